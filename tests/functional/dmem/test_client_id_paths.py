"""`Client.get_memory` and `Client.history` of ids that are not plain path segments:
ids holding ``/`` and the ids ``.`` and ``..`` (`Ident` allows both).

The id is one path segment of ``/v1/memories/{id}``; sent with its ``/`` as is, ``a/b``
would match no route (None: the memory looks missing) and ``x/history`` the history
route of ``x``. A URL's ``.`` and ``..`` segments are removed by normalisation (RFC 3986,
5.2.4: ``/v1/memories/./history`` is ``/v1/memories/history``), so those ids go as
``%2E``; the server decodes the segment back to the id. A real aiohttp server routes as
the respond worker's does.
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


def test_the_ids_dot_and_dot_dot_reach_their_routes() -> None:
    got = _calls([".", "..", "a.", ".b", "..."])
    assert got == [
        {"memory_id": "."}, [{"of": "."}],
        {"memory_id": ".."}, [{"of": ".."}],
        {"memory_id": "a."}, [{"of": "a."}],
        {"memory_id": ".b"}, [{"of": ".b"}],
        {"memory_id": "..."}, [{"of": "..."}],
    ]  # fmt: skip
