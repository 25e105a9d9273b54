"""The live page of a respond worker: ``GET /ui/`` (shell) and ``GET /v1/live`` (its data).

What it shows: the tenants with their core/buffer counts, the gate's thresholds and
the distribution of the gate score over time (from `streams.respond.live`: a
bounded ring fed by a background consumer of the ``memories`` topic), the latest
decisions with their reasons, the dead letters, a search box whose hits show
their score breakdown as bars (the page calls ``POST /v1/search``), and the memory
explorer (``static/explorer.js``): a tenant's memories as a filterable, paginated
table (``GET /v1/memories``), a detail panel with why the memory was stored, its
utility over time and its history (``GET /v1/memories/{id}/history``), and buttons
to rate it (``POST /v1/feedback``) or forget it (``DELETE /v1/memories/{id}``).
``/ui/#tenant=T`` opens the page on tenant T.

Files: hand-written HTML/JS/CSS under ``streams/respond/static/`` (package data),
served by this worker; no build step, no CDN, no third-party script.

Auth (decision): the shell and its static files are public, they carry no data;
every data call (``/v1/live``, ``/v1/search``) is a ``fetch()`` with the
``Authorization: Bearer`` header, checked like every other ``/v1`` call
(`streams.auth`). A browser cannot attach that header to a page navigation, and a
cookie would need CSRF defences, so the page asks for the token (or takes it from
the URL *fragment*, ``/ui/#token=...``, which browsers never send to a server and
the page removes from the address bar at once) and keeps it in ``sessionStorage``:
this tab only, gone when it closes. With auth disabled (``dmem up``) no token is
asked. The shell is served with a Content-Security-Policy that allows only this
origin's script, style and ``fetch`` (no inline script, no eval), and the script
writes data with ``textContent`` only, so a hostile memory text cannot run.

Scope: a token sees the tenants it lists; an all-tenant token (``"*"``) or disabled
auth sees every tenant the ring has seen plus those found by a bounded scan of the
store (``DISCOVER_MAX_ROWS`` rows of the ``tenant`` field, refreshed every
``DISCOVER_TTL_S``). Dead letters carry no trustworthy tenant, so only all-tenant
access reads them. Counts are exact Milvus counts, cached ``COUNT_TTL_S`` for all
viewers, for at most ``MAX_COUNTED`` tenants per call (the rest are listed).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import faust
from faust.web import Request, Response, View

from schemas.limits import LIMITS
from schemas.models import IDENT_PATTERN
from streams.auth import Authorizer
from streams.context import RoleContext, StatusFn
from streams.respond.live import LiveFeed, LiveRing, gate_summary

log = logging.getLogger("dmem.ui")

#: a tenant name, as every read takes it (`schemas.models.Ident`)
TENANT_NAME = re.compile(IDENT_PATTERN[1:-1])
COUNT_TTL_S = 3.0
MAX_COUNTED = 50
DISCOVER_MAX_ROWS = 200_000
DISCOVER_TTL_S = 60.0
DISCOVER_WAIT_S = 3.0
STATIC = {
    "index.html": "text/html; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    "explorer.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def static_file(name: str) -> bytes:
    return resources.files("streams.respond").joinpath("static", name).read_bytes()


class TenantCounts:
    """Exact core/buffer counts per tenant, cached ``ttl_s`` (shared by every viewer)."""

    def __init__(self, store: Any, ttl_s: float = COUNT_TTL_S, parallel: int = 4) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.cache: dict[str, tuple[float, dict[str, int]]] = {}
        self.sem = asyncio.Semaphore(parallel)

    async def _one(self, tenant: str) -> dict[str, int]:
        st = self.store.store
        async with self.sem:
            core = await asyncio.to_thread(st.count, "core", tenant)
            buffer = await asyncio.to_thread(st.count, "buffer", tenant)
        counts = {"core": core, "buffer": buffer, "total": core + buffer}
        self.cache[tenant] = (time.monotonic(), counts)
        return counts

    async def get(self, tenants: list[str]) -> dict[str, dict[str, int]]:
        now = time.monotonic()
        fresh = {t: c for t in tenants if (e := self.cache.get(t)) and now - e[0] < self.ttl_s
                 for c in (e[1],)}  # fmt: skip
        stale = [t for t in tenants if t not in fresh]
        got = await asyncio.gather(*(self._one(t) for t in stale))
        return {**fresh, **dict(zip(stale, got, strict=True))}


class TenantDirectory:
    """Tenant names found in the store: one bounded scan of the ``tenant`` field.

    The ring only knows tenants that wrote since its start window; after a
    restart of `dmem up` (topics are new) the store still holds the others.
    """

    def __init__(
        self, store: Any, max_rows: int = DISCOVER_MAX_ROWS, ttl_s: float = DISCOVER_TTL_S
    ) -> None:
        self.store = store
        self.max_rows = max_rows
        self.ttl_s = ttl_s
        self.names: set[str] = set()
        self.complete = False
        self.at = -ttl_s
        self.task: asyncio.Task[None] | None = None

    def _scan(self) -> tuple[set[str], bool]:
        names: set[str] = set()
        n = 0
        for row in self.store.store.scan(output_fields=["tenant"], batch_size=16_384):
            names.add(str(row["tenant"]))
            n += 1
            if n >= self.max_rows:
                return names, False
        return names, True

    async def _refresh(self) -> None:
        self.names, self.complete = await asyncio.to_thread(self._scan)
        self.at = time.monotonic()

    async def get(self) -> set[str]:
        if self.task is None or (self.task.done() and time.monotonic() - self.at > self.ttl_s):
            self.task = asyncio.ensure_future(self._refresh())
        if not self.task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self.task), DISCOVER_WAIT_S)
            except TimeoutError:
                pass  # answer with what is known; the scan goes on
            except Exception as exc:  # noqa: BLE001 - a listing must not fail the page
                log.info("tenant scan failed: %s", exc)
        if self.task.done() and (self.task.cancelled() or self.task.exception() is not None):
            self.task = None  # retried by the next call
        return set(self.names)


def feed_status(feed: LiveFeed | None, ring: LiveRing,
                scope: frozenset[str] | None) -> dict[str, Any]:  # fmt: skip
    """The live feed's state as ``/v1/live`` shows it to a token of ``scope``.

    Why a paused feed paused is its error's kind only (the text can name the broker's
    address: it goes to the log). The ring's counts span every tenant, so only an
    all-tenant token (``scope`` None) sees them."""
    out: dict[str, Any] = {"enabled": feed is not None,
                           "running": bool(feed and feed.running),
                           "error": feed.error_kind if feed else None,
                           "per_tenant": ring.per_tenant}  # fmt: skip
    if scope is None:
        out.update(ring.stats())
    return out


def wire_ui(
    app: faust.App,
    ctx: RoleContext,
    authorizer: Authorizer,
    denied: Callable[..., Response | None],
    json_response: Callable[..., Response],
) -> StatusFn:
    """Add the page, its static files and ``/v1/live``; returns a health-details callable."""
    settings, store = ctx.settings, ctx.store
    r = settings.respond
    ring = LiveRing(per_tenant=max(r.live_per_tenant, 1), max_tenants=r.live_max_tenants)
    feed: LiveFeed | None = None
    if r.live_per_tenant > 0:
        feed = LiveFeed(settings, ring, loop=app.loop, beacon=app.beacon)
        ctx.run(feed)
    counts = TenantCounts(store)
    directory = TenantDirectory(store)
    files = {name: static_file(name) for name in STATIC}

    def serve(view: View, name: str) -> Response:
        # the type goes in the headers: aiohttp refuses a charset in ``content_type``
        headers = {
            "Content-Type": STATIC[name],
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
        }
        if name == "index.html":
            headers["Content-Security-Policy"] = CSP
        return view.bytes(files[name], headers=headers)

    @app.page("/ui")
    class UiRoot(View):
        async def get(self, request: Request) -> Response:
            return serve(self, "index.html")

    @app.page("/ui/")
    class UiIndex(View):
        async def get(self, request: Request) -> Response:
            return serve(self, "index.html")

    @app.page("/ui/static/{name}")
    class UiStatic(View):
        async def get(self, request: Request, name: str) -> Response:
            if name not in STATIC:
                return json_response(self, {"error": "not found"}, 404)
            return serve(self, name)

    def store_ready() -> bool:
        return store.store is not None and store.connected.is_set()

    async def tenant_rows(scope: frozenset[str] | None) -> tuple[list[str], list[str]]:
        """(tenants to list, notes): most recently active first, then by name."""
        notes: list[str] = []
        if scope is not None:
            names = set(scope)
        else:
            names = set(ring.known)
            if store_ready():
                names |= await directory.get()
                if not directory.complete and directory.at > 0:
                    notes.append(
                        f"tenant list from the newest events and the first "
                        f"{directory.max_rows:,} stored rows only"
                    )
        last = ring.known
        order = sorted(names, key=lambda t: (-last.get(t, -1), t))
        return order, notes

    @app.page("/v1/live")
    class LiveView(View):
        async def get(self, request: Request) -> Response:
            if (no := denied(self, request)) is not None:
                return no
            scope = authorizer.scope(request.headers.get("Authorization"))
            tenant = request.query.get("tenant") or None
            if tenant is not None and not (
                TENANT_NAME.fullmatch(tenant) and len(tenant) <= LIMITS.max_id_chars
            ):
                # the reads' rule (`schemas.models.Ident`): not echoed back as a tenant
                return json_response(self, {"error": f"tenant must match {TENANT_NAME.pattern}"
                                            f" (at most {LIMITS.max_id_chars} characters)"},
                                     422)  # fmt: skip
            if tenant is not None and (no := denied(self, request, tenant)) is not None:
                return no
            names, notes = await tenant_rows(scope)
            counted: dict[str, dict[str, int]] = {}
            if store_ready():
                try:
                    counted = await counts.get(names[:MAX_COUNTED])
                except Exception as exc:  # noqa: BLE001 - show the rest; say why
                    log.warning("live page counts failed: %s", exc)
                    notes.append(f"counts unavailable: {type(exc).__name__}")
            else:
                notes.append("store not ready: counts unavailable")
            if len(names) > MAX_COUNTED:
                notes.append(
                    f"counts for the {MAX_COUNTED} most recently active of {len(names):,} tenants"
                )
            if tenant is None and names:
                tenant = names[0]
            gate = await asyncio.to_thread(gate_summary, ring.snapshot(tenant)) if tenant else None
            rows = []
            for t in names:
                lo, hi = ring.thresholds(t)
                rows.append(
                    {
                        "tenant": t,
                        **counted.get(t, {}),
                        "last_event_ts": ring.known.get(t),
                        "theta_low": lo,
                        "theta_high": hi,
                    }
                )
            body = {
                "now_ms": int(time.time() * 1000),
                "tenant": tenant,
                "tenants": rows,
                "gate": gate,
                "dead_letters": ring.dead_letters(50) if scope is None else None,
                "dead_letters_note": None if scope is None
                else "dead letters carry no trustworthy tenant: an all-tenant token reads them",
                "feed": feed_status(feed, ring, scope),
                "notes": notes,
            }  # fmt: skip
            return json_response(self, body)

    _ = (UiRoot, UiIndex, UiStatic, LiveView)
    # /health is open: whether the feed runs, never its counts over every tenant
    return lambda: {"live_feed": bool(feed and feed.running)}
