"""The request guards as the worker installs them: an aiohttp server with
`guard_middleware` in front of a route that records what reached it."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from streams.settings import Settings
from streams.webguard import guard_middleware


async def serve(settings: Settings) -> tuple[TestClient[Any, Any], list[bytes]]:
    reached: list[bytes] = []

    async def ingest(request: web.Request) -> web.Response:
        reached.append(await request.read())
        return web.json_response({"accepted": 1}, status=202)

    app = web.Application(middlewares=[guard_middleware(settings)])
    app.router.add_post("/v1/transitions", ingest)
    app.router.add_get("/metrics", lambda r: web.Response(text="ok"))
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client, reached


async def test_text_plain_never_reaches_the_route() -> None:
    client, reached = await serve(Settings(web_host="127.0.0.1"))
    try:
        body = b'{"tenant":"t1","agent_id":"a","episode_id":"e","step":0,"observation":"o",' \
               b'"action":"x","reward":100}'  # fmt: skip
        r = await client.post("/v1/transitions", data=body, headers={"Content-Type": "text/plain"})
        assert r.status == 415 and "application/json" in (await r.json())["error"]
        r = await client.post("/v1/transitions", data=body)  # no type at all
        assert r.status == 415
        assert reached == []
        r = await client.post("/v1/transitions", data=body,
                              headers={"Content-Type": "application/json"})  # fmt: skip
        assert r.status == 202 and reached == [body]
    finally:
        await client.close()


async def test_foreign_host_and_origin_refused_on_loopback() -> None:
    client, reached = await serve(Settings(web_host="127.0.0.1"))
    try:
        js = {"Content-Type": "application/json"}
        r = await client.get("/metrics", headers={"Host": "rebind.attacker.example"})
        assert r.status == 421 and "web_allowed_hosts" in (await r.json())["error"]
        r = await client.post("/v1/transitions", data=b"{}",
                              headers={**js, "Origin": "https://evil.example"})  # fmt: skip
        assert r.status == 403
        assert reached == []
        r = await client.get("/metrics")  # the test client sends Host 127.0.0.1:<port>
        assert r.status == 200
    finally:
        await client.close()


async def test_allowed_hosts_setting_opens_a_name() -> None:
    client, _ = await serve(Settings(web_host="127.0.0.1", web_allowed_hosts=["dmem.test"]))
    try:
        assert (await client.get("/metrics", headers={"Host": "dmem.test:80"})).status == 200
        assert (await client.get("/metrics")).status == 421  # the list replaces the default
    finally:
        await client.close()


async def test_an_unknown_route_and_a_wrong_method_answer_json_like_every_error() -> None:
    client, reached = await serve(Settings(web_host="127.0.0.1"))
    try:
        r = await client.get("/v1/nope")
        assert (r.status, r.content_type) == (404, "application/json")
        assert await r.json() == {"error": "not found"}
        r = await client.get("/v1/transitions")
        assert (r.status, r.content_type) == (405, "application/json")
        assert await r.json() == {"error": "method not allowed"}
        assert r.headers["Allow"] == "POST"
        assert reached == []
    finally:
        await client.close()
