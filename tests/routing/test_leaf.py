"""Routing is a leaf: its modules import nothing of the gateway outside gateway.routing
(no API, configuration, database, accounting, errors, serving or tools)."""

from __future__ import annotations

import ast
from pathlib import Path

ROUTING = Path(__file__).resolve().parents[2] / "gateway" / "routing"


def gateway_imports(path: Path) -> set[str]:
    """Every gateway/pricing module a file imports, at any depth (lazy imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [node.module]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in ("gateway", "pricing"))
    return found


def test_routing_imports_only_routing() -> None:
    modules = sorted(ROUTING.glob("*.py"))
    assert len(modules) > 10
    outside = {
        f"{path.name}: {name}"
        for path in modules
        for name in gateway_imports(path)
        if not name.startswith("gateway.routing")
    }
    assert outside == set()


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from gateway.tools.sim import tokenizer\n")
    assert gateway_imports(module) == {"gateway.tools.sim"}
