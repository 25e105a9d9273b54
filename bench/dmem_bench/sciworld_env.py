"""ScienceWorld episodes for `dmem bench sciworld`: policies, steps and ground truth.

Decisions (see BENCHMARKS.md "ScienceWorld"):

- Only the tasks in ``TASKS`` are used; the other ten ScienceWorld tasks
  are kept for an evaluation this project does not see.
- One JVM per benchmark run (``SciWorld``), reused for every task and variation
  (starting it costs ~2-3 s, loading a task ~1-9 s). The bench talks to the
  simulator's own interface (``env.server``) rather than ``ScienceWorldEnv.step``,
  which also computes look/inventory/task text and the full valid-action list on
  every step (~1 s each on these machines); the valid actions are asked for only
  where a policy needs them.
- Determinism: the JVM runs with every identity hash code the same constant
  (``FIXED_IDENTITY_HASH``, ``-XX:hashCode=2``). The simulator keeps its objects in
  hash sets keyed by identity; with HotSpot's default (a per-thread pseudo-random
  sequence) the codes an episode's objects get depend on how many objects the JVM
  hashed before, so the same episode (same task, variation and actions) listed
  other objects and valid actions after other episodes, and even when replayed
  right after itself (``reset`` and ``load`` rebuild the world and reseed the
  simulator's ``Random``; they cannot rewind the JVM's hash sequence). With a
  constant code, set order is a function of insertion order alone: an episode is
  the same whatever was played before it in the JVM, and the same across JVMs
  (BENCHMARKS.md
  "Determinism": checked, and what it costs). The valid-action list is also
  sorted before a random policy draws from it, and every draw comes from a
  ``random.Random`` seeded by (seed, task, variation, policy).
- Score and reward: the simulator's score is 0..100 (or negative when the task
  fails); reward = score delta, so +1..+25 for progress and about -100 for a
  failure. A step is *critical* when its reward is non-zero or it fails the task.
- Subgoals: ScienceWorld exposes its scoring rubric (``getGoalProgressStr``). A
  rewarded step's subgoal is the set of rubric lines that turned from false to
  true on that step, named by its place in the rubric (section and index: the
  same subgoal in every variation of a task, whose descriptions name
  variation-specific objects); the first such line names it, sequential subgoals
  first; none: the step's action template. Relevant memories of a probe are the
  stored rewarded steps of the same task with the same subgoal.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

TASKS: tuple[str, ...] = (
    "melt",
    "freeze",
    "change-the-state-of-matter-of",
    "measure-melting-point-unknown-substance",
    "power-component",
    "power-component-renewable-vs-nonrenewable-energy",
    "test-conductivity-of-unknown-substances",
    "find-non-living-thing",
    "find-plant",
    "find-animal",
    "grow-fruit",
    "chemistry-mix-paint-secondary-color",
    "chemistry-mix-paint-tertiary-color",
    "lifespan-shortest-lived",
    "lifespan-longest-lived-then-shortest-lived",
    "identify-life-stages-2",
    "inclined-plane-friction-named-surfaces",
    "inclined-plane-friction-unnamed-surfaces",
    "mendelian-genetics-known-plant",
    "mendelian-genetics-unknown-plant",
)
#: the first tasks of a default run: short gold paths, several reward kinds, a fail state
DEFAULT_TASKS: tuple[str, ...] = (
    "find-plant",
    "find-animal",
    "find-non-living-thing",
    "power-component",
    "chemistry-mix-paint-secondary-color",
    "lifespan-shortest-lived",
)
POLICIES = ("gold", "noisy", "random")
#: HotSpot options of the simulator's JVM: one constant identity hash code, so the
#: simulator's identity-keyed hash sets iterate in an order fixed by insertion, and an
#: episode does not depend on what the JVM hashed before it (module docstring)
FIXED_IDENTITY_HASH = "-XX:+UnlockExperimentalVMOptions -XX:hashCode=2"
_RUBRIC = re.compile(r"^(\d+)\t(true|false)\t\s*(\S+)\t(.*)$")


@dataclass
class Step:
    """One environment step, with the ground truth the bench scores against."""

    task: str
    variation: int
    policy: str
    episode: str
    step: int
    observation: str
    action: str
    reward: float
    score: int
    next_observation: str
    done: bool
    failed: bool
    subgoal: str | None = None  # rewarded steps only
    gold: bool = False  # the action came from the gold sequence

    @property
    def critical(self) -> bool:
        return self.reward != 0 or self.failed


@dataclass
class Episode:
    task: str
    variation: int
    policy: str
    episode: str
    steps: list[Step] = field(default_factory=list)

    @property
    def final_score(self) -> int:
        return self.steps[-1].score if self.steps else 0

    @property
    def success(self) -> bool:
        return self.final_score >= 100


def rubric(text: str) -> dict[str, bool]:
    """Rubric lines -> completed flag, keyed by section, index and description."""
    out: dict[str, bool] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("Sequential"):
            section = "seq"
        elif line.startswith("Unordered"):
            section = "opt"
        m = _RUBRIC.match(line)
        if m:  # the line's place in the task's rubric names the subgoal; descriptions
            # carry variation details ("(green paint)") that unseen variations change
            out[f"{section}{m.group(1)}"] = m.group(2) == "true"
    return out


def newly_done(before: dict[str, bool], after: dict[str, bool]) -> list[str]:
    """Rubric lines completed by this step, sequential subgoals first."""
    new = [k for k, v in after.items() if v and not before.get(k, False)]
    return sorted(new, key=lambda k: (not k.startswith("seq"), k))


def template(action: str) -> str:
    """The verb part of an action ("open door to kitchen" -> "open")."""
    return action.split(" ", 1)[0] if action else ""


class World(Protocol):
    """What the bench needs of a text environment (`SciWorld`, `twx_env.TWXWorld`)."""

    gold: list[str]
    invalid_prefixes: tuple[str, ...]

    def close(self) -> None: ...
    def variations(self, task: str) -> tuple[list[int], list[int]]: ...
    def load(self, task: str, variation: int) -> None: ...
    def reset(self) -> str: ...
    def valid(self) -> list[str]: ...
    def act(self, action: str) -> tuple[str, float, int, bool, bool]: ...
    def progress(self) -> dict[str, bool]: ...


class JvmWorld:
    """A simulator behind a JVM (py4j): closing it twice, or after it died, is fine."""

    env: Any

    def close(self) -> None:
        try:
            self.env.close()
        except Exception:  # noqa: BLE001 - the JVM may already be gone
            pass


@contextmanager
def java_tool_options(opts: str) -> Iterator[None]:
    """Add `opts` to ``JAVA_TOOL_OPTIONS`` while a JVM is launched (the ScienceWorld
    wrapper has no parameter for JVM options; the launched JVM inherits the
    environment, and a later option overrides an earlier one of the same name)."""
    if not opts:
        yield
        return
    old = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = f"{old} {opts}" if old else opts
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("JAVA_TOOL_OPTIONS", None)
        else:
            os.environ["JAVA_TOOL_OPTIONS"] = old


class SciWorld(JvmWorld):
    """One ScienceWorld JVM, reused for every task and variation of a run."""

    #: the simulator's answer to an input it cannot parse (no move, nothing changes)
    invalid_prefixes: tuple[str, ...] = ("No known action matches",)

    def __init__(self, step_limit: int = 100, fixed_hash: bool = True) -> None:
        """``fixed_hash=False`` keeps HotSpot's default identity hash codes (episodes
        then depend on the episodes played before them in this JVM; for checks)."""
        from scienceworld import ScienceWorldEnv

        with java_tool_options(FIXED_IDENTITY_HASH if fixed_hash else ""):
            self.env = ScienceWorldEnv("", envStepLimit=step_limit)
        self.srv = self.env.server
        self.step_limit = step_limit
        self.loaded: tuple[str, int] | None = None
        self.gold: list[str] = []
        self.last_score = 0

    def variations(self, task: str) -> tuple[list[int], list[int]]:
        """(train, test) variation indices of a task."""
        self.load(task, 0)
        return list(self.srv.getVariationsTrain()), list(self.srv.getVariationsTest())

    def load(self, task: str, variation: int) -> None:
        if task not in TASKS:
            raise ValueError(f"task {task!r} is not one this benchmark may use")
        if self.loaded != (task, variation):
            self.srv.load(task, variation, "", True)
            self.gold = [str(a) for a in self.srv.getGoldActionSequence()]
            self.loaded = (task, variation)

    def reset(self) -> str:
        self.srv.reset()
        self.last_score = 0
        return str(self.srv.step("look around"))

    def valid(self) -> list[str]:
        return sorted(str(a) for a in self.srv.getValidActionObjectCombinations())

    def task_description(self) -> str:
        return str(self.srv.getTaskDescription())

    def act(self, action: str) -> tuple[str, float, int, bool, bool]:
        """(observation, reward, score, done, failed) of one step."""
        obs = str(self.srv.step(action))
        score = int(round(100 * float(self.srv.getScore())))
        reward = float(score - self.last_score)
        self.last_score = score
        failed = score < 0
        done = bool(self.srv.getCompleted()) or failed
        if int(self.srv.getNumMoves()) > self.step_limit:
            done = True
        return obs, reward, score, done, failed

    def progress(self) -> dict[str, bool]:
        return rubric(str(self.srv.getGoalProgressStr()))


def rng_for(seed: int, *parts: Any) -> random.Random:
    return random.Random(f"{seed}|" + "|".join(str(p) for p in parts))


def planned_actions(
    sw: World, policy: str, rng: random.Random, random_steps: int
) -> Iterator[tuple[str | None, bool]]:
    """(action, from_gold) pairs; None = draw a random valid action now."""
    if policy == "gold":
        for a in sw.gold:
            yield a, True
    elif policy == "noisy":  # 1-3 random valid actions before a gold action, p = 0.3
        for a in sw.gold:
            if rng.random() < 0.3:
                for _ in range(rng.randint(1, 3)):
                    yield None, False
            yield a, True
    elif policy == "random":
        for _ in range(random_steps):
            yield None, False
    else:
        raise ValueError(f"unknown policy {policy!r}")


def play(
    sw: World,
    task: str,
    variation: int,
    policy: str,
    seed: int,
    episode: str,
    random_steps: int = 12,
) -> Episode:
    """Play one episode of a scripted policy (gold, noisy or random)."""
    sw.load(task, variation)
    rng = rng_for(seed, task, variation, policy)
    ep = Episode(task, variation, policy, episode)
    obs = sw.reset()
    before = sw.progress()
    for i, (planned, from_gold) in enumerate(planned_actions(sw, policy, rng, random_steps)):
        action = planned if planned is not None else rng.choice(sw.valid())
        nxt, reward, score, done, failed = sw.act(action)
        st = Step(
            task,
            variation,
            policy,
            episode,
            i,
            obs,
            action,
            reward,
            score,
            nxt,
            done,
            failed,
            gold=from_gold,
        )
        if reward > 0:
            after = sw.progress()
            new = newly_done(before, after)
            st.subgoal = new[0] if new else f"template:{template(action)}"
            before = after
        ep.steps.append(st)
        obs = nxt
        if done:
            break
    return ep
