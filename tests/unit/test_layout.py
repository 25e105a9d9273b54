"""The house rules of the layout (docs/architecture.md "Layout"), checked on the source itself.

Every import of the project's packages is read from the AST, module-level and
lazy (inside functions) alike: a lazy import is still a dependency and can still
close a cycle at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "operators", "milvus", "streams", "dmem")
#: which top-level packages each package may import (the table in docs/architecture.md)
ALLOWED = {
    "schemas": {"schemas"},
    "operators": {"schemas", "operators"},
    "milvus": {"schemas", "milvus"},
    "streams": {"schemas", "operators", "milvus", "streams"},
    "dmem": set(PACKAGES),
}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Project modules that `name` imports (a `from pkg import sub` that names a module
    counts as importing that module)."""
    found: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_the_layout_has_its_packages() -> None:
    for sub in ("streams.write", "streams.respond", "streams.jobs", "streams.local", "dmem.bench"):
        assert sub in MODULES, sub
    assert "dmem.cli" in MODULES and "dmem.client" in MODULES


@pytest.mark.parametrize("pkg", PACKAGES)
def test_packages_import_only_what_they_may(pkg: str) -> None:
    bad = sorted(
        f"{mod} -> {dep}"
        for mod, deps in GRAPH.items() if mod.split(".")[0] == pkg
        for dep in deps if dep.split(".")[0] not in ALLOWED[pkg]
    )
    assert bad == []


def test_no_import_cycle() -> None:
    """Tarjan's strongly connected components: every component must be one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_cycle_check_can_fail() -> None:
    """The checker itself finds a planted cycle (so an empty answer means something)."""
    saved = {k: set(v) for k, v in GRAPH.items()}
    try:
        GRAPH["streams.settings"].add("streams.app")
        GRAPH["streams.app"].add("streams.settings")
        with pytest.raises(AssertionError):
            test_no_import_cycle()
    finally:
        GRAPH.clear()
        GRAPH.update(saved)
