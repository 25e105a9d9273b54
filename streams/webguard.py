"""Guards of the worker's web server that run before any route: Host, Origin, Content-Type.

An aiohttp middleware (`guard_middleware`, installed by `streams.app.build_app`)
refuses, with a JSON reason and before the handler reads the body:

- a ``Host`` the server does not answer for (421): a DNS-rebinding page resolves
  its own name to 127.0.0.1 and then talks to the local stack as "same origin";
  the name it sends is its own. Allowed: ``web_allowed_hosts``, or, when that is
  empty and the server binds a loopback address, the loopback names only
  (``localhost``, ``127.0.0.1``, ``::1``). A server bound to another address
  (containers, Kubernetes) answers any Host unless the list is set.
- an ``Origin`` of another site (403) wherever hosts are restricted or
  ``web_allowed_origins`` is set: a cross-site page can send a request without a
  preflight, it must not have it executed. The server's own pages (the live
  page) send the server's own origin.
- a ``POST``/``PUT``/``PATCH`` whose body is not JSON or NDJSON (415): a form or
  ``text/plain`` body is what a page of any site can send without a preflight,
  so a state-changing route never parses one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson
from aiohttp import web

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
JSON_TYPES = frozenset({"application/json"})
NDJSON_TYPES = frozenset({"application/x-ndjson", "application/jsonl", "application/ndjson",
                          "application/json-seq"})  # fmt: skip
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
ANY = "*"


def host_name(value: str) -> str:
    """The host part of a ``Host`` header (no port, no IPv6 brackets), lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        return value.rsplit(":", 1)[0]
    return value


def is_loopback(address: str) -> bool:
    if address in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class Guard:
    """The three checks over one request's method and headers (pure: no aiohttp)."""

    def __init__(self, bind: str, hosts: list[str], origins: list[str]) -> None:
        names = {host_name(h) for h in hosts}
        if ANY in names:
            self.hosts: frozenset[str] | None = None
        elif names:
            self.hosts = frozenset(names)
        else:
            self.hosts = LOOPBACK_NAMES if is_loopback(bind) else None
        self.origins = frozenset(o.strip().lower().rstrip("/") for o in origins)

    @classmethod
    def from_settings(cls, settings: Any) -> Guard:
        return cls(settings.web_host, settings.web_allowed_hosts, settings.web_allowed_origins)

    def refusal(self, method: str, headers: Mapping[str, str]) -> tuple[int, str] | None:
        """None when the request may proceed, else (status, reason)."""
        if self.hosts is not None:
            host = host_name(headers.get("Host", ""))
            if host not in self.hosts:
                return 421, (
                    f"host {host!r} is not served here (allowed: {', '.join(sorted(self.hosts))};"
                    " setting web_allowed_hosts)"
                )
        origin = headers.get("Origin")
        if origin is not None and (self.hosts is not None or self.origins):
            o = origin.strip().lower().rstrip("/")
            name = urlsplit(o).hostname or ""
            if o not in self.origins and (self.hosts is None or name not in self.hosts):
                return 403, f"cross-site request from origin {origin!r} refused"
        if method.upper() in BODY_METHODS:
            ctype = headers.get("Content-Type", "").split(";")[0].strip().lower()
            if ctype not in JSON_TYPES and ctype not in NDJSON_TYPES:
                return 415, (
                    f"Content-Type {ctype or 'missing'!r} refused: send application/json "
                    "(or application/x-ndjson for NDJSON ingest)"
                )
        return None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_error(exc: web.HTTPException) -> web.Response:
    """An aiohttp error answer as a JSON body like every other error of the API (its
    headers kept: a 405's ``Allow``); its own text where it says more than the status."""
    text = exc.text or ""
    why = text if text and not text.startswith(f"{exc.status}:") else exc.reason.lower()
    headers = {k: v for k, v in exc.headers.items() if k.lower() != "content-type"}
    return web.Response(body=orjson.dumps({"error": why}), status=exc.status,
                        headers=headers, content_type="application/json")  # fmt: skip


def guard_middleware(settings: Any) -> Callable[[web.Request, Handler], Awaitable[Any]]:
    """The aiohttp middleware of `Guard` over the worker's settings."""
    guard = Guard.from_settings(settings)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        no = guard.refusal(request.method, request.headers)
        if no is not None:
            status, reason = no
            return web.Response(
                body=orjson.dumps({"error": reason}), status=status, content_type="application/json"
            )
        try:
            return await handler(request)
        except web.HTTPException as exc:  # the router's 404 / 405 and aiohttp's own
            if exc.status < 400:
                raise
            return json_error(exc)

    return middleware
