"""The live page's ring (`streams.respond.live`): bounds, forgets, summaries."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streams.respond.live import Decision, LiveRing, gate_summary, histogram_top
from streams.respond.ui import STATIC, TenantCounts, TenantDirectory, static_file


def ev(
    i: int,
    tenant: str = "t",
    score: float = 0.1,
    route: str = "drop",
    kind: str = "dropped",
    ts: int | None = None,
    **kw: object,
) -> dict[str, object]:
    return {"kind": kind, "memory_id": f"m{i}", "tenant": tenant, "agent_id": "a",
            "route": route, "reason": "below_floor" if route == "drop" else "above_high",
            "rpe_smoothed": score, "theta_low": 0.2, "theta_high": 0.6,
            "ts": 1_000_000 + i * 100 if ts is None else ts, **kw}  # fmt: skip


def test_ring_is_bounded_per_tenant_and_in_tenants() -> None:
    ring = LiveRing(per_tenant=5, max_tenants=2, max_known=3)
    ring.add_events(ev(i, "a") for i in range(12))
    assert [d.memory_id for d in ring.snapshot("a")] == [f"m{i}" for i in range(7, 12)]
    ring.add_events([ev(0, "b"), ev(1, "c")])  # "a" is the least recently active: evicted
    assert set(ring.rings) == {"b", "c"} and ring.snapshot("a") == []
    assert set(ring.known) == {"a", "b", "c"}  # names stay known
    ring.add_events([ev(2, "d")])
    assert set(ring.known) == {"b", "c", "d"}  # the known set is bounded too
    assert ring.events_seen == 15


def test_forgotten_events_remove_the_memory_from_the_ring() -> None:
    ring = LiveRing(per_tenant=10)
    ring.add_events([ev(1), ev(2), ev(1, tenant="other")])
    ring.add_events([{"kind": "forgotten", "memory_id": "m1", "tenant": "t", "ts": 2_000_000}])
    assert [d.memory_id for d in ring.snapshot("t")] == ["m2"]
    assert [d.memory_id for d in ring.snapshot("other")] == ["m1"]  # another tenant's m1


def test_undecodable_records_are_counted_not_kept() -> None:
    ring = LiveRing()
    ring.add_events([{"kind": "written"}, {"tenant": "t", "ts": "x", "memory_id": "m",
                                           "kind": "written"}, ev(3)])  # fmt: skip
    ring.add_dead(
        [
            {"no": "reason"},
            {
                "reason": "malformed JSON",
                "stage": "decode",
                "key": "k" * 100,
                "original_b64": "c2VjcmV0",
                "ts": 5,
            },
        ]
    )
    assert ring.undecodable == 3 and len(ring.snapshot("t")) == 1
    (dl,) = ring.dead_letters(10)
    assert dl["reason"] == "malformed JSON" and "original_b64" not in dl  # never the bytes
    assert len(dl["key"]) == 67


def test_gate_summary_bins_quantiles_thresholds_and_histogram() -> None:
    scores = [0.0] * 90 + [0.3] * 8 + [5.0, 40.0]  # a sparse-reward stream
    routes = ["drop"] * 90 + ["buffer"] * 8 + ["core"] * 2
    ring = LiveRing()
    ring.add_events(
        ev(
            i,
            score=s,
            route=r,
            kind="dropped" if r == "drop" else "written",
            ts=1_000_000 + i * 1000,
        )
        for i, (s, r) in enumerate(zip(scores, routes, strict=True))
    )
    ring.add_events(
        [ev(200, kind="promoted", route="core", score=3.0, theta_low=None, ts=1_200_000)]
    )  # not a decision: listed, not binned
    g = gate_summary(ring.snapshot("t"), bins=10, latest=5)
    assert g["decisions"] == 100 and g["routes"] == {"core": 2, "buffer": 8, "drop": 90}
    assert (g["theta_low"], g["theta_high"]) == (0.2, 0.6)
    assert sum(b["n"] for b in g["series"]) == 100 and len(g["series"]) == 10
    first, last = g["series"][0], g["series"][-1]
    assert first["q50"] == 0.0 and last["max"] == 40.0 and last["routes"]["core"] == 2
    assert all(b["t0"] < b["t1"] for b in g["series"])
    hist = g["histogram"]
    assert hist["edges"][-1] == pytest.approx(1.2)  # 2 x theta_high, not the +40 outlier
    assert sum(sum(c) for c in hist["counts"].values()) == 100
    assert hist["clipped"] == 2 and hist["counts"]["core"][-1] == 2
    assert [d["kind"] for d in g["latest"]][:2] == ["promoted", "written"]


def test_histogram_top_covers_thresholds_and_bulk() -> None:
    assert histogram_top([0.0] * 10, 0.5) == pytest.approx(1.0)
    assert histogram_top([float(i) for i in range(11)], 0.5) == pytest.approx(10.8)
    assert histogram_top([], None) > 0


def test_decision_parse_rejects_non_events() -> None:
    assert Decision.parse({"kind": "written"}) is None
    d = Decision.parse(ev(1, score=float("nan")))
    assert d is not None and d.score is None


def test_static_files_are_packaged_and_self_contained() -> None:
    for name in STATIC:
        text = static_file(name).decode()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in text
    html = static_file("index.html").decode()
    assert "<script>" not in html and "style=" not in html  # CSP: no inline code
    js = static_file("ui.js").decode()
    assert "innerHTML" not in js and "eval(" not in js


class FakeStore:
    """Stands in for `StoreService` (``.store`` with count/scan)."""

    def __init__(self, rows: list[str], fail: bool = False) -> None:
        self.store = self
        self.rows = rows
        self.fail = fail
        self.count_calls = 0

    def count(self, partition: str, tenant: str) -> int:
        self.count_calls += 1
        if self.fail:
            raise RuntimeError("milvus away")
        return sum(1 for t in self.rows if t == tenant) * (2 if partition == "core" else 1)

    def scan(self, **_: object) -> Iterator[dict[str, str]]:
        if self.fail:
            raise RuntimeError("milvus away")
        return iter({"tenant": t} for t in self.rows)


async def test_counts_are_cached_for_every_viewer() -> None:
    store = FakeStore(["a", "a", "b"])
    counts = TenantCounts(store, ttl_s=60)
    first = await counts.get(["a", "b"])
    assert first == {"a": {"core": 4, "buffer": 2, "total": 6},
                     "b": {"core": 2, "buffer": 1, "total": 3}}  # fmt: skip
    assert await counts.get(["b", "a"]) == first and store.count_calls == 4  # cached
    counts.ttl_s = 0
    await counts.get(["a"])
    assert store.count_calls == 6


async def test_tenant_directory_is_bounded_and_survives_failures() -> None:
    d = TenantDirectory(FakeStore(["a", "b", "c", "d"]), max_rows=2)
    assert await d.get() == {"a", "b"} and not d.complete
    full = TenantDirectory(FakeStore(["a", "b", "a"]))
    assert await full.get() == {"a", "b"} and full.complete
    broken = TenantDirectory(FakeStore(["a"], fail=True))
    assert await broken.get() == set() and broken.task is None  # retried next call


def test_the_feed_status_shows_a_scoped_token_no_error_text_and_no_other_tenants_counts(
) -> None:  # fmt: skip
    from types import SimpleNamespace

    from streams.respond.ui import feed_status

    ring = LiveRing(per_tenant=10)
    ring.add_events([ev(1, tenant="a"), ev(2, tenant="b")])
    feed = SimpleNamespace(running=False, error="KafkaConnectionError: 10.0.0.7:9092 refused",
                           error_kind="KafkaConnectionError")  # fmt: skip
    scoped = feed_status(feed, ring, frozenset({"a"}))  # type: ignore[arg-type]
    assert scoped == {"enabled": True, "running": False, "error": "KafkaConnectionError",
                      "per_tenant": 10}  # fmt: skip
    admin = feed_status(feed, ring, None)  # type: ignore[arg-type]
    assert admin["error"] == "KafkaConnectionError" and "10.0.0.7" not in str(admin)
    assert admin["events_seen"] == 2 and admin["tenants_known"] == 2
