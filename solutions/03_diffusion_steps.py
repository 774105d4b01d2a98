"""Solutions to the exercises of notebook 03 (attention over denoising steps), on ``tiny-mmdit`` and
``tiny-pixart``.

Run ``python solutions/03_diffusion_steps.py [--quick] [--only K]``. For your own generators change ``GENERATORS``
(diffusers pipeline folders of a supported family).
"""
from __future__ import annotations

import functools
import sys

import _common  # noqa: F401  (repository root on sys.path)
import numpy as np
import pandas as pd

GENERATORS = ["tiny-mmdit", "tiny-pixart"]
GUIDANCE = 3.0
SEED = 0


def _steps(quick):
    return 8 if quick else 20


@functools.lru_cache(maxsize=None)
def _gen(name):
    from unicache_lib.runtime.loaders import load_generator

    return load_generator(name)


@functools.lru_cache(maxsize=None)
def _short_run(name, n_prompts, steps):
    """Stats capture of the first ``n_prompts`` single-object short prompts (the notebook's section 1)."""
    from unicache_lib.capture.gen_runner import capture_generation
    from unicache_lib.world.text import prompt_set

    prompts = [p["short"] for p in prompt_set(n_prompts, 0, SEED)]
    return capture_generation(_gen(name), prompts, "short", None, steps, GUIDANCE, SEED, progress=False)


def _knees(name, n_prompts, steps, thresholds):
    """Knee table and whole-step reuse window per threshold (the notebook's section 4)."""
    from unicache_lib.analysis import generation as G

    T = G.step_table(_short_run(name, n_prompts, steps).result.records).assign(model=name)
    K = G.knee_table(T, thresholds)
    return K, {t: G.reuse_window(K.loc[name, f"knee (maps) @{t:g}"], steps) for t in thresholds}


def knee(sims, threshold):
    """Exercise 1's gap: the first step s >= 1 from which sims[s:] all stay >= threshold, None if there is none."""
    for s in range(1, len(sims)):
        if all(x >= threshold for x in sims[s:]):
            return s
    return None


def reuse_start(layer_knees):
    """Exercise 2's gap: the first step every layer has settled by (its latest knee), None if one never settles."""
    return None if any(k is None for k in layer_knees) else max(layer_knees)


def top_iou(a, b, k):
    """Exercise 4's gap: IoU of the k largest patches of ``a`` and of ``b``."""
    ta, tb = set(np.argsort(np.asarray(a))[-k:].tolist()), set(np.argsort(np.asarray(b))[-k:].tolist())
    return len(ta & tb) / len(ta | tb)


def token_shares(W):
    """Exercise 5's gap: each token's share of the image queries' attention, mean over the image queries."""
    return np.asarray(W).mean(1)


def exercise_1(quick: bool = False) -> dict:
    """Exercise 1 (★★): write ``knee(sims, threshold)`` and check it on every curve of section 4 (maps and outputs,
    at 0.7 and 0.99), then read the knees of the curve section 4 draws (PixArt's cross-attention outputs at 0.99).

    Expected: the written knee equals :func:`~unicache_lib.analysis.generation.knee` (section 4's table) on every
    curve. At 0.7 every curve's knee is step 1 (nothing to read); at 0.99 PixArt's cross-attention outputs settle
    layer by layer (the notebook's run, 24 prompts, 20 steps: steps 1, 13, 11, 2), so a window to reuse whole
    steps unchanged would open only at the latest, while a per-layer reuse could start each layer at its own knee.
    """
    from unicache_lib.analysis import generation as G

    steps = _steps(quick)
    rows, agree, n = [], 0, 0
    for m in GENERATORS:
        T = G.step_table(_short_run(m, 2 if quick else 8, steps).result.records)
        for (part, layer), d in T.groupby(["part", "layer"]):
            for col in ("sim", "out_sim_img"):
                sims = d.groupby("step")[col].mean().to_numpy()
                for t in (0.7, 0.99):
                    mine = knee(sims, t)
                    agree += mine == G.knee(sims, t)
                    n += 1
                    rows.append({"model": m, "part": part, "layer": layer, "curve": "maps" if col == "sim" else "outputs",
                                 "threshold": t, "knee": mine})
    R = pd.DataFrame(rows)
    strict = R[(R.curve == "outputs") & (R.threshold == 0.99)].set_index(["model", "part", "layer"]).knee
    return {"agree with G.knee": f"{agree} of {n} curves", "output knees at 0.99": "\n" + strict.to_string(),
            "_agree": agree, "_n": n, "_R": R}


def exercise_2(quick: bool = False) -> dict:
    """Exercise 2 (★★): write ``reuse_start(layer_knees)`` (the step every layer has settled by) and apply it to the
    knees at 20 steps and at 8 (the starter's fixed fewer steps), on the line 0.95 (here also 0.99): how many whole
    steps could each generator reuse at 8 steps, and which of its layers holds the window back?

    At 20 steps the curves sit near 0.99 from step 1 on (section 4). Eight steps are 2.5x farther apart, so
    adjacent steps differ more: does the reuse window (:func:`~unicache_lib.analysis.generation.reuse_window`,
    the latest knee over the model's layers; the last step is always computed) shrink?

    Expected on the shipped generators, measured (quick run, 2 prompts): yes. At 20 steps every layer of both
    models has settled above 0.95 by step 1 (window: steps 1..18, 18 of 20 reusable); at 8 steps the lowest
    adjacent cosine falls from ~0.98 to ~0.94: some of the MMDiT's layers (its middle ones in the notebook's
    starter) settle only at step 7, so no whole step is
    left to reuse at 0.95 (0 of 8), and PixArt's window starts at step 2 (5 of 8). At 0.99 some layer never
    settles at either step count: no window to reuse whole steps unchanged (06's ``step_skip`` skips them all the
    same, by extrapolating). Map similarity is a property of the *step spacing*,
    not of the model alone:
    a knee measured at 20 steps does not carry over to an 8-step schedule.
    """
    few_steps = 8  # the starter cell's fewer steps
    rows = []
    for steps in (20, few_steps):
        for m in GENERATORS:
            K, win = _knees(m, 2 if quick else 8, steps, (0.95, 0.99))
            for t, w in win.items():
                ks = [None if np.isnan(k) else int(k) for k in K.loc[m, f"knee (maps) @{t:g}"]]
                assert reuse_start(ks) == w["start"]  # the gap's answer is the library's window start
                rows.append({"model": m, "steps": steps, "threshold": t, "window start": w["start"],
                             "reusable steps": w["reusable"], "lowest cosine": round(float(K["min sim"].min()), 4)})
    R = pd.DataFrame(rows).set_index(["model", "steps", "threshold"])
    return {"table": "\n" + R.to_string(), "_table": R}


def exercise_3(quick: bool = False) -> dict:
    """Exercise 3: capture the unconditional branch (``DiffusionCapture(..., branch="uncond")``) and compare its
    text entropy with the conditional one: what does the model attend to when the prompt is empty?

    The same prompts and seeds are sampled twice with the capture on, once recording the conditional half of
    the classifier-free-guidance batch and once the unconditional half (empty prompt). Compared per model:
    ``text_share`` (image queries' mass on text keys; 1 by construction for PixArt's cross-attention) and
    ``text_entropy`` (normalised entropy of that mass over the text positions).

    Expected, measured (20 steps, 8 prompts): with an empty prompt the image queries have no words to pick
    from: the unconditional branch's text entropy is near 1 on both models (0.98 MMDiT, 0.99 PixArt) against
    0.90 / 0.50 for the prompt, i.e. its text attention is spread evenly over whatever text positions exist,
    and on the MMDiT the text share falls (0.23 -> 0.19: the image reads itself more). The unconditional
    branch attends to "nothing in particular" — the baseline that guidance subtracts.
    """
    from unicache_lib.analysis import generation as G
    from unicache_lib.capture.diffusion import DiffusionCapture
    from unicache_lib.runtime.sampling import sample
    from unicache_lib.world.text import prompt_set

    steps = _steps(quick)
    prompts = [p["short"] for p in prompt_set(2 if quick else 8, 0, SEED)]
    out = {}
    for m in GENERATORS:
        g = _gen(m)
        tabs = []
        for branch in ("cond", "uncond"):  # "uncond": the starter cell's gap `branch`
            ids = [f"{branch}/{i}" for i in range(len(prompts))]
            with DiffusionCapture(g.transformer, ids, branch=branch) as cap:
                sample(g, prompts, steps, GUIDANCE, seed=SEED, callbacks=[cap])
            tabs.append(G.step_table(cap.result.records).assign(branch=branch))
        T = pd.concat(tabs)
        T = T[T.part != "self"]
        out[m] = T.groupby("branch")[["text_share", "text_entropy"]].mean()
    table = pd.concat(out, names=["model"])
    return {"table": "\n" + table.round(3).to_string(), "_table": table}


def _pair_prompts(n: int, same_shape: bool):
    """Two-object prompts, both objects in one colour, left and right; with ``same_shape`` one shape too."""
    from unicache_lib.world.text import COLOURS, SHAPES, short_prompt

    rng = np.random.default_rng(SEED)
    out = []
    for i in range(n):
        c = list(COLOURS)[i % len(COLOURS)]
        s1, s2 = rng.choice(list(SHAPES), 2, replace=False)
        s2 = s1 if same_shape else s2
        objs = [{"colour": c, "shape": str(s1), "position": "left"}, {"colour": c, "shape": str(s2), "position": "right"}]
        out.append({"objects": objs, "short": short_prompt(objs)})
    return out


def exercise_4(quick: bool = False) -> dict:
    """Exercise 4: write ``top_iou(a, b, k)`` (the starter's gap), then make all pairs the same colour *and* the same
    shape, different positions. Do the two shape words' regions still separate?

    Pair prompts ``a red circle on the left and a red circle on the right`` are sampled with capture; the
    notebook's binding overlap (IoU of the two shape words' top-12.5% regions,
    :func:`~unicache_lib.analysis.generation.word_maps` / ``top_region`` / ``iou``) is compared with same-colour,
    different-shape pairs. Same word twice: the only thing that can tell the two tokens apart is their
    position in the prompt.

    Expected on the shipped generators, measured (8 pairs of each kind, 20 steps): no. On PixArt the two
    shape words' regions are *identical* (IoU 1.00; two different shapes: 0.07, chance 0.07): its text encoder
    gives the repeated word the same output, so the image reads both alike. On the MMDiT they overlap 0.37
    against 0.30 for two different shapes (chance 0.07): they never separated well there, and the repeated
    word makes it slightly worse. Nothing in the word maps binds "circle #1" to the left object.
    """
    from unicache_lib.analysis import generation as G
    from unicache_lib.capture.gen_runner import capture_generation

    steps = _steps(quick)
    n = 2 if quick else 8
    rows = []
    for m in GENERATORS:
        g = _gen(m)
        for same_shape in (True, False):  # the starter runs both
            ps = _pair_prompts(n, same_shape)
            run = capture_generation(g, [p["short"] for p in ps], "pairs", None, steps, GUIDANCE, SEED, progress=False)
            for i, p in enumerate(ps):
                W = G.word_maps(run.result.records, run.sample_ids[i])
                toks = run.tokens[i]
                pos = [G.word_positions(toks, o["shape"]) for o in p["objects"]]
                a, b = (pos[0][0], pos[0][1]) if same_shape else (pos[0][0], pos[1][0])
                kk = max(1, int(round(0.125 * W.shape[1])))
                rows.append({"model": m, "pairs": "same colour, same shape" if same_shape else "same colour, two shapes",
                             "overlap": top_iou(W[a], W[b], kk),  # = G.iou(G.top_region(W[a], kk), G.top_region(W[b], kk))
                             "chance": G.chance_iou(kk, W.shape[1])})
    R = pd.DataFrame(rows).groupby(["model", "pairs"]).agg(overlap=("overlap", "mean"), chance=("chance", "mean"), n=("overlap", "size"))
    return {"table": "\n" + R.round(3).to_string(), "_table": R}


def exercise_5(quick: bool = False) -> dict:
    """Exercise 5: write ``token_shares(W)`` (the starter's gap) and rank PixArt's prompt tokens (the starter's
    generator, the last of ``GENERATORS``); then ``step_explorer`` on it: which prompt tokens do its image queries
    read, and what does that say about where colour and position information reach the image?

    The widget shows one (step, layer, head, word) at a time; the same question answered for all of them:
    from the cross-attention word maps (:func:`~unicache_lib.analysis.generation.word_maps`), each real prompt
    token's share of the image queries' attention, averaged over prompts, grouped by the word's role (colour,
    shape, position words, function words). What is left over goes to padding / end-of-text positions. The
    widget itself is built with ``step_explorer(run.result, images, tokens)`` on a full-mode capture (shown in
    the non-quick run).

    Expected on tiny-pixart, measured: padding is masked, so all the image queries' text attention lands on the
    real tokens (share 1.0), and about half of it on the end-of-text token ``</s>`` (0.49 per prompt in the quick
    run), which carries the encoder's summary of the whole prompt; the rest goes to the shape word (~0.2) and
    function words ("the", "a": ~0.28); position words get under 0.02. The colour word is read strongly in some
    prompts (``yellow`` 0.70 in one of the full run's 8) and hardly at all in others (0.01 in the quick run).
    So position does not reach the image as a word through cross-attention at all: it arrives through
    ``</s>``'s pooled context (and the image self-attention that lays the picture out); colour arrives through
    the colour word only for some colours, otherwise also through ``</s>``.
    """
    from unicache_lib.analysis import generation as G
    from unicache_lib.world.text import COLOURS, POSITIONS, SHAPES

    m_look = "tiny-pixart"  # the starter's generator
    steps = _steps(quick)
    run = _short_run(m_look, 2 if quick else 8, steps)
    pos_words = {w for p in POSITIONS for w in str(p).split()} | {"left", "right", "top", "bottom", "middle", "centre", "center"}
    rows = []
    for i, sid in enumerate(run.sample_ids):
        W = G.word_maps(run.result.records, sid)  # [tokens, image]
        per_tok = token_shares(W)
        for t, v in zip(run.tokens[i], per_tok):
            role = ("colour" if t in COLOURS else "shape" if t in SHAPES else "position" if t in pos_words
                    else "end of text" if t.startswith("<") or t.startswith("[") else "function")
            rows.append({"prompt": i, "token": t, "role": role, "share": float(v)})
    D = pd.DataFrame(rows)
    by_role = D.groupby(["prompt", "role"]).share.sum().unstack().fillna(0).mean().sort_values(ascending=False)
    by_token = D.groupby("token").share.mean().sort_values(ascending=False)
    real = D.groupby("prompt").share.sum().mean()
    out = {"share on real prompt tokens": round(float(real), 3), "share per prompt, by role (sum over the role's tokens)": by_role.round(4).to_dict(),
           "most-read tokens": by_token.head(8).round(3).to_dict(), "_by_role": by_role, "_real": real}
    if not quick:
        from unicache_lib.capture.gen_runner import capture_generation
        from unicache_lib.widgets import step_explorer

        maps = capture_generation(_gen("tiny-pixart"), [run.meta[0]["prompt"]], "maps", None, steps, GUIDANCE, SEED,
                                  mode="full", progress=False)
        step_explorer(maps.result, dict(zip(maps.sample_ids, maps.images)), dict(zip(maps.sample_ids, maps.tokens)))
        out["widget"] = "step_explorer built on a full-mode capture of one prompt (display it in a notebook)"
    return out


def next_steps(quick: bool = False) -> dict:
    """Next steps (★★★, on your own checkpoint; not an exercise): run the notebook on a diffusers pipeline folder of SD3 / PixArt /
    Flux / Sana with papermill, e.g.
    ``.venv/bin/papermill notebooks/03_diffusion_steps.ipynb outputs/03_mine.ipynb -y 'GENERATORS: ["/path/to/sd3"]'
    -p DEVICE cuda -y 'LAYERS: [0, 11, 23]' -p MAP_QUERY_STRIDE 8`` (lists go in with ``-y``), and compare with the
    shipped models: the lowest adjacent-step cosine (here >= 0.97), the knee at 0.7 (here step 1 everywhere) and the
    reuse window the decision table prints; then add ``step_skip(head=…)`` from that window to notebook 06's ``METHODS``.

    The calls, shown on a random-weight SD3-class stand-in built like the tests' pipeline folders
    (:func:`~unicache_lib.zoo.builders.tiny_pipelines.build_tiny`): load it with ``load_generator``, capture a few
    prompts' steps, and read knees and window as the notebook does.

    Expected on the stand-in: the code path runs end to end through a diffusers pipeline (joint attention,
    part ``joint``) and gives one knee per captured block; its numbers mean nothing (random weights). On a real
    SD3 at 1024² the study expects early cosines of 0.3–0.5, i.e. the 0.7 knee a few steps in, not at step 1.
    """
    import tempfile
    from pathlib import Path

    from unicache_lib.analysis import generation as G
    from unicache_lib.capture.gen_runner import capture_generation
    from unicache_lib.runtime.loaders import is_stand_in, load_generator
    from unicache_lib.world.text import prompt_set
    from unicache_lib.zoo.builders import tiny_pipelines as tp

    steps = 4 if quick else 8
    d = tp.build_tiny("sd3", Path(tempfile.mkdtemp()) / "sd3-stand-in")
    checkpoint = str(d)  # here a stand-in folder; yours is your pipeline's folder
    gen = load_generator(checkpoint)
    run = capture_generation(gen, [p["short"] for p in prompt_set(2, 0, SEED)], "own", None, steps, GUIDANCE, SEED, progress=False)
    T = G.step_table(run.result.records).assign(model="stand-in")
    K = G.knee_table(T, (0.7, 0.99))
    win = {t: G.reuse_window(K.loc["stand-in", f"knee (maps) @{t:g}"], steps) for t in (0.7, 0.99)}
    return {"stand-in": str(d), "random weights": is_stand_in(str(d)), "parts": sorted(T.part.unique()),
            "knees": "\n" + K.round(3).to_string(), "windows": win, "_K": K, "_steps": steps}


if __name__ == "__main__":
    _common.run_all(sys.modules[__name__], _common.parse(__doc__))
