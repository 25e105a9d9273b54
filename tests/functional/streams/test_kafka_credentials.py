"""Record credentials on the write path and the credit job, without a broker.

An agent record without a valid credential for its tenant is dead-lettered
"unauthenticated" and has no effect; with auth off nothing changes; a
checkpoint of other model sizes is refused before anything is built.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from operators import HashingEncoder
from schemas import EpisodeOutcome, Feedback, MemoryUsage, Transition, encode
from schemas.credentials import TenantSigner
from streams.auth import UNAUTHENTICATED
from streams.jobs.credit import CreditJob
from streams.settings import Settings
from streams.write.pipeline import CheckpointRefused, RawRecord, TenantState, WritePipeline

AUTH = {"tokens": {"token-a": ["a"], "token-b": ["b"]}}


def transition(tenant: str, step: int) -> Transition:
    return Transition(tenant=tenant, agent_id="ag", episode_id="e1", step=step,
                      observation=f"the key is under mat {step}", action="look",
                      reward=5.0)  # fmt: skip


def raw(t: Transition, token: str | None, offset: int, tenant: str | None = None) -> RawRecord:
    value = encode(t)
    headers = tuple(TenantSigner(token).headers(tenant or t.tenant, value)) if token else ()
    return RawRecord(value, b"ag", "dmem.transitions", 0, offset, headers=headers)


def test_write_path_dead_letters_records_without_a_credential_for_their_tenant() -> None:
    p = WritePipeline(Settings(auth=AUTH), HashingEncoder(dim=32))
    raws = [
        raw(transition("a", 0), "token-a", 0),  # good
        raw(transition("a", 1), None, 1),  # no credential
        raw(transition("b", 2), "token-a", 2),  # A's token writing for B
        raw(transition("b", 3), "token-a", 3, tenant="a"),  # signed "for a", names b
        raw(transition("b", 4), "token-b", 4),  # good
    ]
    res = p.process(raws, now_ms=1_000)
    assert sorted(dl.offset for _, dl in res.dead) == [1, 2, 3]
    assert {dl.reason for _, dl in res.dead} == {UNAUTHENTICATED}
    seen = {(ev.tenant, ev.step) for ev in res.events}
    assert seen == {("a", 0), ("b", 4)}  # no event, no state, no row for the others
    rows = {(r["tenant"], r["step"]) for part in res.upserts.values() for r in part}
    assert rows <= {("a", 0), ("b", 4)}


def test_with_auth_off_no_credential_is_needed() -> None:
    p = WritePipeline(Settings(auth={"disabled": True, **AUTH}), HashingEncoder(dim=32))
    res = p.process([raw(transition("a", i), None, i) for i in range(3)], now_ms=1_000)
    assert not res.dead and len(res.events) == 3


def test_a_checkpoint_of_other_model_sizes_is_refused_before_it_is_built() -> None:
    s = Settings()
    good = TenantState(s, 32).to_bytes()
    assert TenantState.from_bytes(s, good, 32).learner.hidden == s.value.hidden
    with pytest.raises(CheckpointRefused, match="dim=32, configured 64"):
        TenantState.from_bytes(s, good, 64)  # another encoder's dimension
    big = TenantState(s.model_copy(update={"value": s.value.model_copy(update={"hidden": 512})}),
                      32).to_bytes()  # fmt: skip
    with pytest.raises(CheckpointRefused, match="hidden=512, configured 64"):
        TenantState.from_bytes(s, big, 32)
    # a forged header asking for a huge RND net is refused before torch builds it
    header = orjson.loads(good)
    header["intrinsic"]["rnd"]["hidden"] = 10**7
    t0 = time.perf_counter()
    with pytest.raises(CheckpointRefused, match="rnd.hidden=10000000"):
        TenantState.from_bytes(s, orjson.dumps(header), 32)
    assert time.perf_counter() - t0 < 5.0
    p = WritePipeline(s, HashingEncoder(dim=32))
    with pytest.raises(CheckpointRefused):
        p.restore("a", big, 0)
    assert ("a", 0) not in p.states


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, Any]] = []

    async def send(self, topic: str, value: bytes, key: bytes | None = None,
                   headers: Any = None) -> None:  # fmt: skip
        self.sent.append((topic, value, headers))


def _msg(topic: str, value: bytes, headers: Any, offset: int) -> Any:
    return SimpleNamespace(topic=topic, value=value, key=b"k", headers=headers, partition=0,
                           offset=offset)  # fmt: skip


def test_credit_job_dead_letters_unauthenticated_feedback_and_usage() -> None:
    s = Settings(auth=AUTH)
    job = CreditJob(s)
    job.producer = _Producer()  # type: ignore[assignment]
    now = int(time.time() * 1000)
    usage = encode(MemoryUsage(tenant="b", episode_id="e", request_id="r", memory_ids=["m"],
                               weights=[1.0], ts=now, source="agent"))  # fmt: skip
    thumbs = encode(Feedback(tenant="b", memory_id="m", kind="thumbs_up", feedback_id="f1"))
    outcome = encode(EpisodeOutcome(tenant="b", episode_id="e", reward=1.0, outcome_id="o"))
    signed_a = TenantSigner("token-a")
    msgs = [
        _msg(s.topic("usage"), usage, signed_a.headers("b", usage), 0),  # A for B
        _msg(s.topic("feedback"), thumbs, [], 1),  # none
        _msg(s.topic("feedback"), outcome, signed_a.headers("a", outcome), 2),
        _msg(s.topic("feedback"), thumbs, TenantSigner("token-b").headers("b", thumbs), 3),
    ]

    async def go() -> None:
        for m in msgs:
            await job._handle(m)

    asyncio.run(go())
    topics = [t for t, _, _ in job.producer.sent]  # type: ignore[attr-defined]
    dead = [orjson.loads(v) for t, v, _ in job.producer.sent  # type: ignore[attr-defined]
            if t == s.topic("deadletter")]  # fmt: skip
    assert [d["offset"] for d in dead] == [0, 1, 2]
    assert {d["reason"] for d in dead} == {UNAUTHENTICATED}
    # only B's own thumbs became a utility update, and it carries the service's signature
    credit = [(v, h) for t, v, h in job.producer.sent  # type: ignore[attr-defined]
              if t == s.topic("credit")]  # fmt: skip
    assert len(credit) == 1 and topics.count(s.topic("credit")) == 1
    assert job.guard.internal_ok(b"m", credit[0][0], credit[0][1], "utility update")


def test_a_forged_record_never_moves_a_tenants_credit_clock() -> None:
    """A usage record for tenant B without B's credential, stamped far in the future,
    is refused before it is queued: B's outcome still waits for B's usage."""
    s = Settings(auth=AUTH)
    job = CreditJob(s)
    job.producer = _Producer()  # type: ignore[assignment]
    forged = orjson.dumps({"tenant": "b", "ts": 10**15, "request_id": "x"})
    outcome = encode(EpisodeOutcome(tenant="b", episode_id="e", reward=1.0, outcome_id="o",
                                    ts=1_000))  # fmt: skip
    b = TenantSigner("token-b")

    async def go() -> None:
        await job._take(_msg(s.topic("usage"), forged, [], 0))
        await job._take(_msg(s.topic("feedback"), outcome, b.headers("b", outcome), 1))

    asyncio.run(go())
    dead = [orjson.loads(v) for t, v, _ in job.producer.sent  # type: ignore[attr-defined]
            if t == s.topic("deadletter")]  # fmt: skip
    assert [(d["offset"], d["reason"]) for d in dead] == [(0, UNAUTHENTICATED)]
    assert job.queue.watermark == {"b": 1_000} and job.queue.due() == []
    assert job.guard.refused_agent == 1
