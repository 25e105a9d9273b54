"""A real Kafka broker for integration tests (one per session).

The backend is ``DMEM_TEST_BACKEND`` (`dmem_bench.backends`): ``embedded`` (default)
is the Tansu broker on a free loopback port, ``containers`` Apache Kafka (KRaft) from
docker-compose.yml's image via testcontainers. A backend that cannot run here skips
every test that needs it, with the reason.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from dmem_bench.backends import BackendChoice, backend_from_env, broker_service

# Tansu answers a new consumer group's first JoinGroup after half the member's session
# timeout: a worker start waits for its roles' joins (made together) and then faust's,
# ~10 s at the product's 10 s session. A 4 s session (heartbeats every 0.5 s) makes
# each join 2 s. Only on the embedded broker: Apache Kafka refuses sessions
# below its group.min.session.timeout.ms (6 s). A value set by the caller is kept.
FAST_GROUPS = {"DMEM_KAFKA__SESSION_TIMEOUT_S": "4", "DMEM_KAFKA__HEARTBEAT_INTERVAL_S": "0.5"}


@pytest.fixture(scope="session")
def test_backend() -> BackendChoice:
    """The services' backend for this session (resolved once: auto probes Docker)."""
    return backend_from_env()


@pytest.fixture(scope="session")
def broker(test_backend: BackendChoice, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if test_backend.skip_reason:
        pytest.skip(test_backend.skip_reason)
    with broker_service(test_backend, Path(tmp_path_factory.mktemp("broker"))) as bootstrap:
        yield bootstrap


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


def tokened_stack(data: Path, broker: str, topic_prefix: str, tokens: dict[str, list[str]]) -> Any:
    """A one-process (``all``) `LocalStack` on ``broker`` with bearer ``tokens``
    (and so Kafka record credentials on), fast write batches; use it with ``with``."""
    from streams.local.stack import LocalStack

    env = isolated_env(topic_prefix, DMEM_WRITE__BATCH_WITHIN_S="0.2",
                       DMEM_AUTH__TOKENS=orjson.dumps(tokens).decode())  # fmt: skip
    return LocalStack(data, roles=("all",), extra_env=env, broker_bootstrap=broker)


async def produce(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes | None, bytes]],
    token: str | None = None,
) -> None:
    """Produce ``records``; with ``token``, each record whose value names a tenant
    carries that token's Kafka credential (as the SDK sends it)."""
    from schemas.credentials import TenantSigner

    signer = TenantSigner(token) if token else None
    # the workers' own limit: a tenant's checkpoint on the models topic can pass 1 MiB
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_request_size=8 << 20)
    await p.start()
    try:
        for key, value in records:
            headers = None
            if signer is not None:
                try:
                    tenant = orjson.loads(value).get("tenant")
                except orjson.JSONDecodeError:
                    tenant = None
                if isinstance(tenant, str):
                    headers = signer.headers(tenant, value)
            await p.send(topic, value, key=key, headers=headers)
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
