"""The layout's rules, read from the code: which package may import which, and where
SQLAlchemy, litellm and the environment may be touched.

    api → serving → routing / upstream / accounting → pricing → (nothing of the gateway's)
    db below accounting; tools (sim, replay, cachetest, demo) beside the service, depending
    on it and never the reverse; only gateway/config.py reads the environment.

Every import counts, a lazy one inside a function too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("gateway", "pricing", "dashboard")

# Each unit, and the units of this repository it may import. A unit is a top-level package,
# or a subpackage or module of gateway (gateway.tools as one).
LOWER = {
    "pricing": set(),
    "gateway.errors": set(),
    "gateway.usage": {"pricing"},
    "gateway.routing": set(),
    "gateway.mirror": set(),
    "gateway.invoices": {"pricing"},
    "gateway.budgets": {"gateway.errors"},
    "gateway.config": {"gateway.errors"},
    "gateway.auth": {"gateway.errors", "gateway.mirror"},
    "gateway.db": {
        "pricing",
        "gateway.errors",
        "gateway.auth",
        "gateway.mirror",
        "gateway.budgets",
    },
    "gateway.directory": {
        "pricing",
        "gateway.auth",
        "gateway.db",
        "gateway.errors",
        "gateway.mirror",
    },
    "gateway.accounting": {"pricing", "gateway.db", "gateway.errors", "gateway.usage"},
    "gateway.upstream": {"gateway.config", "gateway.errors", "gateway.usage"},
    "gateway.metrics": {"gateway.accounting"},
    "gateway.server": {"gateway.config", "gateway.errors"},
    "gateway.billing": {"pricing", "gateway.db", "gateway.errors", "gateway.usage"},
}
LOWER["gateway.serving"] = {
    "pricing",
    "gateway.budgets",
    "gateway.mirror",
    "gateway.accounting",
    "gateway.db",
    "gateway.auth",
    "gateway.config",
    "gateway.errors",
    "gateway.metrics",
    "gateway.routing",
    "gateway.upstream",
    "gateway.usage",
}
LOWER["gateway.api"] = LOWER["gateway.serving"] | {
    "gateway.serving",
    "gateway.billing",
    "gateway.db",
}
SERVICE = {unit for units in LOWER.values() for unit in units} | set(LOWER)
LOWER["gateway.app"] = SERVICE | {"gateway.api"}
LOWER["dashboard"] = {
    "pricing",
    "gateway.billing",
    "gateway.config",
    "gateway.db",
    "gateway.errors",
}
# The tools and the command line stand beside the service and may use all of it.
LOWER["gateway.tools"] = SERVICE | {"gateway.api", "gateway.app", "dashboard"}
LOWER["gateway.cli"] = LOWER["gateway.tools"] | {"gateway.tools"}


@dataclass(frozen=True, slots=True)
class Import:
    path: str
    line: int
    module: str


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path, root: Path = REPO) -> Iterator[Import]:
    where = str(path.relative_to(root))
    for node in ast.walk(ast.parse(path.read_text(), filename=where)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(where, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield Import(where, node.lineno, node.module)
            for alias in node.names:  # `from gateway import billing` imports gateway.billing
                yield Import(where, node.lineno, f"{node.module}.{alias.name}")


def unit(module: str) -> str | None:
    """The unit a module belongs to; None outside this repository's packages."""
    parts = module.split(".")
    if parts[0] in ("pricing", "dashboard"):
        return parts[0]
    if parts[0] != "gateway" or len(parts) == 1:
        return None
    if parts[1].startswith("cli_"):  # the command line's own modules
        return "gateway.cli"
    return ".".join(parts[:2])


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def test_every_unit_has_rules() -> None:
    """A new package or top-level module of gateway gets a line in LOWER."""
    units = {unit(_module_of(path)) for path in _sources()} - {None}
    assert units <= set(LOWER), sorted(units - set(LOWER))


def test_dependencies_point_one_way() -> None:
    """No import against the layout's direction (see the module docstring)."""
    wrong = []
    for path in _sources():
        source = unit(_module_of(path))
        if source is None:
            continue
        for found in _imports(path):
            target = unit(found.module)
            if target is not None and target != source and target not in LOWER[source]:
                wrong.append(f"{found.path}:{found.line} {source} -> {target} ({found.module})")
    assert not wrong, "\n".join(sorted(set(wrong)))


@pytest.mark.parametrize(
    ("library", "allowed"),
    [
        ("sqlalchemy", ("gateway/db/",)),
        ("alembic", ("gateway/db/",)),
        ("litellm", ("gateway/upstream/providers.py", "gateway/upstream/adapters.py")),
    ],
)
def test_libraries_stay_in_their_module(library: str, allowed: tuple[str, ...]) -> None:
    """SQLAlchemy and alembic only in gateway/db; litellm only in upstream/providers.py and
    upstream/adapters.py."""
    wrong = [
        f"{found.path}:{found.line} {found.module}"
        for path in _sources()
        for found in _imports(path)
        if found.module.split(".")[0] == library and not found.path.startswith(allowed)
    ]
    assert not wrong, "\n".join(wrong)


def test_only_config_reads_the_environment() -> None:
    """os.environ, os.getenv and os.putenv appear in gateway/config.py alone."""
    wrong = []
    for path in _sources():
        where = str(path.relative_to(REPO))
        if where == "gateway/config.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id == "os" and node.attr in ("environ", "getenv", "putenv"):
                    name = f"os.{node.attr}"
            elif isinstance(node, ast.ImportFrom) and node.module == "os":
                names = {a.name for a in node.names} & {"environ", "getenv", "putenv"}
                name = ", ".join(sorted(names)) or None
            if name:
                wrong.append(f"{where}:{node.lineno} {name}")
    assert not wrong, "\n".join(wrong)


def test_the_rules_catch_a_wrong_edge(tmp_path: Path) -> None:
    """The reader sees lazy imports inside functions, and `from x import module` forms."""
    source = tmp_path / "probe.py"
    source.write_text(
        "def f():\n    from gateway import api\n    import gateway.db.session\n"
        "from gateway.routing.fleet import Fleet\n"
    )
    found = {(i.line, i.module) for i in _imports(source, tmp_path)}
    assert {(2, "gateway.api"), (3, "gateway.db.session"), (4, "gateway.routing.fleet")} <= found
    assert "gateway.api" not in LOWER["gateway.routing"]
