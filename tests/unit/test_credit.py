"""Credit assignment: joins, duplicates, order, TTL, fairness, idempotent application."""

from __future__ import annotations

import random

import pytest

from operators.credit import CreditAssigner, OutcomeRecord, UsageRecord, apply_utility


def usage(rid: str, step: int, ids: list[str], weights: list[float]) -> UsageRecord:
    return UsageRecord(rid, step, tuple(ids), tuple(weights))


def test_credit_is_weighted_discounted_advantage_per_use() -> None:
    ca = CreditAssigner(gamma=0.5)
    ca.on_usage("t", "e1", usage("r1", 0, ["a", "b"], [0.75, 0.25]), 0)
    ca.on_usage("t", "e1", usage("r2", 1, ["a"], [1.0]), 1)
    ups = {u.memory_id: u for u in ca.on_outcome("t", "e1", OutcomeRecord("o", 8.0, 2), 2)}
    # baseline is 0 for the first episode; G_0 = 0.25 * 8 = 2, G_1 = 0.5 * 8 = 4
    assert ups["a"].credit == pytest.approx((2 * 0.75 + 4 * 1.0) / 2)
    assert ups["a"].uses == 2
    assert ups["b"].credit == pytest.approx(2 * 0.25)
    assert ups["b"].uses == 1


def test_duplicate_outcome_is_ignored_and_counted() -> None:
    ca = CreditAssigner()
    ca.on_usage("t", "e", usage("r", 0, ["m"], [1.0]), 0)
    first = ca.on_outcome("t", "e", OutcomeRecord("o", 1.0), 1)
    again = ca.on_outcome("t", "e", OutcomeRecord("o", 1.0), 2)
    assert len(first) == 1 and again == []
    assert ca.duplicate_outcomes == 1


def test_late_usage_after_outcome_is_credited_once() -> None:
    ca = CreditAssigner(gamma=1.0)
    assert ca.on_outcome("t", "e", OutcomeRecord("o", 5.0, 3), 0) == []
    ups = ca.on_usage("t", "e", usage("r", 1, ["m"], [1.0]), 10)
    assert [u.memory_id for u in ups] == ["m"] and ups[0].credit == pytest.approx(5.0)
    assert ca.on_usage("t", "e", usage("r", 1, ["m"], [1.0]), 11) == []  # redelivered usage


def test_missing_outcome_expires_without_credit() -> None:
    ca = CreditAssigner(ttl_ms=1000)
    ca.on_usage("t", "e", usage("r", 0, ["m"], [1.0]), 0)
    assert ca.expire(500) == 0
    assert ca.expire(5000) == 1
    assert ca.expired_without_outcome == 1
    assert ca.on_outcome("t", "e", OutcomeRecord("o", 1.0), 6000) == []


def test_update_ids_are_deterministic_across_a_rebuild() -> None:
    def run() -> list[str]:
        ca = CreditAssigner()
        ca.on_usage("t", "e", usage("r1", 0, ["a", "b"], [0.5, 0.5]), 0)
        return [u.update_id for u in ca.on_outcome("t", "e", OutcomeRecord("o", 1.0), 1)]

    assert run() == run()


def test_frequently_used_memory_does_not_outrank_the_decisive_one() -> None:
    """'common' is served in every episode, 'decisive' only when it was retrieved;
    success depends on 'decisive' alone."""
    rng = random.Random(0)
    ca = CreditAssigner(gamma=1.0)
    rows = {"common": {"utility": 0.0}, "decisive": {"utility": 0.0}}
    for e in range(300):
        used_decisive = rng.random() < 0.5
        ids = ["common", "decisive"] if used_decisive else ["common"]
        w = [0.5, 0.5] if used_decisive else [1.0]
        ca.on_usage("t", f"e{e}", usage(f"r{e}", 0, ids, w), e)
        success = used_decisive and rng.random() < 0.9
        for u in ca.on_outcome("t", f"e{e}", OutcomeRecord("o", 1.0 if success else 0.0), e):
            apply_utility(rows[u.memory_id], u.update_id, u.credit, u.uses)
    assert rows["decisive"]["utility"] > rows["common"]["utility"] + 0.05
    assert rows["decisive"]["uses"] < rows["common"]["uses"]


def test_apply_utility_is_idempotent() -> None:
    row: dict = {"utility": 0.0, "uses": 0, "metadata": {"user": {}}}
    assert apply_utility(row, "u1", 1.0, 2, beta=0.5)
    snapshot = (row["utility"], row["uses"])
    assert not apply_utility(row, "u1", 1.0, 2, beta=0.5)
    assert (row["utility"], row["uses"]) == snapshot == (0.5, 2)
    assert apply_utility(row, "u2", -1.0, 1, beta=0.5)
    assert row["utility"] == pytest.approx(-0.25) and row["uses"] == 3


def test_validation() -> None:
    with pytest.raises(ValueError):
        CreditAssigner(gamma=1.5)
    with pytest.raises(ValueError):
        CreditAssigner(ttl_ms=0)
