"""A memory row's ``metadata`` stays within Milvus' 64 KiB JSON value, whatever the
user's part holds within its limit and however many merges, credits and retrievals
the row has seen (`schemas.limits`); a job whose row the store refuses all the same
logs it and goes on, changing nothing it cannot write.

The rows go through the code that builds and rewrites them (the write path's row,
the credit applier, the access flush, the dedup job's merge, an edit's carry-over)
over an in-memory store whose writes pass the real store's row check.
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from milvus import MemoryStore
from operators.decay import MaintenancePolicy
from operators.dedup import MergeGroup
from schemas import LIMITS, Transition, UtilityUpdate, storage_key
from schemas.errors import StoreUnavailable
from streams.jobs.access import SEEN_PUBLISHERS, AccessRead
from streams.jobs.credit import UtilityApplier
from streams.jobs.dedup import DedupEngine
from streams.settings import Settings
from streams.write.pipeline import memory_row
from streams.write.replays import reconcile

PUB = "0123456789abcdef"  # a responder's id
T = "acme"
DIM = 8
NOW = 1_800_000_000_000
LONG_FLOAT = -2.2250738585072014e-308  # the longest spelling of a finite float (24 chars)
MILVUS_JSON_LIMIT = 65_536


def metadata_bytes(meta: dict[str, Any], partition: str = "buffer") -> int:
    """The row's ``metadata`` as the store sends it: with its partition stamp, compact
    UTF-8 JSON."""
    stamped = {**meta, "_partition": partition}
    return len(json.dumps(stamped, ensure_ascii=False, separators=(",", ":")).encode())


def user_bytes(meta: dict[str, Any], nxt: str | None) -> int:
    return len(json.dumps({"user": meta, "next": nxt}, ensure_ascii=False,
                          separators=(",", ":")).encode())  # fmt: skip


def user_at_limit() -> tuple[dict[str, Any], str]:
    """User metadata and next observation of 4- and 3-byte characters whose UTF-8 JSON
    takes exactly `LIMITS.max_row_json_bytes`."""
    meta: dict[str, Any] = {f"k{i:02d}": "\U0001f600" * LIMITS.max_metadata_value_chars
                            for i in range(19)}  # fmt: skip
    left = LIMITS.max_row_json_bytes - user_bytes(meta, "")
    nxt = "\u20ac" * (left // 3) + "a" * (left % 3)
    assert user_bytes(meta, nxt) == LIMITS.max_row_json_bytes
    return meta, nxt


def ident(n: int, chars: int) -> str:
    """A memory or update id of `chars` characters (ids are client-chosen, up to 128)."""
    return f"{n:06d}".rjust(chars, "x")


class FakeStore:
    """The store calls of the jobs, in memory; a write passes the real store's row check
    (`MemoryStore._row`: its JSON limit included) before anything is written."""

    def __init__(self) -> None:
        self.real = MemoryStore("row-budget-unused.db", dim=DIM)  # never connected
        self.rows: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.history = SimpleNamespace(record=lambda events: None, fold=lambda *a, **k: None)

    def put(self, row: dict[str, Any], partition: str = "buffer") -> None:
        self.rows[storage_key(row["tenant"], row["id"])] = {**row, "partition": partition}

    def get_keys(self, keys: list[str], **_: Any) -> list[dict[str, Any]]:
        return [copy.deepcopy(self.rows[k]) for k in keys if k in self.rows]

    def get(self, ids: list[str], *, tenant: str, **_: Any) -> list[dict[str, Any]]:
        return self.get_keys([storage_key(tenant, i) for i in ids])

    def survivors_of(self, tenant: str, ids: list[str]) -> dict[str, dict[str, Any]]:
        return {}

    def check_row(self, row: dict[str, Any]) -> str | None:
        return self.real.check_row(row)

    def upsert(self, rows: list[dict[str, Any]], partition: str) -> int:
        for r in rows:
            self.real._row(r)  # noqa: SLF001 - the real check, InvalidRecord as it raises
        for r in rows:
            self.put(copy.deepcopy({k: v for k, v in r.items() if k != "partition"}), partition)
        return len(rows)

    def delete(self, ids: list[str], *, tenant: str) -> int:
        self.deleted += ids
        for i in ids:
            self.rows.pop(storage_key(tenant, i), None)
        return len(ids)

    def move(self, ids: list[str], to: str, *, tenant: str) -> int:
        return 0


def stored_row(tid: str, meta: dict[str, Any] | None = None, nxt: str | None = None,
               step: int = 0) -> dict[str, Any]:  # fmt: skip
    """The write path's row of a transition (`memory_row`), with every part dmem adds."""
    t = Transition(transition_id=tid, tenant=T, agent_id="agent", episode_id="ep", step=step,
                   observation="the key is under the mat", action="look", reward=1.0,
                   next_observation=nxt, metadata=meta or {})  # fmt: skip
    vec = np.full(DIM, 1 / np.sqrt(DIM), dtype=np.float32)
    row = memory_row(t, T, vec, LONG_FLOAT, LONG_FLOAT, LONG_FLOAT, -1, NOW - 10_000 + step,
                     "buffer", "failure_terminal", LONG_FLOAT, LONG_FLOAT)  # fmt: skip
    row["metadata"]["surprise"] = {
        **{k: LONG_FLOAT for k in ("w", "intrinsic", "info", "novelty", "fit")},
        "disclosure": True,
    }
    row["metadata"]["updates"] = "u" * LIMITS.max_id_chars
    row["metadata"]["failure"] = {"outcome": LONG_FLOAT,
                                  "outcome_id": "o" * LIMITS.max_id_chars + ":final",
                                  "steps_from_end": 2**63 - 1}  # fmt: skip
    return row


def credit(uid: str, mid: str, x: float) -> UtilityUpdate:
    return UtilityUpdate(update_id=uid, memory_id=mid, tenant=T, credit=x, ts=NOW,
                         similarity=0.123456789012345)  # fmt: skip


@pytest.mark.parametrize("id_chars", [32, LIMITS.max_id_chars],
                         ids=["transition-hash-ids", "longest-client-ids"])  # fmt: skip
def test_a_worst_case_merge_survivor_fits_milvus_json_field(id_chars: int) -> None:
    """User metadata at exactly its byte limit (emoji), 1,200 merges in 24 windows, 64+
    credit updates with the longest ids, retrieval counts: every write of the survivor
    passes the store's check, and its metadata stays within 64 KiB."""
    store = FakeStore()
    meta, nxt = user_at_limit()
    sid = ident(0, id_chars)
    store.put(stored_row(sid, meta, nxt), "core")
    applier = UtilityApplier(Settings(), SimpleNamespace(store=store))
    engine = DedupEngine(store, MaintenancePolicy())
    folded: list[str] = []
    uid = 0
    for window in range(24):
        members = [ident(1 + 50 * window + j, id_chars) for j in range(50)]
        for j, mid in enumerate(members):
            store.put(stored_row(mid, step=1 + 50 * window + j))
        ups = [credit(ident(uid := uid + 1, LIMITS.max_id_chars), m, 0.1 * k - 0.05)
               for m in members for k in range(2)]  # fmt: skip
        ups += [credit(ident(uid := uid + 1, LIMITS.max_id_chars), sid, 0.3) for _ in range(5)]
        assert applier.apply(ups) == len(members) + 1  # every row written
        hits = {(T, m): [AccessRead(PUB, 1 + window, 10**15, NOW)] for m in [sid, *members]}
        assert applier.apply([], access=hits) == len(hits)
        rows = {r["id"]: r for r in store.get([sid, *members], tenant=T)}
        events = engine._apply_merge(MergeGroup(sid, tuple(members), (0.99,) * 50), rows, NOW)  # noqa: SLF001
        assert events is not None and len(events) == 50
        folded += members
    [row] = store.get([sid], tenant=T)
    assert row["merged_count"] == 1 + len(folded) == 1_201
    assert row["metadata"]["user"] == meta and row["metadata"]["next"] == nxt
    kept = row["metadata"]["merge"]["ids"]
    assert 0 < len(kept) < len(folded) and kept == folded[-len(kept) :]  # the newest
    assert 0 < len(row["metadata"]["credit_ids"]) <= LIMITS.max_credit_ids
    assert metadata_bytes(row["metadata"]) <= MILVUS_JSON_LIMIT
    assert store.real.check_row(row) is None


def test_an_edit_at_the_user_limit_keeps_a_merge_survivor_within_the_json_field() -> None:
    """A survivor written with little user metadata keeps many folded ids; an edit of it
    whose user metadata is at its limit still fits (the carried ids make room)."""
    store = FakeStore()
    old = stored_row("s", {"room": "hall"})
    old["merged_count"] = 1_001
    old["metadata"]["merge"] = {"ids": [f"{i:032x}" for i in range(1_000)]}
    old["metadata"]["credit_ids"] = [f"{i:024x}" for i in range(64)]  # the assigner's ids
    store.put(old, "core")
    assert store.real.check_row(old) is None  # it fits as stored
    meta, nxt = user_at_limit()
    new = stored_row("s", meta, nxt)
    new["text"] = "the key is in the drawer"
    out, skipped = reconcile(
        {"buffer": [new]}, {storage_key(T, "s"): store.rows[storage_key(T, "s")]}
    )
    [w] = out["core"]
    assert not skipped and w["metadata"]["user"] == meta and w["merged_count"] == 1_001
    kept = w["metadata"]["merge"]["ids"]
    assert 0 < len(kept) < 1_000 and kept == old["metadata"]["merge"]["ids"][-len(kept) :]
    assert metadata_bytes(w["metadata"], "core") <= MILVUS_JSON_LIMIT
    assert store.real.check_row(w) is None


def test_the_fixed_parts_fit_their_reserve_and_the_budget_adds_up() -> None:
    """Every part of a row's metadata other than the user's and the two id lists, each at
    its longest (floats of 24 characters, 64-bit integers, the longest ids), with every
    key and the partition stamp, fits `max_row_fixed_bytes`; with the user's part and
    the lists at their bounds the whole fits Milvus' limit."""
    from schemas.limits import json_bytes, merge_ids_budget, newest_within, user_part_bytes

    big = -(2**63)
    worst = stored_row("x" * LIMITS.max_id_chars)["metadata"]
    worst.update(
        done=False,
        merge={"ids": [], "first_seen_ts": big, "last_seen_ts": big,
               "reward_min": LONG_FLOAT, "reward_max": LONG_FLOAT},
        credit={"n": big, "w": LONG_FLOAT, "mean": LONG_FLOAT, "m2": LONG_FLOAT,
                "sim": LONG_FLOAT, "sim_w": LONG_FLOAT},
        credit_ids=[],
        access={"n": big, "seen": [["f" * 16, big]] * SEEN_PUBLISHERS},
        _partition="buffer",
    )  # fmt: skip
    worst["gate"]["reason"] = "r" * 32
    assert json_bytes(worst) <= LIMITS.max_row_fixed_bytes
    lim = LIMITS
    assert (lim.max_row_json_bytes + lim.max_row_fixed_bytes + lim.max_credit_ids_bytes
            + lim.min_merge_ids_bytes) == lim.max_json_field_bytes == MILVUS_JSON_LIMIT  # fmt: skip
    meta, nxt = user_at_limit()
    assert user_part_bytes(meta, nxt) == lim.max_row_json_bytes
    full = {**worst, "user": meta, "next": nxt}
    assert merge_ids_budget(full) == lim.min_merge_ids_bytes
    ids = newest_within([ident(i, 128) for i in range(2_000)], 1_000, lim.min_merge_ids_bytes)
    cids = newest_within([ident(i, 128) for i in range(100)], 64, lim.max_credit_ids_bytes)
    full["merge"] = {**worst["merge"], "ids": ids}
    full["credit_ids"] = cids
    assert json_bytes(full) <= MILVUS_JSON_LIMIT


def test_newest_within_keeps_the_newest_that_fit() -> None:
    from schemas.limits import json_bytes, newest_within

    ids = ["a" * 8, "b" * 8, "c" * 8, "d" * 8]  # 10 bytes each in JSON, 1 comma between
    assert newest_within(ids, 10, 2 + 10 * 3 + 2) == ids[1:]
    assert newest_within(ids, 2, 1_000) == ids[2:]
    assert newest_within(ids, 10, 11) == [] and newest_within([], 10, 100) == []
    assert newest_within(ids, 0, 1_000) == []
    assert json_bytes(newest_within(ids, 10, 33)) <= 33


def test_the_store_check_counts_the_partition_stamp() -> None:
    """The store refuses a metadata object that fits 64 KiB only without the partition
    stamp every write adds to it."""
    store = FakeStore()
    row = stored_row("s")
    room = MILVUS_JSON_LIMIT - metadata_bytes({**row["metadata"], "pad": ""})
    row["metadata"]["pad"] = "a" * room
    assert store.real.check_row(row) is None
    row["metadata"]["pad"] += "a"
    assert "JSON" in (store.real.check_row(row) or "")


@pytest.mark.parametrize("field", ["step", "created_ts", "uses"])
def test_the_store_check_refuses_an_int64_overflow(field: str) -> None:
    """The client raises at send for an integer beyond INT64, an error the store
    service retries: the check says so first, so a writer can set the row aside."""
    store = FakeStore()
    row = stored_row("s")
    row[field] = 2**63 - 1
    assert store.real.check_row(row) is None
    row[field] = 2**63
    assert "64-bit" in (store.real.check_row(row) or "")


def oversized(tid: str) -> dict[str, Any]:
    """A row the store holds whose user metadata fills Milvus' limit (more than
    validation lets through): nothing can be added to it."""
    row = stored_row(tid)
    room = MILVUS_JSON_LIMIT - metadata_bytes({**row["metadata"], "user": {"note": ""}})
    row["metadata"]["user"] = {"note": "a" * room}
    return row


def test_a_merge_the_store_refuses_is_logged_and_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FakeStore()
    store.put(oversized("s"))
    store.put(stored_row("m", step=1))
    before = copy.deepcopy(store.rows)
    engine = DedupEngine(store, MaintenancePolicy())
    rows = {r["id"]: r for r in store.get(["s", "m"], tenant=T)}
    out = engine._apply_merge(MergeGroup("s", ("m",), (0.99,)), rows, NOW)  # noqa: SLF001
    assert out is None and engine.counters == {"merge_refused": 1}
    assert store.deleted == [] and store.rows.keys() == before.keys()
    assert all(store.rows[k]["metadata"] == before[k]["metadata"] for k in before)
    assert "merge of ['m'] into s refused" in caplog.text


def test_a_merge_never_writes_back_a_row_gone_since_its_window_was_read() -> None:
    """Between the window's read and the merge another process forgot a member, or the
    survivor: the merge folds only what is still stored, and nothing comes back."""
    store = FakeStore()
    for tid, step in (("s", 0), ("m1", 1), ("m2", 2)):
        store.put(stored_row(tid, step=step))
    engine = DedupEngine(store, MaintenancePolicy())
    rows = {r["id"]: r for r in store.get(["s", "m1", "m2"], tenant=T)}
    store.delete(["m1"], tenant=T)  # forgotten meanwhile
    out = engine._apply_merge(MergeGroup("s", ("m1", "m2"), (0.99, 0.98)), rows, NOW)  # noqa: SLF001
    assert out is not None and [e.memory_id for e in out if e.kind == "merged"] == ["m2"]
    assert set(store.rows) == {storage_key(T, "s")}  # m1 not written back, m2 folded
    assert store.rows[storage_key(T, "s")]["merged_count"] == 2
    store.put(stored_row("m3", step=3))
    rows = {r["id"]: r for r in store.get(["s", "m3"], tenant=T)}
    store.delete(["s"], tenant=T)  # the survivor forgotten meanwhile
    assert engine._apply_merge(MergeGroup("s", ("m3",), (0.99,)), rows, NOW) is None  # noqa: SLF001
    assert set(store.rows) == {storage_key(T, "m3")}


def test_the_applier_writes_the_rows_the_store_takes_and_logs_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FakeStore()
    store.put(oversized("big"))
    store.put(stored_row("ok", step=1))
    applier = UtilityApplier(Settings(), SimpleNamespace(store=store))
    n = applier.apply([credit("u1", "big", 1.0), credit("u2", "ok", 1.0)])
    assert n == 1 and (applier.applied, applier.refused) == (1, 1)
    assert store.rows[storage_key(T, "ok")]["metadata"]["credit_ids"] == ["u2"]
    assert "credit_ids" not in store.rows[storage_key(T, "big")]["metadata"]
    assert "credit updates ['u1'] not applied" in caplog.text


def test_an_access_fold_writes_the_rows_the_store_takes_and_logs_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FakeStore()
    store.put(oversized("big"))
    store.put(stored_row("ok", step=1))
    applier = UtilityApplier(Settings(), SimpleNamespace(store=store))
    reads = {
        (T, "big"): [AccessRead(PUB, 4, 3, NOW)],
        (T, "ok"): [AccessRead(PUB, 9, 2, NOW)],
    }
    assert applier.apply([], access=reads) == 1 and applier.access_applied == 1
    assert store.rows[storage_key(T, "ok")]["metadata"]["access"] == {"n": 2, "seen": [[PUB, 9]]}
    assert "access" not in store.rows[storage_key(T, "big")]["metadata"]
    assert "not written: the store refuses" in caplog.text


def test_a_fold_the_store_broke_off_counts_what_it_wrote_once() -> None:
    """Rows of two partitions; the second partition's write fails and the applier
    retries the same reads. The first's counts are in their rows (with where they were
    read): the retry must not add them again, the second's must follow."""
    store = FakeStore()
    store.put(stored_row("c", step=0), "core")
    store.put(stored_row("b", step=1), "buffer")
    upsert = store.upsert
    calls: list[str] = []

    def second_fails(rows: list[dict[str, Any]], partition: str) -> int:
        calls.append(partition)
        if len(calls) == 2:
            raise StoreUnavailable("Milvus went away")
        return upsert(rows, partition)

    store.upsert = second_fails  # type: ignore[method-assign]
    applier = UtilityApplier(Settings(), SimpleNamespace(store=store))
    reads = {(T, "c"): [AccessRead(PUB, 3, 1, NOW)], (T, "b"): [AccessRead(PUB, 5, 1, NOW)]}
    with pytest.raises(StoreUnavailable):
        applier.apply([], access=reads)
    applier.apply([], access=reads)  # the retry
    # and the same records read again after a restart (committed offsets not reached)
    assert applier.apply([], access=reads) == 0
    written = {k: store.rows[storage_key(T, k)]["metadata"]["access"]["n"] for k in ("c", "b")}
    assert written == {"c": 1, "b": 1} and len(calls) == 3
