"""The credit job's open episode windows (`operators.credit.EpisodeWindows`): capped per
tenant, evicted in the tenant's own activity order, never across tenants."""

from __future__ import annotations

import random
import time

import pytest

from operators.credit import CreditAssigner, EpisodeWindows, OutcomeRecord, UsageRecord


def use(rid: str) -> UsageRecord:
    return UsageRecord(request_id=rid, step=0, memory_ids=("m",), weights=(1.0,))


def test_a_flood_evicts_only_the_flooding_tenants_windows() -> None:
    a = CreditAssigner(max_episodes=1000, max_episodes_per_tenant=100)
    a.on_usage("B", "b-ep", use("rb"), 0)  # B's episode, opened first (the oldest overall)
    for i in range(5000):
        a.on_usage("A", f"a{i}", use(f"r{i}"), 1 + i)
    assert a.episodes.open_count("A") == 100 and a.episodes.evicted == 4900
    # A kept its most recently active windows, B's one is still open and earns credit
    assert a.episodes.get(("A", "a4999")) is not None and a.episodes.get(("A", "a0")) is None
    ups = a.on_outcome("B", "b-ep", OutcomeRecord(outcome_id="o", reward=1.0), 10_000)
    assert [u.memory_id for u in ups] == ["m"] and ups[0].tenant == "B"


def test_the_total_cap_evicts_from_the_largest_tenant() -> None:
    w = EpisodeWindows(per_tenant=10, total=12)
    for i in range(10):
        w.touch("A", f"a{i}", i)
    w.touch("B", "b0", 100)
    w.touch("B", "b1", 101)
    assert len(w) == 12
    w.touch("B", "b2", 102)  # at the total: A holds the most, A's oldest goes
    assert w.get(("A", "a0")) is None and w.open_count("B") == 3 and len(w) == 12


def test_touch_moves_an_episode_to_the_back_of_its_tenants_order() -> None:
    w = EpisodeWindows(per_tenant=3, total=100)
    for i in range(3):
        w.touch("A", f"e{i}", i)
    w.touch("A", "e0", 10)  # e0 active again: e1 is now the least recently active
    w.touch("A", "e3", 11)
    assert w.get(("A", "e1")) is None and w.get(("A", "e0")) is not None


@pytest.mark.parametrize("seed", range(5))
def test_expire_matches_a_full_scan(seed: int) -> None:
    rng = random.Random(seed)
    w = EpisodeWindows(per_tenant=50, total=120)
    for step in range(3000):
        t, e = rng.choice("ABCD"), f"e{rng.randrange(80)}"
        now = step + rng.randrange(-20, 20)  # arrival times are not monotone
        ep = w.touch(t, e, now)
        assert ep.last_ms >= now and ep.tenant == t
        if step % 500 == 499:
            cut = step - 200
            gone = w.expire(cut)
            assert all(g.last_ms < cut for g in gone)
    live = [(t, e) for t in "ABCD" for e in (f"e{i}" for i in range(80)) if w.get((t, e))]
    assert len(live) == len(w)
    assert all(w.open_count(t) <= 50 for t in "ABCD")
    last = {k: w.get(k).last_ms for k in live}  # type: ignore[union-attr]
    cut = max(last.values()) - 100
    gone = w.expire(cut)
    assert sorted(g.last_ms for g in gone) == sorted(v for v in last.values() if v < cut)
    assert all(w.get(k) is not None for k, v in last.items() if v >= cut)


def test_eviction_at_the_cap_is_cheap() -> None:
    """1,000 new episodes at a 100,000-window cap: a full scan per eviction took
    tens of seconds (the old O(n) `min`); the heap takes milliseconds."""
    a = CreditAssigner(max_episodes=100_000, max_episodes_per_tenant=100_000)
    for i in range(100_000):
        a.on_usage("A", f"a{i}", use("r"), i)
    t0 = time.perf_counter()
    for i in range(1000):
        a.on_usage("A", f"new{i}", use("r"), 200_000 + i)
    took = time.perf_counter() - t0
    assert len(a.episodes) == 100_000 and a.episodes.evicted == 1000
    assert took < 1.0, f"{took:.2f} s for 1,000 evictions"
