"""Failures write lessons end to end: real broker, real write worker, Milvus Lite.

A death that pays no negative reward is dropped by the gate; its outcome (0 where the
same agent's task usually scores 100) writes its terminal steps to the buffer with
reason ``failure_terminal``; a redelivered outcome writes nothing twice.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from milvus import MemoryStore
from schemas import EpisodeOutcome, Transition, encode
from streams.local.stack import LocalStack
from tests.functional.streams.test_write_failure_lessons import episode, hall
from tests.integration.broker_fixtures import collect, decode_all, isolated_env, produce

pytestmark = pytest.mark.integration

TENANT = "acme"
AGENT = "cook"


def transitions() -> list[Transition]:
    """A rewarded agent's history (so reward-free steps are judged on TD noise), then
    two won episodes, a death scored 0 and a second death (reward 0, last step done)."""
    games = ("win0", "win1", "dead2", "dead3")
    return hall(TENANT, AGENT) + [
        t for i, name in enumerate(games) for t in episode(name, tenant=TENANT, agent=AGENT,
                                                           ts0=10_000 + 100 * i)
    ]  # fmt: skip


def outcome(name: str, reward: float, i: int) -> tuple[bytes, bytes]:
    out = EpisodeOutcome(tenant=TENANT, episode_id=name, agent_id=AGENT, task="cooking",
                         reward=reward, ts=20_000 + i, outcome_id=f"{name}:final")  # fmt: skip
    return b"outcomes", encode(out)  # one key: one partition, processed in this order


def events_of(broker: str, stack: LocalStack, until: Any) -> list[dict[str, Any]]:
    msgs = asyncio.run(collect(broker, [stack.settings.topic("memories")], until))
    return decode_all(msgs)


def test_a_silent_death_writes_its_terminal_steps_once(
    tmp_path: Path, broker: str, topic_prefix: str
) -> None:
    env = isolated_env(topic_prefix, DMEM_WRITE__BATCH_WITHIN_S="0.2")
    stack = LocalStack(tmp_path / "data", roles=("write",), extra_env=env, broker_bootstrap=broker)
    stack.start_broker()
    ts = transitions()
    s = stack.settings
    w = stack.start_worker("write")
    try:
        stack.wait_ready(w)
        asyncio.run(produce(broker, s.topic("transitions"),
                            [(t.agent_id.encode(), encode(t)) for t in ts]))  # fmt: skip
        live = events_of(broker, stack, lambda m: len(m) >= len(ts))
        assert len(live) == len(ts)
        route = {e["memory_id"]: e["route"] for e in live}
        ids = {(t.episode_id, t.step): t.memory_id for t in ts}
        # the two last steps of each death, as the gate left them: dropped
        last = {name: [ids[(name, 4)], ids[(name, 5)]] for name in ("dead2", "dead3")}
        assert all(route[m] == "drop" for ms in last.values() for m in ms), route

        outcomes = [outcome("win0", 100.0, 0), outcome("win1", 100.0, 1),
                    outcome("dead2", 0.0, 2)]  # fmt: skip
        asyncio.run(produce(broker, s.topic("feedback"), outcomes))

        def later(m: list[Any], name: str) -> bool:
            # these steps were dropped live: a `written` event of one is a late write
            got = {e["memory_id"] for e in decode_all(m) if e["kind"] == "written"}
            return set(last[name]) <= got

        events_of(broker, stack, lambda m: later(m, "dead2"))
        # dead2's outcome again (at-least-once), then dead3's behind it on the same
        # partition: once dead3's lessons are in, the copy was processed
        asyncio.run(produce(broker, s.topic("feedback"),
                            [outcome("dead2", 0.0, 2), outcome("dead3", 0.0, 3)]))  # fmt: skip
        after = events_of(broker, stack, lambda m: later(m, "dead3"))
    finally:
        stack.stop_workers()
    written = [e for e in after if e["kind"] == "written"]
    for name in ("dead2", "dead3"):
        mine = [e for e in written if e["memory_id"] in last[name]]
        assert sorted(e["memory_id"] for e in mine) == sorted(last[name])  # each once
        assert all(e["reason"] in ("failure_terminal", "retrospective") for e in mine)
    lessons = {e["memory_id"] for e in written if e["reason"] == "failure_terminal"}
    assert lessons and all(e["episode_id"] not in ("win0", "win1") for e in written
                           if e["reason"] == "failure_terminal")  # fmt: skip
    store = MemoryStore(s.milvus_uri, collection=s.milvus.collection, dim=s.encoder.dim)
    store.connect()
    try:
        rows = {r["id"]: r for r in store.get(sorted(lessons), tenant=TENANT)}
        every = [r["id"] for r in store.scan(output_fields=["id"])]
    finally:
        store.close()
    assert set(rows) == lessons
    for r in rows.values():
        assert r["partition"] == "buffer" and r["valence"] == -1
        assert r["metadata"]["gate"]["reason"] == "failure_terminal"
        assert r["metadata"]["failure"]["outcome"] == 0.0
    assert len(every) == len(set(every)), "a redelivered outcome duplicated a memory"
