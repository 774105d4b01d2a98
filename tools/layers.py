"""The layering contract of ``unicache_lib``, and the import graph it is checked on.

    python tools/layers.py            # the layers, each with its modules, and any import that breaks the contract
    python tools/layers.py --write    # regenerate the picture in docs/ARCHITECTURE.md (tests/test_layers.py compares)

Every import counts, function-local ones included (a lazy import hides a dependency; it does not remove it).
A module may import from its own layer or any layer below; nothing in the runtime layers may import training
scripts or test builders (:data:`OUTSIDE`), which may import anything. ``tests/test_layers.py`` runs this in
``make test``, with no import circle allowed anywhere.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "unicache_lib"

# (layer, what it holds, module pattern relative to the package); lowest first
LAYERS = [
    ("core", "errors, model plumbing, registries, modalities, similarity, scoring, intervals, paths, progress, locks",
     r"core(\..*)?|paths|progress|locks|intervals|quality|__root__"),
    ("world", "the synthetic world, its held-out data, the shipped models' architectures and their input layouts",
     r"world(\..*)?|zoo|zoo\.tiny_llava|zoo\.tiny_generators|runtime\.tiny_layouts"),
    ("adapters", "per-family facts (VLM and generator adapters), input checking, attention statistics",
     r"families(\..*)?|gen_families(\..*)?|inputs|stats"),
    ("capture", "attention capture, the store, model loading and sampling",
     r"capture(\..*)?|store|runtime|runtime\.(loaders|sampling|checksums|pipelines|controls)"),
    ("features", "analyses, KV eviction, step reuse, head pruning",
     r"analysis|analysis\.(?!\w+_claims$)\w+|kv(\..*)?|reuse(\..*)?|pruning(\..*)?"),
    ("reporting", "each lesson's record and claims, diagnostics, scoreboards, plots, widgets and the explorer, notebook "
                  "parameters",
     r"lessons|claims|analysis\.\w+_claims|diagnostics(\..*)?|scoreboard|tables|plots|widgets|explorer(\..*)?|"
     r"params|replicate"),
]
# training scripts, test and stand-in builders, make-target drivers: outside the runtime graph
OUTSIDE = r"zoo\.(train|builders)(\..*)?|zoo\.shipping|rehearsal"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT) -> nx.DiGraph:
    """Module -> module edges for every import of the package's own modules, function-local ones included."""
    mods = {module_name(p, root): p for p in (root / PACKAGE).rglob("*.py")}
    G = nx.DiGraph()
    G.add_nodes_from(mods)
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" for a in node.names] if base.startswith(PACKAGE) else []
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith(PACKAGE)]
            else:
                continue
            for t in targets:
                while t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != m:
                    G.add_edge(m, t)
    return G


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS`, ``len(LAYERS)`` for :data:`OUTSIDE`, None for a module no layer names."""
    rel = module[len(PACKAGE) + 1:] if module != PACKAGE else "__root__"
    if re.fullmatch(OUTSIDE, rel):
        return len(LAYERS)
    for i, (_, _, pattern) in enumerate(LAYERS):
        if re.fullmatch(pattern, rel):
            return i
    return None


def violations(G: nx.DiGraph) -> list[str]:
    """Every import that breaks the contract, and every module no layer names, as sentences."""
    out = [f"{m} belongs to no layer: add it to LAYERS or OUTSIDE in tools/layers.py" for m in G if layer_of(m) is None]
    for a, b in G.edges():
        la, lb = layer_of(a), layer_of(b)
        if None in (la, lb) or lb <= la:
            continue
        what = "training / builder code" if lb == len(LAYERS) else f"the {LAYERS[lb][0]} layer"
        out.append(f"{a} ({LAYERS[la][0] if la < len(LAYERS) else 'outside'}) imports {b}, in {what} above it")
    return sorted(out)


def circles(G: nx.DiGraph) -> list[list[str]]:
    """Every import circle (strongly connected group of more than one module)."""
    return sorted(sorted(c) for c in nx.strongly_connected_components(G) if len(c) > 1)


DOC = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN, END = "<!-- layers: generated by tools/layers.py --write -->", "<!-- end of generated layers -->"


def picture(G: nx.DiGraph) -> str:
    """The layers as one mermaid diagram (each box: the layer's packages and modules, with module counts) and the
    number of imports between each pair of layers, from the import graph itself."""
    def groups(i):
        mods = [m[len(PACKAGE) + 1:] or PACKAGE for m in G if layer_of(m) == i]
        by = {}
        for m in mods:
            top = ".".join(m.split(".")[:2]) if m.startswith(("zoo.train", "zoo.builders")) else \
                m.split(".")[0] if not m.startswith(("zoo.", "runtime.tiny_layouts")) else m
            by.setdefault(top, []).append(m)
        return ", ".join(f"{k} ({len(v)})" if len(v) > 1 else k for k, v in sorted(by.items()))
    names = [n for n, _, _ in LAYERS] + ["outside"]
    lines = ["```mermaid", "flowchart TB"]
    for i, name in enumerate(names):
        what = LAYERS[i][1] if i < len(LAYERS) else "training scripts, test and stand-in builders, make-target drivers"
        lines.append(f'    L{i}["<b>{i} {name}</b>: {what}<br/><i>{groups(i)}</i>"]')
    counts = {}
    for a, b in G.edges():
        la, lb = layer_of(a), layer_of(b)
        if la != lb:
            counts[(la, lb)] = counts.get((la, lb), 0) + 1
    for (la, lb), n in sorted(counts.items()):
        lines.append(f"    L{la} -->|{n}| L{lb}")
    lines.append("```")
    return "\n".join(lines)


def write_doc(G: nx.DiGraph) -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    DOC.write_text(f"{head}{BEGIN}\n{picture(G)}\n{END}{tail}")


def main(argv=None) -> int:
    G = import_graph()
    if "--write" in (sys.argv[1:] if argv is None else argv):
        write_doc(G)
        print(f"wrote {DOC.relative_to(ROOT)}")
    for i, (name, what, _) in enumerate(LAYERS):
        mods = sorted(m for m in G if layer_of(m) == i)
        print(f"{i} {name}: {what}\n    " + ", ".join(m[len(PACKAGE) + 1:] or PACKAGE for m in mods))
    print("outside: " + ", ".join(sorted(m[len(PACKAGE) + 1:] for m in G if layer_of(m) == len(LAYERS))))
    bad, loops = violations(G), circles(G)
    for line in bad:
        print("BREAKS THE CONTRACT:", line)
    for c in loops:
        print("IMPORT CIRCLE:", " <-> ".join(c))
    print(f"{G.number_of_nodes()} modules, {G.number_of_edges()} imports; {len(bad)} break the contract, {len(loops)} circles")
    return 1 if bad or loops else 0


if __name__ == "__main__":
    sys.exit(main())
