"""Questions, one-word answers, captions and generation prompts for the synthetic world.

Answers are balanced per question type: the answer is drawn first and the scene is built to make
it true, so a model that ignores the image can do no better than ``1 / #answers`` of that type.
Every question is answerable from its image (colours and positions are distinct within a scene).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import InputError, MissingFileError
from ..core.untrusted import RepeatedKeyError, json_loads, read_utf8, write_inside
from .scenes import COLOURS, POSITIONS, SCENE_TYPES, SHAPES, Scene, make_scene

QUESTION_TYPES: tuple[str, ...] = ("colour", "shape", "position", "exists", "count")
COUNT_WORDS = ("zero", "one", "two", "three", "four")
PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles"}
ANSWERS: dict[str, tuple[str, ...]] = {
    "colour": tuple(COLOURS),
    "shape": SHAPES,
    "position": tuple(POSITIONS),
    "exists": ("yes", "no"),
    "count": COUNT_WORDS[:4],
}
CAPTION_QUESTION = "describe the image ."
# canonical reading order for captions
POSITION_ORDER = ("left", "top", "centre", "bottom", "right")

# Token classes used by the text->image analyses (function words are the rest).
OBJECT_WORDS = frozenset(SHAPES) | frozenset(PLURAL.values()) | {"object", "objects"}
ATTRIBUTE_WORDS = frozenset(COLOURS)
POSITION_WORDS = frozenset(POSITIONS) | {"side"}


@dataclass
class QA:
    """One question about one scene."""

    scene: Scene
    qtype: str
    question: str
    answer: str
    target: int | None  # index of the object the question is about (None when absent / count)


def make_qa(rng: np.random.Generator, qtype: str | None = None, scene_type: str | None = None, size: int = 64,
            scene_types: tuple[str, ...] = SCENE_TYPES, qtypes: tuple[str, ...] = QUESTION_TYPES,
            exists_negatives: str = "hard") -> QA:
    """Draw a question type (or use ``qtype``), a balanced answer, then a scene where it is true.

    ``exists_negatives`` (a training curriculum; every held-out set uses ``"hard"``): ``"hard"`` asks for an
    absent object that shares the colour or the shape of a present one; ``"random"`` for any absent
    colour x shape (most of them have a colour the scene lacks)."""
    if exists_negatives not in ("hard", "random"):
        raise InputError(f"exists_negatives must be 'hard' or 'random', not {exists_negatives!r}")
    qtype = qtype or str(rng.choice(qtypes))
    if qtype not in QUESTION_TYPES:
        raise InputError(f"unknown question type {qtype!r}; expected one of {QUESTION_TYPES}")
    st = scene_type or str(rng.choice(scene_types))
    answer = str(rng.choice(ANSWERS[qtype]))
    if qtype == "colour":
        shape = str(rng.choice(SHAPES))
        return QA(make_scene(rng, st, size, fixed=[{"colour": answer, "shape": shape}], forbid_shapes=(shape,)), qtype,
                  f"what color is the {shape} ?", answer, 0)
    if qtype == "shape":
        sc = make_scene(rng, st, size, fixed=[{"shape": answer}])
        return QA(sc, qtype, f"what shape is the {sc.objects[0].colour} object ?", answer, 0)
    if qtype == "position":
        sc = make_scene(rng, st, size, fixed=[{"position": answer}])
        return QA(sc, qtype, f"where is the {sc.objects[0].name} ?", answer, 0)
    if qtype == "exists":
        sc = make_scene(rng, st, size)
        if answer == "yes":
            t = int(rng.integers(len(sc.objects)))
            return QA(sc, qtype, f"is there a {sc.objects[t].name} ?", answer, t)
        present = {(o.colour, o.shape) for o in sc.objects}
        if exists_negatives == "random":
            cands = [(c, s) for c in COLOURS for s in SHAPES if (c, s) not in present]
        else:  # hard negatives: share the colour or the shape of a present object
            ref = sc.objects[int(rng.integers(len(sc.objects)))]
            cands = [(ref.colour, s) for s in SHAPES] + [(c, ref.shape) for c in COLOURS]
            cands = [c for c in cands if c not in present] or [(c, s) for c in COLOURS for s in SHAPES
                                                                if (c, s) not in present]
        c, s = cands[int(rng.integers(len(cands)))]
        return QA(sc, qtype, f"is there a {c} {s} ?", answer, None)
    # count
    k = COUNT_WORDS.index(answer)
    shape = str(rng.choice(SHAPES))
    n = max(k, int(rng.integers(max(k, 1), 5)))
    if st == "single" and n > 1:
        st = "clutter"
    return QA(make_scene(rng, st, size, n_objects=max(n, 1), fixed=[{"shape": shape}] * k, forbid_shapes=(shape,)),
              qtype, f"how many {PLURAL[shape]} ?", answer, None)


def caption(scene: Scene) -> str:
    """Objects in reading order, e.g. ``"red circle left , blue square top"``."""
    objs = sorted(scene.objects, key=lambda o: POSITION_ORDER.index(o.position))
    return " , ".join(f"{o.colour} {o.shape} {o.position}" for o in objs)


_POS_PHRASE = {"left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom",
               "centre": "in the centre"}
_FILLERS = (
    "the background is plain and dark",
    "nothing else is shown in the picture",
    "there is no text and there are no lines",
    "the objects do not touch each other",
    "the picture is small and simple",
    "every shape is drawn with one flat color",
)


def short_prompt(objects) -> str:
    """``"a red circle on the left"`` (and ``"and a blue square at the top"`` for more)."""
    return " and ".join(f"a {o['colour']} {o['shape']} {_POS_PHRASE[o['position']]}" for o in objects)


def long_prompt(objects, rng: np.random.Generator, min_words: int = 30) -> str:
    """A 30+ word prompt: the objects plus distractor clauses that do not change the picture."""
    body = " , and also ".join(f"a {o['colour']} {o['shape']} {_POS_PHRASE[o['position']]}" for o in objects)
    words = f"a picture that shows {body} .".split()
    fillers = list(_FILLERS)
    rng.shuffle(fillers)
    for f in fillers:
        if len(words) >= min_words:
            break
        words += f.split() + ["."]
    return " ".join(words)


GENERATED_SIZE = 32  # the shipped pixel-space generators' image side
GENERATED_RADIUS = (0.16, 0.20)


def generation_example(rng: np.random.Generator, size: int = GENERATED_SIZE):
    """One (scene, prompt) of the shipped generators' training distribution: one object (70%) or two, a short or a
    long prompt."""
    n = 1 if rng.random() < 0.7 else 2
    sc = make_scene(rng, "single", size, n_objects=n, radius_range=GENERATED_RADIUS)
    objs = sc.describe()
    return sc, short_prompt(objs) if rng.random() < 0.5 else long_prompt(objs, rng)

def vocabulary() -> list[str]:
    """Every word the world can produce (questions, answers, captions, prompts)."""
    words = set(COLOURS) | set(SHAPES) | set(POSITIONS) | set(PLURAL.values()) | set(COUNT_WORDS) | {
        "yes", "no", "user", "assistant", ":", "?", ".", ","}
    return sorted(words | {w for text in ("what color is the", "what shape is the object", "where is the", "is there a",
                                          "how many", CAPTION_QUESTION, "a picture that shows and also",
                                          *_POS_PHRASE.values(), *_FILLERS) for w in text.split()})


def prompt_set(n_single: int, n_pairs: int, seed: int = 0) -> list[dict]:
    """Generation prompts with what they ask for: ``{"id", "objects", "short", "long", "pair"}``.

    ``n_single`` one-object prompts cycle evenly through colour x shape x position; ``n_pairs``
    two-object prompts put two different shapes left and right, alternately in the *same* colour
    (``pair="same"``, the binding test of G9) and in two colours (``pair="different"``).
    """
    rng = np.random.default_rng(seed)
    colours, shapes, positions = list(COLOURS), list(SHAPES), list(POSITIONS)
    combos = [(c, s, p) for c in colours for s in shapes for p in positions]
    order = rng.permutation(len(combos))
    out = []
    for i in range(n_single):
        c, s, p = combos[order[i % len(combos)]]
        objs = [{"colour": c, "shape": s, "position": p}]
        out.append({"id": f"s{i}", "objects": objs, "pair": "", "short": short_prompt(objs), "long": long_prompt(objs, rng)})
    for i in range(n_pairs):
        c1 = colours[rng.integers(len(colours))]
        c2 = c1 if i % 2 == 0 else colours[(colours.index(c1) + 1 + rng.integers(len(colours) - 1)) % len(colours)]
        s1, s2 = rng.choice(shapes, 2, replace=False)
        objs = [{"colour": c1, "shape": str(s1), "position": "left"}, {"colour": c2, "shape": str(s2), "position": "right"}]
        out.append({"id": f"p{i}", "objects": objs, "pair": "same" if c1 == c2 else "different",
                    "short": short_prompt(objs), "long": long_prompt(objs, rng)})
    return out


def export_prompts(prompts: list[dict], out) -> "Path":
    """Generation prompts (:func:`prompt_set`'s dicts) as ``prompts.jsonl``: ``prompt`` (the short form), ``long``,
    ``objects`` (what the prompt asks for, for the prompt-following checks) and ``id``; :func:`read_prompts` reads it.
    Written atomically (:func:`~unicache_lib.core.untrusted.write_inside`: never through a link), its folder created."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return write_inside(out.parent, out.name, "".join(json.dumps({"id": p["id"], "prompt": p["short"], "long": p["long"],
                                                                  "objects": p["objects"]}) + "\n" for p in prompts).encode())


def jsonl_rows(path, text: str | None = None) -> list[tuple[int, object]]:
    """``(line number, parsed JSON)`` of every non-blank line of a JSON-lines file (``text``: its contents, already
    read); a line that is not JSON is refused naming the file, the line and the fix. Lines end at ``\n`` only (JSON
    lines' rule): ``str.splitlines`` would also cut at U+2028, U+0085 or a form feed inside a string."""
    out = []
    for n, line in enumerate((read_utf8(path) if text is None else text).split("\n"), 1):
        if line.strip():
            try:
                out.append((n, json_loads(line)))
            except RepeatedKeyError as e:
                raise InputError(f"{path}, line {n}: {e}: keep one") from None
            except json.JSONDecodeError as e:
                raise InputError(f"{path}, line {n}: not JSON ({e.msg}): write one JSON object per line") from e
            except RecursionError:
                raise InputError(f"{path}, line {n}: nested too deeply to read as JSON: write flat records") from None
    return out


def read_prompts(path) -> list[dict]:
    """Your own generation prompts: a ``prompts.jsonl`` with one ``{"prompt": ...}`` per line (``objects``, ``long``
    and ``id`` optional), as :func:`prompt_set`'s dicts (``short`` is the prompt; ``objects`` empty where not given:
    the prompt-following checks then say they cannot score it). A bad line names itself and the fix."""
    path = Path(path)
    if path.is_dir():
        path = path / "prompts.jsonl"
    if not path.is_file():
        raise MissingFileError(f"no {path}: write one JSON object per line with a 'prompt' (see export_prompts)")
    out, ids = [], {}
    for n, row in jsonl_rows(path):
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
            raise InputError(f"{path}, line {n}: no 'prompt' text: every line needs one, e.g. "
                             '{"prompt": "a red circle on the left"}')
        objects = row.get("objects") or []
        if not isinstance(objects, list) or not all(isinstance(o, dict) for o in objects):
            raise InputError(f"{path}, line {n}: 'objects' must be a list of objects such as "
                             '{"colour": "red", "shape": "circle", "position": "left"}')
        if row.get("long") is not None and not isinstance(row["long"], str):
            raise InputError(f"{path}, line {n}: 'long' must be a text (a longer prompt for the same picture), "
                             f"got {row['long']!r}")
        if "id" in row and (isinstance(row["id"], bool) or not isinstance(row["id"], (str, int)) or not str(row["id"]).strip()):
            raise InputError(f"{path}, line {n}: 'id' must be a non-empty text, got {row['id']!r}")
        pid = str(row.get("id", f"p{len(out)}"))
        if pid in ids:
            raise InputError(f"{path}, line {n}: prompt id {pid!r} is also line {ids[pid]}'s: ids name a prompt's "
                             f"records, so two prompts cannot share one; give every line its own 'id'")
        ids[pid] = n
        binding = (len(objects) == 2 and all(scorable(o) for o in objects) and objects[0]["shape"] != objects[1]["shape"]
                   and [o["position"] for o in objects] == ["left", "right"])  # G9's binding test, in prompt_set's layout
        pair = ("same" if objects[0]["colour"] == objects[1]["colour"] else "different") if binding else ""
        out.append({"id": pid, "objects": list(objects), "pair": pair,
                    "short": row["prompt"], "long": row["long"] if isinstance(row.get("long"), str) else row["prompt"]})
    if not out:
        raise InputError(f"{path} lists no prompts: add one line per prompt")
    return out


def scorable(obj) -> bool:
    """Whether the synthetic world's detector (:func:`~unicache_lib.world.segment.score_object`) can judge ``obj``:
    a colour, a shape and a position it knows. Other objects (your own words) are kept but not scored."""
    return (isinstance(obj, dict) and obj.get("colour") in COLOURS and obj.get("shape") in SHAPES
            and obj.get("position") in POSITIONS)


def load_prompts(path=None, n_single: int = 16, n_pairs: int = 0, seed: int = 0) -> list[dict]:
    """The generation notebooks' prompts: ``n_single`` prompts that are not two-object pairs, then ``n_pairs``
    two-object prompts (the order :func:`prompt_set` uses). ``path`` None: :func:`prompt_set` (the synthetic world);
    else your ``prompts.jsonl`` (:func:`read_prompts`), its prompts taken in file order, pairs being those with two
    objects the detector can judge. Too few of either kind is refused, naming the counts and the fix."""
    if path is None:
        return prompt_set(n_single, n_pairs, seed)
    rows = read_prompts(path)
    singles = [p for p in rows if not p["pair"]]
    pairs = [p for p in rows if p["pair"]]
    if len(singles) < n_single or len(pairs) < n_pairs:
        raise InputError(f"{path} has {len(singles)} prompts that are not two-object pairs and {len(pairs)} two-object "
                         f"pairs; {n_single} and {n_pairs} are asked for: lower the counts (N_SINGLE / N_PAIRS / N_PROMPTS) "
                         f"or add prompts (a pair lists two objects of different shapes, each with a colour, shape and "
                         f"position, the first on the left, the second on the right)")
    return singles[:n_single] + pairs[:n_pairs]


_FUNCTION_WORDS = {"a", "an", "the", "of", "in", "on", "at", "and", "with", "to", "is", "are", "two", "one", "some"}


def single_object(prompt: dict):
    """The one object a prompt asks for, for the prompt-following checks; None for a prompt of none or several
    (scored NaN by :func:`~unicache_lib.world.segment.score_object`, never against its first object)."""
    return prompt["objects"][0] if len(prompt["objects"]) == 1 else None


def named_words(prompt: dict, limit: int = 4) -> list[str]:
    """The words a prompt names, for word maps: its objects' colour and shape words, or, for your own prompts without
    ``objects``, its first ``limit`` distinct content words (function words skipped)."""
    words = [o[r] for o in prompt["objects"] for r in ("colour", "shape") if isinstance(o.get(r), str)]
    if not words:
        words = [w for w in prompt["short"].lower().replace(",", " ").replace(".", " ").split() if w not in _FUNCTION_WORDS]
    return list(dict.fromkeys(words))[:limit] if not prompt["objects"] else list(dict.fromkeys(words))
