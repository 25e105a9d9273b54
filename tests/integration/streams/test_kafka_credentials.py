"""Kafka record credentials on the real broker and a real worker (all roles).

With tokens configured, the worker treats Kafka as an untrusted edge
(`streams.auth.KafkaGuard`): a transition without a credential for its tenant
is not stored, a retrieval request without one gets no reply on any topic, a
forged forget on ``control`` deletes nothing, and a poisoned checkpoint on
``models`` is refused at the next restore while the write worker keeps storing.
The SDK, given the tenant's token, signs what it sends and reads its replies
on the tenant's own topic.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from dmem.client import Client
from milvus import MemoryStore
from schemas import AccessCount, MemoryEvent, RetrievalRequest, Transition, encode
from schemas.credentials import ServiceSigner, TenantSigner, reply_topic_for
from streams.local.stack import LocalStack
from streams.settings import Settings
from streams.write.pipeline import TenantState, state_key
from tests.integration.broker_fixtures import collect, decode_all, isolated_env

pytestmark = pytest.mark.integration

TOKENS = '{"tok-a": ["a"], "tok-b": ["b"]}'
PUB = "00000000000000aa"  # a responder's id
SECRET = "integration-service-secret"


def walk(tenant: str, episode: str, steps: int = 12) -> list[Transition]:
    return [
        Transition(tenant=tenant, agent_id="walker", episode_id=episode, step=k,
                   observation=f"{tenant} room {k} of {episode}", action="forward",
                   reward=(10.0, -10.0, -0.1)[k % 3],
                   next_observation=f"{tenant} room {k + 1} of {episode}", done=k == steps - 1)
        for k in range(steps)
    ]  # fmt: skip


async def send(bootstrap: str, topic: str, records: list[tuple[bytes, bytes, Any]]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await p.start()
    try:
        for key, value, headers in records:
            await p.send_and_wait(topic, value, key=key, headers=headers or None)
    finally:
        await p.stop()


async def topics_naming(bootstrap: str, prefix: str, marker: bytes) -> list[str]:
    """Every topic of this test with a record whose key is, or whose value holds, `marker`."""
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                         enable_auto_commit=False)  # fmt: skip
    await c.start()
    try:
        names = sorted(t for t in await c.topics() if t.startswith(prefix))
        c.subscribe(names)
        found: set[str] = set()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            for tp, msgs in (await c.getmany(timeout_ms=500)).items():
                found.update(tp.topic for m in msgs
                             if m.key == marker or marker in (m.value or b""))  # fmt: skip
        return sorted(found)
    finally:
        await c.stop()


def wait_for(pred: Any, timeout_s: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_kafka_credentials_end_to_end(
    tmp_path: Path, broker: str, topic_prefix: str, milvus_server_uri: str
) -> None:
    env = isolated_env(
        topic_prefix,
        DMEM_AUTH__TOKENS=TOKENS,
        DMEM_AUTH__SERVICE_SECRET=SECRET,
        DMEM_MILVUS__URI=milvus_server_uri,
        DMEM_WRITE__CHECKPOINT_EVERY_S="0.5",
        DMEM_WRITE__BATCH_WITHIN_S="0.2",
        DMEM_MAINTENANCE__ACCESS_FLUSH_S="0.5",
        DMEM_LOG_LEVEL="info",
    )
    stack = LocalStack(tmp_path / "data", roles=("all",), extra_env=env, broker_bootstrap=broker)
    stack.start_broker()
    s: Settings = stack.settings
    w = stack.start_worker("all")
    store = None
    try:
        stack.wait_ready(w)

        def sdk() -> Client:
            return Client(broker, "b", topic_prefix=topic_prefix, token="tok-b", timeout_s=5,
                          retries=8)  # fmt: skip

        # -- writes: signed by B's token stored; none / A's token for B dead-lettered -----
        good, unsigned, a_for_b = walk("b", "e1"), walk("b", "e2"), walk("b", "e3")
        signer_a = TenantSigner("tok-a")

        async def write() -> None:
            async with sdk() as c:
                await c.publish_many(good)
            await send(broker, s.topic("transitions"),
                       [(b"walker", encode(t), None) for t in unsigned]
                       + [(b"walker", encode(t), signer_a.headers("b", encode(t)))
                          for t in a_for_b])  # fmt: skip

        asyncio.run(write())
        # HTTP ingest of an authenticated caller: the service vouches for it on Kafka
        via_http = walk("b", "e5")
        port = stack.web_ports[stack.workers.index(w)]
        body = b"[" + b",".join(encode(t) for t in via_http) + b"]"
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/transitions",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": "Bearer tok-b"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 202
        good = good + via_http
        n = len(good) + len(unsigned) + len(a_for_b)
        out = decode_all(asyncio.run(collect(
            broker, [s.topic("memories"), s.topic("deadletter")],
            lambda m: len(m) >= n)))  # fmt: skip
        events = [m for m in out if m["_topic"] == s.topic("memories")]
        dead = [m for m in out if m["_topic"] == s.topic("deadletter")]
        assert {e["memory_id"] for e in events} == {t.memory_id for t in good}
        assert len(dead) == len(unsigned) + len(a_for_b)
        assert {d["reason"] for d in dead} == {"unauthenticated"}
        written = [e["memory_id"] for e in events if e["kind"] == "written"]
        assert len(written) >= 3, "the signed walks must store three memories at least"
        store = MemoryStore(milvus_server_uri, collection=s.milvus.collection, dim=s.encoder.dim)
        store.connect()
        refused = [t.memory_id for t in unsigned + a_for_b]
        assert store.get(refused, tenant="b") == []

        # -- reads: no credential, no reply anywhere; B's SDK reads B's own topic ---------
        bare = RetrievalRequest(request_id="rq-bare", tenant="b", query="room 3", k=3)
        asyncio.run(send(broker, s.topic("requests"), [(b"b", encode(bare), None)]))

        async def search() -> tuple[list[Any], str]:
            async with sdk() as c:
                return await c.search("room 3", k=3), c.reply_topic

        hits, reply_topic = asyncio.run(search())
        assert hits and all(h.memory_id in written for h in hits)
        wait_for(lambda: any(
            m["reason"] == "unauthenticated" and m["stage"] == "respond"
            for m in decode_all(asyncio.run(collect(broker, [s.topic("deadletter")],
                                                    lambda m: False, timeout_s=2)))),
            what="the bare request's dead letter")  # fmt: skip
        assert asyncio.run(topics_naming(broker, topic_prefix, b"rq-bare")) == [s.topic("requests")]
        assert reply_topic == reply_topic_for(s.topic("responses"), "b")

        # -- access counts: the respond role publishes them signed, the jobs role folds
        # them; a forged count (bare, or signed with B's own token) changes nothing ------
        def access_n(mid: str) -> int:
            rows = store.get([mid], tenant="b")
            meta = (rows[0].get("metadata") or {}) if rows else {}
            return int((meta.get("access") or {}).get("n", 0))

        served = sorted({h.memory_id for h in hits})
        wait_for(lambda: all(access_n(m) >= 1 for m in served), what="the served hits' counts")
        target = served[0]
        before = access_n(target)
        service = ServiceSigner(SECRET.encode())
        fake = encode(AccessCount(memory_id=target, tenant="b", n=1000, ts=1, publisher=PUB, seq=1))
        ok = encode(AccessCount(memory_id=target, tenant="b", n=5, ts=1, publisher=PUB, seq=2))
        key = target.encode()
        asyncio.run(send(broker, s.topic("access"), [
            (key, fake, None),
            (key, fake, TenantSigner("tok-b").headers("b", fake)),  # an agent's, not ours
            (key, ok, service.headers(key, ok)),
        ]))  # fmt: skip
        # one memory's counts are read in order: the signed one last
        wait_for(lambda: access_n(target) >= before + 5, what="the signed access count")
        assert access_n(target) == before + 5
        # sent again (an unacknowledged send retried with its round) it adds nothing;
        # the publisher's next round, read after it, adds its 1
        nxt = encode(AccessCount(memory_id=target, tenant="b", n=1, ts=2, publisher=PUB, seq=3))
        asyncio.run(send(broker, s.topic("access"), [
            (key, ok, service.headers(key, ok)), (key, nxt, service.headers(key, nxt)),
        ]))  # fmt: skip
        wait_for(lambda: access_n(target) >= before + 6, what="the next round's count")
        assert access_n(target) == before + 6

        # -- a forged forget deletes nothing; a signed one after it does ------------------
        victim, other = written[0], written[-1]
        now = int(time.time() * 1000)
        forged = encode(MemoryEvent(kind="forgotten", memory_id=victim, tenant="b", ts=now))
        real = encode(MemoryEvent(kind="forgotten", memory_id=other, tenant="b", ts=now))
        asyncio.run(send(broker, s.topic("control"), [
            (b"b", forged, None),
            (b"b", forged, TenantSigner("tok-b").headers("b", forged)),  # an agent's, not ours
            (b"b", real, service.headers(b"b", real)),
        ]))  # fmt: skip
        # the follower reads `control` in order: once the signed forget is applied, the
        # two forged ones before it have been read (and refused)
        wait_for(lambda: store.get([other], tenant="b") == [], what="the signed forget")
        assert [r["id"] for r in store.get([victim], tenant="b")] == [victim]
        # a forget over HTTP is broadcast on `control` with the service's signature
        third = written[1]
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/forget",
            method="POST",
            data=orjson.dumps({"tenant": "b", "memory_id": third}),
            headers={"Content-Type": "application/json", "Authorization": "Bearer tok-b"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
        notices = [m for m in asyncio.run(collect(
            broker, [s.topic("control")],
            lambda ms: any(third.encode() in (m.value or b"") for m in ms), timeout_s=30))
            if third.encode() in (m.value or b"")]  # fmt: skip
        assert notices and all(service.ok(m.key, m.value, m.headers) for m in notices)

        # -- a poisoned checkpoint: refused at the next restore, the worker keeps storing --
        stack.stop_workers()  # its last checkpoints are on `models` now
        big = s.value.model_copy(update={"hidden": 128})
        poison = TenantState(s.model_copy(update={"value": big}), s.encoder.dim).to_bytes()
        records = []
        for part in range(s.kafka.partitions):
            key = state_key("b", part)
            records.append((key, poison, service.headers(key, poison)))  # sizes refused
            records.append((key, poison, None))  # unsigned: never indexed
        asyncio.run(send(broker, s.topic("models"), records))
        w2 = stack.start_worker("all")
        stack.wait_ready(w2)
        fresh = walk("b", "e4")

        async def write_more() -> None:
            async with sdk() as c:
                await c.publish_many(fresh)

        asyncio.run(write_more())
        ids = {t.memory_id for t in fresh}
        after = decode_all(asyncio.run(collect(
            broker, [s.topic("memories")],
            lambda m: ids <= {orjson.loads(x.value)["memory_id"] for x in m})))  # fmt: skip
        assert ids <= {e["memory_id"] for e in after}
        assert w2.alive
        log = w2.log_path.read_text()
        assert "checkpoint refused: hidden=128, configured 64" in log
        assert "refused an unsigned or forged checkpoint" in log
    finally:
        if store is not None:
            store.close()
        stack.stop_workers()
