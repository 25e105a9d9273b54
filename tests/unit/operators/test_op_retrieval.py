"""Ranking: the exploration bonus, the two lanes (main with promotion, exploration slot)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.credit import CreditStats
from operators.retrieval import RankPolicy, rank


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


def stats(n: int, mean: float, m2: float = 0.0, discount: float = 0.95) -> dict:
    w = sum(discount**i for i in range(n))
    return {"n": n, "w": w, "mean": mean, "m2": m2}


def credited(
    mid: str, sim: float, n: int, mean: float, uses: int | None = None, **kw: bool
) -> dict:
    r = row(mid, sim, utility=mean, uses=n if uses is None else uses, **kw)
    r["metadata"] = {"credit": stats(n, mean)}
    return r


candidate = st.fixed_dictionaries(
    {
        "similarity": st.sampled_from([1.0, 0.9, 0.9, 0.7, 0.56, 0.3, 0.0]),
        "rpe": st.floats(-5, 5),
        "rpe_smoothed": st.floats(0, 5),
        "utility": st.sampled_from([0.0, 0.0, 0.4, -0.7]),
        "created_ts": st.integers(0, 10**9),
        "partition": st.sampled_from(["core", "buffer"]),
        "action": st.sampled_from(["say", "open fridge", "take knife", ""]),
    }
)


@settings(max_examples=200, deadline=None)
@given(pool=st.lists(candidate, min_size=0, max_size=12), k=st.integers(1, 8),
       mmr=st.booleans(), slots=st.integers(0, 3))  # fmt: skip
def test_without_evidence_the_lanes_serve_exactly_todays_list(
    pool: list[dict], k: int, mmr: bool, slots: int
) -> None:
    """Any candidate pool without credited uses: the two lanes serve today's list
    (same memories, same order); only the exploration slots are labelled as such."""
    cands = [{**c, "id": f"m{i}", "uses": 0} for i, c in enumerate(pool)]
    p = RankPolicy.hybrid(explore_slots=slots)
    vectors = None
    if mmr:
        rng = np.random.default_rng(len(cands))
        vectors = {c["id"]: v / np.linalg.norm(v) for c in cands
                   if (v := rng.normal(size=4)) is not None}  # fmt: skip
    today = rank(cands, p, 0.97, 10**9, k, vectors)
    lanes = rank(cands, p, 0.97, 10**9, k, vectors, lanes=True)
    assert [r.row["id"] for r in lanes] == [r.row["id"] for r in today]
    assert [r.score for r in lanes] == [r.score for r in today]
    cut = min(slots, k - 1) if k >= 3 else 0  # slots, one main hit at least
    # a slot exists where there is a choice: more candidates than hits
    n_explore = min(cut, max(0, len(lanes) - (k - cut))) if cut and len(cands) > k else 0
    assert [r.lane for r in lanes] == ["main"] * (len(lanes) - n_explore) + ["explore"] * n_explore


def test_the_exploration_slot_reaches_a_far_decisive_memory_and_evidence_promotes_it() -> None:
    """Six nearer memories that are served and never acted on, one far memory that
    decides the outcome: the slot serves the untried ones nearest first, reaches
    the far one, and its established help puts it in the main lane."""
    p = RankPolicy.hybrid()
    cands = [row(f"d{i}", 0.6 - 0.03 * i) for i in range(6)] + [row("brief", 0.26)]
    by_id = {c["id"]: c for c in cands}
    first_serve = None
    for visit in range(1, 20):
        served = rank(list(by_id.values()), p, 0.97, 0, 3, lanes=True)
        ids = [r.row["id"] for r in served]
        for r in served:
            by_id[r.row["id"]]["uses"] += 1
        if "brief" in ids:
            first_serve = first_serve or visit
            b = by_id["brief"]
            s0 = CreditStats.of(b).fold(1.0, 0.95, similarity=0.26)
            b["metadata"] = {"credit": s0.to_dict()}
            b["utility"] = s0.mean
    assert first_serve is not None and first_serve <= 5
    final = rank(list(by_id.values()), p, 0.97, 0, 3, lanes=True)
    assert final[0].row["id"] == "brief" and final[0].lane == "main" and final[0].bonus > 0
    assert final[-1].lane == "explore" and final[-1].row["id"] != "brief"


def test_credit_applies_to_queries_about_as_close_as_those_that_earned_it() -> None:
    """The ScienceWorld case: "go to outside", credited over five uses from the
    hallway (cosine 1.0 there), is a candidate at the kitchen's start (cosine 0.38).
    There its credit neither promotes it nor wins it the exploration slot; from a
    state close to the hallway (0.95) it does both, and without a recorded similarity
    (credit from thumbs) it keeps its credit everywhere."""
    p = RankPolicy.hybrid()

    def outside(sim: float, earned_at: float | None) -> dict:
        r = credited("outside", sim, 5, 1.2, core=True)
        st = CreditStats(5, r["metadata"]["credit"]["w"], 1.2, 0.2)
        if earned_at is not None:
            st = CreditStats(st.n, st.w, st.mean, st.m2, earned_at, 3.0)
        r["metadata"] = {"credit": st.to_dict()}
        return r

    near = [row(f"door{i}", 0.72 - 0.01 * i, uses=1, core=True) for i in range(5)]
    near += [credited("tried", 0.7, 3, 0.1, core=True)]
    far = rank([outside(0.38, 1.0), *near], p, 0.97, 0, 5, lanes=True)
    assert "outside" not in [r.row["id"] for r in far]
    every = {r.row["id"]: r for r in rank([outside(0.38, 1.0), *near], p, 0.97, 0, 9, lanes=True)}
    assert every["outside"].bonus == 0.0  # no promotion, and its utility does not count
    # the main lane's salience: its utility does not count, and its uses spend no
    # untried bonus there (optimism is the exploration lane's)
    assert every["outside"].salience == p.salience(3.0, 0.0, 0, core=True)
    assert p.fit(outside(0.38, 1.0), 0.38) == 0.0
    close = rank([outside(0.95, 1.0), *near], p, 0.97, 0, 5, lanes=True)
    assert close[0].row["id"] == "outside" and close[0].bonus > 0
    assert p.fit(outside(0.85, 1.0), 0.85) == pytest.approx(2.0 - 0.15 / p.fit_margin)
    unknown = rank([outside(0.38, None), *near], p, 0.97, 0, 5, lanes=True)
    assert unknown[0].row["id"] == "outside"
    off = RankPolicy.hybrid(fit_margin=0.0)
    assert rank([outside(0.38, 1.0), *near], off, 0.97, 0, 5, lanes=True)[0].row["id"] == "outside"


def test_uses_alone_move_nothing_in_the_main_lane() -> None:
    """The TextWorldExpress case: "open fridge", acted on 16 times in the state where
    it earned its credit (cosine 0.92), is an exact tie (0.54) with two untried
    memories in another state, where its credit does not apply. In the main lane it
    keeps its place among them (optimism is the exploration lane's); ranked without
    lanes (a request that fixes lambda) its spent untried bonus puts it last."""
    p = RankPolicy.hybrid(explore_slots=0)
    fridge = credited("a-fridge", 0.54, 16, 0.8, core=True)
    fridge["metadata"]["credit"].update(sim=0.92, sim_w=5.0)
    pool = [fridge, row("b-apple", 0.54, core=True), row("c-apple", 0.54, core=True)]
    assert p.fit(fridge, 0.54) == 0.0
    main = rank(pool, p, 0.97, 0, 3, lanes=True)
    assert [r.row["id"] for r in main] == ["a-fridge", "b-apple", "c-apple"]
    assert main[0].bonus == 0.0 and main[0].salience == main[1].salience
    plain = rank(pool, p, 0.97, 0, 3)
    assert [r.row["id"] for r in plain] == ["b-apple", "c-apple", "a-fridge"]
    # where its credit applies, the credit (not the uses) lifts it
    near = {**fridge, "similarity": 0.92}
    assert rank([near, *pool[1:]], p, 0.97, 0, 3, lanes=True)[0].salience > main[1].salience


def test_a_single_blame_never_demotes_an_exact_match_an_established_effect_can() -> None:
    """The ScienceWorld case: the query's exact match was used in one below-average
    episode and blamed; untried memories of cosine ~0.56 stood in the pool. It
    stays first. Blamed over several uses (an established negative effect) it drops."""
    p = RankPolicy.hybrid()
    focus = [row(f"focus{i}", 0.557 - 0.001 * i, core=True) for i in range(4)]
    others = [credited("b", 0.839, 1, -3.0, core=True), credited("c", 0.7, 1, -3.0, core=True)]
    once = credited("exact", 1.0, 1, -3.0, uses=3, core=True)
    served = rank([once, *others, *focus], p, p.lambda_for(50), 0, 5, lanes=True)
    assert served[0].row["id"] == "exact" and served[0].bonus == 0.0
    often = credited("exact", 1.0, 6, -1.5, uses=8, core=True)
    served = rank([often, *others, *focus], p, p.lambda_for(50), 0, 5, lanes=True)
    assert served[0].row["id"] != "exact"
    assert "exact" not in [r.row["id"] for r in served if r.lane == "main"][:1]


def test_no_exploration_slot_where_there_is_nothing_to_choose() -> None:
    """A vault with three memories, searched with k = 3: all three are served whatever
    the lanes would choose, in the main lane's order, and none is named as explored
    (it would be named in every query, a monopoly of a slot without a choice). A
    fourth candidate makes the choice, and the slot, real again."""
    p = RankPolicy.hybrid()
    pool = [credited("brief", 0.3, 3, 1.0), row("d1", 0.6), row("d4", 0.5, uses=2)]
    served = rank(pool, p, 0.97, 0, 3, lanes=True)
    assert [r.lane for r in served] == ["main"] * 3
    assert served == rank(pool, RankPolicy.hybrid(explore_slots=0), 0.97, 0, 3, lanes=True)
    more = rank([*pool, row("d2", 0.55)], p, 0.97, 0, 3, lanes=True)
    assert [r.lane for r in more] == ["main", "main", "explore"]


def test_the_exploration_slot_offers_an_action_the_served_hits_do_not() -> None:
    """With credit in the context, the slot skips an untried memory whose action a
    served hit already offers (the agent has nothing new to try there) for the most
    optimistic one with a new action; where every candidate has the same action (a
    chat's "say"), it picks by optimism alone."""
    p = RankPolicy.hybrid()

    def acted(mid: str, sim: float, action: str, uses: int = 0) -> dict:
        return {**row(mid, sim, uses=uses), "action": action}

    cands = [acted("meal", 0.9, "prepare meal", uses=2), acted("oven", 0.8, "cook in oven", 2),
             acted("meal2", 0.7, "prepare meal"), acted("knife", 0.69, "take knife")]  # fmt: skip
    served = rank(cands, p, 0.97, 0, 3, lanes=True)
    assert [(r.row["id"], r.lane) for r in served] == [("meal", "main"), ("oven", "main"),
                                                       ("knife", "explore")]  # fmt: skip
    says = [{**c, "action": "say"} for c in cands]
    assert [r.row["id"] for r in rank(says, p, 0.97, 0, 3, lanes=True)] == ["meal", "oven",
                                                                            "meal2"]  # fmt: skip


def test_a_request_that_fixes_lambda_ranks_without_lanes() -> None:
    p = RankPolicy.hybrid()
    cands = [row(f"d{i}", 0.6 - 0.03 * i, uses=4) for i in range(4)]
    cands.append(credited("brief", 0.26, 5, 1.0))
    semantic = rank(cands, p, 1.0, 0, 3)
    assert [r.row["id"] for r in semantic] == ["d0", "d1", "d2"]
    assert {r.lane for r in semantic} == {"main"} and all(r.bonus == 0 for r in semantic)
    assert rank(cands, p, 0.97, 0, 3, lanes=True)[0].row["id"] == "brief"


def test_policy_validation() -> None:
    with pytest.raises(ValueError):
        RankPolicy.hybrid(explore=-1.0)
    with pytest.raises(ValueError):
        RankPolicy.hybrid(explore_slots=-1)
    with pytest.raises(ValueError):
        RankPolicy.hybrid(promote_min_uses=0)


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


def test_the_recency_half_life_follows_each_agents_span() -> None:
    """With ``span_factor`` 1 an agent whose memories span 180 days ranks its oldest at
    half the recency of its newest (not 2^-6 on the fixed 30 days); an agent whose
    stream is shorter than the half-life ranks exactly as with a fixed one."""
    from operators.retrieval import StreamClock

    day = 24 * 3600 * 1000
    fixed, spanned = RankPolicy.hybrid(span_factor=0.0), RankPolicy.hybrid(span_factor=1.0)
    chat = [{"id": "old", "agent_id": "chat", "similarity": 0.6, "rpe": 1.0,
             "created_ts": 10 * day},
            {"id": "mid", "agent_id": "chat", "similarity": 0.55, "rpe": 1.0,
             "created_ts": 100 * day},
            {"id": "new", "agent_id": "chat", "similarity": 0.5, "rpe": 1.0,
             "created_ts": 190 * day},
            {"id": "run-a", "agent_id": "rl", "similarity": 0.5, "rpe": 1.0,
             "created_ts": 3 * day},
            {"id": "run-b", "agent_id": "rl", "similarity": 0.45, "rpe": 1.0,
             "created_ts": 3 * day + 7_200_000}]  # fmt: skip
    clock = StreamClock()
    now = clock.observe("t", chat)
    assert clock.span("t", "chat") == 180 * day and clock.span("t", "rl") == 7_200_000
    assert clock.span("t", "nobody") == 0 and clock.span("other", "chat") == 0
    spans = {a: float(clock.span("t", a)) for a in now}

    def rec(policy: RankPolicy, with_spans: bool) -> dict[str, float]:
        out = rank(chat, policy, 0.3, now, 5, spans=spans if with_spans else None)
        return {r.row["id"]: r.recency for r in out}

    got, before = rec(spanned, True), rec(fixed, True)
    assert got["old"] == pytest.approx(0.5, abs=1e-3) and got["new"] == 1.0
    assert before["old"] == pytest.approx(2**-6, abs=1e-3)
    assert got["mid"] == pytest.approx(2 ** (-90 / 180), abs=1e-3)
    assert before == rec(spanned, False)  # no spans given: the fixed half-life
    assert got["run-a"] == before["run-a"] and got["run-b"] == before["run-b"]
    # a question's own time ends the span there (not after it), never before the origin
    assert clock.span("t", "chat", until=70 * day) == 60 * day
    assert clock.span("t", "chat", until=5 * day) == 0
    assert clock.span("t", "chat", until=900 * day) == 180 * day
    # a later read of an older row stretches the span; the stream time stays
    clock.observe("t", [{"agent_id": "chat", "created_ts": 0}])
    assert clock.span("t", "chat") == 190 * day
    with pytest.raises(ValueError):
        RankPolicy.hybrid(span_factor=-1.0)


def test_the_stream_clock_keeps_the_clocks_it_read_last_with_their_spans() -> None:
    """Bounded: the least recently read clock goes first, its span with it; the clocks
    of the rows just read stay, even one that did not advance; with one clock per
    tenant every agent has the tenant's span."""
    from operators.retrieval import StreamClock

    clock = StreamClock(max_keys=2)
    clock.observe("t", [{"agent_id": "a", "created_ts": 10}, {"agent_id": "a", "created_ts": 50}])
    clock.observe("t", [{"agent_id": "b", "created_ts": 100}])
    clock.observe("t", [{"agent_id": "a", "created_ts": 20}])  # read, not advanced
    now = clock.observe(
        "t", [{"agent_id": "c", "created_ts": 5}, {"agent_id": "a", "created_ts": 30}]
    )
    assert now == {"c": 5, "a": 50}
    assert clock.span("t", "a") == 40 and clock.span("t", "c") == 0
    assert clock.span("t", "b") == 0  # dropped: relearned from the next rows
    assert clock.observe("t", [{"agent_id": "b", "created_ts": 90}]) == {"b": 90}
    assert clock.span("t", "b") == 0 and clock.span("t", "c") == 0  # c went now
    shared = StreamClock(per_agent=False)
    shared.observe("t", [{"agent_id": "a", "created_ts": 10}, {"agent_id": "b", "created_ts": 70}])
    assert shared.span("t", "a") == shared.span("t", "b") == 60


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


MEANS = [0.0, 0.3, -0.4, 1.1]


@settings(max_examples=150, deadline=None)
@given(pool=st.lists(candidate, min_size=3, max_size=12), k=st.integers(3, 8),
       slots=st.integers(1, 3), uses=st.lists(st.integers(0, 6), min_size=12, max_size=12),
       means=st.lists(st.sampled_from(MEANS), min_size=12, max_size=12))  # fmt: skip
def test_several_exploration_slots_pick_by_optimism_among_new_actions(
    pool: list[dict], k: int, slots: int, uses: list[int], means: list[float]
) -> None:
    """With credit evidence, each slot takes the remaining candidate of highest
    optimism (ties by the main lane's order), preferring actions no served hit offers:
    the picks equal that rule applied slot by slot to the main lane's order."""
    from operators.retrieval import explore

    cands = []
    for i, c in enumerate(pool):
        r = {**c, "id": f"m{i}", "uses": uses[i]}
        if uses[i]:
            r["metadata"] = {"credit": stats(uses[i], means[i])}
        cands.append(r)
    p = RankPolicy.hybrid(explore_slots=slots)
    order = rank(cands, p, 0.97, 10**9, len(cands))  # the main lane's full order
    cut = min(slots, k - 1)
    got = [r.row["id"] for r in explore(order, k, cut, p)]
    want = [r.row["id"] for r in order[: k - cut]]
    rest = list(order[k - cut :])
    while rest and len(want) < k:
        served = {str(c["action"]) for c in cands if c["id"] in want}
        fresh = [i for i, r in enumerate(rest) if str(r.row.get("action", "")) not in served]
        value = [p.optimism(r.row, r.fit) for r in rest]
        best = max(fresh or range(len(rest)), key=lambda i: (value[i], -i))
        want.append(rest.pop(best).row["id"])
    assert got == want
