# %% [markdown]
# # 00 · A primer: queries, keys, heads and the attention map
#
# Every later lesson measures attention maps: their spread, where text reads the image, which positions a cache may
# drop. This one shows what an attention map *is*, one picture per idea, on the shipped `tiny-llava` — before any
# statistic. If you know how self-attention works, skim the pictures and go on to 01.
#
# **What you will learn**
# - how one query scores every key and turns the scores into weights that sum to 1 (softmax);
# - what the causal mask does, and how to read a map: rows are queries (who reads), columns keys (what is read);
# - why a layer has several heads, and that they read differently;
# - what an image looks like inside a vision-language model's map: 64 image positions before the question, four
#   [modality blocks](../docs/GLOSSARY.md#modality-blocks), and a word's attention laid over the picture, measured
#   against the uniform level (1 = every visible key read equally).
#
# **Terms** (glossary links): [KV cache](../docs/GLOSSARY.md#kv-cache), [eager](../docs/GLOSSARY.md#eager),
# [sink](../docs/GLOSSARY.md#sink), [modality blocks](../docs/GLOSSARY.md#modality-blocks). **Query** = the vector a
# position uses to look; **key** = the vector a position is found by; **value** = what it hands over when read;
# **head** = one independent set of queries and keys in a layer.
#
# **What it needs**: nothing before it; a minute on 2 CPU cores. Runs on the shipped `tiny-llava` or any supported
# vision-language checkpoint (`MODEL`, `DEVICE`, `DTYPE`).

# %% tags=["parameters"]
MODEL = "tiny-llava"
DEVICE = "auto"               # "cpu", "cuda" or "auto"
DTYPE = "auto"                # weights; statistics are fp32 always
SENTENCE = "where is the red circle ?"
LAYER = -1                    # the layer whose heads §3 and §4 show (-1: the last)
SAMPLE_SEED = 2024            # the shipped standard set
SAMPLES = None                # your own samples: a folder of images with a metadata.jsonl (make samples: an example)
SEED = 0
OUT_DIR = "outputs/00_primer"

# %%
from unicache_lib.params import check_params

check_params(globals())  # every parameter above, before anything loads: a bad value stops here, naming itself

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
from unicache_lib.zoo.loaders import load_understanding

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
# score is the dot product `q · k / √d`. Softmax turns the scores into **weights** that are positive and sum to 1; the
# position then takes the weighted mix of the **values**. Below, a toy query and five keys (random numbers, `d = 4`):
# one key points the way the query does and gets most of the weight.

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
# **What to look at.** The largest score becomes by far the largest weight: softmax exaggerates differences, which is
# why real maps are often *concentrated* on a few keys. A weight is a share of the query's reading, never a
# probability that something is "true".
#
# ## 2. A sentence, and the causal mask
#
# Now every position of a short sentence is a query at once. Stacking their weight rows gives the **attention map**:
# rows are queries (who reads), columns keys (what is read), each row sums to 1. A language model reads left to
# right, so a query may only see keys at or before its own position — the **causal mask** (grey). This is the first
# layer's first head of the shipped model on `SENTENCE`, captured with the workbench's hook (`AttentionCapture`,
# notebook 01).

# %%
enc = processor.tokenizer(SENTENCE, return_tensors="pt").to(model.device)
words = processor.tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
with torch.no_grad(), AttentionCapture(model, mode="full") as cap:
    model(input_ids=enc["input_ids"])
maps = {r.layer: r.probs.float() for r in cap.result}  # layer -> [heads, S, S]
first = maps[min(maps)][0]
_ = plots.save(plots.token_map(first, words, f"layer {min(maps)}, head 0: '{SENTENCE}'"), out, "sentence_map")
above = torch.triu(first, 1)
print(f"{len(words)} tokens {words}; rows sum to {first.sum(-1).min():.3f}-{first.sum(-1).max():.3f}; "
      f"largest weight above the diagonal (masked): {above.max():.1e}")
print(f"the last token '{words[-1]}' reads most: '{words[int(first[-1].argmax())]}' ({first[-1].max():.2f})")

# %% [markdown]
# **What to look at.** The top-left cell is 1: the first token can only read itself. Each later row spreads its unit of
# weight over what it can see; everything above the diagonal is grey and exactly zero (printed above). A bright
# first column — many rows reading the first token — is a [sink](../docs/GLOSSARY.md#sink): a place to park weight,
# common in trained models. What one head does at one layer is not the model's reading; the next section shows why.
#
# ## 3. Heads read differently
#
# A layer runs several heads side by side, each with its own queries and keys, and concatenates what they read. Here
# all heads of layer `LAYER` on the same sentence, with one number per head: the normalised entropy of its rows
# (0 = every row reads one key, 1 = every row reads evenly).

# %%
layer = sorted(maps)[LAYER]
H = maps[layer].shape[0]
ent = stats.normalised_entropy(maps[layer]).nanmean(-1)  # [heads]
fig, axes = plt.subplots(2, (H + 1) // 2, figsize=(2.3 * ((H + 1) // 2), 4.8))
for h, ax in enumerate(np.ravel(axes)[:H]):
    plots.token_map(maps[layer][h], words, f"head {h}: entropy {ent[h]:.2f}", ax=ax, cbar=False)
    ax.set(xlabel="", ylabel="")
    ax.tick_params(labelsize=5)
fig.suptitle(f"layer {layer}: the {H} heads on '{SENTENCE}'", fontsize=10)
fig.tight_layout()
_ = plots.save(fig, out, "heads")
print(f"layer {layer}: normalised entropy per head {np.round(ent.numpy(), 2)}; most focused head {int(ent.argmin())}, "
      f"most spread head {int(ent.argmax())}")

# %% [markdown]
# **What to look at.** The heads of one layer do not agree: some rows pile onto one key, others spread. That is why
# the workbench keeps every head (a mean over heads hides the focused ones), why pruning scores heads one by one
# (notebook 04), and why a cache policy that treats all heads alike can drop what one head needs.
#
# ## 4. An image in the map
#
# A vision-language model turns the picture into **image tokens** (64 here, 576 on LLaVA-1.5) and puts them in the
# sequence before the question: the question's words are queries that can read the image's keys. Grouping positions
# image-first, text-second splits the map into four **modality blocks** — image→image, image→text, text→image,
# text→text (`X→Y`: queries of X reading keys of Y; printed in that order below). Below, one standard sample: its map in blocks, then the attention of one content word of the question
# (an object or a colour, not punctuation) laid over the picture.

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
    plots.image_overlay(s.image, img * (word + 1), f"'{toks[word]}' reads the picture (layer {r.layer})", ax=axes[1],
                        grid=grid, grid_tokens=family.grid_tokens(model.config, inputs),
                        cbar="× uniform (1 = every visible key read equally)")
    fig.tight_layout()
    _ = plots.save(fig, out, "image_in_the_map")
    shares = stats.block_shares(P, spans)
    print(f"sample {s.id}: '{s.question}', {spans.n_image} image + {spans.n_text} text positions")
    print("share of all attention per block: " + ", ".join(f"{b} {v:.2f}" for b, v in zip(BLOCKS, shares.tolist())))
    print(f"'{toks[word]}' (position {word}) puts {img.sum():.2f} of its weight on the {spans.n_image} image keys; its "
          f"most-read patch gets {img.max() * (word + 1):.1f}x the uniform level")
    named = [i for i, o in enumerate(s.objects) if toks[word] in (o["shape"], o["colour"])]  # the object the word names
    if named and grid is not None:
        on = patch_grid_masks(s.masks, grid) == named[0]
        print(f"on the {s.objects[named[0]]['colour']} {s.objects[named[0]]['shape']}'s {on.sum()} patches: {img[on].sum() / img.sum():.2f} "
              f"of that image weight, where its share of the patches is {on.mean():.2f}")

# %% [markdown]
# **What to look at.** Left, on a log10 colour scale (−6 to 0: each step is ten times less weight), positions are
# regrouped image first, so the few prompt tokens that come *before* the image in the sequence (its first token a
# sink) appear as the bright column just right of the border. The image rows (top block) read the image and those
# prompt tokens; they cannot read the question, which comes after them (the causal mask). The bright vertical stripes
# inside the image block are patches that many rows read: notebook 02 calls them anchors. The text rows (bottom
# block) split their weight between the image keys and the text keys. Right: the colour scale is in multiples of the
# uniform level, so 1 means "read like every other key it can see". Read the lines above with it: how much of the
# word's weight goes to the image at all, how far above uniform its most-read patch is, and how much of it lands on
# the object the word names compared with that object's share of the picture. A word's reading is not a
# segmentation: a patch next to the object, or a plain one that acts as a sink, can be the brightest.
#
# ## Recap
#
# | idea | in one line | where the workbook measures it |
# |---|---|---|
# | query, key, softmax | each position scores what it can see and spreads one unit of weight | every notebook |
# | causal mask | a position reads only itself and what came before | 01 (capture checks it), 02 |
# | heads | several readers per layer, each its own map | 02 (head roles), 04 (pruning heads) |
# | image tokens, modality blocks | the picture is positions in the sequence; text reads it through the text→image block | 02, 08 |
# | a word over the picture, × uniform | where a word reads, against reading evenly | 02 (localisation), 05 (what a cache must keep) |
# | KV cache | the keys and values of past positions, kept so the next token need not recompute them | 05 (eviction), 06 (reuse across steps) |
#
# ## Exercises
#
# Graded ★ (a parameter) to ★★ (a few lines). Solutions: [solutions/00_primer.py](../solutions/00_primer.py). Each
# exercise has a starter cell below.
#
# 1. ★ Set `SENTENCE` to a longer one (`"is there a blue square ? what color is the circle ?"`) and compare the weight
#    the rows put on the first token with the uniform share, layer by layer: is the first token a sink on a plain
#    sentence, averaged over the heads? *Expected:* only mildly, and not everywhere — on tiny-llava the short sentence
#    gives it about its uniform share in every layer (0.9–1.1×), the longer one 1.3–1.5× in layers 0, 2 and 3 and
#    less than uniform in layer 1; single heads differ (§2's head 0 of layer 0 is a strong sink).
# 2. ★★ For the sample of §4, which head of the last layer puts the most of the content word's weight on the image?
#    Compute `r.probs[h, word, spans.image_index].sum()` for each head `h`. *Expected:* on tiny-llava the heads differ
#    widely — from 0.40 (head 5) to 0.99 (head 3) of the word's weight on the 64 image keys, mean 0.83: six heads
#    read almost only the picture, two split their weight with the question's words.

# %%
# Exercise 1 starter: another sentence through the same capture
longer = "is there a blue square ? what color is the circle ?"
print(processor.tokenizer.tokenize(longer), "-> capture it as in §2 and plot plots.token_map(...)")

# %%
# Exercise 2 starter: the content word's weight on the image, head by head
if maps:
    per_head = r.probs[:, word, spans.image_index].float().sum(-1)
    print(f"{len(per_head)} heads; next: which is largest, and how far apart are they?")
