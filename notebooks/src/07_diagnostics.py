# %% [markdown]
# # 07 · Diagnostics: a hallucination signal, a modality-neglect detector, and a one-call report
#
# **The claims this notebook tests** (ids as in `CLAIMS` of [unicache_lib/scoreboard.py](../unicache_lib/scoreboard.py); the scoreboard at the end decides
# each on a rule written before the numbers):
#
# | id | claim (one line) | why it matters for caching |
# |---|---|---|
# | U10 | A layer whose share of cross-modal attention falls under ~5% marks a modality cut-off ("modality neglect"). | an eviction rule that keeps few image keys in a layer can *cause* such a cut-off; a cheap detector would let a cache watch for it |
# | U12 | A noun whose attention barely covers the image is likely hallucinated. | if low coverage flags wrong answers, a cache could keep more image KV exactly when coverage drops |
#
# **What you will learn**
# - whether the attention of the position that produces an answer tells right answers from wrong ones —
#   including "is there a …?" questions about absent objects — next to the model's own confidence, and how to
#   read an [AUROC](../docs/GLOSSARY.md#auroc) whose direction is not the one you expected, with an interval that
#   respects how few errors there are;
# - how the study's modality-neglect detector (per layer, the *image share of the text queries' reads*, ~5%
#   cut-off) behaves on a healthy model and on three deliberately broken ones, and what it cannot see;
# - how to turn any stores into a report (figures plus one offline HTML page), here and from the shell.
#
# **What it needs**: notebooks 02 and 03 for the ideas and, for the report, their stores (captured here if
# absent). Runs on the shipped `tiny-llava` or a checkpoint of any supported vision-language family (`MODEL`,
# `DEVICE`, `DTYPE`).
#
# **Terms.** [AUROC](../docs/GLOSSARY.md#auroc): the probability that a randomly drawn wrong answer scores as more
# suspect than a randomly drawn right one (0.5: chance; 1: perfect; 0: perfect *in the other direction*).
# **Image share of text queries' reads** (the detector's signal): of the attention that text queries spend on
# the context's image and text keys, the part on image keys, per layer — not notebook 02's `text->image`, which
# is that block's share of the *whole* attention map. [Modality neglect](../docs/GLOSSARY.md#modality-neglect):
# a layer from which the text no longer reads the image.

# %% tags=["parameters"]
MODEL = "tiny-llava"
DEVICE = "auto"               # "cpu", "cuda" or "auto"
DTYPE = "auto"                # weights; statistics are fp32 always
N_QUESTIONS = 1500            # 40% "is there a ...?" (half about absent objects), the rest colour / shape / position
PER_TYPE = 4                  # standard samples per scene type for the detector
MASK_FROM_LAYER = 2           # the broken variant that masks image attention from this layer on
UNDERSTANDING_STORE = "outputs/02_understanding_maps/stats"
GENERATION_STORE = "outputs/03_diffusion_steps/store/tiny-mmdit"   # None: the report covers the understanding model only
SEED = 0
OUT_DIR = "outputs/07_diagnostics"
SAMPLE_SEED = 2024            # the shipped standard set; another seed builds another set of the same recipe
SAMPLES = None                # your own samples: a folder of images with a metadata.jsonl (make samples: an example)

# %%
from unicache_lib.params import check_params

check_params(globals())  # every parameter above, before anything loads: a bad value stops here, naming itself

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from unicache_lib import plots
from unicache_lib.analysis import diagnostics_claims as DG
from unicache_lib.capture.gen_runner import generation_store_or_capture
from unicache_lib.capture.runner import stats_store_or_capture
from unicache_lib.diagnostics.hallucination import answer_attention
from unicache_lib.diagnostics.neglect import CUTOFF, WARN
from unicache_lib.diagnostics.report import build_report
from unicache_lib.diagnostics.roc import auroc, auroc_interval, auroc_table, rank_average, read_auroc
from unicache_lib.families import family_of
from unicache_lib.paths import project_path
from unicache_lib.replicate import unstable_claims
from unicache_lib.scoreboard import Scoreboard
from unicache_lib.world import samples as sample_set
from unicache_lib.zoo.loaders import is_stand_in, load_generator, load_understanding
from unicache_lib.world.questions import heldout_set

torch.manual_seed(SEED)
out = project_path(OUT_DIR)  # relative: from the repository root, wherever the kernel started
out.mkdir(parents=True, exist_ok=True)
model, processor = load_understanding(MODEL, attn_implementation="eager", dtype=DTYPE, device=DEVICE)
family = family_of(model)
qas = heldout_set(N_QUESTIONS, seed=SEED + 4242, qtypes=("exists", "colour", "exists", "shape", "position"))

# %% [markdown]
# **The questions, before any number.** Each held-out question is asked about a 64×64 scene of one to four
# simple objects; two in five ask "is there a …?", and half of those name an object that is *not* there — the
# place a model hallucinates.

# %%
fig, axes = plt.subplots(1, 5, figsize=(12, 2.8))
for ax, q in zip(axes, qas[:5]):
    ax.imshow(q.scene.uint8())
    ax.set_title(f"{q.question}\n-> {q.answer} ({q.qtype})", fontsize=7)
    ax.axis("off")
fig.tight_layout()
_ = plots.save(fig, out, "questions")

# %%
print(f"{MODEL}: {len(qas)} questions, {sum(q.qtype == 'exists' for q in qas)} of them 'is there a ...?' "
      f"({sum(q.qtype == 'exists' and q.answer == 'no' for q in qas)} about absent objects)")

# %% [markdown]
# ## 1. Does a wrong answer look at the image less? (U12)
#
# For every question, the query that produces the answer (the last prompt position), in every layer:
# **coverage** = its attention mass on image keys; **concentration** = 1 −
# [normalised entropy](../docs/GLOSSARY.md#normalised-entropy) of that mass over the image; **confidence** = the answer's softmax probability. AUROC for detecting *wrong* answers
# (0.5 = no better than chance), each score oriented so that low coverage / concentration / confidence means
# "suspect" — the claim's direction. An AUROC *below* 0.5 is not "no signal": it separates in the inverted
# direction (wrong answers score *higher*), with strength max(AUROC, 1 − AUROC). Each AUROC gets a 95% bootstrap
# interval that resamples wrong and right answers separately (stratified): with only a few wrong answers a plain
# resample would let their count drift.

# %%
# NBVAL_CHECK_OUTPUT
A = answer_attention(model, processor, qas)
wrong = ~A.correct
print(f"{int(wrong.sum())} wrong answers of {len(A)}; accuracy per type: {A.groupby('qtype').correct.mean().round(3).to_dict()}")
print("wrong answers by type:", A[wrong].groupby(["qtype", "answer"]).size().to_dict())
SCORES = {"coverage (low = suspect)": -A.coverage, "concentration (low = suspect)": -A.concentration,
          "confidence (baseline)": -A.confidence, "coverage + confidence (rank mean)": rank_average(-A.coverage, -A.confidence)}
if 2 <= int(wrong.sum()) <= len(A) - 2:
    roc = auroc_table(SCORES, wrong)
    print(f"AUROC for wrong answers, 95% interval resampling the {int(wrong.sum())} wrong and {int((~wrong).sum())} right apart")
    print(roc.round(3).to_string())
else:
    roc = pd.DataFrame({"auroc": {k: auroc(v, wrong) for k, v in SCORES.items()}})
    print(f"{int(wrong.sum())} wrong answers: too few for an interval (raise N_QUESTIONS)")

# %%
fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
for ax, col in zip(axes, ("coverage", "concentration", "confidence")):
    ax.hist([A.loc[~wrong, col], A.loc[wrong, col]], bins=30, density=True, label=[f"right (n={int((~wrong).sum())})", f"wrong (n={int(wrong.sum())})"])
    ax.set_xlabel(col)
    ax.legend(fontsize=7)
fig.suptitle("answer-position attention and confidence, right vs wrong answers", fontsize=10)
fig.tight_layout()
_ = plots.save(fig, out, "hallucination_signal")

# %% [markdown]
# **How to read the table and the histograms.** Healthy for the claim: the orange (wrong) coverage histogram
# sits to the *left* of the blue one and the coverage AUROC is well above 0.5 with an interval that stays above it.
# Unhealthy: the histograms overlap (AUROC near 0.5, interval across it) — or, as can happen, the wrong answers sit
# to the *right* (AUROC below 0.5: wrong answers read the image *more*). The sentences below are printed from this
# run's numbers.

# %%
n_wrong = int(wrong.sum())
if "lo" in roc:
    c, f = roc.loc["coverage (low = suspect)"], roc.loc["confidence (baseline)"]
    print(f"Coverage: AUROC {c.auroc:.2f} [{c.lo:.2f}, {c.hi:.2f}] as the claim orients it -> direction {c.direction}, "
          f"strength {c.strength:.2f}; separates: {c.separates}.")
    if c.direction == "inverted" and c.separates == "yes":
        print(f"  Read it as: wrong answers put MORE of their attention on the image than right ones (strength {c.strength:.2f}), "
              "the opposite of U12's mechanism.")
    print(f"Confidence: AUROC {f.auroc:.2f} [{f.lo:.2f}, {f.hi:.2f}] -> the baseline to beat.")
    absent = ((A.qtype == "exists") & (A.answer == "no")).to_numpy()
    if 2 <= int((wrong & absent).sum()) <= int(absent.sum()) - 2:
        w = auroc_interval(-A.coverage[absent], wrong[absent])
        print(f"Within the {int(absent.sum())} absent-object questions only ({int((wrong & absent).sum())} wrong): coverage AUROC "
              f"{w.value:.2f} [{w.lo:.2f}, {w.hi:.2f}] ({read_auroc(w)['direction']}; separates: {read_auroc(w)['separates']}).")
    half = float((roc.hi - roc.lo).max() / 2)
    print(f"What {n_wrong} wrong answers can show: an AUROC to about ±{half:.2f}, " + ("enough to tell whether a signal clears "
          "a 0.7 bar or points the other way" if half < 0.15 else "too wide to place a signal against a 0.7 bar") +
          ". What they cannot show: how the score behaves on "
          f"error types that barely occur here ({A[wrong].groupby(['qtype', 'answer']).size().to_dict()}), or on a model "
          "that errs for other reasons.")

# %% [markdown]
# **What this run shows (shipped model, 1500 questions).** The coverage signal is real but points the other way:
# AUROC 0.31 [0.23, 0.40] in the claim's direction is 0.69 inverted, and within the 284 absent-object questions,
# where 18 of the 20 errors sit (the model says "yes" to an object that is not there), it is 0.11 [0.06, 0.19] —
# a hallucinating answer reads the image *harder*, as if searching for the object, not less. Confidence (0.95)
# separates far better than either direction of coverage. Twenty errors of one kind make this a hypothesis to test
# on a larger model, not a rule: a detector keyed on *high* coverage would need held-out errors of every type.

# %% [markdown]
# ## 2. The modality-neglect detector (U10), healthy and broken
#
# Per layer, the **image share of the text queries' reads**: of the attention mass the text queries put on the
# context (image and text keys), the part on image keys, over the standard samples. The detector fires when a
# layer falls under 5% (and warns under 15%). Broken variants, each labelled with
# what it breaks:
# - **zeroed features**: what the image tokens carry (the projector's output replaced by zeros);
# - **blank image**: the picture's content (every pixel set to the image's mean colour);
# - **zeroed image values**: what reading an image key returns (the value vectors of image positions are zero
#   in every layer; the attention weights are untouched);
# - **masked attention**: the text queries' attention on the image itself, from layer `MASK_FROM_LAYER` on. This one is
#   *caught by construction* (it forces the share to 0), so it checks the detector's plumbing and does not
#   count for U10.
#
# Next to it, a check that does not look at attention at all: **image dependence**, the mean
# [KL](../docs/GLOSSARY.md#kl) between the answer distribution with the sample's image and with another sample's
# image, in nats (near 0 = the image is ignored).
#
# **A cross-attention VLM** (Mllama) reads the image only in its cross-attention layers, whose keys are all
# vision tokens: their image share of the text queries' reads is 1 by construction, and the self-attention layers never see the
# image. The share detector then says nothing, and U10 is "not measurable here"; the variants still run (the
# masked one gates the cross-attention layers off), and image dependence still tells healthy from broken.

# %%
# NBVAL_CHECK_OUTPUT
samples = sample_set.load(SAMPLES, per_type=PER_TYPE, seed=SAMPLE_SEED)
masked_name = DG.masked_name(MASK_FROM_LAYER)
variants, BREAKS = DG.broken_variants(model, processor, samples, MASK_FROM_LAYER, SEED)  # healthy + four breaks
det, shares = DG.detector_table(variants, BREAKS, family.image_part)
print(f"image share of text queries' reads, per layer, over {len(samples)} samples (cut-off {CUTOFF:.0%}, warning {WARN:.0%})")
print(det.to_string(float_format=lambda x: f"{x:.3f}"))

# %%
fig, ax = plt.subplots(figsize=(6, 3.2))
layer_cols = [c for c in det.columns if c.startswith("L")]
for name, row in det.iterrows():
    ax.plot(range(len(layer_cols)), row[layer_cols].astype(float), marker="o", label=f"{name} (breaks: {row['breaks']})",
            ls=":" if name == masked_name else "-")
ax.axhline(CUTOFF, color="r", ls="--", lw=0.8)
ax.axhline(WARN, color="orange", ls=":", lw=0.8)
ax.set_xticks(range(len(layer_cols)), [c[1:] for c in layer_cols])
ax.set_xlabel("layer")
ax.set_ylabel("image share of text queries' reads")
ax.legend(fontsize=7)
fig.tight_layout()
_ = plots.save(fig, out, "neglect_detector")

# %% [markdown]
# **How to read the detector.** A healthy model's curve stays well above the dashed 5% line in every layer, and
# its image dependence (last column) is large; neglect shows as a curve that drops under the line from some layer
# on. The question this table answers is whether the detector sees the three breaks that are *not* forced onto
# the share. The sentences below are printed from this run's numbers.

# %%
hl = det.loc["healthy", layer_cols].astype(float)
dep0 = det.loc["healthy", "image dependence (KL)"]
print(f"Healthy: lowest layer {hl.idxmin()} at {hl.min():.3f} (cut-off {CUTOFF:.0%}); image dependence KL {dep0:.2f}.")
for n in [n for n in det.index if n not in ("healthy", masked_name)]:
    r = det.loc[n]
    dep = r["image dependence (KL)"]
    print(f"{n}: fires {bool(r.fires)}, lowest share {r[layer_cols].astype(float).min():.3f}, image dependence {dep:.3f} -> "
          + ("the share sees it" if r.fires else "the share misses it; " + (
              "image dependence catches it (near 0)" if dep < 0.1 * dep0 else
              f"image dependence keeps {dep / dep0:.0%} of the healthy value, so it misses it too. Only the answers' "
              "accuracy could tell, and it is not measured here per variant: to measure it, run answer_attention(model, "
              "processor, qas) with the variant applied (inside its context manager, or on its images) and compare "
              f".correct.mean() with the healthy model's {A.correct.mean():.3f}")))
print(f"{masked_name}: fires {bool(det.loc[masked_name, 'fires'])} from layer {det.loc[masked_name, 'first cut-off layer']} "
      "(by construction: it zeroes the very share the detector reads).")

# %% [markdown]
# ## 3. One call, one report
#
# `build_report` turns stores into figures and one HTML page with the figures embedded (it opens without a
# network). From a shell: `unicache-report outputs/02_understanding_maps/stats tiny-mmdit=outputs/03_diffusion_steps/store/tiny-mmdit --out outputs/report`.

# %%
ustore, _ = stats_store_or_capture(project_path(UNDERSTANDING_STORE), out / "understanding_stats", MODEL, sample_seed=SAMPLE_SEED,
                                   model=model, processor=processor)
stores = {Path(MODEL).name: ustore}
if GENERATION_STORE:
    gname = Path(GENERATION_STORE).name
    stores[gname], _ = generation_store_or_capture(project_path(GENERATION_STORE), out / "generation_stats" / gname, load_generator(gname), gname)
page = build_report(stores, out / "report")
print(f"report: {page} ({page.stat().st_size // 1024} KB, {page.read_text().count('<img')} figures)")

# %% [markdown]
# The page below is the report itself, followed by the same figures as static images (the PNG files `build_report`
# writes next to the page), which is what a kernel-less viewer such as GitHub shows: there the frame stays empty.
# The page is written to `report.html` in the `report` folder under `OUT_DIR` (here
# `outputs/07_diagnostics/report/report.html`, path printed above); open it in any browser, offline — the figures
# are embedded. Look for the same curves as in notebooks 02 and 03, whose figures it gathers, side by side for the
# two model kinds; a figure missing from the page means its store lacked that statistic.

# %% tags=["nbval-ignore-output"]
import html
import re
import warnings

from IPython.display import HTML, Image, display

from unicache_lib.core.untrusted import iframe_srcdoc, inside

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # IPython suggests IFrame, which needs a served path; srcdoc embeds the page
    display(HTML(iframe_srcdoc(page.read_text())))  # the page escaped whole: the frame gets it exactly as written
# the page's own figures as static images (its <img alt> names the PNG beside it), for viewers without a kernel
for stem in re.findall(r'<img alt="([^"]+)"', page.read_text()):
    png = inside(page.parent, f"{html.unescape(stem)}.png")  # a name from the page stays in the page's folder
    if png is not None and png.is_file():
        display(Image(filename=str(png)))

# %% [markdown]
# ## 4. Claims scoreboard
#
# U10 is decided on the per-layer image shares of the text queries' reads, resampled over the standard samples (95% bootstrap
# interval), and only on broken variants that the share is not forced to catch; U12 on AUROCs resampled over
# the questions, wrong and right answers apart (stratified), in the claim's direction (low coverage = suspect):
# an AUROC interval wholly below 0.7 is "does not hold" whichever way it points, and the `measured` column names
# the direction. "holds" only if the whole interval clears the threshold, "does not hold" only if it lies
# wholly on the other side, else "inconclusive" with a rough n that would settle it; "partly": one criterion
# holds and the other does not.

# %%
# NBVAL_CHECK_OUTPUT
board = Scoreboard(random_weights=is_stand_in(MODEL), unstable=unstable_claims([MODEL]))
DG.declare(board)  # the rules of U10 and U12, as data in unicache_lib/analysis/diagnostics_claims.py
DG.measure_neglect(board, det, shares, family.cross_attention)
DG.measure_hallucination(board, A.coverage.to_numpy(), A.confidence.to_numpy(), wrong.to_numpy(), family.cross_attention)
board.save(out / "scoreboard.json")
print({c: r.verdict for c, r in board.rows.items()})

# %%
board.show()

# %% [markdown]
# **Reading the scoreboard.** U10 reads "partly" when the healthy model is quiet (a) but the detector misses the
# breaks that are not forced onto the share (b): an attention share measures *where* the text looks, not whether
# what it finds there carries anything. U12 is decided in the claim's own direction; a "does not hold" whose
# `measured` column says "inverted" means wrong answers read the image *more*, not that attention is useless.
#
# **What was measured in place of the claims' wording.** Both verdicts rest on a stand-in quantity, and they hold
# or fail for that quantity only:
# - **U12** speaks of a *noun's* attention (a generated word naming an object). The answers here are one word and
#   the study's nouns are not located in them, so coverage is measured at the *last prompt position* — the query
#   that produces the answer (§1) — not at a noun's position. A noun-level test needs captions and the positions of
#   their nouns.
# - **U10** speaks of a layer's [cross-modal share](../docs/GLOSSARY.md#cross-modal-share). The scoreboard row keeps
#   the claim's wording, but what it measures is the [image share](../docs/GLOSSARY.md#image-share) *of the text
#   queries' reads*: of the attention the text queries put on the context's image and text keys, the part on
#   image keys (§2) — not the cross-modal blocks' share of the whole attention map.
#
# ## Recap: what this notebook showed on the shipped model
#
# The sentences and the table below are built from this run's numbers.

# %%
print("\n".join("- " + line for line in DG.recap(roc, det, n_wrong, len(A), board)))

# %%
DG.decisions(roc, det, n_wrong, len(A))  # every cell whole, also as plain text

# %% [markdown]
# ## Exercises
#
# Graded ★ (a parameter or a line) to ★★★ (a new measurement). Solutions: `solutions/07_diagnostics.py`. Each exercise has a starter cell
# below the list.
#
# 1. ★ Mask image attention from layer 1, then from layer 3: does accuracy fall with the first cut-off layer?
#    *Expected on tiny-llava:* yes — 0.987 unmasked, 0.90 from layer 3, 0.86 from layer 2, 0.33 from layer 1; the
#    detector's first cut-off layer equals the masked layer every time.
# 2. ★★ Swap coverage for the *shallow* layers' coverage only (`answer_attention(..., layers=...)`). Does the
#    AUROC change, and in which direction? Report it with its stratified interval. *Expected:* all-layer coverage
#    is inverted (0.31, i.e. 0.69 the other way); shallow-only sits near chance (about 0.49, interval across
#    0.5); confidence (0.95) stays far ahead.
# 3. ★★ Add another broken variant — images shuffled across samples — and predict the detector's verdict first.
#    Is it a modality cut-off at all? *Expected:* the detector stays quiet and image dependence stays high, while
#    accuracy falls to about 0.32: the model reads the wrong image fully; only the answers tell.
# 4. ★★★ On your own checkpoint: run this notebook with papermill on your model
#    (`papermill notebooks/07_diagnostics.ipynb out.ipynb -p MODEL /path/to/llava -p N_QUESTIONS 1500`) and
#    compare with the shipped model: the healthy lowest share against 5%, the image dependence of the blank image
#    against the healthy one, and the coverage AUROC — its direction and whether its interval excludes 0.5.
#    How many wrong answers did you get, and is that enough to decide U12? *Expected (shown in the solution on a
#    random-weight stand-in):* the detector and image dependence run on any family; a model with random weights
#    answers (almost) nothing right, so the AUROC is refused with an error naming the fix — a checkpoint needs
#    both right and wrong answers before U12 can be read.

# %%
# Exercise 1 starter: masking from another layer
# with mask_image_attention(model, 1): capture_samples(...) and answer_attention(model, processor, qas)
print(f"MASK_FROM_LAYER is {MASK_FROM_LAYER}; rerun with papermill -p MASK_FROM_LAYER 1 and 3")

# %%
# Exercise 2 starter: shallow-layer coverage only
# answer_attention(model, processor, qas, layers=[0, 1]) -> the coverage column; then auroc_interval(-coverage, wrong)
print(f"{len(A)} questions, {n_wrong} wrong answers")

# %%
# Exercise 3 starter: images shuffled across samples
# shuffled = [copy of s with the image of samples[(i + 1) % n]]; then DG.detector_table on its capture
print(f"{len(samples)} samples to shuffle")

# %%
# Exercise 4 starter: this lesson on your checkpoint
print("papermill notebooks/07_diagnostics.ipynb out.ipynb -p MODEL /path/to/llava -p N_QUESTIONS 1500")
