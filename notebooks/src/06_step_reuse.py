# ---
# jupyter:
#   unicache:
#     figure_kind: psnr
#     first_figure:
#     - gallery_tiny-mmdit
#     - gallery_tiny-pixart
#     quick:
#       N_PROMPTS: 4
#       REPEATS: 2
#       STEPS: 5
#       TIMING_PROMPTS: 2
#     rules:
#     - unicache_lib.analysis.caching_claims:REUSE_RULES
# ---

# %% [markdown]
# # 06 · Cross-step reuse: skip whole steps, and beat sampling with fewer of them
#
# **What you will learn**
# - what reusing, or predicting, a denoising step's work does to an image;
# - whether the study's schedules, diffusers' caches and `step_skip` (skip whole steps) beat **sampling with fewer
#   steps** at equal FLOPs and wall-clock, and why attention-only reuse has a ceiling;
# - which to use on your pipeline: a decision table, and the claims G3, G8 and targets R1–R3 (§5).
#
# *What you see:* one prompt sampled four ways (§1), each image's PSNR against the first; the strips: dark where the
# transformer ran. The four look alike, but `step_skip` (<!--num "notebooks/06_step_reuse.ipynb#out:tiny-mmdit: none" re="step_skip ([0-9.]+ dB)"-->50.9 dB<!--/num-->) stays closer to
# the reference than the same calls spread evenly (<!--num "notebooks/06_step_reuse.ipynb#out:tiny-mmdit: none" re="steps:[0-9]+ ([0-9.]+ dB)"-->44.1 dB<!--/num-->).
#
# ![This lesson's first figure, from its last run](../docs/figures/06_step_reuse.png)

# %% [markdown]
# **Terms**: [PSNR and SSIM](../docs/GLOSSARY.md#psnr-and-ssim) (against the no-reuse image),
# [Pareto](../docs/GLOSSARY.md#pareto)-ahead (as good on every axis, better on one), [CFG](../docs/GLOSSARY.md#cfg),
# [diffusers caches](../docs/GLOSSARY.md#diffusers-caches) (PAB, FasterCache, FirstBlockCache, TaylorSeer, MagCache).
#
# **Needs**: [03](03_diffusion_steps.ipynb) §4 (adjacent steps nearly identical). Runs on the shipped `tiny-mmdit` and `tiny-pixart`,
# or on diffusers pipeline folders of SD3 / SD3.5, PixArt-α / Σ, Flux.1 or Sana (`GENERATORS`, `DEVICE`, `DTYPE`).
#
# **Time**: about <!--num @read_minutes:06_step_reuse fmt="{} min"-->10 min<!--/num--> to read; last run <!--num data/results/06_step_reuse.run.json#duration_s scale=1/60 fmt="{:.0f} min" missing="not recorded yet"-->8 min<!--/num--> (2 CPU cores).

# %% tags=["parameters"]
DEVICE = "auto"               # "cpu", "cuda" or "auto"
DTYPE = "auto"                # weights; statistics are fp32 always
GENERATORS = ["tiny-mmdit", "tiny-pixart"]   # shipped names or pipeline folders
N_PROMPTS = 32                # single-object prompts for the reuse sweep
PROMPTS = None                # your own prompts: a prompts.jsonl, N_PROMPTS scored + 4 to calibrate (make samples: an example)
STEPS = 20
GUIDANCE = 3.0
TIMING_PROMPTS = 8
REPEATS = 10                  # interleaved timing rounds in shuffled order, a wall-clock verdict needs 10 or more
FEWER_STEPS = None            # step counts of the fewer-step control; None: 35-80% of STEPS
PICTURE_CACHE = "diffusers:first_block"   # the diffusers cache shown in the first picture
SEED = 0
OUT_DIR = "outputs/06_step_reuse"

# %%
from unicache_lib.params import check_params

check_params(globals())  # every parameter above, before anything loads: a bad value stops here, naming itself

# %%
import os

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch

from unicache_lib import plots
from unicache_lib.analysis import caching_claims as CC
from unicache_lib.claims import CLAIMS
from unicache_lib.paths import project_path
from unicache_lib.reuse import REUSE_POLICIES, ReuseCache
from unicache_lib.reuse.control import control_table
from unicache_lib.reuse.evaluate import (PSNR_CAP, attention_share, gallery, methods_for, pareto_check, readings, run_reuse,
                                         versus)
from unicache_lib.replicate import unstable_claims
from unicache_lib.scoreboard import Scoreboard
from unicache_lib.tables import wrap
from unicache_lib.world.text import load_prompts, single_object
from unicache_lib.runtime.loaders import is_stand_in, load_generator, model_label


def rules(*ids):
    """Each claim and the rule that decides it, printed where it is measured (both written once, in claims.py)."""
    print("\n".join(wrap(f"{c}: {CLAIMS[c]}\n  rule: {CC.REUSE_RULES[c][0]}") for c in ids))

# %%
if not GENERATORS:
    raise ValueError("GENERATORS is empty: this lesson measures cross-step reuse on at least one generator "
                     "(e.g. GENERATORS=['tiny-mmdit'] or a diffusers pipeline folder)")
torch.manual_seed(SEED)
out = project_path(OUT_DIR)  # relative: from the repository root, wherever the kernel started
out.mkdir(parents=True, exist_ok=True)
gprompts = load_prompts(PROMPTS, N_PROMPTS + 4, 0, SEED)  # the first N_PROMPTS are scored, the last 4 calibrate MagCache
objs = [single_object(p) for p in gprompts[:N_PROMPTS]]  # None (no single object the detector knows): NaN
texts = [p["short"] for p in gprompts[:N_PROMPTS]]
calibration = [p["short"] for p in gprompts[N_PROMPTS:]]
NEW_REUSE, MILD = CC.NEW_REUSE, CC.MILD
gpaths = {model_label(g): g for g in GENERATORS}  # tables use the label, never a full path
gens = {g: load_generator(p, dtype=DTYPE, device=DEVICE) for g, p in gpaths.items()}
fewer = FEWER_STEPS or sorted({max(1, round(f * STEPS)) for f in (0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8)} - {STEPS})
METHODS = {}
for g, gen in gens.items():
    METHODS[g] = methods_for(gen, STEPS, GUIDANCE, calibration, scored_prompts=texts, fewer_steps=fewer)
    # a milder point of the same policy (every 2nd step in the middle), for the Pareto comparison of section 3
    METHODS[g][MILD] = lambda gen=gen: ReuseCache(gen.transformer, REUSE_POLICIES["step_skip"](stride=2), STEPS)
print(f"{len(texts)} scored prompts on {', '.join(gens)}; {STEPS} steps; fewer-step control at {fewer}")

# %% [markdown]
# ## 1. The idea in one picture
#
# One prompt, sampled four ways on each generator: without reuse, with `step_skip`, with fewer steps at as many
# transformer calls, and with one diffusers cache. Above each image: its PSNR against the uncached one. Below it: the
# denoising steps, dark where the transformer ran, light where `step_skip` predicted the output. A diffusers cache
# decides block by block inside each step, so it gets no strip.

# %%
n_new = sum(REUSE_POLICIES["step_skip"]().schedule(STEPS))  # transformer calls step_skip makes
PICTURE = [m for m in ("none", NEW_REUSE, f"steps:{n_new}", PICTURE_CACHE) if m != f"steps:{n_new}" or n_new in fewer]
for g, gen in gens.items():
    shown = {m: METHODS[g][m] for m in PICTURE if m in METHODS[g]}
    G = gallery(gen, shown, texts[0], STEPS, GUIDANCE, SEED)
    fig = plots.reuse_gallery({m: v["image"] for m, v in G.items()}, {m: v["psnr"] for m, v in G.items()},
                              {m: v["schedule"] for m, v in G.items()}, STEPS, f"{g}: '{texts[0]}'")
    _ = plots.save(fig, out, f"gallery_{g}")
    print(wrap(f"{g}: " + "; ".join(f"{m} " + ("identical" if v["psnr"] >= PSNR_CAP else f"{v['psnr']:.1f} dB")
                                    + (f" ({sum(v['schedule'])} calls)" if v["schedule"] else "") for m, v in G.items())))

# %% [markdown]
# **What to look at.** The images look alike; their PSNRs do not. At the same number of transformer calls,
# `step_skip`'s image is closer to the uncached one than the fewer-step control's (on the MMDiT
# <!--num "notebooks/06_step_reuse.ipynb#out:tiny-mmdit: none" re="step_skip ([0-9.]+ dB)"-->50.9 dB<!--/num--> against <!--num "notebooks/06_step_reuse.ipynb#out:tiny-mmdit: none" re="steps:[0-9]+ ([0-9.]+ dB)"-->44.1 dB<!--/num-->):
# computing the first two and last two steps and every third between, and extrapolating the rest, beats spreading the same
# calls evenly.
#
# **One prompt, a kind one.** Over all prompts (§2) the MMDiT's means are
# <!--num "notebooks/06_step_reuse.ipynb#out:PSNR (dB) and SSIM against no reuse > step_skip@0" fmt="{:.1f}"-->45.3<!--/num-->, <!--num "notebooks/06_step_reuse.ipynb#out:PSNR (dB) and SSIM against no reuse > steps:9@1" fmt="{:.1f}"-->41.8<!--/num--> and
# <!--num "notebooks/06_step_reuse.ipynb#out:PSNR (dB) and SSIM against no reuse > diffusers:first_block@0" fmt="{:.1f}"-->39.0<!--/num--> dB (`step_skip`, fewer steps, the cache).

# %% [markdown]
# ## 2. Cross-step reuse on the generators
#
# Besides the five diffusers caches (at diffusers' recommended settings), the methods are:
# - **`step_skip`**: whole transformer calls skipped, `CC.C..C..C..C..C..CC`, each skipped output extrapolated half-way
#   along the line through the last two; **`step_skip (stride 2)`**, its milder setting, computes every 2nd step instead;
# - the study's attention-only schedules (§4): **`every_2`** (reuse on odd steps), **`static_last_third`** (the same,
#   in the last third only), **`adaptive`** (reuse while a module's input keeps a cosine of at least
#   <!--const adaptive's default threshold-->0.995<!--/const--> to the last computed step's, at most twice in a row; 03's <!--const 03's strict threshold-->0.99<!--/const--> judges maps, not inputs) and
#   **`text_side`** (only the text side, after the first step).
#
# `flops`: what the *whole* transformer executed relative to no reuse; speed-up: the median over `REPEATS` shuffled
# rounds, with a 95% interval. Rows `steps:N`, **the control**, sample with N instead of `STEPS` steps: a reuse method
# earns its machinery only where it beats them at equal wall-clock and FLOPs.
#
# The cell first prints target R1 and its rule, written in `unicache_lib/claims.py` before any number (§3 and §4 do
# the same), then `step_skip`'s schedule as tuned on disjoint design prompts (`benchmarks/tune_step_skip.py`): this
# run tests the schedule rather than fits it.

# %%
rules("R1")
TUNED = project_path("benchmarks/results/tune_step_skip.txt")  # its choice for the shipped generators
if TUNED.exists():
    print(wrap("tuned on the design prompts: " + next(ln for ln in TUNED.read_text().splitlines() if ln.startswith("chosen:"))))
RU = {g: run_reuse(gen, METHODS[g], texts, objs, STEPS, GUIDANCE, SEED, TIMING_PROMPTS, REPEATS) for g, gen in gens.items()}
gfamily = {g: gen.family for g, gen in gens.items()}
reuse = pd.concat(RU, names=["model"])
reuse["reading"] = pd.concat({g: readings(RU[g]) for g in RU}, names=["model"])

# %% tags=["nbval-check-output"]
ORDER = list(dict.fromkeys(reuse.index.get_level_values("method")))  # methods in the order they ran
CACHES = [m for m in ORDER if m.startswith("diffusers:")]
BEST = [d.idxmax() for g in RU if len(d := RU[g].reindex(CACHES).psnr.dropna())]  # each generator's closest cache
n_mild = sum(REUSE_POLICIES["step_skip"](stride=2).schedule(STEPS))  # the milder setting's transformer calls
KEY = [m for m in dict.fromkeys([NEW_REUSE, f"steps:{n_new}", MILD, f"steps:{n_mild}", PICTURE_CACHE, *BEST]) if m in ORDER]
q = reuse[["psnr", "ssim", "flops"]].unstack("model").swaplevel(axis=1).reindex(KEY)
print(f"n = {N_PROMPTS} prompts; PSNR (dB) and SSIM against no reuse; flops: transformer FLOPs / no reuse")
print(q[[(g, c) for g in gpaths for c in ("psnr", "ssim", "flops")]].round(3).to_string())
cols = ["psnr", "ssim", "computed", "flops", "speedup", "speedup_lo", "speedup_hi", "note"]
reuse.reset_index()[["model", "method", *cols]].to_csv(out / "reuse.csv", index=False)  # every method, every column
print(wrap(f"the other {len(ORDER) - len(KEY) - 1} rows: §3's figure and §4's table; every row: "
           + os.path.relpath(out / "reuse.csv", project_path("."))))
lost = reuse.loc[(reuse[["colour", "position"]] < 1).any(axis=1), ["colour", "position"]]
print("object's colour / position kept in every image, except: "
      + ("; ".join(f"{g} {m} {r.colour:.3f} / {r.position:.3f}" for (g, m), r in lost.iterrows()) or "none"))
if (reuse.note != "").any():
    print(reuse.loc[reuse.note != "", ["note"]].to_string())

# %% [markdown]
# **How to read the table.** It keeps the rows that carry the lesson: each `step_skip` setting above the fewer-step
# control with as many calls, then §1's cache and each generator's closest cache. PSNR is against the no-reuse image
# ([glossary](../docs/GLOSSARY.md#psnr-and-ssim)); healthy: far below 1 in `flops` at a PSNR where differences are
# invisible.
#
# **Exact caches.** <!--const the PSNR cap, a convention-->100 dB<!--/const--> means bit-identical. On a cross-attention DiT (PixArt here) `text_side` is exact:
# it reuses the text keys and values, projected from a prompt embedding that does not change across steps, so it saves
# only those projections. The cell below names such methods (a free cache on that family, left out of the figures) and
# gives each generator's PSNR range.

# %%
for g in RU:
    for m, why in readings(RU[g]).items():
        if "bit-identical" in why:
            r = RU[g].loc[m]
            print(wrap(f"{g} · {m}: {why}; computed {r.computed:.2f}, speed-up {r.speedup:.2f}x."))
    best = RU[g].drop(index=[i for i in RU[g].index if i == "none" or str(i).startswith("steps:")]).psnr.dropna()
    best = best[best < PSNR_CAP]
    if len(best):
        print(f"{g}: the reuse methods span {best.min():.1f}-{best.max():.1f} dB; lowest {best.idxmin()}, highest {best.idxmax()}.")

# %%
# timings vary from run to run; the table above is the checked part. Seconds per run and their spread: reuse_timing.csv
sp = reuse.apply(lambda r: f"{r.speedup:.2f} [{r.speedup_lo:.2f}, {r.speedup_hi:.2f}]", axis=1).unstack("model")
print(f"speed-up over no reuse: median paired ratio over {REPEATS} shuffled interleaved rounds [95% interval over rounds]")
print(sp.reindex(KEY)[list(gpaths)].to_string())
reuse[["speedup", "speedup_lo", "speedup_hi", "median_s", "iqr_s", "computed", "flops"]].to_csv(out / "reuse_timing.csv")

# %% [markdown]
# **Against R1.** `step_skip` runs <!--num "notebooks/06_step_reuse.ipynb#out:speed-up over no reuse: median paired > step_skip@0" fmt="{:.2f}×"-->2.32×<!--/num--> / <!--num "notebooks/06_step_reuse.ipynb#out:speed-up over no reuse: median paired > step_skip@3" fmt="{:.2f}×"-->2.37×<!--/num--> faster than no reuse (MMDiT / PixArt) at
# <!--num "notebooks/06_step_reuse.ipynb#out:PSNR (dB) and SSIM against no reuse > step_skip@0" fmt="{:.1f}"-->45.3<!--/num--> / <!--num "notebooks/06_step_reuse.ipynb#out:PSNR (dB) and SSIM against no reuse > step_skip@3" fmt="{:.1f}"-->41.3<!--/num--> dB: both medians clear R1's speed bar, but PixArt's mean PSNR falls
# short of its PSNR bar. §5 decides on a larger run, with more prompts and timing rounds.
#
# **Tuned elsewhere.** On PixArt its design prompts gave the schedule <!--num "notebooks/06_step_reuse.ipynb#out:tuned on the design prompts > pixart@2" fmt="{:.1f}"-->43.5<!--/num--> dB (the tuning line above); nothing
# was re-tuned on this run's prompts.

# %% [markdown]
# ## 3. Against fewer steps, and against the diffusers caches
#
# Each method's PSNR minus the fewer-step control's, at the method's own FLOPs and at its own wall-clock speed-up (dB,
# 95% interval over prompts; the control interpolated between step counts). Positive: the method beats fewer steps;
# "outside": it saves more or less than every control point, so it is not compared. First, the targets measured here,
# R2 and R3, with their rules.

# %%
rules("R2", "R3")

# %%
SHOWN = [NEW_REUSE, MILD, "every_2", "diffusers:first_block", "diffusers:magcache"]  # + the control: six on a chart
fig, axes = plt.subplots(len(gpaths), 2, figsize=(12, 4.2 * len(gpaths)), squeeze=False)
for row, g in zip(axes, gpaths):
    d = RU[g].dropna(subset=["psnr"])
    ctrl = d[[str(i).startswith("steps:") for i in d.index]].sort_values("flops")
    for ax, by, lab in ((row[0], "speedup", "wall-clock speed-up (median paired ratio)"), (row[1], "flops", "transformer FLOPs / no reuse")):
        ax.plot(ctrl[by], ctrl.psnr, "-", label="fewer steps (control)", **plots.method_style("steps:1"))
        for n, r in ctrl.iterrows():
            ax.annotate(n.split(":")[1], (r[by], r.psnr), fontsize=6, xytext=(2, -8), textcoords="offset points")
        for m in plots.check_methods(SHOWN, limit=plots.MAX_METHODS - 1):
            if m in d.index and d.loc[m, "psnr"] < PSNR_CAP:
                r = d.loc[m]
                xerr = [[r.speedup - r.speedup_lo], [r.speedup_hi - r.speedup]] if by == "speedup" and np.isfinite(r.speedup_lo) else None
                st = plots.method_style(m)
                ax.errorbar(r[by], r.psnr, xerr=xerr, marker=st["marker"], color=st["color"], ms=12 if m == NEW_REUSE else 7,
                            capsize=2, ls="none", label=m)
        ax.axhline(42, color="grey", lw=0.6, ls=":")
        ax.set(xlabel=lab, ylabel="PSNR vs no reuse (dB)")
    row[1].invert_xaxis()
    row[0].set_title(f"{g}: quality vs speed (numbers: the control's step counts)", fontsize=9)
    row[1].set_title(f"{g}: quality vs work (right = less work)", fontsize=9)
    row[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
fig.tight_layout()
_ = plots.save(fig, out, "reuse_vs_control")

# %% [markdown]
# **What to look at.** The grey line is the control; a point above it beats fewer steps at the same speed-up (left) or
# work (right; less work to the right). The dotted line is <!--const R1's threshold, written before the numbers-->42 dB<!--/const-->, R1's PSNR bar.
#
# **This run.** Only `step_skip`, at both settings, lies above the control: the default by
# <!--num "notebooks/06_step_reuse.ipynb#out:PSNR over the fewer-step control at equal FLOPs > step_skip@0" fmt="{:+.2f}"-->+3.51<!--/num--> / <!--num "notebooks/06_step_reuse.ipynb#out:PSNR over the fewer-step control at equal FLOPs > step_skip@3" fmt="{:+.2f}"-->+3.66<!--/num--> dB at equal FLOPs (MMDiT / PixArt), both intervals above 0.
#
# **At equal wall-clock** the default's margins are <!--num "notebooks/06_step_reuse.ipynb#out:PSNR over the fewer-step control at equal wall-clock > step_skip@0" fmt="{:+.2f}"-->+3.81<!--/num--> / <!--num "notebooks/06_step_reuse.ipynb#out:PSNR over the fewer-step control at equal wall-clock > step_skip@3" fmt="{:+.2f}"-->+3.43<!--/num--> dB (MMDiT / PixArt), both
# intervals above 0. Timings on a loaded machine vary from run to run: where the control's own timings do not fall with
# the step count, a margin reads "outside" (no margin is read off them), so §5 decides R2 on a larger run. Every other
# method in the control's range lies below it, at equal FLOPs and at equal wall-clock (the line under each table).
#
# Below: `step_skip`'s margins, then the diffusers caches head to head where `step_skip` does not dominate (ahead on
# PSNR and speed, both intervals clear of a tie, at no more FLOPs), and each generator's closest; the last column is
# the `step_skip` setting that saves at least as much.

# %% tags=["nbval-check-output"]
CT = {g: control_table(RU[g]) for g in gpaths}
ROWS = [m for m in ORDER if m != "none" and not str(m).startswith("steps:")]


def with_interval(t, col, lo, hi):  # "+3.51 [+1.26, +5.11]" per row; NaN: outside the control's range
    return t.apply(lambda r: f"{r[col]:+.2f} [{r[lo]:+.2f}, {r[hi]:+.2f}]" if np.isfinite(r[col]) else "outside", axis=1)


def margins(by):  # step_skip's two settings, then the other methods in one line: how many compared, their range
    c, ours = f"margin_{by}", [m for m in (NEW_REUSE, MILD) if m in ROWS]
    print(pd.DataFrame({g: with_interval(CT[g], c, c + "_lo", c + "_hi") for g in gpaths}).reindex(ours)
          .fillna("did not run").to_string())
    rest = pd.concat({g: CT[g][c].reindex([m for m in ROWS if m not in ours]) for g in gpaths}).dropna()
    print(wrap(f"the other methods: {len(rest)} method x generator pairs in the control's range, "
               + (f"{rest.min():+.2f} to {rest.max():+.2f} dB (closest: {rest.idxmax()[1]} on {rest.idxmax()[0]})"
                  if len(rest) else "none")))


print("PSNR over the fewer-step control at equal FLOPs (dB) [95% interval over prompts]\n"
      "(outside: saves more or less than every control point)")
margins("flops")

# %%
# timings vary from run to run: these margins and the speed ratios below are not compared by nbval
print("PSNR over the fewer-step control at equal wall-clock (dB) [95% interval over prompts]")
margins("speedup")

# %%
# step_skip head to head with each diffusers cache, and each cache against the best step_skip setting that saves as much
DIFFUSERS = [m for m in reuse.index.get_level_values("method").unique() if m.startswith("diffusers:")]
VS = {g: versus(RU[g], NEW_REUSE, DIFFUSERS) for g in gpaths}
PARETO = {(g, by): pareto_check(RU[g], [NEW_REUSE, MILD], DIFFUSERS, by) for g in gpaths for by in ("speedup", "flops")}
H2H = pd.concat({g: pd.DataFrame({
    f"{NEW_REUSE} - cache": with_interval(VS[g], "psnr_diff", "psnr_lo", "psnr_hi"),
    "time ratio": VS[g].speed_ratio.round(2), "dominates": VS[g].dominates,
    "best saving as much - cache": with_interval(PARETO[g, "speedup"], "psnr_diff", "lo", "hi"),
    "that setting": PARETO[g, "speedup"].match}) for g in gpaths}, names=["model", "cache"])
if H2H["that setting"].nunique() == 1:  # one setting matches every cache: named in the header, not on every row
    setting = H2H["that setting"].iloc[0]
    H2H = H2H.drop(columns="that setting").rename(columns={"best saving as much - cache": f"{setting} - cache"})
closest = [(g, PARETO[g, "speedup"].psnr_diff.idxmin()) for g in gpaths if PARETO[g, "speedup"].psnr_diff.notna().any()]
shown = H2H[(H2H.dominates != True) | H2H.index.isin(closest)].iloc[:8]  # noqa: E712 (a column of bools and NaN)
print(wrap(f"{NEW_REUSE} against each diffusers cache: PSNR difference (dB) [95% interval]; time ratio: the cache's time / "
           f"{NEW_REUSE}'s; then the best {NEW_REUSE} setting that saves at least as much wall-clock"))
print(shown.to_string())
if len(hidden := H2H.drop(index=shown.index)):
    print(f"not shown: {len(hidden)} of {len(H2H)} pairs, {int((hidden.dominates == True).sum())} of them dominated by {NEW_REUSE}")  # noqa: E712
for g in gpaths:  # the same check by FLOPs, printed only where it picks other settings or other margins
    if not PARETO[g, "flops"].round(2).equals(PARETO[g, "speedup"].round(2)):
        print(f"{g}, by FLOPs instead:\n" + PARETO[g, "flops"].round(2).to_string())
pd.concat(VS, names=["model"]).to_csv(out / "versus.csv")  # with the FLOPs ratios and the speed ratios' intervals
print("every interval and FLOPs ratio:", os.path.relpath(out / "versus.csv", project_path(".")))

# %% [markdown]
# **Against the caches.** The milder setting beats every diffusers cache on the MMDiT while saving at least as much;
# on PixArt MagCache ties it: <!--num "notebooks/06_step_reuse.ipynb#out:against each diffusers cache > tiny-pixart > magcache@4" fmt="{:+.2f}"-->+0.34<!--/num--> dB [<!--num "notebooks/06_step_reuse.ipynb#out:against each diffusers cache > tiny-pixart > magcache@5" fmt="{:+.2f}"-->-1.98<!--/num-->, <!--num "notebooks/06_step_reuse.ipynb#out:against each diffusers cache > tiny-pixart > magcache@6" fmt="{:+.2f}"-->+2.23<!--/num-->]: the pair R3 turns on (§5).
#
# **The default setting** loses head to head to PAB on the MMDiT (<!--num "notebooks/06_step_reuse.ipynb#out:against each diffusers cache > diffusers:pab@0" fmt="{:+.2f}"-->-3.07<!--/num--> dB) and to MagCache on PixArt
# (<!--num "notebooks/06_step_reuse.ipynb#out:against each diffusers cache > tiny-pixart > magcache@0" fmt="{:+.2f}"-->-6.05<!--/num--> dB), both of which save far less.

# %% [markdown]
# ## 4. How far can attention-only reuse go?
#
# Reusing attention skips only the attention processors; the MLPs,
# norms, embeddings, text encoding and decoding still run. The share of a sampling run spent inside the
# attention processors caps the speed-up of any attention-only reuse at `1 / (1 - share)`, whatever it skips.

# %%
shares = {g: attention_share(gen, texts[:TIMING_PROMPTS], STEPS, GUIDANCE, SEED, repeats=max(1, min(3, REPEATS)))
          for g, gen in gens.items()}
for g, a in shares.items():
    print(f"{g}: attention {a['share']:.0%} of a sampling run ({a['step_s']:.2f} s per step, batch of "
          f"{min(TIMING_PROMPTS, len(texts))})\n  -> attention-only reuse can reach at most {a['cap']:.2f}x")

# %% [markdown]
# **Reading it.** Attention is
# <!--num "notebooks/06_step_reuse.ipynb#out:tiny-mmdit: attention@0"-->36<!--/num-->% of a sampling run on the MMDiT and
# <!--num "notebooks/06_step_reuse.ipynb#out:tiny-pixart: attention@0"-->42<!--/num-->% on PixArt.
#
# So reusing every attention call could make a run at most
# <!--num "notebooks/06_step_reuse.ipynb#out:tiny-mmdit: attention > at most" re="at most ([0-9.]+)x"-->1.56<!--/num-->× /
# <!--num "notebooks/06_step_reuse.ipynb#out:tiny-pixart: attention > at most" re="at most ([0-9.]+)x"-->1.72<!--/num-->× faster, below R1's target; skipping whole calls (`step_skip`) has no such cap.
#
# **The study's schedules** reuse attention only, so they live under this cap. Two study claims are about them, G3 and
# G8: the cell prints both with their rules, then the four schedules beside the mildest fewer-step control.

# %%
rules("G3", "G8")
ATT = [m for m in CC.ATTENTION_LEVEL if m in ORDER] + [f"steps:{max(fewer)}"]  # + the mildest fewer-step control
t = reuse[["psnr", "ssim", "flops", "speedup"]].unstack("model").swaplevel(axis=1).reindex(ATT)
print(wrap("the study's attention-level schedules and the mildest fewer-step control: PSNR (dB), SSIM, "
           "FLOPs / no reuse, speed-up (median; timings vary from run to run)"))
print(t[[(g, c) for g in gpaths for c in ("psnr", "ssim", "flops", "speedup")]].round(3).to_string())

# %% [markdown]
# **G3, where reuse is safe.** Reusing only in the last third keeps PixArt's SSIM at
# <!--num "notebooks/06_step_reuse.ipynb#out:attention-level schedules > static_last_third@5" fmt="{:.3f}"-->0.992<!--/num-->, above every 2nd step's <!--num "notebooks/06_step_reuse.ipynb#out:attention-level schedules > every_2@5" fmt="{:.3f}"-->0.983<!--/num-->, but it keeps <!--num "notebooks/06_step_reuse.ipynb#out:attention-level schedules > static_last_third@6" fmt="{:.2f}"-->0.92<!--/num--> of the FLOPs
# against <!--num "notebooks/06_step_reuse.ipynb#out:attention-level schedules > every_2@6" fmt="{:.2f}"-->0.77<!--/num-->. Late reuse is safe because it reuses little: by output the last steps are the least reusable
# ([03](03_diffusion_steps.ipynb) §4).
#
# **G8, the text side.** On the MMDiT `text_side` runs <!--num "notebooks/06_step_reuse.ipynb#out:attention-level schedules > text_side@3" fmt="{:.2f}×"-->1.21×<!--/num--> at <!--num "notebooks/06_step_reuse.ipynb#out:attention-level schedules > text_side@0" fmt="{:.1f}"-->47.4<!--/num--> dB; the mildest
# fewer-step control runs <!--num "notebooks/06_step_reuse.ipynb#out:attention-level schedules > steps:@4" fmt="{:.2f}×"-->1.33×<!--/num--> at <!--num "notebooks/06_step_reuse.ipynb#out:attention-level schedules > steps:@1" fmt="{:.1f}"-->52.8<!--/num--> dB: about as fast or faster, and much closer to
# the uncached image. On a joint-attention model, sample with fewer steps instead.

# %% [markdown]
# ## 5. Claims scoreboard

# %%
from unicache_lib.claims import Markdown, claims_table

claims_table("06_step_reuse")  # each claim (statement, why, rule) is written once, in unicache_lib/claims.py

# %% [markdown]
# G3 and G8 are the study's claims; R1–R3 this workbench's targets for `step_skip` (not the study's R1, mixed routing).
# §2–§4 printed their rules, from [unicache_lib/claims.py](../unicache_lib/claims.py), before the numbers
# ([verdicts](../docs/GLOSSARY.md#verdicts)). This run cannot settle every target, so `make evaluate-reuse` ran the
# same methods and rules on many more new prompt/noise pairs; each claim it measured is decided there, this run's
# interval beside it.

# %%
# not compared by nbval: R1 (a), R2, R3 (a) and G8 rest on wall-clock speed-ups, which vary from run to run
board = Scoreboard(random_weights=any(is_stand_in(g) for g in GENERATORS), unstable=unstable_claims(list(gpaths)))
CC.declare(board, CC.REUSE_RULES)
decisive = CC.decisive_reuse(list(gpaths), STEPS, GUIDANCE)  # make evaluate-reuse's committed run, if it fits
CC.measure_reuse(board, RU, CT, PARETO, gfamily, REPEATS, decisive=decisive)
board.save(out / "scoreboard.json")
print({c: r.verdict for c, r in board.rows.items()})

# %%
board.show()

# %%
print("\n".join(wrap(line) for line in board.why_inconclusive()) or "no verdict is inconclusive")

# %% [markdown]
# **How the verdicts were settled** (on `make evaluate-reuse`'s prompts and timing rounds), and what each means:
# - **R1 partly: fast enough, not yet sharp enough.** (a) holds: <!--num data/results/06_step_reuse.json#[claim=R1].criteria[name=a].value fmt="{:.2f}×"-->2.28×<!--/num--> on the slower generator (bar
#   <!--const R1's threshold-->2×<!--/const-->). (b) does not: PixArt's mean PSNR, <!--num data/results/06_step_reuse.json#[claim=R1].criteria[name=b].value fmt="{:.1f}"-->40.4<!--/num--> dB, has its interval below the target.
# - **R2 holds: `step_skip` beats fewer steps**, by <!--num data/results/06_step_reuse.json#[claim=R2].value fmt="{:+.1f}"-->+4.3<!--/num--> dB at equal wall-clock where the margin is smallest.
# - **R3 inconclusive, a tie: prefer `step_skip` to every cache but MagCache on PixArt, which it ties.** `step_skip`
#   every 2nd step minus MagCache: <!--num data/results/06_step_reuse.json#[claim=R3].value fmt="{:+.2f}"-->+0.09<!--/num--> dB [<!--num data/results/06_step_reuse.json#[claim=R3].lo fmt="{:+.2f}"-->-0.24<!--/num-->, <!--num data/results/06_step_reuse.json#[claim=R3].hi fmt="{:+.2f}"-->+0.40<!--/num-->]; about
#   <!--num "notebooks/06_step_reuse.ipynb#out:R3 (a): > settle@1" fmt="{:,}"-->23,253<!--/num--> prompts would settle it.
# - **G3 holds: late reuse is safe, but it saves little** (SSIM <!--num data/results/06_step_reuse.json#[claim=G3].criteria[name=a].value fmt="{:.3f}"-->0.992<!--/num--> on the weaker generator; §4).
# - **G8 holds: the text side is cheap to cache, but fewer steps do better** (<!--num data/results/06_step_reuse.json#[claim=G8].criteria[name=a].value fmt="{:.2f}×"-->1.16×<!--/num-->, the study's
#   ~<!--const the study's reported figure-->15%<!--/const-->; §4).

# %% [markdown]
# ## Recap: what this run showed
#
# - **Fewer steps is a hard control**: no cache or attention-level schedule in its range beats it.
# - **Attention-only reuse is capped** at <!--num "notebooks/06_step_reuse.ipynb#out:tiny-mmdit: attention > at most" re="at most ([0-9.]+)x"-->1.56<!--/num-->× / <!--num "notebooks/06_step_reuse.ipynb#out:tiny-pixart: attention > at most" re="at most ([0-9.]+)x"-->1.72<!--/num-->× (§4).
# - **Only whole-step skipping clears it**: tune `step_skip` on your design prompts; adopt a cache only if it clears
#   the control at equal FLOPs and wall-clock.
#
# This run's numbers, then the decision table (its G3 row says where reuse is safe, not that it pays):

# %%
Markdown("\n".join("- " + s for s in CC.reuse_recap(RU, CT, shares, board)))

# %%
CC.reuse_decisions(RU, CT, shares)  # every cell whole, also as plain text

# %% [markdown]
# ## Exercises
#
# Each starter leaves one gap (`# <- write`) and checks what you wrote. Solutions:
# [solutions/06_step_reuse.py](../solutions/06_step_reuse.py) (`--only K` runs one).
#
# 1. ★★ Write `dominated` (a static schedule computes no more at a PSNR no lower); the cell then runs `adaptive` at
#    other thresholds. Is the adaptive rule ever better than the static schedules at equal `computed`?
# 2. ★★ `step_skip` with `weight=0` reuses the last computed output unchanged. Write `plain`, that method's cache
#    beside the default, and compare their margins over the fewer-step control: what does the extrapolation buy?

# %%
# Exercise 1 starter: the adaptive schedule at other thresholds beside the static schedules, on the first generator
# and four of §2's prompts (PSNR against no reuse over `computed`)
from unicache_lib.reuse.policies.adaptive import Adaptive  # noqa: E402
g0, pt = next(iter(gens)), lambda c, p: pd.Series({"computed": c, "psnr": p})


def dominated(point, static):
    """True when a row of the DataFrame `static` (columns computed, psnr) computes no more than `point` (a Series
    with the same two fields) at a PSNR no lower: then `point` does not beat the static schedules."""
    ...  # <- write: returns a bool


CASES = [((0.6, 44.4), [(0.55, 47.7)], True), ((0.47, 39.7), [(0.55, 47.7)], False),
         ((0.875, 49.8), [(0.875, 64.8)], True), ((0.5, 50.0), [(0.5, 40.0), (0.9, 60.0)], False)]
if dominated(pt(0.6, 44.4), pd.DataFrame([(0.55, 47.7)], columns=["computed", "psnr"])) is None:
    print("Write `dominated`, then run this cell again.")
elif wrong := [c for c in CASES if dominated(pt(*c[0]), pd.DataFrame(c[1], columns=["computed", "psnr"])) != c[2]]:
    print(f"not yet: wrong on (point, static rows, want) {wrong}")
else:
    th = REUSE_POLICIES["adaptive"]().threshold  # §2's; then a looser and a stricter one
    ms = {n: (lambda n=n: ReuseCache(gens[g0].transformer, REUSE_POLICIES[n](), STEPS))
          for n in ("none", "static_last_third", "every_2")}
    ms |= {f"adaptive {t}": (lambda t=t: ReuseCache(gens[g0].transformer, Adaptive(threshold=t), STEPS))
           for t in (0.99, th, 0.999)}
    A1 = run_reuse(gens[g0], ms, texts[:4], objs[:4], STEPS, GUIDANCE, SEED, timing_prompts=1, repeats=2, progress=False)
    static = A1.loc[["static_last_third", "every_2"], ["computed", "psnr"]]
    A1["dominated"] = [dominated(r, static) if m.startswith("adaptive") else "" for m, r in A1.iterrows()]
    print("correct on four made-up points; on", g0, "\n" + A1[["computed", "psnr", "dominated"]].round(3).to_string())

# %%
# Exercise 2 starter: step_skip without extrapolation beside the default and the fewer-step control,
# on each generator and four of §2's prompts; the PSNR margin over the control at equal FLOPs
from unicache_lib.reuse.control import fewer_steps_methods  # noqa: E402


def plain(gen):
    """A fresh ReuseCache over gen.transformer running step_skip with weight=0, for STEPS steps (the default's
    line below shows the pattern)."""
    ...  # <- write: returns the cache


cache = plain(next(iter(gens.values())))
if cache is None:
    print("Write `plain`, then run this cell again.")
elif not isinstance(cache, ReuseCache) or getattr(cache.policy, "weight", None) != 0:
    print(f"not yet: plain(gen) returned {type(cache).__name__} with policy {getattr(cache, 'policy', None)}")
else:
    for g, gen in gens.items():
        ms = {"none": lambda: ReuseCache(gen.transformer, REUSE_POLICIES["none"](), STEPS),
              "step_skip": lambda: ReuseCache(gen.transformer, REUSE_POLICIES["step_skip"](), STEPS),
              "step_skip (weight 0)": lambda gen=gen: plain(gen)}
        A2 = run_reuse(gen, ms | fewer_steps_methods([8, 12]), texts[:4], objs[:4], STEPS, GUIDANCE, SEED,
                       timing_prompts=1, repeats=2, progress=False)
        ct = control_table(A2)
        print(g, A2.loc[list(ms)[1:], ["psnr", "flops"]].assign(margin_flops=ct.loc[list(ms)[1:], "margin_flops"])
              .round(2).to_string(), sep="\n")

# %% [markdown]
# ## Next steps
#
# - **Your pipeline** (★★★): tune `step_skip`'s schedule on your design prompts
#   (`python benchmarks/tune_step_skip.py --help`), then run this lesson on it:
#   `.venv/bin/papermill notebooks/06_step_reuse.ipynb outputs/06_mine.ipynb -y 'GENERATORS: ["/path/to/pipeline"]' -p DEVICE cuda`.
#   Does `step_skip` still beat fewer steps (§3's margins)? On a random-weight stand-in only the FLOPs can be read:
#   `solutions/06_step_reuse.py`'s `next_steps` shows the calls on one.
