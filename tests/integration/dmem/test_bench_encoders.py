"""`dmem bench encoders` at a tiny scale: its JSON contract, and that the encoders
are told apart on real text (the semantic static encoder beats hashing)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_bench_encoders_contract_tiny() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "dmem.cli", "bench", "encoders", "--encoders", "hash,minilm-static",
         "--no-pipeline", "--conversations", "1", "--repeats", "1", "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(out["encoders"]) == {"hash", "minilm-static"}
    for v in out["encoders"].values():
        assert v["raw_per_s"] > 0 and v["questions"] > 50
        assert 0.0 <= v["hit_at_5"] <= 1.0 and 0.0 <= v["mrr_at_10"] <= 1.0
        assert 0.0 < v["cache_hit_rate"] < 1.0
    enc = out["encoders"]
    assert enc["minilm-static"]["hit_at_5"] > enc["hash"]["hit_at_5"]
    assert out["default"] in ("minilm", "minilm-static", "hash", "passthrough")
