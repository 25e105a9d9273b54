"""`dmem report` reading a topic when no broker answers: a clear error, nothing left open."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaConnectionError

from dmem_bench.report import read_topic
from streams.settings import Settings


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_topic_read_without_a_broker_raises_and_stops_its_consumer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The consumer's start fails; its stop must still run (it closes the client the
    start opened: aiokafka warns "Unclosed AIOKafkaConsumer" otherwise)."""
    stopped: list[AIOKafkaConsumer] = []
    stop = AIOKafkaConsumer.stop

    async def counted(self: AIOKafkaConsumer, *a: Any) -> None:
        stopped.append(self)
        await stop(self, *a)

    monkeypatch.setattr(AIOKafkaConsumer, "stop", counted)
    settings = Settings()
    settings.kafka.broker = f"kafka://127.0.0.1:{closed_port()}"
    with pytest.raises(KafkaConnectionError):
        asyncio.run(read_topic(settings, "memories", 10, timeout_s=1.0))
    assert len(stopped) == 1
