"""The faust app: thin wiring around `WritePipeline` and `MemoryStore`.

Decisions:
- The write role reads raw bytes so a malformed record can be dead-lettered
  with its original bytes; decoding is the pipeline's job.
- The write role's consumer is a plain aiokafka consumer group inside a
  Service (`streams.write.consumer.WriteConsumer`), not a faust agent: faust's consumer
  handed records over in 0.3-0.7 s bursts (hard-coded 1.5 s fetch wait). It
  commits a micro-batch's offsets only after Milvus acknowledged its upserts
  and the broker its MemoryEvents; store errors are retried with backoff, so an
  outage stalls consumption (lag grows) instead of skipping records. A crash
  before the commit replays the batch; memory ids are stable, upserts
  idempotent, so nothing duplicates. Details in `streams.write.consumer`.
- Operator state (value model, RPE normaliser, gate sketch, smoothers) is not
  kept in faust Tables: faust refuses table writes from ``take()`` batches
  ("Cannot modify table key from outside of stream iteration"). Instead each
  (tenant, input partition)'s state is snapshotted to the compacted ``models``
  topic (key = ``tenant|partition``) every ``checkpoint_every_s``, on
  revocation and on shutdown, and read back on assignment before the
  partition's first batch (`streams.write.consumer`). That is a changelog in
  all but name, with one record per state instead of one per key update. Late
  outcomes (``retro``) remain a faust agent: they are rare; with several write
  workers an outcome finds its episode's window only where that episode's
  partition is held (README "Scaling", limits).
- Torch work and Milvus calls run in a worker thread (`asyncio.to_thread`),
  never on the event loop, so heartbeats and the web server stay responsive.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import faust
import orjson
import torch
from mode import Service
from pydantic import ValidationError

from milvus import MemoryStore
from operators import Encoder, build_encoder
from schemas import EpisodeOutcome, encode, storage_key
from schemas.errors import ConfigError, InvalidRecord
from streams.backoff import Backoff
from streams.clock import now_ms
from streams.codec import raw_topic
from streams.metrics import install_metrics
from streams.settings import Settings
from streams.settle import backlog, settle_states
from streams.write.pipeline import WritePipeline

log = logging.getLogger("dmem")

ROLES = ("write", "respond", "jobs", "all")


def make_encoder(settings: Settings) -> Encoder:
    e = settings.encoder
    return build_encoder(e.name, dim=e.dim, cache_size=e.cache_size, static_path=e.static_path,
                         device=e.device)


class StoreService(Service):
    """Owns the Milvus client for this process; retries writes until acknowledged."""

    def __init__(self, settings: Settings, dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.dim = dim
        self.store: MemoryStore | None = None
        self.healthy = False
        self.failures = 0
        self._probed_at = 0.0
        self._call_failing = False
        self.connected = asyncio.Event()

    async def on_start(self) -> None:
        m = self.settings.milvus
        if not m.uri:
            self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.store = MemoryStore(
            self.settings.milvus_uri,
            collection=m.collection,
            dim=self.dim,
            token=m.token,
            timeout_s=m.timeout_s,
            tombstone_ttl_s=m.tombstone_ttl_s,
        )
        # Connect in the background: a worker started during a Milvus outage must
        # still come up and answer /health (503) instead of hanging in start-up,
        # which an orchestrator's liveness probe would turn into a restart loop.
        # Users of the store wait for `connected` (or retry through `_retry`).
        self.add_future(self._connect())

    async def _connect(self) -> None:
        assert self.store is not None
        await self._retry("connect", self.store.connect)
        self.connected.set()

    async def on_stop(self) -> None:
        if self.store is not None:
            await asyncio.to_thread(self.store.close)

    async def _retry(self, what: str, fn: Any, *args: Any, raise_invalid: bool = False) -> Any:
        w = self.settings.write
        backoff = Backoff(w.retry_initial_s, w.retry_max_s)
        while True:
            try:
                out = await asyncio.to_thread(fn, *args)
                self.healthy = True
                self._call_failing = False
                return out
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - every store failure is retried
                if raise_invalid and isinstance(exc, InvalidRecord):
                    raise  # retrying cannot help: the caller isolates the record
                self.healthy = False
                self._call_failing = True  # a good ping must not hide failing writes
                self.failures += 1
                retriable = getattr(exc, "retriable", True)
                log.warning(
                    "milvus %s failed (%s, retriable=%s); retry in %.1fs",
                    what,
                    exc,
                    retriable,
                    backoff.delay,
                )
                await backoff.wait()

    async def probe(self, max_age_s: float = 1.0, timeout_s: float = 1.0) -> bool:
        """Ask Milvus now (cached for ``max_age_s``): /health and /metrics must show an
        outage even when no write is pending, not only after the next write fails."""
        if not self.connected.is_set():
            return False
        if self.store is None or time.monotonic() - self._probed_at < max_age_s:
            return self.healthy
        self._probed_at = time.monotonic()
        store = self.store
        try:
            await asyncio.wait_for(asyncio.to_thread(store.ping, timeout_s), timeout_s + 0.2)
            self.healthy = not self._call_failing
        except Exception as exc:  # noqa: BLE001 - any failure means "not reachable now"
            log.info("milvus probe failed: %s", exc)
            self.healthy = False
        return self.healthy

    async def write(self, upserts: Mapping[Any, list[dict[str, Any]]]) -> dict[str, str]:
        """Upsert every partition's rows, retried until acknowledged.

        Returns ``{storage key: reason}`` (``schemas.storage_key(tenant, id)``:
        ids are unique only per tenant) for rows the store refuses by itself
        (`InvalidRecord`, e.g. a metadata object over Milvus' JSON limit): those
        are left out and the rest is written, so one bad row cannot stall its
        partition forever; the caller dead-letters them. Everything else
        (outages, server errors) is retried with backoff, never skipped.
        """
        assert self.store is not None
        rejected: dict[str, str] = {}
        for partition, rows in upserts.items():
            if not rows:
                continue
            try:
                await self._retry(f"upsert {partition}", self.store.upsert, rows, partition,
                                  raise_invalid=True)
            except InvalidRecord:
                store = self.store
                bad = {storage_key(r["tenant"], r["id"]): why for r in rows
                       if (why := store.check_row(r)) is not None}  # fmt: skip
                good = [r for r in rows if storage_key(r["tenant"], r["id"]) not in bad]
                if good:
                    await self._retry(f"upsert {partition}", store.upsert, good, partition)
                rejected.update(bad)
        return rejected


def faust_credentials(settings: Settings) -> Any:
    """SASL/TLS for faust's own clients, from the same settings as aiokafka's."""
    k = settings.kafka
    ssl_ctx = None
    if k.security_protocol in ("SSL", "SASL_SSL"):
        import ssl

        ssl_ctx = ssl.create_default_context(cafile=k.ssl_cafile)
    if k.sasl_mechanism:
        return faust.SASLCredentials(
            username=k.sasl_username, password=k.sasl_password,
            mechanism=k.sasl_mechanism, ssl_context=ssl_ctx,
        )
    if ssl_ctx is not None:
        return faust.SSLCredentials(ssl_ctx)
    return None


def build_app(settings: Settings, role: str = "write") -> faust.App:
    """Create the faust app with the agents of `role` wired in."""
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
    k = settings.kafka
    app = faust.App(
        settings.app_id,
        broker=k.broker,
        store="memory://",
        autodiscover=False,
        web_enabled=True,
        web_host=settings.web_host,
        web_port=settings.web_port,
        web_bind=settings.web_host,
        topic_partitions=k.partitions,
        topic_replication_factor=k.replication_factor,
        broker_session_timeout=k.session_timeout_s,
        broker_heartbeat_interval=k.heartbeat_interval_s,
        broker_rebalance_timeout=k.rebalance_timeout_s,
        broker_commit_interval=k.commit_interval_s,
        consumer_auto_offset_reset="earliest",
        producer_max_request_size=8 * 1024 * 1024,
        stream_buffer_maxsize=max(4096, settings.write.batch_size * 2),
        datadir=str(settings.data_dir / "faust"),
        broker_credentials=faust_credentials(settings),
    )
    install_metrics(app)  # GET /metrics on every role
    encoder = make_encoder(settings)
    store = StoreService(settings, encoder.dim, loop=app.loop, beacon=app.beacon)
    app.add_dependency(store)
    app.dmem_store = store  # type: ignore[attr-defined]  # store metrics on every role
    status: dict[str, Any] = {"roles": [role]}
    if role in ("write", "all"):
        status["write"] = wire_write_path(app, settings, encoder, store)
    if role in ("respond", "all"):
        from streams.respond.http import wire_respond

        # its own encoder instance: the LRU cache is not shared across threads
        status["respond"] = wire_respond(app, settings, make_encoder(settings), store)
        from streams.jobs.maintenance import wire_access

        status["access"] = wire_access(app, settings, store)

    if role in ("respond", "jobs"):  # the write path follows forgets itself (after restore)
        from streams.control import ForgetFollower, echo_to_store

        forgets = ForgetFollower(settings, [echo_to_store(store)], loop=app.loop,
                                 beacon=app.beacon)  # fmt: skip
        app.add_dependency(forgets)
        status["forgets"] = lambda: {"applied": forgets.applied}

    if role in ("jobs", "all"):
        from streams.jobs.credit import wire_jobs

        status["jobs"] = wire_jobs(app, settings, store)
        from streams.jobs.maintenance import wire_maintenance

        status["maintenance"] = wire_maintenance(app, settings, store)

    @app.page("/health")
    async def health(web: Any, request: Any) -> Any:
        ok = await store.probe()
        body: dict[str, Any] = {"ok": ok, "role": role, "store_failures": store.failures}
        for name in ("write", "respond", "jobs", "maintenance", "access", "forgets"):
            if name in status:
                body[name] = status[name]()
        # each component's pending work; "settled": none anywhere in this process
        # (`dmem wait --settled` polls this; README "Guarantees")
        settle = {name: await fn() for name, fn in getattr(app, "dmem_settle", {}).items()}
        body["settle"] = settle
        body["settled"] = bool(ok and all(st["settled"] for st in settle.values()))
        return web.json(body, status=200 if ok else 503)

    _ = health
    return app


def wire_write_path(
    app: faust.App, settings: Settings, encoder: Encoder, store: StoreService
) -> Any:
    """Wire the write consumer and the hindsight agent; returns a health-details callable."""
    pipeline = WritePipeline(settings, encoder)
    # Torch intra-op threads of this process (env DMEM_TORCH_THREADS, default 1):
    # the value MLP's matrices are tiny, and on a small machine extra threads only
    # fight the broker, Milvus and the event loop (a 1024 batch: ~150 ms with 1
    # thread vs ~300-600 ms with 2 on 2 busy cores; see BENCHMARKS.md).
    torch.set_num_threads(max(1, int(os.environ.get("DMEM_TORCH_THREADS", "1"))))

    memories = raw_topic(app, settings.topic("memories"))
    app.dmem_pipeline = pipeline  # type: ignore[attr-defined]
    app.dmem_store = store  # type: ignore[attr-defined]
    from streams.write.consumer import WriteConsumer

    writer = WriteConsumer(settings, pipeline, store, now_ms, loop=app.loop, beacon=app.beacon)
    app.add_dependency(writer)
    app.dmem_consumers = [lambda: (writer.consumer, writer.committed)]  # type: ignore[attr-defined]

    feedback = raw_topic(app, settings.topic("feedback"))

    @app.agent(feedback, name="dmem-retro")
    async def retro_agent(stream: faust.StreamT[bytes]) -> None:
        """Late outcomes: re-score the episode's eligibility window (hindsight)."""
        await writer.ready_event.wait()  # not before the first assignment's states
        async for value in stream:
            try:
                data = orjson.loads(value)
                if not isinstance(data, dict) or "reward" not in data or "kind" in data:
                    continue  # thumbs and other feedback are the credit job's business
                out = EpisodeOutcome.model_validate(data)
            except (orjson.JSONDecodeError, ValidationError):
                continue  # the credit job dead-letters bad feedback
            result = await asyncio.to_thread(
                pipeline.rescore, out.tenant, out.episode_id, out.reward, now_ms()
            )
            rejected = await store.write(result.upserts)
            if rejected:
                log.warning("hindsight rows refused by the store: %s", rejected)
            if result.promote:
                assert store.store is not None
                move = functools.partial(store.store.move, tenant=out.tenant)  # own rows only
                await store._retry("promote", move, result.promote, "core")
            for ev in result.events:
                if storage_key(ev.tenant, ev.memory_id) not in rejected:
                    await memories.send(key=ev.memory_id.encode(), value=encode(ev))

    async def settle_state() -> dict[str, Any]:
        # uncommitted = read but not yet stored and acknowledged; the hindsight agent's
        # outcomes count until faust committed them (after the rescore was written)
        unwritten = await backlog(writer.consumer, writer.committed) if writer.ready else None
        faust_consumer = getattr(app, "_consumer", None)
        outcomes = await backlog(faust_consumer, getattr(faust_consumer, "_committed_offset",
                                                         {}))  # fmt: skip
        pending = {"unwritten_transitions": unwritten, "unprocessed_outcomes": outcomes}
        return {"settled": unwritten == 0 and outcomes == 0, "pending": pending}

    settle_states(app)["write"] = settle_state
    _ = retro_agent
    return writer.health
