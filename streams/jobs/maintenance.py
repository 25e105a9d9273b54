"""Maintenance jobs (jobs role): dedup/merge, decay/forgetting, promotion/demotion,
capacities; access tracking (respond role); ``dmem forget`` and ``dmem inspect``.

The logic is in `operators.maintenance` (pure); this module is the thin part that
talks to Kafka and Milvus.

`MaintenanceJob` (one per deployment, like the credit job: it reads every
partition of ``dmem.memories`` through the consumer group
``<app_id>-maintenance``, because capacities are per tenant):

- Priority index: on start, one scan of the collection's scalar fields builds an
  in-memory columnar index per tenant (`operators.maintenance.PriorityIndex`,
  about 60 bytes of arrays + one dict slot per memory). From then on the
  ``memories`` topic keeps it current: ``written`` adds, ``merged``/``evicted``/
  ``forgotten`` remove, ``moved``/``promoted``/``demoted`` change the partition.
  Values written by other processes (utility from the credit applier, access
  counts from the responders) reach it through a round-robin refresh of
  ``refresh_per_pass`` rows per pass, and every row is re-read just before an
  action is taken on it.
- Dedup: tumbling processing-time windows (``dedup_window_s``) of ``written``
  events, per tenant. At window close the window's rows are read (with
  vectors), grouped by merge scope (`operators.maintenance.merge_scope`: agent,
  action, valence, partition, terminal flag, reward sign, user metadata), and each scope's
  rows are searched against Milvus (one batched ANN query per scope, in the
  scope's partition and reward sign, top ``dedup_k`` excluding the window's
  own ids); rows within cosine ``tau`` whose rewards agree are merged
  oldest-first (`plan_merges`, `merge_rows`): the survivor is rewritten, the
  others deleted, one ``merged`` event each. Offsets are
  committed only after a window's merges were acknowledged by Milvus; a replay
  folds nothing twice (merged ids are remembered in the survivor).
- Decay: every ``decay_interval_s``, per tenant: refresh a slice, plan
  (`plan_decay`, O(n) numpy over the index), re-read the chosen rows, act
  (move / delete, at most ``max_actions_per_pass``), one event per action.
  Ages are stream time: the index keeps the watermark of every clock (per
  tenant and agent, or per tenant), advanced by the bootstrap scan and by the
  ``event_ts`` of every ``written``/``dropped`` event (`operators.maintenance`);
  the wall clock only decides when a pass runs and stamps the events.

Cost of a decay pass for a tenant with n memories: O(n) vectorised arithmetic
in memory (about a millisecond per 100k), plus Milvus I/O bounded by
``refresh_per_pass + 2 * max_actions_per_pass`` rows, independent of n. The
full scan happens once per process start (bootstrap), not per tick.

Tenants (issue 21): memory ids are unique per tenant only, so every store call
here names the tenant (`MemoryStore.get`/`move`/`delete` take ``tenant=``; the
access flush reads by storage key): a merge, a decay action, an access count or
a forget of one tenant never reaches another tenant's row with the same id.

Concurrency: Milvus has no partial updates, so a merge, a move or an access
flush is a read-modify-write of the row. Writers in this module share one
process-wide lock; the credit applier (`streams.jobs.credit`) does not take it, so a
credit applied in the few milliseconds between a merge's read and write of the
same survivor can be lost (documented limitation).

Access tracking: the responder calls `streams.respond.responder.ACCESS_HOOK` with the
served ids; `AccessTracker` accumulates counts in memory and `AccessFlusher`
writes them every ``access_flush_s`` in one batch (``last_access_ts`` and
``metadata.access.n``, the retrieval count). ``uses`` stays the credited-use
count owned by the credit applier (utility is an EMA of credit per *credited*
use; counting retrievals there would dilute it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from mode import Service
from pydantic import ValidationError

from milvus import MemoryStore
from milvus import expr as E
from milvus.schema import VECTOR_FIELD, search_params
from operators.decay import (
    CORE,
    PART_NAME,
    Entry,
    MaintenancePolicy,
    PriorityIndex,
    TenantIndex,
    entry_from_row,
    plan_decay,
    tenant_priorities,
)
from operators.dedup import (
    DEDUP_TAU_BY_ENCODER,
    MergeGroup,
    merge_rows,
    merge_scope,
    plan_merges,
    reward_span,
)
from schemas import MemoryEvent, encode, storage_key
from streams.admin import commit_or_replay, group_consumer, kafka_client_kwargs
from streams.clock import now_ms
from streams.settings import Settings
from streams.settle import backlog, settle_states, touch_hook

log = logging.getLogger("dmem.maintenance")

#: one writer at a time for the read-modify-writes of this module, per process
WRITE_LOCK = threading.Lock()
SCAN_FIELDS = [
    "id", "tenant", "agent_id", "created_ts", "last_access_ts", "rpe", "rpe_smoothed",
    "utility", "metadata",
]
REMOVED = ("merged", "evicted", "forgotten")
SETTLE_PASS_S = 1.0  # while settling, decay passes at most this often (not every 200 ms)
Scope = tuple[str, str, int, str, bool, int, str]  # `operators.maintenance.merge_scope`
PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def context_filter(context: str) -> dict[str, Any]:
    """Filter terms for a scope's user metadata (``metadata.user.<key> == value``) for
    the keys the store can filter on exactly: plain-identifier keys with string, int or
    bool values (no float equality on JSON). The rest of the context is checked on
    the rows (`merge_scope`), so a filter term only narrows the ANN search."""
    ctx = json.loads(context) if context else {}
    return {f"metadata.user.{k}": v for k, v in ctx.items()
            if PLAIN_KEY.match(k) and isinstance(v, str | int | bool)
            and not (isinstance(v, str) and "\x00" in v)}  # fmt: skip
MOVED = ("moved", "promoted", "demoted")


def policy_from(settings: Settings) -> MaintenancePolicy:
    m = settings.maintenance
    return MaintenancePolicy(
        tau=dedup_tau(settings),
        reward_tol=m.dedup_reward_tol,
        half_life_ms=m.half_life_s * 1000.0,
        utility_weight=m.utility_weight,
        access_weight=m.access_weight,
        access_half_life_ms=m.access_half_life_s * 1000.0,
        buffer_floor=m.buffer_floor,
        buffer_ttl_ms=int(m.buffer_ttl_s * 1000),
        demote_below=m.demote_below,
        promote_above=m.promote_above,
        core_capacity=m.core_capacity,
        buffer_capacity=m.buffer_capacity,
        max_actions=m.max_actions_per_pass,
        clock=m.stream_clock,
    )


def dedup_tau(settings: Settings) -> float:
    """``DMEM_MAINTENANCE__DEDUP_TAU``, or the encoder's default (`DEDUP_TAU_BY_ENCODER`)."""
    tau = settings.maintenance.dedup_tau
    return tau if tau is not None else DEDUP_TAU_BY_ENCODER.get(settings.encoder.name, 0.95)


def _unique(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        out.setdefault(str(r["id"]), r)
    return out


def _event(kind: str, row: dict[str, Any], partition: str | None, reason: str,
           now: int) -> MemoryEvent:  # fmt: skip
    return MemoryEvent.model_validate(
        {
            "kind": kind,
            "memory_id": str(row["id"]),
            "tenant": str(row["tenant"]),
            "agent_id": row.get("agent_id") or None,
            "episode_id": row.get("episode_id") or None,
            "step": row.get("step"),
            "partition": partition,
            "reward": row.get("reward"),
            "rpe": row.get("rpe"),
            "valence": row.get("valence"),
            "reason": reason,
            "ts": now,
        }
    )


def get_bounded(store: MemoryStore, tenant: str, ids: Sequence[str],
                fields: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    """``tenant``'s rows by id with Bounded consistency (no wait for the next time
    tick), then a Strong read of the ids that were not found (they may be just written).

    Used for the index refresh and the re-read before acting: a value updated
    in the last moment may be missed and is seen by a later pass.
    """
    out = store.get(ids, tenant=tenant, output_fields=fields, consistency_level="Bounded")
    missing = set(ids) - {str(r["id"]) for r in out}
    if missing:
        out += store.get(sorted(missing), tenant=tenant, output_fields=fields)
    return out


class MaintenanceEngine:
    """Sync core of the maintenance job (runs in a worker thread)."""

    def __init__(
        self,
        store: MemoryStore,
        policy: MaintenancePolicy,
        *,
        dedup_k: int = 8,
        refresh_per_pass: int = 2000,
    ) -> None:
        self.store = store
        self.policy = policy
        self.dedup_k = dedup_k
        self.refresh_per_pass = refresh_per_pass
        self.index = PriorityIndex(per_agent_clock=policy.clock == "agent")
        self.counters: dict[str, int] = {}
        self.touched: dict[str, set[str]] = {}  # tenant -> ids to re-read next pass
        self.last_deferred = 0  # actions the last pass left for the next one
        self.pass_samples: deque[tuple[float, int]] = deque(maxlen=512)  # (ms, memories)

    def _count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    # -- index ---------------------------------------------------------------------
    def bootstrap(self, tenant: str | None = None) -> int:
        """One scan of the scalar fields into the index (on start only)."""
        n = 0
        for row in self.store.scan(tenant=tenant, output_fields=SCAN_FIELDS, batch_size=4096):
            self.index.upsert(str(row["tenant"]), str(row["id"]), entry_from_row(row))
            n += 1
        return n

    def observe(self, ev: MemoryEvent) -> bool:
        """Keep the index and the stream clocks current from one ``memories`` event;
        True when something a decay plan depends on changed.

        The clocks (watermarks) advance with the event time of every ``written``
        and ``dropped`` event: a dropped transition is stream time seen too.
        """
        changed = False
        if ev.kind in ("written", "dropped") and ev.event_ts is not None:
            changed = self.index.tenant(ev.tenant).advance(ev.agent_id, ev.event_ts)
        if ev.kind == "written" and ev.partition is not None and ev.event_ts is not None:
            t = self.index.tenant(ev.tenant)
            if ev.memory_id not in t:  # approximate until the dedup window reads the row
                ts = ev.event_ts  # (an event without one waits for the row: its ``ts`` is
                # processing time, which must never reach a clock)
                t.upsert(ev.memory_id, Entry(0 if ev.partition == "core" else 1, ts, ts,
                                             max(abs(ev.rpe or 0.0), ev.rpe_smoothed or 0.0),
                                             0.0, 0, ts, ev.agent_id or ""))  # fmt: skip
                changed = True
        elif ev.kind in REMOVED:
            changed = self.index.remove(ev.tenant, ev.memory_id) or changed
        elif ev.kind in MOVED and ev.partition is not None:
            changed = self.index.set_partition(ev.tenant, ev.memory_id, ev.partition) or changed
        return changed

    def touch(self, keys: Iterable[tuple[str, str]]) -> None:
        """(tenant, id)s whose row another writer of this process changed (utility,
        access counts): re-read by the next pass instead of waiting for the round robin."""
        for tenant, mid in keys:
            self.touched.setdefault(tenant, set()).add(mid)

    def refresh(self, tenant: str, ids: Sequence[str]) -> set[str]:
        """Re-read `ids` into the index; ids gone from Milvus leave it. Returns those found."""
        if not ids:
            return set()
        rows = _unique(get_bounded(self.store, tenant, list(ids), SCAN_FIELDS))
        t = self.index.tenant(tenant)
        found = set()
        for mid in ids:
            row = rows.get(mid)
            if row is None or row.get("tenant") != tenant:
                t.remove(mid)
            else:
                t.upsert(mid, entry_from_row(row))
                found.add(mid)
        return found

    # -- dedup -----------------------------------------------------------------------
    def _neighbors(self, tenant: str, scope: Scope, vectors: np.ndarray,
                   exclude: list[str]) -> set[str]:  # fmt: skip
        """Ids of stored rows in `scope`'s partition and reward sign within tau of any
        of `vectors` (batched ANN; the rest of the scope is checked on the rows)."""
        agent, action, valence, part, _done, sign, context = scope
        reward = {"==": 0.0} if sign == 0 else ({">": 0.0} if sign > 0 else {"<": 0.0})
        flt = E.build_filter(tenant=tenant, agent_id=agent, extra_filter={
            "action": action, "valence": valence, "reward": reward,
            **context_filter(context)})  # fmt: skip
        if exclude:
            flt = E.and_all([flt, f"not ({self.store.key_filter(tenant, exclude)})"])
        client = self.store.client
        params = search_params(self.store.is_lite, self.dedup_k)
        found: set[str] = set()
        for i in range(0, len(vectors), 256):
            chunk = [v.tolist() for v in vectors[i : i + 256]]
            with self.store._errors("dedup search"):  # noqa: SLF001 - same error mapping
                res = client.search(
                    self.store.collection,
                    data=chunk,
                    filter=flt,
                    limit=self.dedup_k,
                    output_fields=["id"],
                    search_params=params,
                    partition_names=[part],
                    anns_field=VECTOR_FIELD,
                    timeout=self.store.timeout_s,
                    consistency_level="Strong",
                )
            for hits in res or []:
                for h in hits:
                    if float(h["distance"]) >= self.policy.tau - 1e-6:
                        # the hit's own "id" is the storage key: the memory id is a field
                        found.add(str((h.get("entity") or {})["id"]))
        return found

    def dedup(self, tenant: str, ids: Sequence[str], now: int) -> list[MemoryEvent]:
        """Merge one tenant's window of new memories into existing ones (and each other)."""
        rows = {k: r for k, r in _unique(self.store.get(list(ids), tenant=tenant,
                                                        with_vector=True)).items()
                if r.get("tenant") == tenant}  # fmt: skip
        scopes: dict[Scope, list[str]] = {}
        for mid, r in rows.items():
            scopes.setdefault(merge_scope(r), []).append(mid)
        t = self.index.tenant(tenant)
        events: list[MemoryEvent] = []
        for scope, sids in scopes.items():
            vecs = np.stack([np.asarray(rows[m][VECTOR_FIELD], dtype=np.float32) for m in sids])
            near = self._neighbors(tenant, scope, vecs, sids) - set(sids)
            group_rows = {m: rows[m] for m in sids}
            if near:
                for mid, r in _unique(self.store.get(sorted(near), tenant=tenant,
                                                     with_vector=True)).items():
                    if r.get("tenant") == tenant and merge_scope(r) == scope:
                        group_rows[mid] = r
            order = sorted(group_rows)
            groups = plan_merges(
                order,
                [int(group_rows[m]["created_ts"]) for m in order],
                np.stack([np.asarray(group_rows[m][VECTOR_FIELD], dtype=np.float32)
                          for m in order]),  # fmt: skip
                self.policy.tau,
                [reward_span(group_rows[m]) for m in order],
                self.policy.reward_tol,
            )
            merged: set[str] = set()
            for g in groups:
                events += self._apply_merge(g, group_rows, now)
                merged.update(g.members)
            for mid, r in group_rows.items():
                if mid not in merged and mid in rows:
                    t.upsert(mid, entry_from_row(r))
        for mid in ids:
            if mid not in rows:
                t.remove(mid)
        return events

    def _apply_merge(self, g: MergeGroup, rows: dict[str, dict[str, Any]],
                     now: int) -> list[MemoryEvent]:  # fmt: skip
        s = rows[g.survivor]
        members = [rows[m] for m in g.members]
        new, folded = merge_rows(s, members)
        target = str(new.pop("partition"))
        with WRITE_LOCK:
            if folded or target != s["partition"]:
                clean = {k: v for k, v in new.items() if k not in ("distance", "similarity")}
                self.store.upsert([clean], target)  # type: ignore[arg-type]
            self.store.delete(list(g.members), tenant=str(s["tenant"]))
        t = self.index.tenant(str(s["tenant"]))
        events = []
        for m, sim in zip(members, g.similarity, strict=True):
            t.remove(str(m["id"]))
            events.append(
                _event("merged", m, m["partition"], f"into {g.survivor} cos={sim:.4f}", now)
            )
        t.upsert(g.survivor, entry_from_row({**new, "partition": target}))
        self._count("merged", len(members))
        if target != s["partition"]:
            events.append(_event("promoted", s, target, "merge: a core duplicate joined", now))
            self._count("promoted")
        return events

    # -- decay -----------------------------------------------------------------------
    def decay(self, tenant: str, now: int, refresh: bool = True) -> list[MemoryEvent]:
        """One decay pass for one tenant; bounded Milvus I/O (see module doc).

        Ages are the tenant's stream time (the index's watermarks); `now` only
        stamps the events (processing time). ``refresh=False`` (a settling pass)
        skips the round-robin re-read: it plans on the index the events keep
        current, so a pass with nothing to do costs no Milvus I/O.
        """
        t0 = time.perf_counter()
        t = self.index.tenant(tenant)
        touched = sorted(self.touched.pop(tenant, set()))
        self.refresh(tenant, touched + t.next_refresh(self.refresh_per_pass if refresh else 0))
        plan = plan_decay(t, self.policy)
        events: list[MemoryEvent] = []
        if plan.actions:
            chosen = [a.memory_id for a in plan.actions]
            rows = _unique(get_bounded(self.store, tenant, chosen, [
                "id", "tenant", "agent_id", "episode_id", "step", "reward", "rpe", "valence",
                "created_ts", "last_access_ts", "utility", "metadata"]))  # fmt: skip
            fresh = set()
            for mid in chosen:
                r = rows.get(mid)
                if r is None or r.get("tenant") != tenant:
                    t.remove(mid)
                else:
                    t.upsert(mid, entry_from_row(r))
                    fresh.add(mid)
            plan = plan_decay(t, self.policy)  # with the fresh values
            actions = [a for a in plan.actions if a.memory_id in fresh]
            events = self._execute(tenant, t, actions, rows, now)
        self.last_deferred = plan.deferred
        ms = (time.perf_counter() - t0) * 1e3
        self.pass_samples.append((ms, len(t)))
        self._count("decay_passes")
        return events

    def _execute(self, tenant: str, t: TenantIndex, actions: list[Any],
                 rows: dict[str, dict[str, Any]], now: int) -> list[MemoryEvent]:  # fmt: skip
        demote = [a for a in actions if a.kind == "demoted"]
        promote = [a for a in actions if a.kind == "promoted"]
        evict = [a for a in actions if a.kind == "evicted"]
        with WRITE_LOCK:
            if demote:
                self.store.move([a.memory_id for a in demote], "buffer", tenant=tenant)
            if promote:
                self.store.move([a.memory_id for a in promote], "core", tenant=tenant)
            if evict:
                self.store.delete([a.memory_id for a in evict], tenant=tenant)
        events = []
        for a in demote + promote + evict:
            row = rows[a.memory_id]
            if a.kind == "evicted":
                t.remove(a.memory_id)
                part = a.partition
            else:
                part = "buffer" if a.kind == "demoted" else "core"
                t.set_partition(a.memory_id, 1 if part == "buffer" else CORE)
            events.append(_event(a.kind, row, part, f"{a.reason} p={a.priority:.4f}", now))
            self._count(a.kind)
            self._count(f"{a.kind}:{a.reason}")
        return events

    def status(self) -> dict[str, Any]:
        ms = [s[0] for s in self.pass_samples]
        return {
            "indexed": len(self.index),
            "tenants": len(self.index.tenants),
            **self.counters,
            "decay_pass_ms_p50": float(np.percentile(ms, 50)) if ms else None,
            "decay_pass_ms_p99": float(np.percentile(ms, 99)) if ms else None,
            "decay_samples": [list(s) for s in list(self.pass_samples)[-64:]],
        }


class MaintenanceJob(Service):
    """Consumes ``dmem.memories``; runs dedup windows and decay passes (see module doc)."""

    def __init__(self, settings: Settings, store: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.store_service = store
        self.engine: MaintenanceEngine | None = None
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self.windows: dict[str, dict[str, None]] = {}
        self.window_started: float | None = None
        self.emitted = 0
        self.bad = 0
        self.ready = False
        # settling (see `settle_state`): something a decay plan depends on changed
        # since the last pass that found nothing to do; a window or a pass in progress
        self.dirty = True
        self.busy = False
        self.deferred = 0
        self.last_pass = 0.0

    async def on_start(self) -> None:
        k = self.settings.kafka
        kw = kafka_client_kwargs(k)
        self.producer = AIOKafkaProducer(linger_ms=5, **kw)
        await self.producer.start()
        self.consumer = group_consumer(self.settings, self.settings.topic("memories"),
                                       "maintenance")
        await self.consumer.start()
        self.add_future(self._run())

    async def on_stop(self) -> None:
        for client in (self.consumer, self.producer):
            if client is not None:
                await client.stop()

    @property
    def pending(self) -> int:
        return sum(len(w) for w in self.windows.values())

    async def _run(self) -> None:
        assert self.consumer is not None
        m = self.settings.maintenance
        await self.store_service.maybe_start()
        await self.store_service.connected.wait()
        engine = MaintenanceEngine(self.store_service.store, policy_from(self.settings),
                                   dedup_k=m.dedup_k, refresh_per_pass=m.refresh_per_pass)
        n = await self.store_service._retry("maintenance bootstrap", engine.bootstrap)  # noqa: SLF001
        self.engine = engine
        self.ready = True
        log.info("maintenance ready: %d memories indexed", n)
        next_decay = time.monotonic() + m.decay_interval_s
        while not self.should_stop:
            batch = await self.consumer.getmany(timeout_ms=200, max_records=5000)
            for msgs in batch.values():
                for msg in msgs:
                    self._observe(msg)
            if self.windows and self.window_started is not None and (
                time.monotonic() - self.window_started >= m.dedup_window_s
                or self.pending >= m.dedup_max_window
            ):
                await self._close_windows()
            elif batch and not self.windows:
                await commit_or_replay(self.consumer, "maintenance")
            # the timer, or (settling) input is quiet and a pass has something to look at:
            # passes follow each other until one finds nothing to do, then the job waits
            idle = not batch and not self.windows and self.dirty
            if time.monotonic() >= next_decay:
                await self._decay()
                next_decay = time.monotonic() + m.decay_interval_s
            elif idle and time.monotonic() - self.last_pass >= SETTLE_PASS_S:
                await self._decay(refresh=False)

    def _observe(self, msg: Any) -> None:
        assert self.engine is not None
        try:
            ev = MemoryEvent.model_validate(orjson.loads(msg.value))
        except (ValidationError, orjson.JSONDecodeError) as exc:
            self.bad += 1
            log.warning("skipping bad memory event at %s/%s: %s", msg.partition, msg.offset, exc)
            return
        if self.engine.observe(ev):
            self.dirty = True
        if ev.kind == "written" and ev.partition is not None:
            if not self.windows:
                self.window_started = time.monotonic()
            self.windows.setdefault(ev.tenant, {})[ev.memory_id] = None
        elif ev.kind in REMOVED:
            self.windows.get(ev.tenant, {}).pop(ev.memory_id, None)

    async def _emit(self, events: list[MemoryEvent]) -> None:
        assert self.producer is not None
        topic = self.settings.topic("memories")
        for ev in events:
            await self.producer.send(topic, encode(ev), key=ev.memory_id.encode())
        self.emitted += len(events)

    async def _close_windows(self) -> None:
        assert self.engine is not None and self.consumer is not None
        windows, self.windows, self.window_started = self.windows, {}, None
        self.busy = True
        try:
            for tenant, ids in windows.items():
                if ids:
                    events = await self.store_service._retry(  # noqa: SLF001
                        "dedup", self.engine.dedup, tenant, list(ids), now_ms()
                    )
                    self.dirty = True  # the window's rows are read: the index is exact now
                    await self._emit(events)
            assert self.producer is not None
            await self.producer.flush()
            await commit_or_replay(self.consumer, "maintenance")
        finally:
            self.busy = False

    async def _decay(self, refresh: bool = True) -> None:
        assert self.engine is not None
        self.busy = True
        acted = deferred = 0
        try:
            for tenant in sorted(self.engine.index.tenants):
                events = await self.store_service._retry(  # noqa: SLF001
                    "decay", self.engine.decay, tenant, now_ms(), refresh
                )
                acted += len(events)
                deferred += self.engine.last_deferred
                await self._emit(events)
            if self.producer is not None:
                await self.producer.flush()
        finally:
            self.busy = False
        self.last_pass = time.monotonic()
        self.deferred = deferred
        # a pass that acted changed the index: the next one looks again (settling)
        self.dirty = bool(acted or deferred or self.engine.touched)

    def touch(self, keys: Iterable[tuple[str, str]]) -> None:
        """Rows another writer in this process changed (credit, access counts)."""
        if self.engine is not None:
            self.engine.touch(keys)
            self.dirty = True

    async def settle_state(self) -> dict[str, Any]:
        """Pending work, and whether there is none: no unread ``memories`` events, no
        open dedup window, no window or pass running, and a decay pass since the last
        change that found nothing to do (so, with no new input, nothing will change)."""
        unread = await backlog(self.consumer) if self.ready else None
        pending = {"unread_events": unread, "open_window": self.pending,
                   "running": self.busy, "decay_pass_due": self.dirty,
                   "deferred_actions": self.deferred}  # fmt: skip
        settled = (self.ready and unread == 0 and not self.pending and not self.busy
                   and not self.dirty and not self.deferred)  # fmt: skip
        return {"settled": settled, "pending": pending}

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ready": self.ready, "pending": self.pending,
                               "emitted": self.emitted, "bad_events": self.bad}  # fmt: skip
        if self.engine is not None:
            out.update(self.engine.status())
        return out


# -- access tracking -----------------------------------------------------------------------


class AccessTracker:
    """Thread-safe accumulator of retrievals: (tenant, id) -> (hits, last ts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hits: dict[tuple[str, str], tuple[int, int]] = {}
        self.recorded = 0

    def record(self, tenant: str, ids: Sequence[str], now: int) -> None:
        with self._lock:
            for mid in ids:
                n, _ = self._hits.get((tenant, mid), (0, 0))
                self._hits[(tenant, mid)] = (n + 1, now)
            self.recorded += len(ids)

    def pending(self) -> int:
        with self._lock:
            return len(self._hits)

    def drain(self) -> dict[tuple[str, str], tuple[int, int]]:
        with self._lock:
            out, self._hits = self._hits, {}
        return out

    def restore(self, pending: dict[tuple[str, str], tuple[int, int]]) -> None:
        """Put back counts whose write failed (merged with any new ones)."""
        with self._lock:
            for key, (n, ts) in pending.items():
                n2, ts2 = self._hits.get(key, (0, 0))
                self._hits[key] = (n + n2, max(ts, ts2))


def flush_access(store: MemoryStore, hits: dict[tuple[str, str], tuple[int, int]]) -> int:
    """One batched read-modify-write: last_access_ts and metadata.access.n. Returns rows."""
    if not hits:
        return 0
    with WRITE_LOCK:
        # by storage key: a count only ever reaches the row of the tenant it was served to
        rows: dict[tuple[str, str], dict[str, Any]] = {}
        for r in store.get_keys(sorted(storage_key(t, m) for t, m in hits), with_vector=True):
            rows.setdefault((str(r["tenant"]), str(r["id"])), r)
        by_part: dict[str, list[dict[str, Any]]] = {}
        for tid, row in rows.items():
            n, ts = hits[tid]
            meta = dict(row.get("metadata") or {})
            acc = dict(meta.get("access") or {})
            acc["n"] = int(acc.get("n", 0)) + n
            meta["access"] = acc
            row["metadata"] = meta
            row["last_access_ts"] = max(int(row.get("last_access_ts", 0)), ts)
            part = row.pop("partition")
            by_part.setdefault(part, []).append(row)
        for part, prow in by_part.items():
            store.upsert(prow, part)  # type: ignore[arg-type]
    return sum(len(v) for v in by_part.values())


class AccessFlusher(Service):
    """Writes the tracker's counts every ``access_flush_s`` (and on stop)."""

    def __init__(self, settings: Settings, store: Any, tracker: AccessTracker,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.settings = settings
        self.store_service = store
        self.tracker = tracker
        self.flushed = 0
        self.on_flushed: Any = None  # called with the (tenant, id)s written

    async def on_start(self) -> None:
        self.add_future(self._run())

    async def on_stop(self) -> None:
        await self.flush()

    async def flush(self) -> None:
        hits = self.tracker.drain()
        if not hits or not self.store_service.connected.is_set():
            self.tracker.restore(hits)
            return
        try:
            self.flushed += await asyncio.to_thread(flush_access, self.store_service.store, hits)
        except Exception as exc:  # noqa: BLE001 - keep the counts, try again next time
            log.warning("access flush failed (%s); will retry", exc)
            self.tracker.restore(hits)
            return
        if self.on_flushed is not None:
            self.on_flushed(list(hits))

    async def _run(self) -> None:
        while not self.should_stop:
            await self.sleep(self.settings.maintenance.access_flush_s)
            await self.flush()


# -- wiring ----------------------------------------------------------------------------------


async def _disabled() -> dict[str, Any]:
    return {"settled": True, "pending": {"disabled": True}}


def wire_maintenance(app: Any, settings: Settings, store: Any) -> Any:
    job = MaintenanceJob(settings, store, loop=app.loop, beacon=app.beacon)
    if settings.maintenance.enabled:
        app.add_dependency(job)
        app.dmem_touch = job.touch  # writers of this process report the rows they changed
    settle_states(app)["maintenance"] = job.settle_state if settings.maintenance.enabled \
        else _disabled
    return job.status


def wire_access(app: Any, settings: Settings, store: Any) -> Any:
    import streams.respond.responder as respond

    tracker = AccessTracker()
    respond.ACCESS_HOOK = tracker.record
    flusher = AccessFlusher(settings, store, tracker, loop=app.loop, beacon=app.beacon)
    flusher.on_flushed = touch_hook(app)
    app.add_dependency(flusher)

    async def settle_state() -> dict[str, Any]:
        n = tracker.pending()
        return {"settled": n == 0, "pending": {"unflushed_accesses": n}}

    settle_states(app)["access"] = settle_state
    return lambda: {"recorded": tracker.recorded, "flushed": flusher.flushed}


# -- forget and inspect -------------------------------------------------------------------

FORGET_FIELDS = ["id", "tenant", "agent_id", "episode_id", "step", "reward", "rpe", "valence"]


def forget_scope(
    store: MemoryStore, tenant: str, agent_id: str | None = None, memory_id: str | None = None,
    now: int | None = None, rounds: int = 5,
) -> list[MemoryEvent]:  # fmt: skip
    """Delete every memory of the scope; returns one ``forgotten`` event per deleted row.

    Repeats (up to `rounds`) until the scope is empty, so rows written while it
    ran are caught too.
    """
    now = now or now_ms()
    events: list[MemoryEvent] = []
    scope = f"tenant={tenant}" + (f" agent={agent_id}" if agent_id else "") + (
        f" memory={memory_id}" if memory_id else "")  # fmt: skip
    for _ in range(rounds):
        if memory_id is not None:
            rows = [r for r in store.get([memory_id], tenant=tenant, output_fields=FORGET_FIELDS)
                    if r.get("tenant") == tenant
                    and (agent_id is None or r.get("agent_id") == agent_id)]  # fmt: skip
        else:
            extra = {"agent_id": agent_id} if agent_id else None
            rows = list(store.scan(tenant=tenant, extra_filter=extra, output_fields=FORGET_FIELDS))
        found = _unique(rows)
        if not found:
            break
        # tombstoned under the store's exclusive guard: no write in flight (this
        # module's read-modify-writes included) can bring them back
        store.forget(sorted(found), tenant=tenant, at=now / 1000.0)
        events += [_event("forgotten", r, r.get("partition"), f"forget {scope}", now)
                   for r in found.values()]  # fmt: skip
    return events


async def emit_events(settings: Settings, events: Sequence[MemoryEvent]) -> None:
    producer = AIOKafkaProducer(linger_ms=5, **kafka_client_kwargs(settings.kafka))
    await producer.start()
    try:
        topic, control = settings.topic("memories"), settings.topic("control")
        for ev in events:
            await producer.send(topic, encode(ev), key=ev.memory_id.encode())
            if ev.kind == "forgotten":  # write workers clear their state from `control`
                await producer.send(control, encode(ev), key=ev.tenant.encode())
        await producer.flush()
    finally:
        await producer.stop()


async def recent_events(
    settings: Settings, tenant: str, kinds: Sequence[str] = ("merged", "evicted", "demoted",
    "promoted", "forgotten"), per_partition: int = 5000, limit: int = 20,
) -> list[dict[str, Any]]:  # fmt: skip
    """The latest maintenance events of `tenant` from the tail of ``dmem.memories``."""
    c = AIOKafkaConsumer(enable_auto_commit=False, **kafka_client_kwargs(settings.kafka))
    await c.start()
    out: list[dict[str, Any]] = []
    try:
        name = settings.topic("memories")
        parts = c.partitions_for_topic(name)
        if not parts:
            await c._client.force_metadata_update()  # noqa: SLF001
            parts = c.partitions_for_topic(name) or set()
        tps = [TopicPartition(name, p) for p in sorted(parts)]
        if not tps:
            return []
        c.assign(tps)
        ends = await c.end_offsets(tps)
        begins = await c.beginning_offsets(tps)
        for tp in tps:
            c.seek(tp, max(begins[tp], ends[tp] - per_partition))
        todo = {tp for tp in tps if ends[tp] > begins[tp]}
        while todo:
            batch = await c.getmany(timeout_ms=1000, max_records=5000)
            if not batch:
                break
            for tp, msgs in batch.items():
                for m in msgs:
                    try:
                        ev = orjson.loads(m.value)
                    except orjson.JSONDecodeError:
                        continue
                    if ev.get("tenant") == tenant and ev.get("kind") in kinds:
                        out.append(ev)
                    if m.offset >= ends[tp] - 1:
                        todo.discard(tp)
    finally:
        await c.stop()
    out.sort(key=lambda e: (e.get("ts", 0), e.get("memory_id", "")))
    return out[-limit:]


def _quantiles(xs: np.ndarray) -> dict[str, float | None]:
    if xs.size == 0:
        return {k: None for k in ("min", "p50", "p90", "p99", "max")}
    q = np.percentile(xs, [0, 50, 90, 99, 100])
    return {k: round(float(v), 4) for k, v in zip(("min", "p50", "p90", "p99", "max"), q,
                                                   strict=True)}  # fmt: skip


def inspect_tenant(store: MemoryStore, tenant: str, policy: MaintenancePolicy,
                   top: int = 10) -> dict[str, Any]:  # fmt: skip
    """Counts, age/priority distributions, top memories, and what the next pass would do.

    Scans the tenant once (an operator tool, O(n)). Ages are stream time as the
    jobs measure them, with the clocks derived from the stored rows (the newest
    stored event time per clock; the running job has also seen dropped ones).
    """
    fields = [*SCAN_FIELDS, "text", "action", "merged_count", "uses", "valence"]
    rows = list(_unique(store.scan(tenant=tenant, output_fields=fields)).values())
    t = TenantIndex(per_agent_clock=policy.clock == "agent")
    for r in rows:
        t.upsert(str(r["id"]), entry_from_row(r))
    by_id = {str(r["id"]): r for r in rows}
    p, _ = tenant_priorities(t, policy)
    v = t.view()
    age_s = (t.stream_now() - v["created_ts"]) / 1000.0
    out: dict[str, Any] = {
        "tenant": tenant,
        "stream_time_ms": t.stream_time(),
        "clock": policy.clock,
        "counts": {"core": store.count("core", tenant), "buffer": store.count("buffer", tenant)},
        "age_s": {"all": _quantiles(age_s)},
        "priority": {"all": _quantiles(p)},
        "merged_rows": int(sum(1 for r in rows if int(r.get("merged_count", 1)) > 1)),
        "merged_total": int(sum(int(r.get("merged_count", 1)) - 1 for r in rows)),
    }
    for code, name in enumerate(PART_NAME):
        sel = v["partition"] == code
        out["age_s"][name] = _quantiles(age_s[sel])
        out["priority"][name] = _quantiles(p[sel])
    order = np.argsort(-p, kind="stable")[:top]
    out["top"] = [
        {
            "id": t.ids[i],
            "partition": PART_NAME[int(v["partition"][i])],
            "priority": round(float(p[i]), 4),
            "rpe": round(float(by_id[t.ids[i]].get("rpe", 0.0)), 4),
            "utility": round(float(by_id[t.ids[i]].get("utility", 0.0)), 4),
            "merged_count": int(by_id[t.ids[i]].get("merged_count", 1)),
            "hits": int(v["hits"][i]),
            "agent_id": by_id[t.ids[i]].get("agent_id"),
            "action": by_id[t.ids[i]].get("action"),
            "text": str(by_id[t.ids[i]].get("text", ""))[:120],
        }
        for i in order
    ]
    plan = plan_decay(t, policy)
    next_pass: dict[str, int] = {}
    for a in plan.actions:
        next_pass[f"{a.kind}:{a.reason}"] = next_pass.get(f"{a.kind}:{a.reason}", 0) + 1
    out["next_pass"] = next_pass
    out["capacity"] = {"core": policy.core_capacity, "buffer": policy.buffer_capacity}
    return out


__all__ = [
    "SETTLE_PASS_S",
    "AccessFlusher",
    "AccessTracker",
    "MaintenanceEngine",
    "MaintenanceJob",
    "emit_events",
    "flush_access",
    "forget_scope",
    "inspect_tenant",
    "policy_from",
    "recent_events",
    "wire_access",
    "wire_maintenance",
]
