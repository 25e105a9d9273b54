"""Eligibility window: horizon, dedup, TTL with injected time, LRU bound, round-trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from operators.eligibility import EligibilityEntry, EligibilityWindow


def _entry(step: int, tid: str | None = None, reward: float = 0.0) -> EligibilityEntry:
    emb = np.linspace(-1.0, 1.0, 8) * (step + 1) / 100.0
    return EligibilityEntry.make(
        tid or f"t{step}", step, emb, value=0.1 * step, reward=reward, delta=-0.5, route="drop"
    )


def test_entry_packs_float16_and_roundtrips() -> None:
    e = _entry(3)
    assert len(e.embedding) == 8 * 2
    np.testing.assert_allclose(e.vector(), np.linspace(-1.0, 1.0, 8) * 0.04, atol=1e-3)
    assert e.vector().dtype == np.float32
    assert EligibilityEntry.from_dict(json.loads(json.dumps(e.to_dict()))) == e


def test_horizon_order_and_dedup() -> None:
    w = EligibilityWindow(horizon=4)
    for step in (0, 1, 3, 2, 4, 5):
        w.add("ep", _entry(step), now_ms=1000 + step)
    assert [e.step for e in w.get("ep")] == [2, 3, 4, 5]
    w.add("ep", _entry(5, reward=9.0), now_ms=2000)  # redelivery replaces
    got = w.get("ep")
    assert [e.step for e in got] == [2, 3, 4, 5]
    assert got[-1].reward == 9.0
    assert w.get("unknown") == []


def test_close_returns_entries_and_forgets() -> None:
    w = EligibilityWindow()
    w.add("a", _entry(0), now_ms=0)
    w.add("a", _entry(1), now_ms=1)
    closed = w.close("a")
    assert [e.step for e in closed] == [0, 1]
    assert "a" not in w and w.get("a") == [] and w.close("a") == []


def test_expire_uses_injected_time_and_idle_clock() -> None:
    w = EligibilityWindow(ttl_ms=1000)
    w.add("old", _entry(0), now_ms=0)
    w.add("busy", _entry(0), now_ms=0)
    w.add("busy", _entry(1), now_ms=900)  # activity refreshes the idle clock
    assert w.expire(now_ms=1000) == 0  # idle exactly ttl: kept
    assert w.expire(now_ms=1001) == 1
    assert w.episodes() == ["busy"]
    assert w.expire(now_ms=1901) == 1
    assert len(w) == 0


def test_lru_bound() -> None:
    w = EligibilityWindow(max_episodes=3)
    for k in ("a", "b", "c"):
        w.add(k, _entry(0), now_ms=0)
    w.add("a", _entry(1), now_ms=1)  # touch "a": "b" is now least recent
    w.add("d", _entry(0), now_ms=2)
    assert sorted(w.episodes()) == ["a", "c", "d"]
    assert w.evicted == 1


def test_window_roundtrip() -> None:
    w = EligibilityWindow(horizon=3, ttl_ms=50, max_episodes=5)
    for i in range(4):
        w.add(f"ep{i % 2}", _entry(i), now_ms=10 * i)
    back = EligibilityWindow.from_dict(json.loads(json.dumps(w.to_dict())))
    assert back.to_dict() == w.to_dict()
    assert back.episodes() == w.episodes()
    assert back.expire(now_ms=75) == w.expire(now_ms=75) == 1


def test_validation() -> None:
    with pytest.raises(ValueError):
        EligibilityWindow(horizon=0)
