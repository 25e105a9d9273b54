"""A real aiohttp server on a free loopback port standing in for the respond worker."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def stub_server(routes: dict[tuple[str, str], Handler]) -> AsyncIterator[str]:
    """Serve ``{(method, path): handler}``; yields the base URL, stops on exit."""
    app = web.Application()
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
