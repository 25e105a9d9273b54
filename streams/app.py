"""The faust app of a worker: one `RoleContext`, and each role wired over it.

`build_app` creates the faust app, the process's shared components (settings,
store service, encoder) in a `streams.context.RoleContext`, and calls the entry
point of each role the worker runs; ``/health`` and ``/metrics`` read the context.

Decisions:
- The write role reads raw bytes so a malformed record can be dead-lettered
  with its original bytes; decoding is the pipeline's job.
- The write role's consumer is a plain aiokafka consumer group inside a Service
  (`streams.write.consumer.WriteConsumer`), not a faust agent: faust's consumer
  hands records over in bursts with a fixed fetch wait. Offsets are committed
  only after Milvus and the broker acknowledged a micro-batch, so an outage
  stalls consumption instead of skipping records, and a replay duplicates
  nothing (stable ids, idempotent upserts).
- Operator state is not kept in faust Tables (faust refuses table writes from
  ``take()`` batches): each (tenant, input partition)'s state is snapshotted to
  the compacted ``models`` topic and read back on assignment
  (`streams.write.consumer`). Late outcomes (``retro``) remain a faust agent:
  they are rare; with several write workers an outcome finds its episode's
  window only where that episode's partition is held.
- Torch work and Milvus calls run in a worker thread (`asyncio.to_thread`),
  never on the event loop, so heartbeats and the web server stay responsive.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from typing import Any, cast

import faust
import orjson
import torch
from pydantic import ValidationError

from operators import Encoder, build_encoder
from schemas import EpisodeOutcome, encode, storage_key
from schemas.errors import ConfigError
from schemas.models import final_outcome_id
from streams.auth import KafkaGuard
from streams.clock import now_ms
from streams.codec import GUARD_ATTR, raw_topic
from streams.context import RoleContext, StartTogether, StatusFn
from streams.metrics import install_metrics
from streams.settings import Settings
from streams.settle import backlog
from streams.store import StoreService, forgotten_reason
from streams.webguard import guard_middleware
from streams.write.consumer import WriteConsumer
from streams.write.pipeline import WritePipeline
from streams.write.replays import reconcile

log = logging.getLogger("dmem")

ROLES = ("write", "respond", "jobs", "all")
#: outcomes the hindsight agent takes at a time (sorted by event time), and how long it
#: gathers them: outcomes read together are judged in the order they happened
OUTCOME_BATCH = 256
OUTCOME_BATCH_S = 0.2

__all__ = [
    "ROLES",
    "StoreService",
    "build_app",
    "faust_credentials",
    "make_encoder",
    "wire_write_path",
]


def make_encoder(settings: Settings) -> Encoder:
    e = settings.encoder
    return build_encoder(
        e.name, dim=e.dim, cache_size=e.cache_size, static_path=e.static_path, device=e.device
    )


def faust_credentials(settings: Settings) -> Any:
    """SASL/TLS for faust's own clients, from the same settings as aiokafka's."""
    k = settings.kafka
    ssl_ctx = None
    if k.security_protocol in ("SSL", "SASL_SSL"):
        import ssl

        ssl_ctx = ssl.create_default_context(cafile=k.ssl_cafile)
    if k.sasl_mechanism:
        return faust.SASLCredentials(
            username=k.sasl_username,
            password=k.sasl_password,
            mechanism=k.sasl_mechanism,
            ssl_context=ssl_ctx,
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
        # faust's own pages (/router/, /table/, /graph/, stats) expose the cluster layout
        # and table contents without auth; the worker serves only its own routes
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
        web_stats_enabled=False,
        web_application_options={"middlewares": [guard_middleware(settings)]},
    )
    # every raw topic of this app signs what the service sends (streams.codec)
    setattr(app, GUARD_ATTR, KafkaGuard.from_settings(settings))
    encoder = make_encoder(settings)
    store = StoreService(settings, encoder.dim, loop=app.loop, beacon=app.beacon)
    app.add_dependency(store)
    ctx = RoleContext(settings=settings, store=store, encoder=encoder)
    install_metrics(app, ctx)  # GET /metrics on every role
    status: dict[str, StatusFn] = {}
    if role in ("write", "all"):
        status["write"] = wire_write_path(app, ctx)
    if role in ("respond", "all"):
        from streams.jobs.access import wire_access
        from streams.respond.http import wire_respond

        # its own encoder instance: the LRU cache is not shared across threads
        status["respond"] = wire_respond(app, ctx, make_encoder(settings))
        status["access"] = wire_access(app, ctx)

    if role in ("respond", "jobs"):  # the write path follows forgets itself (after restore)
        from streams.control import ForgetFollower, echo_to_store

        forgets = ForgetFollower(settings, [echo_to_store(store)], loop=app.loop,
                                 beacon=app.beacon)  # fmt: skip
        ctx.run(forgets)
        status["forgets"] = lambda: {
            "applied": forgets.applied,
            # keys this process hides from its reads now (its own forgets and those heard)
            "tombstones": len(store.store.tombstones) if store.store is not None else 0,
        }

    if role in ("jobs", "all"):
        from streams.jobs.credit import wire_jobs
        from streams.jobs.history import wire_history
        from streams.jobs.scheduler import wire_maintenance

        status["jobs"] = wire_jobs(app, ctx)
        status["history"] = wire_history(app, ctx)
        status["maintenance"] = wire_maintenance(app, ctx)

    wire_health(app, ctx, role, status)
    # after the store service, before faust's own services (web server, consumer)
    app.add_dependency(StartTogether(ctx.services, loop=app.loop, beacon=app.beacon))
    return app


def wire_health(app: faust.App, ctx: RoleContext, role: str, status: dict[str, StatusFn]) -> None:
    """``GET /health``: store reachability, each role's details and the settle states."""
    store = ctx.store

    @app.page("/health")
    async def health(web: Any, request: Any) -> Any:
        ok = await store.probe()
        body: dict[str, Any] = {"ok": ok, "role": role, "store_failures": store.failures}
        for name in ("write", "respond", "jobs", "maintenance", "access", "forgets"):
            if name in status:
                body[name] = status[name]()
        # each component's pending work; "settled": none anywhere in this process
        # (`dmem wait --settled` polls this)
        settle = {name: await fn() for name, fn in ctx.settle.items()}
        body["settle"] = settle
        body["settled"] = bool(ok and all(st["settled"] for st in settle.values()))
        return web.json(body, status=200 if ok else 503)

    _ = health


def wire_write_path(app: faust.App, ctx: RoleContext) -> StatusFn:
    """Wire the write consumer and the hindsight agent; returns a health-details callable."""
    settings, store = ctx.settings, ctx.store
    pipeline = WritePipeline(settings, ctx.encoder)
    # Torch intra-op threads of this process (env DMEM_TORCH_THREADS, default 1):
    # the value MLP's matrices are tiny, and on a small machine extra threads only
    # fight the broker, Milvus and the event loop.
    torch.set_num_threads(max(1, int(os.environ.get("DMEM_TORCH_THREADS", "1"))))

    memories = raw_topic(app, settings.topic("memories"))
    ctx.pipeline = pipeline
    writer = WriteConsumer(settings, pipeline, store, now_ms, loop=app.loop, beacon=app.beacon)
    ctx.run(writer)
    ctx.consumers.append(lambda: (writer.consumer, writer.committed))

    feedback = raw_topic(app, settings.topic("feedback"))

    def outcome_of(event: Any) -> EpisodeOutcome | None:
        """The episode outcome an event carries, or None (thumbs and other feedback are
        the credit job's business; it dead-letters bad and unauthenticated records)."""
        value = event.value
        try:
            data = orjson.loads(value)
            if not isinstance(data, dict) or "reward" not in data or "kind" in data:
                return None
            out = EpisodeOutcome.model_validate(data)
        except (orjson.JSONDecodeError, ValidationError):
            return None
        return out if pipeline.guard.agent_ok(out.tenant, event.key, value, event.headers) else None

    async def rescore(out: EpisodeOutcome) -> None:
        # event time, not arrival, decides what it re-scores: its episode's
        # transitions first (the wait only decides when). An outcome stamped after
        # its episode's last step goes once the write path has stored everything
        # it has seen; the wait is bounded for transitions that never come.
        waited = 0.0
        while not pipeline.caught_up(out.tenant, out.ts) and waited < settings.write.outcome_wait_s:
            if await backlog(writer.consumer, writer.committed) == 0:
                break
            await asyncio.sleep(0.05)
            waited += 0.05
        # the episode's live rows are stored before this outcome is committed: the
        # credit applier takes that commit as "every row of this outcome is in"
        await writer.stored_so_far()
        async with writer.rewriting():  # no checkpoint between the re-score and the write
            result = await asyncio.to_thread(
                pipeline.rescore, out.tenant, out.episode_id, out.reward, now_ms(), out.ts,
                out.outcome_id, out.agent_id, out.task, out.success,
            )  # fmt: skip
            log.debug("hindsight %s/%s: waited %.2f s, caught up %s, %d events",
                     out.tenant, out.episode_id, waited, pipeline.caught_up(out.tenant, out.ts),
                     len(result.events))  # fmt: skip
            # a hindsight row rewrites a stored one on purpose, keeping what it earned
            rejected, _ = await store.write(result.upserts, reconcile)
        if rejected:  # a row forgotten while its episode was open is routine: info only
            assert store.store is not None
            gone = forgotten_reason(store.store)
            refused = {k: why for k, why in rejected.items() if why != gone}
            if refused:
                log.warning("hindsight rows refused by the store: %s", refused)
            if len(refused) < len(rejected):
                log.info("hindsight rows forgotten meanwhile, not written back: %s",
                         sorted(k for k in rejected if k not in refused))  # fmt: skip
        if result.promote:
            assert store.store is not None
            move = functools.partial(store.store.move, tenant=out.tenant)  # own rows only
            await store._retry("promote", move, result.promote, "core")
        for ev in result.events:
            if storage_key(ev.tenant, ev.memory_id) not in rejected:
                await memories.send(key=ev.memory_id.encode(), value=encode(ev))

    @app.agent(feedback, name="dmem-retro")
    async def retro_agent(stream: faust.StreamT[bytes]) -> None:
        """Late outcomes: re-score the episode's eligibility window (hindsight).

        An outcome is judged against its tenant's earlier outcomes (event time), so the
        outcomes read together go in event-time order: a backlog read after a restart
        interleaves the feedback partitions in any order. Events are acknowledged (and
        committed) after their batch is processed."""
        await writer.ready_event.wait()  # not before the first assignment's states
        batches = cast(faust.Stream, stream).take_events  # StreamT's stub lacks it
        async for events in batches(OUTCOME_BATCH, within=OUTCOME_BATCH_S):
            outs = [o for o in map(outcome_of, events) if o is not None]
            outs.sort(key=lambda o: (o.tenant, o.ts if o.ts is not None else -1,
                                     o.outcome_id or final_outcome_id(o.episode_id)))  # fmt: skip
            for out in outs:
                await rescore(out)

    async def settle_state() -> dict[str, Any]:
        # uncommitted = read but not yet stored and acknowledged; the hindsight agent's
        # outcomes count until faust committed them (after the rescore was written)
        unwritten = await backlog(writer.consumer, writer.committed) if writer.ready else None
        faust_consumer = getattr(app, "_consumer", None)
        outcomes = await backlog(faust_consumer, getattr(faust_consumer, "_committed_offset",
                                                         {}))  # fmt: skip
        if getattr(app, "_assignment", None) is None:
            # before faust's first assignment (a restarted worker waits for its group to
            # rebalance) nothing is assigned, which must not read as "no outcomes left"
            outcomes = None
        pending = {"unwritten_transitions": unwritten, "unprocessed_outcomes": outcomes}
        return {"settled": unwritten == 0 and outcomes == 0, "pending": pending}

    ctx.settle["write"] = settle_state
    _ = retro_agent
    health: StatusFn = writer.health
    return health
