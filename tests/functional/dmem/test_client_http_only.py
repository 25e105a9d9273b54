"""A client on the HTTP transport needs no broker until it writes: searching, reading
and forgetting over HTTP work with Kafka unreachable (`dmem search --http ...`), and the
first write says the broker is unavailable, as a `DmemError`."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web

from dmem import BrokerUnavailable
from dmem.client import Client
from schemas import Transition


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


def test_http_client_searches_without_a_broker_and_a_write_says_it_is_missing() -> None:
    asked: list[dict[str, object]] = []

    async def search(request: web.Request) -> web.Response:
        body = await request.json()
        asked.append(body)
        return web.json_response({"request_id": body["request_id"], "tenant": body["tenant"],
                                  "hits": [], "took_ms": 1.0})  # fmt: skip

    async def go() -> None:
        app = web.Application()
        app.router.add_post("/v1/search", search)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
        try:
            client = Client(f"127.0.0.1:{_closed_port()}", "acme", transport="http",
                            http_url=f"http://127.0.0.1:{port}", timeout_s=2,
                            client_kwargs={"request_timeout_ms": 2000})  # fmt: skip
            async with client:
                assert await client.search("where is the key?", 3) == []
                t = Transition(tenant="acme", agent_id="a", episode_id="e", step=0,
                               observation="x", action="go")  # fmt: skip
                with pytest.raises(BrokerUnavailable):
                    await asyncio.wait_for(client.publish(t), 60)
        finally:
            await runner.cleanup()

    asyncio.run(go())
    assert asked and asked[0]["query"] == "where is the key?" and asked[0]["tenant"] == "acme"
