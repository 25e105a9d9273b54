"""Client SDK for agents: publish transitions, search memories, report outcomes.

Importable without a worker (only aiokafka, aiohttp and `schemas`).

- Kafka transport (default): requests go to ``dmem.retrieval.requests``; the
  client reads ``dmem.retrieval.responses`` (all partitions, from the end, no
  consumer group) and correlates by request_id. A timed-out search is retried
  with the *same* request_id (`retries`), so a responder restart loses nothing
  the client retries, and a late duplicate answer is simply ignored.
- Latency (see BENCHMARKS.md "Retrieval"): requests are sent with
  ``linger_ms=0``; the response consumer fetches with ``fetch_max_wait_ms``
  (default 5) because the embedded Tansu broker holds a fetch for its whole
  max wait even when a record arrives (20 ms cost ~7 ms median per request).
  Short fetches cost CPU, so the response partitions are *paused* while no
  search is waiting (no fetches at all when idle) and resumed before a request
  is sent; a resume starts a fetch at once.
- HTTP transport: searches are ``POST {http_url}/v1/search`` and every write goes to
  the worker's ingest routes (``POST /v1/transitions``, ``/v1/outcomes``,
  ``/v1/feedback``, ``/v1/usage``) as JSON arrays of at most `INGEST_BATCH` records,
  with the bearer token; the client needs no Kafka broker at all. A write returns
  once the server answered 202 for every record (it answers only after the broker
  acknowledged them all); a refused record is an error, never a success.
- Credentials (``token``): the API token is the HTTP bearer token and signs
  every record the client produces on Kafka (`schemas.credentials`: an HMAC
  under a key derived from the token for the record's tenant), which a
  deployment with Kafka auth on requires. With a token the client asks for its
  replies on its tenant's own topic, ``<responses>.<tenant>`` (created if
  missing), and reads only that one.
- `SyncClient` runs the async client on a private event loop thread for
  agents that are not async.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from pydantic import BaseModel, ValidationError
from yarl import URL

from schemas import (
    LIMITS,
    EpisodeOutcome,
    Feedback,
    Hit,
    IngestAccepted,
    MemoryUsage,
    RetrievalRequest,
    RetrievalResponse,
    SearchFilters,
    Transition,
    encode,
)
from schemas.credentials import Headers, TenantSigner, reply_topic_for
from schemas.errors import (
    BrokerUnavailable,
    ConfigError,
    DmemError,
    InvalidRecord,
    ServiceUnavailable,
)
from schemas.models import (
    IDENT_PATTERN,
    MAX_TOPIC_CHARS,
    final_outcome_id,
    fit_id,
    is_ident,
    usage_shares,
)
from schemas.topics import topic_name

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

#: most records, and most body bytes, in one ingest request: under the worker's default
#: ``ingest.max_batch`` (1000) and ``ingest.max_body_bytes`` (8 MiB), so a deployment on
#: its defaults never answers 413 to a batch the client made
INGEST_BATCH = 500
INGEST_BYTES = 4 << 20


def _share(v: object) -> bool:
    """A usage weight: a finite number >= 0 (not a bool, not a string)."""
    return (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 0)  # fmt: skip


def build(model: type[M], data: Mapping[str, Any]) -> M:
    """``model`` validated from ``data``; bad input is an `InvalidRecord` (a `DmemError`,
    not retriable) naming the field and the reason, as every SDK error is a `DmemError`."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise InvalidRecord(f"invalid {model.__name__}: {exc}") from exc


def check_http_url(url: str) -> None:
    """A base URL aiohttp can call (``http(s)://host[:port][/prefix]``); else `ConfigError`
    at once, not aiohttp's `InvalidUrlClientError` out of the first call."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port that is not a number raises here
    except ValueError as exc:
        raise ConfigError(f"http_url {url!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"http_url must be http://host:port or https://..., got {url!r}")


def check_tenant(tenant: str) -> None:
    """A tenant every record and request may name (`schemas.Ident`); else `ConfigError`
    from the constructor, not a refusal of each call later."""
    if not is_ident(tenant):
        raise ConfigError(f"tenant must be 1..{LIMITS.max_id_chars} characters of "
                          f"{IDENT_PATTERN}, got {tenant!r}")  # fmt: skip


def _read_outcome(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _batches(values: list[bytes]) -> Iterable[list[bytes]]:
    """``values`` in runs of at most `INGEST_BATCH` items and `INGEST_BYTES` bytes (a
    single larger value is a run of its own: the server says whether it fits)."""
    run: list[bytes] = []
    size = 0
    for v in values:
        if run and (len(run) >= INGEST_BATCH or size + len(v) + 1 > INGEST_BYTES):
            yield run
            run, size = [], 0
        run.append(v)
        size += len(v) + 1
    if run:
        yield run


def _sent(done: int, what: str) -> str:
    """The tail of a failed write's message: what the server had accepted before."""
    if not done:
        return f" (no {what} accepted)"
    return f" ({done} {what} accepted before this request; sending them again is safe)"


def _segment(memory_id: str) -> str:
    """``memory_id`` as one URL path segment: an id may hold ``/`` (`schemas.models.Ident`),
    which `quote` keeps by default, so ``a/b`` would name another route (a 404, or
    ``x/history`` the history of ``x``); ``%2F`` is matched as part of the id.

    The ids ``.`` and ``..`` are dot-segments, which URL normalisation removes
    (``/v1/memories/./history`` is ``/v1/memories/history``): they go as ``%2E`` and
    ``%2E%2E``, which the server's router decodes back to the id. `_http_call` sends the
    path as encoded here, so the client does not normalise it either."""
    if memory_id in (".", ".."):
        return memory_id.replace(".", "%2E")
    return quote(memory_id, safe="")


def list_params(tenant: str, limit: int, cursor: str | None, agent_id: str | None,
                filters: SearchFilters | Mapping[str, Any] | None) -> dict[str, str]:  # fmt: skip
    """The query parameters of ``GET /v1/memories`` (``meta.<key>`` for metadata)."""
    q: dict[str, str] = {"tenant": tenant, "limit": str(limit)}
    if cursor:
        q["cursor"] = cursor
    if agent_id:
        q["agent_id"] = agent_id
    f = filters if isinstance(filters, SearchFilters) else build(SearchFilters, filters or {})
    for key, value in f.model_dump(exclude_none=True, exclude={"schema_version"}).items():
        if key == "metadata_equals":
            for mk, mv in value.items():
                q[f"meta.{mk}"] = orjson.dumps(mv).decode()  # a JSON literal: "3" stays text
        else:
            q[key] = str(value)
    return q


#: the longest ``Retry-After`` the client waits before trying a call again
RETRY_AFTER_MAX_S = 30.0


def retry_after(value: str | None) -> float | None:
    """The seconds a ``Retry-After`` header asks for (at most `RETRY_AFTER_MAX_S`);
    None where it gives none, or a date (the client's own backoff then)."""
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return min(seconds, RETRY_AFTER_MAX_S)


class SearchError(DmemError):
    """The responder answered with an error (bad request: not retriable)."""


class NotFound(SearchError):
    """The HTTP API has no such memory for this tenant."""


class Unauthorized(SearchError):
    """The deployment refuses this client's token for its tenant (HTTP 401 or 403):
    none, a wrong one, or one for other tenants. Not retriable: fix the token."""


class Client:
    def __init__(
        self,
        bootstrap: str,
        tenant: str,
        *,
        topic_prefix: str = "dmem.",
        http_url: str | None = None,
        transport: str = "kafka",
        timeout_s: float = 5.0,
        retries: int = 2,
        fetch_max_wait_ms: int = 5,
        client_kwargs: dict[str, Any] | None = None,
        token: str | None = None,
    ) -> None:
        """``token``: the tenant's API token; None reads ``$DMEM_API_TOKEN`` (unset or
        empty: no token, for a deployment with auth off)."""
        if token is None:
            token = os.environ.get("DMEM_API_TOKEN") or None
        if transport not in ("kafka", "http"):
            raise ValueError("transport must be 'kafka' or 'http'")
        if transport == "http" and not http_url:
            raise ValueError("the http transport needs http_url")
        if http_url:
            check_http_url(http_url)
        check_tenant(tenant)
        self.bootstrap = bootstrap.removeprefix("kafka://")
        self.tenant = tenant
        self.prefix = topic_prefix
        self.http_url = http_url.rstrip("/") if http_url else None
        self.transport = transport
        self.timeout_s = timeout_s
        self.retries = retries
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.kw = dict(client_kwargs or {})
        self.token = token  # HTTP bearer token (streams.auth) and Kafka record credential
        self._signer = TenantSigner(token) if token else None
        #: where replies come: the tenant's own topic when signing, else the shared one
        self.reply_topic = (
            reply_topic_for(self.topic("responses"), tenant) if token else self.topic("responses")
        )
        self._producer: AIOKafkaProducer | None = None
        self._token_check: asyncio.Task[None] | None = None
        self._started = False
        self._producing = asyncio.Lock()
        self._consumer: AIOKafkaConsumer | None = None
        self._tps: list[TopicPartition] = []
        self._reader: asyncio.Task[None] | None = None
        self._waiting: dict[str, asyncio.Future[RetrievalResponse]] = {}
        self._http: aiohttp.ClientSession | None = None
        #: calls not sent twice (forget) go on a connection of their own (`_http_call`)
        self._http_fresh: aiohttp.ClientSession | None = None

    def topic(self, logical: str) -> str:
        return topic_name(logical, self.prefix)

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> Client:
        """Start what the transport needs. A failure part way stops what had started (a
        producer without its reply consumer would leak); a broker failure is
        `BrokerUnavailable`."""
        self._started = True
        try:
            await self._start()
        except BaseException as exc:
            await self.stop()
            if isinstance(exc, KafkaError):
                raise BrokerUnavailable(f"Kafka at {self.bootstrap}: {exc!r}") from exc
            raise
        return self

    async def _start(self) -> None:
        if self.transport == "kafka":
            await self._producer_ready()
        # over HTTP every call, writes included, goes to the HTTP API: no producer
        if self.transport == "kafka":
            c = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                enable_auto_commit=False,
                fetch_max_wait_ms=self.fetch_max_wait_ms,
                **self.kw,
            )
            try:
                await c.start()
            except BaseException:
                await c.stop()
                raise
            self._consumer = c
            name = self.reply_topic
            parts = c.partitions_for_topic(name)
            if not parts and self._signer is not None:
                parts = await self._own_reply_topic(c)
            if not parts:
                await c._client.force_metadata_update()  # noqa: SLF001
                parts = c.partitions_for_topic(name) or {0}
            tps = [TopicPartition(name, p) for p in sorted(parts)]
            c.assign(tps)
            await c.seek_to_end(*tps)
            for tp in tps:  # resolve the end positions now, before any request
                await c.position(tp)
            c.pause(*tps)  # nothing is waiting yet: no fetches while idle
            self._consumer, self._tps = c, tps
            self._reader = asyncio.create_task(self._read())
        if self.http_url:  # transport="http": everything; else forget, reads and stats
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
            self._http = aiohttp.ClientSession(headers=headers)

    async def _own_reply_topic(self, c: AIOKafkaConsumer) -> set[int]:
        """Create this tenant's reply topic if it is missing (a deployment whose ACLs
        deny creating it creates it beforehand), then wait for its partitions."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **self.kw)
        try:
            await admin.start()
            if self.reply_topic not in set(await admin.list_topics()):
                await admin.create_topics([NewTopic(self.reply_topic, 1, 1)])
        except (KafkaError, OSError):
            pass  # exists already, or not ours to create: wait for it below
        finally:
            await admin.close()
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            await c._client.force_metadata_update()  # noqa: SLF001
            parts = c.partitions_for_topic(self.reply_topic)
            if parts:
                return set(parts)
            await asyncio.sleep(0.1)
        return set()

    def _own_reply(self) -> str | None:
        """The reply_topic a signed Kafka request names (answered there whether or not
        the deployment enforces credentials); None: the deployment's default."""
        own = self._signer is not None and self.transport == "kafka"
        return self.reply_topic if own and len(self.reply_topic) <= MAX_TOPIC_CHARS else None

    def _headers(self, tenant: str, value: bytes) -> Headers | None:
        """The record's credential (none without a token)."""
        return self._signer.headers(tenant, value) if self._signer is not None else None

    async def _producer_ready(self) -> AIOKafkaProducer:
        """The Kafka producer, started on first use; `BrokerUnavailable` when the
        broker cannot be reached; `Unauthorized` when the deployment refuses the token
        (`_check_token`)."""
        assert self._started, "call start() first"
        await self._check_token()
        async with self._producing:
            if self._producer is None:
                p = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=0, **self.kw)
                try:
                    await p.start()
                except KafkaError as exc:
                    await p.stop()
                    raise BrokerUnavailable(f"Kafka at {self.bootstrap}: {exc}") from exc
                self._producer = p
            return self._producer

    async def _check_token(self) -> None:
        """Before the first record goes to Kafka, ask the HTTP API (when the client has
        its address) whether it accepts this client's token for its tenant: a record
        with a refused credential is dead-lettered where the agent never looks, so a
        wrong or missing token fails every write (`Unauthorized`) instead of losing
        them. Asked once per client (concurrent first writes wait for the one
        answer); unreachable, or anything but 401/403: the writes go on."""
        if self._http is None:
            return
        if self._token_check is None:
            self._token_check = asyncio.ensure_future(self._ask_token())
        await asyncio.shield(self._token_check)

    async def _ask_token(self) -> None:
        try:
            await self.stats()
        except Unauthorized as exc:
            hint = "no token is set (DMEM_API_TOKEN)" if not self.token else "check the token"
            raise Unauthorized(
                f"the deployment refuses this client's credentials for tenant "
                f"{self.tenant!r} ({exc}); {hint}: records sent to Kafka with them would be "
                "dead-lettered as unauthenticated"
            ) from exc
        except (DmemError, TimeoutError):  # unreachable, or any other answer: writes go on
            return

    async def _send(self, logical: str, tenant: str, value: bytes, key: bytes,
                    wait: bool = True) -> asyncio.Future[Any] | None:  # fmt: skip
        """Produce one record: acknowledged on return (``wait``), else its delivery future
        (the caller must await it: aiokafka's ``flush`` does not raise a failed delivery).
        A broker failure is `BrokerUnavailable`, not aiokafka's error."""
        producer = await self._producer_ready()
        topic, headers = self.topic(logical), self._headers(tenant, value)
        kw: dict[str, Any] = {"headers": headers} if headers else {}
        try:
            if wait:
                await producer.send_and_wait(topic, value, key=key, **kw)
                return None
            fut: asyncio.Future[Any] = await producer.send(topic, value, key=key, **kw)
            return fut
        except KafkaError as exc:
            raise BrokerUnavailable(f"Kafka at {self.bootstrap}: sending to {topic} failed: "
                                    f"{exc!r}") from exc  # fmt: skip

    async def stop(self) -> None:
        if self._token_check is not None and not self._token_check.done():
            self._token_check.cancel()
        if self._reader:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
        try:
            for closer in (self._consumer, self._producer):
                if closer is not None:
                    await closer.stop()
        finally:
            for session in (self._http, self._http_fresh):
                if session is not None:
                    await session.close()
        self._consumer = self._producer = None
        self._http = self._http_fresh = None
        self._started = False

    async def __aenter__(self) -> Client:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            batch = await self._consumer.getmany(timeout_ms=200)
            for msgs in batch.values():
                for m in msgs:
                    if m.key is None:
                        continue
                    fut = self._waiting.get(m.key.decode())
                    if fut is None or fut.done():
                        continue
                    try:
                        resp = RetrievalResponse.model_validate(orjson.loads(m.value))
                    except Exception as exc:  # noqa: BLE001 - surface to the caller
                        fut.set_exception(exc)
                        continue
                    # the shared topic carries every tenant's answers, keyed by request_id
                    # alone: another tenant's search under the same id is not ours
                    if resp.tenant == self.tenant:
                        fut.set_result(resp)

    # -- write side ----------------------------------------------------------
    async def publish(self, transition: Transition) -> None:
        await self.publish_many([transition])

    async def publish_many(self, transitions: Iterable[Transition]) -> int:
        """Publish transitions; returns how many, once the broker acknowledged every one.
        A broker failure is `BrokerUnavailable` saying how many were acknowledged; the
        batch may be published again (a transition's id is stable: none is stored twice).
        Over HTTP (``transport="http"``) the batch goes to ``POST /v1/transitions``.
        A transition of another tenant than the client's is `InvalidRecord`, and nothing
        is sent (`_own_tenant`)."""
        transitions = self._own_tenant(list(transitions))
        if self.transport == "http":
            return await self._ingest("/v1/transitions", transitions, "transitions")
        producer = await self._producer_ready()
        pending: list[asyncio.Future[Any]] = []
        n = 0
        try:
            for t in transitions:
                fut = await self._send("transitions", t.tenant, encode(t), t.agent_id.encode(),
                                       wait=False)  # fmt: skip
                if fut is not None:  # aiokafka's send always answers one
                    pending.append(fut)
                n += 1
            await producer.flush()
        except BaseException as exc:
            for f in pending:  # read their outcome later (no "exception never retrieved")
                f.add_done_callback(_read_outcome)
            if isinstance(exc, BrokerUnavailable):  # a send refused: say where it stopped
                raise BrokerUnavailable(
                    f"{exc} (after {n} transitions sent, their delivery not confirmed); "
                    "publishing them again is safe"
                ) from exc.__cause__
            raise
        results = await asyncio.gather(*pending, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise BrokerUnavailable(
                f"Kafka at {self.bootstrap}: {n - len(failed)} of {n} "
                f"transitions acknowledged ({failed[0]!r}); publishing them again is safe"
            ) from failed[0]
        return n

    def _own_tenant(self, transitions: list[Transition]) -> list[Transition]:
        """``transitions``, unless one is for another tenant: `InvalidRecord` naming both
        tenants. The deployment refuses such a record (HTTP 403, a dead letter on Kafka
        under auth) or, with auth off, stores it in the other tenant; outcomes, feedback
        and usage are made with the client's tenant."""
        for i, t in enumerate(transitions):
            if t.tenant != self.tenant:
                raise InvalidRecord(
                    f"transition {i} is for tenant {t.tenant!r}, this client's tenant is "
                    f"{self.tenant!r}: a client writes its own tenant's records only (one "
                    "client per tenant); nothing was sent"
                )
        return transitions

    async def publish_chat(
        self, conversation: str, session: str | int, turns: Sequence[ChatTurn], start_step: int = 0
    ) -> int:
        """Publish one session of a conversation (mapping: `chat_transitions`). A turn that
        makes no valid transition is `InvalidRecord` naming it, and nothing is sent."""
        try:
            transitions = chat_transitions(turns, tenant=self.tenant, conversation=conversation,
                                           session=session, start_step=start_step)  # fmt: skip
        except ValidationError as exc:  # as `build` says every SDK input error
            raise InvalidRecord(f"invalid Transition: {exc}") from exc
        return await self.publish_many(transitions)

    async def report_outcome(
        self,
        episode_id: str,
        reward: float,
        *,
        agent_id: str | None = None,
        success: bool | None = None,
        task: str | None = None,
        step: int | None = None,
    ) -> None:
        """The episode's final result on the feedback topic (credit). ``task``: the
        credit baseline is the running mean outcome per (tenant, agent, task), so an
        agent that plays tasks on different score scales should name the task, or a
        good outcome of a low-scoring task is judged against the others' and blames
        the memories that earned it (docs/concepts/credit.md). ``step``: the step
        that earned the outcome (its last reward), if known: usages after it are
        outside the outcome (no credit, no blame, not counted as uses)."""
        assert self._started, "call start() first"
        out = build(
            EpisodeOutcome,
            {
                "tenant": self.tenant,
                "episode_id": episode_id,
                "agent_id": agent_id,
                "task": task,
                "step": step,
                "reward": reward,
                "success": success,
                "ts": int(time.time() * 1000),
                "outcome_id": final_outcome_id(episode_id),
            },
        )
        if self.transport == "http":
            await self._ingest("/v1/outcomes", [out], "outcomes")
            return
        await self._send("feedback", self.tenant, encode(out), episode_id.encode())

    async def feedback(
        self,
        *,
        memory_id: str | None = None,
        episode_id: str | None = None,
        kind: str = "thumbs_up",
        value: float | None = None,
        agent_id: str | None = None,
    ) -> Feedback:
        """A user's thumbs on one memory (or a late reward on an episode): `Feedback`
        on the feedback topic, where the credit job turns it into utility. ``value``:
        the reward of ``kind="reward"`` (default 1.0); a thumbs credits +1 / -1 whatever
        its value (default its sign)."""
        if value is None:
            value = {"thumbs_down": -1.0}.get(kind, 1.0)
        assert self._started, "call start() first"
        fb = build(
            Feedback,
            {
                "tenant": self.tenant,
                "memory_id": memory_id,
                "episode_id": episode_id,
                "agent_id": agent_id,
                "kind": kind,
                "value": value,
                "ts": int(time.time() * 1000),
                "feedback_id": uuid.uuid4().hex,
            },
        )
        if self.transport == "http":
            await self._ingest("/v1/feedback", [fb], "feedback")
            return fb
        key = (episode_id or memory_id or self.tenant).encode()
        await self._send("feedback", self.tenant, encode(fb), key)
        return fb

    async def forget(self, *, memory_id: str | None = None, agent_id: str | None = None) -> int:
        """Delete one memory or an agent's memories of this tenant (respond role, HTTP);
        returns how many rows were deleted. Each is audited as a `forgotten` event."""
        if memory_id is None and agent_id is None:
            raise ValueError("forget needs a memory_id or an agent_id")
        body = {"tenant": self.tenant, "memory_id": memory_id, "agent_id": agent_id}
        # not sent again after a timeout, a connection lost once it was sent or a busy
        # answer: the first forget may still be deleting, or have deleted some rows
        # before the store failed, and a second one would answer only what was left (a
        # connection that never reached the server is retried)
        data = await self._http_json("POST", "/v1/forget", body, retry_timeouts=False,
                                     retry_busy=False)  # fmt: skip
        return int(data["forgotten"])

    async def get_memory(self, memory_id: str) -> dict[str, Any] | None:
        """One stored memory of this tenant (row without its vector), None if not stored."""
        try:
            row: dict[str, Any] = await self._http_json(
                "GET", f"/v1/memories/{_segment(memory_id)}?tenant={quote(self.tenant)}"
            )
        except NotFound:
            return None
        return row

    async def get_memories(self, memory_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Several memories of this tenant by id (``POST /v1/memories:batch_get``):
        ``{id: row}`` for the ids stored or folded into a stored memory."""
        body = {"tenant": self.tenant, "ids": list(memory_ids)}
        data = await self._http_json("POST", "/v1/memories:batch_get", body)
        return {str(r.get("folded_id") or r["memory_id"]): r for r in data["memories"]}

    async def list_page(self, *, limit: int = 50, cursor: str | None = None,
                        agent_id: str | None = None,
                        filters: SearchFilters | Mapping[str, Any] | None = None,
                        ) -> tuple[list[dict[str, Any]], str | None]:  # fmt: skip
        """One page of this tenant's memories, newest first (``GET /v1/memories``):
        (memories, the next page's cursor or None). ``filters`` as for `search`."""
        q = list_params(self.tenant, limit, cursor, agent_id, filters)
        data = await self._http_json("GET", f"/v1/memories?{urlencode(q)}")
        return list(data["memories"]), data.get("next_cursor")

    async def iter_memories(self, *, page_size: int = 100, agent_id: str | None = None,
                            filters: SearchFilters | Mapping[str, Any] | None = None,
                            ) -> AsyncIterator[dict[str, Any]]:  # fmt: skip
        """Every memory of this tenant matching the filters, newest first, page by page."""
        cursor: str | None = None
        while True:
            page, cursor = await self.list_page(limit=page_size, cursor=cursor,
                                                agent_id=agent_id, filters=filters)  # fmt: skip
            for m in page:
                yield m
            if cursor is None:
                return

    async def history(self, memory_id: str, limit: int = 200) -> list[dict[str, Any]]:
        """What happened to one memory, oldest first (``GET /v1/memories/{id}/history``);
        [] when it has no history here."""
        path = (f"/v1/memories/{_segment(memory_id)}/history?tenant={quote(self.tenant)}"
                f"&limit={limit}")  # fmt: skip
        try:
            data = await self._http_json("GET", path)
        except NotFound:
            return []
        return list(data["events"])

    async def stats(self) -> dict[str, Any]:
        """This tenant's memory counts by partition (respond role, HTTP)."""
        return await self._http_json("GET", f"/v1/stats?tenant={quote(self.tenant)}")

    async def _http_call(self, method: str, path: str, data: bytes | str | None,
                         retry_timeouts: bool = True, retry_5xx: bool = False,
                         retry_busy: bool = True) -> tuple[int, bytes]:  # fmt: skip
        """One idempotent HTTP call (search, get, stats, forget), retried on a lost connection.

        A server may close an idle keep-alive connection just as the client reuses
        it (aiohttp's ``ServerDisconnectedError``; seen on a 10-conversation LoCoMo
        run), and a worker restart drops connections: every call here is safe to
        repeat, so it is tried ``retries + 1`` times (0.1 s, 0.2 s, ... apart), then
        becomes `ServiceUnavailable` (retriable), never a raw aiohttp error. A try that
        gets no answer within ``timeout_s`` counts the same (a search is retried with its
        request_id, as over Kafka), unless ``retry_timeouts`` is False: then it, and a
        connection lost once the request was sent, is `ServiceUnavailable` at once,
        saying the call may have completed on the server (one that never connected is
        still retried).
        ``retry_5xx``: a 5xx answer is tried again the same way (the last one is returned);
        for writes whose records carry their ids (`_ingest`). A 429 or 503 (the tenant's
        share taken, the store or broker away) is tried again, unless ``retry_busy`` is
        False (a forget, which may have deleted rows before its store failed), after the
        answer's ``Retry-After`` seconds where it gives them (at most `RETRY_AFTER_MAX_S`),
        else the client's own backoff.
        """
        if self._http is None:
            raise ValueError("this call goes over HTTP: pass http_url to the client")
        session = self._http if retry_timeouts else self._fresh_session(self._http)
        # ``path`` is percent-encoded already (`_segment`, `quote`, `urlencode`): sent as
        # is, so that a ``%2E`` segment (the id ``.``) is not decoded and then dropped
        url = URL(str(URL(str(self.http_url))) + path, encoded=True)
        last: Exception | None = None
        wait_s: float | None = None  # the last answer's Retry-After
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(0.1 * 2 ** (attempt - 1) if wait_s is None else wait_s)
            wait_s = None  # a lost connection after a busy answer backs off on its own
            try:
                async with session.request(
                    method,
                    url,
                    data=data,
                    headers={"Content-Type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                ) as r:
                    status, raw = r.status, await r.read()
                    wait_s = retry_after(r.headers.get("Retry-After"))
                busy = retry_busy and status in (429, 503)
                if (busy or (retry_5xx and status >= 500)) and attempt < self.retries:
                    last = ServiceUnavailable(f"HTTP {status}")
                    continue
                return status, raw
            except aiohttp.ClientConnectorError as exc:  # never reached the server
                last = exc
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                last = exc
                if not retry_timeouts:  # lost once sent: as a timeout, not sent again
                    raise ServiceUnavailable(
                        f"{method} {path.split('?')[0]}: the connection was lost after the "
                        f"request was sent ({type(exc).__name__}); it may have completed on "
                        "the server (calling it again is safe)"
                    ) from None
            except TimeoutError:  # no answer within timeout_s (aiohttp raises it bare)
                last = TimeoutError(f"no answer within {self.timeout_s:g} s")
                if not retry_timeouts:
                    raise ServiceUnavailable(
                        f"{method} {path.split('?')[0]}: no answer within {self.timeout_s:g} s; "
                        "it may still complete on the server (calling it again is safe)"
                    ) from None
        raise ServiceUnavailable(
            f"{method} {path.split('?')[0]} failed after {self.retries + 1} tries: {last!r}"
        )

    def _fresh_session(self, pooled: aiohttp.ClientSession) -> aiohttp.ClientSession:
        """A session that opens a new connection per request, for the calls not sent
        twice (forget): a pooled connection the server closed while idle fails as the
        request goes out, which would read as "lost once sent" (may have completed)."""
        if self._http_fresh is None:
            self._http_fresh = aiohttp.ClientSession(
                headers=pooled.headers, connector=aiohttp.TCPConnector(force_close=True)
            )
        return self._http_fresh

    async def _http_json(self, method: str, path: str, body: Any = None,
                         retry_timeouts: bool = True, retry_busy: bool = True) -> Any:  # fmt: skip
        status, raw = await self._http_call(method, path, orjson.dumps(body) if body else None,
                                            retry_timeouts, retry_busy=retry_busy)  # fmt: skip
        try:
            data: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = raw[:500].decode("utf-8", "replace")
        if status == 200:
            return data
        if status == 404:
            raise NotFound(f"HTTP 404: {data}")
        if status in (401, 403):
            raise Unauthorized(f"not authorised (HTTP {status}): {data}")
        if 400 <= status < 500 and status != 429:  # 429: busy, retriable
            raise SearchError(f"HTTP {status}: {data}")
        raise ServiceUnavailable(f"HTTP {status}: {data}")

    async def _ingest(self, path: str, records: Sequence[BaseModel], what: str) -> int:
        """Send validated records to an ingest route, `INGEST_BATCH` (and at most
        `INGEST_BYTES`) a request; returns how many, once the server accepted every one.

        Every write is retried on a timeout or a 5xx, as searches are: each record carries
        its id before it is sent (a transition's stable id, an outcome's
        ``<episode>:final``, the feedback_id `feedback` draws once per call, a usage
        report's request_id), and the worker's consumers keep one record per id, so a
        batch the server stored before the answer was lost is not stored twice; a busy
        answer (429) is retried too (`_http_call`). A refusal (another 4xx) is not:
        `Unauthorized` (401/403), `InvalidRecord` (422/413/400: the server's reasons,
        indexed in the whole call). Once the tries are spent: `BrokerUnavailable` (503: the
        worker's broker is away), `ServiceUnavailable` otherwise (429, other 5xx, no
        answer); the message says how many records were accepted before it.
        """
        assert self._started, "call start() first"
        done = 0
        for batch in _batches([encode(r) for r in records]):
            body = b"[" + b",".join(batch) + b"]"
            try:
                status, raw = await self._http_call("POST", path, body, retry_5xx=True)
            except ServiceUnavailable as exc:
                raise ServiceUnavailable(f"{exc}{_sent(done, what)}") from exc
            self._ingest_answer(path, status, raw, len(batch), done, what)
            done += len(batch)
        return done

    def _ingest_answer(self, path: str, status: int, raw: bytes, n: int, done: int,
                       what: str) -> None:  # fmt: skip
        """Raise unless ``raw`` accepts all ``n`` records of the request."""
        if 200 <= status < 300:
            try:
                ok = IngestAccepted.model_validate_json(raw)
            except ValidationError:
                ok = None
            if ok is not None and ok.accepted == n and len(ok.ids) == n:
                return
            raise ServiceUnavailable(f"POST {path}: HTTP {status} without the acceptance of all "
                                     f"{n} records: {raw[:500]!r}{_sent(done, what)}")  # fmt: skip
        try:
            data: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = raw[:500].decode("utf-8", "replace")
        if isinstance(data, dict) and isinstance(data.get("detail"), list):
            for d in data["detail"]:  # index within the request -> within the call
                if isinstance(d, dict) and isinstance(d.get("index"), int):
                    d["index"] += done
        where = f"POST {path}: HTTP {status}: {data}{_sent(done, what)}"
        if status in (401, 403):
            hint = "no token is set (DMEM_API_TOKEN)" if not self.token else "check the token"
            raise Unauthorized(f"the deployment refuses this client's credentials ({hint}); "
                               f"{where}")  # fmt: skip
        if status in (400, 413, 422):
            raise InvalidRecord(f"the server refused the records; {where}")
        if status == 503:  # the ingest route's answer when the broker is away
            raise BrokerUnavailable(where)
        raise ServiceUnavailable(where)

    async def report_feedback(
        self,
        *,
        memory_id: str | None = None,
        episode_id: str | None = None,
        kind: str = "thumbs_up",
        value: float = 0.0,
        agent_id: str | None = None,
    ) -> None:
        """A user's thumbs on a memory (or a reward on an episode): becomes credit.

        ``thumbs_up`` / ``thumbs_down`` on a memory credit it +1 / -1 (its utility,
        hence its ranking and whether decay keeps it); ``kind="reward"`` with an
        episode is a late outcome for the credit job and hindsight writes. The same
        record as `feedback`, with the value defaulting to 0 (the kind carries it).
        """
        await self.feedback(
            memory_id=memory_id, episode_id=episode_id, kind=kind, value=value, agent_id=agent_id
        )

    async def report_usage(
        self,
        episode_id: str,
        request_id: str,
        weights: Mapping[str, float],
        *,
        step: int = 0,
        agent_id: str | None = None,
        reward: float | None = None,
    ) -> None:
        """Tell the credit job which served memories the agent actually used.

        `weights` maps each memory the search `request_id` served to the share
        it had in the decision (0 for memories the agent ignored; normalised
        to sum 1 here). This record replaces the responder's score-weighted
        one for that request, so credit goes to what was used, and ignored
        memories collect uses without credit (operators/credit.py).
        `reward` (optional) is the reward observed right after acting on this
        decision: where its sign contradicts the sign of this step's advantage
        (outcome minus baseline) the outcome neither credits nor blames the
        memories used here (a directly rewarded step is not blamed for a failure
        that came later from elsewhere).
        """
        assert self._started, "call start() first"
        ids = list(weights)
        bad = {m: v for m, v in weights.items() if not _share(v)}
        if bad:
            raise InvalidRecord(f"usage weights must be finite numbers >= 0, got {bad}")
        w = usage_shares([float(weights[m]) for m in ids])
        usage = build(
            MemoryUsage,
            {
                "tenant": self.tenant,
                "episode_id": episode_id,
                "request_id": request_id,
                "agent_id": agent_id,
                "step": step,
                "memory_ids": ids,
                "weights": w,
                "ts": int(time.time() * 1000),
                "source": "agent",
                "reward": reward,
            },
        )
        if self.transport == "http":
            await self._ingest("/v1/usage", [usage], "usage reports")
            return
        await self._send("usage", self.tenant, encode(usage), episode_id.encode())

    # -- read side -----------------------------------------------------------
    async def search(
        self,
        query: str | None = None,
        k: int = 5,
        *,
        vector: list[float] | None = None,
        agent_id: str | None = None,
        lambda_: float | None = None,
        episode_id: str | None = None,
        step: int | None = None,
        mmr: bool = False,
        request_id: str | None = None,
        as_of: int | None = None,
        **filters: Any,
    ) -> list[Hit]:
        """Search the tenant's memories. ``as_of``: when the question is asked (event
        time, ms): later memories are left out, recency is measured from it.
        ``filters``: the `SearchFilters` fields."""
        req = build(
            RetrievalRequest,
            {
                "request_id": request_id or uuid.uuid4().hex,
                "tenant": self.tenant,
                "query": query,
                "vector": vector,
                "k": k,
                "agent_id": agent_id,
                "lambda": lambda_,
                "episode_id": episode_id,
                "step": step,
                "mmr": mmr,
                "as_of": as_of,
                "filters": filters,
                "reply_topic": self._own_reply(),
            },
        )
        resp = await (
            self._search_http(req) if self.transport == "http" else self._search_kafka(req)
        )
        if resp.error:
            raise SearchError(resp.error)
        return resp.hits

    async def _search_kafka(self, req: RetrievalRequest) -> RetrievalResponse:
        assert self._started, "call start() first"
        fut: asyncio.Future[RetrievalResponse] = asyncio.get_running_loop().create_future()
        if not self._waiting and self._consumer is not None:
            self._consumer.resume(*self._tps)  # starts a fetch now, before the request
        self._waiting[req.request_id] = fut
        try:
            for _attempt in range(self.retries + 1):
                await self._send(
                    "requests", req.tenant, encode(req), (req.agent_id or req.tenant).encode()
                )
                try:
                    return await asyncio.wait_for(asyncio.shield(fut), self.timeout_s)
                except TimeoutError:
                    continue
            raise ServiceUnavailable(
                f"no answer to request {req.request_id} after {self.retries + 1} tries "
                f"of {self.timeout_s}s (is a respond worker running? With Kafka credentials "
                f"on, a request gets no answer unless its token is valid for tenant "
                f"{req.tenant!r}: "
                f"{'check the token' if self._signer else 'this client has no token'})"
            )
        finally:
            self._waiting.pop(req.request_id, None)
            if not self._waiting and self._consumer is not None:
                self._consumer.pause(*self._tps)

    async def _search_http(self, req: RetrievalRequest) -> RetrievalResponse:
        assert self._http is not None, "call start() first"
        body = req.model_dump_json(by_alias=True, exclude_none=True)
        status, raw = await self._http_call("POST", "/v1/search", body)
        if status == 200:  # pydantic parses the JSON itself (no dict in between)
            return RetrievalResponse.model_validate_json(raw)
        try:
            data: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = raw[:500].decode("utf-8", "replace")
        if status == 422:
            raise SearchError(f"invalid request: {data}")
        if status in (401, 403):
            raise Unauthorized(f"not authorised (HTTP {status}): {data}")
        raise ServiceUnavailable(f"search failed: HTTP {status} {data}")


class SyncClient:
    """Blocking facade over `Client` for agents that are not async."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="dmem-client"
        )
        self._thread.start()
        self._client = Client(*args, **kwargs)
        self._run(self._client.start())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def client(self) -> Client:
        """The async client inside (bound to this facade's own loop: use `submit`)."""
        return self._client

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run a coroutine on the client's loop from any thread (await it with
        `asyncio.wrap_future` from another loop)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    @property
    def tenant(self) -> str:
        return self._client.tenant

    def publish(self, transition: Transition) -> None:
        self._run(self._client.publish(transition))

    def publish_many(self, transitions: Iterable[Transition]) -> int:
        return self._run(self._client.publish_many(list(transitions)))

    def publish_chat(self, conversation: str, session: str | int, turns: Sequence[ChatTurn],
                     start_step: int = 0) -> int:  # fmt: skip
        return self._run(self._client.publish_chat(conversation, session, turns, start_step))

    def search(self, query: str | None = None, k: int = 5, **kw: Any) -> list[Hit]:
        return self._run(self._client.search(query, k, **kw))

    def report_outcome(self, episode_id: str, reward: float, **kw: Any) -> None:
        self._run(self._client.report_outcome(episode_id, reward, **kw))

    def feedback(self, **kw: Any) -> Feedback:
        return self._run(self._client.feedback(**kw))

    def report_feedback(self, **kw: Any) -> None:
        self._run(self._client.report_feedback(**kw))

    def list_page(self, **kw: Any) -> tuple[list[dict[str, Any]], str | None]:
        return self._run(self._client.list_page(**kw))

    def forget(self, **kw: Any) -> int:
        return self._run(self._client.forget(**kw))

    def stats(self) -> dict[str, Any]:
        return self._run(self._client.stats())

    def get_memory(self, memory_id: str) -> dict[str, Any] | None:
        return self._run(self._client.get_memory(memory_id))

    def get_memories(self, memory_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        return self._run(self._client.get_memories(memory_ids))

    def list_memories(self, *, limit: int | None = None, page_size: int = 100,
                      **kw: Any) -> list[dict[str, Any]]:  # fmt: skip
        """This tenant's memories newest first (all, or the first ``limit``)."""

        if limit == 0:  # `limit or page_size` would read a page and answer its first row
            return []

        async def collect() -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            size = min(page_size, limit) if limit else page_size
            async for m in self._client.iter_memories(page_size=size, **kw):
                out.append(m)
                if limit is not None and len(out) >= limit:
                    break
            return out

        return self._run(collect())

    def history(self, memory_id: str, limit: int = 200) -> list[dict[str, Any]]:
        return self._run(self._client.history(memory_id, limit))

    def report_usage(
        self, episode_id: str, request_id: str, weights: Mapping[str, float], **kw: Any
    ) -> None:
        self._run(self._client.report_usage(episode_id, request_id, weights, **kw))

    def close(self) -> None:
        try:
            self._run(self._client.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------
# conversations
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatTurn:
    """One message of a conversation, as a chat product has it."""

    speaker: str
    text: str
    turn_id: str | None = None  # the product's message id (kept in metadata)
    ts: int | None = None  # event time, ms since epoch
    metadata: Mapping[str, str | int | float | bool] = field(default_factory=dict)


def render_turn(turn: ChatTurn) -> str:
    """What gets embedded and stored: ``"speaker: text"`` (names are what people ask about)."""
    return f"{turn.speaker}: {turn.text}"


def chat_transitions(
    turns: Sequence[ChatTurn],
    *,
    tenant: str,
    conversation: str,
    session: str | int,
    start_step: int = 0,
) -> list[Transition]:
    """Map one session of a conversation to Transitions (docs/reference/sdk.md).

    - ``agent_id`` = the conversation (the memory's owner and the search scope),
      ``episode_id`` = ``<conversation>:<session>`` (a session is an episode;
      where that would pass 128 characters, a hash stands for the conversation,
      `schemas.models.fit_id`),
      ``step`` = the turn's index in the session (from ``start_step``);
    - ``observation`` = `render_turn`, ``action`` = ``"say"``, ``reward`` = 0: a
      chat has no reward; thumbs and corrections go to `report_feedback` and
      become credit;
    - ``next_observation`` = the next turn of the same session (how the
      conversation went on: the write path's context-fit guard uses it);
      the session's last turn has none and ``done`` = true;
    - ``ts`` = the turn's event time; ``metadata`` = speaker, session, turn id
      and the turn's own metadata.
    Ids are stable (tenant, agent, episode, step), so publishing a session
    again upserts the same memories.
    """
    out: list[Transition] = []
    last = len(turns) - 1
    for j, turn in enumerate(turns):
        meta: dict[str, Any] = {"speaker": turn.speaker, "session": str(session)}
        if turn.turn_id is not None:
            meta["turn"] = turn.turn_id
        meta.update(turn.metadata)
        out.append(
            Transition(
                tenant=tenant,
                agent_id=conversation,
                episode_id=fit_id("", conversation, f":{session}"),
                step=start_step + j,
                observation=render_turn(turn),
                action="say",
                reward=0.0,
                next_observation=render_turn(turns[j + 1]) if j < last else None,
                done=j == last,
                ts=turn.ts,
                metadata=meta,
            )
        )
    return out
