# ---
# jupyter:
#   unicache:
#     figure_kind: overlay
#     first_figure:
#     - one_map
#     quick:
#       ANCHOR_K: 4
#       PER_TYPE: 1
# ---

# %% [markdown]
# # 01 · Capturing attention from a vision-language model
#
# **What you will learn**
# - three ways to get attention out of a model, why only two work, and how the workbench finds the attention modules;
# - the capture modes `full`, `stats`, `recompute`, their costs, and capturing by layers into a resumable store;
# - the troubleshooting table, live, with the library's own errors;
# - the method claims M1–M4 (can the measurements be trusted?) measured on your model (§7).
#
# *§1's figure:* left, one head's map in sequence order; middle, image first; right, 'triangle' puts
# <!--num "notebooks/01_capture.ipynb#out:image rows read keys > the word puts@0"-->0.99<!--/num--> of its row on one patch, the light square.
#
# ![This lesson's first figure, from its last run](../docs/figures/01_capture.png)

# %% tags=["parameters"]
MODEL = "tiny-llava"          # shipped name, local path or hub id of a supported vision-language model
DEVICE = "auto"               # "cpu", "cuda" or "auto" (CUDA when present)
DTYPE = "auto"                # weights: "auto" (bf16/fp16 on a GPU, fp32 on the CPU), "float32", "bfloat16", "float16"
MEMORY_BUDGET_GB = 8          # full-map captures estimated above this raise (use stats mode or fewer layers)
PER_TYPE = 4                  # standard samples per scene type; 4 gives the full set of 20
OUT_DIR = "outputs/01_capture"
ANCHOR_K = 6                  # anchors per sample for claim M3
SEED = 0
SAMPLE_SEED = 2024            # the shipped standard set; another seed builds another set of the same recipe
SAMPLES = None                # your own samples: a folder of images with a metadata.jsonl (`make samples` writes an example)

# %%
from unicache_lib.params import check_params

check_params(globals())  # every parameter above, before anything loads: a bad value stops here, naming itself

# %% [markdown]
# **Needs**: from [00](00_primer.ipynb), only how to read a map (rows are queries, columns keys, the causal
# mask, × uniform); nothing run before it. The shipped `tiny-llava` on CPU, or a checkpoint of any supported family
# ([docs/MODELS.md](../docs/MODELS.md)) as `MODEL`, on `DEVICE` in `DTYPE`. Convention: `text->image` means text
# queries reading image keys.
#
# **Time**: about <!--num @read_minutes:01_capture fmt="{} min"-->10 min<!--/num--> to read; last run <!--num data/results/01_capture.run.json#duration_s fmt="{:.0f} s" missing="not recorded yet"-->59 s<!--/num--> (2 CPU cores).

# %%
import numpy as np
import pandas as pd
import torch

from unicache_lib import plots, stats
from unicache_lib.analysis import capture_claims as CL
from unicache_lib.analysis.anchors import batching_overlap, image_reads
from unicache_lib.analysis.token_classes import content_position
from unicache_lib.capture import AttentionCapture, CaptureError, find_attention_modules
from unicache_lib.capture.runner import build_prompt, capture_samples, inputs_for
from unicache_lib.capture.vlm import check_memory, full_capture_bytes
from unicache_lib.core.models import language_attention
from unicache_lib.families import family_of
from unicache_lib.paths import project_path
from unicache_lib.replicate import unstable_claims
from unicache_lib.scoreboard import Scoreboard
from unicache_lib.store import Store, StoreError, remove_store
from unicache_lib.tables import wrap
from unicache_lib.world import samples as sample_set
from unicache_lib.runtime.loaders import is_stand_in, load_understanding

torch.manual_seed(SEED)
torch.set_num_threads(min(2, torch.get_num_threads()))
out = project_path(OUT_DIR)  # relative: from the repository root, wherever the kernel started
out.mkdir(parents=True, exist_ok=True)
model, processor = load_understanding(MODEL, attn_implementation="eager", dtype=DTYPE, device=DEVICE)
family = family_of(model)
samples = sample_set.load(SAMPLES, per_type=PER_TYPE, seed=SAMPLE_SEED)
tcfg = model.config.get_text_config()
print(f"model: {MODEL} ({type(model).__name__}, family {family.name}) on {next(model.parameters()).device}, "
      f"weights {next(model.parameters()).dtype}\nlanguage layers: {tcfg.num_hidden_layers}, heads: {tcfg.num_attention_heads}")
print(f"samples: {len(samples)} of the standard set, scene types: {sorted({s.scene_type for s in samples})}")

# %% [markdown]
# ## 1. Three ways to get attention
#
# 1. **`output_attentions=True`**: the model returns every layer's `[batch, heads, q, k]` map — all alive at once, and
#    only under the eager kernel.
# 2. **Forward hooks** on the attention modules (`AttentionCapture`): each layer's map is kept, or reduced to
#    statistics, during the forward, then dropped.
# 3. **Reading it from the outputs** fails: logits and hidden states hold no attention, and fused kernels (sdpa, flash:
#    attention computed in one pass that never writes the weights out) never materialise it.
#
# The first two must agree exactly; we check on one sample, then show one head's map of it and, right, a content
# word's attention over the picture in × uniform.

# %% tags=["nbval-check-output"]
s0 = samples[0]
inputs = inputs_for(model, processor, s0.image, s0.question)
spans = family.spans(model.config, inputs["input_ids"], inputs)
check_memory(full_capture_bytes(model, inputs), MEMORY_BUDGET_GB, "a full capture of one sample")
with torch.no_grad():
    way1 = model(**inputs, output_attentions=True).attentions
    with AttentionCapture(model, mode="full") as cap:
        model(**inputs)
diff = max((way1[r.layer][0].float().cpu() - r.probs).abs().max().item() for r in cap.result)
print(f"sample {s0.id}: {s0.question!r} -> sequence of {len(spans)} tokens "
      f"({spans.n_image} image, {spans.n_text} text)")
if family.cross_attention:
    print(f"cross-attention layers {sorted({r.layer for r in cap.result if r.part == 'cross'})} read "
          f"{cap.result.select(part='cross')[0].seq_len} vision tokens")
print(f"output_attentions vs hooks: {len(way1)} layers, max |difference| = {diff:.1e}")

# %% tags=["nbval-check-output"]
from unicache_lib.analysis.localisation import reading_head
from unicache_lib.world.scenes import patch_grid_masks

toks0 = processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
first = cap.result[0]
word0 = content_position(toks0, first.spans.text_index) if first.part != "cross" else first.probs.shape[1] - 1  # object/colour
r0, h0, peak = reading_head([r for r in cap.result if r.part == first.part], word0)  # where the word reads the picture most
print(f"shown: layer {r0.layer}, head {h0}, where the word {toks0[word0]!r} puts the most weight on one patch: "
      f"{peak:.1f}× uniform\n  (the largest of all {len(cap.result)} layers x {r0.probs.shape[0]} heads)")
named = [i for i, o in enumerate(s0.objects) if toks0[word0] in (o["shape"], o["colour"])]  # the object it names
grid0, gtok0 = family.image_grid(model.config, inputs), family.grid_tokens(model.config, inputs)
if named and grid0 is not None and r0.part != "cross" and s0.has_masks:
    w0 = r0.probs[h0][word0, r0.spans.image_index]
    w0 = w0[gtok0] if gtok0 is not None else w0
    on0 = patch_grid_masks(s0.masks, grid0).ravel() == named[0]
    print(f"its brightest patch is {'on' if on0[int(w0.argmax())] else 'off'} the {s0.objects[named[0]]['shape']} "
          f"the word names")

# %%
fig = plots.map_panel(r0.probs[h0], r0.spans, s0.image, word0, toks0,
                      f"sample {s0.id} · layer {r0.layer} · head {h0}", cross=r0.part == "cross",
                      grid=family.image_grid(model.config, inputs), grid_tokens=family.grid_tokens(model.config, inputs),
                      question=s0.question)
_ = plots.save(fig, out, "one_map")
if r0.part != "cross":  # what this head's image rows avoid, and where the word's row goes
    P0, keys = r0.probs[h0].float(), torch.as_tensor(r0.spans.image_index)
    seen = torch.stack([P0[keys[keys >= j], j].mean() for j in keys])  # per image key, mean over image rows that see it
    low, top = keys[seen.argsort()[:2]].tolist(), int(P0[word0].argmax())
    print(f"image rows read keys {low} least ({seen.min():.3f}; median key {seen.median():.3f});\nthe word puts "
          f"{P0[word0].max():.2f} of its row on key {top}, which image rows read {P0[keys[keys >= top], top].mean():.3f}")

# %% [markdown]
# **What to look at.** The difference printed above is exactly 0: the hooks see the tensor the model returns.
#
# The head shown is the one whose word row peaks hardest on one patch, and it is positional: its image rows read along
# diagonal stripes (patches at fixed distances back) and avoid two columns of the left panel, sequence positions
# <!--num "notebooks/01_capture.ipynb#out:image rows read keys" re="keys \[([0-9, ]+)\]"-->37, 28<!--/num--> (<!--num "notebooks/01_capture.ipynb#out:image rows read keys@2" fmt="{:.3f}"-->0.001<!--/num--> of a row
# on average; the median key <!--num "notebooks/01_capture.ipynb#out:image rows read keys@3" fmt="{:.3f}"-->0.022<!--/num-->).
#
# The word's row is the opposite: it
# puts <!--num "notebooks/01_capture.ipynb#out:image rows read keys > the word puts@0"-->0.99<!--/num--> of its weight on one key,
# <!--num "notebooks/01_capture.ipynb#out:image rows read keys > the word puts@1"-->36<!--/num-->, a patch the image rows barely read, lying
# <!--num "notebooks/01_capture.ipynb#out:its brightest patch is" re="patch is ([onf]+) the"-->on<!--/num--> the
# triangle it names: <!--num "notebooks/01_capture.ipynb#out:shown: layer@2" fmt="{:.1f}"-->71.5<!--/num-->× uniform,
# so the right panel's scale runs so high that the even line (cyan) sits at its foot and every other patch renders
# black. Most heads read the picture far less sharply (02 asks how often a word lands on its object). Next, the fused
# kernel returns no weights: capture needs eager attention, or §3's `recompute` mode.

# %%
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()  # transformers' own warning about it would repeat the point
with torch.no_grad(), language_attention(model, "sdpa"):  # the same weights on the fused kernel
    att = model(**inputs, output_attentions=True).attentions
hf_logging.set_verbosity_warning()
print("under sdpa, output_attentions gives:", None if att is None else [type(a).__name__ for a in att][:2],
      "(no layer's weights)" if not att else "")

# %% [markdown]
# ## 2. Finding the attention modules
#
# The model's *family adapter* (`unicache_lib.families`) names the modules that attend: the language model's
# `layers.N.self_attn` (for a cross-attention model such as Mllama, also `layers.N.cross_attn`, part `cross`), and
# with `part="vision"` the vision tower's.

# %% tags=["nbval-check-output"]
lang = find_attention_modules(model)
vis = find_attention_modules(model, part="vision")
print(f"{family.name}: {len(lang)} language attention modules, e.g. {next(iter(lang))}")
print(f"{len(vis)} vision attention modules, e.g. {next(iter(vis))}")

# %% [markdown]
# ## 3. Full maps or statistics: what it costs
#
# `full` keeps every probability (`heads × S × S` floats per layer); `stats` reduces each map inside the hook
# to the statistics listed below, all of size `heads × S` or smaller; `recompute` leaves the model on sdpa
# and recomputes the probabilities from the layer's queries and keys for the statistics.

# %%
print(wrap("statistics kept per layer (H heads, Sq queries, Sk keys): "
           + "; ".join(f"{k} {v.split(']')[0]}]" for k, v in stats.LAYER_STATS.items())))  # what each is: stats.LAYER_STATS

# %%
with torch.no_grad():  # the same sample in the two reduced modes, against the statistics of its full maps
    with AttentionCapture(model, mode="stats") as cap_stats:
        model(**inputs)
    with language_attention(model, "sdpa"), AttentionCapture(model, mode="recompute") as cap_re:
        model(**inputs)
full_vs_stats = max(
    (r.statistics()[k] - cap_stats.result[r.layer].data[k]).abs().nan_to_num().max().item()
    for r in cap.result for k in cap_stats.result[r.layer].data)
re_vs_stats = max(
    (cap_re.result[r.layer].data[k] - r.data[k]).abs().nan_to_num().max().item()
    for r in cap_stats.result for k in r.data)
memory = {"full": cap.result.nbytes(), "stats": cap_stats.result.nbytes(), "recompute": cap_re.result.nbytes()}
print(f"bytes kept for one sample, all layers: {memory}")
print(f"stats mode vs statistics of full maps: max |diff| = {full_vs_stats:.1e}")
print(f"recompute (sdpa) vs stats (eager): max |diff| = {re_vs_stats:.1e}")

# %%
fig = plots.bars({k: v / 1024 for k, v in memory.items()}, "memory kept per sample", "KiB", log=True)
_ = plots.save(fig, out, "memory_by_mode")
print(f"stats mode keeps {memory['full'] / memory['stats']:.0f}x less than full maps for this sample")
bench = project_path("benchmarks/results/capture_overhead.txt").read_text().split("\n\n")  # the committed benchmark
for block in bench[1:3]:  # attention-dominated (head dim 4); real width (2 LLaVA-1.5-7B layers)
    head, cols, *rows = block.splitlines()
    print(head.split(";")[0] + "\n" + cols)
    print("\n".join(r for r in rows if r.split()[0] in ("output_attentions", "stats", "recompute")))

# %% [markdown]
# **What to look at.** The bars (log scale) are the bytes each mode keeps for one sample: `stats` and `recompute`
# keep the same statistics; `full` keeps <!--num "notebooks/01_capture.ipynb#out:stats mode keeps@0"-->11<!--/num-->× more here, and the ratio
# grows with the sequence (maps grow as S², statistics as S).
#
# The benchmark lines are at LLaVA-1.5's shape: full maps kept
# <!--num "benchmarks/results/capture_overhead.txt#attention-dominated > output_attentions@4" fmt="{:.0f}"-->2352<!--/num--> MB
# against <!--num "benchmarks/results/capture_overhead.txt#attention-dominated > stats@4" fmt="{:.0f}"-->21<!--/num--> MB
# of statistics. In time, `stats` cost
# <!--num "benchmarks/results/capture_overhead.txt#attention-dominated > stats / eager@0"-->1.23<!--/num-->× eager with
# attention dominating (head dim 4), an upper bound.
#
# At real 7B width `stats` cost <!--num "benchmarks/results/capture_overhead.txt#real width > stats / eager@0"-->1.01<!--/num-->×
# eager and `recompute` <!--num "benchmarks/results/capture_overhead.txt#real width > recompute / sdpa@0"-->1.03<!--/num-->×
# sdpa. Every full capture is checked against `MEMORY_BUDGET_GB` before the model runs.
#
# ## 4. Capturing in batches of layers
#
# A model too big to keep every layer's maps is captured a few layers per forward; the result equals one pass:

# %% tags=["nbval-check-output"]
in_batches = capture_samples(model, processor, samples[:1], mode="full", layer_batch=2,
                             memory_budget_gb=MEMORY_BUDGET_GB)
same = all(torch.equal(r.probs, cap.result[r.layer].probs) for r in in_batches)
print(f"layers captured in batches of 2: {[r.layer for r in in_batches][:8]}{' ...' if len(in_batches) > 8 else ''}; "
      f"identical to one pass: {same}")

# %% [markdown]
# ## 5. The store: capture once, analyse many times
#
# `capture_samples` writes one record per sample and layer into a store: one compressed file per layer
# and chunk, one index per writer. Running it again resumes (only missing samples are captured). This notebook
# starts from an empty store each run.

# %%
store_dir = out / "store"
if store_dir.exists():
    remove_store(store_dir)  # this notebook's own output from an earlier run (refused while another process writes it)
store = Store(store_dir, meta={"model": MODEL, "dtype": str(next(model.parameters()).dtype), "sample_seed": SAMPLE_SEED})
res = capture_samples(model, processor, samples, store=store, mode="stats")
again = capture_samples(model, processor, samples, store=store, mode="stats")
back = store.read(layer=0)
roundtrip = max((b.data[k] - res[b.sample, 0].data[k]).abs().nan_to_num().max().item() for b in back for k in b.data)
print(f"captured {len(res.samples)} samples x {len(res.layers)} layers = {len(res)} records; "
      f"second call captured {len(again)} (resume); store problems: {store.verify()}")
print(f"read back layer 0 for {len(back)} samples, max |diff| vs memory = {roundtrip:.1e}")
e0 = np.mean([np.nanmean(b.data["norm_entropy"].numpy()) for b in back])  # an analysis from the store alone
print(f"from the store alone: layer 0's mean normalised entropy {e0:.3f}")
try:
    store.write(back[:1])
except StoreError as e:
    print(f"writing a stored record again: StoreError: {str(e).split(';')[0]}")

# %% [markdown]
# **What to look at.** The second call captured
# <!--num "notebooks/01_capture.ipynb#out:second call captured" re="second call captured ([0-9]+)"-->0<!--/num--> records:
# every (sample, layer) was already in the store, and writing one again is refused. The records read back equal the ones in memory (max difference
# <!--num "notebooks/01_capture.ipynb#out:read back layer 0 for@2" fmt="{:.0e}"-->0e+00<!--/num-->), so an analysis
# can start from the store alone. What these statistics do with depth (entropy and max weight per layer, the depth
# bands) is measured once, in [02 §2](02_understanding_maps.ipynb), on a store `capture_samples` writes as here.

# %% [markdown]
# ## 6. The troubleshooting table, live
#
# | symptom | cause | what the library says / does |
# |---|---|---|
# | nothing recorded, or nonsense | hook on the wrong module | error naming the module and what to hook |
# | weights are `None` | model runs sdpa / flash | error naming the fix (eager, or mode `recompute`) |
# | anchors blur | batch > 1 averaged together | padded batches are refused; measure per sample (M3) |
# | entropy off in the 3rd decimal | weights loaded in fp16/bf16 (`DTYPE`): rounded hidden states move single entries of the maps (exercise 3 measures by how much); not fp16 arithmetic on the statistics, which M1 (§7) tests | statistics are computed in fp32 whatever the weights; load in fp32 to compare |
#
# *Anchors* are, per sample and layer, the image positions the text reads most (the top `ANCHOR_K`;
# [glossary](../docs/GLOSSARY.md#anchors)); two anchor sets are compared by their [Jaccard](../docs/GLOSSARY.md#jaccard)
# overlap |A ∩ B| / |A ∪ B| (1 = the same positions, 0 = disjoint).

# %% tags=["nbval-check-output"]
def message(fn):
    try:
        fn()
    except (CaptureError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"

def wrong_module():
    mlp = next(iter(lang)).replace("self_attn", "mlp").replace("cross_attn", "mlp")
    with AttentionCapture(model, modules=[mlp]):
        model(**inputs)

def sdpa_weights():
    with language_attention(model, "sdpa"), AttentionCapture(model, mode="stats"):
        model(**inputs)

def padded_batch():
    n0 = len(samples[0].question.split())
    two = samples[:1] + [s for s in samples if len(s.question.split()) != n0][:1]  # two lengths: one gets padded
    b = processor(images=[[s.image] for s in two] if family.cross_attention else [s.image for s in two],
                  text=[build_prompt(processor, s.question, family) for s in two], return_tensors="pt", padding=True)
    b = {k: v.to(next(model.parameters()).device) for k, v in b.items()}
    if not (b["attention_mask"] == 0).any():
        raise CaptureError("(these two questions have equal length, so no padding was needed)")
    with AttentionCapture(model, mode="stats"):
        model(**b)

for name, fn in [("hook on an MLP", wrong_module), ("sdpa without weights", sdpa_weights), ("padded batch", padded_batch)]:
    print(f"- {name}:\n" + wrap(f"    {message(fn)}"))

# %% [markdown]
# Each mistake stops with an error naming the cause and the fix; half-precision weights (the fourth row) are no error.

# %% [markdown]
# ## 7. The method claims, measured
#
# Verdicts follow the [interval rule](../docs/GLOSSARY.md#interval), fixed before any number is computed. **M1**
# measures whether fp16 *arithmetic* biases statistics of the same fp32 maps: the signed mean difference (fp16 − fp32)
# per statistic (whether fp16 weights change the maps is exercise 3). **M3**
# averages the text's image reads over all the samples (one batch) and compares each sample's anchors with the
# batch's. **M4**
# captures a second, disjoint standard set (`SAMPLE_SEED + 1`) and compares four headline statistics per sample:
# normalised entropy, max weight, the [cross-modal share](../docs/GLOSSARY.md#cross-modal-share) (`cross_modal`) and
# the [top-10% share](../docs/GLOSSARY.md#top-10-share) (`top10_share`: the text's image reads landing on the most-read
# tenth of image positions; <!--const the share of a uniform read, by definition-->0.1<!--/const--> for an even read).

# %%
board = Scoreboard(random_weights=is_stand_in(MODEL), unstable=unstable_claims([MODEL]))
CL.declare(board, ANCHOR_K)  # the rules of M1-M4, as data in unicache_lib/analysis/capture_claims.py
BIAS = CL.BIAS  # M1's threshold (unicache_lib/claims.py)
for claim, r in board.rows.items():
    print(wrap(f"{claim}: {r.rule_text}"))

# %% tags=["nbval-check-output"]
check = lambda: check_memory(full_capture_bytes(model, inputs), MEMORY_BUDGET_GB, "M1, one sample's full maps at a time")
m1 = CL.measure_fp16_bias(board, model, processor, samples, check)
# fp16 arithmetic moves these digits from machine to machine: the check against ±BIAS is printed, the values are in
# scoreboard.json (docs/TESTING.md, "Checked outputs")
print("M1 signed mean fp16 - fp32, 95% interval:\n ", "; ".join(
    f"{k} {'inside' if -BIAS < iv.lo and iv.hi < BIAS else 'NOT inside'} ±{BIAS:g}" for k, iv in m1.items()))
m2 = CL.measure_repeatability(board, model, processor, samples, res)  # a second capture of the same samples
m3 = CL.measure_batch_anchors(board, res, family.image_part, ANCHOR_K)  # deepest layer that reads the image
m4, gaps = CL.measure_between_sets(board, model, processor, res, family.image_part, PER_TYPE, SAMPLE_SEED)
print("\n".join(f"{k} {m.value:.4f} [{m.lo:.4f}, {m.hi:.4f}] (n = {m.n} {m.unit})" for k, m in (("M2", m2), ("M3", m3), ("M4", m4))))
print(gaps.round(4).to_string())
reach = gaps[["A - B low", "A - B high"]].abs().max(axis=1)  # how far each statistic's interval reaches from 0
print(f"widest interval of A - B: {reach.idxmax()}, reaching {reach.max():.4f}")

# %% [markdown]
# **Reading the M4 table.** `A - B` (set B: the disjoint one) is what changing the sample set moves, `low` and `high`
# its 95% interval; the split-half column is sampling noise within one set. Healthy: `A - B` no larger than the
# split-half differences, as here. The verdict rests on the intervals: the widest,
# <!--num "notebooks/01_capture.ipynb#out:widest interval of A - B" re="B: ([a-z0-9_]+),"-->top10_share<!--/num-->'s,
# reaches <!--num "notebooks/01_capture.ipynb#out:widest interval of A - B" re="reaching ([0-9.]+)"-->0.0357<!--/num-->.

# %% [markdown]
# ## Claims scoreboard
#
# The method claims: can the measurements be trusted before any of them feeds a cache decision?

# %%
from unicache_lib.claims import REGISTRY, Markdown, claims_table

claims_table("01_capture")  # each claim (statement, why, rule) is written once, in unicache_lib/claims.py

# %%
board.save(out / "scoreboard.json")  # the verdicts with their intervals; read in words below

# %% [markdown]
# ## What this run showed
#
# Written from this run's scoreboard (on your model, your numbers), then the decision table.

# %% tags=["nbval-check-output"]
import json
import math

v = board.verdicts()
# a difference between two fp32 computations of one number is reduction-order noise: checked against a tolerance
# (docs/TESTING.md, "Checked outputs"); the exact values go to agreement.json
AGREE_TOL = 1e-5
agreement = {"hooks_vs_output_attentions": diff, "stats_vs_full": full_vs_stats, "recompute_vs_stats": re_vs_stats}
(out / "agreement.json").write_text(json.dumps(agreement, indent=1))
worst_bias = max(abs(iv.value) for iv in m1.values())
m4_note = board.table().loc["M4", "note"]
n_img = spans.n_image  # M3's chance level: the mean Jaccard of two random top-k sets of the image positions
chance = sum(math.comb(ANCHOR_K, t) * math.comb(n_img - ANCHOR_K, ANCHOR_K - t) * t / (2 * ANCHOR_K - t)
             for t in range(ANCHOR_K + 1)) / math.comb(n_img, ANCHOR_K)


def forwards(claim):  # what the verdict means for you first (Claim.meaning), then the claim and its verdict
    m = REGISTRY[claim].meaning.get(v[claim])
    return f"**{m[0].upper() + m[1:]}** ({claim} {v[claim]})" if m else f"**{claim} {v[claim]}**"


Markdown("\n".join([
    f"- {forwards('M1')}: the signed fp16 bias is at most {worst_bias:.0e}, {'inside' if worst_bias < BIAS else 'outside'} "
    f"±{BIAS:g}" + (" (the library computes them in fp32 anyway); whether fp16/bf16 weights change the maps themselves "
                    "is exercise 3." if worst_bias < BIAS else ": compute the statistics in fp32."),
    f"- {forwards('M2')}: two captures differ by at most {m2.value:.0e}" + (", identical on one machine." if m2.value == 0 else "."),
    f"- {forwards('M3')}: batch averaging leaves a sample a Jaccard of {m3.value:.2f} [{m3.lo:.2f}, {m3.hi:.2f}] of its "
    f"top-{ANCHOR_K} anchors (two random sets of {ANCHOR_K} of its {n_img} image positions: {chance:.2f}).",
    f"- {forwards('M4')}: the largest headline difference between two disjoint sets is {m4.value:.4f}, its 95% interval "
    f"[{m4.lo:.4f}, {m4.hi:.4f}] " + ("reaching past ±0.02: use more samples per set before comparing models at 2 decimals"
                                      if m4.hi >= 0.02 else "inside ±0.02: sets compare at 2 decimals")
    + (f" ({m4_note})." if m4_note else "."),
    f"- Hooks and `output_attentions` agree exactly (max difference {diff:.0e}); stats and recompute modes agree with full "
    f"maps {'within' if max(full_vs_stats, re_vs_stats) < AGREE_TOL else 'NOT within'} {AGREE_TOL:.0e}; stats keep "
    f"{memory['full'] / memory['stats']:.0f}x less memory."]))

# %%
from unicache_lib.claims import decision_table

decision_table([  # each claim's row: what was measured here; what to do and where: the claim's advice (claims.py)
    ("M1", "fp16 bias of the statistics' arithmetic (M1)", f"{worst_bias:.0e}"),
    ("M2", "max |difference| between two captures (M2)", f"{m2.value:.0e}"),
    ("M3", f"anchor Jaccard after batch averaging (M3, k={ANCHOR_K})", f"{m3.value:.2f}"),
    ("M4", "largest between-set difference (M4): value, 95% interval", f"{m4.value:.4f} [{m4.lo:.4f}, {m4.hi:.4f}]", m4_note),
    {"measurement": "bytes of a full capture vs stats (this model)", "value here": f"{memory['full']:,} vs {memory['stats']:,}",
     "what it suggests on your model": "maps grow as S² x layers x heads: at 7B size a full capture is gigabytes per sample "
     "(§3 quotes the benchmark); capture stats, or full maps for a few layers", "where": "MEMORY_BUDGET_GB, 02: LAYERS"},
], "01_capture", v)

# %% [markdown]
# **Reading the decision table.** Run it on your model (see "Next steps" below) before trusting numbers from 02–08.

# %% [markdown]
# ## Exercises
#
# Each starter leaves one gap (`# <- write`) and checks what you wrote. Solutions:
# [solutions/01_capture.py](../solutions/01_capture.py) (`--only K` runs one).
#
# 1. ★ Capture the vision tower (`part="vision"`, loaded with `vision_attn_implementation="eager"`) and compare its
#    per-layer mean entropy with the language model's: which is more focused? Write `curve(records)`.
# 2. ★ M3 at other batch sizes: write `jaccard_at(b)`, the mean anchor overlap when the reads of `b` consecutive
#    samples are averaged (`batching_overlap` averages one batch and returns its `mean_jaccard`). The starter checks
#    it against M3 (one batch of every sample); how does a sample's overlap change as `b` grows?
# 3. ★★ Load the model in fp16: do the `stats` mode's statistics match the fp32 model to 3 decimals — the largest and
#    the median entry? Write `gap(a, b)`, the differences over the entries where both are finite.
# 4. ★★ Write one store with several processes (the starter runs each rank as `torchrun -m
#    unicache_lib.capture.distributed --out /tmp/store` would), then run it again. Does the second run capture
#    anything? Write `per_sample(records)`: is each sample there once per layer, as `Store.verify()` says?

# %%
# Exercise 1 starter: the vision tower, beside the language model (`res`, §5's stats capture)
part = "vision"


def curve(records):
    """One value per layer (in layer order): how evenly that layer reads, over its records, heads and rows (0: every
    row on one key, 1: even). Which statistic of §3's list is it, and how do you average it as §5 did?"""
    ...  # <- write: the body


mine = curve(res.records)
if mine is None:
    print("Write the body of `curve`, then run this cell again.")
elif len(mine) != len(res.layers) or abs(float(mine[0]) - e0) > 1e-4:
    print(f"want one value per layer ({len(res.layers)} layers), layer 0's equal to §5's {e0:.3f}; got {mine}")
else:
    print(f"layer 0: {float(mine[0]):.3f}, correct (§5's value)")
    vis_model, _ = load_understanding(MODEL, attn_implementation="eager", vision_attn_implementation="eager",
                                      dtype=DTYPE, device=DEVICE)
    other = capture_samples(vis_model, processor, samples, mode="stats", part=part, progress=False)
    for name, recs in ((part, other.records), ("language", res.records)):
        print(f"{name}: mean normalised entropy per layer {[round(float(x), 3) for x in curve(recs)]}")

# %%
# Exercise 2 starter: M3 at other batch sizes, from `res` (per sample, the deepest layer's image reads)
k = ANCHOR_K  # anchors per sample, as M3
deep = max(r.layer for r in res)
reads = [image_reads(res[sid, deep]) for sid in res.samples]


def jaccard_at(b):
    """M3's overlap when the reads are averaged in batches of b consecutive samples (full batches only), as one
    number for all the batches."""
    ...  # <- write: the body


if jaccard_at(1) is None:
    print(f"Write the body of `jaccard_at`, then run this cell again ({len(reads)} samples' reads, layer {deep}).")
else:
    whole = jaccard_at(len(reads))
    print(f"one batch of all {len(reads)}: {whole:.2f}; " + ("correct (M3's value)" if abs(whole - m3.value) < 1e-9
                                                             else f"M3 measured {m3.value:.2f}"))
    for b in sorted({1, 2, 3, len(samples) // 2, len(samples)} - {0}):
        print(f"batch of {b}: a sample keeps a mean Jaccard of {jaccard_at(b):.2f} of its top-{k} anchors")

# %%
# Exercise 3 starter: the same statistics from a lower-precision model, against fp32, on five samples
dtype = "float16"


def gap(a, b):
    """|a - b| computed in float32, as a 1-D tensor of the entries where both a and b are finite."""
    ...  # <- write: the body


probe = (torch.tensor([1.0, float("nan"), 3.0, 2.0]), torch.tensor([1.5, 2.0, float("inf"), 2.0]))
if gap(*probe) is None:
    print("Write the body of `gap`, then run this cell again.")
elif not torch.equal(torch.as_tensor(gap(*probe)).flatten(), torch.tensor([0.5, 0.0])):
    print(f"on {probe[0].tolist()} and {probe[1].tolist()} want [0.5, 0.0], got {gap(*probe)}")
else:
    model16, _ = load_understanding(MODEL, attn_implementation="eager", dtype=dtype, device=DEVICE)
    a, b = (capture_samples(m, processor, samples[:5], mode="stats", progress=False) for m in (model, model16))
    diffs = {}
    for ra, rb in zip(a, b):
        for key, va in ra.data.items():
            if torch.is_floating_point(va):
                diffs.setdefault(key, []).append(gap(va, rb.data[key]))
    for key, ds in diffs.items():
        d = torch.cat([x.flatten() for x in ds])
        print(f"{key}: largest |{dtype} - fp32| {d.max():.1e}, median {d.median():.1e}")

# %%
# Exercise 4 starter: one store, two processes; each run as torchrun would (RANK, WORLD_SIZE), twice
import contextlib, io, os, tempfile  # noqa: E401,E402
from unicache_lib.capture import distributed  # noqa: E402
world_size = 2


def per_sample(records):
    """A dict: sample id -> how many of `records` belong to that sample."""
    ...  # <- write: the body


if per_sample(res.records) is None:
    print("Write the body of `per_sample`, then run this cell again.")
elif sum(per_sample(res.records).values()) != len(res) or set(per_sample(res.records)) != set(res.samples):
    print(f"on §5's {len(res)} records of {len(res.samples)} samples: the counts do not add up to the records")
else:
    shared, env = tempfile.mkdtemp(prefix="unicache-dist-"), dict(os.environ)
    for run in (1, 2):
        for rank in range(world_size):
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
            with contextlib.redirect_stdout(io.StringIO()) as log:
                distributed.main(["--out", shared, "--n-samples", "4"])
            print(f"run {run}: {log.getvalue().strip()}")
    os.environ.clear()
    os.environ.update(env)
    counts = per_sample(Store(shared).read())
    print(f"{len(counts)} samples, records per sample {sorted(set(counts.values()))}; verify(): {Store(shared).verify()}")

# %% [markdown]
# ## Next steps
#
# > **Your checkpoint.** Run this lesson on a random-weight [stand-in](../docs/GLOSSARY.md#stand-in) or on your
# > model, then read its decision table: which M-claims belong to the code (they hold on random weights too), which
# > to the weights?
# >
# > - the `qwen2-vl-2b` stand-in: `python -m unicache_lib.rehearsal --models qwen2-vl-2b --notebooks 01_capture --no-readme`
# > - your checkpoint: `.venv/bin/papermill notebooks/01_capture.ipynb outputs/01_mine.ipynb -p MODEL <path or hub id>`
# >
# > `solutions/01_capture.py` (`next_steps`) does it for the stand-in and prints the table.
