"""HTTP ingest operators: body forms, validation reasons, the in-flight budget, OpenAPI."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate as validate_openapi

import streams
from schemas import EpisodeOutcome, Feedback, MemoryUsage, Transition
from streams.respond.ingest import KINDS, InflightBudget, IngestRejected, parse_body, validate
from streams.respond.openapi import openapi_document
from streams.settings import IngestSettings, Settings

T = {"tenant": "t", "agent_id": "a", "episode_id": "e", "step": 0, "observation": "o",
     "action": "x"}  # fmt: skip
TRANSITIONS, OUTCOMES, FEEDBACK, USAGE = KINDS


def test_body_forms_object_array_ndjson() -> None:
    one = json.dumps(T).encode()
    assert parse_body(one, "application/json", 10) == [T]
    assert parse_body(json.dumps([T, T]).encode(), None, 10) == [T, T]
    nd = one + b"\n\n" + one + b"\n"
    assert parse_body(nd, "application/x-ndjson; charset=utf-8", 10) == [T, T]
    assert parse_body(nd, "application/json", 10) == [T, T]  # lines without their type


@pytest.mark.parametrize(("body", "ctype", "status"), [
    (b"{nope", "application/json", 422),
    (b"[]", "application/json", 422),
    (json.dumps([T] * 3).encode(), "application/json", 413),
    (b"\n".join([json.dumps(T).encode()] * 3), "application/x-ndjson", 413),
])  # fmt: skip
def test_body_rejections(body: bytes, ctype: str, status: int) -> None:
    with pytest.raises(IngestRejected) as e:
        parse_body(body, ctype, 2)
    assert e.value.status == status


def test_ndjson_reports_every_broken_line() -> None:
    body = json.dumps(T).encode() + b"\n{x\n" + json.dumps(T).encode() + b"\n[\n"
    with pytest.raises(IngestRejected) as e:
        parse_body(body, "application/x-ndjson", 10)
    assert [d["line"] for d in e.value.detail or []] == [2, 4]


def test_validation_lists_every_reason_with_its_index() -> None:
    items = [T, {**T, "step": -1, "action": None}, 7, {**T, "observation": None}]
    with pytest.raises(IngestRejected) as e:
        validate(items, TRANSITIONS)
    detail = e.value.detail or []
    assert e.value.status == 422
    assert sorted({d["index"] for d in detail}) == [1, 2, 3]
    assert {tuple(d["loc"]) for d in detail if d["index"] == 1} == {("step",), ("action",)}


def test_ids_keys_and_topics() -> None:
    [t] = validate([T], TRANSITIONS)
    assert isinstance(t, Transition) and TRANSITIONS.ident(t) == t.memory_id
    assert TRANSITIONS.key(t) == "a" and TRANSITIONS.topic == "transitions"
    o1, o2 = validate(
        [
            {"tenant": "t", "episode_id": "e", "reward": 1},
            {"tenant": "t", "episode_id": "e", "reward": 1, "outcome_id": "mine"},
        ],
        OUTCOMES,
    )
    # without an id: the episode's final outcome, as the SDK names it (a retry counts once)
    assert isinstance(o1, EpisodeOutcome) and o1.outcome_id == "e:final"
    assert OUTCOMES.ident(o2) == "mine" and OUTCOMES.key(o2) == "e"
    [f] = validate([{"tenant": "t", "memory_id": "m1", "kind": "thumbs_down"}], FEEDBACK)
    assert isinstance(f, Feedback) and FEEDBACK.key(f) == "m1" and FEEDBACK.topic == "feedback"
    rep = {"tenant": "t", "episode_id": "e", "request_id": "r1", "memory_ids": ["m1", "m2"],
           "weights": [3.0, 1.0], "ts": 5}  # fmt: skip
    [u] = validate([rep], USAGE)
    assert (USAGE.key(u), USAGE.ident(u), USAGE.topic) == ("e", "r1", "usage")
    # an agent's report, its weights shares of the decision, as the SDK sends them
    assert isinstance(u, MemoryUsage) and u.source == "agent" and u.weights == [0.75, 0.25]


def test_feedback_without_an_id_is_named_by_what_it_says() -> None:
    """A retried POST of the same thumbs (or episode reward) carries the same id, the
    one the credit job gives the record over Kafka, so it is credited once."""
    thumbs = {"tenant": "t", "memory_id": "m1", "kind": "thumbs_up", "ts": 5}
    a, b = validate([thumbs, dict(thumbs)], FEEDBACK)
    assert FEEDBACK.ident(a) == FEEDBACK.ident(b) == "m1:thumbs_up:5"
    [r] = validate([{"tenant": "t", "episode_id": "e", "kind": "reward", "value": 1}], FEEDBACK)
    assert FEEDBACK.ident(r) == "e:final"
    # nothing names a thumbs without a time: each is its own (send feedback_id or ts)
    c, d = validate([{"tenant": "t", "memory_id": "m1", "kind": "thumbs_up"}] * 2, FEEDBACK)
    assert FEEDBACK.ident(c) != FEEDBACK.ident(d)


def test_a_reward_on_a_memory_alone_is_refused_with_the_reason() -> None:
    with pytest.raises(IngestRejected) as exc:
        validate([{"tenant": "t", "memory_id": "m1", "value": 1}], FEEDBACK)
    assert exc.value.status == 422
    assert "reward feedback needs an episode_id" in str(exc.value.detail)


def test_budget_is_bounded_and_never_waits() -> None:
    b = InflightBudget(5)
    assert b.take({"t": 3}) and not b.take({"t": 3}) and b.take({"t": 2})
    assert not b.take({"t": 1})
    b.give({"t": 5})
    assert b.take({"t": 5}) and b.used == 5
    with pytest.raises(ValueError):
        InflightBudget(0)


def test_budget_per_tenant_keeps_the_others_share() -> None:
    b = InflightBudget(10, per_tenant=4)
    assert b.take({"a": 4})
    why = b.refusal({"a": 1})
    assert why is not None and "'a'" in why and not b.take({"a": 1})  # a is at its share
    assert b.take({"b": 4}) and b.take({"c": 2})  # the others are not
    assert not b.take({"c": 1, "d": 1})  # the total still holds: 10 of 10
    assert b.by_tenant == {"a": 4, "b": 4, "c": 2}
    b.give({"a": 4})
    assert "a" not in b.by_tenant and b.take({"a": 1, "d": 1})  # a mixed batch charges both
    assert b.by_tenant["a"] == 1 and b.by_tenant["d"] == 1 and b.used == 8


def test_settings_refuse_a_batch_that_never_fits() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        IngestSettings(max_batch=100, max_inflight=10)
    with pytest.raises(ValueError, match="max_inflight_per_tenant"):
        IngestSettings(max_batch=100, max_inflight=1000, max_inflight_per_tenant=50)


def test_openapi_document_validates_and_follows_settings() -> None:
    s = Settings(ingest=IngestSettings(max_batch=7, max_inflight=7))
    doc = openapi_document(s)
    validate_openapi(doc)
    post = doc["paths"]["/v1/transitions"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"]["oneOf"][1]["maxItems"] == 7
    assert set(post["responses"]) >= {"202", "401", "403", "413", "422", "429", "503"}
    assert "Retry-After" in post["responses"]["429"]["headers"]
    # every route a respond worker registers is documented (the page's static files,
    # /ui without the slash, and the document itself aside)
    src = "".join(p.read_text() for p in Path(streams.__file__).parent.rglob("*.py"))
    routes = set(re.findall(r'@app\.page\("([^"]+)"\)', src)) | {k.path for k in KINDS}
    assert routes - {"/ui", "/ui/static/{name}", "/openapi.json"} <= set(doc["paths"])
    assert len(routes) >= 12
    # the schemas are pydantic's own: a limit of the model shows up in the document
    assert doc["components"]["schemas"]["Transition"]["properties"]["step"]["minimum"] == 0


def test_blank_ndjson_lines_are_bounded_before_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 MiB of blank lines is refused by a byte count, before any per-line scan (a
    Python loop over the lines would hold the event loop for ~0.5 s)."""
    from streams.respond import ingest

    one = json.dumps(T).encode()
    assert parse_body(one + b"\n\n" + one + b"\n", "application/x-ndjson", 2) == [T, T]

    class NoScan:
        def finditer(self, body: bytes) -> Any:
            raise AssertionError(f"scanned {len(body)} bytes line by line")

    monkeypatch.setattr(ingest, "_LINE", NoScan())
    for blank in (b"\n", b" \n", b"\r\n"):
        body = blank * ((8 << 20) // len(blank))  # 8 MiB of blank lines
        with pytest.raises(IngestRejected) as e:
            parse_body(body, "application/x-ndjson", 1000)
        assert e.value.status == 413 and "lines" in e.value.error


def test_an_agents_usage_with_responder_fields_is_refused_not_accepted_then_dead_lettered() -> None:
    """The route's record is the agent's; validated as one, the responder-only
    ``similarities`` are a 422 at the door, not a 202 the credit job dead-letters."""
    rep = {"tenant": "t", "episode_id": "e", "request_id": "r1", "memory_ids": ["m1"],
           "weights": [1.0], "ts": 5, "similarities": [0.9]}  # fmt: skip
    with pytest.raises(IngestRejected) as e:
        validate([rep], USAGE)
    assert e.value.status == 422
    assert any("similarities" in d["msg"] for d in e.value.detail or [])
