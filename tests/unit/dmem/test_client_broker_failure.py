"""A broker failure while the SDK produces is `BrokerUnavailable`, and never a success.

aiokafka's ``flush`` waits for a batch's delivery but does not raise its failure: with the
broker gone, `publish` returned as if the broker had the transition (seen on a local
stack: the broker killed, ``publish`` answered, "Future exception was never retrieved").
Records sent one by one raised aiokafka's own errors, not the SDK's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError, NodeNotReadyError

from dmem.client import Client
from schemas import Transition
from schemas.errors import BrokerUnavailable


class FailingProducer:
    """Delivers the first `ok` records, fails the rest (as a dead broker does)."""

    def __init__(self, ok: int) -> None:
        self.ok = ok
        self.sent = 0

    async def send(self, topic: str, value: bytes, key: bytes, **kw: Any) -> Any:
        fut = asyncio.get_running_loop().create_future()
        self.sent += 1
        if self.sent <= self.ok:
            fut.set_result(None)
        else:
            fut.set_exception(KafkaTimeoutError("batch expired"))
        return fut

    async def send_and_wait(self, topic: str, value: bytes, key: bytes, **kw: Any) -> None:
        raise NodeNotReadyError("node 1 is not ready")

    async def flush(self) -> None:  # as aiokafka's: waits, never raises
        pass


def _client(ok: int) -> Client:
    client = Client("127.0.0.1:9092", "acme")
    client._producer = FailingProducer(ok)  # type: ignore[assignment]
    client._started = True  # noqa: SLF001
    return client


def _t(step: int) -> Transition:
    return Transition(tenant="acme", agent_id="a", episode_id="e", step=step,
                      observation=f"saw {step}", action="go")  # fmt: skip


def test_a_failed_delivery_is_broker_unavailable_not_a_success() -> None:
    with pytest.raises(BrokerUnavailable, match="2 of 3 transitions acknowledged") as err:
        asyncio.run(_client(ok=2).publish_many([_t(0), _t(1), _t(2)]))
    assert err.value.retriable and "publishing them again is safe" in str(err.value)
    with pytest.raises(BrokerUnavailable):
        asyncio.run(_client(ok=0).publish(_t(0)))
    assert asyncio.run(_client(ok=3).publish_many([_t(0), _t(1), _t(2)])) == 3


@pytest.mark.parametrize("call", ["outcome", "feedback", "search"])
def test_a_record_sent_alone_fails_with_the_sdk_error(call: str) -> None:
    client = _client(ok=0)
    client.retries = 0

    async def go() -> Any:
        if call == "outcome":
            return await client.report_outcome("e", 1.0)
        if call == "feedback":
            return await client.feedback(memory_id="m")
        return await client.search("where?")

    with pytest.raises(BrokerUnavailable, match="sending to dmem"):
        asyncio.run(go())


def test_a_send_refused_part_way_says_where_it_stopped() -> None:
    # a send that raises (no metadata from a dead broker) named no count and no retry
    class Refusing(FailingProducer):
        async def send(self, topic: str, value: bytes, key: bytes, **kw: Any) -> Any:
            if self.sent >= self.ok:
                raise KafkaTimeoutError("no metadata")
            return await super().send(topic, value, key, **kw)

    client = _client(ok=2)
    client._producer = Refusing(2)  # type: ignore[assignment]
    with pytest.raises(BrokerUnavailable, match="after 2 transitions sent") as err:
        asyncio.run(client.publish_many([_t(0), _t(1), _t(2)]))
    assert err.value.retriable and "publishing them again is safe" in str(err.value)


def test_a_start_that_fails_part_way_stops_what_it_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The producer started, the reply consumer could not: the producer is stopped (it
    leaked) and the error is `BrokerUnavailable` (it was aiokafka's own)."""
    from aiokafka.errors import KafkaConnectionError

    import dmem.client as client_mod

    stopped: list[str] = []

    class Producer:
        def __init__(self, **_: Any) -> None:
            pass

        async def start(self) -> None:
            pass

        async def stop(self) -> None:
            stopped.append("producer")

    class Consumer:
        def __init__(self, **_: Any) -> None:
            pass

        async def start(self) -> None:
            raise KafkaConnectionError("no connection to the broker")

        async def stop(self) -> None:
            stopped.append("consumer")

    monkeypatch.setattr(client_mod, "AIOKafkaProducer", Producer)
    monkeypatch.setattr(client_mod, "AIOKafkaConsumer", Consumer)
    c = Client("127.0.0.1:1", "t")
    with pytest.raises(BrokerUnavailable, match="no connection"):
        asyncio.run(c.start())
    assert sorted(stopped) == ["consumer", "producer"]
    assert c._producer is None and c._consumer is None  # noqa: SLF001
