"""Prototype reward-free scores for conversations: what a turn tells, not how long it is.

Not wired into the write path. Each candidate replaces the information term of
`operators.surprise.IntrinsicState` (its ``tokens`` model: ``ids(text)`` then
``surprisal(ids)`` then ``learn(ids)``, once per turn in stream order), so the rest
of the intrinsic score (novelty against the agent's bank, the context guard,
the running-mean normalisation) and the gate stay as they are; `install` swaps
one in on a tenant's state. Measured with ``dmem_bench.longmemeval`` and the LoCoMo
replay; the numbers and the choice are in docs/design/2026-12-02-conversation-score.md.

Candidates (``info`` in nats; the intrinsic score divides it by the tenant's
running mean, so only its ranking across turns matters):

- ``sum`` (the production term): summed token surprisal; grows with length.
- ``mean``: surprisal per token, shrunk towards zero for very short turns,
  ``sum / (n + n0)``: a one-word turn cannot outrank a sentence on one rare token.
- ``topm``: the sum of the ``m`` largest token surprisals (distinct tokens): what
  the turn's rarest words say. A long turn is credited for its ``m`` most
  specific words only, a short one loses nothing.
- ``speaker``: the summed surprisal divided by the running mean of the same
  speaker's turns (the ``"speaker: "`` prefix of a chat turn): every speaker is
  judged against its own typical turn, so a verbose speaker does not crowd out a
  terse one.

`AgentRewardMix`: the reward/intrinsic mix per agent instead of per tenant, so a
tenant whose other agents earn rewards still scores its chat agents' turns.

`span_horizons`: forgetting horizons that follow the stream's own span instead of
fixed days, so time alone never ages a conversation's past away.

`shadow_groups`: the shadow buffer's grouping (runs of skipped turns of one
session folded into one cheap searchable row that stands for them);
`shadow_clusters`: the same, folded by topic (nearest open row) instead of by order.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from operators.surprise import IntrinsicScore, RewardMix, TokenSurprisal

__all__ = [
    "CANDIDATES",
    "AgentRewardMix",
    "MeanSurprisal",
    "SpeakerSurprisal",
    "TopSurprisal",
    "install",
    "shadow_clusters",
    "shadow_groups",
    "span_horizons",
]

_SPEAKER = re.compile(r"^([^:\n]{1,64}):\s")


class MeanSurprisal(TokenSurprisal):
    """Surprisal per token, ``sum / (n + n0)`` (``n0`` tokens of shrinkage)."""

    def __init__(self, n0: float = 4.0, **kw: Any) -> None:
        super().__init__(**kw)
        self.n0 = float(n0)

    def surprisal(self, ids: np.ndarray) -> float:
        if ids.size == 0:
            return 0.0
        return super().surprisal(ids) / (ids.size + self.n0)


class TopSurprisal(TokenSurprisal):
    """The sum of the ``m`` largest surprisals among the turn's distinct tokens."""

    def __init__(self, m: int = 8, **kw: Any) -> None:
        super().__init__(**kw)
        self.m = int(m)

    def surprisal(self, ids: np.ndarray) -> float:
        if ids.size == 0:
            return 0.0
        u = np.unique(ids)
        a = self.smoothing
        p = (self.counts[u].astype(np.float64) + a) / (self.total + a * self.buckets)
        s = np.sort(-np.log(p))[::-1]
        return float(s[: self.m].sum())


class SpeakerSurprisal(TokenSurprisal):
    """Summed surprisal over the running mean of the same speaker's turns.

    The speaker is read from the ``"speaker: "`` prefix of the text (`ids` keeps it
    for the `surprisal` call that follows); text without one is its own speaker "".
    """

    def __init__(
        self, alpha: float = 0.01, max_speakers: int = 256, n0: float | None = None, **kw: Any
    ) -> None:
        super().__init__(**kw)
        self.alpha = float(alpha)
        self.n0 = n0  # set: per token first (`MeanSurprisal`), then per speaker
        self.max_speakers = int(max_speakers)
        self.means: OrderedDict[str, list[float]] = OrderedDict()  # speaker -> [mean, count]
        self._speaker = ""

    def ids(self, text: str) -> np.ndarray:
        m = _SPEAKER.match(text)
        self._speaker = m.group(1).strip().lower() if m else ""
        return super().ids(text)

    def surprisal(self, ids: np.ndarray) -> float:
        raw = super().surprisal(ids)
        if self.n0 is not None and ids.size:
            raw /= ids.size + self.n0
        st = self.means.get(self._speaker)
        if st is None:
            st = self.means[self._speaker] = [raw, 0]
            while len(self.means) > self.max_speakers:
                self.means.popitem(last=False)
        self.means.move_to_end(self._speaker)
        st[1] += 1
        mean = st[0] if st[1] > 1 else raw
        st[0] += max(1.0 / st[1], self.alpha) * (raw - st[0])
        return raw / max(mean, 1e-9)


CANDIDATES: dict[str, Any] = {
    "sum": None,
    "mean": MeanSurprisal,
    "topm": TopSurprisal,
    "speaker": SpeakerSurprisal,
}


def install(intrinsic: Any, name: str, **kw: Any) -> None:
    """Give a tenant's `IntrinsicState` the information term ``name`` (fresh counts)."""
    cls = CANDIDATES[name]
    if cls is not None:
        intrinsic.tokens = cls(**kw)


class AgentRewardMix:
    """One `RewardMix` per agent: w_intrinsic of a transition is its own agent's.

    A chat agent publishes reward 0, so its w stays 1 whatever the tenant's other
    agents earn; a rewarded agent's w falls to 0 as before. Bounded to the
    ``max_agents`` most recently seen agents (a new agent starts at w = 1, as a new
    tenant does).
    """

    def __init__(
        self, alpha: float = 0.002, rate_full: float = 0.01, max_agents: int = 4096
    ) -> None:
        self.alpha, self.rate_full, self.max_agents = alpha, rate_full, max_agents
        self.mixes: OrderedDict[str, RewardMix] = OrderedDict()

    def observe(self, agents: Sequence[str], rewards: np.ndarray) -> np.ndarray:
        """Fold each transition's reward into its agent's rate; w per transition."""
        r = np.asarray(rewards, dtype=np.float64).reshape(-1)
        for a, x in zip(agents, r.tolist(), strict=True):
            m = self.mixes.get(a)
            if m is None:
                m = self.mixes[a] = RewardMix(self.alpha, self.rate_full)
                while len(self.mixes) > self.max_agents:
                    self.mixes.popitem(last=False)
            self.mixes.move_to_end(a)
            m.observe(np.asarray([x]))
        return np.asarray([self.mixes[a].weight for a in agents])


def weighted(scores: Sequence[IntrinsicScore], w: np.ndarray) -> list[IntrinsicScore]:
    """Scores with each transition's own weight folded in (the gate then mixes at w = 1)."""
    return [
        replace(s, score=float(s.score * wi), raw=float(s.raw * wi))
        for s, wi in zip(scores, w.tolist(), strict=True)
    ]


def shadow_groups(
    dropped: Sequence[int], session_of: Sequence[Any], size: int, consecutive: bool = True
) -> list[list[int]]:
    """Groups of at most ``size`` dropped turns of one session, consecutive ones only
    unless ``consecutive`` is False (then a session's dropped turns in order).

    ``dropped``: indices (in stream order) of turns the gate skipped;
    ``session_of``: each turn's session. Each group becomes one shadow row (the
    normalised mean of its turns' embeddings) that a search can return; a hit on it
    stands for every turn in the group.
    """
    out: list[list[int]] = []
    for i in dropped:
        g = out[-1] if out else None
        if (
            g is not None
            and len(g) < size
            and session_of[g[-1]] == session_of[i]
            and (i == g[-1] + 1 or not consecutive)
        ):
            g.append(i)
        else:
            out.append([i])
    return out


def span_horizons(policy: Any, span_ms: int, factor: float = 1.0) -> Any:
    """``policy`` with half-life and buffer TTL of at least ``factor`` x the stream's span.

    A stream that spans months keeps its early turns as long as one that spans a
    day keeps its morning: age is measured against the stream's own time scale,
    and what goes is decided by value and pressure (priority floor, capacities).
    """
    h = max(float(policy.half_life_ms), factor * float(span_ms))
    return replace(
        policy,
        half_life_ms=h,
        buffer_ttl_ms=int(max(float(policy.buffer_ttl_ms), factor * float(span_ms))),
    )


def shadow_clusters(
    dropped: Sequence[int], vecs: np.ndarray, size: int, tau: float
) -> list[list[int]]:
    """Dropped turns folded online into topic rows: each joins the open row (fewer than
    ``size`` turns) whose centroid is closest, if that cosine is at least ``tau``, else
    opens a row. Stream order, one pass, no look-ahead: what a write path can do.
    """
    groups: list[list[int]] = []
    sums: list[np.ndarray] = []
    open_ids: list[int] = []
    for i in dropped:
        v = np.asarray(vecs[i], dtype=np.float64)
        best, best_cos = -1, tau
        if open_ids:
            cents = np.stack([sums[g] for g in open_ids])
            cents /= np.maximum(np.linalg.norm(cents, axis=1, keepdims=True), 1e-12)
            cos = cents @ v
            j = int(np.argmax(cos))
            if cos[j] >= best_cos:
                best = open_ids[j]
        if best < 0:
            groups.append([i])
            sums.append(v.copy())
            open_ids.append(len(groups) - 1)
        else:
            groups[best].append(i)
            sums[best] += v
            if len(groups[best]) >= size:
                open_ids.remove(best)
    return groups
