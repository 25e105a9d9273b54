"""Operator state keyed by (tenant, input partition): the unit a rebalance hands over."""

from __future__ import annotations

import pytest

from dmem_bench.demo import q_learning_transitions
from operators import HashingEncoder
from schemas import Transition, encode
from streams.settings import Settings
from streams.write.pipeline import RawRecord, WritePipeline, parse_state_key, state_key


def pipeline() -> WritePipeline:
    return WritePipeline(Settings(), HashingEncoder(dim=64))


def agent_stream(agent: str, n: int, seed: int) -> list[Transition]:
    return [
        t
        for t, _, _ in q_learning_transitions(
            "cliffwalking", n, seed=seed, tenant="t", agent_id=agent
        )
    ]


def raws(ts: list[Transition], partition: int, start: int = 0) -> list[RawRecord]:
    return [
        RawRecord(encode(t), t.agent_id.encode(), "dmem.transitions", partition, start + i)
        for i, t in enumerate(ts)
    ]


def routes(p: WritePipeline, batches: list[list[RawRecord]]) -> dict[str, list[tuple]]:
    """agent -> its (route, reason, rpe) in order, over every batch."""
    out: dict[str, list[tuple]] = {}
    for i, b in enumerate(batches):
        for e in p.process(b, now_ms=1_000 + i).events:
            out.setdefault(e.agent_id or "", []).append((e.route, e.reason, round(e.rpe, 9)))
    return out


def chunks(xs: list[RawRecord], n: int) -> list[list[RawRecord]]:
    return [xs[i : i + n] for i in range(0, len(xs), n)]


@pytest.fixture(scope="module")
def two_agents() -> tuple[list[Transition], list[Transition]]:
    return agent_stream("a", 480, seed=3), agent_stream("b", 480, seed=4)


def test_state_key_round_trip_and_legacy_keys() -> None:
    assert state_key("acme", 3) == b"acme|3"
    assert parse_state_key(b"acme|3") == ("acme", 3)
    assert parse_state_key(b"acme") == ("acme", None)  # a per-tenant checkpoint (migration)
    with pytest.raises(ValueError):
        parse_state_key(b"acme|x")


def test_a_partition_is_judged_by_its_own_records_only(two_agents: tuple) -> None:
    """Why a partition can move alone: holding another partition of the same tenant
    changes nothing in its decisions (one worker with p0 + p1 == one worker per partition)."""
    a, b = two_agents
    mixed = [ra + rb for ra, rb in zip(chunks(raws(a, 0), 64), chunks(raws(b, 1), 64), strict=True)]
    both = routes(pipeline(), mixed)
    alone = routes(pipeline(), chunks(raws(a, 0), 64))
    assert both["a"] == alone["a"]
    p = pipeline()
    routes(p, mixed)
    assert sorted(p.states) == [("t", 0), ("t", 1)]
    assert p.dirty == {("t", 0), ("t", 1)}


def test_revoked_partition_moves_to_another_worker_with_its_state(two_agents: tuple) -> None:
    """Checkpoint + drop on one pipeline, restore on another: the partition continues
    from its learned state (no warm-up reasons, a core share like the uninterrupted run)."""
    a, b = two_agents
    first = [
        ra + rb
        for ra, rb in zip(chunks(raws(a[:240], 0), 48), chunks(raws(b[:240], 1), 48), strict=True)
    ]
    old = pipeline()
    routes(old, first)
    blob = old.snapshot("t", 1)
    assert old.drop([1]) == [("t", 1)]
    assert sorted(old.states) == [("t", 0)] and ("t", 1) not in old.dirty
    new = pipeline()
    new.restore("t", blob, partition=1)
    rest = routes(new, chunks(raws(b[240:], 1, start=240), 48))["b"]
    assert not any(reason == "warmup" for _, reason, _ in rest)
    cold = routes(pipeline(), chunks(raws(b[240:], 1, start=240), 48))["b"]
    assert any(reason == "warmup" for _, reason, _ in cold)  # the check is not vacuous
    core = sum(r == "core" for r, _, _ in rest)
    assert core <= sum(r == "core" for r, _, _ in cold)


def test_per_tenant_checkpoint_seeds_every_partition(two_agents: tuple) -> None:
    """Migration: a checkpoint of the per-tenant era starts each partition of its tenant."""
    a, b = two_agents
    legacy = pipeline()
    routes(legacy, chunks(raws(a, 0), 64))  # what a per-tenant state had learned
    blob = legacy.snapshot("t")
    p = pipeline()
    p.seed("t", blob)
    got = routes(p, [raws(b[:32], 2), raws(a[:32], 3, start=100)])
    assert sorted(p.states) == [("t", 2), ("t", 3)]
    assert not any(reason == "warmup" for evs in got.values() for _, reason, _ in evs)
    with pytest.raises(ValueError):
        p.seed("u", b'{"format": 99}')  # unreadable: refused at once


def test_new_partition_of_a_tenant_starts_from_a_sibling(two_agents: tuple) -> None:
    a, b = two_agents
    p = pipeline()
    routes(p, chunks(raws(a, 0), 64))
    got = routes(p, [raws(b[:32], 5)])["b"]  # a new agent, on a partition new to the tenant
    assert not any(reason == "warmup" for _, reason, _ in got)
    cold = routes(pipeline(), [raws(b[:32], 5)])["b"]
    assert any(reason == "warmup" for _, reason, _ in cold)


def test_hindsight_and_forget_find_the_episode_in_its_partition() -> None:
    p = pipeline()
    quiet = [
        Transition(
            tenant="t",
            agent_id=ag,
            episode_id=f"{ag}-e",
            step=k,
            observation=f"{ag} room {k}",
            action="look",
            reward=0.0,
        )
        for ag in ("x", "y")
        for k in range(40)
    ]
    p.process(raws(quiet[:40], 0) + raws(quiet[40:], 1, start=40), now_ms=10)
    res = p.rescore("t", "y-e", 500.0, now_ms=20)
    assert res.events and all(e.episode_id == "y-e" for e in res.events)
    assert ("t", 1) in p.dirty
    mid = quiet[45].memory_id
    p.dirty.clear()
    p.forget("t", mid, "y-e")
    assert mid not in {e.transition_id for e in p.states[("t", 1)].eligibility.get("y-e")}
    assert p.rescore("t", "no-such-episode", 500.0, now_ms=30).events == []
