"""Every third-party package the code imports is declared: the product's (`schemas`,
`operators`, `milvus`, `streams`, `dmem`) in pyproject.toml, core or an extra; the
harness's (`dmem_bench`) in bench/pyproject.toml or through its ``dmem[server]``.
And the core (no extras) is what the client needs: the server's packages are not in it.

Imports are read from the AST (lazy ones included); a module maps to its distribution
through the installed metadata, so this runs in the test environment, where every
extra is installed."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = {"schemas", "operators", "milvus", "streams", "dmem", "dmem_bench"}
PRODUCT = [ROOT / p for p in ("schemas", "operators", "milvus", "streams", "dmem")]
HARNESS = [ROOT / "bench" / "dmem_bench"]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> str:
    m = re.match(r"[A-Za-z0-9._-]+", req)
    assert m, req
    return _norm(m.group(0))


def _imported(folders: list[Path]) -> dict[str, str]:
    """Top-level third-party module -> one file importing it."""
    out: dict[str, str] = {}
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if (
                        top not in OURS
                        and top not in sys.stdlib_module_names
                        and top != "__future__"
                    ):
                        out.setdefault(top, str(path.relative_to(ROOT)))
    return out


def _project(path: Path) -> dict:
    return tomllib.loads(path.read_text())["project"]


def _undeclared(imported: dict[str, str], declared: set[str]) -> list[str]:
    dists = packages_distributions()
    bad = []
    for mod, where in sorted(imported.items()):
        names = {_norm(d) for d in dists.get(mod, [])}
        if not names & declared:
            bad.append(f"{mod} ({where}; distributions {sorted(names) or 'not installed'})")
    return bad


ROOT_PROJECT = _project(ROOT / "pyproject.toml")
CORE = {_req_name(r) for r in ROOT_PROJECT["dependencies"]}
EXTRAS = {
    name: {_req_name(r) for r in reqs}
    for name, reqs in ROOT_PROJECT["optional-dependencies"].items()
}


def test_the_product_declares_what_it_imports() -> None:
    declared = CORE | set().union(*(v for k, v in EXTRAS.items() if k != "test"))
    assert _undeclared(_imported(PRODUCT), declared) == []


def test_the_harness_declares_what_it_imports() -> None:
    bench = {_req_name(r) for r in _project(ROOT / "bench" / "pyproject.toml")["dependencies"]}
    assert "dmem" in bench
    declared = bench | CORE | EXTRAS["server"]
    assert _undeclared(_imported(HARNESS), declared) == []


def test_the_core_is_the_client() -> None:
    server = {
        "torch",
        "faust-streaming",
        "pymilvus",
        "milvus-lite",
        "sentence-transformers",
        "numpy",
        "gymnasium",
        "matplotlib",
    }
    assert CORE & server == set()
    assert "aiohttp" in CORE  # dmem.client imports it
