"""The write role's consumer: a plain aiokafka group loop feeding `WritePipeline`.

Not a faust agent: faust's consumer has a fixed 1.5 s fetch wait and hands
records over through its own thread, so batches arrived in bursts. This
Service owns its consumer and producer, so fetch waits, batch sizes and
commits are ours.

Decisions:
- Consumer group ``<app_id>-write``; offsets are committed per batch only after
  Milvus acknowledged its upserts *and* the broker every MemoryEvent and dead
  letter of it: at-least-once, and stable ids make each transition stored once.
- Two stages with one batch in flight between them: stage 1 takes what the
  consumer has buffered (up to ``write.batch_size``) and runs the operators in a
  worker thread; stage 2 writes to Milvus (retried until acknowledged), awaits
  the produce acks and commits. The CPU work of batch n+1 overlaps the round
  trips of batch n; Milvus slowness becomes consumer lag, not memory growth.
- Memories the write path takes back (`BatchResult.retract`: the context guard's
  second look) are deleted after the batch's upserts, in the same stage and before
  the commit: a batch that wrote and took back one row leaves it deleted. Not those
  the store found stored before (replays) in this batch or the one before it: stage
  1 judged them before stage 2 learned they were replays (`_withhold`).
- Checkpoints of operator state (`streams.write.pipeline`) are taken after
  stage 2 has drained, so a checkpoint never runs ahead of the store.
- State moves with its partitions: on revocation the in-flight batch is
  finished and the revoked states are checkpointed before the callback returns;
  on assignment the new partitions' states are read back
  (`streams.write.checkpoints.CheckpointIndex`) before their first batch.
- Forgets: each worker follows all of the ``control`` topic
  (`streams.control.ForgetFollower`) and tombstones the keys in its store, so a
  batch in flight cannot write a forgotten memory back.
- MemoryEvents are produced with partitions computed for the whole batch
  (`streams.partitioner`): the ones aiokafka would pick, at a fraction of the CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata
from mode import Service

from schemas import DeadLetter, MemoryEvent, encode, storage_key
from streams.admin import commit_or_replay, group_consumer, kafka_client_kwargs
from streams.backoff import Backoff
from streams.control import ForgetFollower, echo_to_store
from streams.metrics import count_dead_letter, record_batch
from streams.partitioner import partitions_for_records
from streams.settings import Settings
from streams.write.checkpoints import CheckpointIndex
from streams.write.pipeline import (
    RawRecord,
    StateKey,
    WritePipeline,
    dead_letter,
    parse_state_key,
    state_key,
)
from streams.write.replays import reconcile

log = logging.getLogger("dmem.write")

#: fetch wait of the write consumer: the broker answers a fetch after at most this
#: long when no data is there; short, so a micro-batch is never held back by it.
FETCH_MAX_WAIT_MS = 20
#: (topic, key, value, partition): every record's partition chosen once (`_messages`)
Message = tuple[str, bytes | None, bytes, int]
#: record batch size of the write producer (a batch holds ~1000 MemoryEvents)
PRODUCE_BATCH_BYTES = 512 * 1024
#: how long a revocation waits for the in-flight batch before giving up (replay),
#: as a share of the group's rebalance timeout (a member that overstays it is evicted)
REVOKE_DRAIN_SHARE = 0.8
#: how long a shutdown waits for stage 1 and the in-flight batch
STOP_DRAIN_S = 10.0
#: the info line of every completed assignment (benchmarks and tests read it back:
#: `assignments_in_log`)
ASSIGNMENT_LOG = "write assignment gen=%s at_ms=%d partitions=%s restored=%d seeded=%d in %.2fs"
_ASSIGNMENT_RE = re.compile(
    r"write assignment gen=(-?\d+) at_ms=(\d+) partitions=\[([\d, ]*)\] restored=(\d+) "
    r"seeded=(\d+)"
)


def assignments_in_log(text: str) -> list[dict[str, Any]]:
    """The assignments a write worker logged (`ASSIGNMENT_LOG`), in order: generation,
    wall-clock ms, partitions, states restored and seeds read."""
    return [
        {"generation": int(m[1]), "at_ms": int(m[2]),
         "partitions": [int(x) for x in m[3].split(",") if x.strip()],
         "restored": int(m[4]), "seeded": int(m[5])}
        for m in _ASSIGNMENT_RE.finditer(text)
    ]  # fmt: skip


def to_raw(m: Any) -> RawRecord:
    return RawRecord(
        value=m.value,
        key=m.key,
        topic=m.topic,
        partition=m.partition,
        offset=m.offset,
        timestamp_ms=m.timestamp if m.timestamp and m.timestamp > 0 else None,
        headers=tuple(m.headers or ()),
    )


@dataclass(slots=True)
class _Batch:
    """One micro-batch between the stages: its operator results and source offsets."""

    n: int
    offsets: dict[TopicPartition, int]
    result: Any
    msgs: list[Message]
    process_s: float
    raws: list[RawRecord]
    parts: dict[str, list[int]]


class _Drain(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, writer: WriteConsumer) -> None:
        self.writer = writer

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.writer.revoke(list(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.writer.assign(list(assigned))
        # the lag metric starts from the group's commits, not 0; in the background,
        # never inside the rebalance itself
        task = asyncio.ensure_future(self.writer.seed_committed(list(assigned)))
        self.writer.tasks.add(task)
        task.add_done_callback(self.writer.tasks.discard)


class WriteConsumer(Service):
    """Transitions -> pipeline -> Milvus + MemoryEvents, committed after both acked."""

    def __init__(
        self,
        settings: Settings,
        pipeline: WritePipeline,
        store: Any,
        now_ms: Callable[[], int],
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.pipeline = pipeline
        self.store_service = store
        self.now_ms = now_ms
        self.consumer: AIOKafkaConsumer | None = None
        self.forgets = ForgetFollower(
            settings,
            [self._forget, echo_to_store(store)],
            loop=kwargs.get("loop"),
            beacon=kwargs.get("beacon"),
        )
        self.producer: AIOKafkaProducer | None = None
        self.queue: asyncio.Queue[_Batch] = asyncio.Queue(maxsize=1)
        #: storage keys the previous batch's write found stored before (`_withhold`)
        self._replays_before: set[str] = set()
        self._taken = asyncio.Event()  # stage 2 took a batch off the queue
        self.restored = 0  # (tenant, partition) states restored from checkpoints
        self.seeded = 0  # per-tenant checkpoints read as seeds (migration)
        self.assignments = 0
        self.owned: set[int] = set()  # input partitions whose states are restored here
        self.generation = 0  # bumped at every revocation: batches fetched before are stale
        self._assigned = asyncio.Event()  # the current assignment's states are restored
        self._idle = asyncio.Event()  # stage 1 holds no batch (set between batches)
        self._idle.set()
        #: hindsight rewrites between their re-score and the store's ack (`rewriting`)
        self.rewrites = 0
        self._no_rewrites = asyncio.Event()
        self._no_rewrites.set()
        self.checkpoints = CheckpointIndex(
            settings, settings.topic("models"), loop=kwargs.get("loop"), beacon=kwargs.get("beacon")
        )
        self.batches = 0
        #: batches taken into the pipeline, and those finished (stored and committed by
        #: stage 2, failed, or not stored at all)
        self.handed = self.finished = 0
        self.commit_failures = 0
        self.committed: dict[TopicPartition, int] = {}  # for the lag metric
        self.ready = False
        self.ready_event = asyncio.Event()  # state restored, consumers started
        self.tasks: set[asyncio.Future[Any]] = set()  # small background tasks
        self._stage1: asyncio.Future[Any] | None = None
        self.mem_topic = settings.topic("memories")
        self.dl_topic = settings.topic("deadletter")

    # -- lifecycle -----------------------------------------------------------
    async def on_start(self) -> None:
        # The operator state holds ~10^6 long-lived objects (repeat keys, eligibility
        # windows, the dropped-transition cache) and a batch allocates ~10^5 more:
        # with CPython's default thresholds (700, 10, 10) the collector ran young and
        # full passes over that state every few batches. Process-wide; cycles are
        # still collected, just less often.
        gc.set_threshold(50_000, 20, 100)
        k = self.settings.kafka
        self.producer = AIOKafkaProducer(
            linger_ms=2,
            max_request_size=8 * 1024 * 1024,
            max_batch_size=PRODUCE_BATCH_BYTES,
            acks=1,
            **kafka_client_kwargs(k),
        )
        await self.producer.start()
        await self.store_service.maybe_start()
        # the rest waits for Milvus in the background, so the worker's web server
        # (and /health, 503 until then) comes up during a Milvus outage too
        self.add_future(self._start_when_connected())

    async def _start_when_connected(self) -> None:
        await self.store_service.connected.wait()
        await self.checkpoints.start()  # indexes the models topic; restores read through it
        self.consumer = group_consumer(
            self.settings,
            self.settings.topic("transitions"),
            "write",
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            listener=_Drain(self),
        )
        await self.consumer.start()
        await self.add_runtime_dependency(self.forgets)
        self.ready = True
        log.info("write path ready")
        self.add_future(self._stage_store())
        self._stage1 = self.add_future(self._stage_process())

    async def on_stop(self) -> None:
        """Finish the batch in hand, store and commit it, checkpoint, then close.

        mode calls this with the stage loops still running (they see
        ``should_stop``); a kill -9 skips all of it, and the uncommitted batches
        replay on the next start (idempotent).
        """
        if self._stage1 is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._stage1), STOP_DRAIN_S)
            except Exception as exc:  # noqa: BLE001 - timeout or a crashed stage
                log.warning("write stage 1 did not finish cleanly: %r", exc)
        if self.ready:
            try:
                stage1_idle = self._stage1 is not None and self._stage1.done()
                if stage1_idle and await self.drain(STOP_DRAIN_S) and self.pipeline.dirty:
                    await self.checkpoint()  # only state whose batches are all stored
            except Exception as exc:  # noqa: BLE001 - best effort on shutdown
                log.warning("final checkpoint failed: %s", exc)
        if self.consumer is not None:  # the forget follower stops as a child service
            try:
                await self.consumer.stop()
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                log.warning("consumer stop: %s", exc)
        await self.checkpoints.stop()
        if self.producer is not None:
            try:
                await self.producer.stop()
            except Exception as exc:  # noqa: BLE001
                log.warning("producer stop: %s", exc)

    def _input_parts(self, tps: list[TopicPartition]) -> set[int]:
        topic = self.settings.topic("transitions")
        return {tp.partition for tp in tps if tp.topic == topic}

    async def revoke(self, tps: list[TopicPartition]) -> None:
        """Rebalance, before: finish the batch in flight, checkpoint and drop the states."""
        self.generation += 1  # what stage 1 fetched before this point is stale now
        self._assigned.clear()
        parts = self._input_parts(tps)
        if not parts:
            return
        timeout = REVOKE_DRAIN_SHARE * self.settings.kafka.rebalance_timeout_s
        drained = await self.drain(timeout)
        if drained and self.producer is not None:
            await self.checkpoint(self.pipeline.keys(parts))
        dropped = await asyncio.to_thread(self.pipeline.drop, parts)
        self.owned -= parts
        log.info(
            "write partitions revoked: %s (%d states %s)",
            sorted(parts),
            len(dropped),
            "checkpointed" if drained else "dropped without checkpoint: drain timed out",
        )

    async def assign(self, tps: list[TopicPartition]) -> None:
        """Rebalance, after: restore the assigned partitions' states, then let stage 1 go."""
        t0 = time.monotonic()
        parts = self._input_parts(tps)
        # a revocation dropped every state; any here now was made by a batch that
        # outlived a timed-out drain: not restored, so not trusted
        ghosts = await asyncio.to_thread(self.pipeline.drop, {k[1] for k in self.pipeline.states})
        if ghosts:
            log.warning("dropped %d states not restored from a checkpoint", len(ghosts))
        restored, seeded = await self.restore(parts)
        self.owned = parts
        self.restored += restored
        self.seeded += seeded
        self.assignments += 1
        coordinator = getattr(self.consumer, "_coordinator", None)
        log.info(
            ASSIGNMENT_LOG,
            getattr(coordinator, "generation", -1),
            int(time.time() * 1000),
            sorted(parts),
            restored,
            seeded,
            time.monotonic() - t0,
        )
        self._assigned.set()
        self.ready_event.set()  # the hindsight agent waits for the first restore

    async def restore(self, parts: set[int]) -> tuple[int, int]:
        """(states restored, seeds read) for input partitions `parts`, from the index."""
        await self.checkpoints.sync()
        want: list[bytes] = []
        for key in list(self.checkpoints.where):
            try:
                tenant, part = parse_state_key(key)
            except (UnicodeDecodeError, ValueError):
                continue
            if (part is None and tenant not in self.pipeline.seeds) or part in parts:
                want.append(key)
        restored = seeded = 0
        for key, data in (await self.checkpoints.load(want)).items():
            tenant, part = parse_state_key(key)
            try:
                if part is None:
                    await asyncio.to_thread(self.pipeline.seed, tenant, data)
                    seeded += 1
                else:
                    await asyncio.to_thread(self.pipeline.restore, tenant, data, part)
                    restored += 1
            except Exception as exc:  # noqa: BLE001 - a bad checkpoint must not stop the worker
                log.error("ignoring unreadable checkpoint %r: %s", key, exc)
        return restored, seeded

    async def seed_committed(self, tps: list[TopicPartition]) -> None:
        c = self.consumer
        for tp in tps:
            try:
                off = await c.committed(tp) if c is not None else None
            except Exception as exc:  # noqa: BLE001 - metrics only
                log.debug("committed offset of %s unavailable: %s", tp, exc)
                continue
            if off is not None:
                self.committed.setdefault(tp, off)

    async def drain(self, timeout_s: float) -> bool:
        """Wait until stage 1 holds no batch and every batch handed to stage 2 is stored
        and committed."""

        async def both() -> None:
            await self._idle.wait()
            await self.queue.join()

        try:
            await asyncio.wait_for(both(), timeout_s)
            return True
        except TimeoutError:
            log.warning(
                "in-flight write batch not finished within %.0fs; it will replay", timeout_s
            )
            return False

    async def stored_so_far(self) -> None:
        """Until every batch processed so far has left stage 2 (at most the one in flight):
        the rows of what the pipeline has seen are stored."""
        target = self.handed
        while self.finished < target and not self.should_stop:
            await asyncio.sleep(0.02)

    @contextlib.asynccontextmanager
    async def rewriting(self) -> AsyncIterator[None]:
        """Around a hindsight re-score and the store write of its rows: the re-score
        marks its steps done in the state, so no checkpoint may hold those marks before
        the rows are stored (a crash between the two would replay the outcome onto
        steps marked done, and its rows would never be written)."""
        self.rewrites += 1
        self._no_rewrites.clear()
        try:
            yield
        finally:
            self.rewrites -= 1
            if not self.rewrites:
                self._no_rewrites.set()

    async def checkpoint(self, keys: list[StateKey] | None = None) -> None:
        """Snapshot the dirty states (of `keys` only, if given) once stage 2 is empty
        and no hindsight rewrite is between its re-score and its store write (never
        ahead of the store); returns when the broker acknowledged them."""
        await self.queue.join()
        await self._no_rewrites.wait()
        assert self.producer is not None
        # states of partitions not owned (made by a batch a timed-out drain let through)
        # are never checkpointed: they would overwrite their owner's checkpoint
        ghosts = {k[1] for k in self.pipeline.states} - self.owned
        if ghosts:
            await asyncio.to_thread(self.pipeline.drop, ghosts)
        todo = sorted(self.pipeline.dirty if keys is None else self.pipeline.dirty & set(keys))
        self.pipeline.dirty.difference_update(todo)  # marks made from here on stay
        failed: list[StateKey] = []
        futs: list[tuple[StateKey, asyncio.Future[Any]]] = []
        for tenant, part in todo:
            try:
                data = await asyncio.to_thread(self.pipeline.snapshot, tenant, part)
            except KeyError:
                continue  # dropped meanwhile (revoked)
            try:
                key = state_key(tenant, part)
                futs.append(
                    (
                        (tenant, part),
                        await self.producer.send(
                            self.settings.topic("models"),
                            data,
                            key=key,
                            headers=self.pipeline.guard.sign(key, data),
                        ),
                    )
                )
            except KafkaError as exc:
                log.warning("checkpoint of %s|%d not sent: %s", tenant, part, exc)
                failed.append((tenant, part))
        results = await asyncio.gather(*(f for _, f in futs), return_exceptions=True)
        failed += [
            k for (k, _), r in zip(futs, results, strict=True) if isinstance(r, BaseException)
        ]
        if failed:  # tried again at the next interval; the worker keeps going
            log.warning("checkpoint failed for %d state(s); retrying later", len(failed))
            self.pipeline.dirty.update(k for k in failed if k in self.pipeline.states)

    # -- stage 1: fetch + operators ------------------------------------------
    async def _fetch(self) -> list[Any]:
        """What is buffered now, up to ``batch_size``; waits ``batch_within_s`` at most for one.

        No linger once records are there: while stage 1 was busy with the previous
        batch, the consumer's background fetches kept buffering, so under load
        batches grow by themselves (to ``batch_size``) and at low load a record
        does not wait for company. A second, non-blocking call sweeps the other
        partitions' buffered records into the same batch. With ``write.linger_s`` > 0
        it keeps fetching until the batch is full or that long has passed.
        """
        assert self.consumer is not None
        w = self.settings.write
        out: list[Any] = []
        got = await self.consumer.getmany(
            timeout_ms=int(w.batch_within_s * 1000), max_records=w.batch_size
        )
        for msgs in got.values():
            out.extend(msgs)
        deadline = time.monotonic() + w.linger_s
        while out and len(out) < w.batch_size and not self.should_stop:
            left = deadline - time.monotonic()
            more = await self.consumer.getmany(
                timeout_ms=max(0, int(left * 1000)), max_records=w.batch_size - len(out)
            )
            for msgs in more.values():
                out.extend(msgs)
            if not more and left <= 0:
                break
        return out

    def _process(
        self, raws: list[RawRecord], now: int, parts: dict[str, list[int]]
    ) -> tuple[Any, list[Message]]:
        """Pipeline, serialisation and partitioning, in the worker thread (off the loop)."""
        res = self.pipeline.process(raws, now)
        msgs = self._messages(self.dl_topic, [(key, encode(dl)) for key, dl in res.dead], parts)
        msgs += self._messages(
            self.mem_topic, [(ev.memory_id.encode(), encode(ev)) for ev in res.events], parts
        )
        return res, msgs

    @staticmethod
    def _messages(
        topic: str, records: list[tuple[bytes | None, bytes]], parts: dict[str, list[int]]
    ) -> list[Message]:
        """Records of one topic with their partitions: MemoryEvents and dead letters alike."""
        chosen = partitions_for_records([k for k, _ in records], parts[topic])
        return [(topic, k, v, p) for (k, v), p in zip(records, chosen, strict=True)]

    async def _stage_process(self) -> None:
        last_ckpt = time.monotonic()
        while not self.should_stop:
            while self.queue.full():  # stage 2 still has the last batch waiting
                self._taken.clear()
                await self._taken.wait()
            if self.should_stop:  # no new batch once stopping: on_stop checkpoints next
                break
            gen = self.generation
            records = await self._fetch()
            if not self._assigned.is_set():
                if not records:
                    continue  # rebalancing: nothing to do until the states are restored
                await self._assigned.wait()  # restore before the first batch of a partition
            if gen != self.generation:
                continue  # fetched before a rebalance: fetched again from the committed offsets
            self._idle.clear()  # from here a revocation waits for this batch (no await above)
            try:
                await self._one_batch([m for m in records if m.partition in self.owned], gen)
                if self.pipeline.dirty and (
                    time.monotonic() - last_ckpt >= self.settings.write.checkpoint_every_s
                ):
                    await self.checkpoint()
                    last_ckpt = time.monotonic()
            finally:
                self._idle.set()

    async def _one_batch(self, records: list[Any], gen: int) -> None:
        if not records:
            return
        offsets: dict[TopicPartition, int] = {}
        for m in records:
            tp = TopicPartition(m.topic, m.partition)
            offsets[tp] = max(offsets.get(tp, -1), m.offset + 1)
        raws = [to_raw(m) for m in records]
        assert self.producer is not None
        parts = {t: await self._partitions(t) for t in (self.mem_topic, self.dl_topic)}
        t0 = time.perf_counter()
        self.handed += 1  # counted before the pipeline sees it (`stored_so_far`)
        queued = False
        try:
            result, msgs = await asyncio.to_thread(self._process, raws, self.now_ms(), parts)
            if gen != self.generation:  # a rebalance whose drain timed out overtook it
                log.warning(
                    "batch of %d overtaken by a rebalance: not stored (it replays)", len(raws)
                )
                return
            await self.queue.put(
                _Batch(len(raws), offsets, result, msgs, time.perf_counter() - t0, raws, parts)
            )
            queued = True
        finally:
            if not queued:
                self.finished += 1

    # -- stage 2: store + produce + commit -----------------------------------
    async def _stage_store(self) -> None:
        """Runs until cancelled (after `on_stop` drained it), never on should_stop."""
        assert self.producer is not None and self.consumer is not None
        while True:
            b = await self.queue.get()
            self._taken.set()
            try:
                t1 = time.perf_counter()
                # a write of an id already stored: a replay is not written again,
                # an edit keeps what the memory earned (`streams.write.replays`); the
                # events go out either way (a crash between the upsert and the events
                # replays a batch whose rows are stored and whose events are not)
                rejected, replays = await self.store_service.write(
                    b.result.upserts, reconcile
                )  # acked or refused
                if replays:  # stored before: no second look of the guard may take it back
                    self.pipeline.replayed(replays)
                stored_before, self._replays_before = replays | self._replays_before, replays
                retract = self._withhold(b, stored_before)
                if retract:  # after the upserts: a row written by this batch too
                    await self.store_service.evict(retract)
                if rejected:
                    b.msgs = await asyncio.to_thread(self._reject, b, rejected)
                t2 = time.perf_counter()
                await self._produce(b.msgs)
                t3 = time.perf_counter()
                await self._commit(b.offsets)
                record_batch(b.result.events, b.result.dead, b.n, write_s=t2 - t1)
                self.batches += 1
                log.info(
                    "batch n=%d stored=%d dead=%d process=%.1fms store=%.1fms produce=%.1fms",
                    b.n,
                    b.result.stored,
                    len(b.result.dead),
                    b.process_s * 1e3,
                    (t2 - t1) * 1e3,
                    (t3 - t2) * 1e3,
                )
            finally:
                self.finished += 1
                self.queue.task_done()

    def _withhold(self, b: _Batch, stored_before: set[str]) -> list[tuple[str, str]]:
        """The batch's retracts to evict: those of memories the store found stored
        before (``stored_before``: storage keys of this batch's replays and the
        previous batch's) are withheld, and so are their ``evicted`` events.

        Stage 1 judges batch n+1 while stage 2 stores batch n (one batch in flight,
        `_stage_process` waits while the queue is full), so its second look can take
        back a memory that batch n's write finds a replay before `WritePipeline.replayed`
        has released it; within one batch the retract is judged before the write. A
        memory stored before this batch is not this batch's to take back: evicting it
        loses a row the replay was meant to leave as it is.

        What the retract made the write path's state forget is not given back (its
        repeat key and eligibility entry, `TenantState.forget`; its place in the
        intrinsic bank, dropped by the second look): those traces are gone by stage 2
        and the state has moved on since, so the same text published again is judged
        afresh and hindsight does not re-score the memory.
        """
        kept: list[tuple[str, str]] = []
        held: set[str] = set()
        ids: set[bytes] = set()  # message keys: MemoryEvents are keyed by memory id
        for tenant, mid in b.result.retract:
            key = storage_key(tenant, mid)
            if key in stored_before:
                held.add(key)
                ids.add(mid.encode())
            else:
                kept.append((tenant, mid))
        if held:
            b.msgs = [m for m in b.msgs
                      if m[1] not in ids or self._event_of(m, held) != "evicted"]  # fmt: skip
            log.info("withheld %d retract(s) of memories stored before the batch", len(held))
        return kept

    def _event_of(self, m: Message, keys: set[str] | dict[str, str]) -> str | None:
        """The kind of message ``m`` where it is a MemoryEvent of one of ``keys``
        (storage keys), else None."""
        if m[0] != self.mem_topic:
            return None
        ev = orjson.loads(m[2])
        return str(ev["kind"]) if storage_key(ev["tenant"], ev["memory_id"]) in keys else None

    def _reject(self, b: _Batch, rejected: dict[str, str]) -> list[Message]:
        """Rows the store refused: dead letters (original bytes) instead of `written` events."""

        # rejected is keyed by (tenant, id): storage keys
        msgs = [m for m in b.msgs if self._event_of(m, rejected) is None]
        dead: list[tuple[bytes | None, bytes]] = []
        now = self.now_ms()
        for raw in b.raws:
            item = self.pipeline.decode(raw, now)
            if isinstance(item, DeadLetter):
                continue
            skey = storage_key(item.tenant, item.memory_id)
            if skey not in rejected:
                continue
            why = f"store refused the memory: {rejected[skey]}"
            dl = dead_letter(raw, why, "InvalidRecord", "store", now)
            dead.append((raw.key, encode(dl)))
            count_dead_letter(dl)
            self.pipeline.forget(item.tenant, item.memory_id, item.episode_id)  # not stored
            log.warning("dead-lettered %s: %s", item.memory_id, why)
        return msgs + self._messages(self.dl_topic, dead, b.parts)

    async def _produce(self, msgs: list[Message]) -> None:
        """Append every message to one record batch per partition, await all acks once.

        ``send_batch`` with pre-built batches instead of one ``send`` per message:
        the per-message future and accumulator work was a large share of the
        event loop's CPU. Batches the broker did not acknowledge are sent again
        with backoff until it does; the micro-batch is not committed before that.
        A resend can duplicate an event on the topic; consumers of ``memories``
        are replay-safe by memory id.
        """
        assert self.producer is not None
        w = self.settings.write
        groups: dict[tuple[str, int], list[tuple[bytes | None, bytes]]] = {}
        for topic, key, value, part in msgs:
            groups.setdefault((topic, part), []).append((key, value))
        backoff = Backoff(w.retry_initial_s, w.retry_max_s)
        todo = [(tp, chunk) for tp, items in groups.items() for chunk in self._chunks(items)]
        while todo:
            futs: list[asyncio.Future[Any]] = []
            try:
                for (topic, part), chunk in todo:
                    batch = self.producer.create_batch()
                    sign = topic == self.mem_topic and self.pipeline.guard.enabled
                    for key, value in chunk:
                        headers = self.pipeline.guard.sign(key, value) if sign else []
                        batch.append(key=key, value=value, timestamp=None, headers=headers)
                    futs.append(await self.producer.send_batch(batch, topic, partition=part))
            except KafkaError as exc:  # e.g. no metadata: the rest is resent below
                log.warning("produce failed after %d of %d batches: %s", len(futs), len(todo), exc)
            results = await asyncio.gather(*futs, return_exceptions=True)
            failed = [
                c for c, r in zip(todo, results, strict=False) if isinstance(r, BaseException)
            ]
            failed += todo[len(futs) :]
            if failed:
                log.warning(
                    "%d event batches not acknowledged; resend in %.1fs", len(failed), backoff.delay
                )
                await backoff.wait()
            todo = failed

    async def _partitions(self, topic: str) -> list[int]:
        """The topic's partitions, waiting out a broker that is away (never raises)."""
        assert self.producer is not None
        w = self.settings.write
        backoff = Backoff(w.retry_initial_s, w.retry_max_s)
        while True:
            try:
                return sorted(await self.producer.partitions_for(topic))
            except KafkaError as exc:
                log.warning("no partitions for %s (%s); retry in %.1fs", topic, exc, backoff.delay)
                await backoff.wait()

    @staticmethod
    def _chunks(items: list[Any]) -> list[list[Any]]:
        """Slices that fit one producer batch (``PRODUCE_BATCH_BYTES``, with headroom)."""
        out: list[list[Any]] = [[]]
        size = 0
        for kv in items:
            n = len(kv[1]) + (len(kv[0]) if kv[0] else 0) + 64
            if out[-1] and size + n > PRODUCE_BATCH_BYTES // 2:
                out.append([])
                size = 0
            out[-1].append(kv)
            size += n
        return out

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        assert self.consumer is not None
        mine = self.consumer.assignment()
        todo = {tp: OffsetAndMetadata(off, "") for tp, off in offsets.items() if tp in mine}
        if not todo:
            return
        if await commit_or_replay(self.consumer, "write consumer", todo):
            self.committed.update((tp, om.offset) for tp, om in todo.items())
        else:
            self.commit_failures += 1

    # -- forget broadcast (`streams.control`) -----------------------------------
    def _forget(self, events: list[MemoryEvent]) -> None:
        for ev in events:
            self.pipeline.forget(ev.tenant, ev.memory_id, ev.episode_id)

    def health(self) -> dict[str, Any]:
        return {
            "processed": self.pipeline.processed,
            "batches": self.batches,
            "ready": self.ready,
            "partitions": sorted(self.owned),
            "states": len(self.pipeline.states),
            "assignments": self.assignments,
            "state_restores": self.restored,
            "seeds": self.seeded,
            "commit_failures": self.commit_failures,
            "forgets_applied": self.forgets.applied,
        }


__all__ = ["WriteConsumer"]
