"""Notebook 03's claims about generation models (G1, G2, G4-G7, G9) as data, and their measurements on a
:class:`~unicache_lib.scoreboard.Scoreboard`, so the notebook's scoreboard cell reads as a few calls.

:data:`RULES` is the lesson's rules, made from :mod:`unicache_lib.claims` (each claim, its statement and rule written
once there); :func:`declare` writes them on a board. A claim about "generation models" must hold on both generators,
so each statistic is the *weaker* model's (the minimum over models, or the maximum where the claim asks for a low
value). Every interval resamples prompts (the same prompts drive both models, so a resample keeps them paired); G7
resamples prompts and the understanding model's samples separately, G9 (b) the pair prompts within their kind.

The tables come from the notebook: ``T`` the per-(model, prompt, part, layer, step) statistics with ``phase``,
``kind`` (short / long prompts), ``sample`` (``"<kind>/<prompt index>"``) and the statistic columns named below.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..claims import rules_of
from ..intervals import extreme_of, grouped, mean_interval, ratio_interval
from .generation import PHASES, phase_of
from .word_regions import judged

RULES = rules_of("03_diffusion_steps")


def declare(board) -> None:
    """Write every rule of :data:`RULES` on ``board`` (before any measurement)."""
    board.declare(RULES)


def by_prompt(df: pd.DataFrame, col: str, n_prompts: int) -> np.ndarray:
    """``[n_prompts]``: ``col`` averaged over everything else, per prompt index (column ``prompt``)."""
    return df.groupby("prompt")[col].mean().reindex(range(n_prompts)).to_numpy()


def weakest(arrays, reduce=min):
    """The weaker model's mean over prompts (``reduce=max``: the most similar model's), from each model's own
    interval over prompts (:func:`~unicache_lib.intervals.extreme_of`). ``arrays``: per model ``[n_prompts]``."""
    return extreme_of([mean_interval(a, "prompts") for a in arrays], reduce)


def with_prompt(T: pd.DataFrame) -> pd.DataFrame:
    """``T`` with the prompt index parsed from ``sample`` (``"<kind>/<index>"``)."""
    return T.assign(prompt=T["sample"].str.split("/").str[1].astype(int))


def measure_focus_and_similarity(board, T, models, n_prompts: int, cells_falling: str, knees: pd.DataFrame, steps: int):
    """G1 (image-query entropy, early minus late, short prompts) and G2 (adjacent-step similarity of the maps, late
    and early). ``cells_falling``: G1's shown note (how many (model, part, layer) cells fall by 0.02 or more);
    ``knees``: the knee table (``early sim`` / ``late sim`` per model). Returns the per-model early-minus-late entropy
    drops (``[n_prompts]`` each), which the decision table reads."""
    short = T[T.kind == "short"]
    phase = {f: short[short.phase == f] for f in PHASES}
    drop = [by_prompt(phase["early"][phase["early"].model == m], "img_entropy", n_prompts)
            - by_prompt(phase["late"][phase["late"].model == m], "img_entropy", n_prompts) for m in models]
    board.measure("G1", weakest(drop), shown=cells_falling)
    late = [by_prompt(phase["late"][phase["late"].model == m], "sim", n_prompts) for m in models]
    early = [by_prompt(phase["early"][phase["early"].model == m], "sim", n_prompts) for m in models]
    board.measure("G2", weakest(late), criterion="a")
    if all(np.isfinite(a).all() for a in early):
        board.measure("G2", weakest(early, max), criterion="b", shown="; ".join(
            f"{m}: early {knees.loc[m]['early sim'].mean():.2f}, late {knees.loc[m]['late sim'].mean():.2f}" for m in models))
    else:
        board.measure("G2", None, criterion="b", note=f"the early phase of {steps} steps has no step with a previous step")
    return drop


def measure_joint_asymmetry(board, jall: pd.DataFrame, n_prompts: int, asym: pd.DataFrame | None) -> dict:
    """G4 on the joint-attention rows ``jall`` (empty: no MMDiT among the models): the step-to-step change of the
    image->text against the text->image map, and of the image stream's output against the text stream's. Returns
    the per-prompt changes (``sim_it``, ``sim_ti``, ``out_sim_img``, ``out_sim_txt``), {} without a joint model."""
    if not len(jall):
        board.measure("G4", None, note="no joint-attention model in GENERATORS")
        return {}
    jp = with_prompt(jall)
    change = {c: 1 - by_prompt(jp, c, n_prompts) for c in ("sim_it", "sim_ti", "out_sim_img", "out_sim_txt")}
    board.measure("G4", ratio_interval(change["sim_it"], change["sim_ti"], "prompts"),
                  criterion="a", shown=f"text->image {asym.sim_ti.mean():.4f} vs image->text {asym.sim_it.mean():.4f}")
    board.measure("G4", ratio_interval(change["out_sim_img"], change["out_sim_txt"], "prompts"),
                  criterion="b", shown=f"outputs text {asym.out_sim_txt.mean():.4f} vs image {asym.out_sim_img.mean():.4f}")
    return change


def measure_cache_pressure(board, kv: pd.DataFrame, models, n_prompts: int) -> None:
    """G5: image / text KV bytes per attention layer (``kv["image/text"]`` per model: token counts, exact, so the
    interval is a point)."""
    board.measure("G5", weakest([np.full(n_prompts, kv.loc[m, "image/text"]) for m in models]),
                  shown=", ".join(f"{m}: {v:.2f}x" for m, v in kv["image/text"].items()))


def measure_conditioning(board, T, gdf: pd.DataFrame, cond: pd.DataFrame, models, n_prompts: int, steps: int) -> None:
    """G6: (a) guidance strength early minus late on short prompts (``gdf``: per model and kind, one column per step;
    guidance-distilled models have none), (b) long prompts' middle-phase text entropy, (c) its excess over short
    prompts'. ``cond``: the per-(model, kind) summary shown beside the verdict."""
    gsteps = {f: [s for s in range(steps) if phase_of(s, steps) == f] for f in PHASES}
    gvs = [gdf[(gdf.model == m) & (gdf.kind == "short")].drop(columns=["model", "kind"]).to_numpy(dtype=float)
           for m in models]  # guidance-distilled models (no unconditional branch) have no guidance strength
    gdrop = [gv[:, gsteps["early"]].mean(1) - gv[:, gsteps["late"]].mean(1) for gv in gvs if np.isfinite(gv).any()]
    mid = {(m, k): by_prompt(T[(T.model == m) & (T.kind == k) & (T.part != "self") & (T.phase == "middle")],
                             "text_entropy", n_prompts) for m in models for k in ("short", "long")}
    if gdrop:
        board.measure("G6", weakest(gdrop), criterion="a")
    else:
        board.measure("G6", None, criterion="a", note="no model in GENERATORS has an unconditional branch (guidance-distilled)")
    board.measure("G6", weakest([mid[m, "long"] for m in models]), criterion="b")
    board.measure("G6", weakest([mid[m, "long"] - mid[m, "short"] for m in models]), criterion="c",
                  shown="; ".join(f"{m}: guidance {cond.loc[(m, 'short')]['guidance early']:.2f}→"
                                  f"{cond.loc[(m, 'short')]['guidance late']:.2f}, middle text entropy long "
                                  f"{cond.loc[(m, 'long')]['text entropy middle']:.2f} / short "
                                  f"{cond.loc[(m, 'short')]['text entropy middle']:.2f}" for m in models))


def measure_redundancy(board, T, U: pd.DataFrame, models, n_prompts: int):
    """G7: mean head redundancy per prompt of each generator (short prompts) against the understanding model's per
    sample (``U``, :func:`~unicache_lib.analysis.generation.head_redundancy`). Returns ``(gen [n_prompts, models],
    und [n_samples])``."""
    short = T[T.kind == "short"]
    gen_red = np.stack([by_prompt(short[short.model == m], "redundancy", n_prompts) for m in models], 1)
    u_red = U.groupby("sample").redundancy.mean().to_numpy()
    board.measure("G7", grouped({"gen": list(gen_red), "und": list(u_red)}, "prompts / samples",
                                lambda d: np.min(np.mean(d["gen"], 0)) - np.mean(d["und"])),
                  shown=", ".join(f"{m} {v:.2f}" for m, v in zip(models, gen_red.mean(0))) + f" vs understanding {u_red.mean():.2f}")
    return gen_red, u_red


def word_region_lines(loc: pd.DataFrame, models) -> list[str]:
    """One line per model: its colour and shape words' region IoU over chance (``loc``: mean ``iou`` and ``chance``
    per (model, role)); a model none of whose prompts' objects was found in its drawings reads "not measurable here"."""
    lines = []
    for m in models:
        lm = loc.loc[m] if m in loc.index.get_level_values(0) else pd.DataFrame()
        lines.append(f"{m}: colour words {lm.loc['colour', 'iou'] / lm.loc['colour', 'chance']:.1f}x chance, shape words "
                     f"{lm.loc['shape', 'iou'] / lm.loc['shape', 'chance']:.1f}x (claim G9 (a) asks for 2x)"
                     if {"colour", "shape"} <= set(lm.index) else f"{m}: not measurable here: no prompt's object was "
                     "found in its drawings (nothing to compare a word's region with)")
    return lines


def measure_word_regions(board, R: pd.DataFrame, loc: pd.DataFrame, models, prompts: list[dict]) -> None:
    """G9: (a) the object words' region IoU over a random region's, summed over prompts (``R``: per model, prompt and
    role, from :func:`~unicache_lib.analysis.word_regions.word_region_table`; ``loc``: its summary per model), (b) the
    shape words' overlap on same-colour minus different-colour pair prompts."""
    pid = [p["id"] for p in prompts]
    Rl = R[R.role != "binding overlap"]
    iou_sum = [Rl[Rl.model == m].groupby("prompt")[["iou", "chance"]].sum().reindex(pid).fillna(0).to_numpy() for m in models]
    undrawn = [m for m, a in zip(models, iou_sum) if a[:, 1].sum() == 0]
    if not any(judged(p) for p in prompts):
        board.measure("G9", None, criterion="a", note="not measurable with these prompts: none lists objects the "
                      "detector knows; add 'objects' (colour, shape, position) to prompts.jsonl")
    elif undrawn:  # no prompt's object was drawn: a word's region has nothing to be compared with
        board.measure("G9", None, criterion="a", note=f"{', '.join(undrawn)} drew none of the prompts' objects")
    else:
        board.measure("G9", extreme_of([ratio_interval(a[:, 0], a[:, 1], "prompts") for a in iou_sum]),
                      criterion="a", shown="; ".join(f"{m}: IoU {loc.loc[m].iou.mean():.2f} (chance {loc.loc[m].chance.mean():.2f})"
                                                     for m in models))
    Rb = R[R.role == "binding overlap"].pivot_table(index="prompt", columns="model", values="iou")
    kinds = {k: [p["id"] for p in prompts if p["pair"] == k and p["id"] in Rb.index] for k in ("same", "different")}
    if min(len(v) for v in kinds.values()) >= 2:
        board.measure("G9", grouped({k: list(Rb.loc[v, list(models)].to_numpy()) for k, v in kinds.items()},
                                    "pair prompts per kind", lambda d: np.min(np.mean(d["same"], 0) - np.mean(d["different"], 0))),
                      criterion="b")
    else:
        board.measure("G9", None, criterion="b", note="fewer than 2 pair prompts of each kind (N_PAIRS >= 4 needed)")
