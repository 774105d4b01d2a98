# UniCache Workbench. `make run` executes every notebook, `make test` runs the tests; both set up .venv first if it is
# missing or older than pyproject.toml. `make help` lists every target (from the `##` comments below).
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
export PYTHONHASHSEED := 0
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
# Torch's OpenMP workers spin while waiting by default; inside a Jupyter kernel, with any other busy
# process on a 2-core machine, that made sampling 18x slower (61 s vs 3.4 s measured). Passive waiting
# costs nothing measurable when the machine is idle.
export OMP_WAIT_POLICY ?= PASSIVE
# Progress bars (unicache_lib/progress.py) off where notebooks are executed by papermill, so executed and
# committed notebooks carry no bar output; set per target, so `make lab` keeps them for a reader.
run test notebooks: export UNICACHE_PROGRESS = 0

.PHONY: setup help run test test-fast test-extended notebooks docs lab book benchmark samples evaluate evaluate-depth evaluate-reuse replicate settle rehearsal rehearsal-gen gpu-rehearsal models clean-outputs

## setup: create `.venv` and the `python3` kernel: `torch==2.13.0` pinned first (so nothing can pull a CUDA build), then
##        the project with its `dev` extra, and headless Chromium for the browser test where it can (apt-get); runs
##        again only when `pyproject.toml` changed, and every other target runs it first
setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first and pinned, so nothing below can pull a CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 > /dev/null
	# headless Chromium for the browser test (Debian package; Playwright never downloads one)
	@command -v chromium > /dev/null || { apt-get update -qq && apt-get install -y -qq chromium > /dev/null; } \
	  || echo "could not install chromium (not root?): the browser test will be skipped"
	@touch $(STAMP)

## help: this list: every target and what it does, from the `##` comments above each target; docs/SETUP.md's table of
##       targets is generated from the same comments (`make docs`), and the times in them come from recorded runs
##       (tools/doc_numbers.py markers, shown here by their values)
HELP_WIDTH ?= 118
help:
	@awk -v W=$(HELP_WIDTH) 'function plain(s,  i, j) { while ((i = index(s, "<!--")) > 0) { j = index(substr(s, i), "-->"); \
	    if (!j) break; s = substr(s, 1, i - 1) substr(s, i + j + 2) } return s } \
	  function flush(  n, k, w, line, len) { if (t == "") return; n = split(text, w, " "); line = sprintf("%-21s", "make " t); \
	    len = 21; for (k = 1; k <= n; k++) { if (len > 21 && len + 1 + length(w[k]) > W) { print line; \
	    line = sprintf("%-21s", ""); len = 21 } line = line " " w[k]; len += 1 + length(w[k]) } print line; t = "" } \
	  /^## [a-z][a-z-]*:/ { flush(); t = $$2; sub(/:$$/, "", t); s = $$0; sub(/^## [^:]*: */, "", s); text = plain(s); next } \
	  /^##/ && t != "" { s = $$0; sub(/^## */, "", s); text = text " " plain(s); next } \
	  { flush() } END { flush() }' $(firstword $(MAKEFILE_LIST))

## run: execute every notebook on the shipped models: executed copies under `outputs/notebooks/`, figures and
##      scoreboards under `outputs/<notebook>/`
##      (<!--num @run_minutes fmt="about {:.0f} minutes" missing="not recorded yet"-->about 32 minutes<!--/num--> on 2
##      CPU cores: the sum of the notebooks' recorded run times, `data/results/NN_*.run.json`, the README's run column)
run: setup
	@mkdir -p outputs/notebooks
	@for nb in $(NOTEBOOKS); do \
	  echo "== $$nb"; \
	  $(BIN)/papermill --cwd . -k python3 "$$nb" "outputs/notebooks/$$(basename $$nb)" || exit 1; \
	done
	@echo "executed notebooks: outputs/notebooks/ ; figures and scoreboards: outputs/<notebook>/"

## test: unit tests (quick papermill runs of every notebook, the tested solutions, the browser test) and nbval on the
##       committed notebooks, split into two lanes side by side on 2 cores, one thread each; prints each part's time,
##       the slowest tests and the CPU-minutes (docs/TESTING.md). The last recorded run:
##       <!--num data/results/make_test.json#wall_minutes fmt="{:.0f} minutes" missing="not recorded yet"-->21 minutes<!--/num-->
##       on <!--num data/results/make_test.json#cpu_count fmt="{} cores" missing="?"-->2 cores<!--/num-->, set-up
##       included,
##       <!--num data/results/make_test.json#cpu_minutes fmt="{:.0f} CPU-minutes" missing="?"-->35 CPU-minutes<!--/num-->
##       (`data/results/make_test.json`). `RECORD=1` keeps its seconds per file and minutes (`tests/costs.json`,
##       `data/results/make_test.json`, TESTING.md's table) for the next run's lanes and the README. `RUNNER=xdist`
##       runs the same work as one pytest run over pytest-xdist's 2 workers instead of the lanes (`-n 2 --dist
##       loadscope` with the plan's scopes; docs/TESTING.md)
# the clock starts when make does, so the set-up time is printed with the stages
TEST_T0 := $(shell date +%s)
test: setup
	$(BIN)/python tools/run_tests.py --setup-seconds $$(( $$(date +%s) - $(TEST_T0) )) $(if $(RECORD),--record) $(if $(RUNNER),--runner $(RUNNER))

## test-fast: unit tests only (no notebook runs, nothing marked slow or extended) in two lanes like `make test`: the
##            loop while you change code (its files took
##            <!--num @test_minutes:fast fmt="about {:.0f} minutes" missing="not recorded yet"-->about 6 minutes<!--/num-->
##            in all in the last recorded run, `tests/costs_fast.json`, dealt over the two lanes)
test-fast: setup
	$(BIN)/python tools/run_tests.py --fast

## test-extended: the long end-to-end checks `make test` leaves out (the JupyterLab slider tests, a lesson run in `make
##                lab` on a fresh clone, the rehearsal slice and the GPU script's code path, the sharded reuse run,
##                SIGKILL at random points); CI runs it after `make test` (`.ci/run`; docs/TESTING.md)
test-extended: setup
	$(BIN)/python tools/run_tests.py --extended

## notebooks: rebuild the committed notebooks from their paired sources `notebooks/src/NN_*.py` (jupytext; cell ids
##            kept) and execute them in place with full parameters; `NB=03` rebuilds one. Each notebook's scoreboard and
##            run time are kept in `data/results/` (tools/record_results.py, before clean_nb drops papermill's timings)
##            and the numbers its prose quotes from its outputs are refreshed (tools/doc_numbers.py; docs/NUMBERS.md);
##            then `make docs`
NB ?= [0-9][0-9]
notebooks: setup
	@for src in notebooks/src/$(NB)_*.py; do \
	  nb=notebooks/$$(basename $${src%.py}).ipynb; echo "== $$nb"; \
	  $(BIN)/jupytext --quiet --update --to ipynb $$(test -f "$$nb" || echo --set-kernel python3) --output "$$nb" "$$src" && \
	  $(BIN)/papermill --cwd . -k python3 "$$nb" "$$nb" || exit 1; \
	  $(BIN)/python tools/record_results.py "$$nb" || exit 1; \
	  $(BIN)/python tools/clean_nb.py "$$nb"; \
	  $(BIN)/python tools/lesson_pictures.py "$$nb" || exit 1; \
	  $(BIN)/python tools/doc_numbers.py --write "$$src" "$$nb" || exit 1; \
	done

## docs: refresh every generated number in README.md, `docs/*.md` and these help lines from the committed file it comes
##       from, and docs/SETUP.md's table of targets from these help lines (`tools/doc_numbers.py --write`;
##       docs/NUMBERS.md); `tests/test_doc_numbers.py` fails while one differs
docs: setup
	$(BIN)/python tools/doc_numbers.py --write

## lab: JupyterLab (ipywidgets included) serving the repository root and opening on `notebooks/`, so the notebooks'
##      links into `docs/` (the glossary) open in the lab (`tests/test_browser.py` clicks one); relative `OUT_DIR` and
##      stores go to the repository's `outputs/` (`unicache_lib.paths`); `--allow-root` only when run as root (EUID=0);
##      autosave off, so running a lesson never rewrites the committed notebook (`tests/test_lab_clean.py`), and no
##      "Jupyter news" question (`tools/lab_overrides.json`, installed in `.venv`)
EUID ?= $(shell id -u)
LAB_FLAGS := --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks --LabApp.news_url=None
# JupyterLab takes settings defaults from <its app dir>/settings/overrides.d/*.json, and this .venv's app dir is
# .venv/share/jupyter/lab: tools/lab_overrides.json sets autosave false and fetchNews "false" (tests/test_makefile.py)
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.d/unicache-workbench.json
lab: setup $(LAB_OVERRIDES)
	$(BIN)/jupyter lab $(LAB_FLAGS) $(if $(filter 0,$(EUID)),--allow-root)

$(LAB_OVERRIDES): tools/lab_overrides.json
	@mkdir -p $(@D)
	cp $< $@

## benchmark: `benchmarks/capture_overhead.py`, `stats_stride_error.py`, `caching.py` and `store_scale.py`: capture
##            overhead in both regimes (LLaVA-1.5-7B's attention shape at narrow and at real width, an SD3-medium joint
##            block at 1024 px), KV eviction at LLaVA-1.5-7B's attention shape, cross-step reuse on the shipped
##            generators and the SD3-medium stand-in, store cost at 1k-100k records; ratios measured side by side
##            (docs/CAPTURE.md, docs/CACHING.md); its run time is not recorded yet, the capture-overhead part is the
##            long one
benchmark: setup
	$(BIN)/python benchmarks/capture_overhead.py
	$(BIN)/python benchmarks/stats_stride_error.py
	$(BIN)/python benchmarks/caching.py
	$(BIN)/python benchmarks/store_scale.py --out benchmarks/results/store_scale.txt

## rehearsal: random-weight stand-ins of LLaVA-1.5-7B, Qwen2-VL-2B and Llama-3.2-11B-Vision (real token counts and
##            depth, reduced width) through notebooks 01, 02, 04, 05 and 07 by parameters only; wall-clock and peak RSS
##            per notebook and model -> `benchmarks/results/rehearsal.csv` and docs/REHEARSAL.md (the last run's
##            notebooks took
##            <!--num benchmarks/results/rehearsal.csv#sum(wall_s) scale=1/60 fmt="{:.0f} minutes"-->32 minutes<!--/num-->
##            in all; not part of CI, a slice of it is in `make test-extended`)
rehearsal: setup
	$(BIN)/python -m unicache_lib.rehearsal

## rehearsal-gen: pipeline stand-ins of SD3-medium, PixArt-Sigma and FLUX.1-dev (512 px: 1,024 image tokens, real depth
##                and text lengths, reduced head width, tiny random VAE) through notebooks 03, 04 and 06 by parameters
##                only; wall-clock, peak RSS and reuse speed-ups -> `benchmarks/results/rehearsal_generation.csv` and
##                docs/REHEARSAL.md (the last run's notebooks took
##                <!--num benchmarks/results/rehearsal_generation.csv#sum(wall_s) scale=1/60 fmt="{:.0f} minutes"-->51 minutes<!--/num-->
##                in all, in resumed runs)
rehearsal-gen: setup
	$(BIN)/python -m unicache_lib.rehearsal --side generation

## gpu-rehearsal: on a CUDA machine, the rehearsal at LLaVA-1.5-7B's real width in fp16, capture overhead and
##                decode-step time / KV bytes at 25% and 10% of the image KV; on a CPU machine it says so and exits 0
gpu-rehearsal: setup
	$(BIN)/python benchmarks/gpu_rehearsal.py

## samples: the shipped sample set exported in the Hugging Face imagefolder layout your own samples take
##          (`outputs/samples/understanding`: the PNGs, `metadata.jsonl` with `file_name`, `question`, `answer`, ...,
##          and `masks.npz`), and the generation notebooks' default prompts as `outputs/samples/prompts_03.jsonl`
##          (notebook 03: 16 one-object prompts, 8 pairs) and `prompts_06.jsonl` (notebook 06: 36);
##          `samples.load(folder)` and `text.read_prompts(file)` read them, the notebooks' `SAMPLES` and `PROMPTS`
##          parameters take them, and so does `datasets.load_dataset("imagefolder", data_dir=...)`
samples: setup
	$(BIN)/python -m unicache_lib.world.samples --folder --out outputs/samples/understanding
	# notebook 03's default prompts (16 one-object, 8 pairs) and notebook 06's (32 scored + 4 calibration), as PROMPTS reads them
	$(BIN)/python -c "from unicache_lib.world.text import export_prompts, prompt_set; print('wrote', export_prompts(prompt_set(16, 8, 0), 'outputs/samples/prompts_03.jsonl'))"
	$(BIN)/python -c "from unicache_lib.world.text import export_prompts, prompt_set; print('wrote', export_prompts(prompt_set(36, 0, 0), 'outputs/samples/prompts_06.jsonl'))"

## evaluate: the decisive runs of notebook 05's eviction targets E1-E4 and its controls on 2,700 held-out questions no
##           one here tuned on and the notebook does not score, sharded over `NPROC` processes (default 2; torchrun, one
##           shard per rank, merged and checked complete) -> `benchmarks/results/evaluate_eviction.csv` and
##           `evaluate_controls.csv`, which notebook 05 prints beside its own run (the last run's slowest shard of
##           <!--num "benchmarks/results/evaluate.txt#slowest shard@1"-->2<!--/num--> took
##           <!--num "benchmarks/results/evaluate.txt#slowest shard@2" fmt="{:.0f} minutes"-->14 minutes<!--/num-->,
##           `benchmarks/results/evaluate.txt`, longer on a busy machine; not part of CI). `QUESTIONS=...` for another
##           size; `MODEL=...` for another model (its results go to `evaluate_*_<model>.csv`, beside tiny-llava's)
NPROC ?= 2
QUESTIONS ?= 2700
MODEL ?= tiny-llava
BUDGETS ?=
evaluate: setup
	rm -f outputs/evaluate/rows-rank*
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node $(NPROC) benchmarks/evaluate.py --questions $(QUESTIONS) \
	  --model $(MODEL) $(if $(BUDGETS),--budgets $(BUDGETS))
	$(BIN)/python benchmarks/evaluate.py --merge

## evaluate-depth: the decisive run of notebook 05's depth budgets (issue #63, rules `DEPTH_RULES` fixed first): the
##                 per-layer schedule chosen on a design split, then 2,700 new held-out questions on tiny-llava-576 at 64
##                 and 128 image tokens over `NPROC` ranks, then the verdicts -> `benchmarks/results/evaluate_depth_*.csv`
##                 (not part of CI)
evaluate-depth: setup
	rm -f outputs/evaluate_depth/rows-rank*
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/depth_budgets.py --design
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node $(NPROC) benchmarks/depth_budgets.py --questions $(QUESTIONS)
	$(BIN)/python benchmarks/depth_budgets.py --merge

## evaluate-reuse: the decisive runs of notebook 06's reuse targets R1-R3 and its noise-level claims G3 and G8 on 1,600
##                 prompt/noise pairs no one here tuned on and the notebook does not score: `NPROC` torchrun ranks score
##                 in fixed chunks (a merged run equals a one-process run), then one process times (`REPEATS`
##                 interleaved rounds: keep the machine quiet), then the merge ->
##                 `benchmarks/results/evaluate_reuse.csv` and `evaluate_reuse_methods.csv`, which notebook 06 decides
##                 on (`PROMPTS=...`; its run time is not recorded yet; not part of CI)
PROMPTS ?= 1600
REPEATS ?= 20
evaluate-reuse: setup
	rm -f outputs/evaluate_reuse/rows-rank* outputs/evaluate_reuse/timing.json
	OMP_NUM_THREADS=1 $(BIN)/torchrun --standalone --nproc_per_node $(NPROC) benchmarks/evaluate_reuse.py --prompts $(PROMPTS)
	$(BIN)/python benchmarks/evaluate_reuse.py --timing --repeats $(REPEATS)
	$(BIN)/python benchmarks/evaluate_reuse.py --merge

## replicate: notebooks 02-07 on two further sample / question / prompt seeds with full parameters ->
##            `data/replicate/verdicts.csv` and the replication table in docs/VERDICTS.md (its run time is not recorded
##            yet; not part of CI). `QUICK=1`: tiny parameters, a smoke run that writes under `outputs/replicate/` only
replicate: setup
	$(BIN)/python -m unicache_lib.replicate --seeds 1 2 $(if $(QUICK),--quick)

## settle: the claims `make replicate` finds unstable, re-decided once at the sample sizes their scoreboard notes ask
##         for (notebooks 02-05 on a new seed with larger sets) -> `data/replicate/settled.csv` and docs/VERDICTS.md
##         (its run time is not recorded yet; `QUICK=1`: a smoke run)
settle: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m unicache_lib.replicate --settle $(if $(QUICK),--quick)

## models: retrain the shipped models from scratch:
##         <!--num @train_minutes fmt="{:,.0f} CPU minutes"-->677 CPU minutes<!--/num-->,
##         <!--num @train_minutes scale=1/60 fmt="about {:.0f} hours"-->about 11 hours<!--/num--> (the sum of the
##         `train_minutes` of every run the model cards record, one thread per run; docs/MODELS.md); not part of CI
models: setup
	$(BIN)/python -m unicache_lib.world.samples --out data/samples
	$(BIN)/python -m unicache_lib.zoo.train.llava --out runs/tiny-llava-a --seed 0
	# second stage-b run weighted towards the shape-located questions (see the model card)
	$(BIN)/python -m unicache_lib.zoo.train.llava --init-from runs/tiny-llava-a --out data/models/tiny-llava --seed 1 \
	  --steps-a 0 --steps-b 2500 --lr 1e-3 --qtype-weights colour=3,exists=2
	# tiny-llava-576 (LLaVA-1.5's 576 image tokens: 96 px, 4 px patches): a 4-layer tower with tiny-llava's language
	# model, then two stage-b runs, the second weighted towards colour, position and yes/no (see its model card)
	$(BIN)/python -m unicache_lib.zoo.train.llava --image-size 96 --patch 4 --vision-layers 4 --init-lm-from data/models/tiny-llava \
	  --out runs/tiny-llava-576-tower --seed 0 --steps-a 1000 --batch-a 16 --steps-b 0 --lr 1.5e-3 --eval-every 500 \
	  --n-heldout 100 --n-captions 10 --threads 1
	$(BIN)/python -m unicache_lib.zoo.train.llava --init-from runs/tiny-llava-576-tower --out runs/tiny-llava-576-b1 --seed 1 \
	  --steps-a 0 --steps-b 500 --batch-b 24 --lr 1.5e-3 --eval-every 125 --qtype-weights shape=2,colour=2,exists=2 --threads 1
	$(BIN)/python -m unicache_lib.zoo.train.llava --init-from runs/tiny-llava-576-b1 --out data/models/tiny-llava-576 --seed 2 \
	  --steps-a 0 --steps-b 1200 --batch-b 24 --lr 1.5e-3 --eval-every 300 --qtype-weights colour=3,position=2,exists=2 --threads 1
	$(BIN)/python -m unicache_lib.zoo.train.generator --family sd3 --out data/models/tiny-mmdit --seed 0
	$(BIN)/python -m unicache_lib.zoo.train.generator --family pixart --out runs/tiny-pixart-a --seed 0 --threads 1
	$(BIN)/python -m unicache_lib.zoo.train.generator --family pixart --init-from runs/tiny-pixart-a --out data/models/tiny-pixart \
	  --steps 3000 --lr 5e-4 --seed 1 --threads 1
	# the study's other architectures (notebook 08)
	$(BIN)/python -m unicache_lib.zoo.train.vlm --family Mllama --out runs/tiny-mllama-a --seed 0 --threads 1
	$(BIN)/python -m unicache_lib.zoo.train.vlm --family Mllama --init-from runs/tiny-mllama-a --out runs/tiny-mllama-b \
	  --seed 1 --steps-a 0 --steps-b 2500 --lr 1e-3 --qtype-weights exists=3,position=2 --threads 1
	# "is there a ...?" stays at chance through both: one-object scenes with random absent negatives unlock it, then
	# hard negatives on every scene type (see the model card and its previous runs)
	$(BIN)/python -m unicache_lib.zoo.train.vlm --family Mllama --init-from runs/tiny-mllama-b --out runs/tiny-mllama-c \
	  --seed 2 --steps-a 0 --steps-b 600 --lr 2e-3 --qtype-weights exists=20 --single-frac 1 --exists-negatives random \
	  --threads 1 --eval-every 200
	$(BIN)/python -m unicache_lib.zoo.train.vlm --family Mllama --init-from runs/tiny-mllama-c --out runs/tiny-mllama-d \
	  --seed 3 --steps-a 0 --steps-b 2500 --lr 1.5e-3 --qtype-weights exists=3,position=2,shape=2 --threads 1 --eval-every 250
	$(BIN)/python -m unicache_lib.zoo.train.vlm --family Mllama --init-from runs/tiny-mllama-d --out data/models/tiny-mllama \
	  --seed 4 --steps-a 0 --steps-b 1800 --lr 1e-3 --qtype-weights exists=4,position=2,shape=2 --threads 1 --eval-every 300
	$(BIN)/python -m unicache_lib.zoo.train.vilt --out runs/tiny-vilt-a --seed 0 --threads 1
	$(BIN)/python -m unicache_lib.zoo.train.vilt --init-from runs/tiny-vilt-a --out data/models/tiny-vilt --seed 1 --steps 1500 \
	  --lr 5e-4 --threads 1
	$(BIN)/python -m unicache_lib.zoo.train.clip --out data/models/tiny-clip --seed 0 --threads 1
	$(BIN)/python -m unicache_lib.zoo.train.janus --out runs/tiny-janus-a --seed 0 --threads 1 --eval-every 1000
	# Janus too: "is there a ...?" at chance and colour at 0.63 after the first run; the one-object curriculum, then
	# colour and existence weighted on every scene type (the model card's target note and previous_run)
	$(BIN)/python -m unicache_lib.zoo.train.janus --init-from runs/tiny-janus-a --out runs/tiny-janus-c --seed 2 \
	  --steps-vq 0 --steps-a 0 --steps-b 400 --lr 2e-3 --qtype-weights exists=20 --single-frac 1 --exists-negatives random \
	  --n-heldout 200 --n-generate 20 --n-captions 20 --threads 1 --eval-every 200
	$(BIN)/python -m unicache_lib.zoo.train.janus --init-from runs/tiny-janus-c --out data/models/tiny-janus --seed 3 \
	  --steps-vq 0 --steps-a 0 --steps-b 800 --lr 1.5e-3 --qtype-weights colour=3,exists=3 --single-frac 0.25 \
	  --exists-negatives random --n-heldout 1500 --threads 1 --eval-every 200

## clean-outputs: delete `outputs/` (executed notebooks, figures, scoreboards, stores); nothing committed is touched
clean-outputs:
	rm -rf outputs

## book: the course as a static website in `outputs/book/` (open its `index.html` or serve the folder), built by Sphinx
##       with sphinx-book-theme and myst-nb (`book/conf.py`): README.md as the landing page, the committed, executed
##       notebooks as they are (never re-executed), `docs/*.md` and `solutions/`; search, in-page contents, dark mode, a
##       mobile menu; offline, nothing fetched (publishing it: docs/FORKING.md#f-publishing-the-course-as-a-website).
##       `REF=HEAD` builds the committed files only, whatever the working tree holds; `RECORD=1` keeps the build's time
##       and size in `data/results/book.json`; the last recorded build took
##       <!--num data/results/book.json#seconds fmt="{:.0f} s" missing="not recorded yet"-->18 s<!--/num--> for a site of
##       <!--num data/results/book.json#megabytes fmt="{:.0f} MB" missing="?"-->22 MB<!--/num-->
REF ?=
book: setup
	$(BIN)/python book/build.py --out outputs/book $(if $(REF),--ref $(REF)) $(if $(RECORD),--record data/results/book.json)
