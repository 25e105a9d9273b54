"""`dmem bench chaos` scale-out figures from worker logs and MemoryEvents (no stack)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dmem_bench.chaos import BURST_WINDOW_MS, scale_out
from streams.write.consumer import ASSIGNMENT_LOG


def line(gen: int, at_ms: int, parts: list[int], restored: int, seeded: int = 0) -> str:
    return "[info] " + ASSIGNMENT_LOG % (gen, at_ms, parts, restored, seeded, 0.1) + "\n"


def judged(t0: int, t1: int, n: int, core_every: int) -> list[dict[str, Any]]:
    step = (t1 - t0) // n
    return [{"kind": "written" if i % core_every == 0 else "dropped", "ts": t0 + i * step,
             "route": "core" if i % core_every == 0 else "drop", "reason": "x"}
            for i in range(n)]  # fmt: skip


def test_rebalances_restores_and_core_burst(tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    t = 1_000_000
    a.write_text(line(1, t, [0, 1, 2, 3], 0, 2) + line(2, t + 100_000, [0, 1], 3))
    b.write_text(line(2, t + 100_050, [2, 3], 4) + "noise\n")
    kill = t + 100_000
    events = judged(kill - BURST_WINDOW_MS, kill, 600, 10)  # steady: 1 core in 10
    events += judged(kill, kill + BURST_WINDOW_MS, 600, 4)  # after the rebalance: 1 in 4
    events += [{"kind": "written", "ts": kill + 1, "route": "core", "reason": "retrospective"}]
    out = scale_out([a, b, tmp_path / "missing.log"], events)
    assert out["rebalances"] == 1  # generation 2 after the first
    assert out["state_restores"] == 7 and out["state_seeds"] == 2
    assert out["core_burst_windows"] == 1
    assert abs(out["core_burst_ratio"] - (1 / 4) / (1 / 10)) < 0.05


def test_rebalance_without_enough_traffic_is_not_compared(tmp_path: Path) -> None:
    a = tmp_path / "a.log"
    a.write_text(line(1, 0, [0], 0) + line(2, 10, [0], 1))
    out = scale_out([a], judged(20, 1000, 50, 2))
    assert out["rebalances"] == 1 and out["core_burst_ratio"] is None
    assert out["core_burst_windows"] == 0


def test_generation_numbers_reused_after_the_group_emptied_are_new_rebalances(
    tmp_path: Path,
) -> None:
    """One worker killed twice: every restart joins an empty group at generation 0 again."""
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    for i, p in enumerate(logs):
        p.write_text(line(0, 100_000 * i, [0, 1, 2, 3], i))
    out = scale_out(logs, [])
    assert out["rebalances"] == 2 and out["state_restores"] == 3


def test_a_single_worker_restarted_soon_after_is_a_new_rebalance(tmp_path: Path) -> None:
    """One worker killed twice within REBALANCE_SPAN_MS: each restart joins the emptied
    group at generation 0 again, seconds apart; a one-worker group has one member per
    rebalance, so they are not one rebalance of three members (CI saw 0)."""
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    for i, p in enumerate(logs):
        p.write_text(line(0, 1_000_000 + 5_000 * i, [0, 1, 2, 3], 0))
    assert scale_out(logs, [], workers=1)["rebalances"] == 2
    assert scale_out(logs, [])["rebalances"] == 0  # without the group size: merged
