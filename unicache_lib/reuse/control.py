"""Fewer-step sampling: the control every reuse method must beat. Sampling with ``n < STEPS`` steps saves
``1 - n / STEPS`` of the transformer's work with no machinery at all; a reuse method is worth having only
where it gives better images than the control at the same wall-clock (or the same FLOPs).

    methods = methods_for(gen, 20, 3.0, calib) | fewer_steps_methods(range(6, 20))
    df = run_reuse(gen, methods, prompts, objects, 20)     # "steps:N" rows timed in the same rounds
    control_margin(df, "step_skip", by="speedup")         # PSNR over the control at equal speed-up (dB)

:func:`fewer_steps_curve` gives the control on its own (PSNR per prompt and FLOPs per step count, and
optionally wall-clock interleaved with the full run).
"""
import contextlib

import numpy as np
import pandas as pd

from ..core.errors import InputError
from ..intervals import Interval, difference_interval, interleaved_timings, speedup_interval
from ..quality import PSNR_CAP, psnr
from ..runtime.sampling import sample, to_uint8
from .flops import TransformerFlops

PREFIX = "steps:"


class FewerSteps(contextlib.AbstractContextManager):
    """A "method" that samples with ``n`` steps instead of the run's step count (``sample_steps``);
    it is its own sampling callback and does nothing else."""

    def __init__(self, n: int):
        if int(n) < 1:
            raise InputError(f"a fewer-step control needs n >= 1 steps, got {n}")
        self.sample_steps = int(n)

    def __exit__(self, *exc):
        return False


def fewer_steps_methods(steps_list) -> dict:
    """``{"steps:N": factory}`` for :func:`~unicache_lib.reuse.evaluate.run_reuse` (merge into
    ``methods_for``'s dict): each samples with ``N`` steps, scored against the full-step reference."""
    return {f"{PREFIX}{int(n)}": (lambda n=int(n): FewerSteps(n)) for n in steps_list}


def fewer_steps_curve(gen, prompts, ref_images, steps_list, guidance: float = 3.0, seed: int = 0,
                      full_steps: int = 20, repeats: int = 0, timing_prompts: int = 8) -> pd.DataFrame:
    """The control alone. One row per ``n`` in ``steps_list`` (index ``steps``): ``psnr`` (mean over prompts,
    dB, capped at 100), ``psnr_per_prompt`` ``[n_prompts]`` against ``ref_images`` (``[B, H, W, 3]`` uint8, the
    ``full_steps`` images of the same prompts and seeds), ``flops`` (transformer FLOPs counted on this run /
    on a ``full_steps`` run of the first 2 prompts). With ``repeats >= 2``: ``speedup`` (median paired ratio of
    the ``full_steps`` run's time to this one's over ``repeats`` interleaved rounds on ``timing_prompts``
    prompts) and its bootstrap interval ``speedup_lo`` / ``speedup_hi``."""
    ref_images = np.asarray(ref_images)
    if ref_images.shape[0] != len(prompts):
        raise InputError(f"{ref_images.shape[0]} reference images for {len(prompts)} prompts")
    sub = list(prompts[:2])
    with TransformerFlops(gen) as full:
        sample(gen, sub, full_steps, guidance, seed=seed)
    rows = []
    for n in steps_list:
        imgs = to_uint8(sample(gen, list(prompts), int(n), guidance, seed=seed))
        with TransformerFlops(gen) as fl:
            sample(gen, sub, int(n), guidance, seed=seed)
        p = np.minimum(psnr(imgs, ref_images), PSNR_CAP).astype(np.float64)
        rows.append({"steps": int(n), "psnr": float(p.mean()), "psnr_per_prompt": p, "flops": fl.flops / full.flops})
    df = pd.DataFrame(rows).set_index("steps")
    if repeats >= 2:
        tp = list(prompts[:timing_prompts])
        fns = {n: (lambda n=n: sample(gen, tp, n, guidance, seed=seed)) for n in [full_steps, *df.index]}
        times = interleaved_timings(fns, repeats, seed)
        ivs = {n: speedup_interval(times[full_steps], times[n], min_repeats=2) for n in df.index}
        df = df.assign(speedup=[ivs[n].value for n in df.index], speedup_lo=[ivs[n].lo for n in df.index],
                       speedup_hi=[ivs[n].hi for n in df.index])
    return df


def control_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The ``steps:N`` rows of a :func:`~unicache_lib.reuse.evaluate.run_reuse` table (raises if none)."""
    rows = df[[str(i).startswith(PREFIX) for i in df.index]]
    if rows.empty:
        raise InputError("no fewer-step control rows ('steps:N') in this table: add fewer_steps_methods(...) to the "
                         "methods")
    return rows


def _steps(label) -> int:
    return int(str(label)[len(PREFIX):]) if str(label).startswith(PREFIX) else int(label)


def check_monotone(control: pd.DataFrame, by: str) -> None:
    """Refuse a control sweep whose cost is not monotone in its step count: more steps must cost more FLOPs and give
    a smaller speed-up. Interpolating a scrambled sweep (a loaded machine's timings, where 9 steps can time faster
    than 8) would read a margin off a curve that does not exist. Raises ``ValueError`` naming the offending
    step counts; the fix is to re-time (more interleaved repeats, an idle machine)."""
    steps = np.array([_steps(i) for i in control.index])
    order = np.argsort(steps)
    steps, xs = steps[order], control[by].to_numpy(dtype=np.float64)[order]
    # speed-up falls as steps rise; FLOPs rise
    bad = np.flatnonzero(np.diff(xs) >= 0) if by == "speedup" else np.flatnonzero(np.diff(xs) <= 0)
    if len(bad):
        pairs = ", ".join(f"{steps[i]} steps {xs[i]:.3g} vs {steps[i + 1]} steps {xs[i + 1]:.3g}" for i in bad)
        raise InputError(f"the fewer-step control's {by} does not {'fall' if by == 'speedup' else 'rise'} with the "
                         f"step count ({pairs}): its cost is "
                         f"not monotone, so no margin is read off it; re-time the sweep (more interleaved repeats, an "
                         f"idle machine)" + ("" if by == "speedup" else " or check the FLOP counter"))


def control_psnr_at(control: pd.DataFrame, x: float, by: str = "speedup") -> np.ndarray:
    """The control's PSNR per prompt ``[n_prompts]`` at ``by`` = ``x`` (``"speedup"``: wall-clock speed-up;
    ``"flops"``: FLOPs fraction), linear in ``x`` between the two step counts that bracket it. ``x`` outside
    the control's measured range raises (add step counts rather than extrapolate the control)."""
    if by not in ("speedup", "flops"):
        raise InputError(f"by must be 'speedup' or 'flops', got {by!r}")
    xs = control[by].to_numpy(dtype=np.float64)
    ys = np.stack([np.asarray(p, dtype=np.float64) for p in control["psnr_per_prompt"]])  # [n_points, n_prompts]
    if not np.isfinite(xs).all():
        raise InputError(f"the control's {by} has non-finite values: {xs}")
    check_monotone(control, by)
    order = np.argsort(xs)
    xs, ys = xs[order], ys[order]
    if not xs[0] <= x <= xs[-1]:
        raise InputError(f"{by} = {x:.3g} is outside the fewer-step control's range [{xs[0]:.3g}, {xs[-1]:.3g}]: "
                         "add step counts to the control")
    return np.array([np.interp(x, xs, ys[:, j]) for j in range(ys.shape[1])])


def control_margin(df: pd.DataFrame, method: str, by: str = "speedup") -> Interval:
    """PSNR of ``method`` minus the fewer-step control's at the method's own ``by`` (``"speedup"`` or
    ``"flops"``), mean over prompts in dB, with a paired bootstrap interval over prompts (the uncertainty of
    the method's speed-up itself is not propagated: read it from its own interval)."""
    ctrl = control_psnr_at(control_rows(df), float(df.loc[method, by]), by)
    return difference_interval(np.asarray(df.loc[method, "psnr_per_prompt"], dtype=np.float64), ctrl, "prompts")


def control_table(df: pd.DataFrame) -> pd.DataFrame:
    """For every method that is not a control row: ``ctrl_psnr_speedup`` / ``margin_speedup`` (+ ``_lo`` /
    ``_hi``) at its wall-clock speed-up and the same at its FLOPs fraction (``..._flops``); NaN with the
    reason in ``ctrl_note`` where the method lies outside the control's range."""
    ctrl = control_rows(df)
    out = []
    for m in df.index:
        if str(m).startswith(PREFIX) or not np.isfinite(df.loc[m].get("psnr", np.nan)):
            continue
        row, notes = {"method": m}, []
        for by in ("speedup", "flops"):
            try:
                c = control_psnr_at(ctrl, float(df.loc[m, by]), by)
                iv = control_margin(df, m, by)
                row |= {f"ctrl_psnr_{by}": float(c.mean()), f"margin_{by}": iv.value,
                        f"margin_{by}_lo": iv.lo, f"margin_{by}_hi": iv.hi}
            except ValueError as e:
                row |= dict.fromkeys([f"ctrl_psnr_{by}", f"margin_{by}", f"margin_{by}_lo", f"margin_{by}_hi"], np.nan)
                notes.append(f"{by}: {e}")
        out.append(row | {"ctrl_note": "; ".join(notes)})
    return pd.DataFrame(out).set_index("method")
