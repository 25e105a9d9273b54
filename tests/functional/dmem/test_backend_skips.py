"""A backend that cannot run skips the tests that need it, with the reason: never a pass.

Runs an inner pytest session over the real integration fixtures with
``DMEM_TEST_BACKEND=containers`` and a Docker host that does not exist, so the result
is the same on machines with and without a Docker engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: the checkout first, then whatever the outer session was given (the harness's folder)
PYTHONPATH = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

INNER = """
from tests.integration.conftest import *  # noqa: F403

def test_needs_broker(broker):
    assert broker

def test_needs_milvus(milvus_server_uri):
    assert milvus_server_uri
"""


def test_unavailable_containers_backend_skips_with_reason(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {**os.environ, "DMEM_TEST_BACKEND": "containers",
           "DOCKER_HOST": f"unix://{tmp_path}/no-such.sock", "PYTHONPATH": PYTHONPATH}  # fmt: skip
    env.pop("DMEM_TEST_MILVUS_URI", None)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert "2 skipped" in text and "passed" not in text, text
    assert text.count("containers backend unavailable: no Docker engine answers") == 2, text
    assert "dmem integration backend (DMEM_TEST_BACKEND): containers (UNAVAILABLE" not in text


def test_auto_header_names_the_fallback(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text("def test_nothing():\n    assert 1 + 1 == 2\n")
    (tmp_path / "conftest.py").write_text("from tests.integration.conftest import *  # noqa\n"
                                          "from tests.integration.conftest import "
                                          "pytest_report_header  # noqa\n")  # fmt: skip
    env = {**os.environ, "DMEM_TEST_BACKEND": "auto",
           "DOCKER_HOST": f"unix://{tmp_path}/no-such.sock", "PYTHONPATH": PYTHONPATH}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir",
         str(tmp_path), str(tmp_path / "test_inner.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert "1 passed" in text, text
    assert (
        "integration backend (DMEM_TEST_BACKEND): embedded - auto fell back to embedded: "
        "no Docker engine answers" in text
    ), text
