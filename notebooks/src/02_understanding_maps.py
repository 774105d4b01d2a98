# ---
# jupyter:
#   unicache:
#     figure_kind: overlay
#     first_figure:
#     - object_word_over_layers
#     quick:
#       MAP_PER_TYPE: 1
#       N_CAPTIONS: 2
#       PER_TYPE: 1
# ---

# %% [markdown]
# # 02 · Attention maps of an understanding model (LLaVA-style)
#
# **What you will learn**
# - how entropy, focus and distance change with depth; which image positions the text reads (anchors), and where;
# - how much each kind of word reads the image, in the prompt and while captioning, against an even reading;
# - whether a word that names an object looks at *that* object; exploring maps by sample, layer, head, token.
#
# *§1's first look:* the picture, then the word 'triangle' over it in each layer (× uniform, cyan: even). **What you
# see**: in layer <!--num "notebooks/02_understanding_maps.ipynb#out:chosen" re="[(]layer ([0-9]+)[)]"-->1<!--/num--> the word
# lights the triangle's tip and puts <!--num "notebooks/02_understanding_maps.ipynb#out:chosen" re="at ([0-9.]+)x the object"-->12.6<!--/num-->×
# its object's area share on the triangle (the best sample); the other layers light it less against its area
# (printed below the figure). In
# <!--num "notebooks/02_understanding_maps.ipynb#out:multi-object samples with full maps" re="^([0-9]+ of [0-9]+) multi-object"-->10 of 10<!--/num-->
# multi-object samples the word reads its own object above even.
#
# ![This lesson's first figure, from its last run](../docs/figures/02_understanding_maps.png)

# %% tags=["parameters"]
MODEL = "tiny-llava"
DEVICE = "auto"               # "cpu", "cuda" or "auto"
DTYPE = "auto"                # weights; statistics are fp32 always
MEMORY_BUDGET_GB = 8          # full maps (explorer) estimated above this raise: lower MAP_PER_TYPE or set LAYERS
PER_TYPE = 4                  # standard samples per scene type; 4 gives all 20
MAP_PER_TYPE = 4              # samples per type whose full maps are kept (for the widget)
LAYERS = None                 # language layers to capture, e.g. [0, 15, 31] on a 7B model; None means all
TOP_K = 6                     # anchors per (sample, layer)
N_CAPTIONS = 10               # samples captioned for the decoding dynamics
OUT_DIR = "outputs/02_understanding_maps"
SEED = 0
SAMPLE_SEED = 2024            # the shipped standard set; another seed builds another set of the same recipe
SAMPLES = None                # your own samples: a folder of images with a metadata.jsonl (`make samples` writes an example)

# %%
from unicache_lib.params import check_params

check_params(globals())  # every parameter above, before anything loads: a bad value stops here, naming itself

# %% [markdown]
# The study's claims U1–U13 (U7 is tested in 05, U10 and U12 in 07): each claim and its rule, fixed before any run,
# are printed in the section that measures it; this run's verdicts are in the scoreboard (§11).
#
# **Needs**: 01's ideas (capture, store, anchors); nothing run before it. The shipped `tiny-llava` (4 layers ×
# 8 heads, 64 image tokens before the text) or any supported family as `MODEL`.
#
# **Time**: about <!--num @read_minutes:02_understanding_maps fmt="{} min"-->15 min<!--/num--> to read; last run <!--num data/results/02_understanding_maps.run.json#duration_s fmt="{:.0f} s" missing="not recorded yet"-->18 s<!--/num--> (2 CPU cores).

# %%
import os

import numpy as np
import pandas as pd
import torch

from unicache_lib import plots
from unicache_lib.analysis import anchors as A
from unicache_lib.analysis.layers import band_layers, require_bands
from unicache_lib.analysis.localisation import object_readings, object_word_selectivity, query_over_image, reading_head
from unicache_lib.analysis.token_classes import CLASSES, token_class
from unicache_lib.analysis.understanding import BLOCK_LABELS, anchor_sets, head_table, layer_table, token_flow
from unicache_lib.analysis import understanding_claims as UC
from unicache_lib.claims import CLAIMS, NEGLECT_CUTOFF, rules_of
from unicache_lib.core.scoring import FOCUSED
from unicache_lib.capture.decode import decode_with_capture, producing_rows
from unicache_lib.capture.record import CaptureResult
from unicache_lib.capture.runner import capture_samples, inputs_for
from unicache_lib.families import family_of
from unicache_lib.paths import project_path
from unicache_lib.replicate import unstable_claims
from unicache_lib.scoreboard import Scoreboard
from unicache_lib.store import Store, remove_store
from unicache_lib.tables import wrap
from unicache_lib.widgets import attention_explorer
from unicache_lib.world import samples as sample_set
from unicache_lib.world.scenes import SCENE_TYPES, grid_cover, patch_grid_masks
from unicache_lib.runtime.controls import untrained_language_model
from unicache_lib.runtime.loaders import is_stand_in, load_understanding

# %%
torch.manual_seed(SEED)
out = project_path(OUT_DIR)  # relative: from the repository root, wherever the kernel started
out.mkdir(parents=True, exist_ok=True)
model, processor = load_understanding(MODEL, attn_implementation="eager", dtype=DTYPE, device=DEVICE)
family = family_of(model)
PART = family.image_part      # the captured part whose keys are the image ("cross" for Mllama)
CROSS = PART == "cross"
tok = processor.tokenizer
samples = sample_set.load(SAMPLES, per_type=PER_TYPE, seed=SAMPLE_SEED)
scene_of = {s.id: s.scene_type for s in samples}
n_layers = model.config.get_text_config().num_hidden_layers
bands = band_layers(n_layers) if LAYERS is None else require_bands(LAYERS, n_layers)  # a subset needs every band
print(f"{MODEL} ({family.name}): {n_layers} layers, {model.config.get_text_config().num_attention_heads} heads; "
      f"{len(samples)} samples over {len(set(scene_of.values()) - {''})} scene types")
print(wrap(f"depth bands {bands}; the image is read in part {PART!r}"))

# %% [markdown]
# ## 1. Capture once
#
# Statistics for every sample and layer go to one store, full maps for a subset to another (the widget needs maps).
# On a 7B model keep `MAP_PER_TYPE` small (01 §3); the
# estimate is checked against `MEMORY_BUDGET_GB` first. Cross-attention VLMs (Mllama) read the image only through
# [cross-attention layers](../docs/GLOSSARY.md#cross-attention-layer): there §5 and §7 read "not measurable here".

# %%
stores = {name: out / name for name in ("stats", "maps")}
for p in stores.values():
    if p.exists():
        remove_store(p)  # this notebook's own output of an earlier run (refused while another process writes it)
meta = {"model": MODEL, "dtype": str(next(model.parameters()).dtype), "sample_seed": SAMPLE_SEED}
capture_samples(model, processor, samples, Store(stores["stats"], meta=meta), mode="stats", layers=LAYERS)
map_samples = sample_set.load(SAMPLES, per_type=min(MAP_PER_TYPE, PER_TYPE), seed=SAMPLE_SEED)
capture_samples(model, processor, map_samples, Store(stores["maps"], meta=meta), mode="full", layers=LAYERS, part=PART,
                memory_budget_gb=MEMORY_BUDGET_GB)
all_recs = Store(stores["stats"]).read()
recs = [r for r in all_recs if r.part == PART]  # the layers whose keys are the image
maps = Store(stores["maps"]).read(part=PART)
enc = {s.id: inputs_for(model, processor, s.image, s.question) for s in samples}
tokens = {s.id: tok.convert_ids_to_tokens(enc[s.id]["input_ids"][0].tolist()) for s in samples}
grids = {s.id: (family.image_grid(model.config, enc[s.id]), family.grid_tokens(model.config, enc[s.id])) for s in samples}
L = layer_table(recs, scene_of)
H = head_table(recs)
captured = sorted(L["layer"].unique())
bands = require_bands(captured, n_layers, "the captured layers")  # (cross-attention models: the layers that read the image)
print(f"stats store: {len(all_recs)} records, {len(recs)} of part {PART!r} ({L['sample'].nunique()} samples x "
      f"{L.layer.nunique()} layers); maps store: {len(maps)} records")
RULES = rules_of("02_understanding_maps", top_k=TOP_K, u3_bar=float("nan"))  # U3's bar (3x chance) is known in §4


def show_claims(*ids):
    """Each claim and its rule (unicache_lib/claims.py, written before any run), in the section that measures it."""
    for c in ids:
        print(wrap(f"{c}: {CLAIMS[c]}\n  rule: {RULES[c][0]}", indent="    "))


# %% [markdown]
# ### A first look: one word reading the picture, layer by layer
#
# A picture with several objects; the attention of the word naming one (title: the question) over the image tokens
# (mean over heads), one panel per layer, in × uniform; the sample where that word reads its own object most (how
# typical, below). **One colour scale for every panel**; cyan (1): an even reading.

# %%
def own_object_reading(s):
    """(× its area share the object word puts on the object it names, in its best layer; the word's position), or None."""
    toks_s, (grid, gtok) = tokens[s.id], grids[s.id]
    obj = [i for i, t in enumerate(toks_s) if token_class(t) == "object" and t.strip("▁Ġ ").lower() != "object"]
    named = [k for k, o in enumerate(s.objects) if obj and toks_s[obj[-1]].strip("▁Ġ ").lower() == o["shape"]]
    if not named or grid is None or len(s.objects) < 2 or not s.has_masks:
        return None
    own = patch_grid_masks(s.masks, grid).ravel() == named[0]
    ws = {li: w[np.asarray(gtok)] if gtok is not None else w for li, w in query_over_image(maps, s.id, obj[-1]).items()}
    best = max(ws, key=lambda li: float(ws[li][own].sum() / ws[li].sum()))  # the layer where it reads its object most
    return float(ws[best][own].sum() / ws[best].sum() / own.mean()), obj[-1], best


reading = {s.id: own_object_reading(s) for s in map_samples}
candidates = {k: v for k, v in reading.items() if v is not None}
first = next(s for s in map_samples if s.id == max(candidates, key=lambda k: candidates[k][0])) if candidates else \
    next((s for s in map_samples if len(s.masks) >= 2), map_samples[0])  # else a picture with several objects
toks = tokens[first.id]
q_pos = candidates[first.id][1] if candidates else len(toks) - 1  # the object word (else the last position)
q_maps = query_over_image(maps, first.id, q_pos, uniform=True)  # layer -> [n_image] × uniform, mean over heads
if candidates:
    above = sum(v[0] > 1 for v in candidates.values())
    print(f"chosen {first.id}: its object word reads its own object at {candidates[first.id][0]:.1f}x the object's area "
          f"share (layer {candidates[first.id][2]})")
    print(f"{above} of {len(candidates)} multi-object samples with full maps: the object word reads its own object above 1x")
fig = plots.layer_overlays(first.image, q_maps, f"{first.id}: {first.question!r} — the word {toks[q_pos]!r} reading the image",
                           grid=grids[first.id][0], grid_tokens=grids[first.id][1], uniform=True)
_ = plots.save(fig, out, "object_word_over_layers")

# %% tags=["nbval-check-output"]
if grids[first.id][0]:
    k0 = A.token_kinds(first.masks, len(next(iter(q_maps.values()))), *grids[first.id])  # 0 object, 1 edge, 2 background
    on_obj = {li: round(float(w[k0 == 0].sum() / w[k0 >= 0].sum()), 2) for li, w in q_maps.items()}
    print(wrap(f"the word {toks[q_pos]!r}: share on object patches per layer: {on_obj}"))
    print(f"object patches are {np.mean(k0[k0 >= 0] == 0):.2f} of the picture")
    if candidates:  # the best layer's brightest patch: which kind of cell it is
        li_b = candidates[first.id][2]
        kind = A.PATCH_KINDS[k0[int(np.asarray(q_maps[li_b]).argmax())]]
        print(f"layer {li_b}'s brightest patch is {'an' if kind[0] in 'aeiou' else 'a'} {kind} cell")
print(f"question {first.question!r}; objects: {', '.join(o['colour'] + ' ' + o['shape'] for o in first.objects)}")

# %% [markdown]
# **What to look at.** The first two lines are the lesson's opening read-out. The third gives the word's share on
# *any* object's patches (cells at least
# <!--const patch_kinds' object cover, a definition-->75%<!--/const--> covered) per layer, against the objects'
# <!--num "notebooks/02_understanding_maps.ipynb#out:object patches are@0"-->0.05<!--/num--> of the picture.
# Layer <!--num "notebooks/02_understanding_maps.ipynb#out:chosen" re="[(]layer ([0-9]+)[)]"-->1<!--/num-->'s is low because its brightest patch, the triangle's tip, is
# <!--num "notebooks/02_understanding_maps.ipynb#out:brightest patch is" re="is (an? [a-z]+) cell"-->an edge<!--/num--> cell:
# counted in the × but not here. The question ('<!--num "notebooks/02_understanding_maps.ipynb#out:question '" re="question '([^']*)'"-->is there a purple triangle ?<!--/num-->')
# names a colour the picture's triangle lacks (<!--num "notebooks/02_understanding_maps.ipynb#out:question '" re="objects: (.*)$"-->red triangle, purple circle<!--/num-->);
# the word still reads its shape. One picture is not a finding: §6 tests every object
# (U11). Unhealthy: a haze at every layer, or one pattern on every picture.

# %% [markdown]
# ## 2. How attention changes with depth
#
# Mean over samples (band: ±1 standard deviation) of [normalised entropy](../docs/GLOSSARY.md#normalised-entropy)
# (1 = a row spread evenly), [max weight](../docs/GLOSSARY.md#max-weight), [diagonal mass](../docs/GLOSSARY.md#diagonal-mass)
# and [attention distance](../docs/GLOSSARY.md#attention-distance); the table groups layers into
# [depth bands](../docs/GLOSSARY.md#depth-bands) (on `tiny-llava` the shallow and deep bands are one layer each).

# %% tags=["nbval-check-output"]
show_claims("U2a", "U2b", "U13")


def per_layer(col):
    return L.pivot(index="sample", columns="layer", values=col).to_numpy()

fig = plots.layer_curves({"normalised entropy": per_layer("norm_entropy"), "mean max weight": per_layer("max_weight"),
                          "diagonal mass": per_layer("diag")}, "focus per layer", "value (0 to 1)", layers=captured,
                         n_layers=n_layers)
_ = plots.save(fig, out, "focus_per_layer")
fig = plots.layer_curves({"mean attention distance": per_layer("distance")}, "locality per layer", "positions",
                         layers=captured, n_layers=n_layers)
unif_dist = np.mean([(len(tokens[s]) - 1) / 4 for s in L["sample"].unique()])  # uniform causal rows: (S-1)/4
fig.axes[0].axhline(unif_dist, color="c", ls="--", lw=0.8, label="uniform causal rows")
fig.axes[0].legend(fontsize=7)
_ = plots.save(fig, out, "distance_per_layer")
fig = plots.layer_curves({"per-head variance": per_layer("variance")}, "within-row variance per layer (0 = uniform rows)",
                         "variance of a row's weights", layers=captured, n_layers=n_layers)
_ = plots.save(fig, out, "variance_per_layer")
depth = L.groupby("band")[["norm_entropy", "max_weight", "diag", "distance", "variance", "cross_modal",
                            "head_max_weight"]].mean()
print(depth.loc[["shallow", "middle", "deep"]].round(3).to_string())
d_ent = depth.loc["deep", "norm_entropy"] - depth.loc["shallow", "norm_entropy"]
print(f"uniform causal rows would read at mean distance (S-1)/4 = {unif_dist:.1f} (mean over samples; the dashed line)")
print(f"deep minus shallow normalised entropy: {d_ent:+.3f} ({'spreads out' if d_ent > 0 else 'focuses'} with depth); "
      f"distance deep / shallow: {depth.loc['deep', 'distance'] / depth.loc['shallow', 'distance']:.2f}")

# %% [markdown]
# **Reading the curves.** The study expects deep layers to spread out and reach further (U2a) or to focus (U2b).
# Only the spreading happens: deep minus shallow entropy is <!--num "notebooks/02_understanding_maps.ipynb#out:deep minus shallow normalised entropy:@0" fmt="{:+.3f}"-->+0.172<!--/num--> (U2a's (b)), the
# within-row `variance` (0 for uniform rows) and max weight fall (no focusing, against U2b), and `diag` (a row's
# weight on itself) stays low. Distance does not grow
# (deep / shallow <!--num "notebooks/02_understanding_maps.ipynb#out:deep minus shallow normalised entropy:@1" fmt="{:.2f}"-->0.98<!--/num-->, against U2a's (a)) and sits near what uniform causal rows give
# (<!--num "notebooks/02_understanding_maps.ipynb#out:uniform causal rows would read at mean distance@2"-->18.6<!--/num-->, the dashed line): it measures sequence length more than reach.
# (`cross_modal`: image→text plus text→image share, U13's; `head_max_weight`: the most focused head's max weight.)
#
# ## 3. Which positions are read: the read-frequency heatmap
#
# [Read frequency](../docs/GLOSSARY.md#read-frequency): column sums of the map, divided by how many queries can see
# each key. Bright vertical lines through many layers are candidates for [anchors](../docs/GLOSSARY.md#anchors) (the
# second heatmap and §4 use the text's reads only).

# %%
s0 = samples[0].id
rf = np.stack([r.data["read_freq_norm"].mean(0).numpy() for r in sorted((r for r in recs if r.sample == s0), key=lambda r: r.layer)])
sp0 = next(r.spans for r in recs if r.sample == s0)
fig = plots.read_frequency_heatmap(rf, sp0, f"normalised read frequency, sample {s0}", layers=captured)
_ = plots.save(fig, out, "read_frequency_heatmap")
img_pos = np.flatnonzero(sp0.array == 1)  # the image block's key positions
print(f"sample {s0}: brightest image keys over the layers (mean read frequency): "
      + ", ".join(str(int(p)) for p in img_pos[np.argsort(rf[:, img_pos].mean(0))[::-1][:2]]))
img_reads = np.stack([[A.image_reads(r).numpy() for r in sorted((r for r in recs if r.sample == s), key=lambda r: r.layer)]
                      for s in L["sample"].unique()])  # [samples, layers, n_image]
fig = plots.read_frequency_heatmap(img_reads.mean(0), None, f"the text's reads over the image positions, mean of {len(img_reads)} samples",
                                   quantity="text read frequency", layers=captured)
fig.axes[0].set_xlabel("image position (index within the image block)")
_ = plots.save(fig, out, "image_reads_heatmap")
print("mean over samples: brightest image positions (index within the image block):",
      ", ".join(str(int(i)) for i in np.argsort(img_reads.mean((0, 1)))[::-1][:4]))

# %% [markdown]
# **What to look at.** First heatmap (`single-0`, x: sequence positions, log10 of the normalised read frequency;
# no single chance level, even shares differ by row): the positions before the image are bright in
# every layer, the [sink](../docs/GLOSSARY.md#sink); inside the image, keys
# <!--num "notebooks/02_understanding_maps.ipynb#out:brightest image keys over the layers" re="reads?[^:]*: ([0-9]+),"-->28<!--/num--> and <!--num "notebooks/02_understanding_maps.ipynb#out:brightest image keys over the layers" re=", ([0-9]+)$"-->36<!--/num--> stay bright through the layers:
# anchor candidates (the text's reads, all heads; not 01 §1's one head's image rows). The second (x: index within the image block) averages the text's reads over samples, so what survives is
# read on *every* picture, a position bias (its brightest positions: the last line above). Unhealthy: the image block
# dark everywhere.
#
# ## 4. Visual anchors
#
# Per sample and layer, the `TOP_K` image positions the text reads most. How concentrated are the reads (U1, the
# [top-10% share](../docs/GLOSSARY.md#top-10-share); <!--const the share of an even read, by definition-->0.1<!--/const-->
# for an even read)? Do anchors persist (U3)? Where do they sit (U4)? Anchor sets are compared by
# [Jaccard](../docs/GLOSSARY.md#jaccard) overlap; chance for two random sets of k of n positions is ≈ k/(2n−k).

# %% tags=["nbval-check-output"]
n_image = img_reads.shape[-1]
chance_jaccard = TOP_K / (2 * n_image - TOP_K)
show_claims("U1", "U3", "U4")
print(f"  (U3 (a)'s bar: 3 x chance = {3 * chance_jaccard:.3f})")
AS = anchor_sets(recs, TOP_K)
persist = np.mean([A.layer_persistence(img_reads[i], TOP_K) for i in range(len(img_reads))], 0)
lo, mid = bands["shallow"][0], bands["middle"][0]
shallow_mid = float(persist[captured.index(lo), captured.index(mid)])
stab = {li: A.group_stability({s: AS[(s, li)] for s in L["sample"].unique()}, scene_of) for li in captured}
kinds = {s.id: A.token_kinds(s.masks, n_image, *grids[s.id]) if grids[s.id][0] else np.full(n_image, -1)
         for s in samples}  # object / edge / background under each image token (-1: not on the picture's grid)
placement = pd.DataFrame([{"sample": s.id, "layer": li, **A.anchor_placement(AS[(s.id, li)], kinds[s.id])}
                          for s in samples for li in captured])
jac = pd.DataFrame(persist, index=captured, columns=captured).rename_axis("layer")  # the tables whole: CSVs in `out`
stab_t = pd.DataFrame(stab).T[["within", "across", "n_within", "n_across"]].rename_axis("layer")
place_t = placement.groupby("layer")[["object", "object_chance", "edge", "edge_chance", "background", "background_chance"]].mean()
for name, t_ in {"anchor_jaccard": jac, "anchor_stability": stab_t, "anchor_placement": place_t}.items():
    t_.to_csv(out / f"{name}.csv")
print("anchor Jaccard between layers (mean over samples):")
print(jac.round(2).to_string() if len(captured) <= 8 else wrap(f"next layer: {dict(zip(captured, np.diag(persist, 1).round(2)))}"))
print(f"layer {lo} vs layer {mid}: {shallow_mid:.2f} (chance {chance_jaccard:.2f})")
print(f"U1: the top 10% of image positions take {L.top10_share.mean():.2f} of the text's image reads (an even read: 0.10)")
print(UC.scene_type_note(scene_of) or f"anchor Jaccard within a scene type above across types in "
      f"{int((stab_t.within > stab_t.across).sum())} of {len(stab_t)} layers")
print(wrap(f"share of anchors on object patches, per layer: {place_t.object.round(2).to_dict()}; "
           f"random patches: {place_t.object_chance.mean():.2f}"))

# %%
# sink test: share of the text's reads that land on the first 3 positions (before the image) vs on the anchors
# (a cross-attention layer's keys are all vision tokens: there is no text sink to compare with)
sink, anchor_mass = [], []
for r in recs:
    t = r.data["text_read_freq"].mean(0)
    img_idx = r.spans.image_index
    sink.append(float("nan") if CROSS else float(t[:3].sum() / t.sum()))
    anchor_mass.append(float(t[img_idx[AS[(r.sample, r.layer)]]].sum() / t.sum()))
print(f"text reads on the first 3 positions: {np.mean(sink):.3f}; on the {TOP_K} image anchors: {np.mean(anchor_mass):.3f} "
      f"({len(recs)} sample-layers)")
obj_ratio = placement.object.mean() / placement.object_chance.mean()
print(f"anchors persist from layer {lo} to {mid} at {shallow_mid / chance_jaccard:.1f}x chance")
print(f"anchors on object patches: {obj_ratio:.1f}x as often as random patches" if not sample_set.missing(samples, "masks")
      else wrap("where anchors land: " + sample_set.missing(samples, "masks")))
print(f"the first 3 positions take {np.mean(sink) / max(np.mean(anchor_mass), 1e-9):.1f}x the mass of the {TOP_K} anchors")

# %% [markdown]
# **Reading the anchor tables.** *U1*: the top tenth of image positions takes
# <!--num "notebooks/02_understanding_maps.ipynb#out:U1: the top 10%@1"-->0.41<!--/num--> of the text's image reads, well above an even read but under U1's bar of
# <!--const U1's bar, written before the numbers-->0.5<!--/const-->: uneven, not very.
#
# *Jaccard*: the text keeps
# reading some of the same positions through the layers (layer 0 vs 1: <!--num "notebooks/02_understanding_maps.ipynb#out:layer 0 vs layer 1:@2" fmt="{:.2f}"-->0.23<!--/num-->,
# chance <!--num "notebooks/02_understanding_maps.ipynb#out:layer 0 vs layer 1:@3" fmt="{:.2f}"-->0.05<!--/num-->), but U3 (a)'s bar is
# <!--const U3 (a)'s bar, written before the numbers-->3<!--/const-->× chance, and its interval (§11) reaches below it.
#
# *Stability*: anchors overlap more within a scene type than across in
# <!--num "notebooks/02_understanding_maps.ipynb#out:anchor Jaccard within a scene type" re="in ([0-9]+ of [0-9]+) layers"-->3 of 4<!--/num--> layers. *Placement*, the clearest result:
# anchors land on object patches <!--num "notebooks/02_understanding_maps.ipynb#out:anchors on object patches:@0"-->4.6<!--/num-->× as often as random patches.
#
# *Sink test*:
# the positions before the image take <!--num "notebooks/02_understanding_maps.ipynb#out:text reads on the first 3 positions@1"-->0.334<!--/num--> of the text's reads, the
# anchors <!--num "notebooks/02_understanding_maps.ipynb#out:text reads on the first 3 positions@3"-->0.207<!--/num-->: the sink, not the anchors, takes
# the larger share of the reads.

# %% [markdown]
# ## 5. Which words read the image
#
# Every text position after the image, its [image share](../docs/GLOSSARY.md#image-share) (its attention on image keys,
# mean over heads), grouped by [token class](../docs/GLOSSARY.md#token-classes) and layer band.

# %% tags=["nbval-check-output"]
show_claims("U5")
F = token_flow(recs, tokens, set(tok.all_special_tokens))
flow = F.pivot_table(index="class", columns="band", values="image_share", aggfunc="mean").reindex(
    [c for c in CLASSES if c in set(F["class"])])[["shallow", "middle", "deep"]]
counts = F[F.layer == captured[0]].groupby("class").size()
F["even"] = 1.0 if CROSS else n_image / (F["pos"] + 1)  # the image's share of the keys the row can see
even = F[F.layer == captured[0]].groupby("class").even.mean()
print(flow.round(3).assign(even_reading=even.round(3), n_tokens=counts).to_string())
content = F[F["class"].isin(["object", "attribute", "position"])].image_share.mean()
function = F[F["class"].isin(["function", "punctuation"])].image_share.mean()
print(f"content words {content:.3f} vs function words and punctuation {function:.3f}")
print(f"deep band: punctuation {flow.loc['punctuation', 'deep']:.3f} vs object words {flow.loc['object', 'deep']:.3f}; "
      f"shallow band: punctuation {flow.loc['punctuation', 'shallow']:.3f} vs object words {flow.loc['object', 'shallow']:.3f}"
      if {"punctuation", "object"} <= set(flow.index) else "")

# %% [markdown]
# **What to look at.** `even_reading` is the image's share of the keys a row can see: what it would put on the
# image reading every key alike (high: the text follows the image). No class beats it in any band: the deep
# band sits at or just under it, the shallow band far under (the `deep band` line). U5 expects content words to read the image far more than function
# words (a ratio of 2 or more); they lead only slightly (<!--num "notebooks/02_understanding_maps.ipynb#out:vs function words and punctuation@0"-->0.773<!--/num--> vs <!--num "notebooks/02_understanding_maps.ipynb#out:vs function words and punctuation@1"-->0.742<!--/num-->). Punctuation
# rises most with depth, but only up to an even reading: it stops avoiding the image rather than collecting it. For a
# cache: the prompt's words do not single out image keys.

# %% [markdown]
# ## 6. Does an object word look at its object?
#
# For every object of every multi-object sample we ask *where is the {colour} {shape} ?* and take the shape word's
# attention over the image: mean weight per patch on the named object over that on the *other* objects
# ([selectivity](../docs/GLOSSARY.md#selectivity); 1 = no preference). The control is the same model with its language
# model and projector re-initialised ([untrained-LM control](../docs/GLOSSARY.md#untrained-lm-control)).

# %% tags=["nbval-check-output"]
show_claims("U11")
loc = object_word_selectivity(model, processor, samples)
ctrl = object_word_selectivity(untrained_language_model(model, SEED), processor, samples)
sel = pd.DataFrame({"trained": loc.groupby("layer").selectivity.median(), "untrained LM": ctrl.groupby("layer").selectivity.median(),
                    "trained top-1 on target": loc.groupby("layer").top_on_target.mean(),
                    "untrained top-1 on target": ctrl.groupby("layer").top_on_target.mean()})
n_loc = loc[loc.layer == loc.layer.min()].shape[0]
away = [li for li, v in sel["trained"].items() if v < 1]
if loc.empty:  # your samples without object masks (or with one object each)
    print(sample_set.missing(samples, "masks") or "not measurable here: no sample has two or more objects")
else:
    print(f"{n_loc} object questions (median selectivity per layer):\n{sel.round(2).to_string()}")
    print(wrap(f"layers where the object word looks AWAY (median selectivity < 1): {away}; "
               f"best layer {sel['trained'].idxmax()} at {sel['trained'].max():.2f}"))
    t1, c1 = sel["trained top-1 on target"], sel["untrained top-1 on target"]
    print(f"the untrained control's median selectivity over the layers: {sel['untrained LM'].min():.2f}-"
          f"{sel['untrained LM'].max():.2f}")
    print(f"brightest patch on the named object: trained {t1.min():.2f}-{t1.max():.2f}, untrained {c1.min():.2f}-"
          f"{c1.max():.2f} of the questions, over the layers")

# %% [markdown]
# **What to look at.** Healthy grounding: selectivity well above 1 (U11's bar:
# <!--const U11's bar, written before the numbers-->1.5<!--/const-->) and the control at 1 (here
# <!--num "notebooks/02_understanding_maps.ipynb#out:the untrained control's median selectivity@0" fmt="{:.2f}"-->1.00<!--/num-->–<!--num "notebooks/02_understanding_maps.ipynb#out:the untrained control's median selectivity@1" fmt="{:.2f}"-->1.01<!--/num-->).
#
# The trained model's median peaks at only
# <!--num "notebooks/02_understanding_maps.ipynb#out:looks AWAY" re="best layer \S+ at (\S+)"-->1.22<!--/num-->, and in the AWAY layers it is under
# 1: more attention per patch on the *other* objects. Yet its brightest patch lands on the named object in up to
# <!--num "notebooks/02_understanding_maps.ipynb#out:brightest patch on the named object:@1"-->0.44<!--/num--> of the questions, the control's in at most
# <!--num "notebooks/02_understanding_maps.ipynb#out:brightest patch on the named object:@3"-->0.21<!--/num-->: training points one patch, not the whole reading. For a cache: do not
# pick image keys from the question's words.

# %% [markdown]
# ## 7. Modality blocks and head roles
#
# The four [modality blocks](../docs/GLOSSARY.md#modality-blocks) as shares of *all* the layer's attention, and the
# [cross-modal share](../docs/GLOSSARY.md#cross-modal-share) (image→text + text→image). Text→image is small partly
# because the text has far fewer rows than the image. Then [head roles](../docs/GLOSSARY.md#head-roles): how many heads are focused.

# %% tags=["nbval-check-output"]
show_claims("U8", "U9")
blocks = L.groupby("layer")[["image->image", "text->text", "image->text", "text->image", "cross_modal"]].mean()
print("shares of the whole map's attention mass (the four blocks sum to 1; X→Y = X queries reading Y keys):")
print(blocks.rename(columns=BLOCK_LABELS).round(3).T.to_string())
print(f"cross-modal share over the layers: {blocks.cross_modal.min():.2f} to {blocks.cross_modal.max():.2f}")
fig = plots.per_layer_boxes(H.groupby(["layer", "head"]).cross_modal.mean().unstack().to_numpy(),
                            "per-head cross-modal share", "share")
fig.axes[0].axhline(NEGLECT_CUTOFF, color="r", ls="--", lw=0.8, label=f"{NEGLECT_CUTOFF:g}: 07's cut-off, set for another share")
fig.axes[0].legend(fontsize=7)
_ = plots.save(fig, out, "head_cross_modal")
hcm = H.groupby(["layer", "head"]).cross_modal.mean()
print(f"per-head cross-modal share: median {hcm.median():.2f}, highest head {hcm.max():.2f} (layer {hcm.idxmax()[0]}, "
      f"head {hcm.idxmax()[1]}), lowest {hcm.min():.2f}")
focused = H.groupby(["layer", "head"]).max_weight.mean().unstack()
frac_focused = (focused > FOCUSED).mean(1)  # FOCUSED: the study's threshold, one home (core.scoring)
print(wrap(f"share of heads whose rows put > {FOCUSED:g} on one key (on average), per layer: {frac_focused.round(2).to_dict()}"))
print(f"focused heads in layer {focused.index[0]}: {int((focused.iloc[0] > FOCUSED).sum())} of {focused.shape[1]}")

# %% [markdown]
# **What to look at.** image→image dominates every layer, and the cross-modal share stays within
# <!--num "notebooks/02_understanding_maps.ipynb#out:cross-modal share over the layers:@0"-->0.17<!--/num-->–<!--num "notebooks/02_understanding_maps.ipynb#out:cross-modal share over the layers:@1"-->0.25<!--/num-->: text and image meet in every layer. The red line is
# 07's cut-off, drawn for scale only: 07 applies it to another quantity (the image share of the text queries' reads,
# not this share of the whole map), and 07 found that its detector misses real breaks.
#
# In the boxes, heads sit around a median of <!--num "notebooks/02_understanding_maps.ipynb#out:per-head cross-modal share: median@0" fmt="{:.2f}"-->0.21<!--/num-->, the highest at <!--num "notebooks/02_understanding_maps.ipynb#out:per-head cross-modal share: median@1" fmt="{:.2f}"-->0.52<!--/num-->,
# the lowest at <!--num "notebooks/02_understanding_maps.ipynb#out:per-head cross-modal share: median@4" fmt="{:.2f}"-->0.09<!--/num-->. The surprise is the
# focused heads (rows over <!--num "notebooks/02_understanding_maps.ipynb#out:share of heads whose rows put >@0"-->0.45<!--/num--> on one key, on average): the per-layer shares above
# show most layers with none, so the study's "a few focused heads in every layer" (U8) is not this model.

# %% [markdown]
# ## 8. Decoding: image reads while writing a caption
#
# Greedy captions (*describe the image .*) with the capture on; for every generated token the share of
# image keys in the attention row that produced it.

# %%
show_claims("U6")
rows = []
for s in samples[:N_CAPTIONS]:
    gen_toks, res = decode_with_capture(model, processor, s.image, "describe the image .", s.id, max_new_tokens=16,
                                        layers=LAYERS)
    plen = inputs_for(model, processor, s.image, "describe the image .")["input_ids"].shape[-1]
    for li in captured:
        share = producing_rows(res, s.id, len(gen_toks), li, part=PART).mean(1)
        rows += [{"sample": s.id, "layer": li, "k": k, "token": t, "class": token_class(t), "image_share": float(v),
                  "even": 1.0 if CROSS else n_image / (plen + k)}  # token k's row sees the prompt and k tokens
                 for k, (t, v) in enumerate(zip(gen_toks, share.tolist()))]
D = pd.DataFrame(rows)
print("example caption:", " ".join(D[(D["sample"] == samples[0].id) & (D.layer == captured[0])].token))
dec = D.groupby("class").agg(mean=("image_share", "mean"), even_reading=("even", "mean"), count=("k", "size"))
print(dec.round(3).to_string())
one = D[(D["sample"] == samples[0].id)].groupby(["k", "token"])[["image_share", "even"]].mean().reset_index()
print(f"bars below ({samples[0].id}):", ", ".join(f"{r.token} {r.image_share:.3f}" for r in one.itertuples()))
fig = plots.bars({f"{r.k}:{r.token}": r.image_share for r in one.itertuples()},
                 f"image share of each generated token, {samples[0].id} (mean over layers and heads)", "share")
fig.axes[0].plot(range(len(one)), one.even, "c_", ms=24, mew=2, label="even reading")
fig.axes[0].legend(fontsize=7, loc="lower right")
_ = plots.save(fig, out, "decoding_image_share")
c_dec = D[D["class"].isin(UC.CONTENT)].image_share.mean()
f_dec = D[D["class"].isin(UC.FUNCTION)].image_share.mean()
print(f"while decoding: content words {c_dec:.3f} vs function words and punctuation {f_dec:.3f} (ratio {c_dec / f_dec:.2f})")

# %% [markdown]
# **What to look at.** Generated tokens read the image *less* than an even reading would (every class mean under its
# `even_reading`; the cyan marks for one caption): captioning leans on the text written so far. U6 expects image reads to
# *rise* on words naming image content. The bars (`single-0`'s three-word caption) rise with position instead (the
# `bars below` line). Over all captions punctuation
# reads the image most (<!--num "notebooks/02_understanding_maps.ipynb#out:while decoding:@1"-->0.767<!--/num-->), so the content / function ratio is
# <!--num "notebooks/02_understanding_maps.ipynb#out:while decoding:@2" fmt="{:.2f}"-->0.80<!--/num-->; but punctuation is few rows (the `count` column), late in each caption, so the
# ratio partly compares positions.

# %% [markdown]
# ## 9. Scene types

# %% tags=["nbval-check-output"]
print(UC.scene_type_table(L))  # mean per scene type, the spread across types; without two scene types: not measurable

# %% [markdown]
# **What to look at.** Clutter gives the most focused rows (lowest entropy, highest max weight) and the most
# concentrated reads by [Gini](../docs/GLOSSARY.md#gini), though not by top-10% share; `PER_TYPE` samples per type,
# no interval: a hint. The
# entropy spread across types (<!--num "notebooks/02_understanding_maps.ipynb#out:spread across scene types:@0"-->0.082<!--/num-->) is about half the depth effect (§2). Unhealthy: one type far off the rest.

# %% [markdown]
# ## 10. Explore
#
# One view first, as a static figure (what prints): the first look's picture, layer 1, the last prompt position
# (the one that produces the answer) in the head where it reads the picture most. Then the explorer, opened on the
# same view.

# %%
rec1 = next(r for r in maps if r.sample == first.id and r.layer == captured[min(1, len(captured) - 1)])
last = (rec1.probs.shape[1] if CROSS else len(toks)) - 1
_, h1, peak1 = reading_head([rec1], last)  # the head of layer 1 whose last row puts most on one image key
print(f"layer {rec1.layer}, head {h1}: the last position's brightest patch gets {peak1:.1f}x uniform")
if not CROSS and grids[first.id][0] is not None and first.has_masks:
    w1, g1 = rec1.probs[h1][last, rec1.spans.image_index], grids[first.id][1]
    cov = grid_cover(first.masks, grids[first.id][0])[:, int((w1[g1] if g1 is not None else w1).argmax())]
    print(f"that patch: " + ", ".join(f"{c:.0%} {o['colour']} {o['shape']}" for c, o in zip(cov, first.objects) if c > 0)
          + f" (the rest background); the question: {first.question!r}")
fig = plots.map_panel(rec1.probs[h1], rec1.spans, first.image, last, toks, f"sample {first.id} · layer {rec1.layer} · head {h1}",
                      cross=CROSS, grid=grids[first.id][0], grid_tokens=grids[first.id][1], question=first.question)
_ = plots.save(fig, out, "explorer_static")

# %% tags=["nbval-ignore-output"]
explorer = attention_explorer(CaptureResult.from_records(maps), {s.id: s.image for s in map_samples}, tokens, grids,
                              questions={s.id: s.question for s in map_samples})
explorer.select(sample=first.id, layer=rec1.layer, head=h1, word=last, view="t2i")  # the figure's view

# %% [markdown]
# **What to look at.** In the figure, left: the raw map; middle: in blocks; right: the last position over the
# picture, its brightest patch at
# <!--num "notebooks/02_understanding_maps.ipynb#out:the last position's brightest patch gets@2" fmt="{:.1f}"-->40.8<!--/num-->× uniform. That patch is a failure:
# it is only <!--num "notebooks/02_understanding_maps.ipynb#out:that patch:@0"-->20<!--/num-->% object, the edge of the purple circle, the question's colour (§1): this head reads
# the colour, not a triangle.
#
# **The explorer** is drawn in your browser from the maps store, with no kernel. Views: **t2i** (the query token
# reading the picture, × uniform), **i2t** (the patches reading that token), **full** (the whole map, image block
# outlined); sliders: layer, head (last stop: the mean of heads), query token; `explorer.save("outputs/mine/view")`
# writes the exact numbers. Try the last token in layer 1 across heads: does any head find the asked object?
# (Exercise 4 measures it.)

# %% [markdown]
# ## 11. Claims scoreboard
#
# Verdicts follow the [interval rule](../docs/GLOSSARY.md#interval), fixed before any number; criteria (a), (b) are
# decided apart, "partly" when some hold. Shown: the seven claims the decision table below acts on; the other four
# in one line.

# %%
board = Scoreboard(random_weights=is_stand_in(MODEL), unstable=unstable_claims([MODEL]))
UC.declare(board, TOP_K, chance_jaccard)  # U1-U13's rules, written before any number: unicache_lib/claims.py

# %% tags=["nbval-check-output"]
# each group's statistics and 95% intervals over samples: unicache_lib/analysis/understanding_claims.py
UC.measure_depth_claims(board, L, H, bands, CROSS)  # U1, U2a, U2b, U8, U9, U13
UC.measure_anchor_claims(board, L, img_reads, AS, bands, scene_of, placement, sink, anchor_mass,  # U3, U4
                         [r.sample for r in recs], TOP_K, CROSS, family.name, sample_set.missing(samples, "masks"))
UC.measure_word_claims(board, F, D, CROSS)  # U5, U6
UC.measure_localisation_claims(board, loc, ctrl, sample_set.missing(samples, "masks"))  # U11
board.save(out / "scoreboard.json")  # shown next

# %%
from IPython.display import display

from unicache_lib.claims import Markdown, read

DECIDE = ["U1", "U3", "U4", "U2a", "U8", "U9", "U11"]  # the claims the decision table acts on
v = board.verdicts()
view = board.view()  # one line per claim, each verdict with its meaning; a row's details (HTML): statement, rule, note
view.table = view.table.loc[[c for c in view.table.index if c in DECIDE]]
display(view)
print(wrap(f"the other {len(v) - len(DECIDE)}, printed where measured: "
           + "; ".join(f"{c} {read(c, x)}" for c, x in v.items() if c not in DECIDE) + f". All {len(v)}: {os.path.relpath(out / 'scoreboard.json', project_path('.'))}"))

# %%
from mistune import html as md_to_html  # Jupyter's own markdown renderer (nbconvert's)

from unicache_lib.claims import claims_table

claims = claims_table("02_understanding_maps")  # each claim (statement, why, rule) is written once, in unicache_lib/claims.py
display({"text/markdown": claims, "text/html": "<details><summary>the claims, and why each matters for a cache</summary>"
         + md_to_html(claims) + "</details>"}, raw=True)

# %% [markdown]
# Each verdict is the shipped model's, not the study's; a real checkpoint
# (`MODEL = "llava-hf/llava-1.5-7b-hf"`, a GPU) may differ. An [inconclusive](../docs/GLOSSARY.md#inconclusive)
# row's details say about how many samples would settle it.
#
# ## What this run showed
#
# The four claims the decision table does not act on, from this run's scoreboard; the other seven: the table after it.

# %% tags=["nbval-check-output"]
def decided(claim, k):  # one criterion's decision on this run (what a "partly" is made of)
    r = board.rows[claim]
    m = r.measured.get(k)
    return r.criteria[k].decide(m.lo, m.hi) if m is not None and m.value is not None else "not measurable"


ent = depth.norm_entropy
recap = [f"- **Depth** (U2a {v['U2a']}, U2b {read('U2b', v['U2b'])}): normalised entropy goes {ent['shallow']:.2f} → "
         f"{ent['deep']:.2f} from the shallow to the deep band; U2a's (a), deep layers reading farther: {decided('U2a', 'a')}.",
         f"- **Low layers** (U13 {v['U13']}): (a) the shallow band's cross-modal share, {depth.loc['shallow', 'cross_modal']:.2f}, "
         f"in the claim's range: {decided('U13', 'a')}; (b) it spreads more than the middle band ({ent['shallow']:.2f} vs "
         f"{ent['middle']:.2f}): {decided('U13', 'b')}.",
         f"- **Words** (U5 {read('U5', v['U5'])}): content words put {content:.2f} of their reads on the image, function "
         f"words and punctuation {function:.2f}.",
         f"- **Captions** (U6 {read('U6', v['U6'])}): generated content words over function words, {c_dec / f_dec:.2f}; "
         f"the claim needs 1.2."]
Markdown("\n".join(recap))

# %% [markdown]
# ## Measurement → what to do on your model
#
# Each row's advice is written once, beside its claim (`unicache_lib/claims.py`); this run adds its numbers and
# verdicts. Terms:
# [sink](../docs/GLOSSARY.md#sink), [anchors](../docs/GLOSSARY.md#anchors); a cover: keys chosen so that every image
# key is near a kept one ([k-center](../docs/GLOSSARY.md#k-center)).

# %%
from unicache_lib.claims import decision_table

decision_table([  # each row: the claim, what was measured, its value here; what to do and where: the claim's advice
    ("U1", "top-10% share of the text's image reads (U1)", f"{L.top10_share.mean():.2f}"),
    ("U3", f"anchor overlap, layer {lo} vs {mid}, over chance (U3 (a), bar 3x)", f"{shallow_mid / chance_jaccard:.1f}x"),
    ("U4", "text reads on the first 3 positions vs on the anchors (U4 (b))", f"{np.mean(sink):.2f} vs {np.mean(anchor_mass):.2f}"),
    ("U2a", "deep minus shallow normalised entropy (U2a (b))", f"{d_ent:+.2f}"),
    ("U9", "smallest per-layer cross-modal share (U9 (b))", f"{blocks.cross_modal.min():.2f}"),
    ("U11", "best median selectivity of object words (U11 (a))", f"{sel['trained'].max():.2f}" if not loc.empty else "-"),
    ("U8", "share of focused heads, per layer (U8)", str(frac_focused.round(2).to_dict())),
], "02_understanding_maps", v)

# %% [markdown]
# ## Exercises
#
# Each starter leaves one gap (`# <- write`) and checks what you wrote. Solutions:
# [solutions/02_understanding_maps.py](../solutions/02_understanding_maps.py) (`--only K` runs one).
#
# 1. ★ Write `persistence`, the Jaccard overlap of two layers' anchor sets (§4), and read U3 (a) at k = 3, 6 and 12.
#    Is "anchors persist across layers" a statement about every k?
# 2. ★ Write `u5`, U5's ratio (§5). Then 'color' is counted as a function word instead of an attribute: does U5 move?
# 3. ★★ Write `my_selectivity` (§6's measure); the starter runs it on the shape word of *where is the {colour}
#    {shape} ?* and on the colour word of *what shape is the {colour} object ?*. Which word points at its object,
#    and in which layer?
# 4. ★★ Write `head_score`, a score of your own for one head's last prompt position (the one that answers): high
#    when it finds the asked object. Which head does your score rank first, and is it the one you saw in §10's
#    explorer?

# %%
# Exercise 1 starter: anchor persistence between layers `lo` and `mid`, from §4's text reads `img_reads`
def persistence(reads, k):
    """reads [layers, n_image]: one sample's text reads per image position, layers in the order of `captured`.
    Returns the Jaccard overlap (shared / either) of the k most-read positions of layer `lo` and of layer `mid`."""
    ...  # <- write: the two layers' top-k position sets, then their Jaccard


if persistence(img_reads[0], TOP_K) is None:
    print(f"Write the body of `persistence`, then run this cell again (§4: k = {TOP_K}, layers {lo} and {mid}).")
else:
    mine = np.mean([persistence(r, TOP_K) for r in img_reads])
    print(f"k = {TOP_K}: yours {mine:.3f}, §4's {shallow_mid:.3f}: "
          + ("correct" if abs(mine - shallow_mid) < 0.01 else "they differ: top k by reads, then |A & B| / |A | B|"))
    for k in (3, 6, 12):
        jac_k, chance_k = np.mean([persistence(r, k) for r in img_reads]), k / (2 * n_image - k)
        print(f"k = {k:2d}: Jaccard {jac_k:.2f}, chance {chance_k:.2f}: {jac_k / chance_k:.1f}x chance (U3 (a)'s bar: 3x)")

# %%
# Exercise 2 starter: U5 from §5's token-flow table `F` (a row per text token and layer: `class`, `image_share`)
def u5(df):
    """Mean image share of the content words (classes object, attribute, position) over the mean image share of
    the function words and punctuation (classes function, punctuation), over the rows of `df`."""
    ...  # <- write: the ratio of the two groups' mean `image_share`


if u5(F) is None:
    print(f"Write the body of `u5`, then run this cell again (U5's bar: 2; 'color' is a {token_class('color')} now).")
else:
    print(f"U5 ratio: yours {u5(F):.3f}, §5's {content / function:.3f}: "
          + ("correct" if np.isclose(u5(F), content / function) else "they differ: check the classes in each group"))
    moved = F.assign(**{"class": F["class"].mask(F.token.str.lower().isin(["color", "colour"]), "function")})
    print(f"'color' as a function word: U5 {u5(moved):.3f} ({int((moved['class'] != F['class']).sum())} rows moved)")

# %%
# Exercise 3 starter: §6's selectivity, written by you, on the shape word and on the colour word
def my_selectivity(w, patch_object, target):
    """w [n_patches]: one word's attention over the picture's patches; patch_object [n_patches]: the object index
    under each patch (-1: background); target: the named object's index. 1: no preference for the target."""
    ...  # <- write: the mean weight per patch on the target over the mean weight per patch on the other objects


if my_selectivity(np.ones(3), np.array([0, 1, -1]), 0) is None:
    print("Write the body of `my_selectivity`, then run this cell again.")
else:
    med = {}
    for label, q, word in (("shape word", "where is the {colour} {shape} ?", "shape"),
                           ("colour word", "what shape is the {colour} object ?", "colour")):
        rows = [(li, my_selectivity(W.mean(0).float().numpy(), po, t))
                for _, t, li, W, po in object_readings(model, processor, samples, question=q, query=word)]
        med[label] = pd.DataFrame(rows, columns=["layer", "sel"]).groupby("layer").sel.median()
    ok = np.allclose(med["shape word"], loc.groupby("layer").selectivity.median(), rtol=1e-4)
    print("shape word vs §6:", "correct" if ok else "they differ: per patch means, on the target and on the others")
    print(pd.DataFrame(med).round(2).T.to_string())

# %%
# Exercise 4 starter: your per-head score of the last prompt position, on where is the {colour} {shape} ?
def head_score(w, patch_object, target):
    """One head on one question: w [n_patches] its attention over the patches, patch_object [n_patches] the object
    index under each patch (-1: background), target the asked object's index. High: the head finds the target."""
    ...  # <- write: a number from w, patch_object and target (any score you can defend)


if head_score(np.ones(3), np.array([0, 1, -1]), 0) is None:
    print("Write the body of `head_score`, then run this cell again.")
else:
    rows = [(li, h, head_score(w.float().numpy(), po, t), po[int(w.argmax())] == t)
            for _, t, li, W, po in object_readings(model, processor, samples, query="last") for h, w in enumerate(W)]
    g = pd.DataFrame(rows, columns=["layer", "head", "your score", "top patch on target"]).groupby(["layer", "head"]).mean()
    print(g.sort_values("your score", ascending=False).head(5).round(2).to_string())
    hit = g["top patch on target"]
    print(f"your first head's top patch is on the asked object in {hit[g['your score'].idxmax()]:.0%} of the "
          f"questions; the best head's: {hit.max():.0%}")

# %% [markdown]
# ## Next steps
#
# **Your checkpoint.** Run this lesson on a random-weight [stand-in](../docs/GLOSSARY.md#stand-in) of LLaVA-1.5-7B
# (its scoreboard must read "not meaningful (random weights)" on every row) or on a real checkpoint with a GPU, and
# compare its depth table (§2) with this run's:
#
# ```
# python -m unicache_lib.zoo.builders.standins --out outputs/rehearsal/models --only llava-1.5-7b
# .venv/bin/papermill notebooks/02_understanding_maps.ipynb outputs/02_mine.ipynb \
#     -p MODEL outputs/rehearsal/models/llava-1.5-7b -y "LAYERS: [0, 15, 31]" -p PER_TYPE 1 -p MAP_PER_TYPE 1 -p N_CAPTIONS 2
# ```
#
# For a real model set `MODEL = "llava-hf/llava-1.5-7b-hf"` (or your own path). **Your samples**: `SAMPLES = "path"`,
# a folder of images with a `metadata.jsonl` (`make samples` writes an example; a `scene_type` per sample enables
# the scene-type comparisons). Then lesson 05 turns these maps into cache policies.
