"""Tie-aware ranking metrics and rubric parsing of `dmem bench sciworld` (no simulator)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from dmem_bench.sciworld import hit_prob, mrr, step_id, store_stats
from dmem_bench.sciworld_env import TASKS, Step, newly_done, rng_for, rubric


def _brute(scores: list[float], rel: list[bool], k: int) -> tuple[float, float]:
    """Average over every order of equal scores (the definition)."""
    groups = sorted({*scores}, reverse=True)
    blocks = [[i for i in range(len(scores)) if scores[i] == s] for s in groups]
    hits, rr, n = 0.0, 0.0, 0
    for perm in itertools.product(*(itertools.permutations(b) for b in blocks)):
        order = [i for b in perm for i in b]
        n += 1
        hits += any(rel[i] for i in order[:k])
        first = next((p for p, i in enumerate(order[:k]) if rel[i]), None)
        rr += 0.0 if first is None else 1.0 / (first + 1)
    return hits / n, rr / n


@pytest.mark.parametrize("seed", range(12))
def test_tie_aware_metrics_match_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(3, 7)
    scores = [rng.choice([0.9, 0.8, 0.8, 0.5]) for _ in range(n)]
    rel = [rng.random() < 0.3 for _ in range(n)]
    k = rng.randint(1, 4)
    h, r = _brute(scores, rel, k)
    assert hit_prob(scores, rel, k) == pytest.approx(h)
    assert mrr(scores, rel, k) == pytest.approx(r)


def test_identical_strings_share_the_credit() -> None:
    # 10 memories with the same text (same score), one of them relevant: hit@5 = 0.5
    assert hit_prob([1.0] * 10, [True] + [False] * 9, 5) == pytest.approx(0.5)
    assert mrr([1.0] * 10, [True] + [False] * 9, 10) == pytest.approx(
        sum(1 / (i + 1) for i in range(10)) / 10
    )
    assert hit_prob([], [], 5) == 0.0 and math.isfinite(mrr([0.3], [False], 10))


def test_rubric_subgoals() -> None:
    before = rubric(
        "Sequential Subgoals:\n0\tfalse\t   GoalFocus\tfocus on a plant\n"
        "Unordered and Optional Subgoals:\n0\tfalse\t  GoalMove\tmove somewhere\n"
    )
    after = rubric(
        "Sequential Subgoals:\n0\ttrue\t   GoalFocus\tfocus on a plant\n"
        "Unordered and Optional Subgoals:\n0\ttrue\t  GoalMove\tmove somewhere\n"
    )
    assert newly_done(before, after) == ["seq0", "opt0"]
    assert newly_done(after, after) == []


def test_seeded_draws_and_allowed_tasks() -> None:
    assert rng_for(1, "a", 2).random() == rng_for(1, "a", 2).random()
    assert rng_for(1, "a", 2).random() != rng_for(2, "a", 2).random()
    assert len(TASKS) == 20 and "boil" not in TASKS and "use-thermometer" not in TASKS


def test_paired_difference_over_the_same_episodes() -> None:
    from dmem_bench.sciworld import paired

    mean, se, won, lost = paired([17, 0, 67, 50], [17, 17, 67, 0])
    assert mean == pytest.approx(33 / 4)
    d = [0, -17, 0, 50]
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    assert se == pytest.approx(sd / 2)
    assert (won, lost) == (1, 1)
    assert paired([], []) == (0.0, 0.0, 0, 0)
    with pytest.raises(ValueError):
        paired([1.0], [1.0, 2.0])


def test_metrics_do_not_depend_on_the_served_order_of_ties() -> None:
    """The responder orders exact ties by memory id (operators/retrieval.py): the hit
    metrics already take the expectation over ties, so that order cannot move them."""
    scores = [0.9, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.5]
    rel = [False, False, False, True, False, True, False, True]
    want = (hit_prob(scores, rel, 3), mrr(scores, rel, 10))
    shuffler = random.Random(7)
    for _ in range(20):
        order = list(range(len(scores)))
        shuffler.shuffle(order)
        got = (
            hit_prob([scores[i] for i in order], [rel[i] for i in order], 3),
            mrr([scores[i] for i in order], [rel[i] for i in order], 10),
        )
        assert got == pytest.approx(want)
    assert 0.0 < want[0] < 1.0  # the cut at 3 goes through the tied group


def test_failure_terminal_coverage_counts_failed_episodes_by_their_last_step() -> None:
    def step(ep: str, n: int, reward: float, failed: bool) -> Step:
        return Step(task="t", variation=0, policy="random", episode=ep, step=n,
                    observation=f"{ep} obs {n}", action=f"act {n}", reward=reward, score=0,
                    next_observation="", done=failed, failed=failed)  # fmt: skip

    steps = {
        step_id(s): s
        for s in (
            step("a", 0, 0.0, False), step("a", 1, 0.0, True),  # a death scored 0
            step("b", 0, 0.5, False), step("b", 1, -1.0, True),  # a failure that paid -1
            step("c", 0, 1.0, False),  # no failure
        )
    }  # fmt: skip
    rows = {"b:1": ("core", ()), "c:0": ("core", ())}
    got = store_stats(rows, steps)
    assert got["failed_episodes"] == 2 and got["failure_terminal_silent"] == 1
    assert got["failure_terminal_coverage"] == 0.5
    rows["x"] = ("buffer", ("a:1",))  # a dedup survivor stands for the death it merged
    assert store_stats(rows, steps)["failure_terminal_coverage"] == 1.0
