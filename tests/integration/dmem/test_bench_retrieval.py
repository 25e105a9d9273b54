"""`dmem bench retrieval --json` with tiny settings: the JSON contract of issue 3.

Runs the real thing (embedded Milvus server, broker, respond worker) as a
subprocess, exactly as a user would, and checks keys and sane values only; the
performance targets are checked by the full benchmark (BENCHMARKS.md), not here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from milvus.server import EmbeddedMilvusServer
from schemas.errors import ConfigError

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
KEYS = (
    "memories", "kafka_p50_ms", "kafka_p99_ms", "http_p50_ms", "http_p99_ms",
    "milvus_raw_p50_ms", "overhead_ratio_p50", "probe_hit_at_5_hybrid",
    "probe_hit_at_5_semantic", "probe_hit_at_5_store_all", "probes",
)  # fmt: skip


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory: pytest.TempPathFactory) -> dict:
    try:
        EmbeddedMilvusServer(tmp_path_factory.mktemp("probe")).check_installed()
    except ConfigError as exc:
        pytest.skip(str(exc))
    cmd = [
        sys.executable, "-m", "dmem.cli", "bench", "retrieval", "--json",
        "--memories", "2000", "--requests", "30", "--repeats", "1", "--warmup", "5",
        "--env", "cliffwalking", "--steps", "1500",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no stdout; stderr:\n{proc.stderr[-3000:]}"
    assert "latency at 2,000 memories" in proc.stderr  # the human table goes to stderr
    return json.loads(lines[-1])


def test_contract_keys_present(bench_json: dict) -> None:
    missing = [k for k in KEYS if k not in bench_json]
    assert not missing, missing
    assert bench_json["memories"] == 2000


def test_latencies_sane(bench_json: dict) -> None:
    r = bench_json
    for path in ("kafka", "http"):
        assert r[f"{path}_p99_ms"] >= r[f"{path}_p50_ms"] > 0
    assert r["milvus_raw_p99_ms"] >= r["milvus_raw_p50_ms"] > 0
    assert math.isclose(
        r["overhead_ratio_p50"], r["kafka_p50_ms"] / r["milvus_raw_p50_ms"], rel_tol=0.01
    )
    # a responder answer includes a Milvus search: it cannot beat the raw call by much
    assert r["kafka_p50_ms"] >= 0.5 * r["milvus_raw_p50_ms"]
    assert r["empty_responses"] == {"kafka": 0, "http": 0, "milvus_raw": 0}
    assert len(r["latency_repeats"]["kafka"]) == 1
    assert r["latency_repeats"]["kafka"][0]["n"] == 30


def test_quality_block_sane(bench_json: dict) -> None:
    r = bench_json
    assert r["probes"] > 0
    for key in (
        "probe_hit_at_5_hybrid",
        "probe_hit_at_5_semantic",
        "probe_hit_at_5_store_all",
        "probe_stored_gated",
    ):
        assert 0.0 <= r[key] <= 1.0, key
    # no ranking can find a memory the gate did not store
    assert r["probe_hit_at_5_hybrid"] <= r["probe_stored_gated"]
    assert r["probe_hit_at_5_semantic"] <= r["probe_stored_gated"]
    env = r["quality_by_env"]["cliffwalking"]
    assert env["probes"] == r["probes"]
    assert env["all_rows"] == 1500
    assert 0 < env["gated_rows"] < env["all_rows"]
