"""Failure judged per (agent, task) context: which outcomes end an episode in failure.

A death that pays no negative step reward (a CookingWorld agent eating the wrong
item: reward 0, episode over) is invisible to the gate (no TD error, no reward
surprise) and often to hindsight too (an outcome of 0 in a tenant that often scores
0 reveals nothing). Only the outcome says the episode failed, and only against what
the same agent usually gets on the same task: 0 is a failure where 100 is usual and
the norm where nothing better was ever reached.

Decisions:

- Scale-free: an outcome's *position* in the range of its context's outcomes,
  ``(x - lo) / (hi - lo)`` over the outcomes before it in event time together with
  itself. It is a failure when it lies in the lower half (position <
  `FAILURE_POSITION`). The position is unchanged by any positive scale and shift of
  the outcomes, so +-1 and 0..100 scores are judged alike; for two-valued outcomes
  (success / failure) the lower value is a failure whatever the success rate (a
  mean-and-spread advantage would move its threshold with the rate).
- No range, no failure: a context's first outcome, or one equal to every outcome
  before it, is not judged a failure (no number has a meaning on its own: 0 is a
  failure on a 0..100 score and a middling result on +-1). An outcome below a
  context whose outcomes were all equal so far is (the range then runs from it to
  them). An agent that knows says so: ``success`` set on the outcome decides
  instead of the range (``False``: a failure, ``True``: not one).
- Event time: each context holds its last `CONTEXT_KEEP` outcomes sorted by (event
  time, outcome id) and an outcome is judged against those before it, so the
  decision does not depend on the order outcomes are fetched in; an outcome id held
  already (a redelivery) is judged against the same outcomes and not held twice.
  An outcome without an event time is placed after every held one.
- Bounded: at most `CONTEXTS_MAX` contexts, the least recently reported forgotten.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from typing import Any

__all__ = ["CONTEXTS_MAX", "CONTEXT_KEEP", "FAILURE_POSITION", "ContextOutcomes", "failed"]

#: an outcome in the lower half of its context's range is a failure
FAILURE_POSITION = 0.5
#: outcomes held per context (the range is taken over these)
CONTEXT_KEEP = 32
#: contexts held per tenant state
CONTEXTS_MAX = 1024

Held = tuple[int, int, str, float]  # (event time, untimed, outcome id, outcome)


def failed(prior: list[float], x: float, success: bool | None = None) -> bool:
    """Whether outcome `x` is a failure against `prior` (its context's outcomes before it).

    ``success`` given by the agent decides. Otherwise the position of `x` in the range
    of ``prior + [x]``; no range (no prior outcome, or all equal to `x`): not a failure.
    """
    if success is not None:
        return not success
    lo, hi = min([*prior, x]), max([*prior, x])
    if not hi > lo:
        return False
    return (x - lo) / (hi - lo) < FAILURE_POSITION


class ContextOutcomes:
    """Per context (``agent``, ``task``): its last outcomes by event time (module doc)."""

    def __init__(self, keep: int = CONTEXT_KEEP, contexts: int = CONTEXTS_MAX) -> None:
        if keep < 1 or contexts < 1:
            raise ValueError("keep and contexts must be >= 1")
        self.keep = int(keep)
        self.contexts = int(contexts)
        self.held: OrderedDict[str, list[Held]] = OrderedDict()

    @staticmethod
    def key(agent: str | None, task: str | None) -> str:
        return f"{agent or ''}\x1f{task or ''}"

    def _sort_key(self, held: list[Held], ts: int | None, outcome_id: str) -> tuple[int, int, str]:
        if ts is not None:
            return (int(ts), 0, outcome_id)
        return (held[-1][0] if held else 0, 1, outcome_id)

    def judge(
        self,
        context: str,
        x: float,
        ts: int | None,
        outcome_id: str,
        success: bool | None = None,
    ) -> bool:
        """Whether `x` is a failure for `context`, then hold it (a held id: judged as
        when it was first held, not held again)."""
        held = self.held.get(context, [])
        mine = next((h for h in held if h[2] == outcome_id), None)
        key = mine[:3] if mine is not None else self._sort_key(held, ts, outcome_id)
        prior = [h[3] for h in held if h[:3] < key]
        verdict = failed(prior, float(x), success)
        if mine is None:
            bisect.insort(held, (*key, float(x)))
            del held[: max(0, len(held) - self.keep)]
        self.held[context] = held
        self.held.move_to_end(context)
        while len(self.held) > self.contexts:
            self.held.popitem(last=False)
        return verdict

    def to_dict(self, last: int | None = None) -> dict[str, Any]:
        """JSON form; with `last`, only the `last` most recently reported contexts."""
        items = list(self.held.items())
        if last is not None:
            items = items[-last:] if last > 0 else []
        return {"keep": self.keep, "contexts": [[k, [list(h) for h in v]] for k, v in items]}

    @classmethod
    def from_dict(cls, d: dict[str, Any], contexts: int = CONTEXTS_MAX) -> ContextOutcomes:
        c = cls(keep=int(d["keep"]), contexts=contexts)
        for k, v in d["contexts"]:
            c.held[str(k)] = [(int(a), int(b), str(i), float(x)) for a, b, i, x in v]
        return c
