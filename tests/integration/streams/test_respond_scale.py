"""The respond role scaled to two workers behind one request topic (issue 15).

Real Tansu broker, real Milvus 2.3.5 server, two ``respond`` worker processes in
one consumer group. Every search sent over Kafka is answered (with the asking
agent's rows only), and both workers answer some: the group splits the
request partitions between them.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import pytest

from dmem.client import Client
from milvus import MemoryStore
from operators import HashingEncoder
from streams.local.stack import LocalStack
from tests.integration.broker_fixtures import isolated_env
from tests.integration.milvus_fixtures import make_record

pytestmark = pytest.mark.integration
AGENTS = [f"agent-{i}" for i in range(8)]  # request keys spread over the partitions


def searches_served(port: int) -> float:
    """The worker's count of Milvus searches (``dmem_milvus_latency_seconds{op="search"}``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("dmem_milvus_latency_seconds_count") and 'op="search"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_two_respond_workers_share_the_request_topic(
    tmp_path: Path, broker: str, topic_prefix: str, milvus_server_uri: str
) -> None:
    env = isolated_env(topic_prefix, DMEM_MILVUS__URI=milvus_server_uri)
    stack = LocalStack(tmp_path / "data", roles=("respond",), extra_env=env,
                       broker_bootstrap=broker)  # fmt: skip
    stack.start_broker()
    s = stack.settings
    enc = HashingEncoder(dim=s.encoder.dim)
    store = MemoryStore(milvus_server_uri, collection=s.milvus.collection, dim=s.encoder.dim)
    store.connect()
    try:
        texts = [f"{a} found the key under the mat, note {i}" for a in AGENTS for i in range(3)]
        vecs = enc.encode(texts)
        rows = [make_record(f"m{j}", dim=s.encoder.dim, agent_id=AGENTS[j // 3],
                            vector=vecs[j], text=texts[j]) for j in range(len(texts))]  # fmt: skip
        store.upsert(rows, "core")
    finally:
        store.close()
    workers = [stack.start_worker("respond") for _ in range(2)]
    for w in workers:
        stack.wait_ready(w)

    async def ask_all(rounds: int) -> list[list[str]]:
        c = Client(broker, "acme", topic_prefix=topic_prefix, timeout_s=5.0, retries=4)
        await c.start()
        try:
            out = []
            for _ in range(rounds):
                for a in AGENTS:
                    hits = await c.search("where is the key", k=5, agent_id=a)
                    out.append(sorted({h.agent_id or "" for h in hits}))
            return out
        finally:
            await c.stop()

    # until both members are in the group (a join rebalances it), then the measured round
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all(asyncio.run(ask_all(1))) and all(searches_served(p) > 0 for p in stack.web_ports):
            break
        time.sleep(1.0)
    before = [searches_served(p) for p in stack.web_ports]
    got = asyncio.run(ask_all(3))
    after = [searches_served(p) for p in stack.web_ports]
    stack.stop_workers()
    assert got == [[a] for _ in range(3) for a in AGENTS]  # every search answered, own rows
    assert all(b > a for a, b in zip(before, after, strict=True)), (before, after)
