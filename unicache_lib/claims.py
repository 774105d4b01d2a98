"""Every claim the workbench rules on, each written once: what it says, why it matters for a cache, the lesson that
measures it, and its verdict rule, fixed before any number is computed.

A :class:`Claim` is the one source: the scoreboard's statements (:data:`CLAIMS`), each lesson's rules
(:func:`rules_of`, which ``analysis/*_claims.declare`` writes on a board), each lesson's claims table
(:func:`claims_table`, displayed by the notebook), the claim lists of ``docs/LAYOUT.md`` (:func:`ids_text`, filled by
``tools/doc_numbers.py``) and the tests' expectations of which rows each notebook writes are all made from it.
Adding a claim is one entry here plus the function that measures it (see docs/FORKING.md).

A claim also carries what its result means for the reader's model, written once beside it: :class:`Advice` (the
measurement → action, and the :class:`Place` to act: lesson, section, policy, parameter), from which every decision
table row about the claim is made (:func:`advice`, :func:`decision_rows`, :func:`decision_table`), and ``meaning``,
what each verdict means, shown beside it (:func:`read`; the scoreboard does) so that a claim whose failure is the
reader's good news reads forwards ("does not hold — fp16 is safe for these statistics").

A rule's text and thresholds may name a value known only when the lesson runs (``{k}`` in the text, ``"u3_bar"`` as
a threshold): :func:`rules_of` fills them from its keyword arguments and refuses a rule left unfilled.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .core.errors import InputError, UnknownNameError
from .core.scoring import FOCUSED
from .lessons import ids as lesson_ids
from .intervals import MIN_TIMING_REPEATS

# constants that are a claim's rule and also steer the code that measures it (imported from here, written once)
BIAS = 1e-4  # M1: a bias visible at the 4th decimal
STATISTICS = ("entropy", "max_weight", "sum_sq")  # M1: the row statistics computed in both precisions
NEGLECT_CUTOFF = 0.05  # U10: the study's cut-off, also the neglect detector's (diagnostics.neglect.CUTOFF)
NEGLECT_WARN = 0.15  # U9: text reads under this share of the image are not reaching it (diagnostics.neglect.WARN)
NEW, NEW_REUSE = "key_coverage", "step_skip"  # the designed policies the workbench's targets E1-E4 and R1-R3 are about
COURSE = lesson_ids()  # the course's lessons, from their sources (unicache_lib/lessons.py); LESSONS, those with claims,
# follows the registry below
DECISION_COLUMNS = ("measurement", "value here", "what it suggests on your model", "where")  # every decision table


@dataclass(frozen=True)
class Place:
    """Where a reader acts on a claim's result: a ``lesson`` (two digits, ``"05"``), its ``section`` (``## N.``), the
    ``policies`` to use there (names in ``kv.POLICIES`` or ``reuse.REUSE_POLICIES``), ``what`` is there (a few words),
    its ``params`` (names in the lesson's parameters cell) and ``also`` (an exercise, a function). tests/test_advice.py
    checks that the lesson has each of them. Shown as ``05 §3 (`key_coverage`), `BUDGETS```; inside its own lesson
    without the lesson's number (``§3 ...``)."""

    lesson: str
    section: int | None = None
    policies: tuple = ()
    what: str = ""
    params: tuple = ()
    also: tuple = ()

    def __post_init__(self):
        if COURSE and self.lesson not in {nb[:2] for nb in COURSE}:
            raise InputError(f"place {self.lesson!r}: a lesson is two digits, one of {', '.join(nb[:2] for nb in COURSE)}")

    def text(self, lesson: str | None = None) -> str:
        """As a decision table's "where" shows it; ``lesson``: the lesson showing it (its own places drop the number)."""
        own = lesson is not None and lesson[:2] == self.lesson
        head = " ".join(x for x in ("" if own else self.lesson, f"§{self.section}" if self.section else "") if x)
        inner = [f"`{p}`" for p in self.policies] + ([self.what] if self.what else [])
        head += f" ({', '.join(inner)})" if inner else ""
        tail = [f"`{p}`" for p in self.params] + list(self.also)
        return head + ((": " if head == self.lesson else ", " if head else "") + ", ".join(tail) if tail else "")


@dataclass(frozen=True)
class Advice:
    """What a claim's result means for the reader's own model, written once: ``act``, the measurement → action (which
    way the number points and what to do each way, read without any verdict); ``where``, the places to act
    (:class:`Place`); ``found``, what a later lesson measured about that action (``{"05 §8": "..."}``: a fixed result,
    e.g. a decisive run's), appended wherever the advice is shown. A lesson adds its own run's result where it measures
    it (``advice(..., found=...)``); the verdict's meaning (:attr:`Claim.meaning`) is added where a verdict is given."""

    act: str
    where: tuple[Place, ...]
    found: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Claim:
    """One claim. ``statement``: the study's claim paraphrased, or the workbench's own target (it starts with
    "Target:"); ``why``: what it decides for a cache (markdown, shown in the lesson's claims table); ``notebook``: the
    lesson that rules on it; ``rule``: what is measured, over which unit the 95% interval runs and the threshold(s);
    ``criteria``: ``{"": {"above": x}}`` for one criterion, ``{"a": {...}, "b": {...}}`` for several (each decided on
    its own interval); ``section``: where in the lesson it is measured; ``advice``: what its result means for the
    reader's model and where to act (:class:`Advice`; every decision-table row about the claim is made from it);
    ``meaning``: verdict -> what that verdict means for the reader, in a few words, shown beside the verdict (needed
    where the claim's failure is good news: "does not hold" must not read as a warning)."""

    id: str
    statement: str
    why: str
    notebook: str
    rule: str
    criteria: dict = field(default_factory=dict)
    section: str = ""
    advice: Advice | None = None
    meaning: dict = field(default_factory=dict)

    def __post_init__(self):
        if COURSE and self.notebook not in COURSE:
            raise InputError(f"claim {self.id}: notebook {self.notebook!r} is none of {', '.join(COURSE)}")
        if not self.criteria:
            raise InputError(f"claim {self.id}: a rule needs at least one criterion")
        unknown = set(self.meaning) - {"holds", "does not hold", "partly", "inconclusive"}
        if unknown:
            raise InputError(f"claim {self.id}: meaning for verdicts {sorted(unknown)}; a meaning is for holds, does "
                             "not hold, partly or inconclusive")

    @property
    def target(self) -> bool:
        return self.statement.startswith("Target:")


_c = Claim  # the table below, positionally
_ALL = [
    # 01: can the measurements be trusted before any of them feeds a cache decision?
    _c("M1", "Statistics computed in fp16 are biased; compute them in fp32.",
       "a biased eviction score ranks keys wrongly, consistently", "01_capture",
       f"per statistic (entropy, max weight, sum of squared weights), the signed mean fp16−fp32 difference lies "
       f"outside ±{BIAS:g} over its whole 95% interval over samples; holds if for every statistic, partly if for some",
       {k: {"outside": (-BIAS, BIAS)} for k in STATISTICS},
       advice=Advice(f"a bias beyond ±{BIAS:g} ranks keys wrongly: compute the statistics in fp32 (the library does); "
                     "before loading your model in bf16/fp16 to save memory, check that its maps match fp32",
                     (Place("01", 7, params=("DTYPE",), also=("exercise 3",)),)),
       meaning={"holds": "compute statistics in fp32", "partly": "compute the biased ones in fp32",
                "does not hold": "no fp16 bias: fp16 arithmetic is safe for these statistics"}),
    _c("M2", "With fixed seeds, attention statistics reproduce to 4 decimal places.",
       "a policy designed on one capture must see the same numbers on the next", "01_capture",
       "holds if the largest |difference| of any statistic between two captures (95% interval over samples of the "
       "per-sample maximum) stays below 5e-5 (equal to 4 decimals)", {"": {"below": 5e-5}},
       advice=Advice("non-zero: a non-deterministic kernel or unfixed seed; fix it before comparing policies",
                     (Place("01", 7, params=("SEED",)),))),
    _c("M3", "Batching several samples and averaging washes out anchor positions; capture per sample.",
       "a cache is per request: averaged [anchors](../docs/GLOSSARY.md#anchors) are anchors no request has",
       "01_capture", "holds if a sample's top-{k} anchors after batch averaging have a mean Jaccard below 0.5 with its "
       "own (95% interval over samples)", {"": {"below": 0.5}},
       advice=Advice("below ~0.5: never design a cache policy on batch-averaged maps; capture per sample",
                     (Place("01", 7, params=("ANCHOR_K",), also=("capture_samples",)),)),
       meaning={"holds": "capture per sample", "does not hold": "batch averages keep a sample's anchors"}),
    _c("M4", "A fixed standard set of ~20 samples across scene types makes numbers comparable.",
       "lets you compare your model's numbers with the shipped model's", "01_capture",
       "holds if every headline statistic (per-sample mean over layers of normalised entropy, max weight, cross-modal "
       "share, top-10% read share) differs by < 0.02 between two disjoint standard sets: every statistic's own 95% "
       "interval over both sets' samples inside ±0.02 (shown: the farthest one reaches)", {"": {"below": 0.02}},
       advice=Advice("decide on the interval's upper bound, not the value: below 0.02, the set's headline numbers "
                     "compare across models at 2 decimals; above it, use more samples per type before comparing models",
                     (Place("01", 7, params=("PER_TYPE", "SAMPLE_SEED")),)),
       meaning={"holds": "sets compare at 2 decimals", "does not hold": "use more samples per type",
                "inconclusive": "use more samples per type"}),
    # 02: where a vision-language model reads the image
    _c("U1", "Text-to-image reads are very uneven: a few image positions take most of them.",
       "then a few image keys keep most of what the text reads ([eviction](../docs/GLOSSARY.md#eviction))",
       "02_understanding_maps", "share of the text's image reads on the top 10% of image positions (mean over layers; "
       "chance 0.1) above 0.5", {"": {"above": 0.5}},
       meaning={"holds": "a few image keys take most reads", "does not hold": "uneven, but not on a few keys"},
       advice=Advice("above ~0.5: a few image keys carry most of the reads, yet keep a cover of the image keys, not the "
                     "most-read ones (05 §2 counts the score-based rules below random at each budget); near 0.1: the "
                     "reads are spread, keep a larger budget",
                     (Place("05", 3, policies=("key_coverage",), params=("BUDGETS",)),))),
    _c("U2a", "Shallow layers are local/positional; deep layers aggregate globally and spread out.",
       "whether depth should change the image-KV budget (05 §8: one budget per layer ties a width schedule; "
       "shrinking the deep layers loses)", "02_understanding_maps",
       "(a) deep / shallow mean attention distance above 1.1, (b) deep minus shallow normalised entropy above 0.02",
       {"a": {"above": 1.1}, "b": {"above": 0.02}},
       meaning={"holds": "deep layers read farther and spread: do not cut them harder",
                "partly": "one sign of depth only: keep one budget per layer (05 §8)",
                "does not hold": "depth gives no reason to change the budget"},
       advice=Advice("positive: deep layers spread, do not cut them harder than shallow ones; negative: deep layers "
                     "focus, fewer keys may do there. Measure it: 05 §8 compares a depth schedule with one budget per "
                     "layer at equal bytes", (Place("05", 8, what="budgets by depth", params=("DEPTH_SCHEDULES",)),))),
    _c("U2b", f"Shallow layers are near-uniform; deep layers focus (some heads' max weight > {FOCUSED:g}).",
       "whether deep layers could keep fewer image keys (05 §8: shrinking them loses)", "02_understanding_maps",
       "(a) shallow-band normalised entropy above 0.8, (b) the most focused deep head's mean max weight above "
       f"{FOCUSED:g}",
       {"a": {"above": 0.8}, "b": {"above": FOCUSED}},
       meaning={"holds": "deep layers focus on a few keys", "does not hold": "deep layers spread out, not focus"}),
    _c("U3", "Visual anchors persist across layers; moderately stable across images.",
       "whether one selection of image keys could serve every layer (05's larger runs: selecting per layer from the "
       "cache wins)", "02_understanding_maps",
       "(a) top-{top_k} anchor Jaccard between the first shallow and first middle layer above 3x chance, (b) "
       "within-scene-type minus across-type anchor Jaccard above 0", {"a": {"above": "u3_bar"}, "b": {"above": 0.0}},
       advice=Advice("whatever (a) shows, select each layer's image keys from its own cache after the prefill, as "
                     "`key_coverage` does: on 05's larger runs the covers that choose once before the prefill "
                     "(DivPrune, `key_coverage_prefill`) fall behind it (05's appendix)",
                     (Place("05", 3, policies=("key_coverage",)),)),
       meaning={"holds": "anchors persist; still select per layer (05)", "does not hold": "select per layer",
                "inconclusive": "select per layer"}),
    _c("U4", "Anchors sit on salient objects, unlike text attention sinks.",
       "keep the [sinks](../docs/GLOSSARY.md#sink) and a cover of the image, not its most-read (object) patches (05)",
       "02_understanding_maps",
       "(a) anchors on object patches / random patches on objects above 1.5, (b) the text's reads on its anchors minus "
       "on the first 3 positions (a sink) above 0", {"a": {"above": 1.5}, "b": {"above": 0.0}},
       meaning={"holds": "anchors on objects, above the sink; still keep a cover (05)",
                "partly": "keep the sinks and a cover of the image, not the object patches",
                "does not hold": "neither objects nor sinks stand out: keep a cover"},
       advice=Advice("a sink (the first positions) taking as much of the text's reads as the anchors or more: keep it in "
                     "every budget; every 05 policy does, since eviction there drops image keys only and keeps every "
                     "other context position. Anchors on objects: spend the image budget on a cover of the picture, not "
                     "on the most-read patches",
                     (Place("05", 2, what="every policy keeps the non-image positions"),
                      Place("05", 3, policies=("key_coverage",))))),
    _c("U5", "Content words read the image far more than function words.",
       "which queries to watch when scoring image keys", "02_understanding_maps",
       "image share of content words / of function words and punctuation above 2", {"": {"above": 2.0}},
       meaning={"holds": "content words single out image keys", "does not hold": "no word class singles out image keys"}),
    _c("U6", "Image reads rise while naming image content during decoding.",
       "which decoding steps to watch when scoring image keys", "02_understanding_maps",
       "image share of generated content words / of generated function words and punctuation above 1.2",
       {"": {"above": 1.2}},
       meaning={"holds": "naming steps single out image keys", "does not hold": "no decoding step singles out image keys"}),
    _c("U8", "Healthy layers: a few focused heads, the rest moderately spread.",
       "whether heads need image-KV budgets of their own (05: a cover over all heads together is best)",
       "02_understanding_maps",
       f"share of layers in which some but not all heads put > {FOCUSED:g} on one key on average above 0.99 (every "
       "layer)",
       {"": {"above": 0.99}},
       meaning={"holds": "a few focused heads per layer", "does not hold": "almost no head focuses on one key"},
       advice=Advice("heads of one layer read differently, yet budget the image KV by a cover over all heads together: "
                     "05's best policy covers each layer's keys with every head concatenated, while AdaKV (a kvpress "
                     "press that gives each head a budget of its own) did no better than random in 05 §2's paired "
                     "test and frees no memory. Whether a head can go is decided by a test on outputs (04's P3), not "
                     "by its spread",
                     (Place("05", 3, policies=("key_coverage",)), Place("04", 3, params=("FRACTIONS",))))),
    _c("U9", "Image tokens dominate; text<->image share under ~15% means text is not reaching the image.",
       "where image KV is read (the whole map's cross-modal share, not 07's detector quantity)", "02_understanding_maps",
       "(a) image->image minus the largest other block, in its worst layer, above 0, (b) cross-modal share in its "
       f"worst layer above {NEGLECT_WARN:g}", {"a": {"above": 0.0}, "b": {"above": NEGLECT_WARN}},
       meaning={"holds": "the text reads the image in every layer",
                "partly": "one sign only: after a cache change check accuracy (07)",
                "does not hold": "some layer barely reads the image: check accuracy (07)"},
       advice=Advice(f"under {NEGLECT_WARN:g} the text barely reads the image. After a cache change, check image "
                     "dependence and accuracy, not a share: 07's neglect detector stayed quiet on the real breaks it "
                     "was meant to catch, and only accuracy caught them all",
                     (Place("07", 2, what="image dependence, accuracy"),))),
    _c("U11", "Object words attend to their object's patches.",
       "whether a question predicts the patches it needs", "02_understanding_maps",
       "best layer (of the full data): (a) median selectivity above 1.5, (b) median selectivity / the untrained-LM "
       "control's above 1.5", {"a": {"above": 1.5}, "b": {"above": 1.5}},
       meaning={"holds": "words point at their patches; still keep a cover",
                "partly": "a weak sign only: do not select image KV by the question",
                "does not hold": "words do not point at their patches: do not select by them",
                "inconclusive": "no sign words single out their patches: keep a cover"},
       advice=Advice("near or below 1: a question's words do not point at their object, so do not select image KV by "
                     "them; well above 1: they do, but that helps only when the question is known before the cache is "
                     "compressed. Without it, keep a cover of the image keys, not the patches a question might read",
                     (Place("05", 3, policies=("key_coverage",)),))),
    _c("U13", "Low layers spread (~35% cross-modal), middle layers focus, high layers refine.",
       "where in depth the text reads the image (05 §5: one rule serves every depth band)", "02_understanding_maps",
       "(a) shallow-band cross-modal share within [0.2, 0.5], (b) shallow minus middle normalised entropy above 0.02",
       {"a": {"between": (0.2, 0.5)}, "b": {"above": 0.02}},
       meaning={"holds": "the bands differ; one rule still serves every band (05 §5)",
                "partly": "the bands differ in part; one rule serves every band (05 §5)",
                "does not hold": "no band pattern: one rule for every band"}),
    # 03: how a diffusion transformer's attention moves over the denoising steps
    _c("G1", "Early denoising steps attend diffusely, late steps concentrate.",
       "whether focus marks the steps to reuse (by output the last steps are the least reusable, §4)",
       "03_diffusion_steps",
       "image-query normalised entropy, early-phase mean minus late-phase mean (over parts and layers), on the weaker "
       "model, above 0.02", {"": {"above": 0.02}}, "3",
       advice=Advice("above 0.02 late maps focus; either way pick the steps to reuse by how alike adjacent outputs "
                     "are, not by focus: by output the last steps are the least reusable, and late-only reuse saves "
                     "too little (06's G3)",
                     (Place("03", 4, what="the knees"),)),
       meaning={"holds": "late maps focus; still pick reuse steps by output similarity",
                "does not hold": "pick reuse steps by output similarity"}),
    _c("G2", "Adjacent-step similarity is ~0.3-0.5 early and > 0.8 late.",
       "where reusing whole steps unchanged is safe (06's `step_skip` extrapolates them instead)", "03_diffusion_steps",
       "adjacent-step cosine similarity of the maps: (a) late phase, weaker model, above 0.8, (b) early phase, most "
       "similar model, below 0.6", {"a": {"above": 0.8}, "b": {"below": 0.6}}, "4",
       advice=Advice("the latest knee over the layers, on a line that separates them (not one every layer clears at "
                     "step 1), is where reusing whole steps unchanged turns safe; knees move with the step count. "
                     "Skipping steps by extrapolation needs no knee: 06's `step_skip` beat the fewer-step control at "
                     "equal FLOPs (06 §3)",
                     (Place("03", 4, params=("STRICT_THRESHOLD", "STEPS")), Place("06", 3, policies=("step_skip",)))),
       meaning={"holds": "reuse late steps, compute early ones", "partly": "unchanged reuse by the knees (§4)",
               "does not hold": "unchanged reuse by the knees (§4)"}),
    _c("G4", "In joint attention, text->image is stable across steps, image->text varies.",
       "which stream of joint attention is steadier (06's `text_side` tests reusing it)", "03_diffusion_steps",
       "MMDiT, mean step-to-step change (1 - cosine): (a) image->text map / text->image map above 1.5, (b) image "
       "stream's attention output / text stream's above 1.5", {"a": {"above": 1.5}, "b": {"above": 1.5}}, "6",
       advice=Advice("above 1.5 the text side is steadier, but 06's `text_side` loses to fewer steps; near 1: "
                     "neither side is steadier",
                     (Place("06", 3, policies=("text_side",)),)),
       meaning={"holds": "the text side is steadier; fewer steps still win (06)",
                "does not hold": "neither side is safer to reuse"}),
    _c("G5", "Image tokens far outnumber text tokens: cache pressure is on the image side.",
       "cache memory goes to the image side", "03_diffusion_steps",
       "image / text KV bytes per attention layer, weaker model, above 4", {"": {"above": 4.0}}, "7",
       advice=Advice("above 4: the cache memory is on the image side, evict or reuse image keys first; the ratio grows "
                     "with the resolution, so measure it at the size you generate",
                     (Place("03", 7, params=("GENERATORS",)),)),
       meaning={"holds": "evict or reuse image keys first", "does not hold": "text KV matters too at this size"}),
    _c("G6", "Text conditioning is strongest early; long prompts collapse in middle steps.",
       "whether the prompt side can be cached after the first steps", "03_diffusion_steps",
       "weaker model: (a) short prompts' guidance strength, early minus late, above 0, (b) long prompts' middle-phase "
       "text entropy above 0.9, (c) that entropy minus the short prompts' above 0.05",
       {"a": {"above": 0.0}, "b": {"above": 0.9}, "c": {"above": 0.05}}, "5",
       advice=Advice("guidance as strong at the last step as at the first: keep the text side computed late; fading: "
                     "caching it late may save a little, but 06's `text_side` loses to fewer steps",
                     (Place("03", 5), Place("06", 3, policies=("text_side",)))),
       meaning={"holds": "the prompt side could be cached late; fewer steps win (06)",
                "partly": "a failing (b) or (c) is good: no collapse",
               "does not hold": "keep the prompt side computed"}),
    _c("G7", "Generation models have more redundant heads than understanding models.",
       "whether a generator has more heads to prune (04 §4 prunes them)", "03_diffusion_steps",
       "mean head redundancy, weaker generator minus the understanding model, above 0.05 (prompts and samples "
       "resampled separately)", {"": {"above": 0.05}}, "8",
       advice=Advice("well above the understanding model: the generator's heads may be pruned, judged on outputs as 04 "
                     "§4 does; at or below it: no more room than in an understanding model",
                     (Place("04", 4, params=("GENERATORS", "FRACTIONS")),)),
       meaning={"holds": "generators have heads to spare (prune as 04 §4)",
                "does not hold": "not every generator has heads to spare"}),
    _c("G9", "An object word's attention lands on the object's region.",
       "whether word maps can pick the image tokens to keep", "03_diffusion_steps",
       "weaker model: (a) object words' region IoU / a random region's above 2, (b) shape-word region overlap, "
       "same-colour minus different-colour pairs, above 0 (pair prompts resampled within their kind)",
       {"a": {"above": 2.0}, "b": {"above": 0.0}}, "9",
       advice=Advice("above 2x chance: word maps point at objects and could pick the image tokens to keep; near 1: do "
                     "not use them",
                     (Place("03", 9), Place("02", 6))),
       meaning={"holds": "word maps can pick image tokens", "partly": "word maps point, binding unsettled",
               "does not hold": "do not pick image tokens by word maps"}),
    # 04: which heads can go
    _c("P1", "Pruning 10% of heads by attention statistics barely hurts; 20% starts to hurt.",
       "how many heads' keys and values can go", "04_head_pruning",
       "combined attention-statistics scorer: (a) accuracy drop from pruning 10% below 0.01 (1 point), (b) further "
       "drop from 10% to 20% above 0.005 (half a point)", {"a": {"below": 0.01}, "b": {"above": 0.005}}, "2",
       advice=Advice("a drop under 1 point at 10% (its whole interval): a tenth of the heads can go; a further drop "
                     "by 20% marks where to stop. Judge each fraction against random's band over seeds, not only "
                     "against no pruning", (Place("04", 2, params=("FRACTIONS", "RANDOM_SEEDS")),)),
       meaning={"holds": "a tenth can go, a fifth costs", "partly": "(a) failing: prune fewer; (b) failing: more can go",
                "does not hold": "a tenth already costs: prune fewer",
                "inconclusive": "too few questions to fix a safe fraction"}),
    _c("P2", "Scoring heads by attention statistics is more stable than by weight norms.",
       "whether a cache's own statistics can choose what to drop", "04_head_pruning",
       "accuracy averaged over the pruned fractions (> 0), combined statistics scorer minus (a) weight norms, (b) "
       "random's mean over seeds, each above 0", {"a": {"above": 0.0}, "b": {"above": 0.0}}, "2",
       advice=Advice("ahead of both (intervals above 0): the cache's own statistics can choose the heads; tied with "
                     "the data-free weight norms: they earn no place over them. Where labelled questions are at hand, "
                     "compare the gradient scorer too",
                     (Place("04", 2, params=("FRACTIONS", "RANDOM_SEEDS", "N_GRADIENT"), also=("exercise 3",)),)),
       meaning={"holds": "the statistics can choose heads", "partly": "they beat random, not both",
                "does not hold": "the statistics choose no better", "inconclusive": "no edge over weight norms shown"}),
    _c("P3", "Near-uniform shallow heads are not automatically redundant.",
       "a \"diffuse, so unimportant\" rule is unsafe", "04_head_pruning",
       "pruning only the near-uniform shallow heads: (a) accuracy drop above 0.01 (1 point, interval over questions), "
       "(b) the deeper layers' normalised-entropy move (mean |change|) minus the move from pruning as many random "
       "shallow heads (mean over the random draws), above 0 (paired interval over samples)",
       {"a": {"above": 0.01}, "b": {"above": 0.0}}, "3",
       advice=Advice("a drop over 1 point from pruning the near-uniform shallow heads: they are not redundant, whatever "
                     "their entropy. Never prune a head for being diffuse; judge a downstream effect against as many "
                     "random shallow heads", (Place("04", 3, params=("PER_TYPE", "CONTROL_DRAWS")),)),
       meaning={"holds": "do not prune heads for being diffuse", "does not hold": "the diffuse shallow heads can go",
                "partly": "diffuse is no reason to prune: test on outputs"}),
    # 05: KV eviction
    _c("U7", "Shallow-layer KV can be evicted by locality; deep-layer KV must be kept.",
       "whether an eviction rule should differ by depth band", "05_kv_eviction",
       "accuracy of locality in the shallow band + content deeper minus the swapped assignment, per question averaged "
       "over the budgets, above 0.01 (1 point)", {"": {"above": 0.01}},
       advice=Advice("above +1 point (whole interval): a rule per band (locality shallow, content deeper); "
                     "else one coverage rule in every layer",
                     (Place("05", 5, policies=("unicache",)),)),
       meaning={"holds": "one rule per depth band", "does not hold": "one rule serves every depth band"}),
    _c("E1", "Target: a designed eviction policy keeps >= 99% of full-cache accuracy at 25% of the image KV.",
       "how far the image KV can be cut", "05_kv_eviction",
       f"{NEW} accuracy at 25% of the image KV / the full cache's, held-out questions (ratio of means, 95% interval "
       "over questions), above 0.99", {"": {"above": 0.99}},
       meaning={"holds": "a quarter of the image KV is enough", "does not hold": "keep more than a quarter"}),
    _c("E2", "Target: the designed eviction policy keeps >= 97% of full-cache accuracy at 10% of the image KV.",
       "how far the image KV can be cut", "05_kv_eviction",
       f"{NEW} accuracy at 10% / the full cache's, above 0.97", {"": {"above": 0.97}},
       meaning={"holds": "a tenth is enough", "does not hold": "at a tenth, merge rather than drop (§3)"}),
    _c("E3", "Target: its answers stay close to the full cache's: mean KL <= 0.05 at 25%.",
       "whether the answers survive, not only their accuracy", "05_kv_eviction",
       f"{NEW} mean KL(full || evicted) at 25%, interval over questions, below 0.05 nats", {"": {"below": 0.05}},
       meaning={"holds": "the answers barely move", "does not hold": "check the answers, not only accuracy"}),
    _c("E4", "Target: it is at least as accurate as every peer (kvpress, DivPrune, FastV ...) at every budget.",
       "which eviction method to adopt", "05_kv_eviction",
       f"{NEW} minus every peer (kvpress presses, DivPrune, FastV, SnapKV, H2O, StreamingLLM), the worst (budget, "
       "peer) cell of the paired accuracy difference, interval over questions, above -0.01 (1 point)",
       {"": {"above": -0.01}},
       meaning={"holds": "no peer beats it", "does not hold": "a peer beats it somewhere (§3)"}),
    # 06: cross-step reuse
    _c("R1", "Target: a designed step-reuse policy reaches >= 2x wall-clock at >= 42 dB PSNR on both generators.",
       "whether cross-step reuse pays at all", "06_step_reuse",
       f"{NEW_REUSE} on every generator: (a) wall-clock speed-up (interval over >= {MIN_TIMING_REPEATS} timing "
       "rounds, the slower generator) above 2.0, (b) mean PSNR vs no reuse (interval over prompts, the lower "
       "generator) above 42 dB", {"a": {"above": 2.0}, "b": {"above": 42.0}},
       meaning={"holds": "fast and sharp enough", "partly": "fast or sharp enough, not yet both",
                "does not hold": "neither fast nor sharp enough"}),
    _c("R2", "Target: it sits >= 3 dB above simply sampling with fewer steps at equal wall-clock.",
       "whether reuse beats the trivial control", "06_step_reuse",
       f"{NEW_REUSE} PSNR minus the fewer-step control's at its own wall-clock speed-up (interval over prompts, the "
       "generator with the smaller margin) above 3 dB", {"": {"above": 3.0}},
       meaning={"holds": "step_skip beats fewer steps", "does not hold": "fewer steps do as well: use them",
                "inconclusive": "not yet told apart from fewer steps"}),
    _c("R3", "Target: it is Pareto-ahead of every diffusers cache on (PSNR, wall-clock) and (PSNR, FLOPs).",
       "whether to adopt it over the caches diffusers ships", "06_step_reuse",
       f"every diffusers cache (diffusers' settings) on every generator against the best {NEW_REUSE} setting (every "
       "3rd or every 2nd step in the middle) that saves at least as much: the smallest paired PSNR difference, ours "
       "minus theirs (interval over prompts), above 0 dB, (a) at equal or higher wall-clock speed-up, (b) at equal or "
       "fewer transformer FLOPs", {"a": {"above": 0.0}, "b": {"above": 0.0}},
       meaning={"holds": "prefer step_skip to diffusers' caches", "partly": "ahead on time or on FLOPs, not both",
                "does not hold": "a diffusers cache does better", "inconclusive": "ties a diffusers cache, not yet ahead of all"}),
    _c("G3", "Reusing only in the last third of the steps loses almost no quality.",
       "where in the schedule reuse is safe", "06_step_reuse",
       "weaker generator: (a) SSIM of reuse in the last third of the steps above 0.98, (b) that SSIM minus reusing "
       "throughout (every 2nd step) above 0", {"a": {"above": 0.98}, "b": {"above": 0.0}},
       meaning={"holds": "late reuse is safe but saves little", "partly": "late reuse safe or safer, not both",
                "does not hold": "late reuse is neither safe nor safer"}),
    _c("G8", "Caching text-side features over similar steps cut latency ~15% with no visible loss.",
       "whether the text side is worth caching", "06_step_reuse",
       f"joint-attention model, text-side reuse: (a) speed-up above 1.10 (interval over >= {MIN_TIMING_REPEATS} "
       "shuffled interleaved rounds), (b) SSIM above 0.98", {"a": {"above": 1.10}, "b": {"above": 0.98}},
       meaning={"holds": "cheap, but fewer steps do better", "partly": "cheap or lossless, not both",
                "does not hold": "text-side caching does not pay"}),
    # 07: diagnostics
    _c("U10", "A layer with cross-modal share under ~5% marks a modality cut-off.",
       "an eviction rule keeping few image keys can *cause* a cut-off: whether a cheap share detector can catch one",
       "07_diagnostics",
       f"(a) healthy model: its lowest layer's image share of text queries' reads above the {NEGLECT_CUTOFF:.0%} "
       f"cut-off (quiet), (b) broken variants not caught by construction (zeroed features, blank image, zeroed image "
       f"values): the highest of their lowest-layer shares below {NEGLECT_CUTOFF:.0%} (the detector fires on every "
       "one)", {"a": {"above": NEGLECT_CUTOFF}, "b": {"below": NEGLECT_CUTOFF}},
       advice=Advice(f"under {NEGLECT_CUTOFF:.0%}: a modality cut-off, check the layer; above: the share says nothing "
                     "about whether the image content arrives, run image_dependence beside it",
                     (Place("07", 2, params=("PER_TYPE",)),)),
       meaning={"holds": "a share detector you can trust", "partly": "right on one side only: check accuracy too",
                "does not hold": "the share misses cut-offs: check accuracy"}),
    _c("U12", "A noun whose attention barely covers the image is likely hallucinated.",
       "then a cache could keep more image KV exactly when coverage drops", "07_diagnostics",
       "(a) AUROC of low coverage for wrong answers above 0.7, (b) that AUROC minus the confidence baseline's above 0",
       {"a": {"above": 0.7}, "b": {"above": 0.0}},
       advice=Advice("use low coverage as a hallucination flag only if the interval sits above 0.7 and above the "
                     "confidence baseline's; inverted or straddling 0.5: do not key a cache's behaviour on it",
                     (Place("07", 1, params=("MODEL", "N_QUESTIONS")),)),
       meaning={"holds": "low coverage flags hallucinations", "partly": "a flag, no better than confidence",
                "does not hold": "no flag: monitor confidence instead"}),
    # 08: other architectures
    _c("A1", "Single-stream fusion (ViLT): image-image attention dominates; text barely shapes the image tokens.",
       "the image side is most of the KV and reads itself", "08_architectures",
       "ViLT, mean over layers: (a) image queries' share on image keys above 0.5; (b) image queries' share on text "
       "keys / the text's share of the positions (what even attention would give it) below 1",
       {"a": {"above": 0.5}, "b": {"below": 1.0}},
       meaning={"holds": "image KV mostly reads itself", "does not hold": "text shapes the image tokens",
               "inconclusive": "open: A2's ablation decides"}),
    _c("A2", "Fusion encoder: a cross-modal share under ~15% means the text is not injected into the image tokens.",
       "whether text→image paths can be cut", "08_architectures",
       "ViLT: (a) cross-modal share of the healthy model (mean over layers) below 0.15; (b) accuracy lost when image "
       "queries cannot see the text below 0.02 (text that is not injected cannot be missed)",
       {"a": {"below": 0.15}, "b": {"below": 0.02}},
       advice=Advice("a drop: the fused stream injects text into the image tokens; keep text keys for image queries (at "
                     "least in the layers where the drop comes from, exercise 6)", (Place("08", 4, also=("exercise 6",)),)),
       meaning={"holds": "text->image paths can be cut", "does not hold": "keep text keys for image queries",
               "inconclusive": "a failing (b): keep the text keys"}),
    _c("A3", "Cross-attention VLM: low cross layers spread, middle ones focus on the named object, top ones refine.",
       "which layers' vision KV can be thinned", "08_architectures",
       "Mllama, teacher-forced captions, cross layers low / middle / top: (a) low minus middle normalised entropy of "
       "the caption words above 0.02 (spread, then focus); (b) middle: object words' mass on their object / its area "
       "share above 1.5; (c) middle: position words' mass on the matching half / the opposite half above 1.5; (d) "
       "middle minus top background mass above 0 (refine). The study's ~35% cross-modal share is not a criterion: a "
       "cross-attention layer reads only the image",
       {"a": {"above": 0.02}, "b": {"above": 1.5}, "c": {"above": 1.5}, "d": {"above": 0.0}},
       advice=Advice("measured here on Mllama: above ~1.5 a cross layer's words find their objects, near 1 they do "
                     "not; these reads do not say what to thin. No eviction ran on Mllama: to thin its vision KV, 05's "
                     "cover (not the most-read patches) is a pointer, measured on LLaVA only",
                     (Place("05", 3, policies=("key_coverage",), params=("BUDGETS",)),)),
       meaning={"holds": "the study's order: spread, focus, refine", "partly": "some criteria follow the study's "
                "order", "does not hold": "not the study's order"}),
    _c("A4", "Dual tower (CLIP): the image tower's pooled query focuses on the regions the matching text names.",
       "which image tokens an embedding needs", "08_architectures",
       "CLIP image tower, last layer: the class token's attention mass on the objects the caption names / their area "
       "share above 1.5", {"": {"above": 1.5}},
       advice=Advice("measured here on CLIP: well above 1 the embedding leans on the named objects. No token was "
                     "dropped on CLIP: 05's cover-and-merge is a pointer, measured on LLaVA only",
                     (Place("05", 3, policies=("key_coverage_merge",)),)),
       meaning={"holds": "the embedding is object-led", "does not hold": "the embedding is not object-led"}),
    _c("A5", "Unified model: the text's image share is ~40% when describing and ~60% when answering.",
       "one image budget for describing and answering, or two", "08_architectures",
       "Janus, same images: (a) image share of the answer token minus the mean image share of the caption tokens above "
       "0; (b) their ratio above 1.2 (the study: ~60% / ~40% = 1.5)", {"a": {"above": 0.0}, "b": {"above": 1.2}},
       advice=Advice("near 1: one image-KV budget serves both tasks; above ~1.2: give answers a larger budget",
                     (Place("05", params=("BUDGETS",)),)),
       meaning={"holds": "give answers a larger image budget", "does not hold": "one image-KV budget serves both tasks"}),
    _c("A6", "Unified model: after an image-heavy token the next reads the image less; late image-share drops go with "
       "drift.", "bursty decode-time reads of the image KV", "08_architectures",
       "Janus captions: (a) lag-1 correlation of the per-token image share (each position's mean removed) below 0 "
       "(suppression); (b) on captions of four-object scenes, AUROC of a low third-of-caption image share for an error "
       "in that third (a phrase naming no object of the scene) above 0.6 (drift)",
       {"a": {"below": 0.0}, "b": {"above": 0.6}},
       advice=Advice("below 0: a heavy read is followed by a light one; above 0: reads persist over a few tokens. Either "
                     "way evict by a cover (05 §3), not by the last reads (05 §2 counts the read-ranked rules below "
                     "random at each budget)",
                     (Place("05", 3, policies=("key_coverage",)),)),
       meaning={"holds": "evict by a cover, not by recent reads", "does not hold": "evict by a cover, not by recent reads",
               "inconclusive": "evict by a cover, not by recent reads"}),
]
REGISTRY: dict[str, Claim] = {c.id: c for c in _ALL}
if len(REGISTRY) != len(_ALL):
    raise InputError("two claims share an id in unicache_lib/claims.py")
CLAIMS: dict[str, str] = {c.id: c.statement for c in _ALL}  # id -> statement, what the scoreboard prints
LESSONS = tuple(dict.fromkeys(sorted(c.notebook for c in _ALL)))  # the lessons that rule on claims, in order


def of(notebook: str) -> list[Claim]:
    """The claims ``notebook`` (e.g. ``"05_kv_eviction"`` or ``"05_kv_eviction.ipynb"``) rules on, in order."""
    nb = notebook.removesuffix(".ipynb")
    if nb not in LESSONS:
        raise UnknownNameError(f"no lesson {notebook!r}; lessons with claims: {', '.join(LESSONS)}")
    return [c for c in _ALL if c.notebook == nb]


def ids(notebook: str) -> set[str]:
    return {c.id for c in of(notebook)}


def rules_of(notebook: str, **fill) -> dict[str, tuple[str, dict]]:
    """``claim -> (rule text, criteria)`` of ``notebook``'s claims, what :meth:`Scoreboard.declare` writes; ``fill``
    gives the values a rule names (``{k}`` in a text, a threshold given as a name)."""
    out = {}
    for c in of(notebook):
        try:
            text = c.rule.format(**fill)
        except KeyError as e:
            raise InputError(f"claim {c.id}'s rule names {e.args[0]!r}: pass {e.args[0]}=... to declare it") from None
        for bound in (b for test in c.criteria.values() for b in test.values()):
            if isinstance(bound, str) and bound not in fill:
                raise InputError(f"claim {c.id}'s threshold is named {bound!r}: pass {bound}=... to declare it")
        out[c.id] = (text, {name: {side: float(fill[b]) if isinstance(b, str) else b for side, b in test.items()}
                            for name, test in c.criteria.items()})
    return out


class Markdown(str):
    """A markdown text that Jupyter shows rendered (and ``print`` shows as is)."""

    def _repr_markdown_(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return str(self)


def claims_table(notebook: str) -> Markdown:
    """The lesson's claims as a markdown table (id, the claim, what it decides for a cache, and the section where
    measured when the lesson numbers them), made from :data:`REGISTRY`; a notebook displays it beside its scoreboard."""
    cs = of(notebook)
    sections = any(c.section for c in cs)
    head = "| id | claim | why it matters for caching |" + (" § |" if sections else "")
    rows = [head, "|---|---|---|" + ("---|" if sections else "")]
    for c in cs:
        text = c.statement.replace("Target:", "*Workbench target:*", 1).replace("|", "\\|")
        rows.append(f"| {c.id} | {text} | {c.why} |" + (f" {c.section} |" if sections else ""))
    return Markdown("\n".join(rows))


def ids_text(notebook: str) -> str:
    """``notebook``'s claim ids as docs/LAYOUT.md lists them: the study's claims, then "and targets ..." for the
    workbench's own; runs of one letter with consecutive numbers shortened (``U1–U6``)."""
    study = [c.id for c in of(notebook) if not c.target]
    targets = [c.id for c in of(notebook) if c.target]
    text = "claims " + _runs(study) if study else ""
    if targets:
        text += (" and targets " if study else "targets ") + _runs(targets)
    return text


def _runs(names: list[str]) -> str:
    out, i = [], 0
    while i < len(names):
        j = i
        while (j + 1 < len(names) and names[j + 1][:1] == names[i][:1] and names[j + 1][1:].isdigit()
               and names[j][1:].isdigit() and int(names[j + 1][1:]) == int(names[j][1:]) + 1):
            j += 1
        out.append(names[i] if j - i < 2 else f"{names[i]}–{names[j]}")
        if 0 < j - i < 2:
            out.extend(names[i + 1:j + 1])
        i = j + 1
    return ", ".join(out)


def _claim(claim: str) -> Claim:
    if claim not in REGISTRY:
        raise UnknownNameError(f"unknown claim id {claim!r}; known: {', '.join(REGISTRY)}")
    return REGISTRY[claim]


def read(claim: str, verdict: str) -> str:
    """``verdict`` as the reader should read it: followed by the claim's meaning of it where it has one
    (``"does not hold — fp16 is safe for these statistics"``), else the verdict alone."""
    c = REGISTRY.get(claim)  # a claim the registry does not hold (a test's own) has no meaning written
    meaning = c.meaning.get(verdict) if c is not None else None
    return f"{verdict} — {meaning}" if meaning else str(verdict)


def _advice_of(claim: str) -> Advice:
    a = _claim(claim).advice
    if a is None:
        raise InputError(f"claim {claim} has no advice: write advice=Advice(...) beside it in unicache_lib/claims.py")
    return a


def advice(claim: str, verdict: str | None = None, found: str = "") -> str:
    """What ``claim``'s result means for the reader's model, as a decision table shows it: its :class:`Advice`'s
    ``act``; then, given this run's ``verdict``, what that verdict means (:attr:`Claim.meaning`, where written); then
    the results later lessons found (``Advice.found``); then, in parentheses, ``found``: the showing lesson's own
    measured result (a note, a number of its run)."""
    a, c = _advice_of(claim), _claim(claim)
    parts = [a.act]
    if verdict in c.meaning:
        parts.append(f"Here: {read(claim, verdict)}")
    parts += [f"{where}: {text}" for where, text in a.found.items()]
    return ". ".join(parts) + (f" ({found})" if found else "")


def where(claim: str, lesson: str | None = None) -> str:
    """The places to act on ``claim`` (:class:`Place`), as the decision table of ``lesson`` shows them."""
    return "; ".join(p.text(lesson) for p in _advice_of(claim).where)


def decision_rows(rows, lesson: str | None = None, verdicts: dict | None = None) -> list[dict]:
    """A decision table's rows (:data:`DECISION_COLUMNS`), each row about a claim made from the claim's advice.
    ``rows``: ``(claim, measurement, value)`` or ``(claim, measurement, value, found)`` tuples (the measurement names
    the claim; ``value`` and ``found`` are what the showing lesson measured), or a ready dict for a row about no claim;
    ``lesson``: the lesson showing the table; ``verdicts``: claim -> this run's verdict (a board's ``verdicts()``)."""
    out = []
    for r in rows:
        if isinstance(r, dict):
            out.append(r)
            continue
        claim, measurement, value, found = (*r, "") if len(r) == 3 else r
        if not re.search(rf"\b{re.escape(claim)}\b", measurement):
            raise InputError(f"a row about {claim} names it in its measurement; got {measurement!r}")
        out.append(dict(zip(DECISION_COLUMNS, (measurement, value, advice(claim, (verdicts or {}).get(claim), found),
                                               where(claim, lesson)))))
    return out


def decision_table(rows, lesson: str | None = None, verdicts: dict | None = None) -> Markdown:
    """:func:`decision_rows` as a markdown table, one line per row (``|`` in a cell escaped)."""
    lines = ["| " + " | ".join(DECISION_COLUMNS) + " |", "|" + "---|" * len(DECISION_COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]).replace("|", "\\|") for c in DECISION_COLUMNS) + " |"
              for r in decision_rows(rows, lesson, verdicts)]
    return Markdown("\n".join(lines))
