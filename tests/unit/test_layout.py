"""The house rules of the layout (docs/architecture.md "Layout"), checked on the source itself.

Every import of the project's packages is read from the AST, module-level and
lazy (inside functions) alike: a lazy import is still a dependency and can still
close a cycle at run time. The benchmark harness (`dmem_bench`, in ``bench/``) sits
on top of everything; `dmem` reaches it only through the ``dmem.cli`` entry points.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "operators", "milvus", "streams", "dmem", "dmem_bench")
#: where each package's folder is, relative to the repository root
FOLDERS = {pkg: Path(pkg) for pkg in PACKAGES} | {"dmem_bench": Path("bench", "dmem_bench")}
#: which top-level packages each package may import (docs/architecture.md's table)
ALLOWED = {
    "schemas": {"schemas"},
    "operators": {"schemas", "operators"},
    "milvus": {"schemas", "milvus"},
    "streams": {"schemas", "operators", "milvus", "streams"},
    "dmem": {"schemas", "operators", "milvus", "streams", "dmem"},
    "dmem_bench": set(PACKAGES),
}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        base = ROOT / FOLDERS[pkg]
        for path in base.rglob("*.py"):
            parts = [pkg, *path.relative_to(base).with_suffix("").parts]
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
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
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
    for sub in (
        "streams.write",
        "streams.respond",
        "streams.jobs",
        "streams.local",
        "dmem_bench.cli",
    ):
        assert sub in MODULES, sub
    assert "dmem.cli" in MODULES and "dmem.client" in MODULES
    assert not any(
        m.startswith(("dmem.bench", "dmem.demo", "dmem.deploycheck", "dmem.report"))
        for m in MODULES
    )


@pytest.mark.parametrize("pkg", PACKAGES)
def test_packages_import_only_what_they_may(pkg: str) -> None:
    bad = sorted(
        f"{mod} -> {dep}"
        for mod, deps in GRAPH.items()
        if mod.split(".")[0] == pkg
        for dep in deps
        if dep.split(".")[0] not in ALLOWED[pkg]
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
