"""Numbers a payload may carry stay within what the operators and Milvus can hold:
a record beyond them is refused at validation (and dead-lettered by a stream), never
accepted and then crashed on downstream."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from schemas import EpisodeOutcome, Feedback, MemoryUsage, Transition
from schemas.limits import LIMITS

T: dict[str, Any] = {"tenant": "t", "agent_id": "a", "episode_id": "e", "step": 0,
                     "observation": "x", "action": "go"}  # fmt: skip


@pytest.mark.parametrize(
    ("field", "ok", "refused"),
    [
        ("reward", LIMITS.max_abs_value, 1e39),  # beyond float32: the value model's range
        ("reward", -LIMITS.max_abs_value, -1e39),
        ("ts", LIMITS.max_event_ms, 2**63),  # beyond Milvus' INT64
        ("step", LIMITS.max_step, 2**63),
    ],
)
def test_transition_numbers_are_bounded(field: str, ok: float, refused: float) -> None:
    assert getattr(Transition(**{**T, field: ok}), field) == ok
    with pytest.raises(ValidationError) as e:
        Transition(**{**T, field: refused})
    assert e.value.errors()[0]["loc"] == (field,)


def test_metadata_integers_are_what_milvus_and_its_filters_hold() -> None:
    for n in (2**63 - 1, -(2**63) + 1):
        assert Transition(**{**T, "metadata": {"n": n}}).metadata["n"] == n
    for n in (2**70, -(2**63)):  # -2^63 is an INT64, but no filter can name it
        with pytest.raises(ValidationError, match="2\\^63"):
            Transition(**{**T, "metadata": {"n": n}})


def test_an_action_with_nul_is_refused() -> None:
    """The dedup job's filters name the action; a NUL cannot be in a filter."""
    with pytest.raises(ValidationError, match="NUL"):
        Transition(**{**T, "action": "press\x00enter"})


def test_outcome_feedback_and_usage_values_are_bounded() -> None:
    with pytest.raises(ValidationError):
        EpisodeOutcome(tenant="t", episode_id="e", reward=1e200)
    with pytest.raises(ValidationError):
        Feedback(tenant="t", episode_id="e", kind="reward", value=-1e200)
    with pytest.raises(ValidationError):
        MemoryUsage(tenant="t", episode_id="e", request_id="r", memory_ids=["m"],
                    weights=[1e308], ts=1)  # fmt: skip
    with pytest.raises(ValidationError):
        Feedback(tenant="t", memory_id="m", kind="thumbs_up", ts=2**64 - 1)


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"memory_id": "m", "value": 1}, "reward feedback needs an episode_id"),
        ({"episode_id": "e", "kind": "thumbs_up"}, "thumbs_up needs a memory_id"),
    ],
)
def test_feedback_that_would_credit_nothing_is_refused(fields: dict[str, object], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        Feedback.model_validate({"tenant": "t", **fields})


def test_feedback_that_names_what_it_credits_is_taken() -> None:
    got = [
        Feedback.model_validate({"tenant": "t", **f})
        for f in (
            {"memory_id": "m", "kind": "thumbs_down", "value": -1},
            {"memory_id": "m", "kind": "thumbs_up"},
            {"episode_id": "e", "memory_id": "m", "kind": "thumbs_up", "value": 1},
            {"episode_id": "e", "value": -2},
            {"memory_id": "m", "kind": "thumbs_down", "value": 1},
        )
    ]  # the last: a thumbs down as SDK 0.1.0 sent it
    assert [(f.kind, f.value, f.memory_id, f.episode_id) for f in got] == [
        ("thumbs_down", -1.0, "m", None), ("thumbs_up", 0.0, "m", None),
        ("thumbs_up", 1.0, "m", "e"), ("reward", -2.0, None, "e"),
        ("thumbs_down", 1.0, "m", None)]  # fmt: skip
