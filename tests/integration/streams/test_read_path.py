"""The read path against the real broker and Milvus: Kafka and HTTP search,
score breakdowns, usage events, tenant isolation, responder restart."""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dmem.client import Client
from schemas import Transition
from streams.local.stack import LocalStack
from tests.integration.broker_fixtures import collect, decode_all, isolated_env

pytestmark = pytest.mark.integration


def transitions(tenant: str, n_eps: int = 6) -> list[Transition]:
    out = []
    for e in range(n_eps):
        for k in range(10):
            trap = k == 4
            out.append(
                Transition(
                    tenant=tenant,
                    agent_id="agent",
                    episode_id=f"{tenant}-ep{e}",
                    step=k,
                    observation=f"standing at the edge of crater {k}"
                    if trap
                    else f"walking on the quiet road mile {k}",
                    action="jump" if trap else "walk",
                    reward=-20.0 if trap else -0.1,
                    next_observation=f"mile {k + 1}",
                    metadata={"secret": tenant, "k": k},
                )
            )
    return out


@pytest.fixture(params=["lite", "server"])
def stack(request: pytest.FixtureRequest, tmp_path: Path, broker: str, topic_prefix: str) -> Any:
    env = isolated_env(
        topic_prefix,
        DMEM_WRITE__BATCH_WITHIN_S="0.2",
        DMEM_LOG_LEVEL="info",
    )
    roles: tuple[str, ...] = ("all",)
    if request.param == "server":
        env["DMEM_MILVUS__URI"] = request.getfixturevalue("milvus_server_uri")
        env["DMEM_MILVUS__SEARCH_CONSISTENCY"] = "Strong"
        roles = ("write", "respond")
    s = LocalStack(tmp_path / "data", roles=roles, extra_env=env, broker_bootstrap=broker)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def http_port(stack: LocalStack) -> int:
    for w, port in zip(stack.workers, stack.web_ports, strict=True):
        if w.role in ("all", "respond"):
            return port
    raise AssertionError("no respond worker")


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def load(stack: LocalStack) -> dict[str, list[Transition]]:
    data = {t: transitions(t) for t in ("alpha", "beta")}
    s = stack.settings
    for tenant, ts in data.items():  # a client writes its own tenant's records
        async with Client(stack.bootstrap, tenant, topic_prefix=s.kafka.topic_prefix) as c:
            await c.publish_many(ts)
    total = sum(len(v) for v in data.values())
    msgs = await collect(stack.bootstrap, [s.topic("memories")], lambda m: len(m) >= total)
    assert len(msgs) >= total
    return data


async def search_until(c: Client, query: str, timeout_s: float = 30, **kw: Any) -> list:
    deadline = time.monotonic() + timeout_s
    while True:
        hits = await c.search(query, **kw)
        if hits or time.monotonic() > deadline:
            return hits
        await asyncio.sleep(0.5)


def test_search_kafka_http_isolation_usage_and_restart(stack: LocalStack) -> None:
    s = stack.settings
    prefix = s.kafka.topic_prefix
    data = asyncio.run(load(stack))
    alpha_ids = {t.memory_id for t in data["alpha"]}
    beta_ids = {t.memory_id for t in data["beta"]}
    port = http_port(stack)

    async def kafka_checks() -> list:
        async with Client(stack.bootstrap, "alpha", topic_prefix=prefix) as c:
            hits = await search_until(
                c, "standing at the edge of crater 4", k=5, episode_id="alpha-live", step=3
            )
            assert hits
            assert {h.memory_id for h in hits} <= alpha_ids
            assert hits[0].action == "jump" and hits[0].valence == -1
            assert hits[0].partition == "core"
            for h in hits:
                b = h.breakdown
                assert math.isclose(
                    b.score,
                    b.lambda_ * b.semantic + (1 - b.lambda_) * b.salience * b.recency,
                    rel_tol=1e-9,
                )
                assert 0 <= b.semantic <= 1 and 0 <= b.salience <= 1
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
            # lambda override: pure semantic ranking
            sem = await c.search("standing at the edge of crater 4", k=5, lambda_=1.0)
            assert all(h.breakdown.lambda_ == 1.0 for h in sem)
            # filters narrow, hostile filter values never widen scope
            neg = await c.search("walking on the quiet road", k=10, valence=-1)
            assert all(h.valence == -1 for h in neg)
            for hostile in [
                '" or tenant != "',
                'alpha" || 1==1 || "',
                "x') or ('1'='1",
                "ünïcødé \u202e",
                "beta",
            ]:
                res = await c.search("crater", k=10, metadata_equals={"secret": hostile})
                assert res == [], hostile
            # unknown tenant: empty answer, not an error
            async with Client(stack.bootstrap, "nobody", topic_prefix=prefix) as other:
                assert await other.search("crater", k=5) == []
            return hits

    hits = asyncio.run(kafka_checks())

    # usage event for the request with an episode_id
    usage = decode_all(
        asyncio.run(
            collect(stack.bootstrap, [s.topic("usage")], lambda m: len(m) >= 1, timeout_s=20)
        )
    )
    assert usage and usage[0]["episode_id"] == "alpha-live" and usage[0]["step"] == 3
    assert usage[0]["memory_ids"] == [h.memory_id for h in hits]
    assert math.isclose(sum(usage[0]["weights"]), 1.0, rel_tol=1e-9)

    # HTTP: same search, validation errors, memory lookup with tenant scoping
    base = f"http://127.0.0.1:{port}"
    code, body = http(
        "POST",
        base + "/v1/search",
        {"tenant": "beta", "query": "standing at the edge of crater 4", "k": 3},
    )
    assert code == 200 and body["hits"]
    assert {h["memory_id"] for h in body["hits"]} <= beta_ids
    assert set(body["hits"][0]["breakdown"]) >= {
        "semantic",
        "salience",
        "recency",
        "lambda",
        "score",
    }
    code, body = http("POST", base + "/v1/search", {"tenant": "beta", "k": 3})
    assert code == 422 and body["error"] == "invalid request"
    code, body = http("POST", base + "/v1/search", {"tenant": 'beta" or 1==1', "query": "x"})
    assert code == 422
    code, _ = http(
        "POST",
        base + "/v1/search",
        {"tenant": "beta", "query": "x", "filters": {"metadata_equals": {"a b": 1}}},
    )
    assert code == 422
    mid = hits[0].memory_id
    code, row = http("GET", f"{base}/v1/memories/{mid}?tenant=alpha")
    assert code == 200 and row["id"] == mid and row["tenant"] == "alpha"
    code, _ = http("GET", f"{base}/v1/memories/{mid}?tenant=beta")
    assert code == 404

    # responder restart: a client that retries gets its answer
    responder = next(w for w in stack.workers if w.role in ("all", "respond"))

    async def across_restart() -> list:
        async with Client(
            stack.bootstrap, "alpha", topic_prefix=prefix, timeout_s=4, retries=20
        ) as c:
            responder.kill()
            task = asyncio.create_task(c.search("standing at the edge of crater 4", k=3))
            await asyncio.sleep(1.0)
            assert not task.done()
            responder.start()
            return await asyncio.wait_for(task, 120)

    again = asyncio.run(across_restart())
    assert again and {h.memory_id for h in again} <= alpha_ids
