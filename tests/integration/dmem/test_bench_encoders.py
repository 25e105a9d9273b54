"""`dmem bench encoders` at a tiny scale: its JSON contract.

The contract tests need no shared data: they write two small conversations in
LoCoMo's format (`test_bench_locomo.conversation`; the real data set is for
evaluation only and stays outside the repository). One runs the CLI with every
text encoder and no write path, one measures the write path in process against
the session's Milvus server. Only the last test reads the real LoCoMo data (the
folder ``DMEM_LOCOMO_DATA`` names), and skips, saying so, where it is not given.
The quality targets are the full benchmark's (BENCHMARKS.md "Encoders").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dmem_bench import encoders as be
from tests.integration.dmem.test_bench_locomo import PEOPLE, conversation

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
PER_ENCODER = ("raw_per_s", "hit_at_5", "mrr_at_10", "questions", "cache_hit_rate")


@pytest.fixture(scope="module")
def locomo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("locomo")
    for cid in PEOPLE:
        (data / f"{cid}.json").write_text(json.dumps(conversation(cid)))
    return data


def test_bench_encoders_contract_tiny(locomo_dir: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("DMEM_ENCODER__NAME", None)  # `default` is the settings' own default
    res = subprocess.run(
        [sys.executable, "-m", "dmem.cli", "bench", "encoders", "--encoders",
         "hash,minilm,minilm-static", "--no-pipeline", "--data", str(locomo_dir),
         "--repeats", "1", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(out["encoders"]) == {"hash", "minilm", "minilm-static"}
    assert out["default"] == "minilm-static"
    assert out["conversations"] == 2 and out["turns"] == 72 and out["questions"] == 18
    for name, v in out["encoders"].items():
        assert all(k in v for k in PER_ENCODER), name
        assert v["raw_per_s"] > 0 and v["questions"] == 18
        assert 0.0 <= v["mrr_at_10"] <= v["hit_at_5"] <= 1.0
        assert 0.0 < v["cache_hit_rate"] < 1.0
        assert "pipeline_tps" not in v  # --no-pipeline
    e = out["encoders"]
    # every question names its topic word for word: a text encoder finds the turn
    assert min(v["hit_at_5"] for v in e.values()) >= 0.8
    assert out["default_hit_at_5_delta"] == pytest.approx(
        e["minilm-static"]["hit_at_5"] - e["minilm"]["hit_at_5"], abs=1e-4
    )
    assert out["minilm_pipeline_tps"] is None and out["default_pipeline_tps"] is None


def test_bench_encoders_pipeline_tiny(
    locomo_dir: Path, milvus_server_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DMEM_ENCODER__NAME", raising=False)
    out = be.run(
        ["hash", "minilm-static"],
        repeats=1,
        transitions=300,
        data=locomo_dir,
        milvus_uri=milvus_server_uri,
    )
    assert out["default"] == "minilm-static"
    for name, v in out["encoders"].items():
        assert v["pipeline_transitions"] == 300, name
        assert v["pipeline_tps"] > 0 and v["pipeline_raw_encoder_tps"] > 0
        assert v["pipeline_vs_raw_encoder"] == pytest.approx(
            v["pipeline_tps"] / v["pipeline_raw_encoder_tps"], rel=0.01, abs=6e-4
        )  # 3 places
        assert len(v["pipeline_per_repeat"]) == 1
    assert out["default_pipeline_tps"] == out["encoders"]["minilm-static"]["pipeline_tps"]
    assert "default_hit_at_5_delta" not in out  # torch MiniLM was not measured


def test_static_beats_hashing_on_real_locomo() -> None:
    data = Path(os.environ.get("DMEM_LOCOMO_DATA", ""))
    if not os.environ.get("DMEM_LOCOMO_DATA") or not data.is_dir():
        pytest.skip("real LoCoMo data not given (DMEM_LOCOMO_DATA=<folder of its *.json>)")
    convs = be.load_locomo(data, limit=1)
    from operators.encoders import build_encoder

    hit = {
        n: be.quality(build_encoder(n, cache_size=0), convs)[0] for n in ("hash", "minilm-static")
    }
    assert hit["minilm-static"] > hit["hash"] + 0.1, hit
