"""The respond role's HTTP routes (`streams.respond.http.RespondApi`) behind a real
aiohttp server, with auth on and a fake store: what a client is told when the store
fails, and how malformed query parameters, cursors, headers and bodies are answered."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import faust
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from milvus.history import FoldEdges
from schemas.errors import InvalidRecord, StoreError, StoreUnavailable
from streams.respond.http import RespondApi
from streams.settings import AuthSettings, Settings

#: what the store's errors say: the Milvus address a client must never see
LEAK = "Milvus query on 'dmem_memories' at http://127.0.0.1:39217"
OPS = {"Authorization": "Bearer ops"}
JSON = {**OPS, "Content-Type": "application/json"}
MAX_BODY = 4096


class FakeStore:
    """Answers reads empty (one history event), or raises ``fail`` from every call."""

    def __init__(self) -> None:
        self.fail: Exception | None = None
        self.history = SimpleNamespace(edges=FoldEdges(), events=self.events,
                                       folded_into=self.folded_into)  # fmt: skip

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    def lookup(self, *a: Any, **k: Any) -> list[dict[str, Any]]:
        self._check()
        return []

    get = scan = query_rows = lookup

    def folded_into(self, *a: Any, **k: Any) -> dict[str, str]:
        self._check()
        return {}

    def events(self, *a: Any, **k: Any) -> list[dict[str, Any]]:
        self._check()
        return [{"event": "written"}]

    def count(self, *a: Any, **k: Any) -> int:
        self._check()
        return 0


class View:
    """What the handlers need of a faust view: `bytes`."""

    def bytes(self, value: bytes, content_type: str | None = None, status: int = 200) -> Any:
        return web.Response(body=value, content_type=content_type, status=status)


def make_app(api: RespondApi) -> web.Application:
    view = View()
    app = web.Application(client_max_size=MAX_BODY)
    r = app.router
    r.add_post("/v1/search", lambda q: api.search(view, q))
    r.add_get("/v1/memories", lambda q: api.list_memories(view, q))
    r.add_post("/v1/memories:batch_get", lambda q: api.batch_get(view, q))
    r.add_get("/v1/memories/{m}/history", lambda q: api.history(view, q, q.match_info["m"]))
    r.add_get("/v1/memories/{m}", lambda q: api.get_memory(view, q, q.match_info["m"]))
    r.add_delete("/v1/memories/{m}", lambda q: api.delete_memory(view, q, q.match_info["m"]))
    r.add_post("/v1/forget", lambda q: api.forget(view, q))
    r.add_get("/v1/stats", lambda q: api.stats(view, q))
    return app


@pytest.fixture
async def served() -> AsyncIterator[tuple[TestClient[Any, Any], FakeStore]]:
    settings = Settings(auth=AuthSettings(tokens={"ops": ["*"], "tok-a": ["a"]}))
    store = FakeStore()
    connected = asyncio.Event()
    connected.set()
    held = SimpleNamespace(store=store, connected=connected)
    ctx = SimpleNamespace(settings=settings, store=held, record_access=lambda *a: None)
    api = RespondApi(faust.App("respond-http-test", broker="kafka://127.0.0.1:1"), ctx,
                     None)  # type: ignore[arg-type]  # fmt: skip
    sent: list[bytes] = []

    async def send(key: bytes, value: bytes) -> None:
        sent.append(value)

    api.memories = api.control = SimpleNamespace(send=send)  # type: ignore[assignment]
    client = TestClient(TestServer(make_app(api), host="127.0.0.1"))
    await client.start_server()
    try:
        yield client, store
    finally:
        await client.close()
        api.executor.shutdown(wait=False)


READS = [
    ("GET", "/v1/memories?tenant=t", None),
    ("GET", "/v1/memories?tenant=t&ids=m1,m2", None),
    ("GET", "/v1/memories/m1?tenant=t", None),
    ("GET", "/v1/memories/m1/history?tenant=t", None),
    ("POST", "/v1/memories:batch_get", {"tenant": "t", "ids": ["m1"]}),
    ("GET", "/v1/stats?tenant=t", None),
    ("POST", "/v1/forget", {"tenant": "t", "memory_id": "m1"}),
    ("DELETE", "/v1/memories/m1?tenant=t", None),
]


async def call(client: TestClient[Any, Any], method: str, path: str,
               body: Any = None) -> tuple[int, Any, Any]:  # fmt: skip
    data = orjson.dumps(body) if body is not None else None
    r = await client.request(method, path, data=data, headers=JSON)
    return r.status, await r.json(), r.headers


@pytest.mark.parametrize(("method", "path", "body"), READS)
async def test_store_failures_name_their_kind_never_their_text(
    served: tuple[TestClient[Any, Any], FakeStore], method: str, path: str, body: Any
) -> None:
    """Unreachable: 503 with Retry-After; refused: 503 without (retrying cannot help);
    invalid: 422 with the reason. Never the Milvus error's text or address."""
    client, store = served
    for fail, retry in ((StoreUnavailable(f"{LEAK} unavailable: <MilvusException: (code=2)>"),
                         "2"),
                        (StoreError(f"{LEAK} failed: <MilvusException: (code=1100, bad)>"),
                         None)):  # fmt: skip
        store.fail = fail
        status, got, headers = await call(client, method, path, body)
        assert status == 503, got
        assert got["error"].startswith(f"unavailable: {type(fail).__name__}")
        assert "127.0.0.1" not in got["error"] and "Milvus" not in got["error"]
        assert headers.get("Retry-After") == retry
    store.fail = InvalidRecord("tenant 'x' is not a tenant here")
    status, got, _ = await call(client, method, path, body)
    assert (status, got) == (422, {"error": "tenant 'x' is not a tenant here"})


async def test_a_forged_cursor_is_422_before_the_store_is_asked(
    served: tuple[TestClient[Any, Any], FakeStore],
) -> None:
    client, store = served
    store.fail = StoreError(f"{LEAK} failed: cannot parse expression")  # as Milvus answers
    for d in ({"t": True, "i": "x"}, {"t": 2**63, "i": "x"}, {"t": -(2**63), "i": "x"}):
        cursor = base64.urlsafe_b64encode(orjson.dumps(d)).decode().rstrip("=")
        status, got, _ = await call(client, "GET", f"/v1/memories?tenant=t&cursor={cursor}")
        assert status == 422 and "cursor is not a next_cursor" in got["error"], (d, got)


@pytest.mark.parametrize("limit", ["%C2%B2", "9" * 5000, "%D9%A3", "0", "10001", "-5", "+5",
                                   "", "5.0", "%205"])  # fmt: skip
async def test_history_limit_takes_ascii_digits_in_range_only(
    served: tuple[TestClient[Any, Any], FakeStore], limit: str
) -> None:
    client, _ = served
    status, got, _ = await call(client, "GET", f"/v1/memories/m1/history?tenant=t&limit={limit}")
    assert (status, got) == (422, {"error": "limit must be an integer in 1..10000"})


async def test_history_limit_in_range_is_served(
    served: tuple[TestClient[Any, Any], FakeStore],
) -> None:
    client, _ = served
    for limit in ("1", "10000", "007"):
        path = f"/v1/memories/m1/history?tenant=t&limit={limit}"
        status, got, _ = await call(client, "GET", path)
        assert status == 200 and got["events"] == [{"event": "written"}]


@pytest.mark.parametrize("tenant", ["a%00b", "a%7Cb", "%F0%9F%98%80", "a" * 5000, "a%20b"])
@pytest.mark.parametrize("route", ["/v1/stats", "/v1/memories", "/v1/memories/m1",
                                   "/v1/memories/m1/history"])  # fmt: skip
async def test_a_tenant_that_is_no_ident_is_422_on_every_read(
    served: tuple[TestClient[Any, Any], FakeStore], route: str, tenant: str
) -> None:
    client, _ = served
    status, got, _ = await call(client, "GET", f"{route}?tenant={tenant}")
    assert status == 422 and got["error"] == "invalid request", got
    assert got["detail"][0]["loc"] == ["tenant"]


@pytest.mark.parametrize(("method", "path", "extra"), [
    ("GET", "/v1/stats?tenant=t", "agent_id=a"),
    ("GET", "/v1/memories/m1?tenant=t", "agent=a"),
    ("GET", "/v1/memories/m1/history?tenant=t", "limt=5"),
    ("DELETE", "/v1/memories/m1?tenant=t", "agent_id=a"),
    ("GET", "/v1/memories?tenant=t", "agent=a"),
    ("GET", "/v1/memories?tenant=t&ids=m1,m2", "limit=1"),
])  # fmt: skip
async def test_a_query_parameter_the_route_does_not_take_is_422_before_the_store_is_asked(
    served: tuple[TestClient[Any, Any], FakeStore], method: str, path: str, extra: str
) -> None:
    """A filter the route does not apply must not answer as if it had (stats of the
    whole tenant for ``agent_id=a``, a delete wider than asked)."""
    client, store = served
    store.fail = StoreError(f"{LEAK} failed: the store was asked")
    status, got, _ = await call(client, method, f"{path}&{extra}")
    name = extra.split("=")[0]
    assert (status, got) == (422, {"error": f"unknown query parameters ['{name}']"})


async def test_stats_of_a_valid_tenant(served: tuple[TestClient[Any, Any], FakeStore]) -> None:
    client, _ = served
    status, got, _ = await call(client, "GET", "/v1/stats?tenant=t")
    assert status == 200 and (got["core"], got["buffer"], got["total"]) == (0, 0, 0)


async def test_a_non_utf8_bearer_token_is_401(
    served: tuple[TestClient[Any, Any], FakeStore],
) -> None:
    client, _ = served
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(b"GET /v1/stats?tenant=t HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Authorization: Bearer t\xf6k\r\nConnection: close\r\n\r\n")  # fmt: skip
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"401", raw
    assert b"WWW-Authenticate: Bearer" in head
    assert orjson.loads(body)["error"] == "missing or invalid bearer token"


@pytest.mark.parametrize("path", ["/v1/search", "/v1/memories:batch_get", "/v1/forget"])
async def test_a_body_over_the_limit_is_413_as_json(
    served: tuple[TestClient[Any, Any], FakeStore], path: str
) -> None:
    client, _ = served
    body = orjson.dumps({"tenant": "t", "query": "x" * MAX_BODY})
    r = await client.post(path, data=body, headers=JSON)
    assert r.status == 413 and r.content_type == "application/json"
    assert "body size" in (await r.json())["error"]


async def test_a_forget_by_a_folded_id_names_the_survivor_it_forgot(
    served: tuple[TestClient[Any, Any], FakeStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    import streams.respond.http as http
    from schemas import MemoryEvent

    def forget_scope(store: Any, tenant: str, **scope: Any) -> list[MemoryEvent]:
        return [MemoryEvent(kind="forgotten", memory_id="s1", tenant=tenant, partition="core",
                            reason=f"forget memory={scope['memory_id']} (folded into s1)",
                            ts=1)]  # fmt: skip

    monkeypatch.setattr(http, "forget_scope", forget_scope)
    client, _ = served
    calls = [("POST", "/v1/forget", {"tenant": "t", "memory_id": "f1"}),
             ("DELETE", "/v1/memories/f1?tenant=t", None),
             ("POST", "/v1/forget", {"tenant": "t", "memory_id": "s1"})]  # fmt: skip
    for method, path, body in calls:
        r = await client.request(method, path, json=body, headers=OPS)
        got = await r.json()
        assert r.status == 200, got
        want = {"tenant": "t", "forgotten": 1}
        assert got == (want if body and body["memory_id"] == "s1" else
                       {**want, "folded_into": "s1"})  # fmt: skip


async def test_a_forget_the_store_broke_off_announces_what_it_deleted(
    served: tuple[TestClient[Any, Any], FakeStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows deleted before the store failed get their audit events and notices; the
    answer is 503 (retriable) and says how many were forgotten."""
    import streams.respond.http as http
    from schemas import MemoryEvent
    from streams.jobs.forget import ForgetIncomplete

    done = [MemoryEvent(kind="forgotten", memory_id="m1", tenant="t", partition="core", ts=1)]

    def forget_scope(store: Any, tenant: str, **scope: Any) -> list[MemoryEvent]:
        raise ForgetIncomplete(StoreUnavailable("Milvus went away"), done)

    announced: list[list[MemoryEvent]] = []

    async def announce(self: Any, events: list[MemoryEvent]) -> None:
        announced.append(list(events))

    monkeypatch.setattr(http, "forget_scope", forget_scope)
    monkeypatch.setattr(http.RespondApi, "_announce", announce)
    client, _ = served
    r = await client.post("/v1/forget", json={"tenant": "t", "memory_id": "m1"}, headers=OPS)
    assert r.status == 503 and "Retry-After" in r.headers, await r.text()
    assert announced == [done]
