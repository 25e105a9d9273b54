"""What the credit job makes of records at the edges of what validates: ids dmem
derives from a client's ids (an outcome's default id, a thumbs feedback's credit
update id) validate however long the client's ids are, a usage record's weights count
as shares of the decision whoever sent them, and an update that does not validate
dead-letters its record instead of stopping the job."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from schemas import EpisodeOutcome, Feedback, MemoryUsage, UtilityUpdate
from schemas.limits import LIMITS
from schemas.models import feedback_update_id, final_outcome_id
from streams.jobs.credit import CreditJob
from streams.settings import Settings
from tests.functional.streams.test_fuzz_decoding import FakeProducer, Msg

LONG = "m" * LIMITS.max_id_chars


def test_an_episode_id_at_the_limit_has_a_valid_final_outcome_id() -> None:
    oid = final_outcome_id(LONG)
    out = EpisodeOutcome(tenant="t", agent_id="a", episode_id=LONG, reward=1.0, outcome_id=oid)
    assert out.outcome_id == oid == final_outcome_id(LONG)  # the same id on every path
    assert oid.endswith(":final") and oid != final_outcome_id(LONG[:-1])
    assert final_outcome_id("ep-7") == "ep-7:final"  # a short id keeps its readable form


def test_a_thumbs_on_a_memory_id_at_the_limit_emits_one_valid_credit_update() -> None:
    s = Settings()
    job = CreditJob(s)
    prod = FakeProducer()
    job.producer = prod  # type: ignore[assignment]
    fb = Feedback(tenant="t", memory_id=LONG, kind="thumbs_down", ts=1_700_000_000_000)
    raw = orjson.dumps(fb.model_dump(mode="json", exclude_none=True))

    async def go() -> None:
        for off in (0, 1):  # the same feedback twice (a replay)
            await job._handle(Msg(s.topic("feedback"), raw, off))

    asyncio.run(go())
    sent = [UtilityUpdate.model_validate_json(v) for t, v, _ in prod.sent
            if t == s.topic("credit")]  # fmt: skip
    assert len(sent) == 2 and job.dead == 0
    assert sent[0].update_id == sent[1].update_id  # a replay is applied once
    assert sent[0].update_id.startswith("fb:") and sent[0].memory_id == LONG
    assert sent[0].credit == -1.0
    assert feedback_update_id("short") == "fb:short"


def test_a_credit_update_that_does_not_validate_dead_letters_its_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whatever makes a derived update invalid, the record is dead-lettered with the
    reason and the job goes on (an exception here would stop credit for everyone)."""
    import streams.jobs.credit as credit_job

    monkeypatch.setattr(credit_job, "feedback_update_id", lambda fid: "x" * 200)
    s = Settings()
    job = CreditJob(s)
    prod = FakeProducer()
    job.producer = prod  # type: ignore[assignment]
    fb = Feedback(tenant="t", memory_id="m1", kind="thumbs_up", ts=1)
    raw = orjson.dumps(fb.model_dump(mode="json", exclude_none=True))
    asyncio.run(job._handle(Msg(s.topic("feedback"), raw, 0)))
    topics = [t for t, _, _ in prod.sent]
    assert topics == [s.topic("deadletter")] and job.dead == 1
    assert "update_id" in orjson.loads(prod.sent[0][1])["reason"]


def _credits(weights: list[float]) -> dict[str, float]:
    s = Settings()
    job = CreditJob(s)
    prod = FakeProducer()
    job.producer = prod  # type: ignore[assignment]
    use = MemoryUsage(tenant="t", episode_id="e", request_id="r", memory_ids=["m1", "m2"],
                      weights=weights, ts=1, source="agent")  # fmt: skip
    out = EpisodeOutcome(tenant="t", episode_id="e", reward=1.0, ts=2)

    async def go() -> None:
        await job._handle(Msg(s.topic("usage"), use.model_dump_json().encode(), 0))
        await job._handle(Msg(s.topic("feedback"), out.model_dump_json().encode(), 1))

    asyncio.run(go())
    ups = [UtilityUpdate.model_validate_json(v) for t, v, _ in prod.sent
           if t == s.topic("credit")]  # fmt: skip
    assert job.dead == 0
    return {u.memory_id: u.credit for u in ups}


def test_usage_weights_count_as_shares_whoever_sent_them() -> None:
    """A raw producer's weights of 3 and 1 (or of 1e30 each) credit as the SDK's shares
    0.75 and 0.25 (0.5 each) would: an unnormalised report must not count several times."""
    shares = _credits([0.75, 0.25])
    assert shares["m1"] == pytest.approx(3 * shares["m2"]) and shares["m1"] != 0.0
    assert _credits([3.0, 1.0]) == pytest.approx(shares)
    huge = _credits([LIMITS.max_abs_value, LIMITS.max_abs_value])
    assert huge["m1"] == pytest.approx(huge["m2"]) == pytest.approx(sum(shares.values()) / 2)


def test_thumbs_without_id_or_time_are_told_apart_by_their_record() -> None:
    """A raw producer's thumbs with neither ``feedback_id`` nor ``ts``: two records are
    two thumbs (not one and a replay), and a replay of one record stays one."""
    s = Settings()
    job = CreditJob(s)
    prod = FakeProducer()
    job.producer = prod  # type: ignore[assignment]
    raw = orjson.dumps({"tenant": "t", "memory_id": "m1", "kind": "thumbs_up"})

    async def go() -> None:
        for off in (0, 1, 1):  # two records, the second delivered twice
            await job._handle(Msg(s.topic("feedback"), raw, off))

    asyncio.run(go())
    ids = [UtilityUpdate.model_validate_json(v).update_id for t, v, _ in prod.sent
           if t == s.topic("credit")]  # fmt: skip
    assert len(ids) == 3 and ids[0] != ids[1] and ids[1] == ids[2]


@pytest.mark.parametrize("mid", ["m1", LONG])
def test_a_thumbs_posted_over_http_and_the_same_over_kafka_credit_once(mid: str) -> None:
    """HTTP ingest names a feedback without an id as the credit job does, so the same
    thumbs from both paths (or a retried POST) gives one credit update id: the one the
    credit job has always given it (a replay across an upgrade is applied once)."""
    from streams.respond.ingest import KINDS, validate

    (fb_kind,) = [k for k in KINDS if k.model is Feedback]
    s = Settings()
    job = CreditJob(s)
    prod = FakeProducer()
    job.producer = prod  # type: ignore[assignment]
    thumbs = {"tenant": "t", "memory_id": mid, "kind": "thumbs_up", "ts": 1_700_000_000_000}
    (posted,) = validate([thumbs], fb_kind)
    raws = [orjson.dumps(thumbs), orjson.dumps(posted.model_dump(mode="json", exclude_none=True))]

    async def go() -> None:
        for off, raw in enumerate(raws):
            await job._handle(Msg(s.topic("feedback"), raw, off))

    asyncio.run(go())
    sent = [UtilityUpdate.model_validate_json(v) for t, v, _ in prod.sent
            if t == s.topic("credit")]  # fmt: skip
    assert len(sent) == 2 and sent[0].update_id == sent[1].update_id
    assert sent[0].update_id == feedback_update_id(f"{mid}:thumbs_up:1700000000000")
