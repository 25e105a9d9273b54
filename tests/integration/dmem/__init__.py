"""Shared by the `dmem` command tests: the command line and `dmem up` as a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DMEM = [sys.executable, "-m", "dmem.cli"]
REPO = Path(__file__).resolve().parents[3]


def spawn_up(data: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """`dmem up --json` on `data` with exactly `env` (and `args`); its first stdout line
    is the JSON."""
    return subprocess.Popen(
        DMEM + ["up", "--json", "--data-dir", str(data), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
