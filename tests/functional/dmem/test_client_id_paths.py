"""`Client.get_memory` and `Client.history` of an id holding ``/`` (ids may: `Ident`).

The id is one path segment of ``/v1/memories/{id}``; sent with its ``/`` as is, ``a/b``
matched no route (None: the memory looked missing) and ``x/history`` matched the history
route of ``x``. A real aiohttp server routes as the respond worker's does.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from dmem.client import Client
from tests.functional.dmem.stub_http import stub_server


def _calls(ids: list[str]) -> list[Any]:
    async def row(request: web.Request) -> web.StreamResponse:
        return web.json_response({"memory_id": request.match_info["memory_id"]})

    async def history(request: web.Request) -> web.StreamResponse:
        return web.json_response({"events": [{"of": request.match_info["memory_id"]}]})

    routes = {("GET", "/v1/memories/{memory_id}/history"): history,
              ("GET", "/v1/memories/{memory_id}"): row}  # fmt: skip

    async def go() -> list[Any]:
        async with stub_server(routes) as url:
            c = Client("127.0.0.1:1", "t", transport="http", http_url=url, timeout_s=5)
            c._http = aiohttp.ClientSession()  # HTTP only: no broker here  # noqa: SLF001
            try:
                out: list[Any] = []
                for mid in ids:
                    out += [await c.get_memory(mid), await c.history(mid)]
                return out
            finally:
                await c._http.close()  # noqa: SLF001

    return asyncio.run(go())


def test_an_id_with_a_slash_is_one_path_segment() -> None:
    got = _calls(["a/b", "x/history", "p%2Fq"])
    assert got == [
        {"memory_id": "a/b"}, [{"of": "a/b"}],
        {"memory_id": "x/history"}, [{"of": "x/history"}],
        {"memory_id": "p%2Fq"}, [{"of": "p%2Fq"}],
    ]  # fmt: skip
