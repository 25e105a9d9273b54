"""One version: the package, the harness, the Helm chart and the compose file agree."""

from __future__ import annotations

import re
from pathlib import Path

import dmem

ROOT = Path(__file__).resolve().parents[2]


def test_the_chart_ships_the_package_version() -> None:
    chart = (ROOT / "charts" / "dmem" / "Chart.yaml").read_text()
    app_version = re.search(r'^appVersion:\s*"?([^"\n]+)"?', chart, re.M)
    assert app_version is not None and app_version.group(1) == dmem.__version__


def test_the_compose_file_runs_the_package_version() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    tags = re.findall(r"\$\{DMEM_IMAGE:-dmem:([^}]+)\}", compose)
    assert tags and set(tags) == {dmem.__version__}


def test_the_harness_reads_the_same_version_file() -> None:
    harness = ROOT / "bench" / "dmem_bench" / "_version.py"
    assert harness.read_text() == (ROOT / "dmem" / "_version.py").read_text()
