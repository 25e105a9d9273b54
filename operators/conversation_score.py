"""Prototype reward-free scores for conversations: what a turn tells, not how long it is.

The write path's term is `TokenSurprisal` with ``n0`` (``mean`` below); the others
are measured alternatives, not wired in. Each candidate replaces the information term of
`operators.surprise.IntrinsicState` (its ``tokens`` model: ``ids(text)`` then
``surprisal(ids)`` then ``learn(ids)``, once per turn in stream order), so the rest
of the intrinsic score (novelty against the agent's bank, the context guard,
the running-mean normalisation) and the gate stay as they are; `install` swaps
one in on a tenant's state. Measured with ``dmem_bench.longmemeval`` and the LoCoMo
replay; the numbers and the choice are in docs/design/2026-12-02-conversation-score.md.

Candidates (``info`` in nats; the intrinsic score divides it by the tenant's
running mean, so only its ranking across turns matters):

- ``sum``: summed token surprisal; grows with length.
- ``mean`` (the write path's term): surprisal per token, shrunk towards zero for very short turns,
  ``sum / (n + n0)``: a one-word turn cannot outrank a sentence on one rare token.
- ``topm``: the sum of the ``m`` largest token surprisals (distinct tokens): what
  the turn's rarest words say. A long turn is credited for its ``m`` most
  specific words only, a short one loses nothing.
- ``speaker``: the summed surprisal divided by the running mean of the same
  speaker's turns (the ``"speaker: "`` prefix of a chat turn): every speaker is
  judged against its own typical turn, so a verbose speaker does not crowd out a
  terse one.

`shadow_groups`: the shadow buffer's grouping (runs of skipped turns of one
session folded into one cheap searchable row that stands for them);
`shadow_clusters`: the same, folded by topic (nearest open row) instead of by order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from operators.surprise import SPEAKER_PREFIX, TokenSurprisal

__all__ = [
    "CANDIDATES",
    "SpeakerSurprisal",
    "TopSurprisal",
    "install",
    "shadow_clusters",
    "shadow_groups",
]


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
        super().__init__(n0=n0, **kw)  # n0 set: per token first, then per speaker
        self.alpha = float(alpha)
        self.max_speakers = int(max_speakers)
        self.means: OrderedDict[str, list[float]] = OrderedDict()  # speaker -> [mean, count]
        self._speaker = ""

    def ids(self, text: str) -> np.ndarray:
        m = SPEAKER_PREFIX.match(text)
        self._speaker = m.group(1).strip().lower() if m else ""
        return super().ids(text)

    def surprisal(self, ids: np.ndarray) -> float:
        raw = super().surprisal(ids)
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
    "sum": TokenSurprisal,
    "mean": lambda n0=4.0, **kw: TokenSurprisal(n0=n0, **kw),
    "topm": TopSurprisal,
    "speaker": SpeakerSurprisal,
}


def install(intrinsic: Any, name: str, **kw: Any) -> None:
    """Give a tenant's `IntrinsicState` the information term ``name`` (fresh counts)."""
    intrinsic.tokens = CANDIDATES[name](**kw)


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
