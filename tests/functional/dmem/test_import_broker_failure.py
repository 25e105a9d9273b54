"""`dmem import` when the broker fails part way: a retriable `BrokerUnavailable` that
says how far the import got and that importing again is safe, not a raw Kafka error."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaConnectionError

import dmem.importer as importer
from schemas.errors import BrokerUnavailable
from streams.settings import Settings


class _Producer:
    """Acknowledges the first ``ok`` sends, then fails as a broker that went away."""

    ok = 1500

    def __init__(self, **_: Any) -> None:
        self.sent = 0

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, topic: str, value: bytes, **_: Any) -> asyncio.Future[Any]:
        self.sent += 1
        if self.sent > self.ok:
            raise KafkaConnectionError("no connection to the broker")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    async def flush(self) -> None:
        pass


def _import_outcomes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     producer: type[_Producer]) -> BrokerUnavailable:  # fmt: skip
    """Import 2,000 outcomes through ``producer``; the error the import raises."""
    path = tmp_path / "run.jsonl"
    lines = [{"type": "outcome", "tenant": "t", "agent_id": "a", "episode_id": f"e{i}",
              "reward": 1.0} for i in range(2000)]  # fmt: skip
    path.write_bytes(b"\n".join(orjson.dumps(x) for x in lines) + b"\n")
    monkeypatch.setattr(importer, "AIOKafkaProducer", producer)
    with pytest.raises(BrokerUnavailable) as err:
        asyncio.run(importer._publish(Settings(), path, None, 1.0))
    return err.value


def test_a_broker_failure_mid_import_says_how_far_it_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _import_outcomes(tmp_path, monkeypatch, _Producer)
    assert err.retriable
    msg = str(err)
    assert "line 1501 of" in msg and "1000 records were acknowledged" in msg
    assert "idempotent by id" in msg


class _LostDeliveries(_Producer):
    """Takes every send, but the deliveries after the first ``ok`` fail (a broker that
    went away with the batch in flight): ``flush`` waits for them and raises nothing."""

    async def send(self, topic: str, value: bytes, **_: Any) -> asyncio.Future[Any]:
        self.sent += 1
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.sent > self.ok:
            fut.set_exception(KafkaConnectionError("no connection to the broker"))
        else:
            fut.set_result(None)
        return fut


def test_a_failed_delivery_of_an_outcome_is_no_silent_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _import_outcomes(tmp_path, monkeypatch, _LostDeliveries)
    assert "1000 records were acknowledged" in str(err)
