"""Property-based fuzzing (hypothesis) of record decoding, in-process.

Transitions go through the real `WritePipeline`; feedback and usage through the
real `CreditJob._handle` with an in-memory producer; retrieval requests through
the responder's decode step and `store_filter`. Properties:

- no input raises out of the stage (a raised exception would kill the agent or
  the request task);
- every record has exactly one outcome: a dead letter (with a non-empty reason,
  the original bytes and its offset) or a processed result;
- every valid record is processed, never dead-lettered.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dmem_bench.chaos import BAD_KINDS, bad_record
from operators import HashingEncoder
from schemas import RetrievalRequest, Transition
from schemas.errors import InvalidRecord
from schemas.limits import LIMITS
from streams.jobs.credit import CreditJob, parse_feedback
from streams.respond.responder import store_filter
from streams.settings import Settings
from streams.write.pipeline import RawRecord, WritePipeline

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ident = st.from_regex(r"[A-Za-z0-9_.:@/-]{1,24}", fullmatch=True)
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
json_value = st.recursive(
    scalar,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)

TRANSITION_FIELDS = (
    "transition_id",
    "tenant",
    "agent_id",
    "episode_id",
    "step",
    "observation",
    "state",
    "action",
    "reward",
    "next_observation",
    "next_state",
    "done",
    "ts",
    "metadata",
    "schema_version",
)


@st.composite
def valid_transition(draw: Any, step: int | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "tenant": draw(ident),
        "agent_id": draw(ident),
        "episode_id": draw(ident),
        "step": step if step is not None else draw(st.integers(0, 10**6)),
        "action": draw(
            st.one_of(
                st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30),
                st.integers(-5, 5),
            )
        ),
        "reward": draw(st.floats(-1e6, 1e6, allow_nan=False)),
        "done": draw(st.booleans()),
        "metadata": draw(
            st.dictionaries(
                st.from_regex(r"[a-z]{1,8}", fullmatch=True),
                st.one_of(st.text(max_size=20), st.integers(-100, 100), st.booleans()),
                max_size=3,
            )
        ),
    }
    d["observation"] = draw(st.text(min_size=1, max_size=200))
    if draw(st.booleans()):
        d["next_observation"] = draw(st.text(max_size=200))
    if draw(st.booleans()):
        d["ts"] = draw(st.integers(0, LIMITS.max_event_ms))
    return d


def to_json(obj: Any) -> bytes:
    """json.dumps, not orjson: NaN/Infinity tokens and huge ints stay in the bytes."""
    return json.dumps(obj).encode()


@st.composite
def mutated(draw: Any) -> bytes:
    """A valid transition with one field replaced, removed or added."""
    d = draw(valid_transition())
    op = draw(st.sampled_from(["replace", "remove", "add"]))
    field = draw(st.sampled_from(TRANSITION_FIELDS))
    if op == "replace":
        d[field] = draw(json_value)
    elif op == "remove":
        d.pop(field, None)
    else:
        d[draw(st.text(min_size=1, max_size=10))] = draw(json_value)
    return to_json(d)


any_record = st.one_of(
    st.binary(max_size=300),
    json_value.map(to_json),
    mutated(),
    st.builds(
        lambda d, cut: to_json(d)[: max(1, cut)], valid_transition(), st.integers(1, 60)
    ),  # truncated
    st.sampled_from(BAD_KINDS).flatmap(
        lambda k: st.randoms(use_true_random=False).map(lambda r: bad_record(r, k)[1])
    ),
)


def decodes(value: bytes | None) -> bool:
    """The oracle: does the schema accept this record?"""
    if value is None:
        return False
    try:
        Transition.model_validate(orjson.loads(value))
    except (ValidationError, orjson.JSONDecodeError):
        return False
    return True


@pytest.fixture(scope="module")
def pipeline() -> WritePipeline:
    return WritePipeline(Settings(), HashingEncoder(dim=32))


def check_dead(dl: Any, raw: RawRecord) -> None:
    assert dl.reason and dl.reason.strip()
    assert dl.offset == raw.offset and dl.topic == raw.topic
    assert base64.b64decode(dl.original_b64) == (raw.value or b"")


@FUZZ
@given(
    bad=st.lists(any_record, min_size=1, max_size=12),
    good=st.lists(valid_transition(), min_size=1, max_size=6),
)
def test_write_path_every_record_has_one_outcome(
    pipeline: WritePipeline, bad: list[bytes | None], good: list[dict[str, Any]]
) -> None:
    values: list[bytes | None] = []
    for i, d in enumerate(good):  # distinct steps: distinct memory ids
        d["step"] = i
        d["episode_id"] = "fuzz-ep"
        values.append(orjson.dumps(d))
    values += bad
    raws = [RawRecord(v, b"k", "dmem.transitions", 0, off) for off, v in enumerate(values)]
    res = pipeline.process(raws, now_ms=1_700_000_000_000)
    dead = {dl.offset: dl for _, dl in res.dead}
    ids = {ev.memory_id for ev in res.events}
    assert all(ev.kind in ("written", "dropped") for ev in res.events)
    accepted = 0
    for raw in raws:
        if decodes(raw.value):
            accepted += 1
            assert raw.offset not in dead, dead[raw.offset].reason
            assert Transition.model_validate(orjson.loads(raw.value or b"")).memory_id in ids
        else:
            assert raw.offset in dead
            check_dead(dead[raw.offset], raw)
    assert len(dead) == len(raws) - accepted
    assert all(raw.offset not in dead for raw in raws[: len(good)])


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None]] = []

    async def send(self, topic: str, value: bytes, key: bytes | None = None,
                   headers: object = None) -> None:  # fmt: skip
        self.sent.append((topic, value, key))


class Msg:
    def __init__(self, topic: str, value: bytes | None, offset: int) -> None:
        self.topic, self.value, self.key, self.partition, self.offset = (
            topic,
            value,
            b"k",
            0,
            offset,
        )
        self.headers: list[tuple[str, bytes]] = []  # no credential: Kafka auth is off here


feedback_valid = st.one_of(
    st.builds(
        lambda t, e, r: {"tenant": t, "episode_id": e, "reward": r},
        ident,
        ident,
        st.floats(-100, 100),
    ),
    st.builds(
        lambda t, m, k: {"tenant": t, "memory_id": m, "kind": k},
        ident,
        ident,
        st.sampled_from(["thumbs_up", "thumbs_down"]),
    ),
)


@FUZZ
@given(
    records=st.lists(
        st.one_of(any_record, feedback_valid.map(orjson.dumps)), min_size=1, max_size=10
    ),
    topic=st.sampled_from(["feedback", "usage"]),
)
def test_credit_job_dead_letters_bad_feedback_and_usage(
    records: list[bytes | None], topic: str
) -> None:
    s = Settings()
    job = CreditJob(s)
    prod = FakeProducer()
    job.producer = prod  # type: ignore[assignment]
    name = s.topic(topic)

    async def go() -> None:
        for off, v in enumerate(records):
            await job._handle(Msg(name, v, off))

    asyncio.run(go())
    dl_topic = s.topic("deadletter")
    dead = [orjson.loads(v) for t, v, _ in prod.sent if t == dl_topic]
    assert all(d["reason"] for d in dead)
    assert job.dead == len(dead)
    if topic == "feedback":
        for off, v in enumerate(records):
            is_dead = any(d["offset"] == off for d in dead)
            try:
                parse_feedback(v)  # type: ignore[arg-type]
                ok = True
            except Exception:  # noqa: BLE001 - the oracle: anything that fails to parse
                ok = False
            assert is_dead != ok, (v, is_dead)


hostile_text = st.one_of(
    st.text(max_size=60),
    st.sampled_from(
        [
            '" or tenant != "',
            "' or 1==1 --",
            '") || (tenant like "%',
            "\\",
            '"',
            '\\"',
            "𝔱",
            'tenant == "b"',
            "]",
            "[",
            "\u202e",
            "%",
            "*",
        ]
    ),
)


@FUZZ
@given(
    body=st.one_of(
        json_value,
        st.builds(
            lambda t, q, f: {"request_id": "r1", "tenant": t, "query": q, "filters": f},
            st.one_of(ident, hostile_text),
            st.text(max_size=30),
            st.dictionaries(
                st.sampled_from(
                    [
                        "valence",
                        "partition",
                        "since_ms",
                        "until_ms",
                        "min_utility",
                        "metadata_equals",
                        "tenant",
                        "expr",
                    ]
                ),
                st.one_of(json_value, st.dictionaries(hostile_text, hostile_text, max_size=3)),
                max_size=3,
            ),
        ),
    )
)
def test_retrieval_request_decoding_never_escapes_the_tenant(body: Any) -> None:
    """Decode + filter building raise only the errors the responder turns into
    dead letters / error replies, and the built filter always pins the tenant."""
    from milvus.expr import build_filter

    try:
        req = RetrievalRequest.model_validate(orjson.loads(to_json(body)))
    except (ValidationError, orjson.JSONDecodeError):
        return
    try:
        extra = store_filter(req)
        expr = build_filter(tenant=req.tenant, agent_id=req.agent_id, extra_filter=extra)
    except InvalidRecord:
        return
    tenant_term = f"tenant == {json.dumps(req.tenant, ensure_ascii=False)}"
    assert expr.startswith(f"({tenant_term}) && ") or expr == tenant_term
    # string values appear only as escaped literals: none can close its quote early
    for value in req.filters.metadata_equals.values():
        if isinstance(value, str):
            assert json.dumps(value, ensure_ascii=False) in expr
