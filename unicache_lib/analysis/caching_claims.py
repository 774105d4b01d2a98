"""The caching lessons' claims as data, and their measurements on a :class:`~unicache_lib.scoreboard.Scoreboard`, so
each notebook's scoreboard cell reads as a few calls (notebook 05: KV eviction, U7 and E1-E4; notebook 06:
cross-step reuse, R1-R3, G3 and G8).

:data:`EVICTION_RULES` and :data:`REUSE_RULES` are the two lessons' rules, made from :mod:`unicache_lib.claims` (each
claim and its rule written once there), fixed before any number is computed; :func:`declare` writes them on a board. :func:`measure_eviction` and :func:`measure_reuse` record the
measurements from the tables the notebooks built, or mark a claim "not measurable here" with the reason (a budget
or generator left out by parameter, too few timing rounds, a family without an image grid). The
measurement -> action tables (and 06's printed recap) are built here too (:func:`eviction_decisions`,
:func:`reuse_recap`, :func:`reuse_decisions`), from the same tables.

Units resampled: questions (paired) for eviction, prompts for quality, timing rounds for wall-clock.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from ..claims import NEW, NEW_REUSE, REGISTRY, decision_rows, read, rules_of
from ..intervals import MIN_TIMING_REPEATS, Interval, bootstrap, mean_interval
from ..tables import WrappedTable
from ..scoreboard import Criterion, Measurement
from ..reuse.evaluate import readings, worst_generator, worst_pareto_gap
from ..kv.evaluate import against_peers, share_of_full, worst_peer_difference
from .understanding_claims import scene_type_note

MILD = "step_skip (stride 2)"
DECISIVE = Path(__file__).resolve().parents[2] / "benchmarks" / "results"  # make evaluate's committed results
SETTLED = Path(__file__).resolve().parents[2] / "data" / "replicate" / "settled.csv"  # make settle's committed reruns
PEERS = ("divprune", "fastv", "snapkv", "h2o", "streaming")  # the eviction peers beside every kvpress press
ATTENTION_LEVEL = ("adaptive", "every_2", "static_last_third", "text_side")  # the study's attention-level schedules

EVICTION_RULES = rules_of("05_kv_eviction")
REUSE_RULES = rules_of("06_step_reuse")


def settled_u7(model_name: str, path=None) -> Interval | None:
    """U7's interval from ``make settle``'s committed rerun of notebook 05 on more questions
    (``data/replicate/settled.csv``; the rerun is of the shipped ``tiny-llava``), None for another model or none."""
    path = Path(path or SETTLED)
    if model_name != "tiny-llava" or not path.exists():
        return None
    d = pd.read_csv(path).query("notebook == '05_kv_eviction' and claim == 'U7'")
    if not len(d):
        return None
    r = d.iloc[-1]
    return Interval(float(r.value), float(r.lo), float(r.hi), int(r.n), str(r.unit))


def _by_verdict(a: str, b: str, verdicts: dict, flip: bool = False) -> str:
    """``{budget: verdict}`` of ``a`` minus ``b``'s paired intervals in words, budgets grouped by verdict: "a ahead of
    b at 10%, 25% (a tie at 50%)" (``flip``: the file's difference is ``b`` minus ``a``)."""
    at = {v: [f"{x:.0%}" for x, w in sorted(verdicts.items()) if w == v] for v in ("ahead", "behind", "tie")}
    if flip:
        at["ahead"], at["behind"] = at["behind"], at["ahead"]
    lead = [f"{word} {b} at {', '.join(at[v])}" for v, word in (("ahead", "ahead of"), ("behind", "behind"))
            if at[v]]
    return (f"{a} and {b} tie at {', '.join(at['tie'])}" if not lead
            else f"{a} " + ", ".join(lead) + (f" (a tie at {', '.join(at['tie'])})" if at["tie"] else ""))


def cover_finding(results=None) -> str:
    """What 05's decisive run (``make evaluate``, 2,700 held-out questions) found for the two best covers and their
    rivals, in words with the budgets and no number (the appendix, docs/EVICTION_APPENDIX.md, prints the intervals),
    generated from the committed results, never typed, each by its paired interval at every budget measured:
    ``key_coverage_merge`` against ``key_coverage`` (``merge_eviction.csv``), ``key_coverage`` against DivPrune
    (``evaluate_controls.csv``) and against ``key_coverage_prefill`` (``prefill_cover.csv``). "" where none is
    committed."""
    out, root = [], Path(results or DECISIVE)
    for name, what, query, flip in (  # what: (a, b); flip: the file's difference is b minus a
            ("merge_eviction.csv", (f"{NEW}_merge", NEW), f"kind == 'minus' and method == '{NEW}'", False),
            ("evaluate_controls.csv", (NEW, "DivPrune"), "peer == 'divprune'", False),
            ("prefill_cover.csv", (NEW, f"{NEW}_prefill"), f"kind == 'minus' and method == '{NEW}'", True)):
        path = root / name
        d = pd.read_csv(path).query(query) if path.exists() else pd.DataFrame()
        if len(d) and ("model" not in d or (d.model == "tiny-llava").all()):
            out.append(_by_verdict(*what, dict(zip(d.budget, d.verdict)), flip))
    return ("the decisive run: " + "; ".join(out)) if out else ""  # its intervals: the appendix


def budget_label(budget: float, n_image: int | None, sep: str = " ") -> str:
    """A budget as a share and, where the model has a fixed number of image tokens, a token count:
    ``"10% (6 tokens)"`` on tiny-llava, ``"11% (64 tokens)"`` on LLaVA-1.5's 576."""
    return f"{budget:.0%}" + (f"{sep}({round(budget * n_image)} tokens)" if n_image else "")


def declare(board, rules: dict) -> None:
    """Write every rule of ``rules`` (:data:`EVICTION_RULES` or :data:`REUSE_RULES`) on ``board``, before any
    measurement."""
    board.declare(rules)


def decisive_file(table: str, model_name: str, results=None) -> Path:
    """Where ``make evaluate`` keeps a model's decisive ``table``: ``evaluate_<table>.csv`` for the shipped
    ``tiny-llava``, ``evaluate_<table>_<model>.csv`` for any other (``make evaluate MODEL=tiny-llava-576``), so a run on
    one model never replaces another's."""
    slug = "" if model_name == "tiny-llava" else "_" + re.sub(r"[^A-Za-z0-9.-]+", "-", str(model_name)).strip("-")
    return Path(results or DECISIVE) / f"evaluate_{table}{slug}.csv"


def decisive(model_name: str, table: str = "eviction", results=None) -> pd.DataFrame | None:
    """A committed decisive run (``make evaluate``: :func:`decisive_file`; ``eviction``: one row per claim E1-E4,
    indexed by claim; ``controls``: :func:`controls_table` on its questions) when it was run on ``model_name``; None
    otherwise (no such file, or another model)."""
    path = decisive_file(table, model_name, results)
    if not path.exists():
        return None
    d = pd.read_csv(path)
    return None if not len(d) or not (d.model == model_name).all() else d.set_index("claim") if table == "eviction" else d


def decisive_reuse(generators: list[str], steps: int, guidance: float, results=None) -> pd.DataFrame | None:
    """The committed decisive reuse run (``make evaluate-reuse``: ``benchmarks/results/evaluate_reuse.csv``, one row
    per claim and criterion, indexed by both) when it was run on these generators at these settings; else None."""
    path = Path(results or DECISIVE) / "evaluate_reuse.csv"
    if not path.exists():
        return None
    d = pd.read_csv(path, keep_default_na=False, na_values=[""])
    d["criterion"] = d["criterion"].fillna("")
    return (None if not len(d) or not ((d.generators == ",".join(generators)) & (d.steps == steps)
                                       & (d.guidance == guidance)).all() else d.set_index(["claim", "criterion"]))


def _overrule(board, decisive: pd.DataFrame, run: str) -> None:
    """Decide every (claim, criterion) the decisive run measured on its interval, this run's beside it."""
    for (cid, crit), d in decisive.iterrows():
        row = board.rows.get(cid)
        if row is None or crit not in row.criteria or pd.isna(d.value):
            continue
        mine = row.measured.get(crit)
        tag = f"({crit}) " if len(row.criteria) > 1 else ""
        row.measured[crit] = Measurement(float(d.value), float(d.lo), float(d.hi), int(d.n), str(d.unit))
        beside = (f"; this run's {mine.n}: {mine.value:.3g} [{mine.lo:.3g}, {mine.hi:.3g}]"
                  if mine is not None and mine.value is not None else "")
        row.shown = f"{tag}decided by the decisive run ({run}, {int(d.n)} new {d.unit}{beside})" + (
            f"; {row.shown}" if row.shown else "")


def measure_eviction(board, R: pd.DataFrame, budgets, u7: Interval | None, peer_methods: list[str],
                     grid_note: str | None = None, decisive: pd.DataFrame | None = None,
                     settled: Interval | None = None) -> None:
    """U7 and E1-E4 from the eviction rows ``R`` (:func:`~unicache_lib.kv.evaluate.run_eviction`). ``u7``: the paired
    interval of locality-shallow minus swapped (None with ``grid_note``, the reason: the family's image tokens form
    no grid); ``peer_methods``: the peers E4 compares with. ``decisive`` (:func:`decisive`): where it has a
    claim, that claim is decided on the decisive run's interval and its row says so, with this run's beside it;
    ``settled`` (:func:`settled_u7`): U7 decided on ``make settle``'s rerun on more questions, this run's beside it."""
    if u7 is None:
        board.measure("U7", None, note=grid_note or "not measured")
    elif settled is not None:
        board.measure("U7", settled, shown=f"decided by the settled run (make settle, {settled.n} questions); this "
                      f"run's {u7.n}: {100 * u7.value:+.1f} pt [{100 * u7.lo:+.1f}, {100 * u7.hi:+.1f}]")
    else:
        board.measure("U7", u7, shown=f"vs swapped {100 * u7.value:+.1f} pt (mean over {len(budgets)} budgets)")

    def record(cid, iv: Interval, shown: str = "") -> None:
        if decisive is None or cid not in decisive.index or pd.isna(decisive.loc[cid].value):  # (not run there)
            return board.measure(cid, iv, shown=shown)
        d = decisive.loc[cid]
        board.measure(cid, Interval(float(d.value), float(d.lo), float(d.hi), int(d.n), str(d.unit)),
                      shown=f"decided by the decisive run (make evaluate, {int(d.n)} new {d.unit}"
                      + (f"; {d.shown}" if isinstance(d.shown, str) and d.shown else "") + f"); this run's {iv.n}: "
                      f"{iv.value:.3f} [{iv.lo:.3f}, {iv.hi:.3f}]" + (f", {shown}" if shown else ""))

    full = R[R.method == "full"].correct
    for cid, b in (("E1", 0.25), ("E2", 0.1)):
        if b in budgets and full.any():
            record(cid, share_of_full(R, NEW, b), f"{R[(R.method == NEW) & (R.budget == b)].correct.mean():.3f} "
                   f"vs full {full.mean():.3f}")
        else:
            board.measure(cid, None, note=f"budget {b} not in BUDGETS" if b not in budgets else "the full cache answers "
                          "nothing correctly, so a share of its accuracy is undefined")
    if 0.25 in budgets:
        record("E3", mean_interval(R[(R.method == NEW) & (R.budget == 0.25)].sort_values("question").kl, "questions"))
    else:
        board.measure("E3", None, note="budget 0.25 not in BUDGETS")
    vs = against_peers(R, NEW, peer_methods)
    if len(vs):
        w = vs.loc[vs["diff"].idxmin()]
        record("E4", worst_peer_difference(R, NEW, peer_methods), f"worst: {w.peer} at {w.budget:.0%} "
               f"({w['diff']:+.3f}); ahead in {(vs.verdict == 'ahead').sum()} of {len(vs)} cells, behind in "
               f"{(vs.verdict == 'behind').sum()}")
    else:
        board.measure("E4", None, note="no peer ran (PEERS=False and no peer policy)")


def _not_measured(board, claims: dict, note: str) -> None:
    for cid, crits in claims.items():
        for crit in crits:
            board.measure(cid, None, criterion=crit, note=note)


def measure_reuse(board, RU: dict, CT: dict, pareto: dict, families: dict, repeats: int,
                  decisive: pd.DataFrame | None = None) -> None:
    """R1-R3, G3 and G8 from the per-generator reuse tables ``RU`` (:func:`~unicache_lib.reuse.evaluate.run_reuse`),
    their control tables ``CT`` (:func:`~unicache_lib.reuse.control.control_table`), the Pareto checks ``pareto``
    (``(generator, "speedup" | "flops") -> table``, :func:`~unicache_lib.reuse.evaluate.pareto_check`), the families
    (generator -> family name) and the number of timing rounds. ``decisive`` (:func:`decisive_reuse`): every claim
    and criterion it measured is decided on its interval, and the row says so with this run's beside it."""
    _measure_reuse(board, RU, CT, pareto, families, repeats)
    if decisive is not None:
        _overrule(board, decisive, "make evaluate-reuse")


def _measure_reuse(board, RU: dict, CT: dict, pareto: dict, families: dict, repeats: int) -> None:
    gens = list(RU)
    timed = repeats >= MIN_TIMING_REPEATS
    few = f"{repeats} timing rounds; a wall-clock verdict needs >= {MIN_TIMING_REPEATS}"
    if not gens:
        _not_measured(board, {"R1": "ab", "R2": [None], "R3": "ab", "G3": "ab", "G8": "ab"}, "GENERATORS is empty")
        return
    if all(NEW_REUSE in RU[g].index for g in gens):
        slow = min(gens, key=lambda g: RU[g].loc[NEW_REUSE, "speedup"])
        s = RU[slow].loc[NEW_REUSE]
        shown = ", ".join(f"{g}: {RU[g].loc[NEW_REUSE, 'speedup']:.2f}x at {RU[g].loc[NEW_REUSE, 'psnr']:.1f} dB" for g in gens)
        board.measure("R1", Interval(s.speedup, s.speedup_lo, s.speedup_hi, repeats, "timing rounds") if timed else None,
                      criterion="a", shown=shown, note="" if timed else few)
        low = min(gens, key=lambda g: RU[g].loc[NEW_REUSE, "psnr"])
        board.measure("R1", mean_interval(np.asarray(RU[low].loc[NEW_REUSE, "psnr_per_prompt"], float), "prompts"), criterion="b")
        margins = {g: CT[g].loc[NEW_REUSE] for g in gens}
        if all(np.isfinite(m.margin_speedup) for m in margins.values()) and timed:
            g2 = min(margins, key=lambda g: margins[g].margin_speedup)
            m2 = margins[g2]
            board.measure("R2", Interval(m2.margin_speedup, m2.margin_speedup_lo, m2.margin_speedup_hi,
                                         len(RU[g2].loc[NEW_REUSE, "psnr_per_prompt"]), "prompts"),
                          shown=", ".join(f"{g}: {m.margin_speedup:+.1f} dB at equal time, {m.margin_flops:+.1f} dB at "
                                          "equal FLOPs" for g, m in margins.items()))
        else:
            board.measure("R2", None, note="; ".join(f"{g}: {m.ctrl_note}" for g, m in margins.items() if m.ctrl_note) or few)
        for crit, by in (("a", "speedup"), ("b", "flops")):
            if by == "speedup" and not timed:
                board.measure("R3", None, criterion=crit, note=few)
                continue
            iv, worst, unmatched = worst_pareto_gap(RU, {g: pareto[(g, by)] for g in gens})
            if iv is None:
                board.measure("R3", None, criterion=crit, note="no diffusers cache ran" if not unmatched else
                              f"saves more than every {NEW_REUSE} setting: {', '.join(unmatched)}")
                continue
            board.measure("R3", iv, criterion=crit, shown=f"({crit}) closest: {worst[1]} on {worst[0]} vs {worst[2]} "
                          f"({worst[3]:+.1f} dB)", note=f"not compared, saving more than every {NEW_REUSE} setting: "
                          f"{', '.join(unmatched)}" if unmatched else "")
    else:
        _not_measured(board, {"R1": "ab", "R2": [None], "R3": "ab"}, f"{NEW_REUSE} did not run on every generator")
    last = "static_last_third"
    if all(RU[g].loc[last, "computed"] < 1 for g in gens):
        board.measure("G3", worst_generator(RU, last), criterion="a")
    else:
        board.measure("G3", None, criterion="a", note="the last-third schedule reuses nothing at this step count on some generator")
    board.measure("G3", worst_generator(RU, last, minus="every_2"), criterion="b", shown="; ".join(
        f"{g}: last third SSIM {RU[g].loc[last, 'ssim']:.3f} at {RU[g].loc[last, 'computed']:.0%} computed, every 2nd "
        f"{RU[g].loc['every_2', 'ssim']:.3f}" for g in gens))
    joint = [g for g in gens if families[g] in ("sd3", "flux")]  # text-side reuse needs a joint text stream
    if not joint:
        _not_measured(board, {"G8": "ab"}, "no joint-attention generator in GENERATORS")
        return
    t = RU[joint[0]].loc["text_side"]
    board.measure("G8", Interval(t.speedup, t.speedup_lo, t.speedup_hi, repeats, "timing rounds") if timed else None,
                  criterion="a", note="" if timed else few)
    board.measure("G8", worst_generator({joint[0]: RU[joint[0]]}, "text_side"), criterion="b",
                  shown=f"{joint[0]}: speed-up {t.speedup:.2f}x [{t.speedup_lo:.2f}, {t.speedup_hi:.2f}], SSIM {t.ssim:.3f}, "
                  f"{t.computed:.0%} of attention computed")


CONTROLS = {"pooling": "the control: average-pooled image features",
            "downsample": "the control: the picture downsampled, through the vision tower",
            "key_coverage_features": "place: the same cover, on the features before the prefill",
            "divprune_keys": "rule: DivPrune's max-min, on the same cached keys",
            "divprune": "both: DivPrune's rule on the features (the peer)"}


SCREEN_BAR = 0.6  # 05 §4's bar, fixed before the run: the simulation screens policies usefully where rho is above it


def simulation_rho(R: pd.DataFrame) -> Interval | None:
    """Spearman's rho between the simulated ``retained`` attention and real accuracy over the (policy, budget) cells of
    a :func:`~unicache_lib.kv.evaluate.run_eviction` run (the full cache and the presses left out), with its BCa
    interval over questions: each resample recomputes every cell's two means from the same questions. None where rho
    is not defined (accuracy or retained attention the same in every cell: a model that yields nothing)."""
    d = R[(R.kind == "policy") & (R.method != "full")]
    acc, ret = (d.pivot_table(index=["method", "budget"], columns="question", values=v).to_numpy(np.float64)
                for v in ("correct", "retained"))
    rho = lambda q: spearmanr(ret[:, q].mean(1), acc[:, q].mean(1)).statistic  # noqa: E731
    return bootstrap(range(acc.shape[1]), rho, "questions") if np.isfinite(rho(list(range(acc.shape[1])))) else None


def screen_verdict(rho: Interval | None) -> str:
    """05 §4's reading of :func:`simulation_rho` against :data:`SCREEN_BAR`, on its interval."""
    return ("is not measurable here" if rho is None else "ranks policies usefully" if rho.lo > SCREEN_BAR else
            "ranks policies poorly" if rho.hi < SCREEN_BAR else "may or may not rank usefully (interval across the bar)")


def scene_kind(scene: pd.Series) -> np.ndarray:
    """05's hard cases: each row's scene kind, "clutter" or "other scenes" from its question's ``scene_type``;
    "no scene_type" where the sample gave none (your own samples: nothing to call cluttered or not)."""
    scene = scene.fillna("")
    return np.where(scene == "clutter", "clutter", np.where(scene == "", "no scene_type", "other scenes"))


def scene_kind_note(scene: pd.Series) -> str:
    """"" where clutter can be set against the other scenes (two scene types or more among ``scene``, one per
    question); else "; clutter against other scenes: not measurable with these samples: ..." saying what to add."""
    note = scene_type_note(dict(enumerate(scene.fillna(""))))
    return "" if note is None else f"; clutter against other scenes: {note}"


def controls_table(R: pd.DataFrame) -> pd.DataFrame:
    """``key_coverage`` against the pooling control and the two ablations (:data:`CONTROLS`), per budget: paired
    accuracy differences over questions with their interval (:func:`~unicache_lib.kv.evaluate.against_peers`) and
    what each comparison isolates."""
    t = against_peers(R, NEW, [m for m in CONTROLS if m in set(R.method)])
    return t.assign(isolates=t.peer.map(CONTROLS)) if len(t) else t


def accuracy_table(S: pd.DataFrame) -> pd.DataFrame:
    """Accuracy per method (rows, workbench policies and kvpress presses together) and budget (columns), from
    :func:`~unicache_lib.kv.evaluate.summary`."""
    return S["accuracy"].droplevel("kind").unstack("budget")


def score_rules(acc: pd.DataFrame) -> list[str]:
    """The score-based rules among ``acc``'s rows: those that keep the top positions by a per-position score
    (attention read, or key norm), the kvpress presses included; StreamingLLM keeps by recency and is not one."""
    return [m for m in acc.index if m in ("unicache", "h2o", "snapkv", "fastv")
            or (m.startswith("kvpress:") and "streaming" not in m)]


def below_random(acc: pd.DataFrame, budgets, rows: pd.DataFrame | None = None) -> dict:
    """budget -> the score-based rules (:func:`score_rules`) below ``random`` ({} without a random row): with the
    per-question ``rows`` of :func:`~unicache_lib.kv.evaluate.run_eviction`, those whose paired 95% interval of the
    accuracy difference over questions lies wholly below 0 (a point below random inside the noise is not counted);
    without, those whose accuracy is lower."""
    if "random" not in acc.index:
        return {}
    rules = score_rules(acc)
    if rows is None:
        return {b: [m for m in rules if acc.loc[m, b] < acc.loc["random", b]] for b in budgets}
    vs = pd.concat([against_peers(rows, m, ["random"]).assign(method=m) for m in rules], ignore_index=True)
    return {b: [m for m in rules if ((vs.method == m) & (vs.budget == b) & (vs.verdict == "behind")).any()]
            for b in budgets}


def _at(acc, m, b) -> float:
    return float(acc.loc[m, b]) if m in acc.index and b in acc.columns else float("nan")


def _sides(acc, a: str, b: str, budgets, n: int, rows=None) -> tuple[list, list]:
    """The budgets where ``a`` is ahead of ``b``, and where ``b`` is ahead: by the paired interval over questions
    (:func:`~unicache_lib.kv.evaluate.against_peers`) when the per-question ``rows`` are given, the lesson's rule; else
    by more than two of the ``n`` questions."""
    if rows is not None:
        t = against_peers(rows, a, [b])
        return ([x for x in budgets if (t[t.budget == x].verdict == "ahead").any()],
                [x for x in budgets if (t[t.budget == x].verdict == "behind").any()])
    gap = {x: (_at(acc, a, x) - _at(acc, b, x)) * n for x in budgets}  # nan where either did not run: neither list
    return ([x for x in budgets if np.isfinite(gap[x]) and round(gap[x]) > 2],
            [x for x in budgets if np.isfinite(gap[x]) and round(gap[x]) < -2])


def _listed(bs, budgets) -> str:
    return "every budget" if list(bs) == list(budgets) else ", ".join(f"{x:.0%}" for x in bs)


def _read_out(acc, budgets, n: int, pairs, rows=None) -> str:
    """In words, who is ahead of whom (:func:`_sides`), and where: ``pairs`` are ``(a, b)`` names; pairs with the
    same leader and budgets are said once ("key_coverage ahead of pooling and downsample at every budget")."""
    said, covered = {}, set()
    how = "interval above 0" if rows is not None else "more than two questions"
    for a, b in pairs:
        for lead, other, bs in zip((a, b), (b, a), _sides(acc, a, b, budgets, n, rows)):
            if bs:
                said.setdefault((lead, tuple(bs)), []).append(other)
                covered |= set(bs)
    if not said:
        return ("a tie at every budget (each interval across 0)" if rows is not None else
                "within two questions at every budget (a tie)")
    words = "; ".join(f"{lead} ahead of {' and '.join(others)} at {_listed(bs, budgets)}"
                      for (lead, bs), others in said.items())
    return words + (f" ({how}); a tie elsewhere" if covered != set(budgets) else f" ({how})")


def _largest(acc, budgets, base: str, others) -> float:
    """The budget where ``base`` and ``others`` differ most (the smallest such budget on a tie; nan counts as 0)."""
    return max(budgets, key=lambda x: max(np.nan_to_num(abs(_at(acc, base, x) - _at(acc, o, x))) for o in others))


def _random_row(acc, budgets, n: int, rows=None) -> str:
    """Row 5's value: random minus ``unicache`` at the smallest budget, and, where random is ahead (:func:`_sides`), at
    which budgets and by how much at most (its point: random beating a score-based rule)."""
    d = {b: 100 * (_at(acc, "random", b) - _at(acc, "unicache", b)) for b in budgets}
    ahead, behind = _sides(acc, "random", "unicache", budgets, n, rows)
    text = f"{budgets[0]:.0%}: {d[budgets[0]]:+.1f} pt"
    text += (f"; random ahead of unicache at {_listed(ahead, budgets)} (up to {max(d[b] for b in ahead):+.1f} pt)"
             if ahead else "; random never ahead of unicache (no interval above 0)" if rows is not None else
             "; random never ahead of unicache by more than two questions")
    return text + "; other budgets: accuracy.csv"


def _control_ties(acc, budgets, n: int, ctls, rows, results) -> str:
    """Where a control ties ``key_coverage`` in this run (:func:`_sides`), what the decisive run's paired interval
    says at those budgets (``evaluate_controls.csv``): "" where no control ties."""
    dc, said = decisive("tiny-llava", "controls", results), []
    for c in ctls:
        ahead, behind = _sides(acc, NEW, c, budgets, n, rows)
        ties = [b for b in budgets if b not in ahead + behind]
        if ties:
            there = (dc[(dc.peer == c) & dc.budget.isin(ties)] if dc is not None else pd.DataFrame(columns=["verdict"]))
            said.append(f"here {c} ties at {_listed(ties, budgets)}" + (
                f", but the decisive run puts {NEW} ahead there: keep it" if len(there) == len(ties) and (there.verdict == "ahead").all()
                else ""))
    return ("; " + "; ".join(said)) if said else ""


def eviction_decisions(acc: pd.DataFrame, budgets, n: int, u7: Interval | None, rho: Interval | float,
                       u7_run: str = "", results=None, rows: pd.DataFrame | None = None):
    """The measurement -> action table of the eviction lesson (a :class:`~unicache_lib.tables.WrappedTable`), at most
    eight rows and 40 printed lines (tests/test_output_limits.py); the literature's-scale run (64 and 128 tokens on
    tiny-llava-576) is read in docs/EVICTION_APPENDIX.md, not here. ``u7``: the interval U7 is decided on, ``u7_run`` the run it comes from (the settled
    one, :func:`settled_u7`, where committed). The advice about the covers chosen before the prefill comes from the
    larger runs (:func:`cover_finding`, ``results``), not from this run's ties. ``rows``: the run's per-question rows
    (:func:`~unicache_lib.kv.evaluate.run_eviction`): who is ahead is then read on paired intervals, as the lesson reads
    them."""
    full, out, value, picks, tied = _at(acc, "full", budgets[0]), [], "", [], True
    for b in budgets:  # the two best per budget; the row prints the smallest budget's (at most four numbers a row)
        cand = {m: _at(acc, m, b) for m in (NEW, f"{NEW}_merge", "divprune", "h2o", "snapkv", "unicache", "random",
                                             "kvpress:expected_attention")}
        cand = {m: v for m, v in cand.items() if np.isfinite(v)}
        best, second = sorted(cand, key=cand.get, reverse=True)[:2]
        ahead = bool(_sides(acc, best, second, [b], n, rows)[0])  # the paired interval (or, without rows, 2 questions)
        value = value or f"{b:.0%}: {best} {cand[best]:.3f}, {second} {cand[second]:.3f}"
        picks.append(best if ahead else f"{best} or {second}")
        tied &= not ahead
    tie = "intervals across 0" if rows is not None else "within two questions"
    act = (f"a tie at every budget ({tie})" if tied
           else f"pick {picks[0]} at every budget" if len(set(picks)) == 1
           else f"the best differs by budget (smallest first: {'; '.join(picks)}; a tie: {tie})")
    larger = cover_finding(results)
    out.append({"measurement": f"accuracy at the smallest budget, the two best (full {full:.3f}; every budget: "
                                "accuracy.csv)",
                "value here": value,
                "what it suggests on your model": act + (f". {larger[0].upper()}{larger[1:]}. At your budget, pick the "
                                                         "one ahead" if larger else ""),
                "where": "§2-§3: MODEL, BUDGETS, N_EVICTION; appendix"})
    # rows 2-5 print one budget's values (at most four numbers a row), say in words who leads where, and leave the
    # other budgets to accuracy.csv (the lesson writes it in §2)
    b0 = budgets[0]
    ctls = [c for c in ("pooling", "downsample") if c in acc.index]
    if ctls:
        out.append({"measurement": f"{NEW} minus the {' / '.join(ctls)} control",
                     "value here": f"{b0:.0%}: " + " / ".join(f"{100 * (_at(acc, NEW, b0) - _at(acc, c, b0)):+.1f}"
                                                             for c in ctls) + " pt; "
                     + _read_out(acc, budgets, n, [(NEW, c) for c in ctls], rows) + "; other budgets: accuracy.csv",
                     "what it suggests on your model": "where a control ties the designed policy, use it (simpler)"
                     + _control_ties(acc, budgets, n, ctls, rows, results),
                     "where": "§3, " + ", ".join(f"POLICIES['{c}']" for c in ctls)})
    var = [v for v in ("key_coverage_prefill", "key_coverage_merge") if v in acc.index]
    if var:  # the cover moved before the prefill; the evicted image KV merged into the kept instead of dropped
        out.append({"measurement": f"{' / '.join(var)} minus {NEW}",
                     "value here": (lambda b: f"{b:.0%} (the largest gap): " + " / ".join(
                         f"{100 * (_at(acc, v, b) - _at(acc, NEW, b)):+.1f}" for v in var) + " pt; ")(
                         _largest(acc, budgets, NEW, var))
                     + _read_out(acc, budgets, n, [(v, NEW) for v in var], rows) + "; other budgets: accuracy.csv",
                     "what it suggests on your model": "row 1's decisive run decides: cover after the prefill; merge "
                     "where it leads",
                     "where": "§3, kv/policies/key_coverage_prefill.py, merge.py"})
    halves = ("key_coverage_features", "divprune_keys")
    if set(halves) <= set(acc.index):
        out.append({"measurement": f"{NEW} minus each half swapped (place: its cover on the features / rule: DivPrune's "
                     "on the keys)",
                     "value here": (lambda b: f"{b:.0%} (the largest gap): " + " / ".join(
                         f"{100 * (_at(acc, NEW, b) - _at(acc, h, b)):+.1f}" for h in halves) + " pt; ")(
                         _largest(acc, budgets, NEW, halves))
                     + _read_out(acc, budgets, n, [(NEW, h) for h in halves], rows) + "; other budgets: accuracy.csv",
                     "what it suggests on your model": "the decisive runs decide: the rule carries the gain; the place ties "
                     "on tiny-llava but loses at 576 tokens (appendix): keep both halves", "where": "§3, kv/policies/ablations.py; appendix"})
    if {"random", "unicache"} <= set(acc.index):
        out.append({"measurement": "random minus the study's rule (unicache)",
                     "value here": _random_row(acc, budgets, n, rows),
                     "what it suggests on your model": "if random ties or beats a score-based rule, the most-read "
                     "positions cluster: use a coverage policy", "where": "§2, notebook 02 (Gini, anchors)"})
    if u7 is not None:  # what to do, and where, is U7's advice (unicache_lib/claims.py); the verdict by its own rule
        verdict = Criterion(**REGISTRY["U7"].criteria[""]).decide(u7.lo, u7.hi)
        out += decision_rows([("U7", "U7: locality-shallow minus swapped" + (f" ({u7_run})" if u7_run else ""),
                                f"{100 * u7.value:+.1f} pt [{100 * u7.lo:+.1f}, {100 * u7.hi:+.1f}]")],
                              "05_kv_eviction", {"U7": verdict})
    out.append({"measurement": "rho(retained, accuracy)", "value here": f"{rho.value:.2f} [{rho.lo:.2f}, {rho.hi:.2f}]"
                 if isinstance(rho, Interval) else f"{rho:.2f}", "what it suggests on your model": f"the whole interval "
                 f"above {SCREEN_BAR}: screen policies with the simulation, confirm the best few on real answers",
                 "where": "§4"})
    return WrappedTable(pd.DataFrame(out))


def reuse_recap(RU: dict, CT: dict, shares: dict, board) -> list[str]:
    """The reuse lesson's recap, one line per generator and the verdicts, printed from this run's numbers."""
    lines = []
    for g in RU:
        r, c = RU[g].loc[NEW_REUSE], CT[g].loc[NEW_REUSE]
        caches = CT[g].loc[[m for m in CT[g].index if str(m).startswith("diffusers:")], "margin_flops"]
        dif, outside = caches.dropna(), list(caches[caches.isna()].index)
        lines.append(f"{g}: {NEW_REUSE} {r.psnr:.1f} dB at {r.speedup:.2f}x ({r.flops:.2f} of the FLOPs), {c.margin_flops:+.1f} "
                     f"dB over fewer steps at equal FLOPs" + (f"; diffusers caches (default settings) {dif.min():+.1f} to "
                     f"{dif.max():+.1f} dB against the same control at equal FLOPs, {len(dif)} of {len(caches)} in its range"
                     + (f" ({', '.join(outside)} outside)" if outside else "") if len(dif) else "")
                     + (f"; attention is {shares[g]['share']:.0%} of a run (attention-only cap {shares[g]['cap']:.2f}x)."
                        if g in shares else "."))
    lines.append("Verdicts: " + "; ".join(f"{c} {read(c, r.verdict)}" for c, r in board.rows.items()))  # with meanings
    return lines


def _group_margins(CT: dict, members) -> tuple[str, float]:
    """Per generator, the range of a group's margins over fewer steps at equal FLOPs and how many are in range; and
    the best margin (NaN: none in range)."""
    parts, best = [], np.nan
    for g, t in CT.items():
        col = t.loc[[m for m in t.index if members(str(m))], "margin_flops"]
        inside = col.dropna()
        best = np.nanmax([best, inside.max()]) if len(inside) else best
        parts.append(f"{g}: " + (f"{inside.min():+.1f} to {inside.max():+.1f} dB" if len(inside) else "none in range")
                     + f" ({len(inside)} of {len(col)} in range)")
    return "; ".join(parts), best


def reuse_decisions(RU: dict, CT: dict, shares: dict):
    """The measurement -> action table of the reuse lesson (a :class:`~unicache_lib.tables.WrappedTable`), at most eight
    rows for two generators (tests/test_output_limits.py): per generator its ``step_skip`` margin and its bit-identical
    methods, then one row each for attention's share, the diffusers caches, the attention-level schedules and G3."""
    rows = []
    for g in RU:
        c = CT[g].loc[NEW_REUSE]
        timed = bool(np.isfinite(c.margin_speedup))  # NaN: this run's speed-up lies outside the control's range
        wall = (f"{c.margin_speedup:+.1f} [{c.margin_speedup_lo:+.1f}, {c.margin_speedup_hi:+.1f}] dB" if timed
                else "outside the control's range")
        rows.append({"measurement": f"{g}: {NEW_REUSE} over fewer steps at equal FLOPs / wall-clock",
                     "value here": f"{c.margin_flops:+.1f} [{c.margin_flops_lo:+.1f}, {c.margin_flops_hi:+.1f}] dB / {wall}",
                     "what it suggests on your model": ("use step_skip: it beats fewer steps here at equal FLOPs (interval "
                     "above 0)" + ("" if c.margin_speedup_lo > 0 else ", at equal wall-clock not settled (interval across 0)"
                                   if timed else ", at equal wall-clock not measured (speed-up outside the control's range)")
                     + "; tune its schedule on your design prompts" if c.margin_flops_lo > 0 else "sample with fewer steps: "
                     "step_skip does not beat it here (tune its schedule on design prompts before trying again)")
                     + "; a diffusers cache must clear the same control before you adopt it",
                     "where": "§3: GENERATORS, STEPS, FEWER_STEPS"})
        noop = readings(RU[g])
        noop = list(noop[noop.str.startswith("no-op on this family")].index)
        if noop:
            rows.append({"measurement": f"{g}: methods bit-identical to no reuse", "value here": ", ".join(noop),
                         "what it suggests on your model": "exact caches on this family (e.g. cross-attention text K/V): "
                         "always on, they save only their projections", "where": "§2 (the bit-identical lines)"})
    shared = [g for g in RU if g in shares]  # one row for every generator: the table stays within eight rows
    if shared:
        rows.append({"measurement": "attention share of a sampling run",
                     "value here": ", ".join(f"{g} {shares[g]['share']:.0%}" for g in shared),
                     "what it suggests on your model": "attention-only reuse can reach at most "
                     + ", ".join(f"{shares[g]['cap']:.2f}x ({g})" for g in shared) + ": to go further skip whole blocks "
                     "or steps", "where": "§4 (attention_share)"})
    beaten = "below the control where comparable: at these settings sample with fewer steps instead"
    for what, members, act, where in (
            ("diffusers caches", lambda m: m.startswith("diffusers:"),
             "; re-tune a cache and re-measure it against this control before adopting it", "§3 (control_table)"),
            ("attention-level schedules", lambda m: m in ATTENTION_LEVEL,
             "; attention-only reuse is also capped by attention's share (§4): skip whole steps", "§3, §4")):
        value, best = _group_margins(CT, members)
        rows.append({"measurement": f"{what} over fewer steps at equal FLOPs", "value here": value,
                     "what it suggests on your model": (beaten if not best > 0 else "one clears the control at equal FLOPs: "
                     "check it at equal wall-clock too") + act, "where": where})
    last = [g for g in RU if {"static_last_third", "every_2"} <= set(RU[g].index)]
    if last:
        g = min(last, key=lambda g: RU[g].loc["static_last_third", "ssim"])
        late = CT[g].loc["static_last_third"] if "static_last_third" in CT[g].index else pd.Series(dtype=float)
        m, lo = late.get("margin_flops", np.nan), late.get("margin_flops_lo", np.nan)
        rows.append({"measurement": "G3: SSIM of reuse in the last third only / every 2nd step (weaker generator), at unequal work",
                     "value here": f"{g}: {RU[g].loc['static_last_third', 'ssim']:.3f} at {RU[g].loc['static_last_third', 'flops']:.2f}"
                                   f" of the FLOPs / {RU[g].loc['every_2', 'ssim']:.3f} at {RU[g].loc['every_2', 'flops']:.2f}",
                     "what it suggests on your model": ("late-only reuse keeps quality but saves too little to be placed "
                     "against fewer steps: no reason to adopt it" if not np.isfinite(m) else f"late-only reuse is {m:+.1f} dB "
                     "over fewer steps at equal FLOPs: " + ("it clears the control" if lo > 0 else "sample with fewer steps "
                     "instead")), "where": "§2, §5 (G3)"})
    return WrappedTable(pd.DataFrame(rows))


def depth_rule_lines(dv: pd.DataFrame) -> list[str]:
    """One line per rule of a committed depth-budget run (:func:`decisive` ``(model, "depth")``, DEPTH_RULES' order):
    the schedule, the budget, what is measured, the value with its interval, the bar and the verdict."""
    out = []
    for r in dv.itertuples():
        if r.against == "full":
            what, f, bar = "share of full accuracy", "{:.3f}", f"> {r.threshold:g}"
        elif r.against.startswith("bytes"):  # the schedule's KV bytes over one budget per layer's, every question
            what, f, bar = f"KV bytes / {r.against.split()[-1]}'s", "{:.3f}", "= 1 on every question"
        else:
            what, f, bar = f"minus {r.against}", "{:+.3f}", f"> {r.threshold:g}"
        iv = "" if np.isnan(r.lo) else f" [{f.format(r.lo)}, {f.format(r.hi)}]"
        out.append(f"{r.claim} {r.method.split('@')[1]}, {r.tokens}t, {what}: {f.format(r.value)}{iv}, bar {bar} "
                   f"-> {r.verdict}")
    return out
