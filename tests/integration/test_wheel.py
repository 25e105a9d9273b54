"""The dmem wheel is the product only: no benchmark harness, typed, and its unconditional
requirements are the client's (the stream processor is the ``server`` extra).

Builds the wheel from a copy of the packaged files (so the checkout gets no build
folders) without build isolation: it needs setuptools in the running environment and
no network."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "operators", "milvus", "streams", "dmem")
#: what `pip install dmem` (no extras) must not pull
SERVER_OR_HARNESS = (
    "torch",
    "faust-streaming",
    "pymilvus",
    "milvus-lite",
    "sentence-transformers",
    "gymnasium",
    "matplotlib",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("setuptools", reason="building the wheel needs setuptools")
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(
            ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = out.glob("dmem-*.whl")
    return whl


def test_the_wheel_holds_no_harness_and_is_typed(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    harness = [
        n
        for n in names
        if n.startswith(("dmem/bench/", "dmem_bench/", "bench/"))
        or Path(n).name in ("demo.py", "deploycheck.py")
    ]
    assert harness == []
    assert "dmem/py.typed" in names
    assert {n.split("/")[0] for n in names if "/" in n and ".dist-info" not in n} == set(PACKAGES)


def test_the_wheel_requires_only_the_client(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        msg = Parser().parsestr(zf.read(meta).decode())
    requires = msg.get_all("Requires-Dist") or []
    unconditional = [r for r in requires if "extra ==" not in r]
    names = {re.match(r"[A-Za-z0-9._-]+", r).group(0).lower() for r in unconditional}  # type: ignore[union-attr]
    assert not names & set(SERVER_OR_HARNESS), unconditional
    assert "aiohttp" in names  # dmem.client imports it
    server = [r for r in requires if 'extra == "server"' in r]
    assert any(r.startswith("torch") for r in server), requires
