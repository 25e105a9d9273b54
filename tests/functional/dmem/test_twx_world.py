"""TextWorldExpress as the bench's second environment (`dmem_bench.twx_env`), no stack.

Plays real CookingWorld / CoinCollector episodes (Java 17): rewards stay on TWX's own
0..1 scale, the bench score is 0..100, and rewarded steps get a subgoal.
"""

from __future__ import annotations

import shutil

import pytest

from dmem_bench.sciworld import SciConfig
from dmem_bench.sciworld_env import play
from dmem_bench.twx_env import TWXWorld


def test_twx_gold_episodes_keep_their_reward_scale() -> None:
    if shutil.which("java") is None:
        pytest.fail("TextWorldExpress needs Java 17: run scripts/setup.sh as root")
    w = TWXWorld()
    try:
        train, test = w.variations("cookingworld")
        assert train and test and not set(train) & set(test)
        ep = play(w, "cookingworld", train[0], "gold", 0, "cw-gold")
        rewarded = [s for s in ep.steps if s.reward > 0]
        assert ep.success and ep.final_score == 100
        assert 0 < sum(s.reward for s in rewarded) <= 1.0 + 1e-9  # TWX's scale, unchanged
        assert all(s.subgoal and s.subgoal.startswith("template:") for s in rewarded)
        assert ep.steps[-1].done and not any(s.failed for s in ep.steps)
        w.load("coin", test[0])
        obs = w.reset()
        o, r, score, done, failed = w.act("fly to the moon")  # unparsable: changes nothing
        assert o.startswith(w.invalid_prefixes) and (r, score, done, failed) == (
            0.0,
            0,
            False,
            False,
        )
        assert obs and w.valid() and w.valid() == sorted(w.valid())
    finally:
        w.close()


def test_config_checks_tasks_per_env() -> None:
    assert SciConfig(env="twx-coin", tasks=("coin",)).env == "twx-coin"
    with pytest.raises(ValueError, match="not allowed"):
        SciConfig(env="twx-coin", tasks=("find-plant",))
    with pytest.raises(ValueError, match="unknown env"):
        SciConfig(env="twx-zork", tasks=("coin",))


def test_unparsable_inputs_do_not_spend_the_step_limit() -> None:
    """TWX counts every input toward its own limit; the bench's limit counts accepted
    actions only, so an agent that tries more unusable memories gets as many moves."""
    if shutil.which("java") is None:
        pytest.fail("TextWorldExpress needs Java 17: run scripts/setup.sh as root")
    w = TWXWorld(step_limit=3)
    try:
        w.load("cookingworld", w.variations("cookingworld")[1][0])
        w.reset()
        for _ in range(12):  # four times the limit of inputs it cannot parse
            assert w.act("fly to the moon")[3] is False
        done = [w.act("look around")[3] for _ in range(3)]
        assert done == [False, False, True]
        w.reset()  # a new episode has its moves again
        assert w.act("look around")[3] is False
    finally:
        w.close()
