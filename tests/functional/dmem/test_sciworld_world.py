"""ScienceWorld episodes do not depend on what the JVM played before them (no stack).

`sciworld_env.SciWorld` fixes the JVM's identity hash codes (``FIXED_IDENTITY_HASH``):
with HotSpot's default, the same episode (same variation, same seeded random
actions over the sorted valid-action list) lists other objects after other
episodes, which made the closed loop's paired conditions start from different
simulator states (BENCHMARKS.md "ScienceWorld", Determinism).
"""

from __future__ import annotations

import hashlib
import shutil

import pytest

from dmem_bench.sciworld_env import SciWorld, play

TASK, VARIATION = "chemistry-mix-paint-secondary-color", 27  # a test variation


def digest(sw: SciWorld) -> str:
    """Observations, valid-action lists, actions and rewards of one random episode."""
    ep = play(sw, TASK, VARIATION, "random", 0, "check", random_steps=15)
    h = hashlib.md5()
    for st in ep.steps:
        h.update(f"{st.observation}|{st.action}|{st.reward}|{st.next_observation}".encode())
    h.update("\n".join(sw.valid()).encode())
    return h.hexdigest()


def test_an_episode_is_the_same_whatever_the_jvm_played_before() -> None:
    if shutil.which("java") is None:
        pytest.fail("ScienceWorld needs Java 17: run scripts/setup.sh as root")
    fresh, other = SciWorld(), SciWorld()
    try:
        first = digest(fresh)  # the first episode of a fresh JVM
        play(other, "find-plant", 0, "noisy", 0, "history")
        play(other, "power-component", 0, "random", 0, "history", random_steps=10)
        assert digest(other) == first  # after another history
        assert digest(fresh) == first  # replayed right after itself
    finally:
        fresh.close()
        other.close()
