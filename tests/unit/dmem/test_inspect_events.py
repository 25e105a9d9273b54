"""`dmem inspect`'s recent maintenance events: the consumer is closed on every path, and a
broker out of reach is one line naming it, after the store's part."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from click.testing import CliRunner

import streams.jobs.inspection as inspection
from streams.settings import Settings


class FailingConsumer:
    """A consumer whose bootstrap fails, as against a stopped stack's broker."""

    made: list[FailingConsumer] = []

    def __init__(self, **_: Any) -> None:
        self.stopped = False
        FailingConsumer.made.append(self)

    async def start(self) -> None:
        raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    async def stop(self) -> None:
        self.stopped = True


def test_a_consumer_whose_start_fails_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    FailingConsumer.made.clear()
    monkeypatch.setattr(inspection, "AIOKafkaConsumer", FailingConsumer)
    with pytest.raises(KafkaConnectionError):
        asyncio.run(inspection.recent_events(Settings(), "t1"))
    (consumer,) = FailingConsumer.made
    assert consumer.stopped  # aiokafka warns "Unclosed AIOKafkaConsumer" otherwise


def test_inspect_names_the_broker_out_of_reach_and_the_flag_that_skips_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dmem.cli as cli
    import dmem.cli.server as server

    with socket.socket() as s:  # a port nothing listens on: a stopped stack's broker
        s.bind(("127.0.0.1", 0))
        broker = f"127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("DMEM_KAFKA__BROKER", broker)

    class Store:
        def close(self) -> None:
            pass

    report = {"counts": {"core": 1, "buffer": 0}, "capacity": {"core": 10, "buffer": 50},
              "merged_total": 0, "merged_rows": 0, "age_s": {}, "priority": {},
              "next_pass": {}, "top": []}  # fmt: skip
    monkeypatch.setattr(server, "_store", lambda settings, command: Store())
    monkeypatch.setattr(inspection, "inspect_tenant", lambda *_, **__: dict(report))
    out = CliRunner().invoke(cli.main, ["inspect", "--tenant", "t1"])
    assert out.exit_code == 0, out.output
    assert out.stdout.startswith("tenant t1: core 1, buffer 0")  # the store's part is shown
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith(f"recent events unavailable: cannot reach the Kafka broker at {broker}")
    assert last.endswith("(--no-events skips reading them)"), last
    out = CliRunner().invoke(cli.main, ["inspect", "--tenant", "t1", "--json"])
    recent_error = json.loads(out.stdout)["recent_error"]
    assert broker in recent_error and "--no-events" in recent_error, recent_error
