"""HTTP ingest on the respond role: publish to dmem without a Kafka client.

Routes (registered by `streams.respond.http.wire_respond` through `wire_ingest`):

- ``POST /v1/transitions`` -> topic ``transitions`` (key ``agent_id``),
- ``POST /v1/outcomes`` (`EpisodeOutcome`) and ``POST /v1/feedback`` (`Feedback`)
  -> topic ``feedback`` (key ``episode_id``, else ``memory_id``, else ``tenant``:
  the keys `dmem.client.Client` uses),
- ``POST /v1/usage`` (`MemoryUsage`: which served memories a decision rested on,
  what `Client.report_usage` sends) -> topic ``usage`` (key ``episode_id``); the
  record is the agent's (``source`` is set to ``agent``) and its weights are made
  shares of the decision (`schemas.models.usage_shares`), as the SDK does,
- ``GET /openapi.json``: the OpenAPI 3.1 document (`streams.respond.openapi`).

Decisions:
- Body: one JSON object, a JSON array of objects, or NDJSON (one object a line;
  ``Content-Type: application/x-ndjson``, or an ``application/json`` body that is
  not one JSON value but whose lines are). Any other Content-Type is refused with
  415 before the body is read (`streams.webguard`: a form or ``text/plain`` post is
  what a page of any site can send). At most ``ingest.max_batch`` records (default
  1000), ``2 * max_batch + 1`` lines and ``ingest.max_body_bytes`` per request,
  else 413 before anything is parsed further. The body is read from the stream
  with that bound, not with aiohttp's 1 MiB ``client_max_size``.
- Validation: the payload models of `schemas` (the stream's own), every record
  before any is produced; one bad record rejects the whole request with 422 and
  every reason (``detail``: ``{"index", "loc", "msg", "type"}`` per error). A
  request is produced whole or answered with an error: never half-validated.
- Auth (`streams.auth`): the bearer token must list every tenant of the batch
  (401 / 403 as for search); a token writes only its own tenants.
- Durability: a dedicated aiokafka producer with ``acks="all"``; 202 with the
  ids only after the broker acknowledged every record of the request.
- Backpressure: a bounded in-flight budget (``ingest.max_inflight`` records
  produced and not yet acknowledged, over all requests, and at most
  ``ingest.max_inflight_per_tenant`` of them one tenant's, so a tenant's flood
  answers that tenant 429 while the others keep their share). A request that does
  not fit gets 429 at once; nothing is queued in the worker. A broker that does
  not acknowledge within ``ingest.ack_timeout_s`` (or cannot be reached) gives
  503. Both carry ``Retry-After: ingest.retry_after_s``.
- Retries are safe for transitions: the id is stable (tenant, agent, episode,
  step), and the write path upserts by it. An outcome without an id is its
  episode's final one (``<episode_id>:final``, as the SDK and the credit job name
  it), so a retried outcome is credited once. Feedback without an id is named by
  what it says (`schemas.models.feedback_key`: memory, kind and time; an episode's
  reward is its final outcome); only a thumbs without ``ts`` gets a random id, so a
  client that retries one should send its own ``feedback_id`` or ``ts``. A
  503 after a timeout may follow a partial produce; the same retry rule makes that
  harmless.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import faust
import orjson
from aiokafka import AIOKafkaProducer
from faust.web import Request, Response, View
from mode import Service
from pydantic import BaseModel, ValidationError

from schemas import EpisodeOutcome, Feedback, IngestAccepted, MemoryUsage, Transition, encode
from schemas.models import feedback_key, final_outcome_id, usage_shares
from streams.auth import KafkaGuard
from streams.context import RoleContext
from streams.settings import IngestSettings, Settings
from streams.webguard import NDJSON_TYPES

log = logging.getLogger("dmem.ingest")


class IngestRejected(Exception):
    """A request answered with an HTTP error before anything was produced."""

    def __init__(self, status: int, error: str, detail: list[dict[str, Any]] | None = None):
        super().__init__(error)
        self.status = status
        self.error = error
        self.detail = detail


@dataclass(frozen=True)
class IngestKind:
    """One ingest route: its payload model, topic, partition key and id field."""

    path: str
    model: type[BaseModel]
    topic: str  # logical name (schemas.topics)
    id_field: str

    def key(self, rec: BaseModel) -> str:
        if isinstance(rec, Transition):
            return rec.agent_id
        tenant: str = rec.tenant  # type: ignore[attr-defined]
        return str(getattr(rec, "episode_id", None) or getattr(rec, "memory_id", None)
                   or tenant)  # fmt: skip

    def ident(self, rec: BaseModel) -> str:
        return str(getattr(rec, self.id_field))


KINDS = (
    IngestKind("/v1/transitions", Transition, "transitions", "transition_id"),
    IngestKind("/v1/outcomes", EpisodeOutcome, "feedback", "outcome_id"),
    IngestKind("/v1/feedback", Feedback, "feedback", "feedback_id"),
    IngestKind("/v1/usage", MemoryUsage, "usage", "request_id"),
)


def parse_body(body: bytes, content_type: str | None, max_records: int) -> list[Any]:
    """The records of a request body (object, array or NDJSON); raises `IngestRejected`."""
    ctype = (content_type or "").split(";")[0].strip().lower()
    items: list[Any]
    if ctype in NDJSON_TYPES:
        items = _ndjson(body, max_records)
    else:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            if body.strip().count(b"\n") == 0:
                raise IngestRejected(422, f"malformed JSON: {exc}") from exc
            items = _ndjson(body, max_records)  # several lines: NDJSON without its type
        else:
            items = data if isinstance(data, list) else [data]
    if not items:
        raise IngestRejected(422, "no records in the request body")
    if len(items) > max_records:
        raise IngestRejected(413, f"{len(items)} records in one request; at most {max_records}")
    return items


#: one record line: from its first non-blank byte to the end of the line. Blank lines
#: are skipped inside the regex engine, so a body of blank lines costs no Python loop
_LINE = re.compile(rb"[^\s][^\n]*")


def _ndjson(body: bytes, max_records: int) -> list[Any]:
    # blank lines are bounded too: room for one between records, counted at memchr speed
    # before anything is parsed (8 MiB of newlines would otherwise hold the loop)
    lines = body.count(b"\n")
    if lines > 2 * max_records + 1:
        raise IngestRejected(413, f"{lines} lines in one request; at most {2 * max_records + 1}")
    items: list[Any] = []
    errors: list[dict[str, Any]] = []
    line, seen = 1, 0  # line number of offset `seen`
    for m in _LINE.finditer(body):
        if len(items) + len(errors) >= max_records:
            raise IngestRejected(413, f"more than {max_records} records in one request")
        line += body.count(b"\n", seen, m.start())
        seen = m.start()
        try:
            items.append(orjson.loads(m.group()))
        except orjson.JSONDecodeError as exc:
            errors.append(
                {
                    "index": len(items) + len(errors),
                    "line": line,
                    "loc": [],
                    "msg": f"malformed JSON: {exc}",
                    "type": "json_invalid",
                }
            )
    if errors:
        raise IngestRejected(422, "invalid records", errors)
    return items


def validate(items: list[Any], kind: IngestKind) -> list[BaseModel]:
    """Every item as ``kind.model``, with an id; raises 422 listing every reason."""
    out: list[BaseModel] = []
    errors: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            errors.append(
                {
                    "index": i,
                    "loc": [],
                    "msg": "a record must be a JSON object",
                    "type": "model_type",
                }
            )
            continue
        if kind.model is MemoryUsage:  # an agent's report, as the SDK sends it: validated
            item = {**item, "source": "agent"}  # as one (no responder-only fields)
        try:
            rec = kind.model.model_validate(item)
        except ValidationError as exc:
            for e in json.loads(exc.json(include_url=False, include_input=False)):
                errors.append(
                    {
                        "index": i,
                        "loc": e.get("loc", []),
                        "msg": e.get("msg", ""),
                        "type": e.get("type", ""),
                    }
                )
            continue
        if isinstance(rec, EpisodeOutcome) and rec.outcome_id is None:
            rec.outcome_id = final_outcome_id(rec.episode_id)
        if isinstance(rec, Feedback) and rec.feedback_id is None:
            rec.feedback_id = feedback_key(rec)  # as the credit job names it
        if getattr(rec, kind.id_field) is None:
            setattr(rec, kind.id_field, uuid.uuid4().hex)
        if isinstance(rec, MemoryUsage):
            rec.weights = usage_shares(rec.weights)
        out.append(rec)
    if errors:
        raise IngestRejected(422, "invalid records", errors)
    return out


class InflightBudget:
    """Records produced and not yet acknowledged, bounded over all tenants and per tenant;
    `take` never waits. A request is charged to each of its tenants for its records."""

    def __init__(self, limit: int, per_tenant: int | None = None) -> None:
        if limit < 1 or (per_tenant is not None and per_tenant < 1):
            raise ValueError("in-flight budget must be >= 1")
        self.limit = limit
        self.per_tenant = min(per_tenant or limit, limit)
        self.used = 0
        self.by_tenant: dict[str, int] = {}

    def refusal(self, counts: Mapping[str, int]) -> str | None:
        """Why a request of ``counts`` (records per tenant) does not fit now, or None."""
        for tenant, n in sorted(counts.items()):
            held = self.by_tenant.get(tenant, 0)
            if held + n > self.per_tenant:
                return (f"ingest budget of tenant {tenant!r} full ({held} of {self.per_tenant} "
                        "records awaiting the broker)")  # fmt: skip
        total = sum(counts.values())
        if self.used + total > self.limit:
            return f"ingest budget full ({self.used} of {self.limit} records awaiting the broker)"
        return None

    def take(self, counts: Mapping[str, int]) -> bool:
        if self.refusal(counts) is not None:
            return False
        for tenant, n in counts.items():
            self.by_tenant[tenant] = self.by_tenant.get(tenant, 0) + n
        self.used += sum(counts.values())
        return True

    def give(self, counts: Mapping[str, int]) -> None:
        for tenant, n in counts.items():
            left = self.by_tenant.get(tenant, 0) - n
            if left > 0:
                self.by_tenant[tenant] = left
            else:  # an idle tenant holds no entry: the map stays as small as the traffic
                self.by_tenant.pop(tenant, None)
        self.used = max(0, self.used - sum(counts.values()))


class IngestProducer(Service):
    """The ingest producer (acks=all), started on first use so a worker whose broker
    is away still starts and answers 503 instead of failing."""

    def __init__(self, settings: Settings, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.cfg: IngestSettings = settings.ingest
        self.budget = InflightBudget(self.cfg.max_inflight, self.cfg.max_inflight_per_tenant)
        self.producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()
        self.accepted = 0
        self.unavailable = 0

    async def _producer(self) -> AIOKafkaProducer:
        async with self._lock:
            if self.producer is None:
                from streams.admin import kafka_client_kwargs

                p = AIOKafkaProducer(
                    acks="all",
                    linger_ms=2,
                    max_request_size=self.cfg.max_body_bytes + 65536,
                    request_timeout_ms=int(self.cfg.ack_timeout_s * 1000),
                    **kafka_client_kwargs(self.settings.kafka),
                )
                try:
                    await p.start()
                except BaseException:
                    await p.stop()
                    raise
                self.producer = p
            return self.producer

    async def on_stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
            self.producer = None

    async def produce(
        self, topic: str, records: list[tuple[bytes, bytes]], tenants: Mapping[str, int]
    ) -> None:
        """Send ``(key, value)`` records (``tenants``: how many are each tenant's); return
        once the broker acked all of them.

        Raises `IngestRejected` 429 (the budget, or a tenant's share of it, is full) or
        503 (broker away / no ack in time).
        """
        if (why := self.budget.refusal(tenants)) is not None:
            raise IngestRejected(429, why)
        self.budget.take(tenants)
        try:
            await asyncio.wait_for(self._send(topic, records), self.cfg.ack_timeout_s)
        except Exception as exc:  # noqa: BLE001 - every broker failure is a 503
            self.unavailable += 1
            log.warning("ingest to %s failed: %r", topic, exc)
            raise IngestRejected(
                503, f"broker unavailable: {type(exc).__name__} (details in the worker's log)"
            ) from exc
        finally:
            self.budget.give(tenants)
        self.accepted += len(records)

    @functools.cached_property
    def guard(self) -> KafkaGuard:
        """The HTTP caller was authenticated for these tenants: on Kafka the service
        vouches for its records (`streams.auth.KafkaGuard`; nothing when Kafka auth is off)."""
        return KafkaGuard.from_settings(self.settings)

    async def _send(self, topic: str, records: list[tuple[bytes, bytes]]) -> None:
        p = await self._producer()
        sign = self.guard.sign
        futures = [await p.send(topic, value, key=key, headers=sign(key, value) or None)
                   for key, value in records]  # fmt: skip
        await asyncio.gather(*futures)


def wire_ingest(
    app: faust.App,
    ctx: RoleContext,
    denied: Callable[..., Response | None],
    json_response: Callable[..., Response],
) -> IngestProducer:
    """Register the ingest routes and ``/openapi.json``; returns the producer service."""
    from streams.respond.openapi import openapi_document

    settings = ctx.settings
    producer = IngestProducer(settings, loop=app.loop, beacon=app.beacon)
    ctx.run(producer)
    cfg = settings.ingest

    def rejected(view: View, exc: IngestRejected) -> Response:
        body: dict[str, Any] = {"error": exc.error}
        if exc.detail is not None:
            body["detail"] = exc.detail
        resp = json_response(view, body, exc.status)
        if exc.status in (429, 503):
            resp.headers["Retry-After"] = str(cfg.retry_after_s)
        return resp

    async def read_bounded(request: Any) -> bytes:
        """The body, at most ``max_body_bytes`` (an aiohttp request under faust's view)."""
        length = request.content_length
        if length is not None and length > cfg.max_body_bytes:
            raise IngestRejected(413, f"body of {length} bytes; at most {cfg.max_body_bytes}")
        chunks: list[bytes] = []
        size = 0
        while size <= cfg.max_body_bytes:  # read() answers what has arrived: loop to EOF
            chunk = await request.content.read(cfg.max_body_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        body = b"".join(chunks)
        if len(body) > cfg.max_body_bytes:
            raise IngestRejected(413, f"body over {cfg.max_body_bytes} bytes")
        return body

    async def ingest(view: View, request: Request, kind: IngestKind) -> Response:
        if (no := denied(view, request)) is not None:
            return no
        try:
            items = parse_body(
                await read_bounded(request), request.headers.get("Content-Type"), cfg.max_batch
            )
            recs = validate(items, kind)
            tenants = Counter(str(r.tenant) for r in recs)  # type: ignore[attr-defined]
            for tenant in sorted(tenants):
                if (no := denied(view, request, tenant)) is not None:
                    return no
            await producer.produce(
                settings.topic(kind.topic),
                [(kind.key(r).encode(), encode(r)) for r in recs],
                tenants,
            )
        except IngestRejected as exc:
            return rejected(view, exc)
        out = IngestAccepted(
            accepted=len(recs), ids=[kind.ident(r) for r in recs], topic=settings.topic(kind.topic)
        )
        return json_response(view, out.model_dump(mode="json"), 202)

    def route(kind: IngestKind) -> type[View]:
        class IngestView(View):
            async def post(self, request: Request) -> Response:
                return await ingest(self, request, kind)

        IngestView.__name__ = f"Ingest{kind.model.__name__}View"
        return IngestView

    for kind in KINDS:
        app.page(kind.path)(route(kind))

    document = orjson.dumps(openapi_document(settings))

    @app.page("/openapi.json")
    class OpenAPIView(View):
        async def get(self, request: Request) -> Response:
            return self.bytes(document, content_type="application/json")

    _ = OpenAPIView
    return producer
