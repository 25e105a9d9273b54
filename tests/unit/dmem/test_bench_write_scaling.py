"""`dmem bench write --workers 1,2,3`: speedup and efficiency against the first count."""

from __future__ import annotations

from typing import Any

from dmem_bench.write import scaling_summary


def result(tps: float, ratio: float) -> dict[str, Any]:
    return {"encoder": "hash", "transitions": 100, "repeats": 1, "pipeline_tps": tps,
            "ratio_vs_bottleneck": ratio, "bottleneck": "encoder",
            "worker_cpu_us_per_transition": 50.0, "latency_p50_ms": 10.0,
            "latency_p99_ms": 20.0, "machine": {"cpus": 2}}  # fmt: skip


def test_speedup_and_efficiency_per_worker_count() -> None:
    out = scaling_summary({1: result(1000.0, 0.5), 2: result(1500.0, 0.6),
                           3: result(900.0, 0.3)})  # fmt: skip
    assert out["workers"] == [1, 2, 3] and out["baseline_workers"] == 1
    two, three = out["by_workers"]["2"], out["by_workers"]["3"]
    assert two["speedup"] == 1.5 and two["efficiency"] == 0.75
    assert two["speedup_vs_bottleneck"] == 1.2 and two["efficiency_vs_bottleneck"] == 0.6
    assert three["speedup"] == 0.9 and three["efficiency"] == 0.3
    assert out["by_workers"]["1"]["efficiency"] == 1.0
