# %% [markdown]
# # 05 · Caching experiments: KV eviction and cross-step reuse, against the peers
#
# **What you will learn**
# - how to evict image-token KV entries from a real transformers cache and answer on what is left (own
#   decode loop, positions continuing from the original length);
# - how the study's rule ("UniCache"), StreamingLLM, H2O, SnapKV, FastV, random and an oracle compare at
#   10–75% of the image KV, side by side with NVIDIA's `kvpress` presses on the same model and questions;
# - how a policy designed from this workbook's own measurements (`key_coverage`: a cover of each layer's cached
#   image keys) does against all of them and against DivPrune, which prunes image tokens before the prefill —
#   tuned on design questions, scored on held-out ones;
# - when the cheap simulation (attention mass retained) predicts real accuracy;
# - how reusing attention across denoising steps trades quality for speed on both generators, for the
#   study's schedules and for diffusers' own caches (PAB, FasterCache, FirstBlockCache, TaylorSeer, MagCache).
#
# **What it needs**: notebooks 02 and 03 for the ideas; it measures everything it shows. Runs on the shipped
# `tiny-llava`, `tiny-mmdit` and `tiny-pixart`; the eviction half on a checkpoint of any supported
# vision-language family (`UNDERSTANDING_MODEL`, `DEVICE`, `DTYPE`), the reuse half on the shipped generators
# or diffusers pipeline folders of SD3 / SD3.5, PixArt-α / Σ, Flux.1 or Sana (`GENERATORS`, same `DEVICE` /
# `DTYPE`; `[]` skips it), sampled through the pipeline (its scheduler, guidance and VAE) and judged on the
# decoded pixels. Every diffusers cache is configured with the family's own module names.
#
# **Setting.** The image is prefilled once ("user : <image>"); the question arrives after the cache was
# compressed, as in a multi-turn chat. Every answer token is therefore produced on the compressed cache.

# %% tags=["parameters"]
UNDERSTANDING_MODEL = "tiny-llava"
DEVICE = "auto"               # "cpu", "cuda" or "auto"
DTYPE = "auto"                # weights; statistics are fp32 always
GENERATORS = ["tiny-mmdit", "tiny-pixart"]   # shipped names or pipeline folders; [] skips cross-step reuse
N_EVICTION = 150              # questions for the eviction sweep
BUDGETS = [0.1, 0.25, 0.5, 0.75]
PEERS = True                  # also run the kvpress presses
N_PROMPTS = 32                # single-object prompts for the reuse sweep
STEPS = 20
GUIDANCE = 3.0
TIMING_PROMPTS = 8
REPEATS = 10                  # interleaved timing rounds in shuffled order, a wall-clock verdict needs 10 or more
SEED = 0
OUT_DIR = "outputs/05_caching"

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from scipy import stats as st

from unicache_lib import plots
from unicache_lib.capture.runner import inputs_for
from unicache_lib.families import family_of
from unicache_lib.kv import POLICIES
from unicache_lib.kv.evaluate import against_peers, run_eviction, share_of_full, summary, worst_peer_difference
from unicache_lib.kv.peers import press_factories
from unicache_lib.reuse.evaluate import methods_for, run_reuse
from unicache_lib.intervals import MIN_TIMING_REPEATS, Interval, bootstrap, difference_interval
from unicache_lib.replicate import unstable_claims
from unicache_lib.scoreboard import Scoreboard
from unicache_lib.world.text import prompt_set
from unicache_lib.zoo.loaders import is_stand_in, load_generator, load_understanding, model_label
from unicache_lib.zoo.train_llava import heldout_set

torch.manual_seed(SEED)
out = Path(OUT_DIR)
out.mkdir(parents=True, exist_ok=True)
model, processor = load_understanding(UNDERSTANDING_MODEL, attn_implementation="eager", dtype=DTYPE, device=DEVICE)
family = family_of(model)
qas = heldout_set(N_EVICTION, seed=SEED + 2024)
print(f"{UNDERSTANDING_MODEL} ({family.name}): {len(qas)} questions; policies: {', '.join(POLICIES)}; budgets {BUDGETS}")
if family.context_note():
    print(family.context_note())

# %% [markdown]
# ## 1. KV eviction, for real
#
# For each question: prefill the context with attention, answer on the full cache (reference), then for
# each method and budget evict a copy of the cache and answer again. Budget = fraction of the image
# positions kept in every layer (64 on the shipped model, 576 on LLaVA-1.5; non-image context positions always
# stay); `kv_fraction` is what the cache actually holds relative to the full one.
#
# **A cross-attention VLM (Mllama / Llama-3.2-Vision)** keeps no image tokens in its self-attention cache at
# all: the image lives in the keys and values of its cross-attention layers (one every 5th layer), 1,601
# vision tokens per 560-px tile. Evicting "image KV" there means dropping vision-token entries from those
# layers' caches; the text cache is untouched, and padded tiles (masked anyway) are dropped first, exactly.
# What a policy can observe is different too: at eviction time only the text up to the `<|image|>` marker
# has run, and text before the image never reads it (its cross-attention output is gated to zero), so
# attention-based scores rest on very few query rows. The kvpress presses compress self-attention caches
# during prefill and do not apply (the notebook refuses `PEERS=True` for such a model). The kvpress presses get the compression ratio that leaves the same
# number of context positions, configured as their authors intend on this context:
#
# - **SnapKV** (and AdaKV, which wraps it) scores keys with an *observation window* of the last queries of
#   the prefill. Here the question has not arrived when the cache is compressed, so the only queries that
#   exist are the context's own; kvpress's default window of 64 would cover 64 of the 67 context positions,
#   tie every image key and keep one contiguous block. The window is sized to the context
#   (`observation_window`: one eighth, here the last 8 positions = the bottom row of the 8×8 image grid;
#   those keys are always kept, as in SnapKV).
# - **AdaKV** does not free memory: it masks keys per head and keeps the whole cache, so its row reads
#   "masked, full memory" and its `kv_fraction` is 1.0. Its accuracy is not a point on the same memory axis
#   as the others.

# %%
policies = {n: c() for n, c in POLICIES.items()}
policies["unicache_swapped"] = POLICIES["unicache"](swap_bands=True)  # control for U7 (rules of the bands swapped)
R = run_eviction(model, processor, qas, BUDGETS, policies, press_factories() if PEERS else None, SEED, progress=False)
for name, why in R.attrs["skipped"].items():
    print(f"{name} left out: {why}")
S = summary(R)
R.to_csv(out / "eviction_rows.csv", index=False)

# %%
# NBVAL_CHECK_OUTPUT
print(f"n = {len(qas)} questions per row")
print(S[["accuracy", "agree", "kl", "kv_fraction", "retained"]].round(3).to_string())

# %%
fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
for ax, metric, lab in zip(axes, ("correct", "kl", "agree"), ("exact-match accuracy", "KL(full || evicted), nats", "same answer as full cache")):
    for (kind, method), d in R.groupby(["kind", "method"]):
        if method == "full":
            continue
        g = d.groupby("budget")[metric].mean()
        masked = "masked, full memory" in method
        prefill_stage = getattr(policies.get(method), "stage", "cache") == "prefill"
        ax.plot(g.index, g.values, marker="x" if masked else "o", ls=":" if masked else "--" if kind == "kvpress" else
                "-." if prefill_stage else "-", label=method, lw=2.5 if method in ("unicache", "key_coverage") else 1)
    ax.set_xlabel("image KV budget")
    ax.set_ylabel(lab)
    ax.set_xscale("log")
    ax.set_xticks(BUDGETS, [f"{b:.0%}" for b in BUDGETS])
axes[0].axhline(R[R.method == "full"].correct.mean(), color="k", lw=0.8, ls=":")
axes[2].legend(fontsize=6, ncol=2)
fig.suptitle(f"KV eviction on {UNDERSTANDING_MODEL} (solid: cache-stage policies, dash-dot: pruned before the prefill, dashed: "
             f"kvpress, dotted: masked with full memory held), n = {len(qas)}", fontsize=10)
fig.tight_layout()
_ = plots.save(fig, out, "eviction")

# %% [markdown]
# **Memory and time.** Bytes held and the time to answer on the compressed cache (question prefill + first
# token), median over questions. On a 67-position context the attention over the cache is a small part of
# each forward, so time barely moves; bytes scale with the budget.

# %%
mt = R[(R.kind == "policy") & (R.method != "full")].groupby("budget").agg(kv_fraction=("kv_fraction", "mean"), ms_median=("ms", "median"))
mt["time vs full"] = mt.ms_median / R[R.method == "full"].ms.median()
print(mt.round(3).to_string())  # timings vary from run to run

# %% [markdown]
# ## 1b. A policy designed from the measurements: key coverage
#
# **Why this design.** Notebook 02 shows a question's read of the image piling onto one object, and which object
# depends on the question — which has not arrived when the cache is compressed. The table above shows the
# consequence: rules that keep the most-read positions (H2O, SnapKV, the study's rule, the kvpress presses) keep
# several patches of one object and none of the others, and fall below *random* at 25–50%. Even the oracle, which
# knows the question's reads, loses at 10%: scores pile onto one object. What survives is **coverage**: a later
# query can only find what some kept key still resembles. `key_coverage` keeps, in every layer, a k-center cover
# of that layer's cached image keys (greedy farthest point, Euclidean, all heads concatenated, started at the
# most-read position): unusual, large-norm keys — the objects — come first, and one key stands for each cluster
# of near-identical background keys. It was tuned on 100 *design* questions (`benchmarks/tune_key_coverage.py`:
# keys beat keys+values, values, cosine distance and read-weighted variants) and is scored here, once, on the
# held-out questions above.
#
# **The bar: DivPrune** (Alvar et al., CVPR 2025) picks a max-min diverse subset of the image *features* before
# the language model runs, so it also saves prefill compute. Published, the pruned sequence is renumbered; the
# shipped model was trained on one fixed layout and collapses under renumbering (0.58–0.69 on the design set), so
# the peer keeps original positions here (`DivPrune(renumber=True)` runs it as published on a 7B model).

# %%
# NBVAL_CHECK_OUTPUT
design = heldout_set(100, seed=7000)
overlap = {(q.question, q.scene.uint8().tobytes()) for q in design} & {(q.question, q.scene.uint8().tobytes()) for q in qas}
print(f"design set: {len(design)} questions (heldout_set(100, seed=7000)); scored here: {len(qas)} "
      f"(heldout_set({N_EVICTION}, seed={SEED + 2024})); shared: {len(overlap)}")
PEER_METHODS = [m for m in R.method.unique() if m.startswith("kvpress:") or m in ("divprune", "fastv", "snapkv", "h2o", "streaming")]
NEW = "key_coverage"
vs = against_peers(R, NEW, PEER_METHODS)
if len(vs):
    best = vs.loc[vs.groupby("budget").peer_acc.idxmax()]
    print(f"{NEW} against the best peer at each budget (paired difference, 95% interval over questions):")
    print(best[["budget", "peer", "method_acc", "peer_acc", "diff", "lo", "hi", "verdict"]].round(3).to_string(index=False))
    print("cells where key_coverage is ahead / tied / behind:", vs.verdict.value_counts().to_dict())

# %% [markdown]
# **The hard cases on their own.** The shipped world flatters coverage: few, distinct objects at five fixed spots.
# Cluttered scenes (three or four objects, textured background, distractor dots) and the "is there …?" questions
# (an absent object must be *missing* from what is kept, a present one must survive) are where errors sit.

# %%
# NBVAL_CHECK_OUTPUT
show = [m for m in ["full", NEW, "divprune", "oracle", "kvpress:expected_attention", "unicache", "random"] if m in set(R.method)]
hard = R[R.method.isin(show)]
hard = hard.assign(subset=np.where(hard.scene == "clutter", "clutter scenes", "other scenes"))
for col, label in (("subset", "scene"), ("qtype", "question type")):
    t = hard.groupby([col, "method", "budget"]).correct.mean().unstack("budget")
    print(f"accuracy by {label} (n: {hard.drop_duplicates('question')[col].value_counts().to_dict()})")
    print(t.round(3).to_string())

# %% [markdown]
# **What the prefill-stage peer saves.** A cache-stage policy pays the whole prefill and then frees memory;
# DivPrune prefills only the kept tokens. Median prefill time (no attention capture) and positions prefilled:

# %%
pf = R[R.method.isin(["full", NEW, "divprune"])].groupby(["method", "budget"]).agg(
    prefill_tokens=("prefill_tokens", "mean"), prefill_ms=("prefill_ms", "median"), kv_fraction=("kv_fraction", "mean"))
print(pf.round(3).to_string())  # timings vary from run to run
print("At LLaVA-1.5-7B's shape (576 image tokens, 32 layers) bytes, decode-step time and the policies' selection "
      "cost are measured side by side by `make benchmark` (benchmarks/caching.py).")

# %% [markdown]
# **Pareto view.** Accuracy against the bytes the cache actually holds, every method that frees memory, with 95%
# intervals over questions; up and to the left is better.

# %%
from unicache_lib.intervals import proportion_interval

fig, ax = plt.subplots(figsize=(7.5, 4.5))
freed = R[(R.memory == "freed") & (R.method != "full")]
for i, (m, d) in enumerate(freed.groupby("method")):
    pts = [(g.kv_fraction.mean(), proportion_interval(g.sort_values("question").correct, "questions")) for _, g in d.groupby("budget")]
    x = [p[0] for p in pts]
    y = np.array([[p[1].value, p[1].value - p[1].lo, p[1].hi - p[1].value] for p in pts])
    ax.errorbar(x, y[:, 0], yerr=y[:, 1:].T, marker="o", ms=4, capsize=2, color=plt.cm.tab20(i % 20),
                ls="--" if m.startswith("kvpress:") else "-", lw=2.5 if m == NEW else 1, label=m)
ax.axhline(R[R.method == "full"].correct.mean(), color="k", lw=0.8, ls=":", label="full cache")
ax.set_xlabel("KV bytes held / full cache")
ax.set_ylabel("exact-match accuracy")
ax.legend(fontsize=6, ncol=2, loc="lower right")
ax.set_title(f"{UNDERSTANDING_MODEL}: accuracy vs memory, n = {len(qas)} held-out questions", fontsize=9)
fig.tight_layout()
_ = plots.save(fig, out, "eviction_pareto")

# %% [markdown]
# ## 2. Can the cheap simulation be trusted?
#
# `retained` = share of the question's attention on the context that falls on kept positions (from the
# full-cache run). Per (policy, budget) cell, how well does it rank real accuracy?

# %%
# NBVAL_CHECK_OUTPUT
cells = S.loc["policy"].drop(index=["full"], level=0)
rho, pval = st.spearmanr(cells["retained"], cells["accuracy"])
print(f"Spearman rho(retained, accuracy) over {len(cells)} (policy, budget) cells = {rho:.2f} (p = {pval:.1g})")
per_q = R[(R.kind == "policy") & (R.method != "full")]
rho_q = st.spearmanr(per_q.retained, per_q.kl).statistic
print(f"per question: rho(retained, KL) = {rho_q:.2f} over {len(per_q)} rows")
fig, ax = plt.subplots(figsize=(4.5, 3.5))
for m, d in cells.groupby(level=0):
    ax.plot(d.retained, d.accuracy, marker="o", label=m)
ax.set_xlabel("attention mass retained (simulated)")
ax.set_ylabel("accuracy (real)")
ax.legend(fontsize=6)
fig.tight_layout()
_ = plots.save(fig, out, "simulation_vs_real")

# %% [markdown]
# ## 3. Shallow by locality, deep by content? (U7)
#
# `unicache` keeps an even spatial grid over the picture's image tokens (plus anchors; the family adapter says
# which tokens tile the picture, e.g. one tile without its class token on Mllama) in the shallow band and the most-read positions
# deeper; `unicache_swapped` does the opposite. Same budgets, same questions.

# %%
# NBVAL_CHECK_OUTPUT
u7 = S.loc["policy"].loc[["unicache", "unicache_swapped", "h2o", "random"], "accuracy"].unstack("budget")
print(u7.round(3).to_string())
def per_question(method):
    """``[n_questions]``: a method's accuracy per question, averaged over the budgets."""
    return R[(R.kind == "policy") & (R.method == method)].groupby("question").correct.mean().sort_index().to_numpy(dtype=float)


u7_iv = difference_interval(per_question("unicache"), per_question("unicache_swapped"), "questions")
print(f"mean accuracy gap, locality-shallow minus locality-deep: {100 * u7_iv.value:+.1f} points "
      f"[{100 * u7_iv.lo:+.1f}, {100 * u7_iv.hi:+.1f}] (95% interval over questions)")

# %% [markdown]
# ## 4. Cross-step reuse on the generators
#
# Each method draws the same `N_PROMPTS` prompts with the same seeds; quality is measured against the
# no-reuse images, `computed` is the attention work actually done relative to no reuse (counted in batch rows
# at the attention processors, so skipped blocks count too and a call on half of the CFG batch — FasterCache
# skipping the unconditional branch — counts half), and speed-up is the median over `REPEATS` interleaved
# rounds (every method once per round, in a shuffled order) of the no-reuse time divided by the method's time
# in the same round, for a `TIMING_PROMPTS`-prompt batch, with a 95% bootstrap interval over the rounds.
# MagCache is calibrated on 4 held-out prompts, not on the ones it is scored on.

# %%
gprompts = prompt_set(N_PROMPTS + 4, 0, SEED)  # the first N_PROMPTS are scored, the last 4 calibrate MagCache
objs = [p["objects"][0] for p in gprompts[:N_PROMPTS]]
texts = [p["short"] for p in gprompts[:N_PROMPTS]]
calibration = [p["short"] for p in gprompts[N_PROMPTS:]]
RU, gfamily = {}, {}
gpaths = {model_label(g): g for g in GENERATORS}  # tables use the label, never a full path
for gname, gpath in gpaths.items():
    gen = load_generator(gpath, dtype=DTYPE, device=DEVICE)
    gfamily[gname] = gen.family
    RU[gname] = run_reuse(gen, methods_for(gen, STEPS, GUIDANCE, calibration, scored_prompts=texts), texts, objs, STEPS, GUIDANCE,
                          SEED, TIMING_PROMPTS, REPEATS, progress=False)
if not GENERATORS:
    print("GENERATORS is empty: cross-step reuse is skipped")
reuse = pd.concat(RU, names=["model"]) if RU else pd.DataFrame(
    columns=["psnr", "ssim", "colour", "position", "computed", "note", "speedup", "speedup_lo", "speedup_hi", "median_s", "iqr_s"])

# %%
# NBVAL_CHECK_OUTPUT
print(f"n = {N_PROMPTS} prompts")
print(reuse[["psnr", "ssim", "colour", "position", "computed"]].round(3).to_string())
print(reuse.loc[reuse.note != "", ["note"]].to_string())

# %%
# timings vary from run to run; the table above is the checked part
print(f"speed-up: median paired ratio over {REPEATS} shuffled interleaved rounds, 95% interval over rounds")
print(reuse[["speedup", "speedup_lo", "speedup_hi", "median_s", "iqr_s", "computed"]].round(3).to_string())
cols = ["psnr", "ssim", "computed", "speedup", "speedup_lo", "speedup_hi", "note"]
if RU:  # the reuse table as a file, for the rehearsal's README table
    reuse.reset_index()[["model", "method", *cols]].to_csv(out / "reuse.csv", index=False)
fig, axes = plt.subplots(1, max(1, len(gpaths)), figsize=(6 * max(1, len(gpaths)), 4), squeeze=False)
for ax, gname in zip(axes[0], gpaths):
    d = RU[gname].dropna(subset=["ssim"])
    for i, (m, r) in enumerate(d.iterrows()):
        ax.errorbar(r.speedup, r.ssim, xerr=[[r.speedup - r.speedup_lo], [r.speedup_hi - r.speedup]] if np.isfinite(r.speedup_lo) else None,
                    marker="s" if m.startswith("diffusers:") else "o", color=f"C{i % 10}", ms=6, capsize=2)
        ax.annotate(m.replace("diffusers:", "d:"), (r.speedup, r.ssim), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("speed-up (median paired ratio, 95% interval over rounds)")
    ax.set_ylabel("SSIM vs no reuse")
    ax.set_title(f"{gname}: speed vs quality (circles: workbench, squares: diffusers)", fontsize=9)
fig.tight_layout()
_ = plots.save(fig, out, "reuse_pareto")

# %% [markdown]
# **How far can attention-only reuse go?** Reusing attention skips only the attention processors; the MLPs,
# norms, embeddings, text encoding and decoding still run. The share of a sampling run spent inside the
# attention processors caps the speed-up of any attention-only reuse at `1 / (1 - share)`, whatever it skips.

# %%
from unicache_lib.reuse.evaluate import attention_share

shares = {g: attention_share(load_generator(p, dtype=DTYPE, device=DEVICE), texts[:TIMING_PROMPTS], STEPS, GUIDANCE, SEED,
                             repeats=max(1, min(3, REPEATS))) for g, p in gpaths.items()}
for g, a in shares.items():
    print(f"{g}: attention {a['share']:.0%} of a sampling run ({a['step_s']:.2f} s per step, batch of "
          f"{min(TIMING_PROMPTS, len(texts))}) -> attention-only reuse can reach at most {a['cap']:.2f}x")

# %% [markdown]
# ## 5. Claims scoreboard
#
# U7 is decided on its direct test only (the same budgets with the bands' rules swapped), paired over the
# questions; G3 and G8's quality on SSIM per prompt (95% bootstrap interval over prompts), G8's speed on the
# timing interval of section 4 (at least 10 shuffled interleaved rounds). "holds" only if the whole interval
# clears the threshold, "does not hold" only if it lies wholly on the other side, else "inconclusive" with a
# rough n that would settle it; "partly": some criteria hold and the others do not.

# %%
# not compared by nbval: G8's verdict rests on a wall-clock speed-up, which varies from run to run
board = Scoreboard(random_weights=any(is_stand_in(m) for m in [UNDERSTANDING_MODEL, *GENERATORS]),
                   unstable=unstable_claims([UNDERSTANDING_MODEL, *gpaths]))
board.rule("U7", "accuracy of locality in the shallow band + content deeper minus the swapped assignment, per question "
           "averaged over the budgets, above 0.01 (1 point)", above=0.01)
board.rule("E1", f"{NEW} accuracy at 25% of the image KV / the full cache's, held-out questions (ratio of means, 95% "
           "interval over questions), above 0.99", above=0.99)
board.rule("E2", f"{NEW} accuracy at 10% / the full cache's, above 0.97", above=0.97)
board.rule("E3", f"{NEW} mean KL(full || evicted) at 25%, interval over questions, below 0.05 nats", below=0.05)
board.rule("E4", f"{NEW} minus every peer (kvpress presses, DivPrune, FastV, SnapKV, H2O, StreamingLLM), the worst "
           "(budget, peer) cell of the paired accuracy difference, interval over questions, above -0.01 (1 point)", above=-0.01)
board.rule("G3", "weaker generator: (a) SSIM of reuse in the last third of the steps above 0.98, (b) that SSIM minus "
           "reusing throughout (every 2nd step) above 0", criteria={"a": {"above": 0.98}, "b": {"above": 0.0}})
board.rule("G8", f"joint-attention model, text-side reuse: (a) speed-up above 1.10 (interval over >= {MIN_TIMING_REPEATS} "
           "shuffled interleaved rounds), (b) SSIM above 0.98", criteria={"a": {"above": 1.10}, "b": {"above": 0.98}})
q0 = qas[0]
if family.image_grid(model.config, inputs_for(model, processor, q0.scene.uint8(), q0.question)) is None:
    board.measure("U7", None, note=f"{family.name}: the image tokens form no single grid over the picture, so the "
                  "shallow band's locality rule has no spatial grid to keep")
else:
    board.measure("U7", u7_iv, shown=f"vs swapped {100 * u7_iv.value:+.1f} pt (mean over {len(BUDGETS)} budgets)")


from unicache_lib.intervals import mean_interval

for cid, b in (("E1", 0.25), ("E2", 0.1)):
    if b in BUDGETS and R[R.method == "full"].correct.any():
        iv = share_of_full(R, NEW, b)
        board.measure(cid, iv, shown=f"{R[(R.method == NEW) & (R.budget == b)].correct.mean():.3f} vs full "
                      f"{R[R.method == 'full'].correct.mean():.3f}")
    else:
        board.measure(cid, None, note=f"budget {b} not in BUDGETS" if b not in BUDGETS else "the full cache answers nothing "
                      "correctly, so a share of its accuracy is undefined")
if 0.25 in BUDGETS:
    board.measure("E3", mean_interval(R[(R.method == NEW) & (R.budget == 0.25)].sort_values("question").kl, "questions"))
else:
    board.measure("E3", None, note="budget 0.25 not in BUDGETS")
if len(vs):
    w = vs.loc[vs["diff"].idxmin()]
    board.measure("E4", worst_peer_difference(R, NEW, PEER_METHODS), shown=f"worst: {w.peer} at {w.budget:.0%} "
                  f"({w['diff']:+.3f}); ahead in {(vs.verdict == 'ahead').sum()} of {len(vs)} cells, behind in "
                  f"{(vs.verdict == 'behind').sum()}")
else:
    board.measure("E4", None, note="no peer ran (PEERS=False and no peer policy)")


def ssim_of(g, method):
    return RU[g].loc[method, "ssim_per_prompt"]


P = list(range(N_PROMPTS))
if not gpaths:
    for crit in ("a", "b"):
        board.measure("G3", None, criterion=crit, note="GENERATORS is empty")
else:
    if all(RU[g].loc["static_last_third", "computed"] < 1 for g in gpaths):
        board.measure("G3", bootstrap(P, lambda u: min(ssim_of(g, "static_last_third")[u].mean() for g in gpaths), "prompts"),
                      criterion="a")
    else:
        board.measure("G3", None, criterion="a", note=f"the last-third schedule reuses nothing at {STEPS} steps on some generator")
    board.measure("G3", bootstrap(P, lambda u: min((ssim_of(g, "static_last_third") - ssim_of(g, "every_2"))[u].mean()
                                                   for g in gpaths), "prompts"), criterion="b", shown="; ".join(
        f"{g}: last third SSIM {RU[g].loc['static_last_third', 'ssim']:.3f} at {RU[g].loc['static_last_third', 'computed']:.0%} "
        f"computed, every 2nd {RU[g].loc['every_2', 'ssim']:.3f}" for g in gpaths))
joint = [g for g in gpaths if gfamily[g] in ("sd3", "flux")]  # text-side reuse needs a joint text stream
if joint:
    t = RU[joint[0]].loc["text_side"]
    if REPEATS >= MIN_TIMING_REPEATS:
        board.measure("G8", Interval(t.speedup, t.speedup_lo, t.speedup_hi, REPEATS, "timing rounds"), criterion="a")
    else:
        board.measure("G8", None, criterion="a", note=f"{REPEATS} timing rounds; a wall-clock verdict needs >= {MIN_TIMING_REPEATS}")
    board.measure("G8", bootstrap(P, lambda u: ssim_of(joint[0], "text_side")[u].mean(), "prompts"), criterion="b",
                  shown=f"{joint[0]}: speed-up {t.speedup:.2f}x [{t.speedup_lo:.2f}, {t.speedup_hi:.2f}], SSIM {t.ssim:.3f}, "
                  f"{t.computed:.0%} of attention computed")
else:
    board.measure("G8", None, criterion="a", note="no joint-attention generator in GENERATORS")
board.save(out / "scoreboard.json")
print({c: r.verdict for c, r in board.rows.items()})

# %%
board.show()

# %% [markdown]
# **Reading the results.** The study reports ~15% lower latency from text-side reuse and the peers report
# 1.6–2.4× on real DiTs with thousands of image tokens. Here attention is well under half of a sampling run
# (measured above), so even skipping every attention call could not reach 2×: the MLPs and norms are the rest
# of each step, not a fixed overhead. At 1,024 image tokens attention's share grows (about 56% measured on an
# SD3-class block), which is where whole-block or whole-step reuse (diffusers' FirstBlockCache, MagCache)
# separates from attention-only reuse. Compare the `computed` column across methods for the part that
# transfers, and rerun on a real checkpoint to see the wall-clock side. Read every speed-up with its interval:
# a method that computes as much as no reuse (text-side reuse on PixArt skips only the text K/V projections)
# should show an interval around 1, and one that does not is telling you how noisy the clock is.
#
# ## Exercises
# 1. Write a policy that keeps the anchors of notebook 02 (top read frequency from *text* queries of the
#    standard samples) and register it: a new file under `unicache_lib/kv/policies/`. Where does it land?
# 2. Change `Adaptive.threshold` (0.99, 0.999): plot its Pareto points. Is the adaptive rule ever better than
#    the static schedule at equal `computed`?
# 3. Run the eviction sweep with questions about absent objects only (`heldout_set` filtered by `qtype ==
#    "exists"` and answer "no"). Which policies make the model see things that are not there?
