"""Credit assignment: joins, duplicates, order, TTL, fairness, idempotent application."""

from __future__ import annotations

import random
from typing import Any

import pytest

from operators.credit import CreditAssigner, CreditStats, OutcomeRecord, UsageRecord, apply_utility
from schemas.limits import LIMITS, json_bytes
from schemas.models import feedback_update_id


def usage(rid: str, step: int, ids: list[str], weights: list[float]) -> UsageRecord:
    return UsageRecord(rid, step, tuple(ids), tuple(weights))


def test_credit_is_weighted_discounted_advantage_per_use() -> None:
    ca = CreditAssigner(gamma=0.5)
    ca.on_usage("t", "e1", usage("r1", 0, ["a", "b"], [0.75, 0.25]), 0)
    ca.on_usage("t", "e1", usage("r2", 1, ["a"], [1.0]), 1)
    ups = {u.memory_id: u for u in ca.on_outcome("t", "e1", OutcomeRecord("o", 8.0, 2), 2)}
    # baseline is 0 for the first episode; G_0 = 0.25 * 8 = 2, G_1 = 0.5 * 8 = 4; no
    # spread is known yet, so the outcome's own distance from the baseline (8) is one unit
    assert ups["a"].credit == pytest.approx((2 * 0.75 + 4 * 1.0) / 2 / 8)
    assert ups["a"].uses == 2
    assert ups["b"].credit == pytest.approx(2 * 0.25 / 8)
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
    assert [u.memory_id for u in ups] == ["m"] and ups[0].credit == pytest.approx(1.0)
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


def test_apply_utility_is_idempotent_and_keeps_discounted_statistics() -> None:
    row: dict = {"utility": 0.0, "uses": 0, "metadata": {"user": {}}}
    assert apply_utility(row, "u1", 1.0, 2, discount=0.5)
    snapshot = (row["utility"], row["uses"], dict(row["metadata"]["credit"]))
    assert not apply_utility(row, "u1", 1.0, 2, discount=0.5)
    assert (row["utility"], row["uses"], row["metadata"]["credit"]) == snapshot
    assert snapshot[:2] == (1.0, 2)
    assert apply_utility(row, "u2", -1.0, 1, discount=0.5)
    # weights 0.5 (older) and 1: mean (0.5 * 1 - 1) / 1.5
    assert row["utility"] == pytest.approx(-1 / 3) and row["uses"] == 3
    stats = CreditStats.of(row)
    assert stats.n == 2 and stats.w == pytest.approx(1.5) and stats.m2 > 0


def test_a_memory_not_acted_on_keeps_the_credit_it_earned() -> None:
    """Served (weight 0) in a failed episode: its uses grow, its utility does not move;
    before, the zero-credit EMA step eroded what it had earned where it was followed."""
    ca = CreditAssigner(gamma=1.0)
    row: dict = {"utility": 0.0, "uses": 0}
    ca.on_usage("t", "e1", UsageRecord("r1", 0, ("m",), (1.0,), "agent"), 0)
    for u in ca.on_outcome("t", "e1", OutcomeRecord("o", 10.0), 1):
        assert u.evidence
        apply_utility(row, u.update_id, u.credit, u.uses, evidence=u.evidence)
    earned = row["utility"]
    assert earned == pytest.approx(1.0)
    ca.on_usage("t", "e2", UsageRecord("r2", 0, ("m", "x"), (0.0, 1.0), "agent"), 2)
    for u in ca.on_outcome("t", "e2", OutcomeRecord("o", 0.0), 3):
        if u.memory_id == "m":
            assert not u.evidence
            apply_utility(row, u.update_id, u.credit, u.uses, evidence=u.evidence)
    assert row["utility"] == earned and row["uses"] == 2


def test_validation() -> None:
    with pytest.raises(ValueError):
        CreditAssigner(gamma=1.5)
    with pytest.raises(ValueError):
        CreditAssigner(ttl_ms=0)


def test_agent_report_beats_served_record_in_either_order() -> None:
    """What the agent used replaces what the responder served, whichever comes first."""
    for order in ("served-first", "agent-first"):
        ca = CreditAssigner(gamma=1.0)
        served = UsageRecord("r", 0, ("a", "b"), (0.6, 0.4), "served")
        agent = UsageRecord("r", 0, ("a", "b"), (0.0, 1.0), "agent")
        for u in (served, agent) if order == "served-first" else (agent, served):
            ca.on_usage("t", "e", u, 0)
        ups = {u.memory_id: u for u in ca.on_outcome("t", "e", OutcomeRecord("o", 2.0), 1)}
        assert ups["b"].credit == pytest.approx(1.0), order
        # ignored memory: a use without credit (evidence it was tried), not blame
        assert ups["a"].credit == 0.0 and ups["a"].uses == 1, order
        assert not ups["a"].evidence and ups["b"].evidence, order
        assert ca.late_agent_reports == 0


def test_an_update_carries_where_the_memory_was_acted_on_in_either_order() -> None:
    """The agent's record names no similarities; the served record of the same
    request does, and the update carries the mean over the uses that acted on the
    memory (weighted), whichever record arrives first. Served and ignored: none."""
    for order in ("served-first", "agent-first"):
        ca = CreditAssigner(gamma=1.0)
        records = [
            (UsageRecord("r1", 0, ("a", "b"), (0.6, 0.4), "served", similarities=(0.9, 0.5)),
             UsageRecord("r1", 0, ("b",), (1.0,), "agent")),
            (UsageRecord("r2", 1, ("b", "a"), (0.5, 0.5), "served", similarities=(0.8, 0.7)),
             UsageRecord("r2", 1, ("b", "a"), (1.0, 0.0), "agent")),
        ]  # fmt: skip
        for served, agent in records:
            for u in (served, agent) if order == "served-first" else (agent, served):
                ca.on_usage("t", "e", u, 0)
        ups = {u.memory_id: u for u in ca.on_outcome("t", "e", OutcomeRecord("o", 2.0), 1)}
        assert ups["b"].similarity == pytest.approx((0.5 + 0.8) / 2), order
        assert ups["a"].similarity is None and not ups["a"].evidence, order
    ca = CreditAssigner()
    ca.on_usage("t", "e", UsageRecord("r", 0, ("m",), (1.0,), "agent"), 0)
    assert ca.on_outcome("t", "e", OutcomeRecord("o", 1.0), 1)[0].similarity is None
    # an agent record naming a memory the responder did not serve: the others keep theirs
    ca = CreditAssigner()
    ca.on_usage("t", "e", UsageRecord("r", 0, ("a", "b"), (0.5, 0.5), "served",
                                      similarities=(0.9, 0.1)), 0)  # fmt: skip
    ca.on_usage("t", "e", UsageRecord("r", 0, ("a", "c"), (0.5, 0.5), "agent"), 0)
    ups = {u.memory_id: u for u in ca.on_outcome("t", "e", OutcomeRecord("o", 1.0), 1)}
    assert ups["a"].similarity == pytest.approx(0.9) and ups["c"].similarity is None


def test_the_statistics_keep_the_discounted_mean_similarity_of_their_evidence() -> None:
    row: dict = {"utility": 0.0, "uses": 0, "metadata": {}}
    assert apply_utility(row, "u1", 1.0, 1, discount=0.5, similarity=1.0)
    assert apply_utility(row, "u2", 1.0, 1, discount=0.5)  # unknown: leaves it
    assert apply_utility(row, "u3", 1.0, 1, discount=0.5, similarity=0.4)
    stats = CreditStats.of(row)
    # weights 0.5 (the older) and 1: (0.5 * 1.0 + 0.4) / 1.5
    assert stats.sim == pytest.approx(0.6) and stats.sim_w == pytest.approx(1.5)
    assert stats.n == 3
    assert "sim" not in CreditStats().fold(1.0, 0.5).to_dict()


def test_agent_report_after_crediting_is_counted_not_resplit() -> None:
    ca = CreditAssigner(gamma=1.0)
    ca.on_usage("t", "e", UsageRecord("r", 0, ("a",), (1.0,)), 0)
    assert len(ca.on_outcome("t", "e", OutcomeRecord("o", 1.0), 1)) == 1
    assert ca.on_usage("t", "e", UsageRecord("r", 0, ("a",), (0.0,), "agent"), 2) == []
    assert ca.late_agent_reports == 1


def test_out_of_order_and_duplicated_outcomes_across_episodes() -> None:
    """Outcomes arrive in reverse episode order, before some usages, and twice; each
    episode's memories are credited exactly once with that episode's outcome."""
    ca = CreditAssigner(gamma=1.0)
    out: dict[str, float] = {}

    def take(ups: list) -> None:
        for u in ups:
            assert u.memory_id not in out, "credited twice"
            out[u.memory_id] = u.credit

    take(ca.on_usage("t", "e1", usage("r1", 0, ["m1"], [1.0]), 0))
    take(ca.on_outcome("t", "e2", OutcomeRecord("e2:final", -1.0), 1))  # before its usage
    take(ca.on_outcome("t", "e1", OutcomeRecord("e1:final", 1.0), 2))
    take(ca.on_outcome("t", "e2", OutcomeRecord("e2:final", -1.0), 3))  # duplicate
    take(ca.on_usage("t", "e2", usage("r2", 0, ["m2"], [1.0]), 4))  # late usage
    take(ca.on_outcome("t", "e1", OutcomeRecord("e1:final", 1.0), 5))  # duplicate
    assert ca.duplicate_outcomes == 2
    # e2 was judged against an empty history (baseline 0), e1 against e2's -1 (in units
    # of its own distance from it: no spread is known before two outcomes)
    assert out == {"m2": pytest.approx(-1.0), "m1": pytest.approx(1.0)}


def test_missing_outcome_credits_nothing_while_others_complete() -> None:
    ca = CreditAssigner(ttl_ms=1000)
    ca.on_usage("t", "lost", usage("r1", 0, ["m"], [1.0]), 0)
    ca.on_usage("t", "ok", usage("r2", 0, ["m"], [1.0]), 0)
    assert [u.episode_id for u in ca.on_outcome("t", "ok", OutcomeRecord("o", 1.0), 10)] == ["ok"]
    assert ca.expire(5000) == 2 and ca.expired_without_outcome == 1


def test_frequent_memory_does_not_outrank_decisive_one_with_agent_reports() -> None:
    """Served in every episode but never what the decision rested on: many uses,
    zero utility; the decisive memory, used in some episodes, ends positive."""
    rng = random.Random(1)
    ca = CreditAssigner(gamma=1.0)
    rows = {"common": {"utility": 0.0}, "decisive": {"utility": 0.0}}
    for e in range(200):
        served_decisive = rng.random() < 0.5
        ids = ("common", "decisive") if served_decisive else ("common",)
        w = (0.0, 1.0) if served_decisive else (0.0,)
        ca.on_usage("t", f"e{e}", UsageRecord(f"r{e}", 0, ids, w, "agent"), e)
        won = served_decisive or rng.random() < 0.5
        for u in ca.on_outcome("t", f"e{e}", OutcomeRecord("o", 1.0 if won else -1.0), e):
            apply_utility(rows[u.memory_id], u.update_id, u.credit, u.uses)
    assert rows["common"]["uses"] == 200 and rows["common"]["utility"] == 0.0
    assert rows["decisive"]["utility"] > 0.1


def test_bench_briefing_is_never_in_meanings_top_k() -> None:
    """The delayed-credit bench stays honest: with the hash encoder, meaning alone
    never serves a briefing, in any of its phrasings (k = 3 nearer distractors)."""
    from dmem_bench.credit import BRIEFINGS, DISTRACTORS, VAULTS, CreditConfig, briefing, query
    from operators.encoders import build_encoder

    enc = build_encoder("hash", dim=256, cache_size=0)
    k = CreditConfig().k
    for vault in VAULTS:
        q = enc.encode([query(vault)])[0]
        distract = enc.encode([d.format(v=vault) for d in DISTRACTORS]) @ q
        for phrasing in range(len(BRIEFINGS)):
            briefs = enc.encode([briefing(vault, s, phrasing) for s in ("left", "right")]) @ q
            assert (distract > briefs.max()).sum() >= k, (vault, phrasing)


def test_baseline_is_per_agent_a_weaker_agent_is_judged_against_itself() -> None:
    """A guided agent's outcomes (100) do not make every episode of a weaker agent
    (17 after 0s) a failure that blames the memories it used."""
    ca = CreditAssigner(gamma=1.0)
    for e in range(5):
        ca.on_outcome("t", f"gold{e}", OutcomeRecord("o", 100.0, agent="guide"), e)
    ca.on_outcome("t", "weak0", OutcomeRecord("o", 0.0, agent="weak"), 5)
    ca.on_usage("t", "weak1", usage("r", 0, ["m"], [1.0]), 6)
    (up,) = ca.on_outcome("t", "weak1", OutcomeRecord("o", 17.0, agent="weak"), 7)
    assert up.credit == pytest.approx(1.0)  # against the weak agent's own 0: above, not below
    assert ca.baseline("t", None, "guide") == pytest.approx(100.0)
    assert ca.baseline("t", None) == 0.0  # outcomes without an agent have their own
    ca.on_usage("t", "anon", usage("r", 0, ["m"], [1.0]), 8)
    (up,) = ca.on_outcome("t", "anon", OutcomeRecord("o", 17.0), 9)
    assert up.credit == pytest.approx(1.0)


def test_baseline_is_per_task_a_low_scoring_task_is_judged_against_itself() -> None:
    """One agent, two tasks on different score scales (sci13e: find-plant's 67 before
    find-animal's 17): the low task's outcome is judged against its own history, so
    the memory that earned it is not blamed because another task scores higher."""
    ca = CreditAssigner(gamma=1.0)
    ca.on_outcome("t", "plant0", OutcomeRecord("o", 67.0, task="find-plant", agent="loop"), 0)
    ca.on_usage("t", "animal0", usage("r", 0, ["hallway"], [1.0]), 1)
    (up,) = ca.on_outcome(
        "t", "animal0", OutcomeRecord("o", 17.0, task="find-animal", agent="loop"), 2
    )
    assert up.credit == pytest.approx(1.0)  # a gain over its own past, not 17 - 67
    assert ca.baseline("t", "find-plant", "loop") == pytest.approx(67.0)
    assert ca.baseline("t", "find-animal", "loop") == pytest.approx(17.0)


def test_usage_after_the_step_that_earned_the_outcome_is_outside_it() -> None:
    """An outcome earned at step 2 owes nothing to memories used while the agent
    wandered after it, blames them for nothing (sci13e tried return 0 there: it
    blamed them with -b) and does not count the use; without a step, nothing changes."""
    ca = CreditAssigner(gamma=0.5)
    ca.on_outcome("t", "e0", OutcomeRecord("o", 10.0, task="x"), 0)  # baseline 10
    ca.on_usage("t", "e1", usage("r0", 1, ["decisive"], [1.0]), 1)
    ca.on_usage("t", "e1", usage("r1", 5, ["wander"], [1.0]), 2)
    ups = {u.memory_id: u for u in ca.on_outcome("t", "e1", OutcomeRecord("o", 40.0, 2, "x"), 3)}
    # no spread yet: the outcome's distance from the baseline (30) is one unit
    assert ups["decisive"].credit == pytest.approx((0.5 * 40.0 - 10.0) / 30.0)
    assert "wander" not in ups  # not 40 - 10, not -10, and not a use that ends its bonus
    assert ups["decisive"].evidence and ups["decisive"].uses == 1
    ca.on_usage("t", "e2", usage("r0", 1, ["decisive"], [1.0]), 4)
    ca.on_usage("t", "e2", usage("r1", 5, ["wander"], [1.0]), 5)
    ups = {u.memory_id: u for u in ca.on_outcome("t", "e2", OutcomeRecord("o", 40.0, task="x"), 6)}
    assert ups["wander"].credit > ups["decisive"].credit  # end = last usage: the old rule


def test_step_evidence_vetoes_an_outcome_of_the_opposite_sign() -> None:
    """A use directly rewarded is not blamed for a failure that came later, a use
    directly punished is not credited by a success, and a use with reward 0 (or none
    reported) is judged by the outcome; only the sign counts (any reward scale)."""
    ca = CreditAssigner(gamma=1.0)
    ca.on_outcome("t", "warm", OutcomeRecord("o0", 40.0, 0, task="k"), 0)  # baseline, spread 40

    def rec(rid: str, step: int, mid: str, reward: float | None) -> UsageRecord:
        return UsageRecord(rid, step, (mid,), (1.0,), "agent", reward)

    ca.on_usage("t", "fail", rec("f1", 1, "earned", 8.0), 1)
    ca.on_usage("t", "fail", rec("f2", 2, "idle", 0.0), 2)
    ca.on_usage("t", "fail", rec("f3", 3, "silent", None), 3)
    ca.on_usage("t", "fail", rec("f4", 4, "culprit", -100.0), 4)
    ups = {u.memory_id: u for u in ca.on_outcome("t", "fail", OutcomeRecord("o1", 0.0, 4, "k"), 5)}
    assert "earned" not in ups  # no credit, no blame, no use: its exploration bonus stays
    for mid in ("idle", "silent", "culprit"):
        assert ups[mid].evidence is True and ups[mid].credit == pytest.approx(-1.0)
    ca.on_usage("t", "win", rec("w1", 1, "punished", -0.001), 6)
    ca.on_usage("t", "win", rec("w2", 2, "helped", 0.001), 7)
    ups = {u.memory_id: u for u in ca.on_outcome("t", "win", OutcomeRecord("o2", 99.0, 2, "k"), 8)}
    assert "punished" not in ups
    assert ups["helped"].evidence is True and ups["helped"].credit > 0


def test_step_evidence_on_an_agent_record_that_replaces_a_served_one_and_arrives_late() -> None:
    """The served record carries no reward; the agent's record for the same request
    (with its step reward) replaces it, also when it arrives after the outcome; a
    memory with one contradicted and one agreeing use is credited for the latter only."""
    ca = CreditAssigner(gamma=1.0)
    ca.on_outcome("t", "warm", OutcomeRecord("o0", 10.0, 0, task="k"), 0)  # baseline, spread 10
    ca.on_usage("t", "e", UsageRecord("r1", 1, ("m", "x"), (0.7, 0.3), "served"), 1)
    ca.on_usage("t", "e", UsageRecord("r1", 1, ("m",), (1.0,), "agent", 5.0), 2)
    ca.on_usage("t", "e", UsageRecord("r2", 2, ("m",), (1.0,), "agent", 0.0), 3)
    ups = {u.memory_id: u for u in ca.on_outcome("t", "e", OutcomeRecord("o1", 0.0, 3, "k"), 4)}
    assert set(ups) == {"m"}  # the served split (with "x") was replaced
    assert ups["m"].uses == 1 and ups["m"].credit == pytest.approx(-1.0)  # r2 only
    # a late agent record with a contradicting reward: outside the outcome, no update
    assert ca.on_usage("t", "e", UsageRecord("r3", 3, ("y",), (1.0,), "agent", 2.0), 5) == []
    late = ca.on_usage("t", "e", UsageRecord("r4", 3, ("z",), (1.0,), "agent", -2.0), 6)
    assert [(u.memory_id, u.credit) for u in late] == [("z", pytest.approx(-1.0))]


def _solver_run(scale: float, offset: float) -> list[float]:
    """An agent that wins half its episodes by guessing (acting on no memory), then
    always wins by acting on memory "m"; outcomes ``offset + scale * (+-1)``."""
    rng = random.Random(3)
    ca = CreditAssigner(gamma=1.0)
    credits = []
    for e in range(120):
        solved = e >= 20 and e % 2 == 0
        if solved:
            ca.on_usage("t", f"e{e}", UsageRecord(f"r{e}", 0, ("m",), (1.0,), "agent"), e)
        won = solved or rng.random() < 0.5
        out = OutcomeRecord("o", offset + scale * (1.0 if won else -1.0), task="vault")
        credits += [u.credit for u in ca.on_outcome("t", f"e{e}", out, e)]
    return credits


def test_the_memory_that_solved_the_task_is_not_erased_by_its_own_success() -> None:
    """The baseline is what the agent gets without memory (episodes acting on none):
    the memory that wins every time it is followed keeps earning a full unit, where
    an all-outcomes mean would rise towards 1 and its credit fade to 0."""
    credits = _solver_run(1.0, 0.0)
    assert len(credits) == 50
    assert min(credits[-10:]) > 0.8


def test_credit_is_scale_free() -> None:
    """The same episodes with outcomes of +-1 and of 0..100 earn the same credit."""
    assert _solver_run(50.0, 50.0) == pytest.approx(_solver_run(1.0, 0.0))


def test_an_effect_is_established_by_repeated_evidence_never_by_one_use() -> None:
    one_blame = CreditStats().fold(-3.0, 0.95)
    assert one_blame.established(2) == 0.0
    assert one_blame.established(1) < 0  # one use is a bound only when allowed to be
    helped = CreditStats()
    for _ in range(3):
        helped = helped.fold(1.0, 0.95)
    assert 0 < helped.established(2) < 1.0  # a bound below the mean, above 0
    mixed = helped.fold(-1.0, 0.95).fold(1.0, 0.95).fold(-1.0, 0.95)
    assert mixed.established(2) == 0.0  # noisy: not established either way
    hurt = CreditStats()
    for _ in range(6):
        hurt = hurt.fold(-1.0, 0.95)
    assert hurt.established(2) < 0


def test_thumbs_fold_into_the_same_statistics_as_outcomes() -> None:
    row: dict = {"utility": 0.0, "uses": 0}
    apply_utility(row, "e1", 1.0, 1)
    apply_utility(row, "fb:1", -1.0, 0)  # a thumbs down: one spread against, no use
    stats = CreditStats.of(row)
    assert stats.n == 2 and row["uses"] == 1
    assert row["utility"] == pytest.approx(stats.mean) and stats.mean < 0.5


def test_a_task_solved_from_its_first_episode_is_judged_against_the_agents_guesses() -> None:
    """No episode of the task acted on no memory (the memory was found at once): the
    baseline is the agent's no-memory outcome over its other tasks, not the task's
    own mean of wins, so the memory keeps earning."""
    rng = random.Random(5)
    ca = CreditAssigner(gamma=1.0)
    for e in range(12):  # guesses on other tasks: half won
        won = rng.random() < 0.5
        ca.on_outcome("t", f"g{e}", OutcomeRecord("o", 1.0 if won else -1.0, task=f"x{e}"), e)
    credits = []
    for e in range(10):
        ca.on_usage("t", f"s{e}", UsageRecord(f"r{e}", 0, ("m",), (1.0,), "agent"), 20 + e)
        win = OutcomeRecord("o", 1.0, task="solved")
        credits += [u.credit for u in ca.on_outcome("t", f"s{e}", win, 20 + e)]
    assert min(credits) > 0.5


def test_long_update_ids_are_all_remembered_within_the_byte_budget() -> None:
    """Thumbs updates of 128-character client ids: the last `max_credit_ids` of them are
    all recognised on replay (as full ids only ~31 fit the list's byte budget)."""
    row: dict[str, Any] = {"utility": 0.0, "uses": 0, "metadata": {}}
    ids = [feedback_update_id(f"{i:03d}" + "f" * 122) for i in range(LIMITS.max_credit_ids)]
    for uid in ids:
        assert apply_utility(row, uid, 1.0, 1)
    assert json_bytes(row["metadata"]["credit_ids"]) <= LIMITS.max_credit_ids_bytes
    assert not any(apply_utility(row, uid, 1.0, 1) for uid in ids)
    assert row["uses"] == LIMITS.max_credit_ids


def test_a_row_written_with_full_update_ids_still_refuses_their_replay() -> None:
    long_id = "fb:" + "x" * 120
    row: dict[str, Any] = {"utility": 0.0, "uses": 3, "metadata": {"credit_ids": [long_id]}}
    assert not apply_utility(row, long_id, 1.0, 1)
    assert row["uses"] == 3
