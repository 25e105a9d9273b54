"""`MemoryReader.get` over a fake store: how many round trips a read by id costs.

The fake counts lookups and fold-index reads and records whether a fold read was
issued beside the lookup (it runs on the reader's pool thread) or after it, on the
calling thread, because the lookup did not find the id.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from milvus.history import FoldEdges
from streams.respond.browse import MemoryReader, MissRate


class FakeHistory:
    def __init__(self, folds: dict[tuple[str, str], str], lookup_done: threading.Event) -> None:
        self.folds = folds
        self.lookup_done = lookup_done
        self.started = threading.Event()
        self.asked: list[list[str]] = []
        self.after_lookup: list[bool] = []

    def folded_into(self, tenant: str, ids: Sequence[str],
                    consistency_level: str | None = None) -> dict[str, str]:  # fmt: skip
        # beside the lookup = submitted to the reader's pool ("dmem-reads" threads)
        self.after_lookup.append(not threading.current_thread().name.startswith("dmem-reads"))
        self.started.set()
        self.asked.append(list(ids))
        return {m: self.folds[(tenant, m)] for m in ids if (tenant, m) in self.folds}


class FakeStore:
    def __init__(self, rows: dict[tuple[str, str], dict[str, Any]],
                 folds: dict[tuple[str, str], str]) -> None:  # fmt: skip
        self.rows = rows
        self.done = threading.Event()
        self.history = FakeHistory(folds, self.done)
        self.lookups: list[list[str]] = []
        #: a lookup waits (at most 2 s) for a fold read issued beside it to start
        self.wait_for_fold = False

    def lookup(self, ids: Sequence[str], *, tenant: str, output_fields: Any = None,
               consistency_level: Any = None) -> list[dict[str, Any]]:  # fmt: skip
        self.done.clear()
        self.history.started.clear()
        if self.wait_for_fold:
            self.history.started.wait(2.0)
        self.lookups.append(list(ids))
        self.done.set()
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


def test_stored_id_is_one_lookup_and_no_fold_read() -> None:
    reader, store = _reader()
    for _ in range(3):
        got = reader.get("acme", ["m1"])
        assert got["m1"]["memory_id"] == "m1" and "folded_id" not in got["m1"]
    assert store.lookups == [["m1"]] * 3
    assert store.history.asked == []  # nothing read beside or after a lookup that found it


def test_missing_id_reads_the_fold_index_after_the_lookup() -> None:
    reader, store = _reader()
    got = reader.get("acme", ["nope", "m2"])
    assert set(got) == {"m2"} and got["m2"]["memory_id"] == "m2"
    assert store.lookups == [["m2", "nope"]]  # one lookup of both
    assert store.history.asked == [["nope"]]  # only the id the lookup did not find
    assert store.history.after_lookup == [True]


def test_a_tenant_whose_reads_miss_gets_the_fold_read_beside_the_lookup() -> None:
    reader, store = _reader()
    for i in range(8):  # mostly misses: dropped or unknown ids
        assert reader.get("acme", [f"gone{i}"]) == {}
    assert all(store.history.after_lookup[:2]) and not reader.misses.likely("other")
    assert reader.misses.likely("acme")
    store.wait_for_fold = True
    store.history.after_lookup.clear()
    assert reader.get("acme", ["gone9"]) == {}
    assert store.history.after_lookup == [False]  # issued before the lookup ended
    got = reader.get("acme", ["f1"])  # a folded id still answers its survivor
    assert got["f1"]["memory_id"] == "m1" and got["f1"]["folded_id"] == "f1"
    store.wait_for_fold = False
    assert reader.get("other", ["m1"]) == {}  # another tenant: its own rate, its own rows
    assert store.history.after_lookup[-1] is True
    for _ in range(10):  # reads that find their ids bring the tenant back to one read
        reader.get("acme", ["m1", "m2"])
    assert not reader.misses.likely("acme")
    store.history.asked.clear()
    assert reader.get("acme", ["m2"])["m2"]["memory_id"] == "m2"
    assert store.history.asked == []


def test_a_tenant_missing_three_ids_in_five_keeps_the_lookup_first_order() -> None:
    # beside the lookup the fold read pays only when most ids read are not stored
    reader, store = _reader()
    for _ in range(20):
        for ids in (["m1"], ["m2"], ["gone1"], ["gone2"], ["gone3"]):
            reader.get("acme", ids)
            assert not reader.misses.likely("acme")
    assert all(store.history.after_lookup) and len(store.history.asked) == 60


def test_miss_rate_is_bounded_and_ignores_empty_reads() -> None:
    rate = MissRate(alpha=0.5, threshold=0.5, size=2)
    rate.observe("a", 0, 0)
    assert not rate.likely("a")
    rate.observe("a", 2, 2)
    rate.observe("a", 1, 1)
    assert rate.likely("a")  # 0.75
    rate.observe("a", 0, 4)
    assert not rate.likely("a")  # 0.375
    rate.observe("a", 4, 4)
    rate.observe("b", 1, 1)
    rate.observe("c", 1, 1)  # three tenants: the least recently read (a) is dropped
    assert not rate.likely("a")


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
