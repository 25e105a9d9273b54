"""Respond role wiring: the Kafka request/reply consumer and the HTTP API.

`RespondApi` holds the role's handlers over the `RoleContext`, one method per
route; `wire_respond` registers them with the faust app.

- Kafka: `RetrievalRequest` on ``dmem.retrieval.requests`` -> `RetrievalResponse`
  keyed by request_id on ``dmem.retrieval.responses`` (or the request's
  ``reply_topic``, which must itself be a responses topic of this deployment:
  a client cannot make the responder write into arbitrary topics).
  A request that fails validation or carries no valid credential is dead-lettered
  with the reason and not answered (where to answer is part of what failed); an
  error while answering a valid request is replied with ``error``.
- HTTP: ``POST /v1/search`` (JSON `RetrievalRequest`; request_id optional),
  ``GET /v1/memories/{id}?tenant=T``, ``GET /v1/memories?tenant=T`` (pages, newest
  first, with the search's filters), ``GET /v1/memories?ids=a,b`` and
  ``POST /v1/memories:batch_get`` (several ids), ``GET /v1/memories/{id}/history``
  (`streams.respond.browse`), ``DELETE /v1/memories/{id}?tenant=T`` and
  ``POST /v1/forget`` (JSON `ForgetRequest`: one memory or one agent's memories;
  audited as ``forgotten`` MemoryEvents and on ``control``, like ``dmem forget``; a
  folded id forgets its survivor, named in ``folded_into``),
  ``GET /v1/stats?tenant=T`` (row counts by partition); HTTP ingest
  (``POST /v1/transitions|outcomes|feedback``) and ``GET /openapi.json`` come
  from `streams.respond.ingest`. Validation errors are 422
  with a JSON body (malformed query parameters too: `TenantParam`, `int_param`; a
  body over the size limit is a JSON 413, `read_json`); a store failure is 503 naming
  its kind, never its text, with ``Retry-After`` when retriable (`store_failed`); an
  id of another tenant is 404, exactly like a missing one. The
  id of a transition dedup folded into another memory answers with that survivor
  (its row, plus ``folded_id``: the id asked for).
- Both paths emit `MemoryUsage` for requests with an episode_id.
- The request consumer is a plain aiokafka consumer group inside a faust
  Service (`RequestConsumer`), not a faust agent: faust's consumer hands
  records over in cycles far longer than a millisecond search. Requests are
  handled concurrently (bounded by ``respond.concurrency``); offsets are
  auto-committed because a lost request is retried by the client with the
  same request_id. Its fetch wait is short while requests come and longer after
  ``respond.idle_after_s`` without one (`FetchWait`): the embedded broker answers
  a fetch only when the wait expires, so an idle short wait is ~200 empty fetches
  a second on the event loop that also serves HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import faust
import orjson
from aiohttp import web
from aiokafka import AIOKafkaConsumer
from faust.web import Request, Response, View
from mode import Service
from pydantic import BaseModel, ValidationError

from operators import Encoder
from operators.retrieval import RankPolicy
from schemas import (
    BatchGetRequest,
    ForgetRequest,
    MemoryEvent,
    MemoryListQuery,
    RetrievalRequest,
    RetrievalResponse,
    encode,
)
from schemas.errors import DmemError, InvalidRecord, StoreUnavailable
from schemas.limits import LIMITS
from schemas.models import Ident
from streams.admin import group_consumer
from streams.auth import UNAUTHENTICATED, Authorizer, KafkaGuard
from streams.clock import now_ms
from streams.codec import raw_topic
from streams.context import RoleContext, StatusFn
from streams.jobs.forget import ForgetIncomplete, forget_scope
from streams.metrics import count_dead_letter, tenant_label
from streams.respond.browse import MemoryReader, ascii_int, list_query, unknown_params
from streams.respond.fair import TenantBusy, TenantLimiter
from streams.respond.ingest import wire_ingest
from streams.respond.replies import KafkaReplies
from streams.respond.responder import Responder
from streams.respond.ui import wire_ui
from streams.settings import Settings
from streams.write.pipeline import RawRecord, dead_letter, validation_reason

log = logging.getLogger("dmem.respond")

#: threads of a worker's searches and reads (each waits on Milvus most of its time)
READ_THREADS = 8


def set_fetch_wait(consumer: Any, ms: int) -> bool:
    """Make a started aiokafka consumer's next fetches wait at most ``ms`` (its fetcher
    reads the wait for every fetch request); False when this aiokafka keeps it elsewhere."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None or not hasattr(fetcher, "_fetch_max_wait_ms"):
        return False
    fetcher._fetch_max_wait_ms = ms  # noqa: SLF001 - no public setter in aiokafka
    return True


class FetchWait:
    """The request consumer's fetch wait: ``short`` while requests come, ``idle`` once
    none came for ``idle_after_s`` (processing time: this is the worker's own pacing)."""

    def __init__(self, short: int, idle: int, idle_after_s: float, now: float) -> None:
        self.short, self.idle, self.idle_after_s = short, idle, idle_after_s
        self.last = now
        self.current = short

    def observe(self, got: bool, now: float) -> int | None:
        """After a poll (``got``: it returned requests): the wait to switch to, or None."""
        if got:
            self.last = now
            want = self.short
        elif now - self.last >= self.idle_after_s:
            want = self.idle
        else:
            return None
        if want == self.current:
            return None
        self.current = want
        return want


class RequestConsumer(Service):
    """Consumes retrieval requests (consumer group ``<app_id>-respond``)."""

    def __init__(self, settings: Settings, handle: Callable[[Any], Awaitable[None]],
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(**kwargs)
        self.settings = settings
        self.handle = handle
        self.sem = asyncio.Semaphore(settings.respond.concurrency)
        self.consumer: AIOKafkaConsumer | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def on_start(self) -> None:
        self.consumer = group_consumer(
            self.settings,
            self.settings.topic("requests"),
            "respond",
            auto_commit=True,
            offset_reset="latest",
            fetch_max_wait_ms=self.settings.respond.fetch_max_wait_ms,
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
        r = self.settings.respond
        wait = FetchWait(r.fetch_max_wait_ms, r.idle_fetch_max_wait_ms, r.idle_after_s,
                         time.monotonic())  # fmt: skip
        while not self.should_stop:
            batch = await self.consumer.getmany(timeout_ms=200, max_records=256)
            change = wait.observe(bool(batch), time.monotonic())
            if change is not None and not set_fetch_wait(self.consumer, change):
                wait.current = wait.short = wait.idle = r.fetch_max_wait_ms  # keep it short
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
        explore_slots=r.explore_slots,
        explore_c=r.explore_c,
        promote_max=r.promote_max,
        promote_min_uses=r.promote_min_uses,
        promote_full=r.promote_full,
        fit_margin=r.credit_fit_margin,
        span_factor=settings.maintenance.span_factor,
    )


def json_response(view: View, body: Any, status: int = 200) -> Response:
    return view.bytes(orjson.dumps(body), content_type="application/json", status=status)


def public_error(exc: BaseException) -> str:
    """What a client is told about a failure of the store or the broker: its kind, never
    its text (which names the Milvus or broker address); the worker log has the detail."""
    return f"unavailable: {type(exc).__name__} (details in the respond worker's log)"


def timed_json(view: View, body: Any, started: float, store_ms: float,
               status: int = 200) -> Response:  # fmt: skip
    """A JSON answer with ``Server-Timing``: the store read (``store``, in its worker
    thread) and the whole handler (``total``), in ms, so a client can tell the
    server's time from the network's and the store's from the rest."""
    resp = json_response(view, body, status)
    total = (time.perf_counter() - started) * 1e3
    resp.headers["Server-Timing"] = f"store;dur={store_ms:.2f}, total;dur={total:.2f}"
    return resp


def _timed_call(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t0) * 1e3


def _invalid(view: View, exc: ValidationError) -> Response:
    detail = json.loads(exc.json(include_url=False, include_input=False))
    return json_response(view, {"error": "invalid request", "detail": detail}, 422)


class TenantParam(BaseModel):
    """The ``?tenant=`` of a read: an `Ident`, as in the routes' JSON bodies."""

    tenant: Ident


def int_param(query: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """The integer query parameter ``name`` (``default`` when absent): ASCII digits only
    (no sign, no other script's digits), within ``lo..hi``; else `InvalidRecord`."""
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = ascii_int(name, raw)
    except InvalidRecord:
        value = None
    if value is None or not lo <= value <= hi:
        raise InvalidRecord(f"{name} must be an integer in {lo}..{hi}")
    return value


async def read_json(view: View, request: Request) -> tuple[Any, Response | None]:
    """A route's JSON body: (it, None), or (None, the answer): 413 over the server's
    ``client_max_size``, 422 when it is not JSON. Both JSON, like every error."""
    try:
        return orjson.loads(await request.read()), None
    except web.HTTPRequestEntityTooLarge as exc:
        return None, json_response(view, {"error": exc.text or "body too large"}, 413)
    except orjson.JSONDecodeError as exc:
        return None, json_response(view, {"error": f"malformed JSON: {exc}"}, 422)


class RespondApi:
    """The respond role's handlers: the Kafka request handler and one method per route."""

    def __init__(self, app: faust.App, ctx: RoleContext, encoder: Encoder) -> None:
        self.app = app
        self.settings = settings = ctx.settings
        self.ctx = ctx
        self.store = ctx.store
        self.encoder = encoder
        self.responses_name = settings.topic("responses")
        self.usage_topic = raw_topic(app, settings.topic("usage"))
        self.deadletters = raw_topic(app, settings.topic("deadletter"))
        self.memories = raw_topic(app, settings.topic("memories"))
        self.control = raw_topic(app, settings.topic("control"))
        self.authorizer = Authorizer.from_settings(settings)
        self.limiter = TenantLimiter(settings.respond.tenant_searches,
                                     settings.respond.tenant_search_queue)  # fmt: skip
        self.replies = KafkaReplies(app, settings, KafkaGuard.from_settings(settings))
        self._responder: Responder | None = None
        self._reader: MemoryReader | None = None
        #: searches and reads run here, not in the loop's default executor, which the
        #: write and jobs roles of the same worker fill with batch and maintenance work
        self.executor = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="dmem-read")
        self.errors = 0

    # -- shared ----------------------------------------------------------------------
    def store_ready(self) -> bool:
        return self.store.store is not None and self.store.connected.is_set()

    def responder(self) -> Responder:
        if self._responder is None:
            if not self.store_ready():
                raise StoreUnavailable("store not ready")
            s = self.settings
            self._responder = Responder(
                self.store.store,
                self.encoder,
                policy_from(s),
                count_ttl_s=s.respond.count_ttl_s,
                consistency_level=s.milvus.search_consistency,
                per_agent_clock=s.maintenance.stream_clock == "agent",
                on_access=self.ctx.record_access,
            )
        return self._responder

    async def reply_topic(self, req: RetrievalRequest) -> faust.TopicT:
        return await self.replies.topic(req)  # streams.respond.replies

    async def answer(self, req: RetrievalRequest) -> RetrievalResponse:
        """Answer in a worker thread, in the tenant's turn (`TenantBusy` when it has too
        many searches in flight)."""
        try:
            async with self.limiter.turn(req.tenant):
                resp, usage = await self.in_thread(self.responder().answer, req, now_ms())
        except InvalidRecord as exc:
            return RetrievalResponse(request_id=req.request_id, tenant=req.tenant, error=str(exc))
        if usage is not None:
            await self.usage_topic.send(key=usage.episode_id.encode(), value=encode(usage))
        return resp

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the role's own threads (`executor`)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def denied(self, view: View, request: Request, tenant: str | None = None) -> Response | None:
        """Auth check (streams.auth): None when allowed, else the 401/403 response."""
        d = self.authorizer.check(request.headers.get("Authorization"), tenant)
        if d is None:
            return None
        resp = json_response(view, {"error": d.error}, d.status)
        if d.status == 401:
            resp.headers["WWW-Authenticate"] = "Bearer"
        return resp

    def unavailable(self, view: View, error: str) -> Response:
        """503 with ``Retry-After`` (``ingest.retry_after_s``): retrying can help."""
        resp = json_response(view, {"error": error}, 503)
        resp.headers["Retry-After"] = str(self.settings.ingest.retry_after_s)
        return resp

    def store_failed(self, view: View, exc: DmemError, what: str) -> Response:
        """The answer to a failed store call: 422 with the reason for an `InvalidRecord`;
        else 503 naming the kind of failure, never its text (`public_error`), with
        ``Retry-After`` when the error is retriable. The log has the detail."""
        if isinstance(exc, InvalidRecord):
            return json_response(view, {"error": str(exc)}, 422)
        log.warning("%s failed: %s", what, exc)
        if exc.retriable:
            return self.unavailable(view, public_error(exc))
        return json_response(view, {"error": public_error(exc)}, 503)

    def tenant_query(
        self, view: View, request: Request, allowed: Collection[str] | None = ("tenant",)
    ) -> tuple[str, Response | None]:
        """The ``?tenant=`` of a read, authorised, with the store ready; else the answer.

        ``allowed``: the route's query parameters; any other is a 422 naming it (a
        misspelt ``limit`` or an ``agent_id`` the route does not filter by would
        otherwise answer as if it were not there). None: the route checks its own.
        """
        if (no := self.denied(view, request)) is not None:
            return "", no
        tenant = request.query.get("tenant")
        if not tenant:
            return "", json_response(view, {"error": "query parameter tenant is required"}, 422)
        try:
            TenantParam(tenant=tenant)
        except ValidationError as exc:
            return "", _invalid(view, exc)
        if (no := self.denied(view, request, tenant)) is not None:
            return "", no
        if allowed is not None and (why := unknown_params(request.query, allowed)):
            return "", json_response(view, {"error": why}, 422)
        if not self.store_ready():
            return "", self.unavailable(view, "store not ready")
        return tenant, None

    # -- Kafka: dmem.retrieval.requests ------------------------------------------------
    async def handle(self, msg: Any) -> None:
        now = now_ms()
        try:
            req = RetrievalRequest.model_validate(orjson.loads(msg.value or b""))
            if not self.replies.admit(req, msg):  # no credential for its tenant: no reply
                raise PermissionError(UNAUTHENTICATED)
            topic = await self.reply_topic(req)
        except (ValidationError, orjson.JSONDecodeError, InvalidRecord, PermissionError) as exc:
            raw = RawRecord(msg.value, msg.key, msg.topic, msg.partition, msg.offset)
            why = UNAUTHENTICATED if isinstance(exc, PermissionError) else validation_reason(exc)
            kind = "Unauthenticated" if isinstance(exc, PermissionError) else type(exc).__name__
            dl = dead_letter(raw, why, kind, "respond", now)
            await self.deadletters.send(key=msg.key, value=encode(dl))
            count_dead_letter(dl)
            self.errors += 1
            return
        try:
            resp = await self.answer(req)
        except TenantBusy as exc:  # says nothing but the tenant's own count
            resp = RetrievalResponse(request_id=req.request_id, tenant=req.tenant, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - answer with the error, keep serving
            log.warning("search failed for %s: %s", req.request_id, exc)
            self.errors += 1
            resp = RetrievalResponse(
                request_id=req.request_id, tenant=req.tenant, error=public_error(exc)
            )
        await topic.send(key=req.request_id.encode(), value=encode(resp))

    # -- HTTP routes -------------------------------------------------------------------
    async def search(self, view: View, request: Request) -> Response:
        """``POST /v1/search``."""
        if (no := self.denied(view, request)) is not None:
            return no
        body, no = await read_json(view, request)
        if no is not None:
            return no
        if isinstance(body, dict) and "request_id" not in body:
            body["request_id"] = uuid.uuid4().hex
        try:
            req = RetrievalRequest.model_validate(body)
        except ValidationError as exc:
            return _invalid(view, exc)
        if (no := self.denied(view, request, req.tenant)) is not None:
            return no
        try:
            resp = await self.answer(req)
        except TenantBusy as exc:
            busy = json_response(view, {"error": str(exc)}, 429)
            busy.headers["Retry-After"] = "1"
            return busy
        except DmemError as exc:
            return self.store_failed(view, exc, f"search {req.request_id}")
        status = 422 if resp.error and not resp.error.startswith("unavailable") else 200
        return json_response(view, resp.model_dump(mode="json", by_alias=True), status)

    def reader(self) -> MemoryReader:
        if self._reader is None:
            assert self.store.store is not None  # store_ready
            store = self.store.store  # its fold edges: those the jobs of this process see too
            self._reader = MemoryReader(store, self.settings.milvus.search_consistency,
                                        store.history.edges)  # fmt: skip
        return self._reader

    async def _read(self, view: View, fn: Callable[..., Any],
                    *args: Any) -> tuple[Any, float, Response | None]:  # fmt: skip
        """A store read in a worker thread: (its result, its ms, None), or the 422 / 503
        answer when it fails (`store_failed`)."""
        try:
            out, ms = await self.in_thread(_timed_call, fn, *args)
        except DmemError as exc:
            return None, 0.0, self.store_failed(view, exc, f"read {fn.__name__}")
        return out, ms, None

    async def get_memory(self, view: View, request: Request, memory_id: str) -> Response:
        """``GET /v1/memories/{id}?tenant=T``: a folded id answers with its survivor."""
        started = time.perf_counter()
        tenant, no = self.tenant_query(view, request)
        if no is not None:
            return no
        rows, ms, no = await self._read(view, self.reader().get, tenant, [memory_id])
        if no is not None:
            return no
        if memory_id not in rows:
            return timed_json(view, {"error": "not found"}, started, ms, 404)
        return timed_json(view, rows[memory_id], started, ms)

    async def batch_get(self, view: View, request: Request) -> Response:
        """``POST /v1/memories:batch_get`` (JSON `BatchGetRequest`)."""
        started = time.perf_counter()
        if (no := self.denied(view, request)) is not None:
            return no
        body, no = await read_json(view, request)
        if no is not None:
            return no
        try:
            req = BatchGetRequest.model_validate(body)
        except ValidationError as exc:
            return _invalid(view, exc)
        if (no := self.denied(view, request, req.tenant)) is not None:
            return no
        if not self.store_ready():
            return self.unavailable(view, "store not ready")
        return await self._many(view, req.tenant, req.ids, started)

    async def _many(self, view: View, tenant: str, ids: list[str], started: float) -> Response:
        rows, ms, no = await self._read(view, self.reader().get, tenant, ids)
        if no is not None:
            return no
        want = list(dict.fromkeys(ids))
        return timed_json(view, {"tenant": tenant,
                                 "memories": [rows[i] for i in want if i in rows],
                                 "missing": [i for i in want if i not in rows]},
                          started, ms)  # fmt: skip

    async def list_memories(self, view: View, request: Request) -> Response:
        """``GET /v1/memories?tenant=T[&limit=N&cursor=C&filters]`` (or ``?ids=a,b``)."""
        started = time.perf_counter()
        tenant, no = self.tenant_query(view, request, allowed=None)  # `list_query` checks
        if no is not None:
            return no
        params = dict(request.query)
        if "ids" in params:
            if why := unknown_params(params, ("tenant", "ids")):  # no filter applies to ids
                return json_response(view, {"error": why}, 422)
            ids = [i for i in params.pop("ids").split(",") if i]
            try:
                req = BatchGetRequest.model_validate({"tenant": tenant, "ids": ids})
            except ValidationError as exc:
                return _invalid(view, exc)
            return await self._many(view, req.tenant, req.ids, started)
        try:
            q = MemoryListQuery.model_validate(list_query(params))
        except ValidationError as exc:
            return _invalid(view, exc)
        except InvalidRecord as exc:
            return json_response(view, {"error": str(exc)}, 422)
        page, ms, no = await self._read(view, self.reader().page, q)
        if no is not None:
            return no
        memories, nxt = page
        return timed_json(view, {"tenant": tenant, "memories": memories, "next_cursor": nxt},
                          started, ms)  # fmt: skip

    async def history(self, view: View, request: Request, memory_id: str) -> Response:
        """``GET /v1/memories/{id}/history?tenant=T[&limit=N]``: its events, oldest first."""
        started = time.perf_counter()
        tenant, no = self.tenant_query(view, request, allowed=("tenant", "limit"))
        if no is not None:
            return no
        try:
            limit = int_param(request.query, "limit", 200, 1, LIMITS.max_history)
        except InvalidRecord as exc:
            return json_response(view, {"error": str(exc)}, 422)
        events, ms, no = await self._read(view, self.reader().history, tenant, memory_id, limit)
        if no is not None:
            return no
        if not events:
            return json_response(view, {"error": "not found"}, 404)
        return timed_json(view, {"tenant": tenant, "memory_id": memory_id, "events": events},
                          started, ms)  # fmt: skip

    async def delete_memory(self, view: View, request: Request, memory_id: str) -> Response:
        """``DELETE /v1/memories/{id}?tenant=T``: 404 when nothing matched."""
        if not request.query.get("tenant"):  # as the reads say it
            if (no := self.denied(view, request)) is not None:
                return no
            return json_response(view, {"error": "query parameter tenant is required"}, 422)
        if why := unknown_params(request.query, ("tenant",)):
            if (no := self.denied(view, request)) is not None:
                return no
            return json_response(view, {"error": why}, 422)
        body = {"tenant": request.query.get("tenant"), "memory_id": memory_id}
        return await self._forget(view, request, body, missing=404)

    async def forget(self, view: View, request: Request) -> Response:
        """``POST /v1/forget``: authenticated before the body is read."""
        if (no := self.denied(view, request)) is not None:
            return no
        body, no = await read_json(view, request)
        if no is not None:
            return no
        return await self._forget(view, request, body)

    async def _forget(self, view: View, request: Request, body: Any,
                      missing: int = 200) -> Response:  # fmt: skip
        """Validate, authorise, delete the scope, audit it; ``missing`` when nothing matched."""
        if (no := self.denied(view, request)) is not None:
            return no
        try:
            req = ForgetRequest.model_validate(body)
        except ValidationError as exc:
            return _invalid(view, exc)
        if (no := self.denied(view, request, req.tenant)) is not None:
            return no
        if not self.store_ready():
            return self.unavailable(view, "store not ready")
        store = self.store.store
        assert store is not None  # store_ready
        try:
            events = await asyncio.to_thread(
                forget_scope, store, req.tenant, agent_id=req.agent_id, memory_id=req.memory_id
            )
        except ForgetIncomplete as exc:  # what was deleted is audited and announced
            await self._announce(exc.events)
            return self.store_failed(view, exc, f"forget for {req.tenant}")
        except DmemError as exc:
            return self.store_failed(view, exc, f"forget for {req.tenant}")
        await self._announce(events)
        status = missing if not events else 200
        out: dict[str, Any] = {"tenant": req.tenant, "forgotten": len(events)}
        if req.memory_id is not None and events and events[0].memory_id != req.memory_id:
            out["folded_into"] = events[0].memory_id  # the survivor that held its content
        return json_response(view, out, status)

    async def _announce(self, events: Sequence[MemoryEvent]) -> None:
        """``forgotten`` events on ``memories`` (the audit trail, as `dmem forget`) and on
        ``control`` (every process clears its state of them)."""
        for ev in events:
            await self.memories.send(key=ev.memory_id.encode(), value=encode(ev))
            await self.control.send(key=ev.tenant.encode(), value=encode(ev))

    async def stats(self, view: View, request: Request) -> Response:
        """``GET /v1/stats?tenant=T``: row counts by partition."""
        started = time.perf_counter()
        tenant, no = self.tenant_query(view, request)
        if no is not None:
            return no
        counts, ms, no = await self._read(view, self._counts, tenant)
        if no is not None:
            return no
        return timed_json(view, {"tenant": tenant, **counts, "total": sum(counts.values()),
                                 "metrics_label": tenant_label(tenant)}, started, ms)  # fmt: skip

    def _counts(self, tenant: str) -> dict[str, int]:
        st = self.store.store
        assert st is not None  # store_ready
        return {p: st.count(p, tenant) for p in ("core", "buffer")}

    @property
    def answered(self) -> int:
        return self._responder.answered if self._responder else 0


def wire_respond(app: faust.App, ctx: RoleContext, encoder: Encoder) -> StatusFn:
    """Wire the request consumer and the HTTP routes; returns a health-details callable.

    `encoder` is the role's own instance (its LRU cache is not shared across threads).
    """
    api = RespondApi(app, ctx, encoder)
    consumer = RequestConsumer(ctx.settings, api.handle, loop=app.loop, beacon=app.beacon)
    ctx.run(consumer)

    @app.page("/v1/search")
    class SearchView(View):
        async def post(self, request: Request) -> Response:
            return await api.search(self, request)

    @app.page("/v1/memories")
    class MemoriesView(View):
        async def get(self, request: Request) -> Response:
            return await api.list_memories(self, request)

    @app.page("/v1/memories:batch_get")
    class BatchGetView(View):
        async def post(self, request: Request) -> Response:
            return await api.batch_get(self, request)

    @app.page("/v1/memories/{memory_id}/history")
    class HistoryView(View):
        async def get(self, request: Request, memory_id: str) -> Response:
            return await api.history(self, request, memory_id)

    @app.page("/v1/memories/{memory_id}")
    class MemoryView(View):
        async def get(self, request: Request, memory_id: str) -> Response:
            return await api.get_memory(self, request, memory_id)

        async def delete(self, request: Request, memory_id: str) -> Response:
            return await api.delete_memory(self, request, memory_id)

    @app.page("/v1/forget")
    class ForgetView(View):
        async def post(self, request: Request) -> Response:
            return await api.forget(self, request)

    @app.page("/v1/stats")
    class StatsView(View):
        async def get(self, request: Request) -> Response:
            return await api.stats(self, request)

    _ = (SearchView, MemoriesView, BatchGetView, HistoryView, MemoryView, ForgetView, StatsView)
    ingest = wire_ingest(app, ctx, api.denied, json_response)  # POST /v1/transitions ...
    live = wire_ui(app, ctx, api.authorizer, api.denied, json_response)  # GET /ui/, /v1/live
    return lambda: {
        "answered": api.answered,
        "errors": api.errors,
        "busy_refused": api.limiter.refused,
        "live": live(),
        "ingested": ingest.accepted,
        "ingest_unavailable": ingest.unavailable,
    }
