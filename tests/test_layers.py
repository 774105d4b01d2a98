"""The layering contract (tools/layers.py): no import circle, function-local imports included; every module in a
named layer; no module importing from a layer above its own; training and test builders outside the runtime graph."""
import re
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


def test_the_features_run_on_the_runtime_not_the_zoo():
    """Loading and sampling any model is unicache_lib.runtime; the shipped toys, their builders and training stay in
    zoo, which capture, kv, reuse, pruning and params never import (function-local imports included)."""
    G = layers.import_graph()
    users = re.compile(r"unicache_lib\.(capture|kv|reuse|pruning)(\..*)?|unicache_lib\.params")
    found = sorted(f"{a} imports {b}" for a, b in G.edges()
                   if users.fullmatch(a) and (b == "unicache_lib.zoo" or b.startswith("unicache_lib.zoo.")))
    assert found == []
    assert G.has_edge("unicache_lib.capture.runner", "unicache_lib.runtime.loaders")  # the check sees the imports

def test_the_check_catches_what_it_forbids(tmp_path):
    """A planted upward import, a planted circle and a runtime module importing a training script are all named."""
    pkg = tmp_path / "unicache_lib"
    for sub in ("core", "kv", "zoo", "families"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "errors.py").write_text("def f():\n    from ..kv import cache  # a lazy import still counts\n")
    (pkg / "kv" / "cache.py").write_text("from ..core.errors import f\nfrom ..zoo.train.llava import x\n")
    (pkg / "zoo" / "train").mkdir()
    (pkg / "zoo" / "train" / "__init__.py").write_text("")
    (pkg / "zoo" / "train" / "llava.py").write_text("x = 1\n")
    (pkg / "odd_one.py").write_text("")
    G = layers.import_graph(tmp_path)
    assert layers.circles(G) == [["unicache_lib.core.errors", "unicache_lib.kv.cache"]]
    bad = "\n".join(layers.violations(G))
    assert "unicache_lib.core.errors (core) imports unicache_lib.kv" in bad
    assert "unicache_lib.kv.cache (features) imports unicache_lib.zoo.train.llava, in training / builder code" in bad
    assert "unicache_lib.odd_one belongs to no layer" in bad


def test_the_architecture_picture_is_generated_from_the_code():
    text = layers.DOC.read_text()
    assert layers.picture(layers.import_graph()) in text, "docs/ARCHITECTURE.md is stale: run python tools/layers.py --write"


# private internals of torch, transformers and diffusers the workbench needs (no public API): attribute accesses,
# getattr strings and helper names; only core/compat.py may use them
_PRIVATE_FRAMEWORK = re.compile(
    r"\.(_global_mapping|_diffusers_hook|_hook_order|_child_registries_cache|_attn_implementation|_orig_mod|_tokenizer|"
    r"_registry)\b|['\"](_diffusers_hook|_attn_implementation|_orig_mod|_scaled_dot_product_flash_attention_for_cpu)['\"]|"
    r"\b(_set_cache_context|_get_qkv_projections|_ALL_TRANSFORMER_BLOCK_IDENTIFIERS)\b")
_FRAMEWORKS = ("torch", "transformers", "diffusers")


def _private_framework_uses(path: Path) -> list[str]:
    import ast

    src = path.read_text()
    found = [m.group(0) for m in _PRIVATE_FRAMEWORK.finditer(src)]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in _FRAMEWORKS:
            private_module = any(part.startswith("_") for part in node.module.split("."))
            private_names = [a.name for a in node.names if a.name.startswith("_")]
            if private_module or private_names:
                found.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
    return found


def test_private_framework_internals_live_in_one_compatibility_module():
    """Every use of a framework's private internals is in unicache_lib/core/compat.py (which names the versions it was
    checked against), so an upgrade that moves one breaks one function; the check finds a planted one."""
    pkg = ROOT / "unicache_lib"
    compat = pkg / "core" / "compat.py"
    offenders = {str(p.relative_to(ROOT)): u for p in sorted(pkg.rglob("*.py")) if p != compat
                 for u in [_private_framework_uses(p)] if u}
    assert offenders == {}
    assert _private_framework_uses(compat)  # the names are where they belong
    from unicache_lib.core.compat import CHECKED

    assert {"torch", "transformers", "diffusers"} <= set(CHECKED)


def test_the_private_use_check_catches_one(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text("from diffusers.hooks._helpers import TransformerBlockRegistry\nx = cfg._attn_implementation\n")
    assert _private_framework_uses(planted) == ["._attn_implementation",
                                                "from diffusers.hooks._helpers import TransformerBlockRegistry"]
