"""The claims scoreboard that closes every analysis notebook.

A notebook declares each claim's verdict rule *before* it measures (``board.rule(...)``), then
records the measurement (``board.measure(...)``); the verdict is computed from the rule, never
typed in. Claim texts paraphrase the study's write-ups (ids as in the project's CLAIMS list).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

VERDICTS = ("holds", "partly", "does not hold", "not measurable here")

CLAIMS: dict[str, str] = {
    "M1": "Statistics computed in fp16 are biased; compute them in fp32.",
    "M2": "With fixed seeds, attention statistics reproduce to 4 decimal places.",
    "M3": "Batching several samples and averaging washes out anchor positions; capture per sample.",
    "M4": "A fixed standard set of ~20 samples across scene types makes numbers comparable.",
    "U1": "Text-to-image reads are very uneven: a few image positions take most of them.",
    "U2a": "Shallow layers are local/positional; deep layers aggregate globally and spread out.",
    "U2b": "Shallow layers are near-uniform; deep layers focus (some heads' max weight > 0.45).",
    "U3": "Visual anchors persist across layers; moderately stable across images.",
    "U4": "Anchors sit on salient objects, unlike text attention sinks.",
    "U5": "Content words read the image far more than function words.",
    "U6": "Image reads rise while naming image content during decoding.",
    "U7": "Shallow-layer KV can be evicted by locality; deep-layer KV must be kept.",
    "U8": "Healthy layers: a few focused heads, the rest moderately spread.",
    "U9": "Image tokens dominate; text<->image share under ~15% means text is not reaching the image.",
    "U10": "A layer with cross-modal share under ~5% marks a modality cut-off.",
    "U11": "Object words attend to their object's patches.",
    "U12": "A noun whose attention barely covers the image is likely hallucinated.",
    "U13": "Low layers spread (~35% cross-modal), middle layers focus, high layers refine.",
    "G1": "Early denoising steps attend diffusely, late steps concentrate.",
    "G2": "Adjacent-step similarity is ~0.3-0.5 early and > 0.8 late.",
    "G3": "Reusing only in the last third of the steps loses almost no quality.",
    "G4": "In joint attention, text->image is stable across steps, image->text varies.",
    "G5": "Image tokens far outnumber text tokens: cache pressure is on the image side.",
    "G6": "Text conditioning is strongest early; long prompts collapse in middle steps.",
    "G7": "Generation models have more redundant heads than understanding models.",
    "G8": "Caching text-side features over similar steps cut latency ~15% with no visible loss.",
    "G9": "An object word's attention lands on the object's region.",
    "P1": "Pruning 10% of heads by attention statistics barely hurts; 20% starts to hurt.",
    "P2": "Scoring heads by attention statistics is more stable than by weight norms.",
    "P3": "Near-uniform shallow heads are not automatically redundant.",
}


def criteria_met(v: float) -> str:
    """Verdict for a rule of two criteria measured as how many are met: 2 holds, 1 partly."""
    return {2: "holds", 1: "partly"}.get(int(v), "does not hold")


@dataclass
class Row:
    claim: str
    rule_text: str
    decide: Callable[[float], str]
    value: float | None = None
    shown: str = ""
    n: int | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        if self.value is None or (isinstance(self.value, float) and math.isnan(self.value)):
            return "not measurable here"
        v = self.decide(self.value)
        if v not in VERDICTS:
            raise ValueError(f"rule for {self.claim} returned {v!r}, not one of {VERDICTS}")
        return v


class Scoreboard:
    """Rules first, then measurements, then ``table()`` (a pandas DataFrame)."""

    def __init__(self):
        self.rows: dict[str, Row] = {}

    def rule(self, claim: str, text: str, decide: Callable[[float], str]) -> None:
        if claim not in CLAIMS:
            raise KeyError(f"unknown claim id {claim!r}; known: {', '.join(CLAIMS)}")
        if claim in self.rows and self.rows[claim].value is not None:
            raise RuntimeError(f"the rule for {claim} must be written before its measurement")
        self.rows[claim] = Row(claim, text, decide)

    def measure(self, claim: str, value: float, n: int, shown: str | None = None, note: str = "") -> None:
        if claim not in self.rows:
            raise KeyError(f"write the verdict rule for {claim} (board.rule) before measuring it")
        r = self.rows[claim]
        r.value = float(value) if value is not None else None
        r.n, r.note = int(n), note
        r.shown = shown if shown is not None else (f"{value:.4g}" if value is not None else "-")

    def table(self):
        import pandas as pd

        missing = [c for c, r in self.rows.items() if r.value is None and not r.note]
        if missing:
            raise RuntimeError(f"claims with a rule but no measurement: {missing}")
        return pd.DataFrame([{
            "claim": r.claim, "statement": CLAIMS[r.claim], "measured": r.shown, "n": r.n,
            "rule": r.rule_text, "verdict": r.verdict, "note": r.note,
        } for r in self.rows.values()]).set_index("claim")

    def save(self, path) -> None:
        """Write the rows as JSON (atomically) for tests and the report."""
        import json

        from .store import _atomic_write_bytes

        rows = [{"claim": r.claim, "value": r.value, "shown": r.shown, "n": r.n, "rule": r.rule_text,
                 "verdict": r.verdict, "note": r.note} for r in self.rows.values()]
        from pathlib import Path

        _atomic_write_bytes(Path(path), json.dumps(rows, indent=1).encode())

    def verdicts(self) -> dict[str, str]:
        return {c: r.verdict for c, r in self.rows.items()}
