# ---
# jupyter:
#   unicache:
#     figure_kind: overlay
#     first_figure:
#     - image_in_the_map
# ---

# %% [markdown]
# # 00 · A primer: queries, keys, heads and the attention map
#
# **What you will learn**: how softmax turns a query's scores over its keys into weights summing to 1; how to read a
# map (rows: who reads; columns: what is read) and its causal mask; that one layer's heads read differently; how an
# image sits in the map ([modality blocks](../docs/GLOSSARY.md#modality-blocks), a word's reading of the picture in
# [× uniform](../docs/GLOSSARY.md#x-uniform): 1 = every visible key read equally).
#
# *§4's figure:* left, a sample's map, image positions first; right, the word 'triangle' over the picture (× uniform).
# **What you see**: the word puts <!--num "notebooks/00_primer.ipynb#out:of its weight on the@1"-->0.83<!--/num--> of its
# weight on the image, and its brightest patch is on the triangle, which draws
# <!--num "notebooks/00_primer.ipynb#out:the brightest patch is" re="[(]([0-9.]+x)"-->2.8x<!--/num--> its share of the patches.
#
# ![This lesson's first figure, from its last run](../docs/figures/00_primer.png)

# %% tags=["parameters"]
MODEL = "tiny-llava"
DEVICE = "auto"               # "cpu", "cuda" or "auto"
DTYPE = "auto"                # weights; statistics are fp32 always
SENTENCE = "where is the red circle ?"
LAYER = -1                    # the layer whose heads §3 and §4 show (-1: the last)
SAMPLE_SEED = 2024            # the shipped standard set
SAMPLES = None                # your own samples: a folder of images with a metadata.jsonl (`make samples` writes an example)
SEED = 0
OUT_DIR = "outputs/00_primer"

# %%
from unicache_lib.params import check_params

check_params(globals())  # every parameter above, before anything loads: a bad value stops here, naming itself

# %% [markdown]
# What a map *is*, one picture per idea, on the shipped `tiny-llava`. If you know self-attention, skim the pictures.
#
# **Terms**: a **query** is the vector a position looks with, a **key** the one it is found by, a **value** what it
# hands over; a **head** is one set of queries and keys in a layer. Also: [eager](../docs/GLOSSARY.md#eager),
# [sink](../docs/GLOSSARY.md#sink), [KV cache](../docs/GLOSSARY.md#kv-cache).
#
# **Needs**: nothing before it; any supported vision-language model (`MODEL`).
#
# **Time**: about <!--num @read_minutes:00_primer fmt="{} min"-->10 min<!--/num--> to read; last run <!--num data/results/00_primer.run.json#duration_s fmt="{:.0f} s" missing="not recorded yet"-->15 s<!--/num--> (2 CPU cores).

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

from unicache_lib import plots, stats
from unicache_lib.analysis.token_classes import content_position
from unicache_lib.capture import AttentionCapture
from unicache_lib.capture.runner import inputs_for
from unicache_lib.families import family_of
from unicache_lib.core.modality import BLOCKS
from unicache_lib.paths import project_path
from unicache_lib.world import samples as sample_set
from unicache_lib.world.scenes import patch_grid_masks
from unicache_lib.runtime.loaders import load_understanding

torch.manual_seed(SEED)
out = project_path(OUT_DIR)  # relative: from the repository root, wherever the kernel started
out.mkdir(parents=True, exist_ok=True)
model, processor = load_understanding(MODEL, attn_implementation="eager", dtype=DTYPE, device=DEVICE)
family = family_of(model)
tcfg = model.config.get_text_config()
print(f"{MODEL}: {tcfg.num_hidden_layers} language layers x {tcfg.num_attention_heads} heads, "
      f"{tcfg.hidden_size // tcfg.num_attention_heads} numbers per query and key")

# %% [markdown]
# ## 1. One query reads its keys
#
# A position that looks (the **query** `q`) compares itself with every position it may see (their **keys** `k`): the
# score is `q · k / √d`. Softmax turns the scores into **weights** that are positive and sum to 1; the position then
# takes the weighted mix of the **values**. Below, a toy query and five random keys (`d = 4`), one of them pointing the
# way the query does.

# %%
g = torch.Generator().manual_seed(SEED)
d = 4
q = torch.randn(d, generator=g)
K = torch.randn(5, d, generator=g)
K[2] = 1.5 * q + 0.2 * torch.randn(d, generator=g)  # one key that points the way the query does
scores = K @ q / d ** 0.5
weights = torch.softmax(scores, 0)
fig, axes = plt.subplots(1, 2, figsize=(8, 2.6))
names = [f"key {i}" for i in range(5)]
axes[0].bar(names, scores.numpy(), color="#777777")
axes[0].set(title="scores q·k/√d (any real number)", ylabel="score")
axes[1].bar(names, weights.numpy(), color="#1f77b4")
axes[1].set(title="weights = softmax(scores): positive, sum to 1", ylabel="weight", ylim=(0, 1))
fig.tight_layout()
_ = plots.save(fig, out, "one_query")
print("scores :", np.round(scores.numpy(), 2))
print("weights:", np.round(weights.numpy(), 3), f"sum = {weights.sum():.3f}; key {int(weights.argmax())} gets the most")

# %% [markdown]
# **What to look at.** Key 2's score is the largest, and softmax makes it by far the largest weight
# (<!--num "notebooks/00_primer.ipynb#out:weights:@2"-->0.985<!--/num-->): softmax exaggerates differences. Real maps
# are less extreme than this toy: on notebook 02's trained model the top tenth of the image positions takes
# <!--num data/results/02_understanding_maps.json#[claim=U1].value fmt="{:.2f}"-->0.41<!--/num--> of the text's image
# reads (U1 <!--num data/results/02_understanding_maps.json#[claim=U1].verdict-->does not hold<!--/num-->: mildly
# uneven). A weight is the share of the query's reading that goes to a key.
#
# ## 2. A sentence, and the causal mask
#
# Stack the weight rows of every position of a sentence and you have the **attention map**: rows are queries, columns
# keys, each row sums to 1. A language model reads left to right, so a query sees only keys at or before its own
# position — the **causal mask** (grey). Below: layer 0, head 0 on `SENTENCE`, captured with `AttentionCapture` (01).

# %%
enc = processor.tokenizer(SENTENCE, return_tensors="pt").to(model.device)
words = processor.tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
with torch.no_grad(), AttentionCapture(model, mode="full") as cap:
    model(input_ids=enc["input_ids"])
maps = {r.layer: r.probs.float() for r in cap.result}  # layer -> [heads, S, S]
first = maps[min(maps)][0]
_ = plots.save(plots.token_map(first, words, f"layer {min(maps)}, head 0: '{SENTENCE}'"), out, "sentence_map")
above = torch.triu(first, 1)
sink0, even = first[1:, 0].mean().item(), np.mean([1 / (i + 1) for i in range(1, len(words))])  # even: rows 1..S-1
print(f"{len(words)} tokens {words}")
print(f"rows sum to {first.sum(-1).min():.3f}-{first.sum(-1).max():.3f}; "
      f"largest weight above the diagonal (masked): {above.max():.1e}")
print(f"rows 1-{len(words) - 1} put on average {sink0:.2f} of their weight on the first token '{words[0]}' "
      f"(an even reading: {even:.2f})")
print(f"the last token '{words[-1]}' reads most: '{words[int(first[-1].argmax())]}' ({first[-1].max():.2f})")

# %% [markdown]
# **What to look at.** The top-left cell is 1: the first token can only read itself. Above the diagonal all is
# exactly zero. The bright first column is a [sink](../docs/GLOSSARY.md#sink): the rows after the first
# put on average <!--num "notebooks/00_primer.ipynb#out:of their weight on the first token@2"-->0.82<!--/num--> of
# their weight on the first token (an even reading:
# <!--num "notebooks/00_primer.ipynb#out:of their weight on the first token@3"-->0.27<!--/num-->), a place to put weight, not a sign the token matters; the last token
# reads itself most (<!--num "notebooks/00_primer.ipynb#out:reads most:" re="[(]([0-9.]+)[)]"-->0.90<!--/num-->). But one
# head is not the model's reading:
#
# ## 3. Heads read differently
#
# A layer runs several heads side by side, each with its own queries and keys. Here all heads of layer `LAYER` on the
# same sentence, titled with the normalised entropy of their rows (0 = every row reads one key, 1 = evenly).

# %%
layer = sorted(maps)[LAYER]
H = maps[layer].shape[0]
ent = stats.normalised_entropy(maps[layer]).nanmean(-1)  # [heads]
fig, axes = plt.subplots(2, (H + 1) // 2, figsize=(2.3 * ((H + 1) // 2), 4.8))
for h, ax in enumerate(np.ravel(axes)[:H]):
    plots.token_map(maps[layer][h], words, f"head {h}: entropy {ent[h]:.2f}", ax=ax, cbar=False)
    ax.set(xlabel="", ylabel="")
    ax.tick_params(labelsize=5)
fig.colorbar(np.ravel(axes)[0].images[0], ax=axes, shrink=0.8, label="attention weight (grey: masked)")
fig.suptitle(f"layer {layer}: the {H} heads on '{SENTENCE}'", fontsize=10)
_ = plots.save(fig, out, "heads")
print(f"layer {layer}: normalised entropy per head {np.round(ent.numpy(), 2)}")
print(f"most focused head {int(ent.argmin())} ({ent.min():.2f}), most spread head {int(ent.argmax())} ({ent.max():.2f})")

# %% [markdown]
# **What to look at.** The heads of one layer disagree (one colour bar for all; row 0 is always 1, the first token
# reading itself): the most focused head's
# rows have normalised entropy <!--num "notebooks/00_primer.ipynb#out:most focused head" re="most focused head \d+ [(]([0-9.]+)[)]"-->0.64<!--/num-->,
# the most spread head's <!--num "notebooks/00_primer.ipynb#out:most focused head" re="most spread head \d+ [(]([0-9.]+)[)]"-->0.90<!--/num-->.
# So the workbench keeps every head when it measures (a mean hides the focused ones) and pruning scores heads one by
# one (04). A cache is another matter: 05's best policy keeps one cover of the image keys over all heads together.
#
# ## 4. An image in the map
#
# A vision-language model turns the picture into **image tokens** (64 here, 576 on LLaVA-1.5) placed before the
# question, so the question's words can read the image's keys. Grouping positions image-first splits the map into four
# **modality blocks** (`X→Y`: queries of X reading keys of Y). Below: one sample's map in blocks, and a content word
# of the question (an object or colour) over the picture.

# %%
s = sample_set.load(SAMPLES, per_type=1, seed=SAMPLE_SEED)[0]
inputs = inputs_for(model, processor, s.image, s.question)
toks = processor.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
with torch.no_grad(), AttentionCapture(model, mode="full") as cap:
    model(**inputs)
maps = [x for x in cap.result if x.part == family.image_part and x.probs.shape[-1] == x.probs.shape[-2]]
if not maps:  # e.g. Mllama: the image is read through cross-attention layers, never placed in the sequence
    print(f"§4 not measurable here: {family.name} keeps the image out of the self-attention sequence, so no map has an "
          "image block; notebook 08 shows what its cross-attention layers read")

# %%
if maps:
    r = maps[LAYER]
    P, spans = r.probs.float().mean(0), r.spans  # mean over heads, for the picture only
    word = content_position(toks, spans.text_index)
    img = P[word, spans.image_index]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    plots.blocked_map(P, spans, f"layer {r.layer}, mean over heads: image | text", ax=axes[0])
    grid = family.image_grid(model.config, inputs)
    plots.image_overlay(s.image, img * (word + 1), f"'{toks[word]}' reads the picture (layer {r.layer}, mean over heads)", ax=axes[1],
                        grid=grid, grid_tokens=family.grid_tokens(model.config, inputs),
                        cbar="× uniform (1 = every visible key read equally)", vmin=0.0, chance=1.0)
    fig.tight_layout()
    _ = plots.save(fig, out, "image_in_the_map")
    shares = stats.block_shares(P, spans)
    print(f"sample {s.id}: '{s.question}', {spans.n_image} image + {spans.n_text} text positions")
    print("share of all attention per block: " + ", ".join(f"{b} {v:.2f}" for b, v in zip(BLOCKS, shares.tolist())))
    print(f"'{toks[word]}' (position {word}) puts {img.sum():.2f} of its weight on the {spans.n_image} image keys "
          f"(even over its {word + 1} visible keys: {spans.n_image / (word + 1):.2f})")
    print(f"its most-read patch gets {img.max() * (word + 1):.1f}x the uniform level")
    named = [i for i, o in enumerate(s.objects) if toks[word] in (o["shape"], o["colour"])]  # the object the word names
    if named and grid is not None:
        on = patch_grid_masks(s.masks, grid) == named[0]
        print(f"on the {s.objects[named[0]]['colour']} {s.objects[named[0]]['shape']}'s {on.sum()} patches: "
              f"{img[on].sum() / img.sum():.3f} of that image weight, where its share of the patches is {on.mean():.3f}")
        top2 = img[family.grid_tokens(model.config, inputs)][: 2 * grid[1]] * (word + 1)
        print(f"the top two rows of patches: {top2.mean():.1f}x uniform on average")
        top = int(img.argmax())
        print(f"the brightest patch is {'on' if on.ravel()[top] else 'off'} the named object "
              f"({(img[on].sum() / img.sum()) / on.mean():.1f}x the object's share of the patches overall)")

# %% [markdown]
# **What to look at.** Left (log10 scale; masked cells in the darkest colour): the dark band just below the border is the prompt tokens *before* the
# image, which cannot see it; their keys (the first a sink) are the bright column right of the border. Image rows (top)
# read the image and those tokens; bright stripes are patches many rows read. Of all attention,
# image→image takes <!--num "notebooks/00_primer.ipynb#out:share of all attention per block:@0"-->0.69<!--/num--> and
# text→image <!--num "notebooks/00_primer.ipynb#out:share of all attention per block:@3"-->0.09<!--/num-->, small partly
# because text has <!--num "notebooks/00_primer.ipynb#out:image + " re="([0-9]+) text positions"-->11<!--/num--> rows to
# the image's <!--num "notebooks/00_primer.ipynb#out:image + " re="([0-9]+) image \+"-->64<!--/num-->.
#
# Right: the word put <!--num "notebooks/00_primer.ipynb#out:of its weight on the@1"-->0.83<!--/num--> of its weight on the image,
# slightly under an even reading (<!--num "notebooks/00_primer.ipynb#out:of its weight on the@4"-->0.89<!--/num-->).
# Inside the picture it is uneven: its top patch got
# <!--num "notebooks/00_primer.ipynb#out:its most-read patch gets@0"-->5.3<!--/num-->× uniform, the top two rows of
# patches, background it does not name, <!--num "notebooks/00_primer.ipynb#out:the top two rows of patches:@0"-->2.1<!--/num-->×.
#
# The object it names drew <!--num "notebooks/00_primer.ipynb#out:the brightest patch is" re="[(]([0-9.]+x)"-->2.8x<!--/num-->
# its share of the patches (the `on the ... patches` line), and the brightest patch is
# <!--num "notebooks/00_primer.ipynb#out:the brightest patch is" re="patch is ([onf]+) the"-->on<!--/num--> it (the light
# square on the triangle): a word's reading leans towards what it names, but it is not a segmentation.

# %% [markdown]
# ## Recap
#
# On this run: softmax gave the key pointing the query's way
# <!--num "notebooks/00_primer.ipynb#out:weights:@2"-->0.985<!--/num--> of the weight; the rows of a sentence put
# <!--num "notebooks/00_primer.ipynb#out:of their weight on the first token@2"-->0.82<!--/num--> of their weight on the
# first token, a sink.
#
# The heads of one layer ranged from normalised entropy
# <!--num "notebooks/00_primer.ipynb#out:most focused head" re="most focused head \d+ [(]([0-9.]+)[)]"-->0.64<!--/num--> to
# <!--num "notebooks/00_primer.ipynb#out:most spread head" re="most spread head \d+ [(]([0-9.]+)[)]"-->0.90<!--/num-->; a
# question word put <!--num "notebooks/00_primer.ipynb#out:of its weight on the@1"-->0.83<!--/num--> of its weight on the
# image, leaning towards the object it names.
#
# What each means for a cache, from the lesson that measures it (`unicache_lib/claims.py`). Terms: a **budget**, the
# share of the image KV kept ([eviction](../docs/GLOSSARY.md#eviction)); a **cover**, kept keys such that every image
# key is near one ([k-center](../docs/GLOSSARY.md#k-center)), what 05's `key_coverage` keeps; P3, 04's head-pruning test.

# %%
from unicache_lib.claims import decision_table

decision_table([  # (claim, what you measured here, its value); what it means and where to act: the claim's advice
    ("U4", "a sink column: the rows' weight on the first token (§2; 02's U4)",
     f"{sink0:.2f} (even {even:.2f})"),
    ("U8", "heads with different entropies: normalised entropy per head of one layer (§3; 02's U8)",
     f"{ent.min():.2f} to {ent.max():.2f}"),
    ("U11", "a word's reading of the picture: its weight on the object it names / the object's share of the patches "
     "(§4; 02's U11)", f"{(img[on].sum() / img.sum()) / on.mean():.1f}x" if maps and named and grid is not None else "-"),
], "00_primer")

# %% [markdown]
# ## Exercises
#
# Each starter leaves one gap (`# <- write`) and checks what you wrote. Solutions:
# [solutions/00_primer.py](../solutions/00_primer.py) (`--only K` runs one).
#
# 1. ★ §2 read one head. Write `sink_ratio(P)`: for one layer's maps `P` (`[heads, S, S]`), the mean weight the
#    rows after the first put on the first token, over rows and heads, divided by the uniform share. The starter
#    checks it on §2's head, then runs it on every layer of a longer sentence: in which layers is the first token a
#    sink (above <!--const this exercise's threshold, chosen before the answer-->2<!--/const-->× uniform)?
# 2. ★★ For §4's sample, which head of the last layer puts most of the content word's weight on the image, and how
#    far apart are the heads? The starter checks your per-head sums against §4's mean over heads.

# %%
# Exercise 1 starter: the first token's share, every head of every layer of a longer sentence
def sink_ratio(P):
    """P: one layer's maps [heads, S, S]. Returns a float: the mean weight rows 1..S-1 put on key 0 (over rows and
    heads), divided by the uniform share (1 / keys visible, averaged over the same rows)."""
    ...  # <- write: the body (the uniform share as §2 computed `even`)


if sink_ratio(first[None]) is None:
    print("Write the body of `sink_ratio`, then run this cell again.")
else:
    got, want = float(sink_ratio(first[None])), sink0 / even  # §2: head 0 of the first layer, as printed there
    print(f"§2's head: {got:.3f}x uniform; " + ("correct" if abs(got - want) < 1e-3 else f"§2 printed {want:.3f}x"))
    longer = "is there a blue square ? what color is the circle ?"
    ids = processor.tokenizer(longer, return_tensors="pt")["input_ids"].to(model.device)
    with torch.no_grad(), AttentionCapture(model, mode="full") as cap:
        model(input_ids=ids)
    for rec in cap.result:
        print(f"layer {rec.layer}: weight on the first token {float(sink_ratio(rec.probs.float())):.2f}x uniform")

# %%
# Exercise 2 starter: the content word's weight on the image, head by head (§4's sample, layer `r.layer`)
per_head = ...  # <- write: an expression over r.probs, word and spans.image_index: one sum per head
if not maps:
    print("§4 found no image block for this model: nothing to measure")
elif per_head is ...:
    print("Write `per_head`, then run this cell again.")
else:
    per_head = np.asarray(per_head, dtype=float)
    check = "correct" if abs(per_head.mean() - float(img.sum())) < 1e-4 else f"§4 printed {float(img.sum()):.2f}"
    print(f"mean over heads {per_head.mean():.2f} ({check}); " + ", ".join(f"h{h} {v:.2f}" for h, v in enumerate(per_head)))
    print(f"most image-reading head {int(per_head.argmax())}, least {int(per_head.argmin())}; "
          f"spread {per_head.max() - per_head.min():.2f}")

# %% [markdown]
# ## Next steps
#
# > **Your model.** Run this lesson on it and compare §3's heads and §4's word with this run's:
# > `.venv/bin/papermill notebooks/00_primer.ipynb outputs/00_mine.ipynb -p MODEL <path or hub id>`. Then 01.
