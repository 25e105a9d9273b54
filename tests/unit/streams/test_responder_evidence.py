"""The responder's default lambda adapts to outcome evidence within the
exploration window (operators.retrieval `RankPolicy.adapt`), with a fake store."""

from __future__ import annotations

from typing import Any

from operators import PassthroughEncoder
from schemas import RetrievalRequest
from streams.respond.responder import Responder


class FakeStore:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def count(self, tenant: str) -> int:
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


def served(rows: list[dict[str, Any]], lam: float | None = None) -> list[tuple[str, float]]:
    r = Responder(FakeStore(rows), PassthroughEncoder(2))
    req = RetrievalRequest.model_validate(
        {"request_id": "q", "tenant": "t", "vector": [1.0, 0.0], "k": 2, "lambda": lam}
    )
    resp, _ = r.answer(req, now_ms=0)
    return [(h.memory_id, h.breakdown.lambda_) for h in resp.hits]


def test_blamed_top_k_explores_neighbours_not_far_memories() -> None:
    blamed = [mem(f"x{i}", 0.9 - 0.1 * i, utility=-2.0, uses=1) for i in range(6)]
    far = mem("far", 0.05)
    hits = served([*blamed, far])
    assert [m for m, _ in hits] == ["x0", "x1"]
    assert hits[0][1] == 1 / 1.1  # lowered by the evidence, to the spread floor
    # an untried neighbour within the spread is explored; the far one never
    hits = served([blamed[0], mem("near", 0.79), *blamed[1:], far])
    assert [m for m, _ in hits] == ["x0", "near"]


def test_credited_top_k_keeps_the_schedule_lambda() -> None:
    helped = [mem(f"h{i}", 0.9 - 0.01 * i, utility=0.5, uses=2) for i in range(3)]
    hits = served([*helped, mem("far", 0.3)])
    assert [m for m, _ in hits] == ["h0", "h1"]
    assert hits[0][1] == Responder(FakeStore([]), PassthroughEncoder(2)).policy.lambda_for(4)
    # an explicit lambda is never adapted
    blamed = [mem(f"x{i}", 0.9, utility=-2.0, uses=1) for i in range(3)]
    assert {lam for _, lam in served([*blamed, mem("far", 0.3)], lam=0.2)} == {0.2}


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
