# ---
# jupyter:
#   unicache:
#     figure_kind: against random
#     first_figure:
#     - understanding_pruning
#     quick:
#       CONTROL_DRAWS: 2
#       FRACTIONS:
#       - 0.0
#       - 0.1
#       - 0.2
#       GENERATION_STORE: OUT/none
#       N_GRADIENT: 16
#       N_PROMPTS: 4
#       N_QUESTIONS: 100
#       RANDOM_SEEDS: 2
#       STEPS: 4
#       TIMING_REPEATS: 2
#       UNDERSTANDING_STORE: OUT/none
#     rules:
#     - unicache_lib.analysis.pruning_claims:RULES
# ---

# %% [markdown]
# # 04 · Pruning attention heads by their attention statistics
#
# **What you will learn**: to score every attention head (attention statistics, weight norms, the masking gradient
# of Michel et al. 2019, random), mask heads exactly or slice them out, and measure what that costs a vision-language
# model's answers and generators' pictures, always **against pruning as many random heads**: a scorer that does not
# beat random tells you nothing about the heads it picked.
#
# *What you see:* §2 on `tiny-llava`: accuracy (left) and KL to the unpruned answers (right) as more heads are
# masked. Random (dashed, its band grey) falls fastest and lies below every scorer; the gradient (green) stays on top.
#
# ![This lesson's first figure, from its last run](../docs/figures/04_head_pruning.png)

# %% [markdown]
# **Needs**: the stats stores of notebooks 02 and 03 (captured here if absent). Runs on the shipped
# `tiny-llava`, `tiny-mmdit` and `tiny-pixart`, or on your checkpoints (`MODEL`: any supported
# vision-language family; `GENERATORS`: SD3 / SD3.5, PixArt-α / Σ, Flux.1 or Sana pipelines, `[]` skips them;
# `DEVICE`, `DTYPE`). Sana's linear attention heads form no map and are not scored.
#
# **Time**: about <!--num @read_minutes:04_head_pruning fmt="{} min"-->10 min<!--/num--> to read; last run <!--num data/results/04_head_pruning.run.json#duration_s scale=1/60 fmt="{:.0f} min" missing="not recorded yet"-->16 min<!--/num--> (2 CPU cores).
#
# **Terms**: [depth bands](../docs/GLOSSARY.md#depth-bands), [head mask](../docs/GLOSSARY.md#head-mask),
# [KL](../docs/GLOSSARY.md#kl) (here of the first answer token's distribution, unpruned ‖ pruned, in nats),
# [Spearman correlation](../docs/GLOSSARY.md#spearman), [PSNR and SSIM](../docs/GLOSSARY.md#psnr-and-ssim),
# [control](../docs/GLOSSARY.md#control). Each claim (P1–P3) and its rule are printed in the section that measures it.

# %% tags=["parameters"]
MODEL = "tiny-llava"
DEVICE = "auto"               # "cpu", "cuda" or "auto"
DTYPE = "auto"                # weights; statistics are fp32 always
GENERATORS = ["tiny-mmdit", "tiny-pixart"]   # shipped names or pipeline folders; [] skips the generator half
N_QUESTIONS = 1000            # held-out questions for accuracy and KL
N_GRADIENT = 128              # other questions for the gradient scorer
FRACTIONS = [0.0, 0.1, 0.2, 0.3, 0.5]
RANDOM_SEEDS = 10             # random scorer's draws in §2: its band narrows as 1/sqrt(seeds) (§2's rule)
CONTROL_DRAWS = 3             # random control draws in §3 (shallow heads) and §4 (generators): each costly
N_PROMPTS = 16                # single-object prompts per generator
STEPS = 20
GUIDANCE = 3.0
SEED = 0
TIMING_REPEATS = 15
PER_TYPE = 4                  # standard samples per scene type for P3's capture (4 = all 20)
UNDERSTANDING_STORE = "outputs/02_understanding_maps/stats"
GENERATION_STORE = "outputs/03_diffusion_steps/store"
GEN_STATS_PROMPTS = 8         # prompts captured (every block) when GENERATION_STORE has no store for a generator
OUT_DIR = "outputs/04_head_pruning"
SAMPLE_SEED = 2024            # the shipped standard set; another seed builds another set of the same recipe
SAMPLES = None                # your own samples: a folder of images with a metadata.jsonl (make samples: an example)

# %%
from unicache_lib.params import check_params

check_params(globals())  # every parameter above, before anything loads: a bad value stops here, naming itself

# %%
import copy

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from unicache_lib import plots
from unicache_lib.analysis import pruning_claims as PC
from unicache_lib.analysis.layers import band_layers
from unicache_lib.capture.gen_runner import generation_store_or_capture
from unicache_lib.capture.runner import stats_store_or_capture
from unicache_lib.paths import project_path
from unicache_lib.pruning import SCORERS, HeadMask, HeadSpace, ScoringContext, prune_physically
from unicache_lib.pruning.heads import physical_pruning_unsupported
from unicache_lib.pruning import evaluate as E
from unicache_lib.pruning.scorers import head_statistics
from unicache_lib.intervals import interleaved_timings, proportion_interval, speedup_interval
from unicache_lib.replicate import unstable_claims
from unicache_lib.scoreboard import Scoreboard
from unicache_lib.claims import of
from unicache_lib.tables import WrappedTable, wrap
from unicache_lib.store import Store
from unicache_lib.world import samples as sample_set
from unicache_lib.world.text import prompt_set
from unicache_lib.runtime.loaders import is_stand_in, load_generator, load_understanding, model_label
from unicache_lib.world.questions import heldout_set

# %%
torch.manual_seed(SEED)
out = project_path(OUT_DIR)  # relative: from the repository root, wherever the kernel started
out.mkdir(parents=True, exist_ok=True)
model, processor = load_understanding(MODEL, attn_implementation="eager", dtype=DTYPE, device=DEVICE)
space = HeadSpace.of(model)
qas = heldout_set(N_QUESTIONS, seed=12345 + SEED)  # SEED 0: the fixed held-out set
grad_qas = heldout_set(N_GRADIENT, seed=SEED + 777)
ustore, fresh = stats_store_or_capture(project_path(UNDERSTANDING_STORE), out / "understanding_stats", MODEL,
                                       sample_seed=SAMPLE_SEED, model=model, processor=processor)
urecs = Store(ustore).read()
print(f"{MODEL}: {len(space.units)} layers x {space.shape[1]} heads = {space.n_heads} heads; {len(qas)} held-out questions")
print(wrap(f"statistics from {len(urecs)} records in {ustore}{' (captured now)' if fresh else ''}"))
print("scorers:\n" + "\n".join(wrap(f"  {n}: {c.description}", indent="    ") for n, c in SCORERS.items()))


def show_claims(*ids):
    """Each claim's statement and rule (unicache_lib/claims.py, written before any run), in the section measuring it."""
    for c in of("04_head_pruning"):
        if c.id in ids:
            print(wrap(f"{c.id}: {c.statement}\n  rule: {c.rule}", indent="    "))

# %% [markdown]
# ## 1. Score every head
#
# Importance per head (higher = keep), shown as layer × head grids of each scorer's *ranking* on one shared scale (the
# scorers' raw units differ): where two grids light up alike, the two scorers would prune the same heads. The
# statistics scorers read notebook 02's store; the gradient scorer differentiates the answer loss on `N_GRADIENT`
# *other* questions through a head mask held at 1.

# %%
ctx = ScoringContext(space, urecs, E.understanding_loss_fns(model, processor, grad_qas), SEED)
scores = {name: cls()(ctx) for name, cls in SCORERS.items() if name != "random"}
for s in range(RANDOM_SEEDS):
    scores[f"random#{s}"] = SCORERS["random"]()(ScoringContext(space, seed=SEED + s))
names = [n for n in scores if not n.startswith("random")]
# scorers have different units: each grid shows its heads' rank (0 = pruned first, 1 = kept longest), on one scale
ranks = {n: (scores[n].ravel().argsort().argsort() / (scores[n].size - 1)).reshape(scores[n].shape) for n in names}
fig = plots.grid_panels(ranks, "head", "layer", "importance rank (1 = kept longest)", shared=True)
_ = plots.save(fig, out, "head_scores")


# %% tags=["nbval-check-output"]
def rank_corr(a, b):
    ra, rb = a.ravel().argsort().argsort(), b.ravel().argsort().argsort()
    return float(np.corrcoef(ra, rb)[0, 1])

print("Spearman correlation between scorers' head rankings:")
corr = pd.DataFrame([[rank_corr(scores[a], scores[b]) for b in names] for a in names], index=names, columns=names)
print(corr.round(2).to_string())


def ranked(sc, k=3, low=False):
    """The ``k`` highest (or lowest: pruned first) heads of a ``[layers, heads]`` score as 'L<layer>H<head>'."""
    order = np.argsort(sc.ravel(), kind="stable")
    idx = order[:k] if low else order[::-1][:k]
    return ", ".join(f"L{i // sc.shape[1]}H{i % sc.shape[1]}" for i in idx)


for n in names:
    per_layer = scores[n].mean(1)
    print(f"{n:>18}: keeps {ranked(scores[n])}; prunes first {ranked(scores[n], low=True)}; "
          f"most important layer on average: {int(per_layer.argmax())}")
off = corr.where(~np.eye(len(names), dtype=bool)).stack()
print(f"most alike: {' / '.join(off.idxmax())} ({off.max():.2f}); least: {' / '.join(off.idxmin())} ({off.min():.2f})")

# %% [markdown]
# **What to look at.** In the grids, which heads each scorer keeps (bright, one scale for all six); in the table,
# whether two scorers would prune the same heads (1 = same ranking, negative = opposite). **This run**: every
# statistics scorer ranks layer <!--num "notebooks/04_head_pruning.ipynb#out:attention_combined: keeps" re="on average: ([0-9]+)"-->0<!--/num--> most important and prunes the last layer's heads first; the weight
# norm ranks layer <!--num "notebooks/04_head_pruning.ipynb#out:weight_norm: keeps" re="on average: ([0-9]+)"-->3<!--/num--> first. The statistics agree closely with one another (most alike:
# <!--num "notebooks/04_head_pruning.ipynb#out:most alike:" re="most alike: (.*?) [(]"-->attention_combined / low_variance<!--/num-->, <!--num "notebooks/04_head_pruning.ipynb#out:most alike:@0" fmt="{:.2f}"-->0.90<!--/num-->), moderately with the gradient, which
# measures what the loss needs, and weakly opposite to the weight norms (least alike: <!--num "notebooks/04_head_pruning.ipynb#out:most alike:" re="least: (.*?) [(]"-->redundancy / weight_norm<!--/num-->, <!--num "notebooks/04_head_pruning.ipynb#out:most alike:@1" fmt="{:.2f}"-->-0.36<!--/num-->). Which ranking is
# right, §2 measures on real answers.

# %% [markdown]
# ## 2. Prune and answer: accuracy and KL
#
# For each scorer and fraction, the lowest-scoring heads are masked (at least one head per layer stays) and all
# `N_QUESTIONS` questions are answered again; KL is averaged over questions. Random is drawn `RANDOM_SEEDS` times:
# its **band** is the 95% t-interval of its mean accuracy over the draws. The draws spread widely (one hits a head
# the answers need, another misses it), so with few seeds the band holds every scorer. The claims measured here:

# %%
show_claims("P1", "P2")

# %%
ref_logp = E.answer_logprobs(model, processor, qas)
U = E.sweep_understanding(model, processor, space, scores, FRACTIONS, qas, ref_logp)
U["family"] = U.scorer.str.replace(r"#\d+$", "", regex=True)

# %% tags=["nbval-check-output"]
from scipy import stats as st

def curves(df, metric):
    """family -> (fractions, mean, half-width of the 95% interval over seeds)."""
    res = {}
    for fam, d in df.groupby("family"):
        g = d.groupby("fraction")[metric]
        m, sd, n = g.mean(), g.std(ddof=1).fillna(0), g.size()
        half = st.t.ppf(0.975, np.maximum(n - 1, 1)) * sd / np.sqrt(n) * (n > 1)
        res[fam] = (m.index.to_numpy(), m.to_numpy(), half.to_numpy())
    return res

acc_tab = U.pivot_table(index="family", columns="fraction", values="accuracy", aggfunc="mean")
kl_tab = U.pivot_table(index="family", columns="fraction", values="kl", aggfunc="mean")
kl_tab.to_csv(out / "kl.csv")  # KL(unpruned || pruned) in nats, every scorer and fraction: the chart's right panel
print(f"accuracy on {len(qas)} held-out questions (random: mean of {RANDOM_SEEDS} seeds; KL: the chart, kl.csv)")
print(acc_tab.round(3).to_string())

# %%
CHARTED = [f for f in ("attention_combined", "gradient", "high_entropy", "low_variance", "weight_norm", "random")
           if f in set(U.family)]  # six on a chart (every scorer is in the tables above)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
for ax, metric, lab in ((axes[0], "accuracy", "exact-match accuracy"), (axes[1], "kl", "KL to unpruned (nats)")):
    for fam, (x, m, h) in curves(U[U.family.isin(plots.check_methods(CHARTED))], metric).items():
        ax.plot(x, m, label=fam, ls="--" if fam == "random" else "-", **plots.method_style(fam))
        if fam == "random":  # the band is clipped to what the metric can be (accuracy in [0, 1], KL >= 0)
            ax.fill_between(x, np.clip(m - h, 0, None), np.clip(m + h, None, 1 if metric == "accuracy" else None),
                            alpha=0.2, color=ax.lines[-1].get_color())
    ax.set_xlabel("fraction of heads pruned")
    ax.set_ylabel(lab)
    ax.legend(fontsize=7)
fig.suptitle(f"{MODEL}: pruning heads, n = {len(qas)} questions", fontsize=10)
fig.tight_layout()
_ = plots.save(fig, out, "understanding_pruning")

# %% tags=["nbval-check-output"]
sep = PC.against_random(U)  # every scorer at every pruned fraction against random's band
sep.to_csv(out / "against_random.csv", index=False)
print(wrap(f"rule: {PC.SEPARATION_RULE}"))
f1 = sep.fraction.min()
d1 = sep[sep.fraction == f1]
r1 = U[(U.family == "random") & (U.fraction == f1)].accuracy
sd1, half = r1.std(ddof=1), lambda n: st.t.ppf(0.975, n - 1) * r1.std(ddof=1) / np.sqrt(n)
print(f"{f1:.0%} pruned: random's band [{d1.band_lo.iloc[0]:.3f}, {d1.band_hi.iloc[0]:.3f}] over {len(r1)} seeds "
      f"(mean {r1.mean():.3f}); each scorer's accuracy [95% Wilson]:")
for r in d1.itertuples():
    print(f"  {r.scorer:>18}: {r.accuracy:.3f} [{r.lo:.3f}, {r.hi:.3f}]  {r.verdict}")
print(f"  {int((d1.verdict == 'ahead of random').sum())} of {len(d1)} scorers ahead of random, "
      f"{int((d1.verdict == 'inconclusive').sum())} inconclusive; random's draws spread (sd {sd1:.3f}):\n"
      f"  band half-width {half(len(r1)):.3f} with {len(r1)} seeds, {half(3):.3f} with 3")
for f, d in sep[sep.fraction > f1].groupby("fraction"):
    print(f"{f:.0%} pruned: random's band [{d.band_lo.iloc[0]:.3f}, {d.band_hi.iloc[0]:.3f}]; ahead of it: "
          f"{int((d.verdict == 'ahead of random').sum())} of {len(d)} scorers, inconclusive: "
          f"{int((d.verdict == 'inconclusive').sum())}")

# %% [markdown]
# **What to look at.** Each scorer's curve against random's dashed one and its band: a useful scorer stays near
# unpruned accuracy and zero KL where random has fallen. **This run**: random costs most — accuracy falls from
# <!--num "notebooks/04_head_pruning.ipynb#out:family > random@0" fmt="{:.2f}"-->0.98<!--/num--> unpruned to <!--num "notebooks/04_head_pruning.ipynb#out:family > random@1" fmt="{:.3f}"-->0.839<!--/num--> at 10% and <!--num "notebooks/04_head_pruning.ipynb#out:family > random@4" fmt="{:.3f}"-->0.406<!--/num--> at 50%, and its KL (right) climbs
# highest — while every scorer loses about a point or less at 10%. The gradient stays on top throughout; the
# statistics scorers and the weight norms fall further, close to one another (P2, §6).
#
# **Against random, by the rule** (under the chart; all fractions in `against_random.csv`). At this spread, three
# seeds would give a band reaching
# <!--num "notebooks/04_head_pruning.ipynb#out:10% pruned: random's band > band half-width" re="([0-9.]+) with 3"-->0.332<!--/num--> either side of its mean and hold
# every scorer. With `RANDOM_SEEDS` draws the band is narrow enough that
# <!--num "notebooks/04_head_pruning.ipynb#out:10% pruned: random's band > scorers ahead of random" re="([0-9]+ of [0-9]+) scorers"-->6 of 6<!--/num--> scorers' intervals lie above it at
# 10%: each is shown to beat random (the last lines: the other fractions). On your model, pick the seeds from
# random's spread: half-width ≈ 2·sd/√seeds.

# %% [markdown]
# ## 3. Near-uniform shallow heads (P3)
#
# The shallow band's most uniform heads (normalised entropy ≥ the band's median) are pruned *alone*: we capture the
# standard samples with and without them, compare the deeper layers' attention and answer the questions again. The
# **control**: as many *random* shallow heads, drawn `CONTROL_DRAWS` times (each draw captures the samples again,
# so fewer than §2's seeds). Any pruning moves the layers above a little; the claim concerns these heads only if
# they move them *more* than random ones do.

# %% tags=["nbval-check-output"]
show_claims("P3")
hs = head_statistics(ctx)
shallow = band_layers(len(space.units))["shallow"]
std_samples = sample_set.load(SAMPLES, per_type=PER_TYPE, seed=SAMPLE_SEED)
exp = PC.near_uniform_experiment(model, processor, space, qas, ref_logp, std_samples, hs["entropy"], shallow, CONTROL_DRAWS,
                                 SEED)
p3, rand_labels = exp["table"], exp["random"]
base_acc = float(acc_tab[0.0].iloc[0])
print(f"unpruned accuracy {base_acc:.3f}; shallow band = layers {shallow}, mean normalised entropy of the pruned heads "
      f"{exp['entropy']:.3f}\ncontrol: {len(rand_labels)} random draws of {exp['n']} shallow heads")
print(p3[["heads pruned", "accuracy", "kl", "deep d_entropy", "deep d_image_share"]].astype(float).round(4).to_string())
print("deeper layers' entropy move per layer:\n" + exp["per_layer"].round(4).to_string())
deep_move, rand_move = PC.per_sample_moves(exp)
excess = deep_move - rand_move
print(f"near-uniform minus random: deeper entropy {excess.mean():+.4f} per sample "
      f"({int((excess > 0).sum())} of {len(excess)} samples move more)")
print(f"accuracy: near-uniform {p3.loc[PC.NEAR_UNIFORM, 'accuracy']:.3f}, random shallow (mean of {len(rand_labels)}) "
      f"{p3.loc[rand_labels, 'accuracy'].mean():.3f}, unpruned {base_acc:.3f}")
p3_found = ""  # P3 (a) against its control, for the decision table
if len(rand_labels) >= 2:  # P3 (a)'s rule compares with no pruning; this is its comparison with the control (§2's band)
    nu = proportion_interval(np.asarray(p3.loc[PC.NEAR_UNIFORM, "correct_q"], float), "questions")
    c_lo, c_hi = PC.random_band(p3.loc[rand_labels, "accuracy"].astype(float))
    where_nu = "inside it" if c_lo <= nu.hi and nu.lo <= c_hi else "below it" if nu.hi < c_lo else "above it"
    print(f"(a) against the control: near-uniform accuracy {nu.value:.3f} [{nu.lo:.3f}, {nu.hi:.3f}] (Wilson)\n"
          f"  random shallow heads' band [{c_lo:.3f}, {c_hi:.3f}] (95% t over {len(rand_labels)} draws): {where_nu}")
    p3_found = (f"near-uniform's accuracy (a) is {where_nu.split()[0]} random shallow heads' band "
                f"[{c_lo:.3f}, {c_hi:.3f}]")

# %% [markdown]
# **What to look at.** The first row against the random rows: an effect the random rows show too is the cost of
# removing *any* shallow heads. **This run**: masking layer 0's near-uniform
# heads cuts accuracy from <!--num "notebooks/04_head_pruning.ipynb#out:accuracy: near-uniform@3" fmt="{:.2f}"-->0.98<!--/num--> to <!--num "notebooks/04_head_pruning.ipynb#out:accuracy: near-uniform@0" fmt="{:.2f}"-->0.45<!--/num-->, but as many random layer-0 heads cost about as
# much (<!--num "notebooks/04_head_pruning.ipynb#out:accuracy: near-uniform@2" fmt="{:.3f}"-->0.525<!--/num--> on average): layer 0 has no spare heads, near-uniform or not. The deeper layers' entropy
# moves slightly *less* than under random removal (only
# <!--num "notebooks/04_head_pruning.ipynb#out:near-uniform minus random:" re="[(]([0-9]+ of [0-9]+) samples"-->4 of 20<!--/num--> samples move more): P3 (b) does not hold.
#
# **What P3 (a) can and cannot show.** Its rule, fixed before the run, compares with *no* pruning: a drop over one
# point shows that these heads are not redundant — what P3 says — but not that being near-uniform is why. The last
# two lines hold the comparison it lacks: against the random shallow heads' band
# [<!--num "notebooks/04_head_pruning.ipynb#out:random shallow heads' band@0" fmt="{:.3f}"-->0.056<!--/num-->, <!--num "notebooks/04_head_pruning.ipynb#out:random shallow heads' band@1" fmt="{:.3f}"-->0.993<!--/num-->], near-uniform's accuracy is
# <!--num "notebooks/04_head_pruning.ipynb#out:random shallow heads' band" re="draws[)]: (.+)"-->inside it<!--/num-->: with `CONTROL_DRAWS` draws (each a fresh capture, so few) the
# band spans most of the accuracy range and tells these heads from no other shallow heads. So P3's "partly"
# reads: diffuse is no reason to prune a head, and no reason to keep it either; judge heads by what removing them
# does to the outputs.

# %% [markdown]
# ## 4. The generators
#
# Every attention module is a unit (MMDiT: 4 joint blocks; PixArt: 4 self- and 4 cross-attention modules).
# Statistics come from notebook 03's stores; the gradient scorer uses the rectified-flow training loss on
# fixed synthetic batches. Each pruned model draws the same `N_PROMPTS` prompts with the same seeds as the
# unpruned one.

# %%
gen_rows, gen_refs = [], {}
objs = [p["objects"][0] for p in prompt_set(N_PROMPTS, 0, SEED)]
gprompts = [p["short"] for p in prompt_set(N_PROMPTS, 0, SEED)]
gpaths = {model_label(g): g for g in GENERATORS}  # outputs and tables use the label, never a full path
for gname, gpath in gpaths.items():
    gen = load_generator(gpath, dtype=DTYPE, device=DEVICE)
    gspace = HeadSpace.of(gen.transformer, mapless=False)  # heads with an attention map (not Sana's linear ones)
    gstore, gfresh = generation_store_or_capture(project_path(GENERATION_STORE) / gname, out / "generation_stats" / gname, gen, gname,
                                                 n_prompts=GEN_STATS_PROMPTS, steps=STEPS, guidance=GUIDANCE, seed=SEED)
    gctx = ScoringContext(gspace, Store(gstore).read(), E.generation_loss_fns(gen, seed=SEED), SEED)
    gscores = {name: cls()(gctx) for name, cls in SCORERS.items() if name != "random"}
    for s in range(CONTROL_DRAWS):
        gscores[f"random#{s}"] = SCORERS["random"]()(ScoringContext(gspace, seed=SEED + s))
    df, gen_refs[gname] = E.sweep_generation(gen, gspace, gscores, FRACTIONS, gprompts, objs, STEPS, GUIDANCE, SEED)
    gen_rows.append(df.assign(model=gname))
    print(f"{gname}: {len(gspace.units)} units x {gspace.shape[1]} heads; statistics from {gstore}{' (captured now)' if gfresh else ''}")
Gdf = pd.concat(gen_rows, ignore_index=True) if gen_rows else pd.DataFrame(columns=["model", "scorer", "fraction"])
Gdf["family"] = Gdf.scorer.str.replace(r"#\d+$", "", regex=True)
if not GENERATORS:
    print("GENERATORS is empty: the generator half is skipped")

# %% tags=["nbval-check-output"]
if GENERATORS:  # the two measures the figure draws; every scorer at every fraction goes to generation_pruning.csv
    every = Gdf.pivot_table(index=["model", "family"], columns="fraction", values=["ssim", "colour"], aggfunc="mean")
    every.columns = [f"{m} {f:.0%}" for m, f in every.columns]
    every.round(4).to_csv(out / "generation_pruning.csv")
    read_at = [f for f in FRACTIONS if f in (0.2, 0.5)] or FRACTIONS[-1:]  # the fractions the prose reads
    READ = ("attention_combined", "gradient", "random")  # the statistics, the best scorer on answers, the control
    gtab = every[[f"{m} {f:.0%}" for m in ("ssim", "colour") for f in read_at]]
    gtab = gtab[gtab.index.get_level_values("family").isin(READ)]
    print(f"SSIM and colour correct by fraction pruned (n = {N_PROMPTS} prompts; random: mean of {CONTROL_DRAWS} seeds)")
    print(gtab.round(3).to_string())
    print(f"every scorer, every fraction: {out.name}/generation_pruning.csv; the chart draws {len(CHARTED)} of them")

# %%
if GENERATORS:
    fig, axes = plt.subplots(1, 2 * len(GENERATORS), figsize=(5 * len(GENERATORS) + 2, 3.4))
    for j, gname in enumerate(gpaths):
        for k, (metric, lab) in enumerate((("ssim", "SSIM vs unpruned"), ("colour", "colour correct"))):
            ax = axes[2 * j + k]
            for fam, (x, m, h) in curves(Gdf[(Gdf.model == gname) & Gdf.family.isin(CHARTED)], metric).items():
                ax.plot(x, m, label=fam, ls="--" if fam == "random" else "-", **plots.method_style(fam))
                if fam == "random":  # a share or an SSIM: the band clipped to [0, 1]
                    ax.fill_between(x, np.clip(m - h, 0, 1), np.clip(m + h, 0, 1), alpha=0.2, color=ax.lines[-1].get_color())
            ax.set_ylim(0, 1.02)  # one scale on every panel
            ax.set_title(f"{gname}: {lab}", fontsize=9)
            ax.set_xlabel("fraction pruned")
            ax.set_ylabel(lab)
    fig.tight_layout()
    plots.shared_legend(fig, axes, ncol=6)
    _ = plots.save(fig, out, "generation_pruning")

# %% [markdown]
# **What to look at.** Whether each scorer's SSIM and prompt following (*colour* correct) stay above random's
# band. **This run** (the table: the combined statistics, the gradient and random, at <!--const FRACTIONS, a parameter-->20%<!--/const--> and 50%): the
# combined statistics keep the MMDiT's pictures close to the unpruned ones (SSIM above random's mean) and cost
# PixArt detail (SSIM below random's, the colour kept). The gradient, the best scorer on the answers (§2),
# breaks PixArt's prompt following: colour correct <!--num "notebooks/04_head_pruning.ipynb#out:SSIM and colour correct > tiny-pixart > gradient@3" fmt="{:.3f}"-->0.250<!--/num--> at 50% against random's <!--num "notebooks/04_head_pruning.ipynb#out:SSIM and colour correct > tiny-pixart > random@3" fmt="{:.3f}"-->0.771<!--/num-->.
#
# These are means over `N_PROMPTS` prompts and `CONTROL_DRAWS` random draws, mostly inside random's band in the
# chart: hints, not findings, and no claim rules on them. What they suggest: a scorer that wins on answers is not
# safe for a generator by that alone; check each generator against random (`CONTROL_DRAWS`) before pruning it.

# %% [markdown]
# ## 5. Physical pruning: does it run faster?
#
# Masking costs as much as the full model. Slicing the pruned heads out of the q/k/v/o projections gives a smaller
# model with the mask's outputs (checked below); its forward time is measured interleaved with the full model's,
# `TIMING_REPEATS` times on a batch of 100 questions. The same cell times **attention's share** of the forward: the
# seconds inside the language model's attention modules over the whole call (hooks, one torch thread).

# %%
keep30 = space.keep_mask(scores["attention_combined"], 0.3)
why_not = physical_pruning_unsupported(space)  # e.g. grouped-query attention: query heads share key/value heads
if why_not:
    kept, small, TIMING_REPEATS = None, None, 0
    print(f"physical pruning is not available for this model ({why_not}); the HeadMask results above still hold")
else:
    small = copy.deepcopy(model)  # a second copy of the model: only when it can be pruned
    kept = prune_physically(HeadSpace.of(small), keep30)
batch = qas[:100]
if kept is not None:
    with torch.no_grad():
        with HeadMask(space, keep30):
            masked_lp = E.answer_logprobs(model, processor, batch)
        small_lp = E.answer_logprobs(small, processor, batch)
    same = float((masked_lp - small_lp).abs().max())
    times = interleaved_timings({"full": lambda: E.answer_logprobs(model, processor, batch),
                                 "pruned 30%": lambda: E.answer_logprobs(small, processor, batch)}, TIMING_REPEATS, SEED)
    tt = pd.DataFrame({k: {"median ms": 1e3 * np.median(v), "IQR ms": 1e3 * (np.percentile(v, 75) - np.percentile(v, 25))}
                       for k, v in times.items()}).T
    print(f"heads kept per layer: {list(kept.values())}; max |log p(masked) - log p(pruned)| = {same:.1e}")
    print(tt.round(2).to_string())
del small
if kept is not None and TIMING_REPEATS >= 2:
    sp = speedup_interval(times["full"], times["pruned 30%"], min_repeats=2)
    print(f"speed-up {sp.value:.2f}x [{sp.lo:.2f}, {sp.hi:.2f}] over {TIMING_REPEATS} shuffled interleaved repeats")
    att = PC.attention_share(space, lambda: E.answer_logprobs(model, processor, batch), repeats=TIMING_REPEATS)
    gone = float((keep30 == 0).sum()) / space.n_heads
    print(f"attention's share of the full forward: {att['share']:.0%} (median of {TIMING_REPEATS} hooked runs, "
          f"hooks' own cost {att['hook_overhead']:+.0%})\n  removing {gone:.0%} of the heads removes about "
          f"{gone * att['share']:.0%} of the time: expect about {att['cap'](gone):.2f}x (measured {sp.value:.2f}x)")

# %% [markdown]
# **This run**: the physically pruned model gives the masked model's answers exactly (largest log-probability
# difference <!--num "notebooks/04_head_pruning.ipynb#out:heads kept per layer" re="= ([0-9.]+e[+-][0-9]+)"-->0.0e+00<!--/num-->) and runs faster:
# <!--num "notebooks/04_head_pruning.ipynb#out:speed-up" re="speed-up ([0-9.]+x \[[0-9.]+, [0-9.]+\])"-->1.23x [1.09, 1.30]<!--/num--> (timings vary from run to run).
#
# **Why not faster?** Attention takes <!--num "notebooks/04_head_pruning.ipynb#out:attention's share of the full forward@0" fmt="{:.0f}%"-->38%<!--/num--> of the full forward (the last two
# lines). Removing <!--num "notebooks/04_head_pruning.ipynb#out:attention's share of the full forward > removing@0" fmt="{:.0f}%"-->31%<!--/num--> of the heads removes that share of the
# attention time, about <!--num "notebooks/04_head_pruning.ipynb#out:attention's share of the full forward > removing@1" fmt="{:.0f}%"-->12%<!--/num--> of the whole, a speed-up near
# <!--num "notebooks/04_head_pruning.ipynb#out:attention's share of the full forward > expect about" re="expect about ([0-9.]+x)"-->1.14x<!--/num-->: the measured interval above is of that size. The rest of
# the forward, outside the attention modules, does not shrink, so the gain stays far below the share of heads
# removed. Measure that share on your model (`PC.attention_share`) before promising a gain.

# %% [markdown]
# ## 6. Claims scoreboard
#
# The claims and their rules are printed in §2 (P1, P2) and §3 (P3). Accuracy differences are paired over the `N_QUESTIONS` questions (95% interval over questions); the deeper layers'
# entropy change is resampled over the standard samples. How an interval becomes a verdict:
# [verdicts](../docs/GLOSSARY.md#verdicts).

# %%
from unicache_lib.claims import claims_table

claims_table("04_head_pruning")  # each claim (statement, why) is written once, in unicache_lib/claims.py

# %% tags=["nbval-check-output"]
board = Scoreboard(random_weights=any(is_stand_in(m) for m in [MODEL, *GENERATORS]),
                   unstable=unstable_claims([MODEL, *gpaths]))
PC.declare(board)  # the rules of P1-P3, as data in unicache_lib/analysis/pruning_claims.py
mean_over_f = PC.measure(board, U, FRACTIONS, acc_tab.index, exp, base_acc)
u = p3.loc[PC.NEAR_UNIFORM]
board.save(out / "scoreboard.json")
print({c: r.verdict for c, r in board.rows.items()})

# %%
board.show()

# %% [markdown]
# **Reading the scoreboard.** These verdicts concern a 4-layer, 8-head model; how much a 7B model can lose is its own
# measurement (Next steps).

# %% [markdown]
# ## Recap: what this notebook showed on the shipped models
#
# - **Scores** (§1): the statistics agree with one another, moderately with the gradient, not with the weight norms.
# - **Answers** (§2): random's mean loses <!--num "notebooks/04_head_pruning.ipynb#out:drop at 10% pruned > value here > random" re="random ([0-9.]+)"-->14.1<!--/num-->
#   points at 10%, every scorer about a point or less. Over `RANDOM_SEEDS` random draws, <!--num "notebooks/04_head_pruning.ipynb#out:10% pruned: random's band > scorers ahead of random" re="([0-9]+ of [0-9]+) scorers"-->6 of 6<!--/num--> scorers are
#   ahead of random at 10%, <!--num "notebooks/04_head_pruning.ipynb#out:50% pruned: random's band" re="ahead of it: ([0-9]+ of [0-9]+)"-->6 of 6<!--/num--> at 50%. The gradient is best.
# - **P1 is <!--num data/results/04_head_pruning.json#[claim=P1].verdict-->inconclusive<!--/num-->**: the combined statistics lose <!--num data/results/04_head_pruning.json#[claim=P1].shown@1 fmt="{:.1f}"-->0.9<!--/num--> points at 10%
#   and <!--num data/results/04_head_pruning.json#[claim=P1].shown@3 fmt="{:.1f}"-->5.0<!--/num--> at <!--const FRACTIONS, a parameter-->20%<!--/const-->: P1's shape, but the 10% drop's interval straddles P1's one-point
#   line, so these questions cannot fix a safe fraction.
# - **P2 is <!--num data/results/04_head_pruning.json#[claim=P2].verdict-->inconclusive<!--/num-->**: on mean accuracy over the pruned fractions (the rule fixed before the run), the
#   combined statistics and the data-free weight norms tie (<!--num "notebooks/04_head_pruning.ipynb#out:statistics vs weight norms > value here@0" fmt="{:.3f}"-->0.855<!--/num--> against <!--num "notebooks/04_head_pruning.ipynb#out:statistics vs weight norms > value here@2" fmt="{:.3f}"-->0.855<!--/num-->). low_variance's
#   <!--num "notebooks/04_head_pruning.ipynb#out:statistics vs weight norms > value here@1" fmt="{:.3f}"-->0.877<!--/num--> is ahead, but picking the best of five scorers after the fact proves nothing.
# - **P3 is <!--num data/results/04_head_pruning.json#[claim=P3].verdict-->partly<!--/num-->** (§3): layer 0's near-uniform heads are needed (a), but so are random ones, and the control's
#   band cannot tell them apart; deeper layers move no more than under random removal (b). Diffuse is no reason to
#   prune a head, nor to keep it.
# - **Generators** (§4, hints without a claim): a scorer that wins on answers can break a generator (the gradient,
#   on PixArt's colour); the combined statistics cost PixArt detail. **Physical pruning** (§5) matches the mask
#   exactly but speeds up only attention's share of the forward: measure that share on your model
#   (`PC.attention_share`) before promising a gain.

# %% [markdown]
# The decision table, one row per claim (the advice: `unicache_lib/claims.py`; §4's and §5's suggestions above have
# no claim, so no row):

# %%
from unicache_lib.claims import decision_rows

drop10 = {f: float(acc_tab.loc[f, 0.0] - acc_tab.loc[f, 0.1]) for f in acc_tab.index if 0.1 in acc_tab.columns}
p1 = board.rows["P1"].measured.get("a")  # attention_combined's drop at 10%, with its interval over questions
d20 = (f", at 20% {100 * float(acc_tab.loc['attention_combined', 0.0] - acc_tab.loc['attention_combined', 0.2]):.1f}"
       if 0.2 in acc_tab.columns else "")
p1_found = f"attention_combined at 10% {100 * p1.value:.1f} [{100 * p1.lo:.1f}, {100 * p1.hi:.1f}]{d20}" if p1 and p1.value is not None else ""
best = max(mean_over_f, key=lambda k: mean_over_f[k].mean())
P2_SHOWN = ("attention_combined", "low_variance", "weight_norm", "random")
d_rows = decision_rows([  # (claim, what was measured, its value here, this run's note); what to do and where: the advice
    ("P1", "P1: accuracy drop at 10% pruned, per scorer (points)", ", ".join(f"{k} {100 * v:.1f}" for k, v in drop10.items()), p1_found),
    ("P2", "P2: statistics vs weight norms vs random, accuracy averaged over the pruned fractions",
     ", ".join(f"{k} {mean_over_f[k].mean():.3f}" for k in P2_SHOWN if k in mean_over_f),
     f"best here: {best} {mean_over_f[best].mean():.3f}"),
    ("P3", "P3: near-uniform shallow heads: accuracy, and deeper-entropy move minus random's",
     f"accuracy {base_acc:.3f}→{float(u['accuracy']):.3f} (random shallow {p3.loc[rand_labels, 'accuracy'].mean():.3f}); "
     f"move {excess.mean():+.4f}", p3_found),
], "04_head_pruning", board.verdicts())
WrappedTable(pd.DataFrame(d_rows))  # every cell whole, also as plain text

# %% [markdown]
# ## Exercises
#
# Each starter leaves one gap (`# <- write` or `# <- fill in`) and checks what you wrote. Solutions:
# [solutions/04_head_pruning.py](../solutions/04_head_pruning.py) (`--only K` runs one).
#
# 1. ★★ Write `prune_in_band` (prune the lowest-scoring heads inside some layers only); the cell prunes the most
#    diffuse heads in the deep, then the shallow band. Are diffuse heads as costly to lose deep as shallow?
# 2. ★★ Write a scorer of your own (the body of `my_score`, e.g. by image share from `ctx.records`); the cell
#    registers it and reruns §2 beside `gradient`. Does it beat `gradient`?
# 3. ★ How few gradient questions (`n_grad`; §2 used `N_GRADIENT`) can the gradient scorer use before its curve
#    falls to random's?
# 4. ★★ Write random's band (§2): the 95% t-interval of the mean of one accuracy per seed. Over the first 2, 3, ...
#    seeds, when does `attention_combined`'s interval clear it at 10%?

# %%
# Exercise 1 starter: §2's high_entropy scores, pruned inside one band only; accuracy on 100 held-out questions
bands = band_layers(len(space.units))
few_qas, few_ref = qas[:100], ref_logp[:100]


def accuracy(keep):
    with HeadMask(space, keep):
        return E.understanding_metrics(E.answer_logprobs(model, processor, few_qas), few_ref, processor, few_qas)["accuracy"]


def prune_in_band(score, layers, n_heads):
    """A keep mask like space.keep_mask's (torch float [layers, heads], 1 = keep) pruning the `n_heads`
    lowest-scoring heads of `score` among the rows `layers` only; every head outside them is kept."""
    ...  # <- write: returns the mask


mask = prune_in_band(scores["high_entropy"], bands["deep"], 2)
if mask is None:
    print(f"Write `prune_in_band`, then run this cell again (bands: {bands}).")
else:
    sc = scores["high_entropy"]
    for band, n_heads in [(b, n) for b in ("deep", "shallow") for n in (2, 4)]:
        keep = prune_in_band(sc, bands[band], n_heads)
        problems = PC.band_mask_problems(keep, sc, bands[band], n_heads)  # what is wrong with it, if anything
        if problems:
            print(f"{band}, {n_heads} heads: not right yet ({'; '.join(problems)})")
            break
        print(f"{band} band {bands[band]}, {n_heads} most diffuse heads pruned: accuracy {accuracy(torch.tensor(keep)):.2f}")
    else:
        print(f"correct; unpruned: accuracy {accuracy(space.ones()):.2f}")

# %%
# Exercise 2 starter: a scorer of your own, registered, swept beside gradient (§2) on 100 held-out questions
from unicache_lib.pruning import HeadScorer  # noqa: E402
from unicache_lib.pruning.scorers.base import register  # noqa: E402


def my_score(ctx):
    """One float per head, [layers, heads] (ctx.space.shape), high = keep; ctx.records: §1's statistics records."""
    ...  # <- write: returns your scores


probe = my_score(ctx)
if probe is None:
    print(wrap("Write `my_score`, then run this cell again. Registered scorers: " + ", ".join(SCORERS)))
elif np.shape(probe) != space.shape or not np.isfinite(np.asarray(probe, float)).all():
    print(f"my_score must return finite numbers of shape {space.shape}; it returned shape {np.shape(probe)}")
else:
    if "my_scorer" not in SCORERS:
        @register
        class MyScorer(HeadScorer):
            name, needs, description = "my_scorer", "records", "the scorer of exercise 2"

            def score(self, ctx):
                return my_score(ctx)  # the function written above, looked up when scored
    mine = {n: scores[n] for n in ("gradient", "attention_combined")} | {"my_scorer": SCORERS["my_scorer"]()(ctx)}
    U2 = E.sweep_understanding(model, processor, space, mine, [0.0, 0.1, 0.2, 0.3], qas[:100], ref_logp[:100],
                               progress=False)
    print(U2.pivot_table(index="scorer", columns="fraction", values="accuracy").round(3).to_string())

# %%
# Exercise 3 starter: the gradient scorer from fewer questions, against random, on 100 held-out questions
n_grad = ...  # <- fill in: how many of the gradient questions (grad_qas) the scorer may use
if n_grad is ...:
    print(f"Fill in `n_grad`, then run this cell again (§2 used N_GRADIENT = {N_GRADIENT}).")
else:
    few = {f"gradient n={n_grad}": SCORERS["gradient"]()(ScoringContext(
        space, loss_fns=E.understanding_loss_fns(model, processor, grad_qas[:n_grad]), seed=SEED)),
        **{f"random#{s}": scores[f"random#{s}"] for s in range(RANDOM_SEEDS)}}
    U3 = E.sweep_understanding(model, processor, space, few, [0.1, 0.2, 0.3], qas[:100], ref_logp[:100], progress=False)
    U3["family"] = U3.scorer.str.replace(r"#\d+$", "", regex=True)
    print(U3.groupby("family").accuracy.mean().round(3).to_string())

# %%
# Exercise 4 starter: random's band at the smallest pruned fraction, from its accuracies (one per seed, §2's sweep)
acc_by_seed = U[(U.family == "random") & (U.fraction == f1)].accuracy.to_numpy()


def band(acc):
    """(lo, hi): the 95% t-interval of the mean of `acc`, one accuracy per random seed (scipy.stats is `st`)."""
    ...  # <- write: returns the two ends


if band(acc_by_seed) is None:
    print("Write `band`, then run this cell again.")
else:
    mine, want = np.array(band(acc_by_seed), float), np.array([d1.band_lo.iloc[0], d1.band_hi.iloc[0]])
    print("correct: §2's band" if np.allclose(mine, want, atol=1e-6) else f"not yet: yours {mine.round(3)}, §2's {want.round(3)}")
    ac = d1.set_index("scorer").loc["attention_combined"]
    for n in range(2, len(acc_by_seed) + 1):
        lo, hi = band(acc_by_seed[:n])
        print(f"{n:>2} seeds: band [{lo:.3f}, {hi:.3f}]; attention_combined [{ac.lo:.3f}, {ac.hi:.3f}] "
              + ("clears it" if ac.lo > hi else "inside or below it"))

# %% [markdown]
# ## Next steps
#
# - **Your checkpoint** (★★★): run this lesson with papermill on your vision-language model,
#   `.venv/bin/papermill notebooks/04_head_pruning.ipynb outputs/04_mine.ipynb -p MODEL /path/or/hub-id -y 'GENERATORS: []'`.
#   Do the near-uniform shallow heads beat their random control (§3, decision table; on this lesson's model they do
#   not)? Compare the "minus random" numbers, not the raw drops. `solutions/04_head_pruning.py`'s `next_steps`
#   runs §3's procedure on a random-weight stand-in with grouped-query attention.
# - **More control draws**: raise `CONTROL_DRAWS` until random's band in §4's chart can place a scorer.
