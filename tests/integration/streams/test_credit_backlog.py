"""A worker that starts behind its input (a restart, the stream published while it was
down) loses no credit: it reads the backlog in bulk, the credit job's updates for
memories that only hindsight writes come before those rows, and they wait for them
(the hindsight agent's commit of their outcome), however short the applier's
time-based hold."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dmem.wait import wait_settled
from dmem_bench.replay import make_stream
from milvus import MemoryStore
from operators.encoders import encoder_dim
from schemas import MemoryUsage, Transition, encode
from streams.local.stack import LocalStack
from tests.integration.broker_fixtures import isolated_env, produce

pytestmark = pytest.mark.integration


def test_credit_for_hindsight_writes_survives_a_worker_behind(tmp_path: Path, broker: str,
                                                        topic_prefix: str) -> None:  # fmt: skip
    records = make_stream("cliffwalking", 200, 7)  # one episode, with hindsight writes
    env = isolated_env(topic_prefix, DMEM_JOBS__CREDIT_HOLD_S="0.1")
    stack = LocalStack(tmp_path / "data", roles=("all",), extra_env=env, broker_bootstrap=broker)
    stack.start_broker()  # topics; no worker yet: everything is published while it is down
    s = stack.settings
    try:
        by_topic: dict[str, list[tuple[bytes, bytes]]] = {}
        for r in records:
            if isinstance(r, Transition):
                topic, key = s.topic("transitions"), r.agent_id
            elif isinstance(r, MemoryUsage):
                topic, key = s.topic("usage"), r.episode_id
            else:
                topic, key = s.topic("feedback"), r.episode_id
            by_topic.setdefault(topic, []).append((key.encode(), encode(r)))
        for topic, recs in by_topic.items():
            asyncio.run(produce(broker, topic, recs))
        stack.wait_ready(stack.start_worker("all"))
        wait_settled([f"http://127.0.0.1:{stack.web_ports[0]}"], 180.0, 1.0)
        stack.stop_workers()
        store = MemoryStore(s.milvus_uri, collection=s.milvus.collection,
                            dim=encoder_dim(s.encoder.name, s.encoder.dim)).connect()  # fmt: skip
        try:
            rows = {
                r["id"]: r
                for r in store.scan(tenant="replay", output_fields=["id", "uses", "metadata"])
            }
        finally:
            store.close()
    finally:
        stack.stop()
    retro = {m for m, r in rows.items() if r["metadata"]["gate"]["reason"] == "retrospective"}
    used = {m for r in records if isinstance(r, MemoryUsage) for m in r.memory_ids}
    credited = retro & used
    assert credited, "the stream must store used memories by hindsight"
    uncredited = sorted(m for m in credited if int(rows[m].get("uses") or 0) == 0)
    assert not uncredited, f"used hindsight memories without credit: {uncredited}"
