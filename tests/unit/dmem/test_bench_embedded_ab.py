"""The embedded bench's A/B against another revision: its order, summary and inputs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dmem_bench.embedded import ab_order, ab_summary, cpu_seconds, export_revision, wait_quiet
from schemas.errors import ConfigError
from streams.local.stack import REPO_ROOT, WorkerProcess


def test_each_round_is_ref_main_main_ref() -> None:
    assert ab_order(1) == ["ref", "main", "main", "ref"]
    order = ab_order(3)
    assert len(order) == 12
    # every prefix of whole rounds has as many runs of each code, and the drift of a
    # store over the run weighs on both: the mean position of each code is the same
    assert order.count("ref") == order.count("main") == 6
    pos = {c: sum(i for i, x in enumerate(order) if x == c) / 6 for c in ("ref", "main")}
    assert pos["ref"] == pos["main"]


def test_summary_is_medians_and_ratio_of_main_over_ref() -> None:
    runs = [
        {"code": "ref", "p50": 10.0, "p99": 40.0},
        {"code": "main", "p50": 9.0, "p99": 20.0},
        {"code": "main", "p50": 11.0, "p99": 30.0},
        {"code": "ref", "p50": 14.0, "p99": 60.0},
    ]
    out = ab_summary(runs)
    assert out["ab_search_p50_ms"] == {"ref": 12.0, "main": 10.0}
    assert out["ab_search_p99_ms"] == {"ref": 50.0, "main": 25.0}
    assert out["ab_search_p50_ratio"] == pytest.approx(10.0 / 12.0, abs=1e-3)
    assert out["ab_search_p99_ratio"] == 0.5
    assert out["ab_runs"] is runs


def test_summary_without_runs_of_a_code_has_no_ratio() -> None:
    out = ab_summary([{"code": "main", "p50": 9.0, "p99": 20.0}])
    assert out["ab_search_p50_ms"]["ref"] is None
    assert out["ab_search_p50_ratio"] is None


def test_export_revision_writes_that_revisions_tree(tmp_path: Path) -> None:
    dest = export_revision("HEAD", tmp_path / "ref")
    committed = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "show", "HEAD:streams/worker.py"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    assert (dest / "streams" / "worker.py").read_bytes() == committed


def test_export_revision_refuses_an_unknown_revision_and_an_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no-such-revision"):
        export_revision("no-such-revision", tmp_path / "ref")
    with pytest.raises(ConfigError, match="not a commit"):
        export_revision(f"--output={tmp_path / 'x.tar'}", tmp_path / "ref")
    assert not (tmp_path / "x.tar").exists()


def test_worker_runs_another_checkouts_code_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, object] = {}

    class _Popen:
        def __init__(self, args: list[str], **kw: object) -> None:
            seen.update(kw, args=args)

    monkeypatch.setattr(subprocess, "Popen", _Popen)
    other = tmp_path / "other"
    WorkerProcess("all", {}, tmp_path / "w.log", other).start()
    env = seen["env"]
    assert isinstance(env, dict)
    assert env["PYTHONPATH"].split(":")[0] == str(other)
    assert seen["cwd"] == other  # ``-m`` puts the working directory first on sys.path
    assert seen["args"] == [sys.executable, "-m", "streams.worker", "--role", "all"]
    seen.clear()
    WorkerProcess("all", {}, tmp_path / "w2.log").start()
    env = seen["env"]
    assert isinstance(env, dict)
    assert env["PYTHONPATH"].split(":")[0] == str(REPO_ROOT)
    assert seen["cwd"] is None  # this checkout's worker keeps the caller's directory


def test_wait_quiet_returns_once_the_process_is_idle_and_waits_out_a_busy_one() -> None:
    idle = subprocess.Popen(["sleep", "30"])
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        # shares far from both processes' on a loaded machine: a sleeping process uses
        # none, a spinning one more than 5 % of a core unless a score of others spin
        waited = wait_quiet(idle.pid, 0.05, 1.0, 10.0)
        assert 1.0 <= waited < 5.0
        assert wait_quiet(spin.pid, 0.05, 1.0, 2.5) >= 2.5  # never quiet: the timeout
        spent = cpu_seconds(spin.pid)
        assert spent is not None and spent > 0.1
    finally:
        for p in (idle, spin):
            p.kill()
            p.wait()


def test_cpu_seconds_of_no_process_is_none() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert cpu_seconds(dead.pid) is None
