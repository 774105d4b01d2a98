# ---
# jupyter:
#   unicache:
#     figure_kind: overlay
#     first_figure:
#     - right_and_wrong
#     quick:
#       GENERATION_STORE: OUT/none/tiny-mmdit
#       N_QUESTIONS: 60
#       PER_TYPE: 1
#       UNDERSTANDING_STORE: OUT/none
#     rules:
#     - unicache_lib.analysis.diagnostics_claims:RULES
# ---

# %% [markdown]
# # 07 · Diagnostics: a hallucination signal, a modality-neglect detector, and a one-call report
#
# **What you will learn**
# - whether the answer position's attention tells right answers from wrong (U12), beside the model's confidence, and
#   how to read an [AUROC](../docs/GLOSSARY.md#auroc) that points the unexpected way;
# - how the study's [modality-neglect](../docs/GLOSSARY.md#modality-neglect) detector (U10) fares on a healthy model and three broken ones;
# - how to turn [stores](../docs/GLOSSARY.md#store) of captured attention statistics into a report, with
#   an explorer of every layer, head and token in it.
#
# *What you see:* two held-out questions, one answered right (left) and one wrong (right); the colour is where the
# answer position (the last prompt position) reads the picture in its last image-reading layer (× uniform, one scale
# for both). In this layer the right answer's peak is the brighter
# (<!--num "notebooks/07_diagnostics.ipynb#out:right:  > coverage" re="peak ([0-9.]+)x"-->14.1<!--/num-->× against
# <!--num "notebooks/07_diagnostics.ipynb#out:wrong:  > coverage" re="peak ([0-9.]+)x"-->8.5<!--/num-->×), but over all
# layers the wrong answer puts no less of its attention on the image (coverage
# <!--num "notebooks/07_diagnostics.ipynb#out:wrong:  > coverage" re="coverage ([0-9.]+)"-->0.58<!--/num--> against
# <!--num "notebooks/07_diagnostics.ipynb#out:right:  > coverage" re="coverage ([0-9.]+)"-->0.55<!--/num-->): it looked,
# and still answered wrong. §1 asks whether that holds over all the questions.
#
# ![This lesson's first figure, from its last run](../docs/figures/07_diagnostics.png)

# %% [markdown]
# **Needs**: 02's ideas (image shares, modality blocks) and, for the report, 02's and 03's stores (captured
# here if absent). The shipped `tiny-llava` or any supported vision-language family (`MODEL`).
#
# **Time**: about <!--num @read_minutes:07_diagnostics fmt="{} min"-->10 min<!--/num--> to read; last run <!--num data/results/07_diagnostics.run.json#duration_s fmt="{:.0f} s" missing="not recorded yet"-->59 s<!--/num--> (2 CPU cores).
#
# **Terms.** AUROC: the probability that a random wrong answer scores as more suspect than a random right one (one
# half: chance; 0: perfect *the other way*). **Image share of text queries' reads** (the detector's signal): of the
# attention text queries spend on the context, the part on image keys, per layer — not 02's `text->image`, a share
# of the *whole* map.

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
from unicache_lib.capture import AttentionCapture
from unicache_lib.capture.gen_runner import generation_store_or_capture
from unicache_lib.capture.runner import inputs_for, stats_store_or_capture
from unicache_lib.diagnostics.hallucination import answer_attention
from unicache_lib.diagnostics.broken import blank_image, mask_image_attention, zero_image_features, zero_image_values
from unicache_lib.diagnostics.neglect import CUTOFF, WARN
from unicache_lib.diagnostics.report import build_report
from unicache_lib.diagnostics.roc import auroc, auroc_interval, auroc_table, rank_average, read_auroc
from unicache_lib.families import family_of
from unicache_lib.paths import project_path
from unicache_lib.replicate import unstable_claims
from unicache_lib.scoreboard import Scoreboard
from unicache_lib.tables import wrap
from unicache_lib.world import samples as sample_set
from unicache_lib.runtime.loaders import is_stand_in, load_generator, load_understanding
from unicache_lib.world.questions import heldout_set
from unicache_lib.world.scenes import patch_grid_masks

torch.manual_seed(SEED)
out = project_path(OUT_DIR)  # relative: from the repository root, wherever the kernel started
out.mkdir(parents=True, exist_ok=True)
model, processor = load_understanding(MODEL, attn_implementation="eager", dtype=DTYPE, device=DEVICE)
family = family_of(model)
qas = heldout_set(N_QUESTIONS, seed=SEED + 4242, qtypes=("exists", "colour", "exists", "shape", "position"))

# %% [markdown]
# **One right answer and one wrong, before any number.** Each held-out question is about a small scene of one to four
# simple objects; two in five ask "is there a …?", and about half of those name an object that is *not* there — where
# a model hallucinates. Below, the first question answered right and the first answered wrong: the answer position
# reading the picture in its last image-reading layer (mean over heads), both panels on one × uniform scale.

# %%
import dataclasses  # noqa: E402

A = answer_attention(model, processor, qas)  # one row per question: its answer, right or wrong, coverage (§1)
ok = A.correct.to_numpy()
picked = ({"right": int(np.flatnonzero(ok)[0]), "wrong": int(np.flatnonzero(~ok)[0])} if (~ok).any() else
          {"right": int(np.flatnonzero(ok)[0]), "least confident": int(A.confidence.to_numpy().argmin())}) if ok.any() else {}
reads, kept = {}, {}
for kind, i in picked.items():  # the answer position (the last prompt position) over the image keys it reads
    inp = inputs_for(model, processor, qas[i].scene.uint8(), qas[i].question)
    with torch.no_grad(), AttentionCapture(model, mode="full", part=family.image_part) as cap:
        model(**inp)
    kept[kind] = [dataclasses.replace(x, sample=kind) for x in cap.result.select(part=family.image_part)]  # §3
    r = kept[kind][-1]
    on = torch.as_tensor(r.spans.array == 1)  # the image keys (cross-attention: every key)
    reads[kind] = (r.probs.float().mean(0)[-1][on] * r.probs.shape[-1], r.layer, inp)  # × uniform: all keys visible
if not picked:
    print(f"not measurable here: no right answer among {len(ok)} questions")
elif "wrong" not in picked:
    print(f"no wrong answer among {len(ok)} questions: the least confident one stands in (raise N_QUESTIONS)")

# %%
if picked:
    top = max(float(w.max()) for w, _, _ in reads.values())
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.6))
    for ax, (kind, (w, li, inp)) in zip(axes, reads.items()):
        q, a = qas[picked[kind]], A.iloc[picked[kind]]
        plots.image_overlay(q.scene.uint8(), w, f"{q.question!r} -> '{a.prediction}' ({kind})", ax=ax,
                            grid=family.image_grid(model.config, inp), grid_tokens=family.grid_tokens(model.config, inp),
                            cbar="× uniform (1 = even over the visible keys)", vmin=0.0, vmax=top, chance=1.0)
    fig.suptitle(f"{MODEL}: the answer position reading the picture (layer {li}, mean over heads)", fontsize=9)
    fig.tight_layout()
    _ = plots.save(fig, out, "right_and_wrong")
    for kind, i in picked.items():
        w, _, inp = reads[kind]
        grid, gtok = family.image_grid(model.config, inp), family.grid_tokens(model.config, inp)
        sc = qas[i].scene
        where = ""
        if grid is not None and len(sc.masks):  # which object the brightest patch lies on
            k = int(patch_grid_masks(sc.masks, grid).ravel()[int((w[gtok] if gtok is not None else w).argmax())])
            on = f"the {sc.objects[k].colour} {sc.objects[k].shape}" if k >= 0 else "background"
            where = f"; brightest patch on {on}"
        print(f"{kind}: {qas[i].question!r} -> '{A.prediction.iloc[i]}' (reference '{qas[i].answer}'), {sc.scene_type} scene\n"
              f"  coverage {A.coverage.iloc[i]:.2f} (mean over layers), peak {float(w.max()):.1f}x uniform{where}")

# %% [markdown]
# **What to look at.** Whether the wrong answer's position reads the picture less than the right one's. In the layer
# drawn its peak is the dimmer, but over all layers its coverage (its attention mass on the image, mean over layers)
# is no lower: <!--num "notebooks/07_diagnostics.ipynb#out:right:  > coverage" re="coverage ([0-9.]+)"-->0.55<!--/num--> for the right answer,
# <!--num "notebooks/07_diagnostics.ipynb#out:wrong:  > coverage" re="coverage ([0-9.]+)"-->0.58<!--/num--> for the wrong one, whose
# brightest patch lies on
# <!--num "notebooks/07_diagnostics.ipynb#out:wrong:  > coverage" re="brightest patch on (.*)$" missing="(not measurable here)"-->the orange circle<!--/num-->.
# Here the wrong answer did not look away: it looked, and took an object of the asked colour for the asked shape. (The
# grey strips along the top and bottom of the left scene are text-like glyphs: a <!--num "notebooks/07_diagnostics.ipynb#out:right: " re=", (\w+) scene$"-->text<!--/num--> scene.) One pair is an anecdote; §1 asks it of all
# the questions.

# %%
print(f"{MODEL}: {len(qas)} questions, {sum(q.qtype == 'exists' for q in qas)} of them 'is there a ...?' "
      f"({sum(q.qtype == 'exists' and q.answer == 'no' for q in qas)} about absent objects)")

# %% [markdown]
# ## 1. Does a wrong answer look at the image less? (U12)
#
# For every question, the query that produces the answer (the last prompt position), in every layer:
# [**coverage**](../docs/GLOSSARY.md#answer-coverage) =
# its attention mass on image keys; **concentration** = 1 − [normalised entropy](../docs/GLOSSARY.md#normalised-entropy)
# of that mass; **confidence** = the answer's probability. AUROC for detecting *wrong* answers, each score oriented the
# claim's way (low = suspect): below chance it still separates, inverted, with strength max(AUROC, 1 − AUROC).
# **U12's bar**, fixed before any number: coverage's AUROC, in the claim's direction (low coverage = suspect), clears
# <!--const U12's bar, written before the numbers-->0.7<!--/const--> (its interval, not its point) and beats
# confidence's. An inverted signal, however strong, does not pass it.

# %% tags=["nbval-check-output"]
wrong = ~A.correct  # A: the first cell's answers and their attention, one row per question
print(f"{int(wrong.sum())} wrong answers of {len(A)}; accuracy per type: {A.groupby('qtype').correct.mean().round(3).to_dict()}")
print("wrong answers by (question type, reference answer):", A[wrong].groupby(["qtype", "answer"]).size().to_dict())
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
    ax.set(xlabel=col, ylabel="density (area 1 per group)" if col == "coverage" else None)
    ax.legend(fontsize=7)
fig.suptitle("answer-position attention and confidence, right vs wrong answers", fontsize=10)
fig.tight_layout()
_ = plots.save(fig, out, "hallucination_signal")
mid = lambda x: f"middle half {x.quantile(0.25):.2f} to {x.quantile(0.75):.2f}"  # noqa: E731
print(f"coverage of right answers: {mid(A.coverage[~wrong])}; of wrong answers: {mid(A.coverage[wrong])}")

# %% [markdown]
# **How to read the histograms.** For the claim, wrong answers' coverage (orange) would sit *left* of the right
# answers' (blue). It sits right: the middle half of wrong answers lies at
# <!--num "notebooks/07_diagnostics.ipynb#out:coverage of right answers" re="of wrong answers: middle half ([0-9.]+ to [0-9.]+)"-->0.61 to 0.66<!--/num-->,
# of right ones at <!--num "notebooks/07_diagnostics.ipynb#out:coverage of right answers" re="right answers: middle half ([0-9.]+ to [0-9.]+)"-->0.55 to 0.64<!--/num-->: wrong answers read the image *more*.
# Concentration (middle) points the claim's way, but weakly: AUROC
# <!--num "notebooks/07_diagnostics.ipynb#out:AUROC for wrong answers > concentration (low = suspect)@0" fmt="{:.2f}"-->0.64<!--/num--> [<!--num "notebooks/07_diagnostics.ipynb#out:AUROC for wrong answers > concentration (low = suspect)@1" fmt="{:.2f}"-->0.52<!--/num-->,
# <!--num "notebooks/07_diagnostics.ipynb#out:AUROC for wrong answers > concentration (low = suspect)@2" fmt="{:.2f}"-->0.73<!--/num-->], short of the bar. The right panel shows why confidence wins:
# right answers pile up near 1, wrong ones spread far below.

# %%
n_wrong = int(wrong.sum())
if "lo" in roc:
    c, f = roc.loc["coverage (low = suspect)"], roc.loc["confidence (baseline)"]
    print(f"Coverage: AUROC {c.auroc:.2f} [{c.lo:.2f}, {c.hi:.2f}] as the claim orients it -> direction {c.direction},\n"
          f"  strength {c.strength:.2f}; separates: {c.separates}.")
    if c.direction == "inverted" and c.separates == "yes":
        print(wrap(f"  Read it as: wrong answers put MORE of their attention on the image than right ones (strength "
                   f"{c.strength:.2f}), the opposite of U12's mechanism."))
    print(f"Confidence: AUROC {f.auroc:.2f} [{f.lo:.2f}, {f.hi:.2f}] -> the baseline to beat.")
    absent = ((A.qtype == "exists") & (A.answer == "no")).to_numpy()
    if 2 <= int((wrong & absent).sum()) <= int(absent.sum()) - 2:
        w = auroc_interval(-A.coverage[absent], wrong[absent])
        print(f"Within the {int(absent.sum())} absent-object questions only ({int((wrong & absent).sum())} wrong):\n  coverage AUROC "
              f"{w.value:.2f} [{w.lo:.2f}, {w.hi:.2f}] ({read_auroc(w)['direction']}; separates: {read_auroc(w)['separates']}).")
    half = float((roc.hi - roc.lo).max() / 2)
    print(wrap(f"What {n_wrong} wrong answers can show: an AUROC to about ±{half:.2f}, " + ("enough to tell whether a signal "
               "clears a 0.7 bar or points the other way" if half < 0.15 else "too wide to place a signal against a 0.7 bar")
               + ". What they cannot show: how the score behaves on "
               f"error types that barely occur here ({A[wrong].groupby(['qtype', 'answer']).size().to_dict()}), or on a "
               "model that errs for other reasons."))

# %% [markdown]
# **What this run shows.** The coverage signal is real but points the other way (AUROC
# <!--num "notebooks/07_diagnostics.ipynb#out:Coverage: AUROC@0" fmt="{:.2f}"-->0.31<!--/num-->, interval wholly below chance). Within the
# absent-object questions, where almost all errors sit, it is <!--num "notebooks/07_diagnostics.ipynb#out:Within the > coverage AUROC@0" fmt="{:.2f}"-->0.11<!--/num-->:
# a hallucinating answer reads the image *harder*. Confidence separates far better,
# and combining the two, coverage taken in the claim's direction, hurts (AUROC <!--num "notebooks/07_diagnostics.ipynb#out:coverage + confidence (rank mean)@0" fmt="{:.2f}"-->0.67<!--/num-->).
# So few errors of one kind make this a hypothesis to test on a larger model, not a rule.

# %% [markdown]
# ## 2. The modality-neglect detector (U10), healthy and broken
#
# Per layer, the image share of the text queries' reads; the detector fires under <!--const the detector's cut-off, the study's figure fixed before any run-->5%<!--/const--> (warns under
# <!--const the detector's warning level, fixed before any run-->15%<!--/const-->). Broken variants, by what
# each breaks:
# - **zeroed features**: what the image tokens carry (the projector's output set to zeros);
# - **blank image**: the picture's content (every pixel the image's mean colour);
# - **zeroed image values**: what reading an image key returns (image value vectors zeroed, weights untouched);
# - **masked attention**: the text's attention on the image from layer `MASK_FROM_LAYER` on — *caught by
#   construction*: it checks the plumbing, not U10.
#
# Beside it, a check blind to attention: **image dependence**, the mean [KL](../docs/GLOSSARY.md#kl) between the
# answers with the sample's image and with another's (near 0 = image ignored). **U10's bar**, fixed before any number:
# the healthy model stays above the cut-off in every layer, and each of the three unforced breaks falls under it in
# some layer. (A cross-attention VLM reads the image in layers of its own: there U10 is recorded not measurable.)

# %%
samples = sample_set.load(SAMPLES, per_type=PER_TYPE, seed=SAMPLE_SEED)
masked_name = DG.masked_name(MASK_FROM_LAYER)
variants, BREAKS = DG.broken_variants(model, processor, samples, MASK_FROM_LAYER, SEED)  # healthy + four breaks
det, shares = DG.detector_table(variants, BREAKS, family.image_part)

# %% tags=["nbval-check-output"]
from unicache_lib.pruning import evaluate as E  # noqa: E402

few_qas = qas[:200]  # each variant's accuracy, on 200 of §1's questions


def accuracy(questions):
    lp = E.answer_logprobs(model, processor, questions)
    return E.understanding_metrics(lp, lp, processor, questions)["accuracy"]


blank = [dataclasses.replace(q, scene=dataclasses.replace(q.scene, image=blank_image(q.scene.image))) for q in few_qas]
ACC = {DG.HEALTHY: accuracy(few_qas), "blank image": accuracy(blank)}
for name, broken in (("zeroed features", lambda: zero_image_features(model)), ("zeroed image values", lambda: zero_image_values(
        model, 0)), (masked_name, lambda: mask_image_attention(model, MASK_FROM_LAYER))):
    with broken():
        ACC[name] = accuracy(few_qas)
print(f"image share of text queries' reads, per layer, over {len(samples)} samples (cut-off {CUTOFF:.0%}, warning {WARN:.0%});\n"
      f"accuracy on {len(few_qas)} questions")
print(det.drop(columns=["breaks"]).assign(accuracy=pd.Series(ACC)).to_string(float_format=lambda x: f"{x:.3f}"))  # breaks: §2's list

# %% [markdown]
# **How to read the detector.** Healthy: every layer well above the dashed <!--const the detector's cut-off, the study's figure fixed before any run-->5%<!--/const--> line, with a large image
# dependence (its column in the table); neglect: a curve under it.

# %%
fig, ax = plt.subplots(figsize=(8, 3.4))
layer_cols = [c for c in det.columns if c.startswith("L")]
for name, row in det.iterrows():
    ax.plot(range(len(layer_cols)), row[layer_cols].astype(float), marker="o", label=name,  # what each breaks: §2's list
            ls=":" if name == masked_name else "-", lw=4 if name == DG.HEALTHY else 1.5, alpha=0.45 if name == DG.HEALTHY else 1,
            zorder=1 if name == DG.HEALTHY else 2)  # healthy drawn wide beneath: a break on the same shares stays visible
ax.axhline(CUTOFF, color="r", ls="--", lw=0.8, label=f"cut-off {CUTOFF:.0%} (U10)")
ax.axhline(WARN, color="orange", ls=":", lw=0.8, label=f"warning {WARN:.0%}")
ax.set_xticks(range(len(layer_cols)), [c[1:] for c in layer_cols])
ax.set_xlabel("layer")
ax.set(ylabel="image share of text queries' reads", ylim=(0, 1),
       title="fires on: " + (", ".join(n for n in det.index if det.loc[n, "fires"]) or "none"))
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes: the lines stay visible
fig.tight_layout()
_ = plots.save(fig, out, "neglect_detector")

# %%
hl = det.loc["healthy", layer_cols].astype(float)
dep0 = det.loc["healthy", "image dependence (KL)"]
print(f"Healthy: lowest layer {hl.idxmin()} at {hl.min():.3f} (cut-off {CUTOFF:.0%}); image dependence KL {dep0:.2f}.")
for n in [n for n in det.index if n not in ("healthy", masked_name)]:
    r = det.loc[n]
    dep = r["image dependence (KL)"]
    print(f"{n}: fires {bool(r.fires)}, lowest share {r[layer_cols].astype(float).min():.3f}, image dependence {dep:.3f}"
          f"; accuracy {ACC[n]:.3f} (healthy {ACC[DG.HEALTHY]:.3f})\n  -> "
          + ("the share sees it" if r.fires else "the share misses it; " + (
              "image dependence catches it (near 0)" if dep < 0.1 * dep0 else
              f"image dependence keeps {dep / dep0:.0%} of the healthy value, so it misses it too")))
print(f"accuracy under the three unforced breaks: at most {max(ACC[n] for n in det.index if n not in ('healthy', masked_name)):.3f}")
print(f"{masked_name}: fires {bool(det.loc[masked_name, 'fires'])} from layer {det.loc[masked_name, 'first cut-off layer']} "
      "(by construction: it zeroes the very share the detector reads).")

# %% [markdown]
# **This run.** The healthy model stays far above the cut-off (lowest layer
# <!--num "notebooks/07_diagnostics.ipynb#out:Healthy: lowest layer@0"-->0.394<!--/num-->), and so do all three breaks it is
# not forced to see: the share misses every one. Image dependence drops to near 0 under the two breaks that empty
# the image (zeroed features, blank image) but keeps
# <!--num "notebooks/07_diagnostics.ipynb#out:zeroed image values: fires > -> @0"-->56<!--/num-->% of its healthy value when only the
# values are zeroed. Accuracy tells all three: from
# <!--num "notebooks/07_diagnostics.ipynb#out:zeroed features: fires" re="healthy ([0-9.]+)"-->0.980<!--/num--> it falls to at most
# <!--num "notebooks/07_diagnostics.ipynb#out:accuracy under the three unforced breaks" re="at most ([0-9.]+)"-->0.460<!--/num--> (the table's last column).

# %% [markdown]
# ## 3. One call, one report
#
# `build_report` turns stores into figures and one self-contained HTML page; given explorers, it embeds them too. From
# a shell (figures only: a store holds no pictures or tokens): `unicache-report outputs/02_understanding_maps/stats
# tiny-mmdit=outputs/03_diffusion_steps/store/tiny-mmdit --out outputs/report`. Here the page also gets an explorer
# of the two questions above, every layer and head, so a reader can follow the answer position without a kernel.

# %%
import os  # noqa: E402
import re  # noqa: E402

from unicache_lib.capture.record import CaptureResult  # noqa: E402
from unicache_lib.explorer import attention_explorer  # noqa: E402

ustore, _ = stats_store_or_capture(project_path(UNDERSTANDING_STORE), out / "understanding_stats", MODEL, sample_seed=SAMPLE_SEED,
                                   model=model, processor=processor)
stores = {Path(MODEL).name: ustore}
if GENERATION_STORE:
    gname = Path(GENERATION_STORE).name
    stores[gname], _ = generation_store_or_capture(project_path(GENERATION_STORE), out / "generation_stats" / gname, load_generator(gname), gname)

# %%
explorers = {}
if picked:  # the two questions of the first figure: every layer and head, the answer position first
    explorer = attention_explorer(
        CaptureResult.from_records([x for recs in kept.values() for x in recs]),
        {k: qas[i].scene.uint8() for k, i in picked.items()},
        {k: processor.tokenizer.convert_ids_to_tokens(reads[k][2]["input_ids"][0].tolist()) for k in picked},
        {k: (family.image_grid(model.config, reads[k][2]), family.grid_tokens(model.config, reads[k][2])) for k in picked},
        {k: f"{qas[i].question} -> {A.prediction.iloc[i]} ({k})" for k, i in picked.items()})
    r_open = kept[next(iter(picked))][-1]  # the first figure's view: its layer, mean of heads, the answer position
    explorer.select(layer=r_open.layer, word=r_open.probs.shape[1] - 1, head="mean", view="t2i")
    explorers[f"{Path(MODEL).name}: the answer position, right and wrong"] = explorer
page = build_report(stores, out / "report", explorers=explorers)
html = page.read_text()
n_ex = html.count('class="ucx"')  # explorers embedded in the page
print(f"report: {os.path.relpath(page, project_path('.'))} ({page.stat().st_size // 1024} KB, {html.count('<img')} figures, "
      f"{n_ex} explorer{'s' * (n_ex != 1)})")
print(wrap("figures: " + ", ".join(re.findall(r'<img alt="([^"]+)"', html))))
if explorers:
    print(f"explorer: {explorer.data.summary()}; {explorer.nbytes / 1e6:.2f} MB of the 2 MB budget")

# %% [markdown]
# The figures (named above) are 02's and 03's, each read in its own lesson: the modality blocks, for one, are
# [02 §7](02_understanding_maps.ipynb)'s. What the page adds is the explorer below, drawn by the browser from the
# captured maps, the same in JupyterLab, on the course site or in the report opened from disk. It opens on the
# answer position, mean of heads, as the first figure; views: **t2i** (the token reading the picture), **i2t** (the
# patches reading the token), **full** (the whole map); sliders: layer, head, query token. Try the wrong answer's
# last layer head by head: which heads read the object it took for the asked one?

# %% tags=["nbval-ignore-output"]
explorer if explorers else None

# %% [markdown]
# ## 4. Claims scoreboard

# %%
from unicache_lib.claims import claims_table

claims_table("07_diagnostics")  # each claim (statement, why, rule) is written once, in unicache_lib/claims.py

# %% [markdown]
# Verdicts follow the [interval rule](../docs/GLOSSARY.md#interval), fixed before any number, per criterion:
# - **U10** (layer shares resampled over samples): (a) the healthy model's lowest layer above <!--const the detector's cut-off-->5%<!--/const--> (quiet);
#   (b) the highest of the three unforced breaks' lowest layers below it: the detector fires on every break. The
#   claim as worded does not promise this recall; the rule adds it because a cache must catch the cut-offs it causes;
# - **U12** (AUROCs resampled stratified, in the claim's direction): (a) coverage's AUROC above
#   <!--const U12's bar, written before the numbers-->0.7<!--/const--> in the claim's direction (an inverted signal does not pass; the scoreboard's 'measured' line, under 'rule, notes', names the direction); (b) coverage's AUROC minus confidence's above 0.

# %% tags=["nbval-check-output"]
board = Scoreboard(random_weights=is_stand_in(MODEL), unstable=unstable_claims([MODEL]))
DG.declare(board)  # the rules of U10 and U12, as data in unicache_lib/analysis/diagnostics_claims.py
DG.measure_neglect(board, det, shares, family.cross_attention)
DG.measure_hallucination(board, A.coverage.to_numpy(), A.confidence.to_numpy(), wrong.to_numpy(), family.cross_attention)
board.save(out / "scoreboard.json")
print({c: r.verdict for c, r in board.rows.items()})

# %%
board.show()

# %% [markdown]
# **Reading the scoreboard.** U10
# <!--num data/results/07_diagnostics.json#[claim=U10].verdict-->partly<!--/num-->: quiet when healthy (a), blind to the breaks
# it is meant to catch (b): a share measures *where* the text looks, not whether what it finds carries anything. (a)
# and (b) print one value: the break whose lowest-layer share is highest, zeroed image values, has layer 0's share
# exactly the healthy one's (values enter no layer-0 weight), and layer 0 is the lowest layer of both. U12
# <!--num data/results/07_diagnostics.json#[claim=U12].verdict-->does not hold<!--/num-->, inverted; its (b), <!--num data/results/07_diagnostics.json#[claim=U12].criteria[name=b].value fmt="{:+.2f}"-->-0.64<!--/num-->, is coverage's AUROC minus confidence's. Both rest on proxies: U12 speaks of a *noun's*
# attention, measured here at the last prompt position (answers are one word); U10 of a layer's
# [cross-modal share](../docs/GLOSSARY.md#cross-modal-share), measured as the
# [image share](../docs/GLOSSARY.md#image-share) of the text queries' reads (§2).
#
# ## Recap: what this run showed
#
# - **U12** <!--num data/results/07_diagnostics.json#[claim=U12].verdict-->does not hold<!--/num-->: coverage AUROC <!--num "notebooks/07_diagnostics.ipynb#out:Coverage: AUROC@0" fmt="{:.2f}"-->0.31<!--/num-->,
#   inverted; confidence (<!--num "notebooks/07_diagnostics.ipynb#out:Confidence: AUROC@0" fmt="{:.2f}"-->0.95<!--/num-->) is the signal to beat. On
#   your model, monitor confidence before keying a cache on coverage.
# - **U10** <!--num data/results/07_diagnostics.json#[claim=U10].verdict-->partly<!--/num-->: the healthy model is quiet (lowest share
#   <!--num "notebooks/07_diagnostics.ipynb#out:Healthy: lowest layer@0"-->0.394<!--/num-->), but the share fires on none of the three real breaks,
#   and image dependence misses zeroed image values. After a cache or pruning change, run image dependence and
#   accuracy beside the share: only accuracy caught all three.
#
# The decision table, from this run's numbers:

# %%
DG.decisions(roc, det, n_wrong, len(A))  # every cell whole, also as plain text

# %% [markdown]
# ## Exercises
#
# Each starter leaves one gap (`# <- write`) and checks what you wrote. Solutions:
# [solutions/07_diagnostics.py](../solutions/07_diagnostics.py) (`--only K` runs one).
#
# 1. ★ Write `masked(from_layer)`: under `mask_image_attention(model, from_layer)`, the accuracy on `few_qas` and the
#    detector's first cut-off layer on `few_samples`. The starter checks the accuracy at §2's layer, then masks from
#    layer 1 and from layer 3: does accuracy fall with the first cut-off layer, and does the detector follow?
# 2. ★★ Write `coverage_auroc(layers)`: the AUROC for wrong answers of low coverage read from `layers` only
#    (`answer_attention(..., layers=...)`, on the questions `pick`). The starter checks it with every layer against
#    §1's coverage, then asks it of the *shallow* band: does the AUROC change, and in which direction?
# 3. ★★ Add another broken variant — images shuffled across samples — and predict the detector's verdict first.
#    Write `shuffle_images(samples, offset)`: copies of the samples, each showing the picture `offset` places along
#    the list. Is it a modality cut-off at all? What do image dependence and accuracy say?

# %%
# What the exercises share: `few_samples` (five standard samples), §2's 200 questions `few_qas` and `accuracy`
import copy  # noqa: E402
from unicache_lib.analysis.layers import band_layers  # noqa: E402
from unicache_lib.capture.runner import capture_samples  # noqa: E402
from unicache_lib.diagnostics.neglect import detect_neglect, image_dependence  # noqa: E402
few_samples = samples[:5]


def image_records(ss):  # the detector's input: the captured records of the part that reads the image
    return [r for r in capture_samples(model, processor, ss, progress=False) if r.part == family.image_part]


# %%
# Exercise 1 starter: image attention masked from another layer; accuracy on §2's 200 questions, the detector on
# five standard samples
def masked(from_layer):
    """(accuracy on few_qas, the detector's first cut-off layer on few_samples) with the text's attention on the
    image masked from `from_layer` on."""
    ...  # <- write: the body (detect_neglect(image_records(...)) gives the detector's verdict)


mine = masked(MASK_FROM_LAYER)  # §2's variant
if mine is None:
    print(f"Write the body of `masked`, then run this cell again (§2's variant masked from {MASK_FROM_LAYER}).")
else:
    acc, cut = mine
    print(f"from layer {MASK_FROM_LAYER}: accuracy {acc:.3f} " + ("(correct: §2's)" if abs(acc - ACC[masked_name]) < 1e-9
                                                                  else f"(§2 measured {ACC[masked_name]:.3f})"))
    print(f"unmasked: accuracy {ACC[DG.HEALTHY]:.3f}")
    for layer in (1, 3):
        acc, cut = masked(layer)
        print(f"masked from layer {layer}: accuracy {acc:.3f}; detector's first cut-off layer {cut}")

# %%
# Exercise 2 starter: coverage from some layers only, on §1's wrong answers and 300 right ones (an AUROC does not
# depend on the share of wrong answers), beside all-layer coverage and confidence
pick = list(np.flatnonzero(wrong.to_numpy())) + list(np.flatnonzero(~wrong.to_numpy())[:300])
sub = A.iloc[pick]  # §1's answers to those questions


def coverage_auroc(layers):
    """The AUROC for sub's wrong answers of low coverage (-coverage) read from `layers` only (None: every layer),
    answer_attention run again on [qas[i] for i in pick]."""
    ...  # <- write: the body (auroc(score, is_wrong) from unicache_lib.diagnostics.roc)


if n_wrong < 2:
    print(f"{n_wrong} wrong answers: too few for an AUROC (raise N_QUESTIONS)")
elif (every := coverage_auroc(None)) is None:
    print(f"Write the body of `coverage_auroc`, then run this cell again ({n_wrong} wrong answers of {len(A)}).")
else:
    want = auroc(-sub.coverage.to_numpy(), ~sub.correct.to_numpy())  # §1's coverage on the same questions
    print(f"every layer: {every:.3f} " + ("(correct: §1's coverage)" if abs(every - want) < 1e-6 else f"(§1's: {want:.3f})"))
    shallow = band_layers(model.config.get_text_config().num_hidden_layers)["shallow"]
    print(f"shallow layers {shallow}: {coverage_auroc(shallow):.3f}; confidence (baseline): "
          f"{auroc(-sub.confidence.to_numpy(), ~sub.correct.to_numpy()):.3f}")

# %%
# Exercise 3 starter: every standard sample shown another sample's picture (questions likewise moved to another
# scene); detector, image dependence and accuracy against the healthy row of §2's table
offset = 1


def shuffle_images(ss, offset):
    """Copies of the samples `ss` (copy.copy), sample i showing the image of sample (i + offset) % len(ss)."""
    ...  # <- write: the body


shuffled = shuffle_images(samples, offset)
if shuffled is None:
    print(f"Write the body of `shuffle_images`, then run this cell again ({len(samples)} samples).")
elif [s.image is samples[(i + offset) % len(samples)].image for i, s in enumerate(shuffled)] != [True] * len(samples) \
        or any(a is b for a, b in zip(shuffled, samples)):
    print("want new sample objects (copy.copy), sample i with the image of sample (i + offset) % n")
else:
    moved = [dataclasses.replace(q, scene=few_qas[(i + offset) % len(few_qas)].scene) for i, q in enumerate(few_qas)]
    v = detect_neglect(image_records(shuffled))
    print(f"shuffled images: fires {v.fires}, lowest layer share {v.shares.min():.3f}, image dependence (KL) "
          f"{image_dependence(model, processor, shuffled, SEED):.2f}, accuracy {accuracy(moved):.3f} (200 questions)")
    print(det.loc[["healthy"], ["fires", "image dependence (KL)"]].to_string())

# %% [markdown]
# ## Next steps
#
# > **Your checkpoint.** Run this lesson on your model and compare with this run: the healthy lowest share against
# > <!--const the detector's cut-off, the study's figure fixed before any run-->5%<!--/const-->, the blank image's
# > image dependence against the healthy one's, and the coverage AUROC (its direction, its interval, the number of
# > wrong answers: enough to decide U12?):
# > `.venv/bin/papermill notebooks/07_diagnostics.ipynb outputs/07_mine.ipynb -p MODEL <path or hub id> -p N_QUESTIONS 1500`.
# > `solutions/07_diagnostics.py` (`next_steps`) does it on a random-weight stand-in of the LLaVA family.
