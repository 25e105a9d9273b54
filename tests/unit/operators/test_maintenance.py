"""Maintenance operators: priority, merge planning and arithmetic, decay plans, index."""

from __future__ import annotations

import math

import numpy as np
import pytest

from operators.credit import CreditStats
from operators.decay import (
    BUFFER,
    CORE,
    DAY_MS,
    Entry,
    MaintenancePolicy,
    TenantIndex,
    entry_from_row,
    plan_decay,
    priority,
    tenant_priorities,
)
from operators.dedup import is_critical, merge_rows, merge_scope, plan_merges, rewards_agree
from streams.jobs.access import AccessTracker

NOW = 1_800_000_000_000


def unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def test_priority_formula() -> None:
    pol = MaintenancePolicy(
        half_life_ms=1000, access_half_life_ms=500, utility_weight=2.0, access_weight=0.5
    )
    p, earned = priority(
        np.array([2.0]), np.array([1000]), np.array([0.3]), np.array([3]), np.array([500]), pol
    )
    want_earned = 2.0 * math.tanh(0.3) + 0.5 * math.log2(4) * 0.5
    assert earned[0] == pytest.approx(want_earned)
    assert p[0] == pytest.approx(2.0 * 0.5 + want_earned)
    # negative utility lowers priority; no hits, no access term
    p2, e2 = priority(1.0, 0, -1.0, 0, 0, pol)
    assert e2 == pytest.approx(2.0 * math.tanh(-1.0)) and p2 < 1.0


def test_policy_requires_hysteresis() -> None:
    with pytest.raises(ValueError):
        MaintenancePolicy(demote_below=0.5, promote_above=0.5)


def test_plan_merges_oldest_survives_regardless_of_order() -> None:
    a, b = unit([1, 0, 0]), unit([0, 1, 0])
    near_a = unit([1, 0.05, 0])
    ids = ["z-new", "a-old", "b", "m"]
    created = [30, 10, 5, 20]
    vecs = np.stack([near_a, a, b, near_a])
    groups = plan_merges(ids, created, vecs, tau=0.95)
    assert len(groups) == 1
    g = groups[0]
    assert g.survivor == "a-old" and g.members == ("m", "z-new")
    perm = [3, 1, 0, 2]
    again = plan_merges([ids[i] for i in perm], [created[i] for i in perm], vecs[perm], 0.95)
    assert again == groups


def test_plan_merges_does_not_chain_beyond_tau() -> None:
    # x ~ y and y ~ z above tau but x !~ z: z becomes its own survivor... unless y merged first
    x = unit([1, 0])
    y = unit([math.cos(0.25), math.sin(0.25)])
    z = unit([math.cos(0.5), math.sin(0.5)])
    tau = math.cos(0.3)
    groups = plan_merges(["x", "y", "z"], [1, 2, 3], np.stack([x, y, z]), tau)
    assert [(g.survivor, g.members) for g in groups] == [("x", ("y",))]


def test_plan_merges_never_merges_across_rewards() -> None:
    v = unit([1, 0, 0])
    vecs = np.stack([v] * 6)
    ids = ["zero", "r25", "zero2", "r25b", "r25-drift", "r-neg"]
    spans = [(0.0, 0.0), (25.0, 25.0), (0.0, 0.0), (25.1, 25.1), (25.3, 25.3), (-25.0, -25.0)]
    groups = plan_merges(ids, [1, 2, 3, 4, 5, 6], vecs, 0.95, spans, reward_tol=0.01)
    # within 1 % of every reward in the group: 25.3 would stretch {25, 25.1} to 1.2 %
    assert [(g.survivor, g.members) for g in groups] == [("zero", ("zero2",)), ("r25", ("r25b",))]
    # an existing survivor's span counts (complete linkage across windows)
    groups = plan_merges(
        ["old", "new"], [1, 2], vecs[:2], 0.95, [(24.8, 25.0), (25.2, 25.2)], reward_tol=0.01
    )
    assert groups == []
    assert rewards_agree(0.0, 0.0, 0.01) and not rewards_agree(-1e-9, 1e-9, 0.5)
    assert not rewards_agree(0.0, 1e-12, 0.01)


def test_merge_scope_separates_route_terminal_and_reward_sign() -> None:
    base = {
        "agent_id": "a",
        "action": "go",
        "valence": 1,
        "partition": "core",
        "reward": 2.0,
        "metadata": {"done": False},
    }
    assert merge_scope(base) == merge_scope({**base, "reward": 3.0})
    for other in (
        {"partition": "buffer"},
        {"metadata": {"done": True}},
        {"reward": 0.0},
        {"reward": -2.0},
        {"valence": -1},
        {"action": "stay"},
        {"metadata": {"done": False, "user": {"task": "melt"}}},
    ):
        assert merge_scope(base) != merge_scope({**base, **other})
    # the agent's declared context is compared whole, key order aside
    a = {**base, "metadata": {"user": {"task": "melt", "variation": 1}, "merge": {"ids": ["x"]}}}
    b = {**base, "metadata": {"user": {"variation": 1, "task": "melt"}}}
    c = {**base, "metadata": {"user": {"variation": 2, "task": "melt"}}}
    assert merge_scope(a) == merge_scope(b) != merge_scope(c)
    assert is_critical({"reward": 0.0, "metadata": {"done": True}})
    assert is_critical({"reward": -0.5}) and not is_critical({"reward": 0.0, "metadata": {}})


def row(mid: str, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "id": mid,
        "tenant": "t",
        "reward": 0.0,
        "rpe": 0.0,
        "rpe_smoothed": 0.0,
        "gate": 0.0,
        "utility": 0.0,
        "uses": 0,
        "merged_count": 1,
        "created_ts": 0,
        "last_access_ts": 0,
        "metadata": {"user": {"k": 1}},
        "partition": "buffer",
    }
    base.update(kw)
    return base


def test_merge_arithmetic_and_idempotency() -> None:
    s = row(
        "s",
        reward=1.0,
        rpe=0.5,
        merged_count=2,
        created_ts=100,
        last_access_ts=100,
        utility=0.2,
        uses=1,
        gate=0.3,
        rpe_smoothed=0.4,
    )
    m1 = row(
        "m1",
        reward=4.0,
        rpe=-3.0,
        created_ts=300,
        last_access_ts=350,
        utility=0.8,
        uses=3,
        partition="core",
        gate=0.9,
        rpe_smoothed=2.0,
    )
    m2 = row("m2", reward=-2.0, rpe=1.0, created_ts=200, last_access_ts=50)
    new, folded = merge_rows(s, [m1, m2])
    assert folded == ["m1", "m2"]
    assert new["merged_count"] == 4
    assert new["reward"] == pytest.approx((1.0 * 2 + 4.0 - 2.0) / 4)
    assert new["rpe"] == -3.0  # largest |rpe|, sign kept
    assert new["rpe_smoothed"] == 2.0 and new["gate"] == 0.9
    assert new["uses"] == 4 and new["utility"] == pytest.approx((0.2 * 1 + 0.8 * 3) / 4)
    assert new["created_ts"] == 100 and new["last_access_ts"] == 350
    assert new["metadata"]["merge"]["last_seen_ts"] == 300
    assert new["metadata"]["merge"]["first_seen_ts"] == 100
    assert new["metadata"]["user"] == {"k": 1}
    assert new["partition"] == "core"
    # replaying the same merge on the merged row folds nothing
    again, folded2 = merge_rows(new, [m1, m2])
    assert folded2 == [] and again["merged_count"] == 4 and again["reward"] == new["reward"]
    # a third member later: counts continue from the merged row
    third, _ = merge_rows(new, [row("m3", reward=0.0, created_ts=400)])
    assert third["merged_count"] == 5 and third["reward"] == pytest.approx(4.0 / 5)
    assert entry_from_row(third).last_seen_ts == 400
    merge = third["metadata"]["merge"]
    assert (merge["reward_min"], merge["reward_max"]) == (-2.0, 4.0)
    # a survivor folded into another brings the ids it stood for, and its credit ids
    top, folded = merge_rows(
        row("top", metadata={"credit_ids": ["c0"]}),
        [{**third, "metadata": {**third["metadata"], "credit_ids": ["c1"]}}],
    )
    assert folded == ["s", "m1", "m2", "m3"]
    assert top["metadata"]["merge"]["ids"] == folded and top["merged_count"] == 6
    assert top["metadata"]["credit_ids"] == ["c0", "c1"]


def test_horizons_follow_the_clocks_span() -> None:
    """A clock spanning 30 days keeps a 20-day-old buffer memory (TTL >= span) and its
    30-day-old core memory (half-life >= span: 1 * 2^-1 = 0.5 >= 0.3); a clock that
    spans a day decays on the fixed horizons, as with span_factor 0."""
    long = index_of({"old-buf": e(BUFFER, 20, 5.0), "old-core": e(CORE, 30, 1.0)})
    assert plan_decay(long, MaintenancePolicy(), NOW).actions == []
    fixed = {(a.memory_id, a.kind) for a in plan_decay(
        long, MaintenancePolicy(span_factor=0.0), NOW).actions}  # fmt: skip
    assert fixed == {("old-buf", "evicted"), ("old-core", "demoted")}
    short = {"a": e(BUFFER, 1, 0.03), "b": e(CORE, 0.5, 0.2), "c": e(BUFFER, 0.2, 1.0)}
    for pol in (MaintenancePolicy(), MaintenancePolicy(span_factor=0.0)):
        got = {(a.memory_id, a.kind) for a in plan_decay(index_of(short), pol, NOW).actions}
        assert got == {("a", "evicted"), ("b", "demoted")}
    # factor 1: an entry is never older than its clock's span, so the TTL never fires
    # and the |rpe| term keeps at least half; value and capacity decide (0.3: demoted)
    weak = index_of({"first": e(CORE, 90, 0.5), "last": e(BUFFER, 0, 0.02)})
    got = {
        (a.memory_id, a.kind, a.reason) for a in plan_decay(weak, MaintenancePolicy(), NOW).actions
    }
    assert got == {("first", "demoted", "faded"), ("last", "evicted", "below_floor")}
    with pytest.raises(ValueError, match="span_factor"):
        MaintenancePolicy(span_factor=-1.0)


def index_of(entries: dict[str, Entry]) -> TenantIndex:
    t = TenantIndex(capacity=2)
    for k, e in entries.items():
        t.upsert(k, e)
    return t


def e(part: int, age_days: float, rpe: float, **kw: float) -> Entry:
    ts = int(NOW - age_days * DAY_MS)
    return Entry(
        part,
        ts,
        ts,
        rpe,
        kw.get("utility", 0.0),
        int(kw.get("hits", 0)),
        int(NOW - kw.get("access_age_days", age_days) * DAY_MS),
    )


def test_decay_ttl_floor_fade_promote() -> None:
    pol = MaintenancePolicy(span_factor=0.0)  # fixed horizons (7 d half-life, 14 d TTL)
    t = index_of(
        {
            "old-buf": e(BUFFER, 20, 5.0),  # past TTL (14 d)
            "weak-buf": e(BUFFER, 1, 0.03),  # below floor
            "ok-buf": e(BUFFER, 1, 1.0),
            "faded-core": e(CORE, 30, 1.0),  # 1 * 2^-30/7 ~ 0.05 < 0.3
            "fresh-core": e(CORE, 0.5, 2.0),
            "useful-buf": e(BUFFER, 3, 0.2, utility=0.9),  # earned tanh(.9)=0.72 >= 0.5
            "used-buf": e(BUFFER, 3, 0.2, hits=15, access_age_days=0.01),
        }
    )
    plan = plan_decay(t, pol, NOW)
    got = {(a.memory_id, a.kind, a.reason) for a in plan.actions}
    assert got == {
        ("old-buf", "evicted", "ttl"),
        ("weak-buf", "evicted", "below_floor"),
        ("faded-core", "demoted", "faded"),
        ("useful-buf", "promoted", "earned"),
        ("used-buf", "promoted", "earned"),
    }
    # a recently accessed old buffer entry is not past the TTL
    t2 = index_of({"old-but-used": e(BUFFER, 20, 5.0, access_age_days=1, hits=1)})
    assert all(a.reason != "ttl" for a in plan_decay(t2, pol, NOW).actions)


def test_capacities_pick_lowest_priority() -> None:
    pol = MaintenancePolicy(core_capacity=2, buffer_capacity=3)
    t = index_of(
        {
            "c-hi": e(CORE, 0, 5.0),
            "c-mid": e(CORE, 0, 3.0),
            "c-lo": e(CORE, 0, 1.0),
            "b1": e(BUFFER, 0, 0.9),
            "b2": e(BUFFER, 0, 0.8),
            "b3": e(BUFFER, 0, 0.7),
        }
    )
    plan = plan_decay(t, pol, NOW)
    assert [(a.memory_id, a.kind, a.reason) for a in plan.actions] == [
        ("b3", "evicted", "buffer_capacity"),
        ("c-lo", "demoted", "core_capacity"),
    ]
    # a promotion that would not make the core's top is not made
    t.upsert("b-earned", e(BUFFER, 0, 0.0, utility=0.6))
    plan = plan_decay(t, pol, NOW)
    assert "b-earned" not in {a.memory_id for a in plan.by_kind("promoted")}


def test_max_actions_defers() -> None:
    pol = MaintenancePolicy(buffer_capacity=0, max_actions=3)
    t = index_of({f"b{i}": e(BUFFER, 0, 1.0 + i) for i in range(5)})
    plan = plan_decay(t, pol, NOW)
    assert [a.memory_id for a in plan.actions] == ["b0", "b1", "b2"] and plan.deferred == 2


def test_index_swap_remove_and_refresh_cursor() -> None:
    t = index_of({f"m{i}": e(BUFFER, 0, float(i)) for i in range(5)})
    assert t.remove("m1") and not t.remove("m1")
    assert len(t) == 4 and "m4" in t
    got = t.get("m4")
    assert got is not None and got.abs_rpe == 4.0
    seen = t.next_refresh(3) + t.next_refresh(3)
    assert set(seen) == set(t.ids)
    t.set_partition("m4", CORE)
    assert t.counts() == {"core": 1, "buffer": 3}


def test_access_tracker_batches() -> None:
    tr = AccessTracker()
    tr.record("t", ["a", "b"], 10)
    tr.record("t", ["a"], 20)
    hits = tr.drain()
    assert hits == {("t", "a"): (2, 20), ("t", "b"): (1, 10)}
    assert tr.drain() == {}
    tr.record("t", ["a", "b"], 30)
    assert tr.drain(hold={("t", "a")}) == {("t", "b"): (1, 30)}  # a's count stays
    assert tr.pending() == 1 and tr.drain() == {("t", "a"): (1, 30)}


def test_ages_are_stream_time_per_agent_clock() -> None:
    """Ages are measured to the watermark of the memory's own clock: shifting one
    agent's timestamps by any constant changes no decision, for it or for others."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    entry = st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from([CORE, BUFFER]),
                      st.integers(0, 40 * DAY_MS), st.floats(0, 6), st.floats(-1, 1),
                      st.integers(0, 20), st.integers(0, 40 * DAY_MS))  # fmt: skip

    @settings(max_examples=60, deadline=None)
    @given(
        st.lists(entry, min_size=1, max_size=40),
        st.dictionaries(
            st.sampled_from(["a", "b", "c"]), st.integers(-3 * 365 * DAY_MS, 3 * 365 * DAY_MS)
        ),
    )
    def check(entries: list[tuple], shift: dict[str, int]) -> None:
        pol = MaintenancePolicy(core_capacity=8, buffer_capacity=12)
        base = 10 * 365 * DAY_MS

        def index(by: dict[str, int]) -> TenantIndex:
            t = TenantIndex()
            for i, (agent, part, seen, rpe, util, hits, acc) in enumerate(entries):
                ts = base + seen + by.get(agent, 0)
                t.upsert(
                    f"m{i}",
                    Entry(
                        part,
                        ts,
                        ts,
                        rpe,
                        util,
                        hits,
                        base + min(acc, seen) + by.get(agent, 0),
                        agent,
                    ),
                )
            return t

        def plan(t: TenantIndex) -> list[tuple[str, str, str]]:
            return [(a.memory_id, a.kind, a.reason) for a in plan_decay(t, pol).actions]

        assert plan(index(shift)) == plan(index({}))

    check()


def test_stream_clocks_are_watermarks() -> None:
    t = TenantIndex()
    t.upsert("x", e(BUFFER, 3, 1.0))
    assert t.stream_time("agent") is None and t.stream_time("") == int(NOW - 3 * DAY_MS)
    t.advance("", NOW)
    t.advance("", NOW - DAY_MS)  # never backwards
    assert t.stream_time() == NOW and t.stream_now().tolist() == [NOW]
    t.remove("x")
    assert t.stream_time() == NOW  # removing memories does not move the clock back
    shared = TenantIndex(per_agent_clock=False)
    shared.upsert("p", Entry(BUFFER, 10, 10, 1.0, agent="a"))
    shared.advance("b", 99)
    assert shared.stream_time("a") == shared.stream_time("b") == 99
    with pytest.raises(ValueError):
        MaintenancePolicy(clock="wall")


def test_retrievals_the_agent_reported_ignoring_are_not_earned() -> None:
    """A memory served 12 times, credited 12 uses of which none was acted on, has
    earned no access; one acted on 4 of them keeps those; without usage reports
    every retrieval counts."""

    def mem(uses: int, acted: int) -> dict:
        meta: dict = {"access": {"n": 12}}
        if acted:
            meta["credit"] = {"n": acted, "w": float(acted), "mean": 1.0, "m2": 0.0}
        return {"partition": "buffer", "created_ts": 0, "uses": uses, "metadata": meta}

    assert entry_from_row(mem(12, 0)).hits == 0
    assert entry_from_row(mem(12, 4)).hits == 4
    assert entry_from_row(mem(0, 0)).hits == 12


def test_a_memory_with_negative_credit_is_not_promoted_by_its_retrievals() -> None:
    """Served 22 times in the last second: a buffer memory without credit is promoted
    on its retrievals; one whose credit is negative (acted on three times: helped once,
    misled twice; or thumbed down) is not, however often it is found."""

    def mem(credits: list[float]) -> dict:
        stats = CreditStats()
        for x in credits:
            stats = stats.fold(x, 0.95)
        meta: dict = {"access": {"n": 22}}
        if credits:
            meta["credit"] = stats.to_dict()
        row = {"partition": "buffer", "created_ts": NOW - 1000, "rpe": 0.1, "uses": len(credits)}
        return row | {"last_access_ts": NOW - 1000, "utility": stats.mean, "metadata": meta}

    idx = TenantIndex()
    cases = {"plain": [], "helped": [1.0], "mixed": [1.0, -1.0, -1.0], "thumbed": [-0.5]}
    for name, credits in cases.items():
        idx.upsert(name, entry_from_row(mem(credits)))
    plan = plan_decay(idx, MaintenancePolicy(), NOW)
    promoted = {a.memory_id for a in plan.actions if a.kind == "promoted"}
    assert promoted == {"plain", "helped"}
    # the earned value alone would have promoted the two with negative credit
    _, earned = tenant_priorities(idx, MaintenancePolicy(), NOW)
    assert all(earned[idx.ids.index(m)] >= MaintenancePolicy().promote_above for m in cases)
