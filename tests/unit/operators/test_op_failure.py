"""Failure judged per (agent, task) context (`operators.failure`)."""

from __future__ import annotations

import random

import pytest

from operators.failure import CONTEXT_KEEP, ContextOutcomes, failed


def verdicts(xs: list[float], ts: list[int] | None = None) -> list[bool]:
    c = ContextOutcomes()
    ts = ts or list(range(len(xs)))
    return [c.judge("ctx", x, t, f"o{t}") for x, t in zip(xs, ts, strict=True)]


@pytest.mark.parametrize("seed", range(6))
def test_scale_free_the_same_verdicts_for_any_positive_scale_and_shift(seed: int) -> None:
    rng = random.Random(seed)
    # no value is the midpoint of two others: a verdict at exactly 1/2 would hang on rounding
    xs = [rng.choice([0.0, 0.0, 0.2, 0.7, 1.0]) for _ in range(40)]
    base = verdicts(xs)
    assert any(base) and not all(base)
    assert verdicts([100 * x for x in xs]) == base  # a 0..100 score
    assert verdicts([2 * x - 1 for x in xs]) == base  # +-1
    assert verdicts([-3.0 + 0.01 * x for x in xs]) == base


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_two_valued_outcomes_the_lower_is_a_failure_whatever_the_success_rate(rate: float) -> None:
    rng = random.Random(7)
    ok = [True] + [rng.random() < rate for _ in range(80)]  # the first is a success
    # a failure while a success is among the context's last CONTEXT_KEEP outcomes
    want = [not s and any(ok[max(0, i - CONTEXT_KEEP) : i]) for i, s in enumerate(ok)]
    assert sum(want) >= 0.5 * (len(ok) - sum(ok))
    for lo, hi in ((-1.0, 1.0), (0.0, 100.0)):
        assert verdicts([hi if s else lo for s in ok]) == want


def test_first_outcome_of_a_context_is_no_failure_unless_the_agent_says_so() -> None:
    for x in (-1.0, 0.0, 100.0):
        assert not ContextOutcomes().judge("ctx", x, 1, "a")
        assert ContextOutcomes().judge("ctx", x, 1, "a", success=False)
    assert failed([], 0.0) is False and failed([], 0.0, success=False) is True


def test_success_is_never_a_failure_and_equal_outcomes_reveal_nothing() -> None:
    c = ContextOutcomes()
    assert [c.judge("ctx", 5.0, t, f"o{t}") for t in range(4)] == [False] * 4
    assert c.judge("ctx", 9.0, 10, "best") is False  # above everything
    assert c.judge("ctx", 1.0, 11, "worst") is True  # below a context of equal outcomes
    assert c.judge("ctx", 0.0, 12, "said", success=True) is False  # the agent's word wins


def test_contexts_are_judged_apart() -> None:
    c = ContextOutcomes()
    c.judge(c.key("a", "easy"), 100.0, 1, "e1")
    c.judge(c.key("a", "hard"), 5.0, 2, "h1")
    # 5 is a failure on the easy task, and the best result so far on the hard one
    assert c.judge(c.key("a", "easy"), 5.0, 3, "e2")
    assert not c.judge(c.key("a", "hard"), 6.0, 4, "h2")


def test_event_time_decides_and_a_redelivery_is_judged_alike_and_held_once() -> None:
    c = ContextOutcomes()
    assert not c.judge("ctx", 100.0, 10, "a")
    assert not c.judge("ctx", 100.0, 30, "c")
    # late: stamped 20, after c arrived; judged against a (10) and c is not before it
    assert c.judge("ctx", 0.0, 20, "b")
    assert c.judge("ctx", 0.0, 20, "b")  # redelivered
    assert [h[2] for h in c.held["ctx"]] == ["a", "b", "c"]
    # an outcome stamped before every other has nothing before it: no range
    assert not c.judge("ctx", 0.0, 5, "first")


def test_bounded_and_round_trips() -> None:
    c = ContextOutcomes(keep=3, contexts=2)
    for t in range(5):
        c.judge("x", float(t), t, f"x{t}")
    c.judge("y", 1.0, 1, "y1")
    c.judge("z", 1.0, 1, "z1")
    assert list(c.held) == ["y", "z"]  # the least recently reported context went
    for t in range(5):
        c.judge("z", float(t), 10 + t, f"z{t + 10}")
    assert len(c.held["z"]) == 3
    back = ContextOutcomes.from_dict(c.to_dict(), contexts=2)
    assert back.held == c.held and back.keep == 3
    assert ContextOutcomes.from_dict(c.to_dict(last=1)).held == {"z": c.held["z"]}
    with pytest.raises(ValueError):
        ContextOutcomes(keep=0)
