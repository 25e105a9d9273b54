"""`MemoryReader.get` over a fake store: how many round trips a read by id costs.

The fake counts lookups and fold-index reads and records whether a fold read ran
while the lookup of the same round was in flight (the two are issued together).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from milvus.history import FoldEdges
from streams.respond.browse import MemoryReader


class FakeHistory:
    def __init__(self, folds: dict[tuple[str, str], str], lookup_started: threading.Event) -> None:
        self.folds = folds
        self.lookup_started = lookup_started
        self.asked: list[list[str]] = []
        self.overlapped: list[bool] = []

    def folded_into(self, tenant: str, ids: Sequence[str],
                    consistency_level: str | None = None) -> dict[str, str]:  # fmt: skip
        # True only when the lookup of the same round started before this read ended
        self.overlapped.append(self.lookup_started.wait(2.0))
        self.asked.append(list(ids))
        return {m: self.folds[(tenant, m)] for m in ids if (tenant, m) in self.folds}


class FakeStore:
    def __init__(self, rows: dict[tuple[str, str], dict[str, Any]],
                 folds: dict[tuple[str, str], str]) -> None:  # fmt: skip
        self.rows = rows
        self.started = threading.Event()
        self.history = FakeHistory(folds, self.started)
        self.lookups: list[list[str]] = []

    def lookup(self, ids: Sequence[str], *, tenant: str, output_fields: Any = None,
               consistency_level: Any = None) -> list[dict[str, Any]]:  # fmt: skip
        self.started.set()
        self.lookups.append(list(ids))
        return [dict(self.rows[(tenant, m)]) for m in ids if (tenant, m) in self.rows]


def _row(tenant: str, mid: str) -> dict[str, Any]:
    return {"id": mid, "tenant": tenant, "text": f"text of {mid}", "merged_count": 1,
            "metadata": {}}  # fmt: skip


def _reader() -> tuple[MemoryReader, FakeStore]:
    rows = {("acme", m): _row("acme", m) for m in ("m1", "m2")}
    folds = {("acme", "f1"): "m1", ("acme", "f2"): "f1", ("acme", "loop1"): "loop2",
             ("acme", "loop2"): "loop1"}  # fmt: skip
    store = FakeStore(rows, folds)
    return MemoryReader(store, "Bounded"), store


def test_stored_id_is_one_lookup() -> None:
    reader, store = _reader()
    got = reader.get("acme", ["m1"])
    assert got["m1"]["memory_id"] == "m1" and "folded_id" not in got["m1"]
    assert store.lookups == [["m1"]]


def test_missing_id_costs_one_round_with_the_fold_read_alongside() -> None:
    reader, store = _reader()
    assert reader.get("acme", ["nope"]) == {}
    assert store.lookups == [["nope"]] and store.history.asked == [["nope"]]
    assert store.history.overlapped == [True]  # issued together, not one after the other


def test_folded_chain_answers_the_survivor_and_a_second_read_uses_cached_edges() -> None:
    reader, store = _reader()
    got = reader.get("acme", ["f2", "m2"])
    assert got["f2"]["memory_id"] == "m1" and got["f2"]["folded_id"] == "f2"
    assert got["m2"]["memory_id"] == "m2"
    assert len(store.lookups) == 3  # f2 -> f1 -> m1: one round per hop the first time
    store.lookups.clear()
    store.history.asked.clear()
    again = reader.get("acme", ["f2"])
    assert again["f2"]["memory_id"] == "m1" and again["f2"]["folded_id"] == "f2"
    assert store.lookups == [["f2", "f1", "m1"]] and store.history.asked == []


def test_fold_edges_are_tenant_scoped_and_cycles_end() -> None:
    reader, store = _reader()
    assert reader.get("acme", ["f1"])["f1"]["memory_id"] == "m1"
    assert reader.get("other", ["f1"]) == {}  # neither the index nor the cache crosses tenants
    assert reader.get("acme", ["loop1"]) == {}  # a cycle of folds is not followed forever
    assert len(store.lookups) < 20


def test_an_edge_known_before_the_first_read_costs_one_lookup() -> None:
    rows = {("acme", "m1"): _row("acme", "m1")}
    store = FakeStore(rows, {("acme", "f1"): "m1"})
    edges = FoldEdges()
    edges.add("acme", {"f1": "m1"})  # what dedup or the history recorder put there
    reader = MemoryReader(store, "Bounded", edges)
    got = reader.get("acme", ["f1"])
    assert got["f1"]["memory_id"] == "m1" and got["f1"]["folded_id"] == "f1"
    assert store.lookups == [["f1", "m1"]] and store.history.asked == []
    assert reader.get("other", ["f1"]) == {}  # the edge is acme's only


def test_fold_edges_are_bounded_and_chains_end() -> None:
    edges = FoldEdges(size=3)
    edges.add("acme", {"a": "b", "b": "c"})
    edges.add("acme", {"x": "y", "c": "a"})  # the oldest edge (a -> b) goes
    assert len(edges) == 3
    assert edges.chains("acme", ["b"], 8) == {"b": "c", "c": "a"}  # a is no longer known
    edges.add("acme", {"a": "b"})  # now b -> c goes
    assert edges.chains("acme", ["c"], 8) == {"c": "a", "a": "b"}
    assert edges.chains("other", ["c"], 8) == {}
    loop = FoldEdges()
    loop.add("acme", {"p": "q", "q": "p"})
    assert loop.chains("acme", ["p"], 8) == {"p": "q", "q": "p"}  # a cycle ends
    edges.drop_tenant("acme")
    assert len(edges) == 0
