"""Ranking: exploration bonus for untried memories and the evidence-adaptive lambda."""

from __future__ import annotations

import itertools
import random

import pytest

from operators.retrieval import RankPolicy, explore_window, rank


def row(mid: str, sim: float, utility: float = 0.0, uses: int = 0, core: bool = False) -> dict:
    return {
        "id": mid,
        "similarity": sim,
        "rpe": 3.0,
        "utility": utility,
        "uses": uses,
        "created_ts": 0,
        "partition": "core" if core else "buffer",
    }


def test_exploration_bonus_shrinks_with_uses_and_utility_still_counts() -> None:
    p = RankPolicy.hybrid()
    untried, once, often = (p.salience(3.0, 0.0, n) for n in (0, 1, 10))
    assert untried > once > often > p.salience(3.0, -0.5, 10)
    assert p.salience(3.0, 1.0, 10) > untried  # proven utility beats mere optimism
    assert RankPolicy.hybrid(explore=0.0).salience(3.0, 0.0, 0) == pytest.approx(
        RankPolicy.hybrid(explore=0.0).salience(3.0, 0.0, 50)
    )


def test_lambda_moves_to_lambda_evidence_as_the_semantic_top_k_get_credited() -> None:
    p = RankPolicy.hybrid(lambda_evidence=0.5)
    cands = [
        row("a", 0.9, uses=2),
        row("b", 0.5, uses=0),
        row("c", 0.1, uses=1),
        row("z", 0.05, uses=0),
    ]
    assert p.lambda_with_evidence(0.9, cands, 3) == pytest.approx(0.9 + (2 / 3) * (0.5 - 0.9))
    assert p.lambda_with_evidence(0.9, [row("a", 0.9), row("b", 0.8)], 2) == 0.9
    assert p.lambda_with_evidence(0.1, cands, 3) == 0.1  # never raises lambda
    assert p.lambda_with_evidence(0.9, [], 3) == 0.9


def test_lambda_never_falls_below_the_spread_floor_of_the_top_k() -> None:
    """A lift of at most the cosine spread of meaning's top k: 1 / (1 + spread)."""
    p = RankPolicy.hybrid(lambda_evidence=0.1)
    tried = [row("a", 0.9, uses=2), row("b", 0.8, uses=1), row("c", 0.7, uses=1)]
    assert p.lambda_with_evidence(0.97, tried, 3) == pytest.approx(1 / 1.2)
    ties = [row(f"t{i}", 1.0, uses=1) for i in range(5)]
    assert p.lambda_with_evidence(0.97, ties, 5) == 0.97  # exact ties: salience re-orders them
    assert p.lambda_with_evidence(0.8, ties, 5) == 0.8  # the floor never raises lambda


def test_untried_neighbour_within_the_spread_is_explored_a_far_one_never() -> None:
    """Once meaning's top k were tried without credit, an untried memory a little
    less similar than them is served; one far below them is not, even with credit."""
    p = RankPolicy.hybrid()
    near = [row("n0", 0.9), row("n1", 0.8)]
    nxt, far = row("next", 0.79), row("far", 0.35)
    lam0 = p.lambda_with_evidence(p.lambda_for(10), [*near, nxt, far], 2)
    assert [r.row["id"] for r in rank([*near, nxt, far], p, lam0, 0, 2)] == ["n0", "n1"]
    tried = [row("n0", 0.9, uses=2), row("n1", 0.8, uses=2)]
    lam1, pool = p.adapt(p.lambda_for(10), [*tried, nxt, far], 2)
    assert lam1 == pytest.approx(1 / 1.1)
    assert [r.row["id"] for r in rank(pool, p, lam1, 0, 2)] == ["n0", "next"]
    proven = row("far", 0.35, utility=0.5, uses=3)
    lam2, pool = p.adapt(p.lambda_for(10), [*tried, nxt, proven], 2)
    assert "far" not in [r.row["id"] for r in rank(pool, p, lam2, 0, 2)]
    # a pure semantic request (lambda = 1) is never adapted
    assert [r.row["id"] for r in rank([*tried, nxt], p, 1.0, 0, 2)] == ["n0", "n1"]


def test_positive_evidence_keeps_lambda_only_the_unhelpful_share_lowers_it() -> None:
    p = RankPolicy.hybrid(lambda_evidence=0.5)
    helped = [row("a", 0.9, utility=0.3, uses=2), row("b", 0.1, utility=0.01, uses=1)]
    assert p.lambda_with_evidence(0.9, helped, 2) == 0.9
    mixed = [row("a", 0.9, utility=0.3, uses=2), row("b", 0.1, utility=-0.4, uses=1)]
    assert p.lambda_with_evidence(0.9, mixed, 2) == pytest.approx(0.9 + 0.5 * (0.5 - 0.9))


def test_explore_window_keeps_the_nearest_and_every_tie_at_the_cut() -> None:
    cands = [
        row("far", 0.2),
        row("t1", 0.7),
        row("top", 0.9),
        row("t2", 0.7),
        row("t3", 0.7),
        row("mid", 0.5),
    ]
    assert [r["id"] for r in explore_window(cands, 2)] == ["top", "t1", "t2", "t3"]
    assert [r["id"] for r in explore_window(cands, 5)] == ["top", "t1", "t2", "t3", "mid"]
    assert len(explore_window(cands, 10)) == 6


def test_a_blamed_exact_match_is_never_traded_for_untried_memories_of_another_state() -> None:
    """The ScienceWorld case (find-animal, hybrid, second repeat, step 0): the query's
    exact match (cosine 1.0) was used in a below-average episode and blamed; untried
    core memories of cosine ~0.56 (another observation) stood in the pool. With
    lambda at lambda_evidence they took all the served slots; with the spread floor
    and the window the exact match stays first, and the evidence still re-orders
    the rest of the top k."""
    p = RankPolicy.hybrid()
    exact = row("exact", 1.0, utility=-4.0, uses=1, core=True)
    top = [
        exact,
        row("b", 0.839, utility=-4.0, uses=1, core=True),
        row("c", 0.7, utility=-4.0, uses=1, core=True),
        row("d", 0.7, uses=1),
        row("e", 0.57, utility=-4.0, uses=1, core=True),
    ]
    focus = [row(f"focus{i}", 0.557 - 0.001 * i, core=True) for i in range(4)]
    cands = [*top, *focus]
    lam, pool = p.adapt(p.lambda_for(50), cands, 5)
    assert lam == pytest.approx(1 / (1 + 0.43))
    served = [r.row["id"] for r in rank(pool, p, lam, 0, 5)]
    assert served[0] == "exact"
    assert served != [r.row["id"] for r in rank(cands, p, 1.0, 0, 5)]  # evidence still acts
    old = [r.row["id"] for r in rank(cands, p, p.lambda_evidence, 0, 5)]
    assert "exact" not in old[:4]  # what the unbounded lambda did


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        RankPolicy.hybrid(explore=-1.0)
    with pytest.raises(ValueError):
        RankPolicy.hybrid(lambda_evidence=1.5)
    with pytest.raises(ValueError):
        RankPolicy.hybrid(explore_ranks=0)


def test_recency_is_stream_time_on_each_agents_clock() -> None:
    from operators.retrieval import StreamClock

    p = RankPolicy.hybrid()
    day = 24 * 3600 * 1000

    def ranked(shift_b: int) -> list[tuple[str, float]]:
        clock = StreamClock()
        rows = [{"id": "a-new", "agent_id": "a", "similarity": 0.5, "rpe": 1.0,
                 "created_ts": 100 * day},
                {"id": "a-old", "agent_id": "a", "similarity": 0.6, "rpe": 1.0,
                 "created_ts": 40 * day},
                {"id": "b-new", "agent_id": "b", "similarity": 0.4, "rpe": 1.0,
                 "created_ts": 70 * day + shift_b}]  # fmt: skip
        now = clock.observe("t", rows)
        return [(r.row["id"], round(r.recency, 9)) for r in rank(rows, p, 0.3, now, 3)]

    got = ranked(0)
    assert dict(got)["a-new"] == 1.0 and dict(got)["b-new"] == 1.0
    assert dict(got)["a-old"] == pytest.approx(2 ** (-60 / 30))
    assert ranked(400 * day) == got == ranked(-400 * day)  # b's clock is b's business
    # a clock only moves forward: an old memory read later is measured to it
    clock = StreamClock(per_agent=False)
    clock.observe("t", [{"agent_id": "a", "created_ts": 50}])
    assert clock.observe("t", [{"agent_id": "b", "created_ts": 10}]) == {"b": 50}


def test_identical_texts_are_won_by_outcome_evidence() -> None:
    """Many observations are identical strings: among equally similar candidates the
    rewarded one (its gate score carries the reward's surprise) ranks first."""
    p = RankPolicy.hybrid()
    mundane = [
        {
            "id": f"m{i}",
            "similarity": 0.97,
            "rpe": 0.05,
            "rpe_smoothed": 0.05,
            "utility": 0.0,
            "uses": 0,
            "created_ts": 0,
        }
        for i in range(6)
    ]
    rewarded = {
        "id": "r",
        "similarity": 0.97,
        "rpe": 0.04,
        "rpe_smoothed": 2.5,
        "utility": 0.0,
        "uses": 0,
        "created_ts": 0,
    }
    top = rank([*mundane, rewarded], p, p.lambda_for(100), 0, 3)
    assert top[0].row["id"] == "r"
    # pure semantic ranking (lambda = 1) cannot tell them apart: ties by id
    assert rank([*mundane, rewarded], p, 1.0, 0, 3)[0].row["id"] == "m0"


def test_young_store_does_not_trade_meaning_for_salience() -> None:
    """A clearly closer memory keeps its place against a far, very surprising one."""
    p = RankPolicy.hybrid()
    near = {
        "id": "near",
        "similarity": 0.9,
        "rpe": 0.0,
        "rpe_smoothed": 0.0,
        "utility": 0.0,
        "uses": 0,
        "created_ts": 0,
    }
    far = {
        "id": "far",
        "similarity": 0.7,
        "rpe": 8.0,
        "rpe_smoothed": 8.0,
        "utility": 0.0,
        "uses": 0,
        "created_ts": 0,
    }
    assert rank([far, near], p, p.lambda_for(100), 0, 1)[0].row["id"] == "near"


def test_core_memories_of_equal_meaning_tie_whatever_their_reward_or_ms_age() -> None:
    """Among identical texts, whether a memory mattered (core vs buffer) and its credit
    break the tie, not how large its reward was or milliseconds between writes: with
    no evidence either way the tie stays exact (issue 13)."""
    p = RankPolicy.hybrid()
    base = {"similarity": 1.0, "utility": 0.0, "uses": 0, "partition": "core"}
    big = {**base, "id": "big", "rpe": 0.1, "rpe_smoothed": 6.0, "created_ts": 1_000}
    small = {**base, "id": "small", "rpe": 0.1, "rpe_smoothed": 1.1, "created_ts": 1_007}
    tier = {
        **base,
        "id": "tier",
        "rpe": 0.1,
        "rpe_smoothed": 6.0,
        "partition": "buffer",
        "created_ts": 1_003,
    }
    lam = p.lambda_for(100)
    got = {r.row["id"]: r.score for r in rank([big, small, tier], p, lam, 2_000, 3)}
    assert got["big"] == got["small"] > got["tier"]
    helped = {**small, "utility": 1.0, "uses": 2}  # proven utility beats optimism
    assert rank([big, helped], p, lam, 2_000, 1)[0].row["id"] == "small"
    # recency still counts on the scale of its half-life
    old = {**big, "id": "old", "created_ts": 2_000 - int(p.half_life_ms)}
    assert rank([old, small], p, lam, 2_000, 1)[0].row["id"] == "small"
    assert p.recency(0, p.half_life_ms) == pytest.approx(0.5)


def test_exact_ties_get_one_order_whatever_order_the_store_returned() -> None:
    """The store returns equal similarities in a varying order; the ranking orders
    exact ties by memory id, so the same query gets the same answer, and semantic and
    hybrid ranking order the ties alike where evidence does not tell them apart."""
    p = RankPolicy.hybrid()
    base = {
        "rpe": 0.1,
        "rpe_smoothed": 0.1,
        "utility": 0.0,
        "uses": 0,
        "created_ts": 0,
        "partition": "core",
    }
    cands = [{**base, "id": f"m{i}", "similarity": 0.8} for i in (3, 7, 1, 5, 2)]
    cands += [
        {**base, "id": "best", "similarity": 0.9},
        {**base, "id": "far", "similarity": 0.5},
        {**base, "id": "m9", "similarity": 0.8, "utility": 1.0, "uses": 2},
    ]
    shuffler = random.Random(13)
    for lam, want in (
        (1.0, ["best", "m1", "m2", "m3", "m5", "m7"]),
        (p.lambda_for(100), ["best", "m9", "m1", "m2", "m3", "m5"]),
    ):
        for _ in range(20):
            order = cands[:]
            shuffler.shuffle(order)
            assert [r.row["id"] for r in rank(order, p, lam, 0, 6)] == want
    # where evidence distinguishes (m9 helped) hybrid lifts it over its ties; the
    # rest (equal evidence) keep the same id order in both rankings
    hybrid = [r.row["id"] for r in rank(cands, p, p.lambda_for(100), 0, 8)]
    semantic = [r.row["id"] for r in rank(cands, p, 1.0, 0, 8)]
    assert semantic.index("m9") > semantic.index("m7") and hybrid.index("m9") < hybrid.index("m1")
    assert [i for i in hybrid if i != "m9"] == [i for i in semantic if i != "m9"]


def test_evidence_lambda_does_not_depend_on_the_order_of_tied_candidates() -> None:
    """Meaning's top k ends inside a group of exact ties: which of them count as "tried
    without credit" is decided by id, not by the store's order (which changed the
    adapted lambda, and so the answer, from one call of the same query to the next)."""
    p = RankPolicy.hybrid(lambda_evidence=0.1)
    cands = [
        row("a", 0.9, uses=1),
        row("b", 0.3),
        row("c", 0.3),
        row("y", 0.3, uses=1),
        row("z", 0.3, uses=1),
    ]
    want = 0.97 + (1 / 3) * (0.1 - 0.97)  # top 3 = a, b, c: one of three tried
    for order in itertools.permutations(cands):
        lam, pool = p.adapt(0.97, list(order), 3)
        assert lam == pytest.approx(want)
        assert [r["id"] for r in pool] == ["a", "b", "c", "y", "z"]


def _upd(mid: str, sim: float, ts: int, updates: str | None = None) -> dict:
    r = row(mid, sim)
    r["created_ts"] = ts
    if updates is not None:
        r["metadata"] = {"updates": updates}
    return r


def test_a_later_update_ranks_directly_above_the_memory_it_updates() -> None:
    p = RankPolicy.hybrid()
    cands = [
        _upd("old", 0.80, 1_000),  # "I keep my sneakers under the bed."
        _upd("mid", 0.70, 2_000),  # unrelated, in between
        _upd("new", 0.60, 3_000, updates="old"),  # "I moved my sneakers to the closet."
        _upd("far", 0.50, 4_000),
    ]
    ranked = rank(cands, p, 0.95, 5_000.0, 4)
    assert [r.row["id"] for r in ranked] == ["new", "old", "mid", "far"]
    assert ranked[0].supersedes == "old" and ranked[1].supersedes is None
    assert ranked[0].score < ranked[2].score  # its own score is kept for the breakdown
    top1 = rank(cands, p, 0.95, 5_000.0, 1)
    assert [r.row["id"] for r in top1] == ["new"]


def test_updates_chain_in_event_time_and_an_older_claimed_update_moves_nothing() -> None:
    p = RankPolicy.hybrid()
    chain = [
        _upd("v1", 0.9, 1_000),
        _upd("v2", 0.6, 2_000, updates="v1"),
        _upd("v3", 0.5, 3_000, updates="v2"),
        _upd("x", 0.8, 500),
    ]
    assert [r.row["id"] for r in rank(chain, p, 0.95, 5_000.0, 4)] == ["v3", "v2", "v1", "x"]
    # a pointer to a newer memory (a replayed or skewed clock) is not an update
    back = [_upd("a", 0.9, 5_000), _upd("b", 0.5, 1_000, updates="a"), _upd("c", 0.7, 2_000)]
    assert [r.row["id"] for r in rank(back, p, 0.95, 6_000.0, 3)] == ["a", "c", "b"]
    # the updated memory absent from the candidates: plain score order
    alone = [_upd("n", 0.5, 3_000, updates="gone"), _upd("m", 0.7, 1_000)]
    assert [r.row["id"] for r in rank(alone, p, 0.95, 6_000.0, 2)] == ["m", "n"]


def test_without_updates_the_order_is_exactly_score_then_id() -> None:
    rnd = random.Random(7)
    p = RankPolicy.hybrid()
    for _ in range(50):
        cands = [_upd(f"m{i}", round(rnd.random(), 2), rnd.randrange(10)) for i in range(12)]
        got = [r.row["id"] for r in rank(cands, p, 0.95, 20.0, 12)]
        scored = [(r.score, r.row["id"]) for r in rank(cands, p, 0.95, 20.0, 12)]
        assert got == [mid for _, mid in sorted(scored, key=lambda x: (-x[0], x[1]))]
