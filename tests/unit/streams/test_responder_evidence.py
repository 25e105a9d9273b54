"""The responder ranks a default request in two lanes (operators.retrieval) and
records each hit's lane in the usage, with a fake store."""

from __future__ import annotations

from typing import Any

from operators import PassthroughEncoder
from schemas import MemoryUsage, RetrievalRequest
from streams.respond.responder import Responder


class FakeStore:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.counted: list[str] = []

    def count(self, tenant: str, consistency_level: str = "Strong") -> int:
        self.counted.append(consistency_level)
        return len(self.rows)

    def search(self, vec: Any, *, k: int, **kw: Any) -> list[dict[str, Any]]:
        return [dict(r) for r in self.rows[:k]]


def mem(mid: str, sim: float, utility: float = 0.0, uses: int = 0) -> dict[str, Any]:
    """A buffer-tier row (surprise from its rpe)."""
    return {
        "id": mid,
        "similarity": sim,
        "rpe": 3.0,
        "utility": utility,
        "uses": uses,
        "created_ts": 0,
        "partition": "buffer",
        "agent_id": "a",
        "text": mid,
    }


def served(
    rows: list[dict[str, Any]], lam: float | None = None, k: int = 3
) -> tuple[list[tuple[str, str, float]], MemoryUsage | None]:
    r = Responder(FakeStore(rows), PassthroughEncoder(2))
    req = RetrievalRequest.model_validate(
        {"request_id": "q", "tenant": "t", "vector": [1.0, 0.0], "k": k, "lambda": lam,
         "episode_id": "e"}
    )  # fmt: skip
    resp, usage = r.answer(req, now_ms=0)
    return [(h.memory_id, h.breakdown.lane, h.breakdown.lambda_) for h in resp.hits], usage


def test_the_last_hit_is_the_exploration_lane_and_the_usage_records_it() -> None:
    """Without evidence the list is the ranking's own; with the near memories served
    and never acted on, the slot goes to the nearest untried one further down."""
    rows = [mem(f"x{i}", 0.9 - 0.1 * i) for i in range(6)]
    hits, usage = served(rows)
    assert [(m, lane) for m, lane, _ in hits] == [("x0", "main"), ("x1", "main"),
                                                  ("x2", "explore")]  # fmt: skip
    assert usage is not None and usage.lanes == ["main", "main", "explore"]
    assert usage.propensities == [1.0, 1.0, 1.0]
    # each served hit's cosine, for credit to remember where a memory earned it
    assert usage.similarities == [r["similarity"] for r in rows[:3]]
    tried = [mem(f"x{i}", 0.9 - 0.1 * i, uses=2) for i in range(4)] + [mem("x4", 0.5)]
    hits, _ = served(tried)
    assert [m for m, _, _ in hits] == ["x0", "x1", "x4"]
    assert {lam for _, _, lam in hits} == {Responder(FakeStore([]), PassthroughEncoder(2))
                                           .policy.lambda_for(5)}  # fmt: skip


def test_an_explicit_lambda_ranks_without_lanes() -> None:
    tried = [mem(f"x{i}", 0.9 - 0.1 * i, uses=2) for i in range(4)] + [mem("x4", 0.5)]
    hits, usage = served(tried, lam=1.0)
    assert [(m, lane, lam) for m, lane, lam in hits] == [
        ("x0", "main", 1.0), ("x1", "main", 1.0), ("x2", "main", 1.0)]  # fmt: skip
    assert usage is not None and usage.lanes == ["main"] * 3
    hits, _ = served(tried, k=2)  # fewer than 3 hits: no exploration slot
    assert [lane for _, lane, _ in hits] == ["main", "main"]


def test_as_of_bounds_the_search_and_measures_recency_from_the_question() -> None:
    """``as_of``: nothing written after the question (the store filter's upper bound,
    the tighter of it and ``until_ms``), and recency measured from the question's
    time, not from the newest memory the responder has read."""
    from streams.respond.responder import store_filter

    def req(**kw: Any) -> RetrievalRequest:
        return RetrievalRequest.model_validate(
            {"request_id": "q", "tenant": "t", "vector": [1.0, 0.0], "k": 2, **kw}
        )

    assert store_filter(req(as_of=500)) == {"created_ts": {"<=": 500}}
    assert store_filter(req(as_of=500, filters={"until_ms": 300, "since_ms": 10})) == {
        "created_ts": {">=": 10, "<=": 300}
    }
    assert store_filter(req()) == {}
    day = 24 * 3600 * 1000
    old = mem("old", 0.9) | {"created_ts": 0}
    new = mem("new", 0.9) | {"created_ts": 60 * day}
    r = Responder(FakeStore([old, new]), PassthroughEncoder(2))
    live, _ = r.answer(req(), now_ms=0)  # recency from the newest read: "new" is fresh
    rec = {h.memory_id: h.breakdown.recency for h in live.hits}
    assert rec["new"] == 1.0 and rec["old"] < 1.0
    asked, _ = r.answer(req(as_of=0), now_ms=0)  # asked on day 0: "old" is fresh
    rec = {h.memory_id: h.breakdown.recency for h in asked.hits}
    assert rec["old"] == 1.0


def test_the_tenant_count_for_lambda_reads_with_the_searches_consistency() -> None:
    """A Strong count waits for a server time tick per partition: the count that sets
    lambda is read as the searches are (bounded), once per ``count_ttl_s``."""
    store = FakeStore([mem("x0", 0.9)])
    r = Responder(store, PassthroughEncoder(2), consistency_level="Bounded")
    req = RetrievalRequest.model_validate(
        {"request_id": "q", "tenant": "t", "vector": [1.0, 0.0], "k": 1}
    )
    r.answer(req, now_ms=0)
    r.answer(req, now_ms=1)
    assert store.counted == ["Bounded"]


def test_recency_follows_the_agents_span_up_to_the_question() -> None:
    """The responder gives the ranking each agent's span as its clock has read it: a
    chat over 180 days keeps half the recency for its oldest memory (not 2^-6 on the
    fixed 30 days); a question asked on day 90 measures the span up to day 90."""
    from operators.retrieval import RankPolicy

    day = 24 * 3600 * 1000
    rows = [mem("old", 0.9) | {"created_ts": 0}, mem("new", 0.8) | {"created_ts": 180 * day}]
    req = RetrievalRequest.model_validate(
        {"request_id": "q", "tenant": "t", "vector": [1.0, 0.0], "k": 2}
    )

    def recency(policy: RankPolicy | None, **kw: Any) -> dict[str, float]:
        r = Responder(FakeStore(rows), PassthroughEncoder(2), policy=policy)
        resp, _ = r.answer(req.model_copy(update=kw), now_ms=0)
        return {h.memory_id: h.breakdown.recency for h in resp.hits}

    assert recency(None)["old"] == 0.5 and recency(None)["new"] == 1.0
    assert recency(RankPolicy.hybrid(span_factor=0.0))["old"] == 2.0**-6
    assert recency(None, as_of=90 * day)["old"] == 0.5  # age 90 d on a 90 d half-life


def test_a_retried_request_counts_its_hits_as_retrievals_once() -> None:
    """The SDK retries a timed-out search with the same request id; the retrievals
    decay reads (`metadata.access`) must not count the retry. Another id, or the same
    id of another tenant, is a retrieval of its own."""
    from streams.jobs.access import AccessTracker

    tracker = AccessTracker()
    r = Responder(FakeStore([mem("x0", 0.9), mem("x1", 0.8)]), PassthroughEncoder(2),
                  on_access=tracker.record)  # fmt: skip

    def ask(rid: str, tenant: str = "t") -> None:
        req = RetrievalRequest.model_validate(
            {"request_id": rid, "tenant": tenant, "vector": [1.0, 0.0], "k": 2}
        )
        resp, _ = r.answer(req, now_ms=0)
        assert len(resp.hits) == 2

    ask("q1")
    ask("q1")  # the retry: answered again, counted once
    assert tracker.recorded == 2
    ask("q2")
    ask("q1", tenant="u")
    assert tracker.recorded == 6
    assert tracker.drain()[("t", "x0")][0] == 2
