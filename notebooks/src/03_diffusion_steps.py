# ---
# jupyter:
#   unicache:
#     figure_kind: overlay
#     first_figure:
#     - first_look_tiny-mmdit
#     - first_look_tiny-pixart
#     quick:
#       MAP_PROMPTS: 1
#       N_PAIRS: 2
#       N_SINGLE: 2
#       STEPS: 5
#       UNDERSTANDING_STORE: OUT/no-such-store
#     rules:
#     - unicache_lib.analysis.diffusion_claims:RULES
# ---

# %% [markdown]
# # 03 · How attention evolves over denoising steps (MMDiT and cross-attention DiT)
#
# **What you will learn**: to capture a diffusion transformer's attention at every denoising step without changing
# a pixel; how focus and step-to-step similarity move over the steps; from which step a layer's attention could be
# reused, its [knee](../docs/GLOSSARY.md#knee) (the first step from which the cosine between adjacent steps stays
# above a line); how hard the prompt pulls per step; whether a word's attention lands on what it names. On these toy generators the study's line, <!--const the study's reuse threshold, the THRESHOLD parameter-->0.7<!--/const-->, puts every knee at step <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-mmdit: lowest adjacent-step cosine > settled by step@1"-->1<!--/num-->; a stricter line on
# the attention outputs shows a knee (section 4).
#
# *What you see:* section 0's first look: tiny-mmdit's picture, and its colour and shape words' attention over it,
# in × uniform (1 = an even spread); a miss: 'blue' lights the green circle.
#
# ![This lesson's first figure, from its last run](../docs/figures/03_diffusion_steps.png)

# %% [markdown]
# **Needs**: notebook 01 (capture, store) and, for G7, notebook 02's store (captured here if absent).
# Runs on the shipped `tiny-mmdit` (SD3 class: [joint attention](../docs/GLOSSARY.md#joint-attention) over
# `[image | text]`) and `tiny-pixart` (image self-attention plus image→text cross-attention), or on your diffusers
# folders (Next steps).
#
# **Time**: about <!--num @read_minutes:03_diffusion_steps fmt="{} min"-->15 min<!--/num--> to read; last run <!--num data/results/03_diffusion_steps.run.json#duration_s fmt="{:.0f} s" missing="not recorded yet"-->82 s<!--/num--> (2 CPU cores).
#
# **Claims.** Sections 3–9 each test one of the study's claims by a rule fixed before any run, printed where it is
# measured. The *weaker model* decides: the one whose 95% interval is less favourable to the claim
# ([verdicts](../docs/GLOSSARY.md#verdicts)).
#
# Terms: [phase](../docs/GLOSSARY.md#phase) (early = the first <!--const the phase boundaries, a definition fixed before any run-->20%<!--/const--> of the steps, middle = up to <!--const the phase boundaries, a definition fixed before any run-->60%<!--/const-->, late = the rest),
# [CFG](../docs/GLOSSARY.md#cfg), [IoU](../docs/GLOSSARY.md#iou). `X->Y` = queries of X reading keys of Y.

# %% tags=["parameters"]
GENERATORS = ["tiny-mmdit", "tiny-pixart"]   # shipped names or diffusers pipeline folders
DEVICE = "cpu"                # "cpu", "cuda" or "auto" (generators)
DTYPE = "float32"             # weights; statistics are fp32 always
LAYERS = None                 # blocks to capture (None = all; e.g. [0, 11, 23] on a 24-block model)
MAP_QUERY_STRIDE = 1          # keep every k-th query row of the widget's full maps (memory at real sizes)
N_SINGLE = 16                 # one-object prompts (each once short and once long)
N_PAIRS = 8                   # two-object prompts, half of them with both objects in one colour
PROMPTS = None                # your own prompts: a prompts.jsonl (pairs: two objects; make samples: an example)
STEPS = 20                    # denoising steps
GUIDANCE = 3.0                # classifier-free guidance scale
SEED = 0                      # prompt i is sampled with seed SEED + i
THRESHOLD = 0.7               # adjacent-step similarity that counts as safe to reuse (the study's)
STRICT_THRESHOLD = 0.99       # a second, stricter one: on the shipped generators only this one separates layers
MAP_PROMPTS = 2               # prompts whose full maps are kept for the widget
MODEL = "tiny-llava"
UNDERSTANDING_STORE = "outputs/02_understanding_maps/stats"
OUT_DIR = "outputs/03_diffusion_steps"
SAMPLE_SEED = 2024            # standard set behind the understanding store for G7, 2024 is the shipped set

# %%
from unicache_lib.params import check_params

check_params(globals())  # every parameter above, before anything loads: a bad value stops here, naming itself

# %%
import os

import numpy as np
import pandas as pd
import torch

from unicache_lib import plots
from unicache_lib.analysis import diffusion_claims as DC
from unicache_lib.analysis import generation as G
from unicache_lib.capture.gen_runner import capture_generation
from unicache_lib.capture.runner import stats_store_or_capture
from unicache_lib.paths import project_path
from unicache_lib.replicate import unstable_claims
from unicache_lib.claims import REGISTRY
from unicache_lib.scoreboard import Scoreboard
from unicache_lib.tables import WrappedTable, wrap
from unicache_lib.store import Store, remove_store
from unicache_lib.world.segment import score_object
from unicache_lib.world.text import load_prompts, named_words, single_object
from unicache_lib.gen_families import gen_family_of
from unicache_lib.runtime.loaders import is_stand_in, load_generator, model_label

torch.manual_seed(SEED)
out = project_path(OUT_DIR)  # relative: from the repository root, wherever the kernel started
out.mkdir(parents=True, exist_ok=True)
paths = {model_label(m): m for m in GENERATORS}  # from here on a model is named by its label (outputs go under it)
gens = {m: load_generator(p, dtype=DTYPE, device=DEVICE) for m, p in paths.items()}
GENERATORS = list(gens)
prompts = load_prompts(PROMPTS, N_SINGLE, N_PAIRS, SEED)  # N_SINGLE prompts, then N_PAIRS two-object ones
n_prompts = len(prompts)
board = Scoreboard(random_weights=any(is_stand_in(p) for p in paths.values()), unstable=unstable_claims([*GENERATORS, MODEL]))
DC.declare(board)  # the claims' rules, as data (unicache_lib/analysis/diffusion_claims.py); each section measures its claim
rule = lambda cid: wrap(f"{cid}, the study's claim: {REGISTRY[cid].statement}\n  rule: {REGISTRY[cid].rule}")  # noqa: E731

# %%
# Section 0's helpers: the prompt a generator draws, its word maps, and where each word's brightest patch lies
from unicache_lib.analysis.word_regions import (distinct_objects, drawn_objects, fully_drawn, object_masks,
                                               peak_objects, word_region_table)
from unicache_lib.world.scenes import grid_cover


def first_drawn(g, cands):
    """(prompt index, run, how many tried): the first of ``cands`` that ``g`` draws in full, else the last tried."""
    for n, i in enumerate(cands, 1):
        run = capture_generation(g, [prompts[i]["short"]], "look", None, STEPS, GUIDANCE, SEED + i, layers=LAYERS)
        if fully_drawn(run.images[0], prompts[i]):
            break
    return i, run, n


def named_maps(run, k, p):
    """word -> its map (image queries' attention to it, :func:`G.word_maps`) for prompt ``p``'s colour and shape
    words (your prompts: content words), and the number of real text tokens."""
    W, words, maps = G.word_maps(run.result.records, run.sample_ids[k]), set(named_words(p)), {}
    for j, t in enumerate(run.tokens[k]):
        if t in words:
            maps[t if t not in maps else f"{t} (again)"] = W[j]  # a repeated word keeps both panels
    return maps, W.shape[0]


def keys_read(m, n_real):
    """Keys an image query reads (1 × uniform = 1/keys): joint attention, image and text positions; cross, the words."""
    joint = "joint" in gen_family_of(gens[m].transformer).parts
    return gens[m].image_tokens + gens[m].text_tokens if joint else n_real


def peak_words(img, p, maps, patch):
    """Each word's brightest patch: on which object, and how much of that patch the object covers."""
    peaks = peak_objects(img, p, maps)
    cover = grid_cover(object_masks(img, p), patch) if peaks else None
    return [f"{w!r} on " + (f"the {o} ({cover[:, int(np.argmax(maps[w]))].max():.0%} of the patch)" if o else "background")
            + ("" if not o or w.split()[0] in o.split() else " <- another object") for w, o in peaks.items()]


# %% [markdown]
# ## 0. A first look: does a word look at what it names?
#
# For each generator, the first prompt it draws in full (two different objects if it can). Left, the picture; right,
# the image queries' attention to each colour and shape word, averaged over heads, layers and steps, in × uniform
# (1 = an even spread). The two figures have different scales: read each colour bar's top.

# %%
cands = [i for i in range(N_SINGLE, N_SINGLE + N_PAIRS) if distinct_objects(prompts[i])] + list(range(min(N_SINGLE, 2)))
look, look_at, tried, word_maps = {}, {}, {}, {}
for m, g in gens.items():  # each generator's first candidate drawn in full: pairs first, then one-object prompts
    look_at[m], look[m], tried[m] = first_drawn(g, cands or [0])
    p = prompts[look_at[m]]
    word_maps[m], n_real = named_maps(look[m], 0, p)
    if not word_maps[m]:  # your own prompts: no content word is one of the transformer's tokens
        print(f"{m}: no word of {p['short']!r} is a whole token here: no word map to draw")
        continue
    keys = keys_read(m, n_real)
    fig = plots.word_regions(look[m].images[0], word_maps[m], f"{m}: {p['short']!r}", keys=keys)
    _ = plots.save(fig, out, f"first_look_{m}")
    print(f"{m}: an image query reads {keys} keys (1 × uniform = 1/{keys}); the brightest word peaks at "
          f"{max(float(v.max()) for v in word_maps[m].values()) * keys:.1f} × uniform")

# %% tags=["nbval-check-output"]
for m, run in look.items():
    p, img = prompts[look_at[m]], run.images[0]
    print(f"{m}: prompt {look_at[m]}, {len(p.get('objects') or [])} object(s), "
          + ("drawn in full" if fully_drawn(img, p) else "not drawn in full") + f" ({tried[m]} tried)")
    said = "; ".join(f"{d['asked']} -> " + (f"a {d['drawn']} ({d['position']})" if d["drawn"] else "nothing in that colour")
                     + ("" if d["shape_ok"] else "  <- not what was asked") for d in drawn_objects(img, p))
    print("   " + (said or "not measurable with these prompts: none lists objects the detector knows (add 'objects' to prompts.jsonl)"))
    patch = gens[m].image_size // int(round(gens[m].image_tokens ** 0.5))  # pixels per image token's side
    wr = word_region_table(run, [p], patch)
    print(wrap("   word regions on the drawn objects: " + (", ".join(
        f"{p['objects'][r.object][r.role]!r} IoU {r.iou:.2f} (chance {r.chance:.2f})" for r in wr[wr.role != "binding overlap"].itertuples())
        or "none (no asked object was drawn)")))
    print("   each word's brightest patch:" + ("".join(f"\n     {w}" for w in peak_words(img, p, word_maps.get(m, {}), patch))
                                               or " not measurable here"))

# %% [markdown]
# **What to look at.** Healthy: a bright blob on the drawn object the word names. Two scales: brightness in
# × uniform, and the IoU of the word's top patches with its object against a random region's ("chance").
#
# The MMDiT drew both objects and its brightest word reaches <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-mmdit: an image query reads@4" fmt="{:.1f}"-->12.1<!--/num--> × uniform, but off target: no word's
# brightest patch is on its own object, and <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-mmdit: prompt > each word's brightest patch > 'blue' on" re="('blue' on .*)$"-->'blue' on the green circle (100% of the patch) <- another object<!--/num-->
# (a binding error). Its best IoU, 'circle''s <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-mmdit: prompt > word regions on the drawn objects@2" fmt="{:.2f}"-->0.12<!--/num-->, is near chance (<!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-mmdit: prompt > word regions on the drawn objects@3" fmt="{:.2f}"-->0.08<!--/num-->). Bright is not placed.
#
# PixArt drew no tried two-object prompt in full, so it shows a one-object one. Its image queries weigh other
# prompt tokens, so no named word exceeds <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-pixart: an image query reads@4" fmt="{:.1f}"-->1.0<!--/num--> × uniform; yet the colour word's top patches are the object's: IoU
# <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-pixart: prompt > word regions on the drawn objects@0" fmt="{:.2f}"-->1.00<!--/num--> (chance <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-pixart: prompt > word regions on the drawn objects@1" fmt="{:.2f}"-->0.03<!--/num-->).
#
# ('triangle''s IoU, <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-pixart: prompt > word regions on the drawn objects@2" fmt="{:.2f}"-->0.00<!--/num-->, is no miss: its brightest patch is only <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-pixart: prompt > each word's brightest patch > 'triangle' on" re="'triangle' on the green triangle [(]([0-9]+%)"-->19%<!--/num--> triangle, under the
# <!--const the cover at which IoU counts a patch as an object's (patch_grid_masks)-->25%<!--/const--> IoU needs.) Section 9 measures all prompts (G9). The models, the prompts and the run:

# %%
for m, g in gens.items():
    fam = gen_family_of(g.transformer)
    sites = fam.sites(g.transformer)
    print(f"{m}: {type(g.transformer).__name__} ({fam.name}), {len({s.layer for s in sites})} blocks x "
          f"{sites[0].module.heads} heads, {g.image_tokens} image tokens, {g.image_size} px"
          + (f", sampled through {type(g.pipe).__name__}" if getattr(g, "pipe", None) is not None else ""))
print(f"{len(prompts)} prompts ({N_SINGLE} single, {N_PAIRS} pairs), each short and long; {STEPS} steps, guidance {GUIDANCE}")
print(wrap(f"e.g. {prompts[0]['short']!r} / {prompts[0]['long']!r}"))

# %% [markdown]
# ## 1. Capture every step
#
# `capture_generation` wraps each attention module's processor: the original still produces the output, and the
# wrapper recomputes `softmax(QKᵀ/√d + mask)` in float32 for the statistics, one record per (prompt, part, layer,
# step); full maps only for `MAP_PROMPTS` prompts. First, the promise that capture changes nothing:

# %% tags=["nbval-check-output"]
from unicache_lib.capture.diffusion import DiffusionCapture
from unicache_lib.runtime.sampling import sample

for m, g in gens.items():
    few = [p["short"] for p in prompts[:2]]
    plain = sample(g, few, STEPS, GUIDANCE, seed=SEED)
    with DiffusionCapture(g.transformer, ["check/0", "check/1"], layers=LAYERS) as cap:
        captured = sample(g, few, STEPS, GUIDANCE, seed=SEED, callbacks=[cap])
    print(f"{m}: max |image with capture - without| = {float((plain - captured).abs().max()):.1e} "
          f"over {len(cap.result)} records")

# %%
runs = {}
for m, g in gens.items():
    for p in (out / "store" / m, out / "maps" / m):
        if p.exists():
            remove_store(p)  # this notebook's own output of an earlier run (refused while another process writes it)
    store = Store(out / "store" / m, meta={"model": m})
    for kind in ("short", "long"):
        meta = [{"kind": kind, "pair": p["pair"], "id": p["id"]} for p in prompts]
        runs[m, kind] = capture_generation(g, [p[kind] for p in prompts], kind, store, STEPS, GUIDANCE, SEED,
                                           meta=meta, layers=LAYERS)
    maps = capture_generation(g, [p["short"] for p in prompts[:MAP_PROMPTS]], "maps", Store(out / "maps" / m, meta={"model": m}),
                              STEPS, GUIDANCE, SEED, mode="full", layers=LAYERS, query_stride=MAP_QUERY_STRIDE)
    runs[m, "maps"] = maps
T = pd.concat([G.step_table(Store(out / "store" / m).read()).assign(model=m) for m in GENERATORS], ignore_index=True)
print(T.groupby(["model", "part"]).agg(records=("step", "size"), prompts=("sample", "nunique"),
                                       layers=("layer", "nunique"), steps=("step", "nunique")).to_string())

# %% [markdown]
# ## 2. Are the pictures right?
#
# Word maps mean something only where the model drew what was asked. Each single-object image is segmented by
# colour and scored (share right); each two-object prompt gets one outcome: "swapped" is a binding error (each shape
# drawn on the other's side), "one missing" an asked colour with no pixels.

# %% tags=["nbval-check-output"]
follow = []
for (m, kind), run in runs.items():
    if kind == "maps":
        continue
    for p, img in zip(prompts[:N_SINGLE], run.images[:N_SINGLE]):
        follow.append({"model": m, "kind": kind, **score_object(img, single_object(p))})  # NaN: not judged
follow = pd.DataFrame(follow)
if follow.colour.notna().any():
    print(follow.groupby(["model", "kind"])[["colour", "position", "shape"]].mean().round(3).to_string())
    print(f"n = {int(follow.colour.notna().sum() // (len(runs) - len(GENERATORS)))} single-object prompts per row")
else:
    print("not measurable with these prompts: none lists an object the detector knows (add 'objects' to prompts.jsonl)")


def pair_outcome(img, p):
    d = drawn_objects(img, p)
    if all(x["shape_ok"] for x in d):
        return "both right"
    if any(x["drawn"] is None for x in d):
        return "one missing"
    if [x["drawn"] for x in d] == [o["shape"] for o in p["objects"][::-1]]:
        return "swapped"
    return "wrong shape"


pairs = pd.DataFrame([{"model": m, "pair": p["pair"], "outcome": pair_outcome(img, p)}
                      for m in GENERATORS for p, img in zip(prompts[N_SINGLE:], runs[m, "short"].images[N_SINGLE:])])
if len(pairs):
    print(pairs.groupby(["model", "pair"]).outcome.value_counts().unstack(fill_value=0).to_string())
    print(f"n = {N_PAIRS} two-object prompts per model (short)")

# %% [markdown]
# The MMDiT follows single-object prompts; PixArt gets colour and position right, the shape in only <!--num "notebooks/03_diffusion_steps.ipynb#out:colour  position  shape > tiny-pixart long > short@2" fmt="{:.3f}"-->0.688<!--/num--> of the
# short prompts. The MMDiT gets every different-colour pair right but of its same-colour pairs swaps the shapes in
# <!--num "notebooks/03_diffusion_steps.ipynb#out:both right  one missing > tiny-mmdit > same@2"-->2<!--/num--> and draws a wrong shape in <!--num "notebooks/03_diffusion_steps.ipynb#out:both right  one missing > tiny-mmdit > same@3"-->1<!--/num-->;
# PixArt draws only one object of every same-colour pair and no different-colour pair fully right.

# %%
import matplotlib.pyplot as plt

fig, axes = plt.subplots(len(GENERATORS), 8, figsize=(12, 1.8 * len(GENERATORS)), squeeze=False)
for i, m in enumerate(GENERATORS):
    for j, ax in enumerate(axes[i]):
        k = j * max(1, len(prompts) // 8) % len(prompts)
        ax.imshow(runs[m, "short"].images[k])
        ax.set_title(prompts[k]["short"].replace(" and ", "\n& "), fontsize=6)
        ax.set_axis_off()
    axes[i][0].text(-4, 16, m, rotation=90, va="center", ha="right", fontsize=8)
fig.tight_layout()
_ = plots.save(fig, out, "samples")

# %% [markdown]
# **What you see.** Every third prompt (the MMDiT above, PixArt below). Both place single objects where asked,
# PixArt with ragged edges. The two pairs on the right show the table's failures: the MMDiT's orange "circle" is
# barely rounder than its square; PixArt drops the circle, and draws the last pair both purple (the blue object
# missing), the shapes in each other's places.
#
# ## 3. From diffuse to focused? Entropy per step and layer (G1)
#
# Normalised entropy of the image queries' rows (1 = uniform over their keys) and their mean maximum weight;
# bands: one standard deviation over the short prompts.

# %%
def per_step(df, col):
    """``[n_prompts, n_steps]`` of ``col`` averaged over layers."""
    return df.groupby(["sample", "step"])[col].mean().unstack("step").to_numpy()

views = [(m, p) for m in GENERATORS for p in sorted(T[T.model == m].part.unique())]
fig, axes = plt.subplots(1, len(views), figsize=(4.2 * len(views), 3.2), squeeze=False, sharey=True)  # one scale
for ax, (m, p) in zip(axes[0], views):
    d = T[(T.model == m) & (T.part == p) & (T.kind == "short")]
    plots.step_curves({"entropy": per_step(d, "img_entropy"), "max weight": per_step(d, "img_max")},
                      f"{m} · {p}", "image-query rows", ax=ax)
axes[0][0].set_ylim(0, 1)  # both are shares: 0 to 1 on every panel
fig.tight_layout()
_ = plots.save(fig, out, "entropy_per_step")

# %% tags=["nbval-check-output"]
print(rule("G1"))  # judged in section 4, with G2
phase_tab = (T[T.kind == "short"].groupby(["model", "part", "layer", "phase"]).img_entropy.mean()
             .unstack("phase")[list(G.PHASES)])
phase_tab["early-late"] = phase_tab["early"] - phase_tab["late"]
phase_tab.round(4).to_csv(out / "entropy_phases.csv")  # every (model, part, layer): early, middle, late, early-late
g1_layers = phase_tab["early-late"] >= 0.02
fall = phase_tab["early-late"].unstack("layer").round(3)  # one row per (model, part), one column per layer
fall.columns = [f"layer {layer}" for layer in fall.columns]
print("image-query entropy, early minus late (above 0: focuses late):")
print(fall.to_string())
print(f"cells whose entropy falls by >= 0.02 from early to late: {int(g1_layers.sum())} of {len(g1_layers)}"
      f"\n(every phase's entropy per layer: {os.path.relpath(out / 'entropy_phases.csv', project_path('.'))})")

# %% [markdown]
# **What to look at.** Coarse to fine is entropy falling (max weight rising) over the steps. Only PixArt's
# cross-attention does so; the other two sink to the middle steps and climb late. Per layer (the table), PixArt's
# cross-attention falls in every layer (layer 0 by
# <!--num "notebooks/03_diffusion_steps.ipynb#out:early minus late (above 0 > tiny-pixart cross@0" fmt="{:.3f}"-->0.127<!--/num-->); the MMDiT's *rises* in every block but the last (block 0: <!--num "notebooks/03_diffusion_steps.ipynb#out:early minus late (above 0 > tiny-mmdit@0" fmt="{:+.3f}"-->-0.155<!--/num-->).
#
# <!--num "notebooks/03_diffusion_steps.ipynb#out:cells whose entropy falls by@1"-->7<!--/num--> of <!--num "notebooks/03_diffusion_steps.ipynb#out:cells whose entropy falls by@2"-->12<!--/num--> cells fall by at least
# <!--const G1's threshold, written before the numbers-->0.02<!--/const-->, but the weaker model, the MMDiT, decides G1 (section 4).
#
# ## 4. When do adjacent steps look alike? (G2)
#
# Cosine between step *s* and step *s−1* of the maps and of the attention *outputs* (what a reuse cache would hand
# on). Dashed: `THRESHOLD` (the study's); dotted: `STRICT_THRESHOLD`.

# %%
fig, axes = plt.subplots(1, len(views), figsize=(4.2 * len(views), 3.2), squeeze=False)
for ax, (m, p) in zip(axes[0], views):
    d = T[(T.model == m) & (T.part == p) & (T.kind == "short")]
    plots.step_curves({"maps": per_step(d, "sim"), "outputs": per_step(d, "out_sim_img")}, f"{m} · {p}",
                      "cosine with previous step", threshold=THRESHOLD, ax=ax)
    ax.axhline(STRICT_THRESHOLD, color="k", ls=":", lw=0.8)
fig.tight_layout()
_ = plots.save(fig, out, "adjacent_similarity")

# %% tags=["nbval-check-output"]
short_T = T[T.kind == "short"]
knees = G.knee_table(short_T, (THRESHOLD, STRICT_THRESHOLD))  # one row per (model, part, layer)
for col, c in (("sim", ""), ("out_sim_img", "out ")):
    by_phase = short_T.groupby(["model", "part", "layer", "phase"])[col].mean().unstack("phase").reindex(columns=list(G.PHASES))
    knees[f"early {c}sim"], knees[f"late {c}sim"] = by_phase["early"], by_phase["late"]  # step 0 has no previous step
knees.to_csv(out / "knees.csv")  # one row per (model, part, layer): knees and similarities, maps and outputs
per_part = knees.groupby(level=["model", "part"])  # the layers of one (model, part) on one line
knee_list = lambda ks: " ".join("never" if k != k else str(int(k)) for k in ks)  # noqa: E731 - "never": no settling
print(pd.DataFrame({**{f"maps' knees @{t:g}": per_part[f"knee (maps) @{t:g}"].agg(knee_list) for t in (THRESHOLD, STRICT_THRESHOLD)},
                    "min sim": per_part["min sim"].min(), "early sim": per_part["early sim"].mean(),
                    "late sim": per_part["late sim"].mean()}).round(3).to_string())  # knees: layer 0 first
print("every layer's knees and similarities, maps and outputs:", os.path.relpath(out / "knees.csv", project_path(".")))
for (m, p), d in short_T.groupby(["model", "part"]):  # the outputs' curve per step, mean over layers and prompts
    o = d.groupby("step").out_sim_img.mean()
    print(f"{m} {p}: output cosine highest {o.max():.3f} (step {int(o.idxmax())}), {o.iloc[-1]:.3f} at the last step;\n  "
          f"output knee at {STRICT_THRESHOLD:g}: never in {int(knees.loc[(m, p), f'knee (outputs) @{STRICT_THRESHOLD:g}'].isna().sum())} of {d.layer.nunique()} layers")
window = {(m, t): G.reuse_window(knees.loc[m, f"knee (maps) @{t:g}"], STEPS) for m in GENERATORS for t in (THRESHOLD, STRICT_THRESHOLD)}
for m in GENERATORS:
    print(f"{m}: lowest adjacent-step cosine {knees.loc[m, 'min sim'].min():.3f}" + "".join(
        f"\n  at {t:g} " + (f"every layer has settled by step {w['start']}: whole steps {w['start']}..{STEPS - 2} could be reused "
                        f"unchanged ({w['reusable']} of {STEPS})" if w["start"] is not None
                        else "some layer never settles: no window to reuse whole steps unchanged")
        for t in (THRESHOLD, STRICT_THRESHOLD) for w in [window[m, t]]))

# %% [markdown]
# **What to look at.** Every curve dips at step 1; then the maps stay near 1 while the MMDiT's and PixArt's
# self-attention outputs fall again over the last steps (PixArt's cross-attention outputs dip mid-run instead, below). The lowest adjacent-step cosine of any layer is <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-mmdit: lowest adjacent-step cosine@0" fmt="{:.3f}"-->0.977<!--/num--> (MMDiT) and <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-pixart: lowest adjacent-step cosine@0" fmt="{:.3f}"-->0.971<!--/num-->
# (PixArt), so at the study's <!--const the study's reuse threshold, the THRESHOLD parameter-->0.7<!--/const--> every knee is step
# <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-mmdit: lowest adjacent-step cosine > settled by step@1"-->1<!--/num-->: that line cannot tell layers apart.
#
# The *outputs* fall late, to <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-mmdit joint: output cosine" re="([0-9.]+) at the last step"-->0.938<!--/num--> at the MMDiT's last step
# (PixArt self-attention <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-pixart self: output cosine" re="([0-9.]+) at the last step"-->0.965<!--/num-->); at the strict line the MMDiT's outputs never
# settle (<!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-mmdit joint: output cosine > output knee" re="never in ([0-9]+ of [0-9]+)"-->4 of 4<!--/num--> layers). By output the last steps are the least reusable; 06's G3 finds late-only reuse safe because it reuses little.
#
# **The knee, where it shows.** The output curve whose knee at `STRICT_THRESHOLD` comes latest, one line per layer
# (strict line dashed, each knee dotted). The y-axis is zoomed: every point is near 1.

# %% tags=["nbval-check-output"]
kcol = f"knee (outputs) @{STRICT_THRESHOLD:g}"
latest = knees[kcol].groupby(level=["model", "part"]).max()  # each (model, part): its latest knee over layers
if latest.notna().any() and latest.max() > 1:
    km, kp = latest.idxmax()
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    below = {}  # layer -> the steps its curve lies under the strict line
    for layer, dl in short_T[(short_T.model == km) & (short_T.part == kp)].groupby("layer"):
        curve, k = dl[dl.step > 0].groupby("step").out_sim_img.mean(), knees.loc[(km, kp, layer), kcol]
        below[layer] = curve[curve < STRICT_THRESHOLD]
        line, = ax.plot(curve.index, curve.values, marker=".", label=f"layer {layer}: knee "
                        + (f"step {int(k)}" if k == k else "never"))
        if k == k:
            ax.axvline(k, color=line.get_color(), ls=":", lw=1)
    ax.axhline(STRICT_THRESHOLD, color="k", ls="--", lw=0.8)
    ax.set(xlabel="denoising step", ylabel="output cosine with previous step", title=f"{km} · {kp}: the knee")
    ax.legend(fontsize=7)
    _ = plots.save(fig, out, "knee")
    print(f"a knee shows: {km} {kp} outputs at {STRICT_THRESHOLD:g}, latest knee step {int(latest.max())}")
    for layer, k in knees.loc[(km, kp), kcol].items():  # where each curve lies under the line, and its knee
        b, spans = below[layer], []
        for s in b.index:  # consecutive steps joined: 8, 9, 10 -> "8-10"
            spans[-1:] = [[spans[-1][0], s]] if spans and s == spans[-1][1] + 1 else spans[-1:] + [[s, s]]
        print(f"  layer {layer}: knee " + (f"step {int(k)}" if k == k else "never") + "; under the line at "
              + (", ".join(f"step {a}" if a == z else f"steps {a}-{z}" for a, z in spans)
                 + f" (lowest {b.min():.3f})" if len(b) else "no step"))
else:
    print(f"no knee after step 1 at {STRICT_THRESHOLD:g} on any output curve: raise STRICT_THRESHOLD or lower STEPS")

# %% [markdown]
# **What you see.** A knee is a curve's last crossing of the strict line (the lines printed above). Layer 0 never
# drops under it; the others start under it, and layers 1 and 2 drop under it again mid-run (layer 1 at <!--num "notebooks/03_diffusion_steps.ipynb#out:a knee shows: > layer 1:" re="(steps [0-9]+-[0-9]+)"-->steps 8-12<!--/num-->), so their knees come late. Reusing these outputs unchanged, which needs every layer settled,
# could start only at step <!--num "notebooks/03_diffusion_steps.ipynb#out:a knee shows:" re="latest knee step ([0-9]+)"-->13<!--/num-->, or each layer at its own knee. That holds for
# <!--num "notebooks/03_diffusion_steps.ipynb#out:a knee shows:" re="shows: (.*) outputs at"-->tiny-pixart cross<!--/num--> only: PixArt's self-attention outputs never settle (the table above).

# %% tags=["nbval-check-output"]
# G1 (section 3's entropy, early minus late) and G2 (these similarities), each on the weaker model, over prompts
print(rule("G2"))
DC.measure_focus_and_similarity(board, DC.with_prompt(T), GENERATORS, n_prompts,
                                f"{int(g1_layers.sum())}/{len(g1_layers)} cells fall >= 0.02", knees, STEPS)
print(board.criteria_lines("G1", "G2"))

# %% [markdown]
# **Verdicts.** G2 is <!--num "notebooks/03_diffusion_steps.ipynb#out:G2 verdict" re="verdict: (\w[\w ]*)"-->partly<!--/num-->: late above <!--const G2's threshold, written before the numbers-->0.8<!--/const--> holds, early below <!--const G2's threshold, written before the numbers-->0.6<!--/const--> fails (<!--num "notebooks/03_diffusion_steps.ipynb#out:G2 (b):@0" fmt="{:.2f}"-->0.99<!--/num-->).
#
# G1 <!--num "notebooks/03_diffusion_steps.ipynb#out:G1 verdict" re="verdict: (\w[\w ]*)"-->does not hold<!--/num-->: the MMDiT's early minus late lies below zero (its maps spread late).
#
# ## 5. How hard does the prompt pull, step by step? (G6)
#
# Short vs long prompts (the long ones add clauses that do not change the picture):
# - **guidance strength** `‖v_cond − v_uncond‖ / ‖v_uncond‖`: how much the prompt changes the update;
# - **text share**: image queries' mass on text keys, padding included (MMDiT only);
# - **text entropy**: how evenly image queries spread over the real prompt tokens (near 1: a "collapse").

# %%
gdf = pd.concat([pd.DataFrame(runs[m, k].guidance).assign(model=m, kind=k) for m in GENERATORS for k in ("short", "long")])
fig, axes = plt.subplots(1, 3, figsize=(13, 3.2))
for m in GENERATORS:
    for k in ("short", "long"):
        v = gdf[(gdf.model == m) & (gdf.kind == k)].drop(columns=["model", "kind"]).to_numpy(dtype=float)
        if np.isfinite(v).any():  # a guidance-distilled model (Flux.1-dev) has no unconditional branch
            plots.step_curves({f"{m} {k}": v}, "guidance strength", "relative", ax=axes[0])
        d = T[(T.model == m) & (T.kind == k) & (T.part != "self")]
        plots.step_curves({f"{m} {k}": per_step(d, "text_entropy")}, "text entropy (image queries)", "normalised", ax=axes[2])
        if m in T[T.part == "joint"].model.unique():
            plots.step_curves({f"{m} {k}": per_step(d, "text_share")}, "text share (joint attention)", "share", ax=axes[1])
fig.tight_layout()
_ = plots.save(fig, out, "text_conditioning")

# %% tags=["nbval-check-output"]
cond_rows = []
for m in GENERATORS:
    for k in ("short", "long"):
        gv = gdf[(gdf.model == m) & (gdf.kind == k)].drop(columns=["model", "kind"]).to_numpy()
        d = T[(T.model == m) & (T.kind == k) & (T.part != "self")]
        ph = d.groupby("phase")[["text_share", "text_entropy"]].mean()
        row = {"model": m, "kind": k}
        for f in G.PHASES:
            idx = [s for s in range(STEPS) if G.phase_of(s, STEPS) == f]
            row[f"guidance {f}"] = np.nanmean(gv[:, idx]) if gv.shape[1] == STEPS and np.isfinite(gv[:, idx]).any() else float("nan")
        for f in G.PHASES:
            row[f"text entropy {f}"] = ph.loc[f, "text_entropy"]
        row["text share early"], row["text share late"] = ph.loc["early", "text_share"], ph.loc["late", "text_share"]
        cond_rows.append(row)
cond = pd.DataFrame(cond_rows).set_index(["model", "kind"])
print("guidance strength and the text's reads by phase, mean over prompts:")
print(cond.set_axis(pd.MultiIndex.from_tuples([tuple(c.rsplit(" ", 1)) for c in cond.columns]), axis=1).round(3).to_string())
g_ends = {}  # model -> guidance strength at step 0 and at the last step (the decision table reads it)
for m in GENERATORS:  # the phase means above hide the last step: read it per step
    g_step = gdf[(gdf.model == m) & (gdf.kind == "short")].drop(columns=["model", "kind"]).to_numpy(dtype=float)
    if g_step.shape[1] == STEPS and np.isfinite(g_step).any():
        g_step = np.nanmean(g_step, 0)
        g_ends[m] = (float(g_step[0]), float(g_step[-1]))
        print(f"{m} (short): guidance strength {g_step[0]:.2f} at step 0, lowest {np.nanmin(g_step):.2f} (step {int(np.nanargmin(g_step))}), "
              f"{g_step[-1]:.2f} at the last step ({STEPS - 1})\n  "
              + ("the last step pulls harder than the first" if g_step[-1] > g_step[0] else "the first step pulls hardest"))

# %% tags=["nbval-check-output"]
print(rule("G6"))
DC.measure_conditioning(board, DC.with_prompt(T), gdf, cond, GENERATORS, n_prompts, STEPS)  # G6, weaker model
print(board.criteria_lines("G6"))

# %% [markdown]
# **What to look at.** Guidance (left) is strongest early (MMDiT
# <!--num "notebooks/03_diffusion_steps.ipynb#out:the text's reads by phase > tiny-mmdit  short@0" fmt="{:.3f}"-->0.182<!--/num--> early, <!--num "notebooks/03_diffusion_steps.ipynb#out:the text's reads by phase > tiny-mmdit  short@2" fmt="{:.3f}"-->0.088<!--/num--> late; PixArt
# <!--num "notebooks/03_diffusion_steps.ipynb#out:the text's reads by phase > tiny-pixart short@0" fmt="{:.3f}"-->0.134<!--/num-->, <!--num "notebooks/03_diffusion_steps.ipynb#out:the text's reads by phase > tiny-pixart short@2" fmt="{:.3f}"-->0.039<!--/num-->).
#
# It rises again at the last step, the MMDiT's (<!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-mmdit (short): guidance strength@4" fmt="{:.2f}"-->0.32<!--/num-->) above its step 0
# (<!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-mmdit (short): guidance strength@0" fmt="{:.2f}"-->0.30<!--/num-->): dropping the prompt side after the first steps would miss it.
#
# Long prompts do not collapse (right): middle-phase text entropy <!--num "notebooks/03_diffusion_steps.ipynb#out:the text's reads by phase > tiny-mmdit  short > long@4" fmt="{:.3f}"-->0.843<!--/num-->
# (MMDiT) and <!--num "notebooks/03_diffusion_steps.ipynb#out:the text's reads by phase > tiny-pixart short > long@4" fmt="{:.3f}"-->0.732<!--/num--> (PixArt), below G6's
# <!--const G6's threshold, written before the numbers-->0.9<!--/const-->, and only <!--num "notebooks/03_diffusion_steps.ipynb#out:G6 (c):@0" fmt="{:.3f}"-->0.012<!--/num--> above the short prompts' (rule (c)). So G6 is <!--num "notebooks/03_diffusion_steps.ipynb#out:G6 verdict" re="verdict: (\w[\w ]*)"-->partly<!--/num-->: guidance falls, nothing collapses.
#
# ## 6. Joint attention: which side is steadier? (G4)
#
# MMDiT only: step-to-step similarity of each block of the joint map (`ti`: text queries on image keys) and of the
# two output streams.

# %% tags=["nbval-check-output"]
jall = T[(T.part == "joint") & (T.step > 0)]
if len(jall):
    asym = jall.groupby("layer")[["sim_ii", "sim_it", "sim_ti", "sim_tt", "out_sim_img", "out_sim_txt"]].mean()
    asym["spread it"] = jall.groupby("layer").sim_it.std()
    asym["spread ti"] = jall.groupby("layer").sim_ti.std()
    print(asym.round(4).to_string())
    js = T[(T.part == "joint") & (T.kind == "short")]
    fig = plots.step_curves({b: per_step(js, f"sim_{b}") for b in ("it", "ti", "ii", "tt")},
                            "joint blocks: cosine with previous step", "cosine")
    _ = plots.save(fig, out, "joint_asymmetry")

# %% tags=["nbval-check-output"]
print(rule("G4"))
change = DC.measure_joint_asymmetry(board, jall, n_prompts, asym if len(jall) else None)  # G4, MMDiT only
print(board.criteria_lines("G4"))

# %% [markdown]
# **What to look at.** G4 expects the image→text block (`it`) to change clearly more than text→image (`ti`). All
# blocks move most at the first and last steps, together; `it` changes only
# <!--num "notebooks/03_diffusion_steps.ipynb#out:G4 (a):@0" fmt="{:.2f}"-->1.22<!--/num--> times as much as `ti` (the rule asks <!--const G4's threshold, written before the numbers-->1.5<!--/const-->), the image output stream
# <!--num "notebooks/03_diffusion_steps.ipynb#out:G4 (b):@0" fmt="{:.2f}"-->1.14<!--/num--> times the text stream's: G4 <!--num "notebooks/03_diffusion_steps.ipynb#out:G4 verdict" re="verdict: (\w[\w ]*)"-->does not hold<!--/num-->. Neither side is the safer one to reuse.
#
# ## 7. Where is the cache pressure? (G5)
#
# Keys and values per attention layer, in fp16, for one image: image positions vs the padded text sequence.

# %% tags=["nbval-check-output"]
print(rule("G5"))
kv = []
for m, g in gens.items():
    a = gen_family_of(g.transformer).sites(g.transformer)[0].module
    per_tok = 2 * a.heads * (a.to_k.out_features // a.heads) * 2  # K and V, fp16 bytes
    n_text = max(r.meta["n_text"] for r in runs[m, "short"].result.records)
    real = np.mean([len(t) for t in runs[m, "short"].tokens] + [len(t) for t in runs[m, "long"].tokens])
    kv.append({"model": m, "image tokens": g.image_tokens, "text positions": n_text, "real text tokens (mean)": real,
               "image KV bytes/layer": g.image_tokens * per_tok, "text KV bytes/layer": n_text * per_tok,
               "image/text": g.image_tokens / n_text})
kv = pd.DataFrame(kv).set_index("model")
print(kv.rename(columns=lambda c: c.replace(" tokens (mean)", " (mean)").replace(" bytes/layer", "/layer")).round(2).to_string())
print("(KV: fp16 bytes of keys and values per layer)")
print("for scale: SD3 at 1024x1024 holds 4096 image vs 333 text positions (12.3x);\n  PixArt-alpha 1024: 4096 vs 120 (34x)")
DC.measure_cache_pressure(board, kv, GENERATORS, n_prompts)  # G5, weaker model
print(board.criteria_lines("G5"))

# %% [markdown]
# <!--num "notebooks/03_diffusion_steps.ipynb#out:image tokens  text positions > tiny-mmdit@0"-->64<!--/num--> image tokens against <!--num "notebooks/03_diffusion_steps.ipynb#out:image tokens  text positions > tiny-mmdit@1"-->48<!--/num--> text positions: the image side needs only
# <!--num "notebooks/03_diffusion_steps.ipynb#out:image/text > tiny-mmdit@5" fmt="{:.2f}"-->1.33<!--/num-->× the text side's keys and values, far from G5's <!--const G5's threshold, written before the numbers-->4×<!--/const-->.
#
# Half the text positions are padding (<!--num "notebooks/03_diffusion_steps.ipynb#out:image/text > tiny-mmdit@2" fmt="{:.0f}"-->24<!--/num--> real tokens on average). At 1024² the image side is
# <!--num "notebooks/03_diffusion_steps.ipynb#out:for scale:@3"-->12.3<!--/num-->–<!--num "notebooks/03_diffusion_steps.ipynb#out:for scale: > PixArt-alpha@3"-->34<!--/num-->× larger (the "for scale" lines): G5 fails for the toy resolution, not the architecture.
#
# ## 8. Are a generator's heads more alike than an understanding model's? (G7)
#
# Mean pairwise cosine of the head maps within a layer (1 = every head draws the same map); the understanding
# model's from notebook 02's store.

# %% tags=["nbval-check-output"]
ustore, fresh = stats_store_or_capture(project_path(UNDERSTANDING_STORE), out / "understanding_stats", MODEL, sample_seed=SAMPLE_SEED)
if fresh:
    print(f"notebook 02's store not found: captured {MODEL} on the standard set into {ustore}")
U = G.head_redundancy(Store(ustore).read())
red = {m: T[(T.model == m) & (T.kind == "short")].groupby("part").redundancy.mean() for m in GENERATORS}
red_tab = pd.DataFrame([{"model": m, "part": p, "redundancy": v, "n records": int(((T.model == m) & (T.kind == "short") & (T.part == p)).sum())}
                        for m in GENERATORS for p, v in red[m].items()]
                       + [{"model": Store(ustore).read_meta().get("model", "understanding"), "part": "language",
                           "redundancy": U.redundancy.mean(), "n records": len(U)}]).set_index(["model", "part"])
print(red_tab.round(3).to_string())
per_layer_red = pd.concat([T[(T.model == m) & (T.kind == "short")].groupby("layer").redundancy.mean().rename(m) for m in GENERATORS]
                          + [U.groupby("layer").redundancy.mean().rename("understanding")], axis=1)
print(per_layer_red.round(3).to_string())

# %% tags=["nbval-check-output"]
print(rule("G7"))
gen_red, u_red = DC.measure_redundancy(board, DC.with_prompt(T), U, GENERATORS, n_prompts)  # G7, weaker generator
print(board.criteria_lines("G7"))

# %% [markdown]
# PixArt's heads are more alike than tiny-llava's (<!--num "notebooks/03_diffusion_steps.ipynb#out:G7 verdict@1" fmt="{:.2f}"-->0.75<!--/num--> against
# <!--num "notebooks/03_diffusion_steps.ipynb#out:G7 verdict@2" fmt="{:.2f}"-->0.44<!--/num-->, in every layer; its cross-attention heads most), the
# MMDiT's are not (<!--num "notebooks/03_diffusion_steps.ipynb#out:G7 verdict@0" fmt="{:.2f}"-->0.41<!--/num-->). G7, judged on the weaker generator, <!--num "notebooks/03_diffusion_steps.ipynb#out:G7 verdict" re="verdict: (\w[\w ]*)"-->does not hold<!--/num-->: not every
# generator has heads to spare. Measure yours; where they are alike, prune them judged on outputs, as 04 §4 does.
#
# ## 9. Does a word look at what it names? (G9)
#
# Each prompt word's column of the image→text attention (mean over heads, layers and steps) is an 8×8 map. Its
# *region*: its top-k patches, k = the drawn object's patch count; IoU with the object, against a random k-patch
# region's. For two-object prompts, the overlap of the two *shape* words' regions, same-colour vs different-colour
# pairs (binding).

# %% tags=["nbval-check-output"]
print(rule("G9"))
R = pd.concat([word_region_table(runs[m, "short"], prompts, gens[m].image_size // int(round(gens[m].image_tokens ** 0.5))).assign(model=m)
               for m in GENERATORS], ignore_index=True)
loc = R[R.role != "binding overlap"].groupby(["model", "role"]).agg(iou=("iou", "mean"), chance=("chance", "mean"), n=("iou", "size"))
print(loc.round(3).to_string())
bind = R[R.role == "binding overlap"].groupby(["model", "pair"]).agg(overlap=("iou", "mean"), n=("iou", "size"))
print(bind.round(3).to_string())
print("\n".join(DC.word_region_lines(loc, GENERATORS)))
DC.measure_word_regions(board, R, loc, GENERATORS, prompts)  # G9, weaker model
print(board.criteria_lines("G9"))

# %% [markdown]
# **What to look at.** IoU well above chance: a word's top patches sit on its object. PixArt's cross-attention
# localises (colour words <!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-pixart: colour words@0"-->9.2<!--/num-->× chance), the MMDiT's joint attention does not
# (<!--num "notebooks/03_diffusion_steps.ipynb#out:tiny-mmdit: colour words@0"-->0.7<!--/num-->×): word maps are a pointer on the cross-attention model only.
#
# **Caveat on G9 (b)**: PixArt drew one object in every same-colour pair, so its same-colour overlap
# (<!--num "notebooks/03_diffusion_steps.ipynb#out:overlap  n > tiny-pixart > same@0" fmt="{:.3f}"-->0.000<!--/num-->), on which the verdict rests, measures no binding. The MMDiT, which drew both, shows the study's direction
# (<!--num "notebooks/03_diffusion_steps.ipynb#out:overlap  n > tiny-mmdit > same@0" fmt="{:.3f}"-->0.415<!--/num--> same-colour against <!--num "notebooks/03_diffusion_steps.ipynb#out:overlap  n > tiny-mmdit@0" fmt="{:.3f}"-->0.130<!--/num--> different-colour).
#
# ## 10. Explore: step, layer, head and word
#
# Full maps of the first `MAP_PROMPTS` prompts. One view for print (middle step, last layer, head 0): left, the
# head's map; right, the shape word's column over the image.

# %%
m0 = GENERATORS[0]
mrun = runs[m0, "maps"]
mrecs = [r for r in mrun.result.records if "probs" in r.data and r.sample == mrun.sample_ids[0] and r.meta.get("n_text", 0) > 0]
mid_step, last_layer = sorted({r.step for r in mrecs})[len({r.step for r in mrecs}) // 2], max(r.layer for r in mrecs)
rec = next(r for r in mrecs if r.step == mid_step and r.layer == last_layer)
shape_word = next((o["shape"] for o in prompts[0]["objects"] if isinstance(o.get("shape"), str)),
                  (named_words(prompts[0]) or [""])[-1])  # its shape word (your prompts: a content word)
wpos = G.word_positions(mrun.tokens[0], shape_word) or [0]
fig = plots.step_panel(rec, 0, mrun.images[0], wpos[0], mrun.tokens[0],
                       f"{m0} · {prompts[0]['short']!r} · step {mid_step} · layer {last_layer} · head 0")
_ = plots.save(fig, out, "step_panel")
P = torch.as_tensor(rec.probs[0]).float().numpy()  # head 0, as drawn: the word's column over the image, × uniform
text_first = rec.part == "joint" and rec.meta.get("token_order", "image|text").startswith("text")  # Flux: [text | image]
n_img, img0 = rec.meta["n_image"], rec.meta["n_text"] if text_first else 0
wcol = P[img0:img0 + n_img, ((0 if text_first else n_img) + wpos[0]) if rec.part == "joint" else wpos[0]] * P.shape[1]
on = peak_objects(mrun.images[0], prompts[0], {shape_word: wcol})
where = ("on the " + on[shape_word] if on[shape_word] else "on background") if on else "(not judged)"
r, c = divmod(int(wcol.argmax()), int(round(n_img ** 0.5)))
print(f"{shape_word!r} peaks at {wcol.max():.1f} × uniform, patch row {r}, column {c}: {where}")
print(f"query rows whose largest weight is highest: {sorted(np.argsort(P.max(1))[-2:].tolist())} "
      f"(weights up to {P.max():.2f}; an even read is {1 / P.shape[1]:.3f})")

# %% [markdown]
# **What to look at.** The red borders split the joint map into section 6's four blocks. Here
# the shape word peaks at <!--num "notebooks/03_diffusion_steps.ipynb#out:× uniform, patch row" re="peaks at ([0-9.]+)"-->2.2<!--/num--> × uniform <!--num "notebooks/03_diffusion_steps.ipynb#out:× uniform, patch row" re=": (on .*)"-->on background<!--/num-->: a miss.
# Query rows <!--num "notebooks/03_diffusion_steps.ipynb#out:query rows whose largest weight" re="highest: (\[.*?\])"-->[11, 20]<!--/num--> concentrate on few keys (the dark bands).
#
# **The explorer** draws any view in the browser, without a kernel: views `i2t` (the picture reading a word),
# `t2i` (the word reading the picture) and `full`; sliders for step, layer, head (last stop: the mean of the heads)
# and word; *Save view (PNG)*, *Save numbers (JSON)*, or `explorer.save("outputs/mine/view")` from Python.

# %% tags=["nbval-ignore-output"]
from unicache_lib.widgets import step_explorer

explorer = step_explorer(mrun.result, dict(zip(mrun.sample_ids, mrun.images)), dict(zip(mrun.sample_ids, mrun.tokens)))
explorer.select(step=mid_step, layer=last_layer, head=0, word=wpos[0])  # the view drawn above; the sliders follow

# %% [markdown]
# ## 11. Claims scoreboard
#
# Each section's verdict and what it means for you; the weaker model decides each.

# %% tags=["nbval-check-output"]
board.save(out / "scoreboard.json")  # every claim as its section measured it (sections 4-9)
print(wrap("; ".join(f"{c} {r.verdict}" for c, r in board.rows.items())))

# %%
board.show()

# %%
from unicache_lib.claims import claims_table

claims_table("03_diffusion_steps")  # the claims beside their verdicts, each written once, in unicache_lib/claims.py

# %% [markdown]
# **Reading the scoreboard.** G5 fails for the toy's few image tokens (section 7); whether G2 (b) does too, only a
# real checkpoint can tell (Next steps).
#
# ## Recap
#
# - Capture changes nothing (identical images).
# - **G1**: only PixArt's cross-attention goes from diffuse to focused.
# - **G2**: adjacent maps are alike from the first step; on the strict line PixArt's cross-attention outputs settle
#   layer by layer; by output the last steps are the least reusable.
# - **G4, G5**: neither side of joint attention is clearly steadier; the image side holds only
#   <!--num "notebooks/03_diffusion_steps.ipynb#out:image/text > tiny-mmdit@5" fmt="{:.2f}"-->1.33<!--/num-->× the text side's keys and values at this size.
# - **G6**: the prompt pulls hardest early, and again at the last step; long prompts do not collapse.
# - **G7, G9**: PixArt's heads are alike and its word maps point at objects; the MMDiT's do neither.
#
# The decision table: advice from `unicache_lib/claims.py`, values from this run.

# %%
from unicache_lib.claims import decision_rows

start = lambda w, t: f"from step {w['start']} at {t:g}" if w["start"] is not None else f"none at {t:g}"  # noqa: E731
strict = {m: window[m, STRICT_THRESHOLD] for m in GENERATORS}
windows = "; ".join(f"{m} {start(window[m, THRESHOLD], THRESHOLD)}, {start(w, STRICT_THRESHOLD)}" for m, w in strict.items())
g2_found = "; ".join(f"06: step_skip(head={w['head']}) for {m}" for m, w in strict.items() if w["start"] is not None)
# G1 gets no row: whatever the focus, the steps to reuse are picked by the knees (G2's row)
rows = [("G2", "G2: window to reuse whole steps unchanged (latest knee of the maps)", windows, g2_found)]
if g_ends:
    rows.append(("G6", "G6: guidance strength, step 0 / last step", ", ".join(f"{m} {a:.2f} / {b:.2f}" for m, (a, b) in g_ends.items())))
if len(jall):
    rows.append(("G4", "G4: MMDiT change, image->text / text->image", f"{change['sim_it'].mean() / change['sim_ti'].mean():.2f}"))
rows += [("G5", "G5: image / text KV bytes per layer", ", ".join(f"{m} {v:.2f}x" for m, v in kv["image/text"].items())),
         ("G7", "G7: head redundancy, generators vs understanding",
          ", ".join(f"{m} {v:.2f}" for m, v in zip(GENERATORS, gen_red.mean(0))) + f" vs {u_red.mean():.2f}"),
         ("G9", "G9: word-region IoU / chance, colour and shape words pooled",
          ", ".join(f"{m} {loc.loc[m].iou.sum() / loc.loc[m].chance.sum():.1f}x" for m in GENERATORS if m in loc.index.get_level_values(0)))]
WrappedTable(pd.DataFrame(decision_rows(rows, "03_diffusion_steps", board.verdicts())))  # advice: unicache_lib/claims.py

# %% [markdown]
# **Reading the table.** The maps give no trustworthy window for reusing whole steps *unchanged*: at the study's line
# every knee is the first step, at the strict line some layer never settles. Skipping steps by extrapolation
# (06's `step_skip`) needs no knee. G1 has no row: focus or not, the steps to reuse are picked by the knees (G2). Word maps point on PixArt (<!--num "notebooks/03_diffusion_steps.ipynb#out:G9: word-region IoU > value here@1"-->6.3<!--/num-->× chance), not on the MMDiT (<!--num "notebooks/03_diffusion_steps.ipynb#out:G9: word-region IoU > value here@0"-->1.0<!--/num-->×).

# %% [markdown]
# ## Exercises
#
# Each starter leaves one gap (`# <- write`) and checks what you wrote. Solutions:
# [solutions/03_diffusion_steps.py](../solutions/03_diffusion_steps.py) (`--only K` runs one).
#
# 1. ★★ Write `knee(sims, threshold)`; the starter checks it on every curve of section 4.
# 2. ★★ Write `reuse_start(layer_knees)`, the first step at which every layer has settled. The starter applies it
#    at `STEPS` and at 8 steps, on the line `0.95`: how many whole steps could each generator reuse at 8 steps, and
#    which of its layers holds the window back?
# 3. ★ Capture the guidance batch's empty-prompt half (`DiffusionCapture`'s `branch`): what do the image queries
#    read when the prompt is empty?
# 4. ★★ Write `top_iou(a, b, k)`, the IoU of two word maps' k brightest patches. On same-colour pairs with two
#    shapes and with one shape twice: do the shape words' regions separate?
# 5. ★★ Write `token_shares(W)`, each prompt token's share of the image queries' attention (section 9's word maps).
#    The starter ranks `GENERATORS[-1]`'s tokens: which do its image queries read; do colour and position words?

# %%
# Exercise 1 starter: the knee, checked against section 4's table on every curve (maps and outputs, both lines)
def knee(sims, threshold):
    """sims[s]: cosine of step s with step s-1 (sims[0] has no previous step: ignore it). Returns the first step
    s >= 1 from which sims[s], sims[s+1], ... are all >= threshold, or None when there is no such step."""
    ...  # <- write: the body


if knee([0.0, 0.2, 0.9, 0.95], 0.7) is None:
    print("Write the body of `knee`, then run this cell again (on [0.0, 0.2, 0.9, 0.95] at 0.7 it is step 2).")
else:
    bad = []
    for (m, p, layer), d in short_T.groupby(["model", "part", "layer"]):
        for name, col in (("maps", "sim"), ("outputs", "out_sim_img")):
            sims = d.groupby("step")[col].mean().to_numpy()
            for t in (THRESHOLD, STRICT_THRESHOLD):
                want, got = knees.loc[(m, p, layer), f"knee ({name}) @{t:g}"], knee(sims, t)
                if (got is None) != bool(np.isnan(want)) or (got is not None and got != want):
                    bad.append(f"{m} {p} layer {layer} {name} @{t:g}: yours {got}, section 4's {want}")
    print("correct: every knee is section 4's" if not bad else "\n".join(bad[:6]))
    if not bad and latest.notna().any() and latest.max() > 1:  # the curve section 4 draws
        d = short_T[(short_T.model == km) & (short_T.part == kp)]
        print(f"{km} {kp} outputs at {STRICT_THRESHOLD:g}: " + ", ".join(
            f"layer {l} {knee(dl.groupby('step').out_sim_img.mean().to_numpy(), STRICT_THRESHOLD)}" for l, dl in d.groupby("layer")))

# %%
# Exercise 2 starter: whole-step reuse from the layers' knees, at STEPS and at 8 steps (four prompts, each generator)
def reuse_start(layer_knees):
    """layer_knees: one knee per layer (a step, or None where the layer never settles). Returns the first step from
    which every layer has settled, or None when some layer never does."""
    ...  # <- write: the body


if reuse_start([1, 3, 2]) is None:
    print("Write the body of `reuse_start`, then run this cell again.")
else:
    for m, g in gens.items():
        for n in (STEPS, 8):
            run = capture_generation(g, [p["short"] for p in prompts[:4]], f"steps{n}", None, n, GUIDANCE, SEED, progress=False)
            col = G.knee_table(G.step_table(run.result.records).assign(model=m), (0.95,))["knee (maps) @0.95"]
            first, want = reuse_start([None if np.isnan(k) else int(k) for k in col]), G.reuse_window(col, n)["start"]
            per_part = ", ".join(f"{p} " + " ".join("never" if k != k else str(int(k)) for k in c)
                                 for p, c in col.groupby(level="part"))  # layer 0 first
            print(f"{m}, {n} steps, knees at 0.95: {per_part}; reusable from step {first}: "
                  f"{0 if first is None else max(0, n - 1 - first)} of {n}"
                  + ("" if first == want else f"  <- G.reuse_window says {want}"))

# %%
# Exercise 3 starter: the text attention of the prompted half of the guidance batch and of yours, two prompts each
branch = ...  # <- fill in: the branch name of the half that sees the empty prompt
if branch is ...:
    print("Fill in `branch` (DiffusionCapture's docstring names the halves), then run this cell again.")
else:
    for m, g in gens.items():
        tabs = []
        for label, kw in (("prompted (default)", {}), (f"branch={branch!r}", {"branch": branch})):
            with DiffusionCapture(g.transformer, [f"{label}/0", f"{label}/1"], **kw) as cap:
                sample(g, [p["short"] for p in prompts[:2]], STEPS, GUIDANCE, seed=SEED, callbacks=[cap])
            tabs.append(G.step_table(cap.result.records).assign(half=label))
        B = pd.concat(tabs)
        tab = B[B.part != "self"].groupby("half")[["text_share", "text_entropy"]].mean()
        print(m, tab.round(3).to_string(), sep="\n")
        if np.allclose(tab.iloc[0], tab.iloc[1]):
            print("  the same numbers twice: that branch is the prompted half; pick the other one")

# %%
# Exercise 4 starter: pairs of one colour, left and right; the overlap of the two shape words' regions (as in §9)
from unicache_lib.world.text import COLOURS, SHAPES, short_prompt  # noqa: E402


def top_iou(a, b, k):
    """a, b: two word maps (one weight per image patch). Returns the IoU (intersection over union) of the sets of
    the k patches where a is largest and the k patches where b is largest."""
    ...  # <- write: the body


if top_iou(np.arange(4.0), np.arange(4.0), 2) is None:
    print("Write the body of `top_iou`, then run this cell again.")
else:
    x, y = np.random.default_rng(0).random((2, 64))
    print("check:", "correct" if abs(top_iou(x, y, 8) - G.iou(G.top_region(x, 8), G.top_region(y, 8))) < 1e-9 else "differs from G.iou")
    for same_shape in (False, True):
        objs = [[{"colour": c, "shape": list(SHAPES)[i % len(SHAPES)], "position": "left"},
                 {"colour": c, "shape": list(SHAPES)[(i + 1 - same_shape) % len(SHAPES)], "position": "right"}]
                for i, c in enumerate(list(COLOURS)[:4])]
        for m, g in gens.items():
            run = capture_generation(g, [short_prompt(o) for o in objs], "same", None, STEPS, GUIDANCE, SEED, progress=False)
            Ws = [G.word_maps(run.result.records, sid) for sid in run.sample_ids]
            pos = [[j for x in o for j in G.word_positions(run.tokens[i], x["shape"])] for i, o in enumerate(objs)]
            kk = max(1, round(0.125 * Ws[0].shape[1]))
            ov = [top_iou(W[p[0]], W[p[-1]], kk) for W, p in zip(Ws, pos)]
            W = Ws[0]
            print(f"{m}, {'one shape twice' if same_shape else 'two shapes'}: shape-word overlap {np.mean(ov):.2f} "
                  f"(chance {G.chance_iou(kk, W.shape[1]):.2f})")

# %%
# Exercise 5 starter: what a generator's image queries read, by prompt token (§9's word maps)
def token_shares(W):
    """W: a prompt's word maps, [tokens, image patches]: W[j, i] is image query i's attention to token j (mean over
    heads, layers and steps). Returns one number per token: its share of the image queries' attention, mean over
    the image queries."""
    ...  # <- write: the body


run = runs[GENERATORS[-1], "short"]
if token_shares(np.ones((2, 3))) is None:
    print(f"Write the body of `token_shares`, then run this cell again (it ranks {GENERATORS[-1]}'s tokens).")
else:
    W0 = G.word_maps(run.result.records, run.sample_ids[0])
    print("check:", "correct" if np.allclose(token_shares(W0), W0.mean(1)) else "not the mean over the image queries")
    share = pd.concat([pd.Series(np.asarray(token_shares(G.word_maps(run.result.records, sid))), index=run.tokens[i])
                       for i, sid in enumerate(run.sample_ids)])
    print(wrap(f"{GENERATORS[-1]}, most-read tokens (mean share over prompts): " + ", ".join(
        f"{t!r} {v:.3f}" for t, v in share.groupby(level=0).mean().sort_values(ascending=False).head(8).items())))

# %% [markdown]
# ## Next steps
#
# > **Your checkpoint.** Run this lesson on your diffusers SD3 / PixArt / Flux / Sana folder, on a GPU:
# >
# > `.venv/bin/papermill notebooks/03_diffusion_steps.ipynb outputs/03_mine.ipynb -y 'GENERATORS: ["<your folder>"]' -p DEVICE cuda -y 'LAYERS: [0, 11, 23]' -p MAP_QUERY_STRIDE 8`
# >
# > Compare the knees (section 4) with this run's, then put the decision table's `step_skip(head=…)` in 06's
# > `METHODS`. `solutions/03_diffusion_steps.py` (`next_steps`) runs the same calls on a random-weight stand-in.
