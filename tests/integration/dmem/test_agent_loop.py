"""examples/agent_loop.py against the real broker, write path, responder and Milvus Lite.

Why the assertion can fail meaningfully: both conditions draw the same random
numbers per episode, and the with-memory agent deviates from the no-memory
agent only when a retrieved memory vetoes an action. If retrieval returned
nothing useful (memories not written, wrong tenant, filters or ranking broken,
text mismatch), the two runs would be identical step for step and the fall
counts equal.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[3] / "examples" / "agent_loop.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dmem_example_agent_loop", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_agent_loop_with_memory_falls_less(tmp_path: Path, broker: str, topic_prefix: str) -> None:
    ex = load_example()
    # seed 4, 8 episodes: 20 falls without memory, 11 of them repeats of an earlier
    # (state, action); an instant, perfect memory would leave 10 falls (2 repeats)
    episodes, seed = 8, 4
    s = ex.run(
        episodes=episodes,
        seed=seed,
        data_dir=tmp_path / "data",
        broker_bootstrap=broker,
        topic_prefix=topic_prefix,
        quiet=True,
    )
    for key in (
        "episodes",
        "seed",
        "return_without_memory",
        "return_with_memory",
        "falls_without",
        "falls_with",
        "repeat_falls_without",
        "repeat_falls_with",
        "vetoes",
        "searches",
        "gate_falls",
        "returns_without",
        "returns_with",
    ):
        assert key in s, key
    assert s["episodes"] == episodes and s["seed"] == seed
    assert len(s["returns_without"]) == len(s["returns_with"]) == episodes
    assert s["searches"] > 0 and s["vetoes"] > 0
    assert s["gate_falls"]["falls_kept"] >= 1
    assert s["falls_with"] < s["falls_without"], s
    assert s["repeat_falls_with"] < s["repeat_falls_without"], s
    assert s["return_with_memory_all"] > s["return_without_memory_all"], s


def test_agent_loop_script_help_and_json_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The script runs from any directory; --json ends stdout with one JSON object."""
    import json
    import subprocess

    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    for flag in ("--episodes", "--seed", "--json"):
        assert flag in r.stdout
    ex = load_example()
    fake = {
        "episodes": 2,
        "seed": 5,
        "eval_last": 1,
        "epsilon": 0.25,
        "k": 5,
        "encoder": "hash",
        "return_without_memory": -120.0,
        "return_with_memory": -15.0,
        "return_without_memory_all": -120.0,
        "return_with_memory_all": -60.0,
        "falls_without": 2,
        "falls_with": 1,
        "falls_without_last": 1,
        "falls_with_last": 0,
        "vetoes": 1,
        "searches": 30,
        "search_p50_ms": 5.0,
        "search_p99_ms": 9.0,
        "elapsed_s": 1.0,
    }
    seen = {}

    def fake_run(**kw: object) -> dict:
        seen.update(kw)
        return fake

    monkeypatch.setattr(ex, "run", fake_run)
    assert ex.main(["--episodes", "2", "--seed", "5", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out.strip().splitlines()[-1]) == fake
    assert "without memory" in out.err and seen["episodes"] == 2 and seen["seed"] == 5
