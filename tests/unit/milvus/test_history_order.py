"""`milvus.history.in_order`: a memory's history oldest first, and utility changes of
one millisecond in the order they were applied."""

from __future__ import annotations

from typing import Any

from milvus.history import in_order


def ev(key: str, ts: int, before: float | None = None, after: float | None = None,
       kind: str = "fed_back") -> dict[str, Any]:  # fmt: skip
    body: dict[str, Any] = {"processed_ts": ts}
    if before is not None:
        body |= {"utility_before": before, "utility_after": after}
    return {"key": key, "ts": ts, "kind": kind, "body": body}


def test_changes_of_one_millisecond_follow_their_chain() -> None:
    # three thumbs down applied 0 -> -0.2 -> -0.37 -> -0.5, keys in another order
    rows = [ev("c", 5, -0.367, -0.5), ev("a", 5, -0.2, -0.367), ev("b", 5, 0.0, -0.2),
            ev("w", 1, kind="written"), ev("z", 9, -0.5, -0.6)]  # fmt: skip
    assert [r["key"] for r in in_order(rows)] == ["w", "b", "a", "c", "z"]


def test_time_orders_first_and_other_events_keep_their_place() -> None:
    rows = [ev("m", 5, kind="moved"), ev("x", 5, 0.3, 0.5), ev("y", 5, 0.1, 0.3),
            ev("p", 2, 0.9, 0.1)]  # fmt: skip
    out = [r["key"] for r in in_order(rows)]
    assert out[0] == "p" and out.index("y") < out.index("x") and "m" in out
    assert len(out) == 4
