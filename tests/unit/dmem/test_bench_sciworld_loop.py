"""The closed loop's random fallback uses common random numbers (no simulator, no stack).

`dmem_bench.sciworld.fallback_action` seeds each draw by the decision point, so two
paired conditions that reach the same state draw the same action whatever happened
before in their episodes (BENCHMARKS.md "sci13e"). With one random stream per
episode (the code before), the condition that took one more step before reaching
the state drew from another place in the stream.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from dmem_bench.sciworld import SciConfig, fallback_action, loop_episode

HALL = [f"go to room {i}" for i in range(20)]


class GraphWorld:
    """A tiny text world: start -> kitchen -> hall, or start -> hall; hall -> done."""

    gold: list[str] = []
    invalid_prefixes = ("No known action",)

    def __init__(self) -> None:
        self.state = "start"

    def close(self) -> None: ...
    def variations(self, task: str) -> tuple[list[int], list[int]]:
        return [0], [1]

    def load(self, task: str, variation: int) -> None: ...
    def progress(self) -> dict[str, bool]:
        return {}

    def reset(self) -> str:
        self.state = "start"
        return "You are at the start."

    def valid(self) -> list[str]:
        return {
            "start": ["go to hall", "go to kitchen"],
            "kitchen": ["go to hall", "walk to hall"],
            "hall": HALL,
        }[self.state]

    def act(self, action: str) -> tuple[str, float, int, bool, bool]:
        if action not in self.valid():
            return "No known action matches that input.", 0.0, 0, False, False
        if self.state in ("start", "kitchen") and action.endswith("hall"):
            self.state = "hall"
            return "You are in the hall.", 0.0, 0, False, False
        if self.state == "start":
            self.state = "kitchen"
            return "You are in the kitchen.", 0.0, 0, False, False
        return (
            f"You went to {action[6:]}.",
            float(HALL.index(action)),
            HALL.index(action),
            True,
            False,
        )


class OneHint:
    """A client whose only memory, served at the start, says which way to go."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.outcomes: list[tuple[str, float, dict[str, Any]]] = []
        self.usages: list[tuple[str, dict[str, float], dict[str, Any]]] = []

    async def report_usage(
        self, episode_id: str, request_id: str, weights: dict[str, float], **kw: Any
    ) -> None:
        self.usages.append((request_id, dict(weights), kw))

    async def report_outcome(self, episode_id: str, reward: float, **kw: Any) -> None:
        self.outcomes.append((episode_id, reward, kw))

    async def search(self, obs: str, k: int, **_: Any) -> list[Any]:
        if not obs.startswith("You are at the start"):
            return []
        return [
            SimpleNamespace(
                memory_id="m1",
                action=self.action,
                reward=1.0,
                utility=0.0,
                breakdown=SimpleNamespace(lambda_=1.0, semantic=1.0, salience=0.5),
            )
        ]


def _hall_action(hint: str, seed: int) -> tuple[str, int]:
    trace: list[dict[str, Any]] = []
    cfg = SciConfig(tasks=("find-plant",), seed=seed, loop_max_steps=5)
    asyncio.run(
        loop_episode(
            GraphWorld(),
            OneHint(hint),
            "find-plant",
            1,
            1.0,  # type: ignore[arg-type]
            cfg,
            "t",
            trace,
            credit=False,
        )
    )
    step = trace[-1]
    assert step["memory"] is None  # the hall's action is the random fallback's
    return str(step["action"]), int(step["step"])


def test_same_state_after_different_histories_draws_the_same_fallback() -> None:
    for seed in range(5):
        # via the kitchen: one fallback draw there before the hall
        via_kitchen, at_step = _hall_action("go to kitchen", seed)
        direct, at_step_direct = _hall_action("go to hall", seed)
        assert (at_step, at_step_direct) == (2, 1)  # different histories, same hall
        assert via_kitchen == direct
        assert via_kitchen in HALL


def test_draw_depends_on_the_decision_point_and_revisits_draw_anew() -> None:
    base = dict(seed=0, task="find-plant", variation=1, repeat=0, obs="You are in the hall.")
    first = fallback_action(**base, valid=HALL, avoid=set(), visit=0)  # type: ignore[arg-type]
    # same state: same action, whatever the order the valid actions were listed in
    assert fallback_action(**base, valid=HALL[::-1], avoid=set(), visit=0) == first  # type: ignore[arg-type]
    # over many states, another repeat, another seed or a revisit changes some draws
    for key, other in (("repeat", 1), ("seed", 1), ("visit", 1)):
        draws = []
        for i in range(10):
            args: dict[str, Any] = {
                **base,
                "obs": f"state {i}",
                "valid": HALL,
                "avoid": set(),
                "visit": 0,
            }
            a = fallback_action(**args)
            args[key] = other
            draws.append(a != fallback_action(**args))
        assert any(draws), key


def test_avoiding_other_actions_keeps_the_draw() -> None:
    for i in range(20):
        obs = f"state {i}"
        free = fallback_action(0, "find-plant", 1, 0, obs, HALL, set(), 0)
        warned = set(HALL[:5]) - {free}
        assert fallback_action(0, "find-plant", 1, 0, obs, HALL, warned, 0) == free
        assert fallback_action(0, "find-plant", 1, 0, obs, HALL, {free}, 0) != free
        # everything warned against: the draw is still one of the valid actions
        assert fallback_action(0, "find-plant", 1, 0, obs, HALL, set(HALL), 0) in HALL


def test_loop_outcome_names_its_task_and_the_step_that_earned_it() -> None:
    """The credit baseline is per (tenant, agent, task): without the task, one loop
    agent's outcomes on every task share one running mean; and memories used after
    the last score change get no share of the outcome (sci13e)."""
    for seed in range(3):
        client = OneHint("go to kitchen")
        cfg = SciConfig(tasks=("find-plant",), loop_max_steps=5, seed=seed)
        trace: list[dict[str, Any]] = []
        score, _ = asyncio.run(
            loop_episode(
                GraphWorld(),
                client,
                "find-plant",
                1,
                None,  # type: ignore[arg-type]
                cfg,
                "hybrid",
                trace,
            )
        )
        rewarded = [s["step"] for s in trace if s["reward"] != 0]
        assert client.outcomes == [
            (
                "find-plant-1-loop-hybrid",
                float(score),
                {
                    "agent_id": "loop-hybrid",
                    "task": "find-plant",
                    "step": rewarded[-1] if rewarded else None,
                },
            )
        ]


def test_loop_usage_carries_the_reward_that_followed_the_decision() -> None:
    """Each usage record names the step's reward as step evidence (operators/credit.py:
    an outcome of the opposite sign then neither credits nor blames that use)."""

    class RewardingHint(OneHint):
        async def search(self, obs: str, k: int, **kw: Any) -> list[Any]:
            if not obs.startswith("You are in the hall"):
                return await super().search(obs, k, **kw)
            hits = await super().search("You are at the start.", k, **kw)
            return [SimpleNamespace(**{**vars(h), "action": "go to room 7"}) for h in hits]

    class AmbiguousWorld(GraphWorld):
        """The room's action first asks which one was meant; "0" resolves it."""

        def act(self, action: str) -> tuple[str, float, int, bool, bool]:
            if action == "go to room 7":
                return "Ambiguous request: which one?", 0.0, 0, False, False
            return super().act("go to room 7" if action == "0" else action)

    for world in (GraphWorld(), AmbiguousWorld()):
        client = RewardingHint("go to hall")
        trace: list[dict[str, Any]] = []
        asyncio.run(
            loop_episode(
                world,
                client,
                "find-plant",
                1,
                None,  # type: ignore[arg-type]
                SciConfig(tasks=("find-plant",), loop_max_steps=5),
                "hybrid",
                trace,
            )
        )
        # the reward of the action as resolved (after an ambiguous request too)
        assert [(u[1], u[2]["reward"]) for u in client.usages] == [
            ({"m1": 1.0}, 0.0),
            ({"m1": 1.0}, 7.0),
        ]
        assert [s["reward"] for s in trace] == [0.0, 7.0]


def test_publish_mode_is_validated() -> None:
    import pytest

    assert SciConfig(tasks=("find-plant",), publish="step").publish == "step"
    with pytest.raises(ValueError, match="publish"):
        SciConfig(tasks=("find-plant",), publish="bulk")


def test_credit_between_is_validated() -> None:
    import pytest

    assert SciConfig(tasks=("find-plant",)).credit_between == "settled"
    assert SciConfig(tasks=("find-plant",), credit_between="async").credit_between == "async"
    with pytest.raises(ValueError, match="credit_between"):
        SciConfig(tasks=("find-plant",), credit_between="eventually")
