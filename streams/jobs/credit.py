"""Jobs role: the credit job and the utility applier (faust Services, thin wiring).

Credit job (`CreditJob`): reads ``dmem.usage`` and ``dmem.feedback``, feeds
`operators.credit.CreditAssigner` and emits `UtilityUpdate`s to ``dmem.credit``.
No state store: on start it re-reads both topics from ``now - ttl`` (by broker
timestamp) and rebuilds its windows; updates emitted again keep their ids and
the applier ignores ids it has applied, so a restart neither loses nor
double-counts credit. One jobs worker per deployment (it reads all partitions);
scale the applier, not the job.

Applier (`UtilityApplier`): consumer group ``<app_id>-applier`` on ``dmem.credit``;
reads the rows by storage key (tenant, memory id), folds the updates with
`apply_utility` (the memory's credit statistics: count, discounted mean and
variance of normalised advantage) and upserts them back; a buffer memory whose
help is established (`CreditStats.established` > 0) moves to core. Offsets are
committed only after Milvus acknowledged. A row the store refuses by itself (a
metadata object over Milvus' JSON limit, which the row budget of `schemas.limits`
rules out for rows dmem built) is left as it is and the rest of the batch
written; its updates are logged as errors and counted (``credit_refused``), not
retried forever. An update for a memory dedup folded
into another goes to that survivor; one for a memory of another tenant, or one
that no longer exists, finds no row and is skipped.

Time: records are joined in event-time order (`EventTimeQueue`): a usage or
feedback record waits until its tenant's watermark (the highest event time read
on both topics) is ``jobs.credit_lateness_ms`` past it, or the input was
idle ``jobs.credit_idle_s``, and waiting records go in (event time, usage before
feedback, id) order, so an outcome read before its episode's usage (another
topic, fetched first) still finds it, and outcomes fold into the baselines in
the order they happened. The join window's expiry (``credit_ttl_ms``) is
ingestion time. The applier holds an update whose memory is not stored yet, and
later updates of that memory behind it (a memory's statistics are a discounted
mean, so the order of its updates matters), until the row can no longer come:
an update names the feedback record that earned it (`UtilityUpdate.feedback_offset`),
and once the hindsight agent (consumer group ``<app_id>``) has committed that
record, its retrospective writes are stored, so a row still missing is skipped.
That is a fact of the stream, not of timing: a slow or restarted write role
delays credit, it does not lose it. An update without that position waits
``jobs.credit_hold_s``. The applier commits its input below the oldest held
update, so a restart re-reads what it held (update ids make that a no-op).

Feedback payloads: an `EpisodeOutcome`, or a `Feedback`; ``kind=reward`` with an
episode id acts as that episode's outcome, thumbs on a memory id become a direct
update of +1 / -1 credit (one spread of advantage), folded into the same
statistics as an outcome's. Usage comes from the responder (``source="served"``)
and optionally from agents (``source="agent"``), which the assigner prefers.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import OrderedDict
from typing import Any, TypeVar, cast

import faust
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from mode import Service
from pydantic import BaseModel, ValidationError

from operators.credit import (
    CreditAssigner,
    CreditStats,
    CreditUpdate,
    OutcomeRecord,
    UsageRecord,
    apply_utility,
)
from schemas import (
    AccessCount,
    DeadLetter,
    EpisodeOutcome,
    Feedback,
    MemoryUsage,
    Partition,
    UtilityUpdate,
    encode,
    storage_key,
)
from schemas.models import feedback_key, feedback_update_id, final_outcome_id, usage_shares
from streams.admin import commit_or_replay, group_consumer, kafka_client_kwargs, topic_partitions
from streams.auth import UNAUTHENTICATED, KafkaGuard
from streams.clock import now_ms
from streams.context import RoleContext, SettleState, StatusFn, TouchFn
from streams.jobs.access import AccessReads, fold_access, read_access
from streams.jobs.rows import WRITE_LOCK
from streams.metrics import CREDIT_UPDATES, count_dead_letter
from streams.settings import Settings
from streams.settle import backlog
from streams.store import StoreService, upsert_fitting
from streams.write.pipeline import RawRecord, TenantState, dead_letter, validation_reason

M = TypeVar("M", bound=BaseModel)

log = logging.getLogger("dmem.jobs")


def parse_feedback(value: bytes) -> EpisodeOutcome | Feedback:
    data = orjson.loads(value)
    if isinstance(data, dict) and ("kind" in data or "memory_id" in data or "value" in data):
        return Feedback.model_validate(data)
    return EpisodeOutcome.model_validate(data)


def credit_event(u: UtilityUpdate, target: str, before: float,
                 row: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The history event of an applied update: thumbs are ``fed_back``, outcomes
    ``credited``; ``via`` names the folded id the update was addressed to."""
    return {
        "tenant": u.tenant, "memory_id": target,
        "kind": "fed_back" if u.update_id.startswith("fb:") else "credited",
        "ts": u.ts, "episode_id": u.episode_id, "update_id": u.update_id,
        "advantage": u.credit, "evidence": u.evidence, "uses": u.uses,
        "utility_before": before, "utility_after": float(row.get("utility", 0.0)),
        "via": u.memory_id if u.memory_id != target else None,
    }  # fmt: skip


def _event_key(topic_rank: int, value: bytes | None) -> tuple[str, int | None, str]:
    """(tenant, event time, id) of a usage or feedback record, read leniently: a record
    that does not parse is ordered by arrival and dead-lettered when it is handled."""
    try:
        d = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return ("", None, "")
    if not isinstance(d, dict):
        return ("", None, "")
    ts = d.get("ts")
    ts = ts if isinstance(ts, int) and not isinstance(ts, bool) else None
    ids = ("request_id",) if topic_rank == 0 else ("outcome_id", "feedback_id", "episode_id")
    ident = next((str(d[k]) for k in ids if isinstance(d.get(k), str)), "")
    return (str(d.get("tenant", "")), ts, ident)


class EventTimeQueue:
    """Records held per tenant and released in (event time, rank, id, arrival) order
    once the tenant's watermark (highest event time pushed) is `lateness_ms` past them,
    or all of them on `flush`. A record without an event time takes the watermark."""

    def __init__(self, lateness_ms: int) -> None:
        self.lateness_ms = int(lateness_ms)
        self.watermark: dict[str, int] = {}
        self._heaps: dict[str, list[tuple[int, int, str, int, Any]]] = {}
        self._seq = 0

    def __len__(self) -> int:
        return sum(len(h) for h in self._heaps.values())

    def push(self, tenant: str, ts: int | None, rank: int, ident: str, item: Any) -> None:
        mark = self.watermark.get(tenant)
        if ts is None:
            ts = mark if mark is not None else 0
        elif mark is None or ts > mark:
            self.watermark[tenant] = ts
        self._seq += 1
        heapq.heappush(self._heaps.setdefault(tenant, []), (ts, rank, ident, self._seq, item))

    def due(self, flush: bool = False) -> list[Any]:
        """Released records, tenant by tenant (tenants are independent), each in order."""
        out = []
        for tenant in sorted(self._heaps):
            heap = self._heaps[tenant]
            limit = self.watermark.get(tenant, 0) - self.lateness_ms
            while heap and (flush or heap[0][0] <= limit):
                out.append(heapq.heappop(heap)[4])
        return out


class CreditJob(Service):
    def __init__(self, settings: Settings, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.guard = KafkaGuard.from_settings(settings)
        self.settings = settings
        j = settings.jobs
        self.assigner = CreditAssigner(
            gamma=j.credit_gamma,
            ttl_ms=j.credit_ttl_ms,
            max_episodes=j.credit_max_episodes,
            max_episodes_per_tenant=j.credit_max_episodes_per_tenant,
            free_min=j.credit_free_min,
        )
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self.emitted = 0
        self.dead = 0
        self.rebuilt = 0
        self.handling = 0  # records fetched and not yet handled
        #: usage and feedback waiting for their tenant's watermark (module doc, Time)
        self.queue = EventTimeQueue(settings.jobs.credit_lateness_ms)
        self.usage_topic = settings.topic("usage")
        #: storage key of (tenant, episode) -> (partition, offset) of its outcome on the
        #: feedback topic: the updates of late usage name the outcome that earned them
        self.outcome_at: OrderedDict[str, tuple[int, int]] = OrderedDict()

    async def on_start(self) -> None:
        kw = kafka_client_kwargs(self.settings.kafka)
        self.producer = AIOKafkaProducer(linger_ms=5, **kw)
        await self.producer.start()
        c = AIOKafkaConsumer(enable_auto_commit=False, fetch_max_wait_ms=100, **kw)
        await c.start()
        tps: list[TopicPartition] = []
        for logical in ("usage", "feedback"):
            name = self.settings.topic(logical)
            tps += [TopicPartition(name, p) for p in sorted(await topic_partitions(c, name))]
        c.assign(tps)
        since = now_ms() - self.settings.jobs.credit_ttl_ms
        offsets = await c.offsets_for_times({tp: since for tp in tps})
        for tp in tps:
            found = offsets.get(tp)
            if found is not None:
                c.seek(tp, found.offset)
            else:
                await c.seek_to_end(tp)
        self.consumer = c
        self.add_future(self._run())
        self.add_future(self._expire())

    async def on_stop(self) -> None:
        for client in (self.consumer, self.producer):
            if client is not None:
                await client.stop()

    async def _run(self) -> None:
        assert self.consumer is not None
        last_input = time.monotonic()
        while not self.should_stop:
            batch = await self.consumer.getmany(timeout_ms=200, max_records=1000)
            for msgs in batch.values():
                for m in msgs:
                    await self._take(m)
            if batch:
                last_input = time.monotonic()
            idle = time.monotonic() - last_input >= self.settings.jobs.credit_idle_s
            due = self.queue.due(flush=idle)
            self.handling = len(due)
            for m in due:
                await self._handle(m)
                self.handling -= 1

    async def _expire(self) -> None:
        while not self.should_stop:
            await self.sleep(30.0)
            self.assigner.expire(now_ms())

    async def _take(self, m: Any) -> None:
        """Queue a usage or feedback record by its event time, or refuse it first when
        its credential does not cover its tenant: a forged record's time must not move
        that tenant's watermark (it would release the tenant's outcomes before their
        usage arrived, and the record stays on the topic for every replay)."""
        rank = 0 if m.topic == self.usage_topic else 1
        tenant, ts, ident = _event_key(rank, m.value)
        if tenant and not self.guard.agent_ok(tenant, m.key, m.value, m.headers):
            await self._refuse(m, now_ms())
            return
        self.queue.push(tenant, ts, rank, ident, m)

    async def _refuse(self, m: Any, now: int) -> None:
        """Dead-letter a record whose credential does not cover its tenant."""
        raw = RawRecord(m.value, m.key, m.topic, m.partition, m.offset)
        await self._dead(raw.key, dead_letter(raw, UNAUTHENTICATED, "Unauthenticated", "auth", now))

    async def _handle(self, m: Any) -> None:
        now = now_ms()
        try:
            if m.topic == self.settings.topic("usage"):
                u = MemoryUsage.model_validate(orjson.loads(m.value))
                if not self.guard.agent_ok(u.tenant, m.key, m.value, m.headers):
                    raise PermissionError(UNAUTHENTICATED)
                at = self.outcome_at.get(storage_key(u.tenant, u.episode_id))
                ups = self.assigner.on_usage(
                    u.tenant,
                    u.episode_id,
                    UsageRecord(
                        u.request_id,
                        u.step,
                        tuple(u.memory_ids),
                        # shares of the decision, whoever produced the record: the SDK and
                        # HTTP send shares, a raw producer may not (credit sums adv x share)
                        tuple(usage_shares(u.weights)),
                        u.source,
                        u.reward,
                        tuple(u.similarities or ()),
                    ),
                    now,
                )
            else:
                fb = parse_feedback(m.value)
                if not self.guard.agent_ok(fb.tenant, m.key, m.value, m.headers):
                    raise PermissionError(UNAUTHENTICATED)
                at = (m.partition, m.offset)
                if fb.episode_id is not None and (isinstance(fb, EpisodeOutcome)
                                                  or fb.kind == "reward"):  # fmt: skip
                    # the first outcome of an episode is the one credited (the assigner
                    # ignores copies); late usage is credited by it
                    key = storage_key(fb.tenant, fb.episode_id)
                    at = self.outcome_at.get(key, at)
                    TenantState.link(self.outcome_at, key, at,
                                     self.settings.jobs.credit_max_episodes)  # fmt: skip
                ups = self._feedback(fb, now, (m.partition, m.offset))
            msgs = self._updates(ups, now, at)
        except PermissionError:
            await self._refuse(m, now)
            return
        except (ValidationError, orjson.JSONDecodeError, ValueError, ArithmeticError) as exc:
            raw = RawRecord(m.value, m.key, m.topic, m.partition, m.offset)
            await self._dead(
                raw.key, dead_letter(raw, validation_reason(exc), type(exc).__name__, "credit", now)
            )
            return
        await self._emit(msgs)

    def _feedback(self, fb: EpisodeOutcome | Feedback, now: int,
                  at: tuple[int, int]) -> list[CreditUpdate]:  # fmt: skip
        """``at``: the record's (partition, offset), which names a thumbs that carries
        neither an id nor a time (two such thumbs are two records, a replay one)."""
        if isinstance(fb, EpisodeOutcome):
            oid = fb.outcome_id or final_outcome_id(fb.episode_id)
            rec = OutcomeRecord(oid, fb.reward, fb.step, fb.task, fb.agent_id)
            return self.assigner.on_outcome(fb.tenant, fb.episode_id, rec, now)
        if fb.memory_id is not None and fb.kind != "reward":
            credit = 1.0 if fb.kind == "thumbs_up" else -1.0
            where = f"{fb.memory_id}:{fb.kind}:@{at[0]}.{at[1]}"  # no id, no time: the record
            fid = fb.feedback_id or feedback_key(fb) or where
            return [
                CreditUpdate(
                    feedback_update_id(fid), fb.tenant, fb.memory_id, fb.episode_id or "", credit, 0
                )
            ]
        if fb.episode_id is not None:
            oid = fb.feedback_id or final_outcome_id(fb.episode_id)  # = feedback_key
            return self.assigner.on_outcome(
                fb.tenant, fb.episode_id, OutcomeRecord(oid, fb.value, agent=fb.agent_id), now
            )
        return []

    @staticmethod
    def _updates(ups: list[CreditUpdate], now: int,
                 at: tuple[int, int] | None = None) -> list[UtilityUpdate]:  # fmt: skip
        """`ups` as the credit topic's records; `at`: the feedback record (partition,
        offset) that earned them. Validated here, inside the record's handling, so an
        update that does not validate dead-letters its record instead of raising."""
        return [
            UtilityUpdate(
                update_id=u.update_id,
                memory_id=u.memory_id,
                tenant=u.tenant,
                credit=u.credit,
                uses=u.uses,
                ts=now,
                evidence=u.evidence,
                similarity=u.similarity,
                episode_id=u.episode_id or None,
                feedback_partition=at[0] if at else None,
                feedback_offset=at[1] if at else None,
            )
            for u in ups
        ]

    async def _emit(self, msgs: list[UtilityUpdate]) -> None:
        assert self.producer is not None
        for msg in msgs:
            key, value = msg.memory_id.encode(), encode(msg)
            await self.producer.send(
                self.settings.topic("credit"), value, key=key, headers=self.guard.sign(key, value)
            )
            self.emitted += 1

    async def _dead(self, key: bytes | None, dl: DeadLetter) -> None:
        assert self.producer is not None
        await self.producer.send(self.settings.topic("deadletter"), encode(dl), key=key)
        count_dead_letter(dl)
        self.dead += 1


class UtilityApplier(Service):
    def __init__(self, settings: Settings, store: StoreService, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.store_service = store
        self.guard = KafkaGuard.from_settings(settings)
        self.consumer: AIOKafkaConsumer | None = None
        self.applied = 0
        self.skipped = 0
        self.forged = 0  # updates without the service's signature (not applied)
        self.applying = 0  # updates fetched and not yet applied
        self.promoted = 0  # buffer memories moved to core by established credit
        #: updates not applied because the store refuses their row (logged as errors)
        self.refused = 0
        self.access_applied = 0  # access counts folded into their rows
        self.access_topic = settings.topic("access")
        self.on_applied: TouchFn | None = None  # called with the (tenant, id)s whose rows changed
        #: updates waiting for their memory's row, in arrival order, with when they first
        #: waited (module doc, Time)
        self.held: list[tuple[float, UtilityUpdate]] = []
        #: reads the hindsight agent's commits on the feedback topic (never joins its group)
        self.hindsight: AIOKafkaConsumer | None = None
        #: update id -> where it was read (``dmem.credit``): commits stay below held ones
        self._read_at: dict[str, tuple[TopicPartition, int]] = {}

    async def on_start(self) -> None:
        topics = [self.settings.topic("credit"), self.access_topic]
        self.consumer = group_consumer(self.settings, topics, "applier", fetch_max_wait_ms=200,
                                       co_partitioned=True)  # fmt: skip
        await self.consumer.start()
        await self._check_partitions(topics)
        self.hindsight = AIOKafkaConsumer(group_id=self.settings.app_id, enable_auto_commit=False,
                                          **kafka_client_kwargs(self.settings.kafka))  # fmt: skip
        await self.hindsight.start()
        self.add_future(self._run())

    async def on_stop(self) -> None:
        for client in (self.consumer, self.hindsight):
            if client is not None:
                await client.stop()

    async def _check_partitions(self, topics: list[str]) -> None:
        """Log an error where the credit and access topics differ in partition count: a
        memory's credit and its counts may then be folded by two processes."""
        assert self.consumer is not None
        counts = {t: len(await topic_partitions(self.consumer, t)) for t in topics}
        if all(counts.values()) and len(set(counts.values())) > 1:
            log.error("the applier's topics differ in partition count (%s): give them the "
                      "same count, or run one jobs worker", counts)  # fmt: skip

    async def hindsight_done(self, updates: list[UtilityUpdate]) -> dict[int, int]:
        """Feedback partition -> the hindsight agent's committed offset, for the
        partitions `updates` name (module doc, Time)."""
        out: dict[int, int] = {}
        topic = self.settings.topic("feedback")
        for p in sorted({u.feedback_partition for u in updates
                         if u.feedback_partition is not None}):  # fmt: skip
            assert self.hindsight is not None
            try:
                off = await self.hindsight.committed(TopicPartition(topic, p))
            except KafkaError as exc:  # not known now: its updates keep waiting
                log.debug("hindsight commit of %s/%d unavailable: %s", topic, p, exc)
                continue
            if off is not None:
                out[p] = int(off)
        return out

    async def _run(self) -> None:
        assert self.consumer is not None
        while not self.should_stop:
            batch = await self.consumer.getmany(timeout_ms=500, max_records=2000)
            updates: list[UtilityUpdate] = []
            access: AccessReads = {}
            for tp, msgs in batch.items():
                for m in msgs:
                    if tp.topic == self.access_topic:
                        if rec := self._internal(m, AccessCount, "access count"):
                            read_access(access, rec)
                    elif u := self._internal(m, UtilityUpdate, "utility update"):
                        updates.append(u)
                        self._read_at.setdefault(u.update_id, (tp, m.offset))
            self.applying = len(updates) + len(access)
            if updates or self.held or access:
                done = await self.hindsight_done([*updates, *(u for _, u in self.held)])
                await self.store_service.maybe_start()
                await self.store_service.connected.wait()
                await self.store_service._retry(  # noqa: SLF001
                    "apply credit", self.apply, updates, time.monotonic(), done, access
                )
            if batch:
                await commit_or_replay(self.consumer, "credit applier", await self._commits())
            self.applying = 0

    def _internal(self, m: Any, model: type[M], what: str) -> M | None:
        """A record of an internal topic: signed by the service and valid, else None
        (counted as forged, or logged as bad)."""
        if not self.guard.internal_ok(m.key, m.value, m.headers, what):
            self.forged += 1
            return None
        try:
            return model.model_validate(orjson.loads(m.value))
        except (ValidationError, orjson.JSONDecodeError) as exc:
            log.warning("skipping bad %s record at %s/%s: %s", what, m.partition, m.offset, exc)
            return None

    async def _commits(self) -> dict[TopicPartition, int]:
        """Next offsets to commit: the position, or the oldest held update's offset."""
        assert self.consumer is not None
        held = {u.update_id for _, u in self.held}
        self._read_at = {k: v for k, v in self._read_at.items() if k in held}
        out = {tp: await self.consumer.position(tp) for tp in self.consumer.assignment()}
        for tp, off in self._read_at.values():
            if tp in out:
                out[tp] = min(out[tp], off)
        return out

    def apply(self, updates: list[UtilityUpdate], now_s: float | None = None,
              hindsight_done: dict[int, int] | None = None,
              access: AccessReads | None = None) -> int:  # fmt: skip
        """Fold updates into their rows (sync; runs in a worker thread). Held updates go
        first; an update without a row waits (`held`), the later ones of its memory
        behind it: one naming a feedback record until `hindsight_done` (feedback
        partition -> the hindsight agent's committed offset, read before this call)
        is past that record, any other until `now_s` is ``jobs.credit_hold_s`` past
        when it first waited. Without `now_s` nothing waits.

        A read-modify-write of the rows under the maintenance jobs' `WRITE_LOCK`: a merge
        folds the survivor as it is after the credit, never a copy read before it.
        ``access``: retrieval counts read from ``dmem.access`` (`streams.jobs.access`),
        folded into the same rows in the same write; a count of a memory no longer stored
        is dropped."""
        with WRITE_LOCK:
            touched = self._fold(updates, now_s, hindsight_done, access or {})
        if touched and self.on_applied is not None:
            self.on_applied(sorted(touched))  # the (tenant, id) keys of the changed rows
        return len(touched)

    def _fold(self, updates: list[UtilityUpdate], now_s: float | None,
              hindsight_done: dict[int, int] | None,
              access: AccessReads) -> dict[tuple[str, str], Any]:  # fmt: skip
        store = self.store_service.store
        assert store is not None  # connected before any update is applied
        queued = [*self.held, *((now_s or 0.0, u) for u in updates)]
        held: list[tuple[float, UtilityUpdate]] = []  # `self.held` once the fold is done:
        # a store failure part way leaves it as it was, for the retry to fold again
        updates = [u for _, u in queued]
        keys = sorted({storage_key(u.tenant, u.memory_id) for u in updates}
                      | {storage_key(*k) for k in access})  # fmt: skip
        # by (tenant, id): an update only ever reaches its own tenant's row
        rows = {(r["tenant"], r["id"]): r for r in store.get_keys(keys, with_vector=True)}
        # a memory dedup folded into a survivor: its credit goes to the survivor
        into: dict[tuple[str, str], tuple[str, str]] = {}
        by_tenant: dict[str, set[str]] = {}
        for u in updates:
            if (u.tenant, u.memory_id) not in rows:
                by_tenant.setdefault(u.tenant, set()).add(u.memory_id)
        for tenant, missing in by_tenant.items():
            for mid, srow in store.survivors_of(tenant, sorted(missing)).items():
                into[(tenant, mid)] = (tenant, str(srow["id"]))
        extra = sorted({storage_key(*k) for k in into.values() if k not in rows})
        if extra:
            for r in store.get_keys(extra, with_vector=True):
                rows[(r["tenant"], r["id"])] = r
        touched: dict[tuple[str, str], dict[str, Any]] = {}
        history: list[dict[str, Any]] = []
        done: list[tuple[tuple[str, str], UtilityUpdate]] = []  # applied to the rows read
        waiting: set[tuple[str, str]] = set()
        for since, u in queued:
            key = (u.tenant, u.memory_id)
            target = key if key in rows else into.get(key)
            row = rows.get(target) if target is not None else None
            if key in waiting or (
                (row is None or target is None) and self._may_come(u, since, now_s, hindsight_done)
            ):
                waiting.add(key)  # its row may still come; the memory's next updates wait too
                held.append((since, u))
                continue
            if row is None or target is None:
                self.skipped += 1
                continue
            before = float(row.get("utility", 0.0))
            if apply_utility(
                row,
                u.update_id,
                u.credit,
                u.uses,
                discount=self.settings.jobs.credit_discount,
                evidence=u.evidence,
                similarity=u.similarity,
            ):
                touched[target] = row
                history.append(credit_event(u, target[1], before, row))
                done.append((target, u))
            else:
                self.skipped += 1
        counted = [k for k, r in sorted(access.items()) if k in rows and fold_access(rows[k], r)]
        for k in counted:  # a memory no longer stored: its count is dropped
            touched[k] = rows[k]
        parts = {k: str(row.pop("partition")) for k, row in touched.items()}
        by_part: dict[str, list[dict[str, Any]]] = {}
        for k, row in touched.items():
            by_part.setdefault(parts[k], []).append(row)
        refused: dict[str, str] = {}
        for part, part_rows in by_part.items():
            refused.update(upsert_fitting(store, part_rows, cast(Partition, part)))
        for skey, why in sorted(refused.items()):
            ids = [u.update_id for t, u in done if storage_key(*t) == skey]
            log.error("credit updates %s not applied: the store refuses memory %s (%s)",
                      ids, skey, why)  # fmt: skip
        self.access_applied += sum(storage_key(*k) not in refused for k in counted)
        for skey in sorted(refused.keys() & {storage_key(*k) for k in counted}):
            log.error("access count of memory %s not written: the store refuses its row (%s)",
                      skey, refused[skey])  # fmt: skip
        for target, u in done:
            if storage_key(*target) in refused:
                self.refused += 1
            else:
                self.applied += 1
                CREDIT_UPDATES.labels(tenant=u.tenant).inc()
        if refused:
            touched = {k: r for k, r in touched.items() if storage_key(*k) not in refused}
            history = [h for h in history
                       if storage_key(h["tenant"], h["memory_id"]) not in refused]  # fmt: skip
        promote: dict[str, list[str]] = {}
        min_uses = self.settings.respond.promote_min_uses
        for (tenant, mid), row in touched.items():
            if parts[(tenant, mid)] == "buffer" and CreditStats.of(row).established(min_uses) > 0:
                promote.setdefault(tenant, []).append(mid)
        for tenant, ids in sorted(promote.items()):  # established help: buffer -> core
            self.promoted += store.move(ids, "core", tenant=tenant)
        if history:  # after the rows: history never shows credit the row lacks
            store.history.record(history)
        self.held = held
        return touched

    def _may_come(self, u: UtilityUpdate, since: float, now_s: float | None,
                  hindsight_done: dict[int, int] | None) -> bool:  # fmt: skip
        """Whether the missing row of `u` may still be stored (see `apply`)."""
        if now_s is None:
            return False
        if u.feedback_partition is not None and u.feedback_offset is not None:
            done = (hindsight_done or {}).get(u.feedback_partition)
            return done is None or done <= u.feedback_offset
        return now_s - since < self.settings.jobs.credit_hold_s


def wire_jobs(app: faust.App, ctx: RoleContext) -> StatusFn:
    """Run the credit job and the utility applier; returns a status callable."""
    job = CreditJob(ctx.settings, loop=app.loop, beacon=app.beacon)
    applier = UtilityApplier(ctx.settings, ctx.store, loop=app.loop, beacon=app.beacon)
    applier.on_applied = ctx.touch  # the maintenance job re-reads those rows
    ctx.run(job)
    ctx.run(applier)

    async def settle_state() -> SettleState:
        unread = await backlog(job.consumer)
        unapplied = await backlog(applier.consumer)
        pending = {"unread_usage_feedback": unread, "handling": job.handling,
                   "waiting_usage_feedback": len(job.queue),
                   "unapplied_credit_access": unapplied, "applying": applier.applying,
                   "held_credit": len(applier.held),
                   "open_episodes": len(job.assigner.episodes)}  # fmt: skip
        # open episodes wait for outcomes that may never come: not work that runs by itself;
        # waiting and held records are released by the idle flush and the hold's bound
        settled = (unread == 0 and unapplied == 0 and not job.handling and not applier.applying
                   and not len(job.queue) and not applier.held)  # fmt: skip
        return {"settled": settled, "pending": pending}

    ctx.settle["credit"] = settle_state
    return lambda: {
        "credit_emitted": job.emitted,
        "duplicate_outcomes_ignored": job.assigner.duplicate_outcomes,
        "late_agent_reports": job.assigner.late_agent_reports,
        "credit_applied": applier.applied,
        "credit_promoted": applier.promoted,
        "credit_skipped": applier.skipped,
        "credit_refused": applier.refused,
        "access_applied": applier.access_applied,
        "open_episodes": len(job.assigner.episodes),
    }


__all__ = ["CreditJob", "UtilityApplier", "wire_jobs"]
