"""`Client` over HTTP survives a dropped connection (`Client._http_call`).

A server may close a keep-alive connection just as the client reuses it; a
10-conversation LoCoMo run died of one ``ServerDisconnectedError``. Every HTTP
call of the SDK is idempotent, so it is repeated; when the server stays away the
caller gets `ServiceUnavailable` (retriable), not a raw aiohttp error. A real
aiohttp server on a free port stands in for the respond worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from dmem.client import Client
from schemas.errors import ServiceUnavailable


async def _serve(drop_first: int) -> tuple[web.AppRunner, str, list[str]]:
    seen: list[str] = []

    async def stats(request: web.Request) -> web.StreamResponse:
        seen.append(request.path)
        if len(seen) <= drop_first:
            assert request.transport is not None
            request.transport.close()  # the connection goes away mid-request
            return web.Response()
        return web.json_response({"tenant": "t", "core": 2, "buffer": 1, "total": 3})

    app = web.Application()
    app.router.add_get("/v1/stats", stats)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}", seen


def _stats(drop_first: int, retries: int) -> tuple[Any, list[str]]:
    async def go() -> tuple[Any, list[str]]:
        runner, url, seen = await _serve(drop_first)
        try:
            c = Client("127.0.0.1:1", "t", transport="http", http_url=url,
                           retries=retries, timeout_s=5)  # fmt: skip
            c._http = aiohttp.ClientSession()  # HTTP only: no broker in this test  # noqa: SLF001
            try:
                return await c.stats(), seen
            except ServiceUnavailable as exc:
                return exc, seen
            finally:
                await c._http.close()  # noqa: SLF001
        finally:
            await runner.cleanup()

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
