"""`dmem bench write` end to end at toy scale: the JSON contract and sane numbers.

Uses the session's Milvus server (``milvus_server_uri``) and a small workload so
the test stays well under 90 s; the real numbers live in BENCHMARKS.md.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dmem_bench import write as bw

pytestmark = pytest.mark.integration

KEYS = (
    "transitions", "encoder", "pipeline_tps", "raw_kafka_tps", "raw_encoder_tps",
    "raw_milvus_insert_tps", "ratio_vs_bottleneck", "latency_p50_ms", "latency_p99_ms", "workers",
)  # fmt: skip


def test_workload_is_mostly_dropped_material() -> None:
    rows = bw.make_workload(800)
    assert len(rows) == 800
    assert len({r["agent_id"] for r in rows}) == bw.N_AGENTS
    rewards = [r["reward"] for r in rows]
    assert rewards.count(-1.0) / len(rewards) > 0.7  # ordinary steps dominate
    k1, v1, ids1 = bw.rekey(rows, "a")
    _, _, ids2 = bw.rekey(rows, "b")
    assert len(set(ids1)) == len(rows) and not set(ids1) & set(ids2)


def test_bench_write_contract(milvus_server_uri: str, tmp_path: Path) -> None:
    out = bw.run(
        transitions=1500, encoder="hash", workers=1, repeats=1, batch_size=512,
        latency_transitions=300, milvus_uri=milvus_server_uri, results_dir=tmp_path,
        warmup=500,
    )  # fmt: skip
    for k in KEYS:
        assert k in out, k
    assert out["transitions"] == 1500 and out["workers"] == 1 and out["encoder"] == "hash"
    for k in ("pipeline_tps", "raw_kafka_tps", "raw_encoder_tps", "raw_milvus_insert_tps"):
        assert out[k] > 0 and math.isfinite(out[k]), k
    bottleneck = min(out["raw_kafka_tps"], out["raw_encoder_tps"], out["raw_milvus_insert_tps"])
    ratio = out["pipeline_tps"] / bottleneck
    assert out["ratio_vs_bottleneck"] == pytest.approx(ratio, rel=0.01, abs=6e-4)  # 3 places
    assert 0 < out["latency_p50_ms"] <= out["latency_p99_ms"]
    assert out["latency_missing"] == 0
    assert 0 < out["worker_batch_stats"]["stored_frac"] < 0.5  # the gate drops most
    assert (tmp_path / "write-hash-w1.json").is_file()
