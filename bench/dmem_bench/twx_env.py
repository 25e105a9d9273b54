"""TextWorldExpress worlds for `dmem bench sciworld --env twx-...` (the second environment).

The same bench, policies and ground truth as ScienceWorld (`dmem_bench.sciworld_env`),
on another reward structure, so nothing is tuned to one: TextWorldExpress (PyPI
``textworld-express``, a Java 17 jar like ScienceWorld) pays rewards on its own
0..1 scale (CookingWorld: 1/n per recipe step; CoinCollector: 1 for the coin, the
only reward), and a CookingWorld failure (eating the wrong thing) ends the episode
with reward 0. The bench publishes those rewards unchanged; only its reported score
is 0..100 (failure = 0), like ScienceWorld's.

Decisions (BENCHMARKS.md "ScienceWorld", second environment):

- A "task" is a game with fixed generation parameters (``GAMES``): small worlds
  (a few rooms, no doors for CookingWorld) so that gold paths stay short, chosen
  once and not per result. A "variation" is a seed; train variations come from the
  game's train seeds, test variations from its test seeds (disjoint in TWX).
- Subgoals: TextWorldExpress exposes no rubric. A rewarded step's subgoal is its
  action template (the verb: take / slice / cook / prepare / eat), the documented
  equivalent of ScienceWorld's rubric line: relevant memories of a probe are the
  stored rewarded steps of the same game with the same verb.
- Determinism: a seed fixes the world; policies draw from a seeded
  ``random.Random`` over the sorted valid-action list (as for ScienceWorld).
"""

from __future__ import annotations

from typing import Any

from dmem_bench.sciworld_env import JvmWorld

#: game -> generation parameters (TextWorldExpress ``gameParams``)
GAMES: dict[str, str] = {
    "coin": "numLocations=5,numDistractorItems=0,includeDoors=1,limitInventorySize=0",
    "cookingworld": "numLocations=3,numIngredients=2,numDistractorItems=2,includeDoors=0,"
    "limitInventorySize=0",
}
ENVS: dict[str, str] = {"twx-coin": "coin", "twx-cookingworld": "cookingworld"}
#: TWX's own limit, on every input: far above any episode (the step limit is ours)
ENV_INPUT_LIMIT = 1_000_000


class TWXWorld(JvmWorld):
    """One TextWorldExpress JVM with the interface of `sciworld_env.SciWorld`."""

    invalid_prefixes: tuple[str, ...] = ("Unknown action",)

    def __init__(self, step_limit: int = 100) -> None:
        from textworld_express import TextWorldExpressEnv

        # TWX counts every input toward its own step limit, one it cannot parse too;
        # the limit is kept here over accepted actions instead (`act`), so an agent
        # that tries more unusable memories does not run out of moves sooner
        self.env = TextWorldExpressEnv(envStepLimit=ENV_INPUT_LIMIT)
        self.step_limit = step_limit
        self.moves = 0
        self.loaded: tuple[str, int] | None = None
        self.fold: dict[tuple[str, int], str] = {}
        self.gold: list[str] = []
        self.infos: dict[str, Any] = {}

    def variations(self, task: str) -> tuple[list[int], list[int]]:
        if task not in GAMES:
            raise ValueError(f"unknown TextWorldExpress game {task!r}")
        self.env.load(gameName=task, gameParams=GAMES[task])
        train = [int(s) for s in self.env.getValidSeedsTrain()]
        test = [int(s) for s in self.env.getValidSeedsTest()]
        self.fold.update({(task, s): "train" for s in train})
        self.fold.update({(task, s): "test" for s in test})
        return train, test

    def load(self, task: str, variation: int) -> None:
        if task not in GAMES:
            raise ValueError(f"unknown TextWorldExpress game {task!r}")
        if (task, variation) not in self.fold:
            self.variations(task)
        self.loaded = (task, variation)

    def reset(self) -> str:
        assert self.loaded is not None, "load a task first"
        task, seed = self.loaded
        obs, self.infos = self.env.reset(
            seed=seed,
            gameFold=self.fold[(task, seed)],
            gameName=task,
            gameParams=GAMES[task],
            generateGoldPath=True,
        )
        self.moves = 0
        self.gold = [str(a) for a in self.env.getGoldActionSequence()]
        return str(obs)

    def valid(self) -> list[str]:
        return sorted(str(a) for a in self.infos.get("validActions", []))

    def task_description(self) -> str:
        return str(self.infos.get("taskDescription", ""))

    def act(self, action: str) -> tuple[str, float, int, bool, bool]:
        """(observation, reward on TWX's own scale, score 0..100 with failure 0, done,
        failed). An input TWX cannot parse changes nothing: no move, and it does not
        count toward ``step_limit`` (done once that many actions were accepted)."""
        obs, reward, done, infos = self.env.step(action)
        if str(obs).startswith(self.invalid_prefixes):
            return (
                str(obs),
                0.0,
                int(round(100 * float(self.infos.get("score", 0.0)))),
                False,
                False,
            )
        self.infos = infos
        self.moves += 1
        done = bool(done) or self.moves >= self.step_limit
        failed = bool(infos.get("taskfailure"))
        score = 0 if failed else int(round(100 * float(infos.get("score", 0.0))))
        return str(obs), float(reward), score, bool(done) or failed, failed

    def progress(self) -> dict[str, bool]:
        """No rubric in TWX: subgoals fall back to the action template (module doc)."""
        return {}
