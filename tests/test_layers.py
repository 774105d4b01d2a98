"""The layering contract (tools/layers.py): no import circle, function-local imports included; every module in a
named layer; no module importing from a layer above its own; training and test builders outside the runtime graph."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import layers  # noqa: E402

sys.path.remove(str(ROOT / "tools"))


def test_no_import_circle():
    assert layers.circles(layers.import_graph()) == []


def test_every_import_keeps_to_the_layers():
    assert layers.violations(layers.import_graph()) == []


def test_the_check_catches_what_it_forbids(tmp_path):
    """A planted upward import, a planted circle and a runtime module importing a training script are all named."""
    pkg = tmp_path / "unicache_lib"
    for sub in ("core", "kv", "zoo", "families"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "errors.py").write_text("def f():\n    from ..kv import cache  # a lazy import still counts\n")
    (pkg / "kv" / "cache.py").write_text("from ..core.errors import f\nfrom ..zoo.train_llava import x\n")
    (pkg / "zoo" / "train_llava.py").write_text("x = 1\n")
    (pkg / "odd_one.py").write_text("")
    G = layers.import_graph(tmp_path)
    assert layers.circles(G) == [["unicache_lib.core.errors", "unicache_lib.kv.cache"]]
    bad = "\n".join(layers.violations(G))
    assert "unicache_lib.core.errors (core) imports unicache_lib.kv" in bad
    assert "unicache_lib.kv.cache (features) imports unicache_lib.zoo.train_llava, in training / builder code" in bad
    assert "unicache_lib.odd_one belongs to no layer" in bad


def test_the_architecture_picture_is_generated_from_the_code():
    text = layers.DOC.read_text()
    assert layers.picture(layers.import_graph()) in text, "docs/ARCHITECTURE.md is stale: run python tools/layers.py --write"
