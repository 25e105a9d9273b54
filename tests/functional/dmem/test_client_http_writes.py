"""A ``transport="http"`` client writes over the worker's ingest routes and needs no
Kafka: every write (transitions, outcomes, feedback, usage) is posted with the bearer
token, in batches, and returns only once the server accepted every record; a refused
record raises. The Kafka bootstrap points at a closed port throughout. A real aiohttp
server on a free port stands in for the respond worker (`streams.respond.ingest`)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from aiohttp import web

from dmem.client import INGEST_BATCH, ChatTurn, Client, SyncClient, Unauthorized
from schemas import Transition
from schemas.errors import BrokerUnavailable, InvalidRecord, ServiceUnavailable
from tests.functional.dmem.stub_http import Handler, stub_server

ROUTES = ("/v1/transitions", "/v1/outcomes", "/v1/feedback", "/v1/usage")


def _t(step: int) -> Transition:
    return Transition(tenant="acme", agent_id="a", episode_id="e", step=step,
                      observation=f"saw {step}", action="go")  # fmt: skip


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


def _client(url: str, **kw: Any) -> Client:
    return Client(f"127.0.0.1:{_closed_port()}", "acme", transport="http", http_url=url,
                  timeout_s=2, client_kwargs={"request_timeout_ms": 2000},
                  **{"token": "tok-acme", **kw})  # fmt: skip


class Server:
    """Accepts what it is sent like the ingest routes (202 with the ids), recording
    (path, Authorization, records); ``answers`` scripts earlier answers per route."""

    def __init__(self, answers: dict[str, list[tuple[Any, ...]]] | None = None) -> None:
        self.seen: list[tuple[str, str | None, list[dict[str, Any]]]] = []
        self.answers = answers or {}

    def handler(self, path: str) -> Handler:
        async def ingest(request: web.Request) -> web.Response:
            recs = await request.json()
            self.seen.append((path, request.headers.get("Authorization"), recs))
            if self.answers.get(path):
                status, body, *headers = self.answers[path].pop(0)
                return web.json_response(body, status=status, headers=(headers or [None])[0])
            return web.json_response(
                {"accepted": len(recs), "ids": [str(i) for i in range(len(recs))],
                 "topic": "dmem.x"}, status=202)  # fmt: skip

        return ingest

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {("POST", p): self.handler(p) for p in ROUTES}


def test_every_write_goes_over_http_with_the_token_and_no_broker() -> None:
    srv = Server()

    async def go() -> None:
        async with stub_server(srv.routes()) as url, _client(url) as c:
            assert c._producer is None and c._consumer is None  # noqa: SLF001
            # validated as over Kafka: an invalid record is refused before anything is sent
            with pytest.raises(InvalidRecord):
                await c.report_outcome("e", reward=float("nan"))
            with pytest.raises(InvalidRecord):
                await c.report_usage("e", "r", {"m1": -1.0})
            assert srv.seen == []
            await c.publish(_t(0))
            assert await c.publish_many(_t(i) for i in range(1, INGEST_BATCH + 3)) == (
                INGEST_BATCH + 2
            )
            turns = [ChatTurn("ann", "hi"), ChatTurn("bob", "hello")]
            assert await c.publish_chat("conv", 1, turns) == 2
            await c.report_outcome("e", reward=1.0, success=True)
            fb = await c.feedback(memory_id="m1", kind="thumbs_down")
            await c.report_usage("e", "req-1", {"m1": 3.0, "m2": 1.0}, step=2)
            assert c._producer is None  # noqa: SLF001

            by_path = [(p, len(r)) for p, _a, r in srv.seen]
            assert by_path == [
                ("/v1/transitions", 1),
                ("/v1/transitions", INGEST_BATCH),
                ("/v1/transitions", 2),
                ("/v1/transitions", 2),
                ("/v1/outcomes", 1),
                ("/v1/feedback", 1),
                ("/v1/usage", 1),
            ]
            assert {a for _p, a, _r in srv.seen} == {"Bearer tok-acme"}
            first = srv.seen[0][2][0]
            assert first["transition_id"] == _t(0).transition_id and first["tenant"] == "acme"
            out = srv.seen[4][2][0]
            assert out["episode_id"] == "e" and out["outcome_id"] == "e:final"
            assert srv.seen[5][2][0]["feedback_id"] == fb.feedback_id
            usage = srv.seen[6][2][0]
            assert usage["request_id"] == "req-1" and usage["weights"] == [0.75, 0.25]

    asyncio.run(asyncio.wait_for(go(), 60))


def test_the_sync_client_writes_over_http() -> None:
    srv = Server()

    async def serve(ready: asyncio.Future[str], done: asyncio.Event) -> None:
        async with stub_server(srv.routes()) as url:
            ready.set_result(url)
            await done.wait()

    async def go() -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[str] = loop.create_future()
        done = asyncio.Event()
        task = asyncio.create_task(serve(ready, done))
        url = await ready

        def write() -> None:
            with SyncClient(f"127.0.0.1:{_closed_port()}", "acme", transport="http",
                            http_url=url, timeout_s=2) as c:  # fmt: skip
                c.publish(_t(0))
                c.report_outcome("e", 0.5)

        await asyncio.to_thread(write)
        done.set()
        await task

    asyncio.run(asyncio.wait_for(go(), 60))
    assert [p for p, _a, _r in srv.seen] == ["/v1/transitions", "/v1/outcomes"]


@pytest.mark.parametrize(
    ("status", "body", "error", "retried"),
    [
        (
            422,
            {"error": "invalid records", "detail": [{"index": 1, "loc": [], "msg": "bad"}]},
            InvalidRecord,
            False,
        ),
        (401, {"error": "no token"}, Unauthorized, False),
        (403, {"error": "not your tenant"}, Unauthorized, False),
        (413, {"error": "too big"}, InvalidRecord, False),
        (429, {"error": "budget full"}, ServiceUnavailable, True),
        (503, {"error": "broker unavailable"}, BrokerUnavailable, True),
        (500, {"error": "boom"}, ServiceUnavailable, True),
    ],
)
def test_a_refused_write_raises_and_only_busy_or_5xx_is_retried(
    status: int, body: dict[str, Any], error: type[Exception], retried: bool
) -> None:
    srv = Server({p: [(status, body)] * 3 for p in ROUTES})

    async def go() -> None:
        async with stub_server(srv.routes()) as url, _client(url, retries=2) as c:
            with pytest.raises(error) as exc:
                await c.publish_many([_t(0), _t(1)])
            assert f"HTTP {status}" in str(exc.value)
            assert "no transitions accepted" in str(exc.value)
            with pytest.raises(error):
                await c.report_outcome("e", reward=1.0)
            with pytest.raises(error):
                await c.feedback(memory_id="m1")
            with pytest.raises(error):
                await c.report_usage("e", "r", {"m1": 1.0})

    asyncio.run(asyncio.wait_for(go(), 60))
    assert len(srv.seen) == (12 if retried else 4)


def test_a_5xx_then_202_is_a_success_with_the_same_records() -> None:
    srv = Server({"/v1/transitions": [(503, {"error": "broker unavailable"})]})

    async def go() -> None:
        async with stub_server(srv.routes()) as url, _client(url) as c:
            assert await c.publish_many([_t(0), _t(1)]) == 2

    asyncio.run(asyncio.wait_for(go(), 60))
    assert len(srv.seen) == 2 and srv.seen[0][2] == srv.seen[1][2]


def test_a_busy_answer_is_retried_after_its_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """429 / 503 mean nothing was done: the write is sent again after the seconds the
    answer's Retry-After asks for (capped), the client's own backoff where it has none."""
    import dmem.client as client

    srv = Server({"/v1/transitions": [(429, {"error": "busy"}, {"Retry-After": "7"}),
                                      (503, {"error": "away"}, {"Retry-After": "3600"}),
                                      (429, {"error": "busy"})]})  # fmt: skip
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(client.asyncio, "sleep", sleep)

    async def go() -> None:
        async with stub_server(srv.routes()) as url, _client(url, retries=3) as c:
            assert await c.publish_many([_t(0), _t(1)]) == 2

    asyncio.run(asyncio.wait_for(go(), 60))
    # (aiohttp's own sleep(0) calls go through the patched module too)
    assert [x for x in slept if x] == [7.0, client.RETRY_AFTER_MAX_S, 0.4]
    assert len(srv.seen) == 4 and all(s[2] == srv.seen[0][2] for s in srv.seen)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("2", 2.0),
        ("0.5", 0.5),
        ("0", 0.0),
        ("99999", 30.0),
        (None, None),
        ("-1", None),
        ("nan", None),
        ("Wed, 21 Oct 2026 07:28:00 GMT", None),
    ],
)
def test_retry_after_reads_seconds_only(value: str | None, seconds: float | None) -> None:
    from dmem.client import retry_after

    assert retry_after(value) == seconds


def test_a_refusal_in_a_later_batch_says_what_was_accepted() -> None:
    detail = [{"index": 3, "loc": ["observation"], "msg": "bad", "type": "x"}]
    srv = Server({"/v1/transitions": [(202, {"accepted": INGEST_BATCH,
                                             "ids": ["x"] * INGEST_BATCH, "topic": "t"}),
                                      (422, {"error": "invalid records",
                                             "detail": detail})]})  # fmt: skip

    async def go() -> None:
        async with stub_server(srv.routes()) as url, _client(url) as c:
            with pytest.raises(InvalidRecord) as exc:
                await c.publish_many(_t(i) for i in range(INGEST_BATCH + 5))
            msg = str(exc.value)
            assert f"{INGEST_BATCH} transitions accepted before" in msg
            assert f"'index': {INGEST_BATCH + 3}" in msg  # the index within the whole call

    asyncio.run(asyncio.wait_for(go(), 60))


@pytest.mark.parametrize(
    "answer",
    [
        (202, {"accepted": 1, "ids": ["a"], "topic": "t"}),  # fewer than sent
        (200, {"ok": True}),  # not the ingest answer
    ],
)
def test_a_2xx_that_does_not_accept_every_record_is_no_success(
    answer: tuple[int, Any],
) -> None:
    srv = Server({"/v1/transitions": [answer]})

    async def go() -> None:
        async with stub_server(srv.routes()) as url, _client(url) as c:
            with pytest.raises(ServiceUnavailable, match="acceptance of all 2"):
                await c.publish_many([_t(0), _t(1)])

    asyncio.run(asyncio.wait_for(go(), 60))
