"""`dmem bench embedded` at toy scale: the JSON contract of the last stdout line.

Milvus Lite and the hash encoder keep it to about a minute; the real numbers (the
embedded Milvus server, the default encoder, 10,000 memories) live in BENCHMARKS.md.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

KEYS = (
    "memories", "ingest_per_s", "search_p50_ms", "search_p99_ms", "kcat_ok",
    "confluent_kafka_ok", "openapi_valid", "ui_ok", "get_p50_ms", "get_p99_ms",
    "get_missing_p50_ms", "get_folded_p50_ms", "list_page_p50_ms", "history_p50_ms",
    "explorer_ok",
)  # fmt: skip
REPO = Path(__file__).resolve().parents[3]


def test_bench_embedded_contract() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "dmem.cli", "bench", "embedded", "--memories", "40",
           "--queries", "10", "--repeats", "1", "--warmup", "2", "--batch", "50",
           "--encoder", "hash", "--milvus", "lite", "--json"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for k in KEYS:
        assert k in out, k
    assert out["milvus_mode"] == "lite" and out["memories"] >= 40
    assert out["transitions"] >= out["memories"] and out["ingest_per_s"] > 0
    assert 0 < out["search_p50_ms"] <= out["search_p99_ms"] and math.isfinite(out["search_p99_ms"])
    assert out["openapi_valid"] is True
    assert out["confluent_kafka_ok"] is True and out["confluent_processed"] == 20
    assert isinstance(out["kcat_ok"], bool) and isinstance(out["ui_ok"], bool)
    if not out["kcat_ok"]:
        assert out["kcat_reason"]
    if not out["ui_ok"]:
        assert out["ui_reason"]
    assert 0 < out["get_p50_ms"] <= out["get_p99_ms"] and out["get_missing_p50_ms"] > 0
    # the walk comes after the fold step, whose first copies are new memories
    assert out["listed"] >= out["memories"] and out["list_page_p50_ms"] > 0
    if out["get_folded_n"]:
        assert out["get_folded_p50_ms"] > 0 and out["get_folded_again_p50_ms"] > 0
    # the server's share comes from its Server-Timing header; Lite has no raw baseline
    assert 0 < out["get_store_p50_ms"] <= out["get_server_p50_ms"]
    assert out["raw_get_p50_ms"] is None and out["get_p50_ratio"] is None
    assert out["raw_search_p50_ms"] is None and out["search_p50_ratio"] is None
    assert out["raw_page_p50_ms"] is None and out["list_page_p50_ratio"] is None
    assert out["raw_get_p99_ms"] is None and out["get_p99_ratio"] is None
    assert 0 < out["list_page_server_p50_ms"] <= out["list_page_p50_ms"]
    assert out["history_p50_ms"] > 0 and isinstance(out["explorer_ok"], bool)
    if not out["explorer_ok"]:
        assert out["explorer_reason"]
