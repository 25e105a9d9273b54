"""Real Tansu broker for integration tests (one per session, free port)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from streams.local.embedded import EmbeddedBroker


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = Path(tmp_path_factory.mktemp("broker")) / "tansu.log"
    b = EmbeddedBroker(log_path=log)
    b.start()
    try:
        yield b.bootstrap
    finally:
        b.stop()


@pytest.fixture
def topic_prefix() -> str:
    """Each test gets its own topics, so tests never see each other's records."""
    return f"t{uuid.uuid4().hex[:8]}."


def isolated_env(prefix: str, **overrides: str) -> dict[str, str]:
    """Worker settings that keep a test to its own topics, group and collection."""
    return {
        "DMEM_ENCODER__NAME": "hash",
        "DMEM_KAFKA__TOPIC_PREFIX": prefix,
        "DMEM_APP_ID": prefix.rstrip("."),
        "DMEM_MILVUS__COLLECTION": prefix.rstrip(".").replace(".", "_") + "_mem",
        **overrides,
    }


async def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await p.start()
    try:
        for key, value in records:
            await p.send(topic, value, key=key)
        await p.flush()
    finally:
        await p.stop()


async def collect(
    bootstrap: str,
    topics: list[str],
    until: Any,
    timeout_s: float = 90.0,
) -> list[Any]:
    """Consume `topics` from the beginning until `until(messages)` is true."""
    c = AIOKafkaConsumer(
        *topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await c.start()
    msgs: list[Any] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    try:
        while not until(msgs) and loop.time() < deadline:
            batch = await c.getmany(timeout_ms=500)
            for part in batch.values():
                msgs.extend(part)
    finally:
        await c.stop()
    return msgs


def decode_all(msgs: list[Any]) -> list[dict[str, Any]]:
    return [orjson.loads(m.value) | {"_topic": m.topic} for m in msgs]
