"""The write path end to end: real Tansu broker, real worker process, real Milvus
(Lite and the 2.3.5 server). Transitions are published with plain aiokafka.
"""

from __future__ import annotations

import asyncio
import base64
import math
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from milvus import MemoryStore
from schemas import Transition, encode
from schemas.models import stable_transition_id
from streams.local.stack import LocalStack
from tests.integration.broker_fixtures import collect, decode_all, isolated_env, produce

pytestmark = pytest.mark.integration

TENANT = "acme"


def corridor(episodes: int, start_episode: int = 0, agents: int = 2) -> list[Transition]:
    """A corridor walk: small step costs, a rare trap (-10) and a goal (+10)."""
    out = []
    for e in range(start_episode, start_episode + episodes):
        agent = f"agent-{e % agents}"
        for k in range(12):
            trap = (e % 5 == 0) and k == 6
            goal = k == 11
            reward = -10.0 if trap else (10.0 if goal else -0.1)
            out.append(
                Transition(
                    tenant=TENANT,
                    agent_id=agent,
                    episode_id=f"ep{e}",
                    step=k,
                    observation=f"room {k} of the corridor" + (" (slippery)" if trap else ""),
                    action="jump" if trap else "forward",
                    reward=reward,
                    next_observation=f"room {k + 1} of the corridor",
                    done=goal,
                    metadata={"k": k},
                )
            )
    return out


BAD: list[tuple[str, bytes]] = [
    ("malformed JSON", b'{"tenant": "acme", "agent_id": '),
    (
        "invalid record",
        orjson.dumps(
            {"agent_id": "a", "episode_id": "e", "step": 1, "observation": "x", "action": "a"}
        ),
    ),  # no tenant
    (
        "malformed JSON",
        b'{"tenant":"acme","agent_id":"a","episode_id":"e","step":1,'
        b'"observation":"x","action":"a","reward":NaN}',
    ),
    (
        "finite",
        orjson.dumps(
            {
                "tenant": "acme",
                "agent_id": "a",
                "episode_id": "e",
                "step": 1,
                "observation": "x",
                "action": "a",
                "reward": "inf",
            }
        ),
    ),
    (
        "differ in dimension",
        orjson.dumps(
            {
                "tenant": "acme",
                "agent_id": "a",
                "episode_id": "e",
                "step": 2,
                "state": [0.1, 0.2, 0.3],
                "next_state": [0.1, 0.2],
                "action": "a",
            }
        ),
    ),
    (
        "at most 8192",
        orjson.dumps(
            {
                "tenant": "acme",
                "agent_id": "a",
                "episode_id": "e",
                "step": 3,
                "observation": "x" * 9000,
                "action": "a",
            }
        ),
    ),
    (
        "unsupported schema_version",
        orjson.dumps(
            {
                "schema_version": 99,
                "tenant": "acme",
                "agent_id": "a",
                "episode_id": "e",
                "step": 4,
                "observation": "x",
                "action": "a",
            }
        ),
    ),
]


@pytest.fixture(params=["lite", "server"])
def milvus_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "lite":
        return ""  # the embedded default: a Lite file under the data dir
    uri: str = request.getfixturevalue("milvus_server_uri")
    return uri


def make_stack(tmp_path: Path, broker: str, prefix: str, milvus_uri: str) -> LocalStack:
    env = isolated_env(
        prefix,
        DMEM_WRITE__CHECKPOINT_EVERY_S="0.5",
        DMEM_WRITE__BATCH_WITHIN_S="0.3",
        DMEM_LOG_LEVEL="info",
    )
    if milvus_uri:
        env["DMEM_MILVUS__URI"] = milvus_uri
    return LocalStack(tmp_path / "data", roles=("write",), extra_env=env, broker_bootstrap=broker)


def run_batch(
    stack: LocalStack, broker: str, records: list[tuple[bytes | None, bytes]], expect: int
) -> list[dict[str, Any]]:
    """Publish, then wait until `expect` outcomes in total (events + dead letters)."""
    s = stack.settings
    asyncio.run(produce(broker, s.topic("transitions"), records))
    msgs = asyncio.run(
        collect(broker, [s.topic("memories"), s.topic("deadletter")], lambda m: len(m) >= expect)
    )
    return decode_all(msgs)


def open_store(stack: LocalStack) -> MemoryStore:
    s = stack.settings
    store = MemoryStore(s.milvus_uri, collection=s.milvus.collection, dim=s.encoder.dim)
    store.connect()
    return store


def test_write_path_routes_dead_letters_replays_and_restores(
    tmp_path: Path, broker: str, topic_prefix: str, milvus_uri: str
) -> None:
    stack = make_stack(tmp_path, broker, topic_prefix, milvus_uri)
    stack.start_broker()
    good = corridor(40)
    records: list[tuple[bytes | None, bytes]] = []
    for i, t in enumerate(good):
        records.append((t.agent_id.encode(), encode(t)))
        if i % 60 == 30 and i // 60 < len(BAD):
            records.append((b"bad", BAD[i // 60][1]))
    n_bad = sum(1 for k, _ in records if k == b"bad")
    assert n_bad == len(BAD)

    # -- first run: routing and dead letters ---------------------------------
    w = stack.start_worker("write")
    stack.wait_ready(w)
    out = run_batch(stack, broker, records, len(records))
    assert w.alive, "the worker must survive bad input"
    dead = [m for m in out if m["_topic"].endswith("deadletter")]
    events = {m["memory_id"]: m for m in out if m["_topic"].endswith("memories")}
    assert len(dead) == len(BAD)
    assert len(events) == len(good)
    for (marker, original), dl in zip(BAD, dead, strict=True):
        assert marker in dl["reason"], (marker, dl["reason"])
        assert base64.b64decode(dl["original_b64"]) == original
        assert dl["offset"] is not None and dl["topic"].endswith("transitions")
    routes = Counter(e["route"] for e in events.values())
    assert routes["core"] > 0 and routes["drop"] > 0
    traps = [t for t in good if t.reward == -10.0]
    # the first trap of each agent is a surprise: it must be in core
    first_trap = {}
    for t in traps:
        first_trap.setdefault(t.agent_id, t)
    assert all(events[t.memory_id]["partition"] == "core" for t in first_trap.values())
    stack.stop_workers()
    store = open_store(stack)
    rows = {r["id"]: r for r in store.get([t.memory_id for t in good], tenant=TENANT)}
    written = {k: e for k, e in events.items() if e["kind"] == "written"}
    assert set(rows) == set(written)
    for mid, e in written.items():
        r = rows[mid]
        assert r["partition"] == e["partition"]
        assert math.isclose(r["rpe"], e["rpe"], rel_tol=1e-6, abs_tol=1e-9)
        assert math.isclose(r["gate"], e["gate"], rel_tol=1e-6, abs_tol=1e-9)
        assert r["valence"] == e["valence"]
        assert r["valence"] == (1 if e["rpe"] > 0 else -1 if e["rpe"] < 0 else 0)
    total_before = store.count()
    store.close()

    # -- second run: replay the same records + new ones; restored state -------
    w2 = stack.start_worker("write")
    stack.wait_ready(w2)
    more = corridor(10, start_episode=40)
    replay = records + [(t.agent_id.encode(), encode(t)) for t in more]
    out2 = run_batch(stack, broker, replay, 2 * len(records) + len(more))
    stack.stop_workers()
    new_events = [m for m in out2[len(records) :] if m["_topic"].endswith("memories")]
    assert not any(e["reason"] == "warmup" for e in new_events), "gate state was not restored"
    # restored state, not a cold start: replays of what was stored are recognised
    # as repeats, and new transitions do not cause a burst of core writes
    replayed = [e for e in new_events if e["memory_id"] in events]
    assert len(replayed) == len(good)
    core_first = sum(e["route"] == "core" for e in events.values())
    core_replayed = sum(e["route"] == "core" for e in replayed)
    assert core_replayed < core_first, (core_replayed, core_first)
    assert sum(e["reason"] == "repeat" for e in replayed) > 0
    fresh = [e for e in new_events if e["memory_id"] in {t.memory_id for t in more}]
    assert len(fresh) == len(more)
    cold = sum(e["route"] == "core" for e in list(events.values())[: len(more)])
    assert sum(e["route"] == "core" for e in fresh) <= max(cold, 1)

    store = open_store(stack)
    ids = [r["id"] for r in store.scan(output_fields=["id"])]
    store.close()
    assert len(ids) == len(set(ids)), "a replay duplicated memories"
    assert len(ids) >= total_before
    replayed_written = {e["memory_id"] for e in new_events if e["kind"] == "written"}
    assert set(ids) >= replayed_written


def test_a_row_too_large_for_the_store_is_dead_lettered_and_the_rest_stored(
    tmp_path: Path, broker: str, topic_prefix: str
) -> None:
    """A record within every character limit whose row Milvus could not hold (its
    metadata JSON over 64 KiB in bytes) must not stall its partition: validation
    dead-letters it with the reason, its batch is stored. (The store's own refusal of
    such a row, the last line of defence: tests/integration/milvus/test_store_tenants.py.)"""
    env = isolated_env(topic_prefix, DMEM_GATE__WARMUP="1000")  # warm-up: keep ~everything
    stack = LocalStack(tmp_path / "data", roles=("write",), extra_env=env, broker_bootstrap=broker)
    stack.start_broker()
    good = corridor(3)
    huge = Transition.model_construct(  # what a client that skips validation sends
        transition_id=stable_transition_id(TENANT, "agent-0", "huge", 0),
        schema_version=1,
        state=None,
        next_state=None,
        done=False,
        ts=None,
        tenant=TENANT,
        agent_id="agent-0",
        episode_id="huge",
        step=0,
        observation="a room with a very long note",
        action="jump",
        reward=-50.0,
        next_observation="\u20ac" * 8000,
        metadata={f"k{i}": "\u20ac" * 500 for i in range(32)},
    )
    records = [(t.agent_id.encode(), encode(t)) for t in good[:10]]
    records += [(huge.agent_id.encode(), encode(huge))]
    records += [(t.agent_id.encode(), encode(t)) for t in good[10:]]
    w = stack.start_worker("write")
    try:
        stack.wait_ready(w)
        out = run_batch(stack, broker, records, len(records))
        assert w.alive
    finally:
        stack.stop_workers()
    dead = [m for m in out if m["_topic"].endswith("deadletter")]
    events = {m["memory_id"]: m for m in out if m["_topic"].endswith("memories")}
    assert len(dead) == 1 and dead[0]["stage"] == "decode"
    assert "bytes as UTF-8 JSON" in dead[0]["reason"] and dead[0]["error_type"] == "ValidationError"
    assert base64.b64decode(dead[0]["original_b64"]) == encode(huge)
    assert huge.memory_id not in events, "no `written` event for a row that was not stored"
    assert set(events) == {t.memory_id for t in good}
    store = open_store(stack)
    try:
        rows = store.get([t.memory_id for t in good] + [huge.memory_id], tenant=TENANT)
    finally:
        store.close()
    written = {k for k, e in events.items() if e["kind"] == "written"}
    assert written and {r["id"] for r in rows} == written
