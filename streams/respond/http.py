"""Respond role wiring: the Kafka request/reply agent and the HTTP API.

- Kafka: `RetrievalRequest` on ``dmem.retrieval.requests`` -> `RetrievalResponse`
  keyed by request_id on ``dmem.retrieval.responses`` (or the request's
  ``reply_topic``, which must itself be a responses topic of this deployment:
  a client cannot make the responder write into arbitrary topics).
  Bad requests are dead-lettered *and* answered with an error when they carry
  a usable request_id, so a client never waits for a timeout on a typo.
- HTTP: ``POST /v1/search`` (JSON `RetrievalRequest`; request_id optional),
  ``GET /v1/memories/{id}?tenant=T``, ``DELETE /v1/memories/{id}?tenant=T`` and
  ``POST /v1/forget`` (JSON `ForgetRequest`: one memory or one agent's memories;
  audited as ``forgotten`` MemoryEvents and on ``control``, like ``dmem forget``),
  ``GET /v1/stats?tenant=T`` (row counts by partition); HTTP ingest
  (``POST /v1/transitions|outcomes|feedback``) and ``GET /openapi.json`` come
  from `streams.respond.ingest`. Validation errors are 422
  with a JSON body; an id of another tenant is 404, exactly like a missing one. The
  id of a transition dedup folded into another memory answers with that survivor
  (its row, plus ``folded_id``: the id asked for).
- Both paths emit `MemoryUsage` for requests with an episode_id.
- The request consumer is a plain aiokafka consumer group inside a faust
  Service (`RequestConsumer`), not a faust agent: faust's consumer thread hands
  records over in ~0.3-0.7 s cycles against the embedded broker (measured:
  an echo agent saw 115-740 ms per record, raw aiokafka 4 ms), which would
  dominate a millisecond search. Requests are handled concurrently (bounded by
  ``respond.concurrency``); offsets are auto-committed because a lost request
  is retried by the client with the same request_id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import Any

import faust
import orjson
from aiokafka import AIOKafkaConsumer
from faust.web import Request, Response, View
from mode import Service
from pydantic import ValidationError

from operators import Encoder
from operators.retrieval import RankPolicy
from schemas import ForgetRequest, RetrievalRequest, RetrievalResponse, encode
from schemas.errors import DmemError, InvalidRecord
from streams.settings import Settings
from streams.write.pipeline import RawRecord, dead_letter, validation_reason

log = logging.getLogger("dmem.respond")


class RequestConsumer(Service):
    """Consumes retrieval requests (consumer group ``<app_id>-respond``)."""

    def __init__(self, settings: Settings, handle: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.handle = handle
        self.sem = asyncio.Semaphore(settings.respond.concurrency)
        self.consumer: AIOKafkaConsumer | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def on_start(self) -> None:
        from streams.admin import group_consumer

        self.consumer = group_consumer(
            self.settings, self.settings.topic("requests"), "respond", auto_commit=True,
            offset_reset="latest", fetch_max_wait_ms=self.settings.respond.fetch_max_wait_ms,
        )
        await self.consumer.start()
        self.add_future(self._run())

    async def on_stop(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        if self.consumer is not None:
            await self.consumer.stop()

    async def _one(self, msg: Any) -> None:
        try:
            await self.handle(msg)
        finally:
            self.sem.release()

    async def _run(self) -> None:
        assert self.consumer is not None
        while not self.should_stop:
            batch = await self.consumer.getmany(timeout_ms=200, max_records=256)
            for msgs in batch.values():
                for msg in msgs:
                    await self.sem.acquire()
                    task = asyncio.ensure_future(self._one(msg))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)


def policy_from(settings: Settings) -> RankPolicy:
    r = settings.respond
    return RankPolicy.hybrid(
        half_life_ms=r.half_life_s * 1000.0,
        lambda_hi=r.lambda_hi,
        lambda_lo=r.lambda_lo,
        young=r.young,
        mature=r.mature,
        explore=r.explore,
        lambda_evidence=r.lambda_evidence,
        explore_ranks=r.explore_ranks,
    )


def wire_respond(app: faust.App, settings: Settings, encoder: Encoder, store: Any) -> Any:
    """Wire the responder agent and HTTP views; returns a health-details callable."""
    from streams.clock import now_ms
    from streams.codec import raw_topic
    from streams.respond.responder import Responder

    responses_name = settings.topic("responses")
    usage_topic = raw_topic(app, settings.topic("usage"))
    deadletters = raw_topic(app, settings.topic("deadletter"))
    reply_topics: dict[str, faust.TopicT] = {responses_name: raw_topic(app, responses_name)}
    state: dict[str, Any] = {"responder": None, "errors": 0}

    def responder() -> Responder:
        if state["responder"] is None:
            if store.store is None or not store.connected.is_set():
                raise DmemError("store not ready")
            state["responder"] = Responder(
                store.store, encoder, policy_from(settings),
                count_ttl_s=settings.respond.count_ttl_s,
                consistency_level=settings.milvus.search_consistency,
                per_agent_clock=settings.maintenance.stream_clock == "agent",
            )
        r: Responder = state["responder"]
        return r

    def reply_topic(req: RetrievalRequest) -> faust.TopicT:
        name = req.reply_topic or responses_name
        if not name.startswith(responses_name):
            raise InvalidRecord(f"reply_topic must start with {responses_name!r}")
        if name not in reply_topics:
            reply_topics[name] = raw_topic(app, name)
        return reply_topics[name]

    async def answer(req: RetrievalRequest) -> RetrievalResponse:
        try:
            resp, usage = await asyncio.to_thread(responder().answer, req, now_ms())
        except InvalidRecord as exc:
            return RetrievalResponse(request_id=req.request_id, tenant=req.tenant,
                                     error=str(exc))
        if usage is not None:
            await usage_topic.send(key=usage.episode_id.encode(), value=encode(usage))
        return resp

    async def handle(msg: Any) -> None:
        now = now_ms()
        try:
            req = RetrievalRequest.model_validate(orjson.loads(msg.value or b""))
            topic = reply_topic(req)
        except (ValidationError, orjson.JSONDecodeError, InvalidRecord) as exc:
            raw = RawRecord(msg.value, msg.key, msg.topic, msg.partition, msg.offset)
            dl = dead_letter(raw, validation_reason(exc), type(exc).__name__, "respond", now)
            await deadletters.send(key=msg.key, value=encode(dl))
            state["errors"] += 1
            return
        try:
            resp = await answer(req)
        except Exception as exc:  # noqa: BLE001 - answer with the error, keep serving
            log.warning("search failed for %s: %s", req.request_id, exc)
            state["errors"] += 1
            resp = RetrievalResponse(request_id=req.request_id, tenant=req.tenant,
                                     error=f"unavailable: {exc}")
        await topic.send(key=req.request_id.encode(), value=encode(resp))

    consumer = RequestConsumer(settings, handle, loop=app.loop, beacon=app.beacon)
    app.add_dependency(consumer)

    def json_response(view: View, body: Any, status: int = 200) -> Response:
        return view.bytes(orjson.dumps(body), content_type="application/json", status=status)

    from streams.auth import Authorizer

    authorizer = Authorizer.from_settings(settings)

    def denied(view: View, request: Request, tenant: str | None = None) -> Response | None:
        """Auth check (streams.auth): None when allowed, else the 401/403 response."""
        d = authorizer.check(request.headers.get("Authorization"), tenant)
        if d is None:
            return None
        resp = json_response(view, {"error": d.error}, d.status)
        if d.status == 401:
            resp.headers["WWW-Authenticate"] = "Bearer"
        return resp

    @app.page("/v1/search")
    class SearchView(View):
        async def post(self, request: Request) -> Response:
            if (no := denied(self, request)) is not None:
                return no
            try:
                body = orjson.loads(await request.read())
            except orjson.JSONDecodeError as exc:
                return json_response(self, {"error": f"malformed JSON: {exc}"}, 422)
            if isinstance(body, dict) and "request_id" not in body:
                body["request_id"] = uuid.uuid4().hex
            try:
                req = RetrievalRequest.model_validate(body)
            except ValidationError as exc:
                detail = json.loads(exc.json(include_url=False, include_input=False))
                return json_response(self, {"error": "invalid request", "detail": detail}, 422)
            if (no := denied(self, request, req.tenant)) is not None:
                return no
            try:
                resp = await answer(req)
            except DmemError as exc:
                return json_response(self, {"error": str(exc)}, 503)
            status = 422 if resp.error and not resp.error.startswith("unavailable") else 200
            return json_response(self, resp.model_dump(mode="json", by_alias=True), status)

    def tenant_query(view: View, request: Request) -> tuple[str, Response | None]:
        """The ``?tenant=`` of a read, authorised, with the store ready; else the answer."""
        if (no := denied(view, request)) is not None:
            return "", no
        tenant = request.query.get("tenant")
        if not tenant:
            return "", json_response(view, {"error": "query parameter tenant is required"}, 422)
        if (no := denied(view, request, tenant)) is not None:
            return "", no
        if store.store is None or not store.connected.is_set():
            return "", json_response(view, {"error": "store not ready"}, 503)
        return tenant, None

    @app.page("/v1/memories/{memory_id}")
    class MemoryView(View):
        async def get(self, request: Request, memory_id: str) -> Response:
            tenant, no = tenant_query(self, request)
            if no is not None:
                return no
            try:
                rows = await asyncio.to_thread(store.store.get, [memory_id], tenant=tenant)
            except InvalidRecord as exc:
                return json_response(self, {"error": str(exc)}, 422)
            if not rows:  # folded into a survivor by dedup: the survivor stands for it
                into = await asyncio.to_thread(store.store.survivors_of, tenant, [memory_id])
                if memory_id not in into:
                    return json_response(self, {"error": "not found"}, 404)
                rows = [{**into[memory_id], "folded_id": memory_id}]
            row = rows[0]
            row.pop("vector", None)
            return json_response(self, row)

        async def delete(self, request: Request, memory_id: str) -> Response:
            body = {"tenant": request.query.get("tenant"), "memory_id": memory_id}
            return await forget_view(self, request, body, missing=404)

    memories = raw_topic(app, settings.topic("memories"))
    control = raw_topic(app, settings.topic("control"))

    async def forget_view(view: View, request: Request, body: Any,
                          missing: int = 200) -> Response:
        """Validate, authorise, delete the scope, audit it; ``missing`` when nothing matched."""
        from streams.jobs.maintenance import forget_scope

        if (no := denied(view, request)) is not None:
            return no
        try:
            req = ForgetRequest.model_validate(body)
        except ValidationError as exc:
            detail = json.loads(exc.json(include_url=False, include_input=False))
            return json_response(view, {"error": "invalid request", "detail": detail}, 422)
        if (no := denied(view, request, req.tenant)) is not None:
            return no
        if store.store is None or not store.connected.is_set():
            return json_response(view, {"error": "store not ready"}, 503)
        events = await asyncio.to_thread(forget_scope, store.store, req.tenant,
                                         agent_id=req.agent_id, memory_id=req.memory_id)
        for ev in events:  # the same audit trail as `dmem forget`
            await memories.send(key=ev.memory_id.encode(), value=encode(ev))
            await control.send(key=ev.tenant.encode(), value=encode(ev))
        status = missing if not events else 200
        return json_response(view, {"tenant": req.tenant, "forgotten": len(events)}, status)

    @app.page("/v1/forget")
    class ForgetView(View):
        async def post(self, request: Request) -> Response:
            try:
                body = orjson.loads(await request.read())
            except orjson.JSONDecodeError as exc:
                return json_response(self, {"error": f"malformed JSON: {exc}"}, 422)
            return await forget_view(self, request, body)

    @app.page("/v1/stats")
    class StatsView(View):
        async def get(self, request: Request) -> Response:
            tenant, no = tenant_query(self, request)
            if no is not None:
                return no
            st = store.store
            counts = await asyncio.to_thread(
                lambda: {p: st.count(p, tenant) for p in ("core", "buffer")})
            return json_response(self, {"tenant": tenant, **counts,
                                        "total": sum(counts.values())})

    from streams.respond.ingest import wire_ingest

    ingest = wire_ingest(app, settings, denied, json_response)  # POST /v1/transitions ...
    _ = (SearchView, MemoryView, ForgetView, StatsView)
    from streams.respond.ui import wire_ui  # the live page: GET /ui/, GET /v1/live

    live = wire_ui(app, settings, store, authorizer, denied, json_response)
    return lambda: {
        "answered": state["responder"].answered if state["responder"] else 0,
        "errors": state["errors"],
        "live": live(),
        "ingested": ingest.accepted,
        "ingest_unavailable": ingest.unavailable,
    }
