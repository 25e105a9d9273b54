"""`Client` over HTTP survives a dropped connection (`Client._http_call`).

A server may close a keep-alive connection just as the client reuses it; a
10-conversation LoCoMo run died of one ``ServerDisconnectedError``. Every HTTP
call of the SDK is idempotent, so it is repeated; when the server stays away the
caller gets `ServiceUnavailable` (retriable), not a raw aiohttp error. A real
aiohttp server on a free port stands in for the respond worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from dmem.client import Client
from schemas.errors import ServiceUnavailable
from tests.functional.dmem.stub_http import stub_server


def _stats(drop_first: int, retries: int) -> tuple[Any, list[str]]:
    seen: list[str] = []

    async def stats(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        if len(seen) <= drop_first:
            assert request.transport is not None
            request.transport.close()  # the connection goes away mid-request
            return web.Response()
        return web.json_response({"tenant": "t", "core": 2, "buffer": 1, "total": 3})

    async def go() -> tuple[Any, list[str]]:
        async with stub_server({("GET", "/v1/stats"): stats}) as url:
            c = Client("127.0.0.1:1", "t", transport="http", http_url=url,
                           retries=retries, timeout_s=5)  # fmt: skip
            c._http = aiohttp.ClientSession()  # HTTP only: no broker in this test  # noqa: SLF001
            try:
                return await c.stats(), seen
            except ServiceUnavailable as exc:
                return exc, seen
            finally:
                await c._http.close()  # noqa: SLF001

    return asyncio.run(go())


def test_a_dropped_connection_is_retried() -> None:
    # aiohttp itself repeats an idempotent request once on a lost connection (it
    # did so in the LoCoMo run too): drop more than that
    out, seen = _stats(drop_first=3, retries=2)
    assert out == {"tenant": "t", "core": 2, "buffer": 1, "total": 3}
    assert len(seen) == 4


@pytest.mark.parametrize("retries", [0, 2])
def test_a_server_that_keeps_dropping_is_service_unavailable(retries: int) -> None:
    out, seen = _stats(drop_first=99, retries=retries)
    assert isinstance(out, ServiceUnavailable) and out.retriable
    assert "GET /v1/stats failed after" in str(out)
    # each of the client's tries is one or two requests (aiohttp's own repeat)
    assert len(seen) >= retries + 1 and len(seen) % (retries + 1) == 0


def _slow(route: tuple[str, str], retries: int,
          call: Callable[[Client], Awaitable[Any]]) -> tuple[Any, list[str]]:  # fmt: skip
    """``call`` on a client whose server answers ``route`` after 1 s (timeout_s 0.2): its
    answer or its `ServiceUnavailable`, and the paths the server saw."""
    seen: list[str] = []

    async def slow(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        await asyncio.sleep(1)
        return web.json_response({"forgotten": 5})

    async def go() -> Any:
        async with stub_server({route: slow}) as url:
            c = Client("127.0.0.1:1", "t", transport="http", http_url=url,
                       retries=retries, timeout_s=0.2)  # fmt: skip
            c._http = aiohttp.ClientSession()  # noqa: SLF001
            try:
                return await call(c)
            except ServiceUnavailable as exc:
                return exc
            finally:
                await c._http.close()  # noqa: SLF001

    return asyncio.run(go()), seen


def test_a_server_that_does_not_answer_in_time_is_service_unavailable() -> None:
    # aiohttp raises a bare TimeoutError at timeout_s: the SDK let it out (a traceback
    # from `dmem search --http`, an unexplained error from the MCP tools)
    out, seen = _slow(("POST", "/v1/search"), 1, lambda c: c.search("q"))
    assert isinstance(out, ServiceUnavailable) and out.retriable, out
    assert "POST /v1/search failed after 2 tries" in str(out) and "0.2 s" in str(out)
    assert len(seen) == 2


def test_a_slow_forget_is_not_sent_again() -> None:
    """A forget that outlasts timeout_s may still be deleting: it is sent once, and the
    error says that calling it again is safe (a second forget would count only what the
    first had left)."""
    out, seen = _slow(("POST", "/v1/forget"), 2, lambda c: c.forget(agent_id="a"))
    assert isinstance(out, ServiceUnavailable) and out.retriable, out
    assert "may still complete" in str(out)
    assert seen == ["/v1/forget"]


def _busy_stats(busy: int, retries: int) -> tuple[Any, int]:
    """``/v1/stats`` answers 429 (the tenant is busy) ``busy`` times, then the counts."""
    seen: list[int] = []

    async def stats(request: web.Request) -> web.StreamResponse:
        seen.append(1)
        if len(seen) <= busy:
            return web.json_response({"error": "busy"}, status=429, headers={"Retry-After": "0"})
        return web.json_response({"tenant": "t", "core": 1, "buffer": 0, "total": 1})

    async def go() -> Any:
        async with stub_server({("GET", "/v1/stats"): stats}) as url:
            c = Client("127.0.0.1:1", "t", transport="http", http_url=url,
                       retries=retries, timeout_s=5)  # fmt: skip
            c._http = aiohttp.ClientSession()  # noqa: SLF001
            try:
                return await c.stats()
            except ServiceUnavailable as exc:
                return exc
            finally:
                await c._http.close()  # noqa: SLF001

    return asyncio.run(go()), len(seen)


def test_a_busy_read_is_retried_and_then_retriable() -> None:
    out, calls = _busy_stats(busy=2, retries=2)
    assert out == {"tenant": "t", "core": 1, "buffer": 0, "total": 1} and calls == 3
    out, calls = _busy_stats(busy=5, retries=2)
    assert isinstance(out, ServiceUnavailable) and out.retriable, out
    assert "HTTP 429" in str(out) and calls == 3


def _forget(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    """``forget(memory_id="m1")`` (retries 3) against ``handler``: its answer or error."""

    async def go() -> Any:
        async with stub_server({("POST", "/v1/forget"): handler}) as url:
            c = Client("127.0.0.1:1", "t", transport="http", http_url=url, retries=3,
                       timeout_s=5)  # fmt: skip
            c._http = aiohttp.ClientSession()  # noqa: SLF001
            try:
                return await c.forget(memory_id="m1")
            except ServiceUnavailable as exc:
                return exc
            finally:
                await c.stop()

    return asyncio.run(go())


def test_a_forget_answered_503_is_not_sent_again() -> None:
    """A store that failed part way may have deleted rows: the forget raises at once."""
    seen: list[int] = []

    async def forget(request: web.Request) -> web.StreamResponse:
        seen.append(1)
        return web.json_response({"error": "store unavailable"}, status=503,
                                 headers={"Retry-After": "0"})  # fmt: skip

    out = _forget(forget)
    assert isinstance(out, ServiceUnavailable) and "HTTP 503" in str(out), out
    assert len(seen) == 1


def test_a_forget_whose_connection_is_lost_after_sending_is_not_sent_again() -> None:
    """The worker may have deleted the rows before the connection went: a second forget
    would answer ``forgotten: 0`` for a forget that deleted them."""
    seen: list[int] = []

    async def forget(request: web.Request) -> web.StreamResponse:
        seen.append(1)
        assert request.transport is not None
        request.transport.close()  # deleted, then the connection goes away
        return web.Response()

    out = _forget(forget)
    assert isinstance(out, ServiceUnavailable) and out.retriable, out
    assert "may have completed" in str(out) and len(seen) == 1


def test_a_forget_never_goes_out_on_a_pooled_connection() -> None:
    """A pooled keep-alive connection the server closed while idle fails as the request
    goes out, and a forget lost once sent is not sent again: the forget opens its own
    connection, so that failure never reads as "may have completed"."""
    peers: list[tuple[str, Any]] = []

    async def stats(request: web.Request) -> web.StreamResponse:
        peers.append(("stats", request.transport.get_extra_info("peername")))  # type: ignore[union-attr]
        return web.json_response({"tenant": "t", "core": 0, "buffer": 0, "total": 0})

    async def forget(request: web.Request) -> web.StreamResponse:
        peers.append(("forget", request.transport.get_extra_info("peername")))  # type: ignore[union-attr]
        return web.json_response({"forgotten": 1})

    async def go() -> int:
        routes = {("GET", "/v1/stats"): stats, ("POST", "/v1/forget"): forget}
        async with stub_server(routes) as url:
            c = Client("127.0.0.1:1", "t", transport="http", http_url=url, timeout_s=5)
            c._http = aiohttp.ClientSession()  # noqa: SLF001
            try:
                await c.stats()
                await c.stats()  # the pool keeps its connection
                return await c.forget(memory_id="m1")
            finally:
                await c.stop()

    assert asyncio.run(go()) == 1
    [s1, s2, f] = [p for _, p in peers]
    assert s1 == s2 and f != s1


def test_stop_closes_both_sessions_when_the_producer_fails_to_stop() -> None:
    """A producer whose stop raises (the broker went away) must not leave the HTTP
    sessions open: each holds sockets, and aiohttp warns of an unclosed session."""

    class BrokenProducer:
        async def stop(self) -> None:
            raise RuntimeError("broker gone")

    async def go() -> tuple[bool, bool, BaseException | None]:
        c = Client("127.0.0.1:1", "t", transport="http", http_url="http://127.0.0.1:1")
        pooled = aiohttp.ClientSession()
        c._http = pooled  # noqa: SLF001
        fresh = c._fresh_session(pooled)  # noqa: SLF001
        c._producer = BrokenProducer()  # type: ignore[assignment]  # noqa: SLF001
        err: BaseException | None = None
        try:
            await c.stop()
        except RuntimeError as exc:
            err = exc
        return pooled.closed, fresh.closed, err

    pooled_closed, fresh_closed, err = asyncio.run(go())
    assert pooled_closed and fresh_closed
    assert isinstance(err, RuntimeError) and "broker gone" in str(err)
