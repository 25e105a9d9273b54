"""A client with the HTTP API's address: searching over HTTP works with Kafka
unreachable (`dmem search --http ...`; its writes: test_client_http_writes.py). A
Kafka-transport client given the HTTP API's address asks it, before its first record
goes to Kafka, whether its token is accepted for its tenant: a refused token fails
that write (`Unauthorized`) instead of every record being dead-lettered where the
agent never looks."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web

from dmem import Unauthorized
from dmem.client import Client
from schemas import Transition
from tests.functional.dmem.stub_http import stub_server

T = Transition(tenant="acme", agent_id="a", episode_id="e", step=0, observation="x",
               action="go")  # fmt: skip


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


def _client(url: str, token: str | None = None, transport: str = "http") -> Client:
    return Client(f"127.0.0.1:{_closed_port()}", "acme", transport=transport, http_url=url,
                  timeout_s=2, client_kwargs={"request_timeout_ms": 2000},
                  token=token)  # fmt: skip


def test_http_client_searches_without_a_broker() -> None:
    asked: list[dict[str, object]] = []

    async def search(request: web.Request) -> web.Response:
        body = await request.json()
        asked.append(body)
        return web.json_response({"request_id": body["request_id"], "tenant": body["tenant"],
                                  "hits": [], "took_ms": 1.0})  # fmt: skip

    async def go() -> None:
        async with stub_server({("POST", "/v1/search"): search}) as url, _client(url) as client:
            assert await client.search("where is the key?", 3) == []

    asyncio.run(go())
    assert asked and asked[0]["query"] == "where is the key?" and asked[0]["tenant"] == "acme"


@pytest.mark.parametrize(("status", "token"), [(401, None), (403, "tok-of-another-tenant")])
def test_a_refused_token_fails_the_first_write(
    status: int, token: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DMEM_API_TOKEN", raising=False)
    asked: list[tuple[str, str | None]] = []

    async def stats(request: web.Request) -> web.Response:
        asked.append((request.query["tenant"], request.headers.get("Authorization")))
        return web.json_response({"error": "not for this tenant"}, status=status)

    async def go() -> None:
        async with stub_server({("GET", "/v1/stats"): stats}) as url:
            # a Kafka-transport client with the HTTP address, started without its broker
            # (the check comes before the producer): only the HTTP session it asks with
            c = _client(url, token, transport="kafka")
            c._started = True  # noqa: SLF001
            headers = {"Authorization": f"Bearer {token}"} if token else None
            c._http = aiohttp.ClientSession(headers=headers)  # noqa: SLF001
            try:
                await _refused(c, status)
            finally:
                await c.stop()

    async def _refused(c: Client, status: int) -> None:
        # concurrent first writes: one question, every write refused
        outs = await asyncio.wait_for(
            asyncio.gather(c.publish(T), c.publish(T), return_exceptions=True), 60
        )
        assert all(isinstance(o, Unauthorized) for o in outs), outs
        err = outs[0]
        assert f"HTTP {status}" in str(err) and "'acme'" in str(err)
        assert ("DMEM_API_TOKEN" in str(err)) is (token is None)
        with pytest.raises(Unauthorized):  # and so is every later one
            await asyncio.wait_for(c.report_outcome("e", reward=1.0), 60)

    asyncio.run(go())
    bearer = None if token is None else f"Bearer {token}"
    assert asked == [("acme", bearer)]


def test_the_token_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DMEM_API_TOKEN", "tok-from-env")
    assert _client("http://127.0.0.1:1").token == "tok-from-env"
    assert _client("http://127.0.0.1:1", token="given").token == "given"
    monkeypatch.setenv("DMEM_API_TOKEN", "")
    assert _client("http://127.0.0.1:1").token is None
