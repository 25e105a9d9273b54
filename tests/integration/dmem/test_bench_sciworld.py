"""`dmem bench sciworld` at the smallest scale: the JSON contract, through the real stack.

One task, one train and one test variation, short random and closed-loop episodes,
hash encoder: the real ScienceWorld simulator (Java 17), broker, worker and Milvus
Lite. It checks the contract and that the numbers are consistent, not their size
(BENCHMARKS.md has the real run).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

KEYS = (
    "tasks", "episodes", "published", "storage_ratio_gate", "critical_coverage_gate",
    "reward_up_coverage_gate", "stored_buffer_gate", "storage_ratio_final",
    "critical_coverage_final", "precision_core_final", "probes", "hit_at_5_dmem",
    "hit_at_5_store_all", "hit_at_5_semantic_stored", "mrr_at_10_dmem", "mrr_at_10_store_all",
    "success_no_memory", "success_semantic", "success_hybrid", "score_no_memory",
    "score_semantic", "score_hybrid", "elapsed_s",
)  # fmt: skip


def test_bench_sciworld_contract(tmp_path: Path) -> None:
    if shutil.which("java") is None:
        pytest.fail("ScienceWorld needs Java 17: run scripts/setup.sh as root")
    from dmem_bench.sciworld import SciConfig, main

    cfg = SciConfig(
        tasks=("find-plant",),
        train_variations=1,
        test_variations=1,
        random_steps=4,
        loop_max_steps=4,
        encoder="hash",
        settle_s=2.0,
        out_dir=tmp_path,
        publish="step",
    )  # a live agent's micro-batches of one
    out = main(cfg, as_json=False)
    assert out["publish"] == "step"
    for k in KEYS:
        assert k in out, k
    assert out["tasks"] == 1 and out["episodes"] == 3
    assert out["published"] > 10  # gold find-plant alone is ~10 steps
    for k in KEYS:
        if k.startswith(
            ("storage_", "critical_", "reward_", "precision_", "hit_", "mrr_", "success_")
        ):
            assert 0.0 <= out[k] <= 1.0, k
        if k.startswith("score_"):
            assert 0.0 <= out[k] <= 100.0, k
    # two repeats per test variation and condition, paired
    assert out["loop_episodes"] == 2 and out["loop_repeats"] == 2
    # the credited condition waited for each episode's credit (quiet for 1 s each time)
    assert out["loop_credit_wait_s_hybrid"] >= 1.0 * out["loop_episodes"]
    assert out["score_diff_hybrid_no_memory"] == pytest.approx(
        out["score_hybrid"] - out["score_no_memory"], abs=0.02
    )
    assert out["probes"] > 0  # the test variation's gold episode is rewarded
    # the stored set is a subset of what was published: cosine over it can't beat the ceiling
    assert out["storage_ratio_gate"] > 0
    saved = json.loads((tmp_path / "sciworld.json").read_text())
    assert saved["result"]["published"] == out["published"]
    assert (tmp_path / "sciworld.png").stat().st_size > 0
