"""`SyncClient.list_memories(limit=N)` answers at most N memories (``limit=0``: none).

``limit=0`` was read as "no limit" for the page size and then cut after the first row:
it answered one memory. A real aiohttp server stands in for the respond worker.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from dmem.client import SyncClient
from tests.functional.dmem.stub_http import stub_server

ROWS = [{"memory_id": f"m{i}", "text": f"memory {i}"} for i in range(3)]


@pytest.fixture
def url() -> Iterator[str]:
    async def page(request: web.Request) -> web.StreamResponse:
        n = int(request.query["limit"])
        return web.json_response({"tenant": "t", "memories": ROWS[:n], "next_cursor": None})

    loop = asyncio.new_event_loop()
    ready: list[str] = []
    done = asyncio.Event()

    async def serve() -> None:
        async with stub_server({("GET", "/v1/memories"): page}) as base:
            ready.append(base)
            await done.wait()

    t = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    t.start()
    while not ready:
        threading.Event().wait(0.01)
    yield ready[0]
    loop.call_soon_threadsafe(done.set)
    t.join(5)
    loop.close()


@pytest.mark.parametrize(("limit", "n"), [(0, 0), (1, 1), (2, 2), (None, 3)])
def test_list_memories_answers_at_most_limit(url: str, limit: int | None, n: int) -> None:
    with SyncClient("127.0.0.1:1", "t", transport="http", http_url=url) as c:
        assert len(c.list_memories(limit=limit)) == n
