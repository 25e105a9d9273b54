"""Payload models: validation limits, stable ids, codec, JSON Schema export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas import (
    LIMITS,
    DeadLetter,
    MemoryUsage,
    RetrievalRequest,
    Transition,
    decode,
    encode,
    export_json_schemas,
    stable_transition_id,
)
from schemas.errors import BrokerUnavailable, ConfigError, DmemError, StoreUnavailable

BASE = {
    "tenant": "t1",
    "agent_id": "a",
    "episode_id": "e",
    "step": 3,
    "observation": "o",
    "action": "left",
}


def test_transition_id_is_stable_and_scoped() -> None:
    a = Transition(**BASE)
    b = Transition(**BASE)
    c = Transition(**{**BASE, "tenant": "t2"})
    assert a.transition_id == b.transition_id == stable_transition_id("t1", "a", "e", 3)
    assert a.transition_id != c.transition_id


def test_round_trip_through_codec() -> None:
    t = Transition(**BASE, reward=-2.5, metadata={"k": 1})
    assert decode(Transition, encode(t)) == t


@pytest.mark.parametrize(
    "patch, fragment",
    [
        ({"reward": float("nan")}, "finite"),
        ({"reward": float("inf")}, "finite"),
        ({"observation": "x" * (LIMITS.max_text_chars + 1)}, "at most"),
        ({"state": [0.0] * (LIMITS.max_vector_dim + 1), "observation": None}, "at most"),
        ({"schema_version": 2}, "unsupported schema_version"),
        ({"tenant": "bad tenant!"}, "pattern"),
        ({"observation": None}, "observation"),
        ({"unknown_field": 1}, "Extra inputs"),
        ({"step": -1}, "greater than or equal"),
        ({"action": True}, "action"),
        ({"state": [1.0, 2.0], "next_state": [1.0], "observation": None}, "dimension"),
        ({"metadata": {f"k{i}": i for i in range(LIMITS.max_metadata_keys + 1)}}, "keys"),
        # within every character limit, over the row's JSON budget in bytes (emoji: 4 each)
        (
            {
                "metadata": {
                    f"k{i}": "\U0001f600" * LIMITS.max_metadata_value_chars
                    for i in range(LIMITS.max_metadata_keys)
                }
            },
            "bytes as UTF-8 JSON",
        ),
    ],
)
def test_transition_limits(patch: dict, fragment: str) -> None:
    with pytest.raises(ValidationError) as err:
        Transition(**{**BASE, **patch})
    assert fragment in str(err.value)


def test_the_largest_plain_text_payload_fits_a_row() -> None:
    meta = {f"k{i}": "x" * LIMITS.max_metadata_value_chars for i in range(LIMITS.max_metadata_keys)}
    t = Transition(**BASE, metadata=meta, next_observation="y" * LIMITS.max_text_chars)
    assert len(t.metadata) == LIMITS.max_metadata_keys


def test_integer_actions_become_text() -> None:
    assert Transition(**{**BASE, "action": 2}).action == "2"


def test_retrieval_request_alias_and_bounds() -> None:
    r = RetrievalRequest.model_validate(
        {"request_id": "r", "tenant": "t", "query": "q", "lambda": 0.3}
    )
    assert r.lambda_ == 0.3
    with pytest.raises(ValidationError):
        RetrievalRequest(request_id="r", tenant="t", query="q", k=LIMITS.max_k + 1)
    with pytest.raises(ValidationError):
        RetrievalRequest(request_id="r", tenant="t")
    for empty in ("", "  \n "):
        with pytest.raises(ValidationError, match="query is empty"):
            RetrievalRequest(request_id="r", tenant="t", query=empty)
    assert RetrievalRequest(request_id="r", tenant="t", query="", vector=[1.0]).query == ""


def test_usage_weights_align_and_are_shares() -> None:
    with pytest.raises(ValidationError):
        MemoryUsage(
            tenant="t", episode_id="e", request_id="r", memory_ids=["a", "b"], weights=[1.0], ts=0
        )
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(ValidationError, match="weights.0"):
            MemoryUsage(tenant="t", episode_id="e", request_id="r", memory_ids=["a"],
                        weights=[bad], ts=0)  # fmt: skip


def test_usage_similarities_are_the_responders_aligned_and_in_range() -> None:
    base = {"tenant": "t", "episode_id": "e", "request_id": "r", "memory_ids": ["a", "b"],
            "weights": [0.5, 0.5], "ts": 0}  # fmt: skip
    u = MemoryUsage(**base, similarities=[0.9, 0.2])
    assert decode(MemoryUsage, encode(u)).similarities == [0.9, 0.2]
    for bad in ([0.9], [1.2, 0.1], [-0.1, 0.5]):
        with pytest.raises(ValidationError):
            MemoryUsage(**base, similarities=bad)
    with pytest.raises(ValidationError, match="responder"):
        MemoryUsage(**base, similarities=[0.9, 0.2], source="agent")


def test_usage_step_reward_is_optional_finite_and_round_trips() -> None:
    base = {
        "tenant": "t",
        "episode_id": "e",
        "request_id": "r",
        "memory_ids": ["a"],
        "weights": [1.0],
        "ts": 0,
        "source": "agent",
    }
    assert MemoryUsage(**base).reward is None
    u = MemoryUsage(**base, reward=-2.5)
    assert decode(MemoryUsage, encode(u)).reward == -2.5
    with pytest.raises(ValidationError, match="finite"):
        MemoryUsage(**base, reward=float("nan"))


def test_json_schema_export(tmp_path: Path) -> None:
    paths = export_json_schemas(tmp_path)
    names = {p.name for p in paths}
    for model in (
        "Transition",
        "EpisodeOutcome",
        "Feedback",
        "RetrievalRequest",
        "RetrievalResponse",
        "MemoryUsage",
        "MemoryEvent",
        "UtilityUpdate",
        "DeadLetter",
    ):
        assert f"{model}.schema.json" in names
    schema = json.loads((tmp_path / "Transition.schema.json").read_text())
    assert "schema_version" in schema["properties"]
    assert schema["properties"]["observation"]["anyOf"][0]["maxLength"] == LIMITS.max_text_chars
    assert "DeadLetter" in DeadLetter.__name__


def test_error_tree_retriable_flags() -> None:
    assert StoreUnavailable("x").retriable and BrokerUnavailable("x").retriable
    assert not ConfigError("x").retriable
    err = DmemError("bad", topic="t", partition=1, offset=5, key="k")
    assert str(err) == "bad (topic=t, partition=1, offset=5, key=k)"
