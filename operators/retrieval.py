"""Value-aware re-ranking of ANN candidates (pure; no Milvus, no faust).

score = lambda * semantic + (1 - lambda) * salience * recency

- semantic: cosine similarity of query and memory, clipped to [0, 1] (vectors
  are unit; negative cosine means unrelated, not "anti-relevant").
- salience: how much the memory mattered, in [0, 1]:
  ``(1 - w_u) * (1 - exp(-|rpe| / rpe_scale)) + w_u * (0.5 + 0.5 * tanh(utility))``.
  |rpe| is the stored tenant-normalised RPE (a z-score), so ``rpe_scale`` = 2
  puts a 2-sigma surprise at 0.63. Utility is the credit job's EMA of
  advantage per use; 0 (never credited) sits at the neutral 0.5, so credit
  raises or lowers a memory relative to uncredited ones. w_u defaults to 0.5.
- recency: 2^(-age / half_life), age from the memory's event time.
- lambda schedule: young memory stores are ranked mostly by meaning (a handful
  of memories carry little salience signal yet); as the tenant's store grows,
  salience weighs more. lambda(n) interpolates log-linearly from ``hi`` at
  ``young`` memories to ``lo`` at ``mature`` memories. A request may override it.
- MMR (optional): greedy maximal marginal relevance on the re-ranked list,
  ``mmr_score = score - mu * max cosine to already-selected``.
- Weights of the served hits (for credit) are the scores normalised to sum 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Ranked", "RankPolicy", "rank", "usage_weights"]


@dataclass(frozen=True)
class RankPolicy:
    """Ranking knobs, validated at construction (use the named constructor)."""

    rpe_scale: float = 2.0
    utility_weight: float = 0.5
    half_life_ms: float = 30 * 24 * 3600 * 1000.0
    lambda_hi: float = 0.9
    lambda_lo: float = 0.4
    young: int = 200
    mature: int = 20_000
    mmr_mu: float = 0.5

    @classmethod
    def hybrid(cls, **kw: Any) -> RankPolicy:
        p = cls(**kw)
        if p.rpe_scale <= 0 or p.half_life_ms <= 0:
            raise ValueError("rpe_scale and half_life_ms must be positive")
        if not 0 <= p.utility_weight <= 1:
            raise ValueError("utility_weight must be in [0, 1]")
        if not 0 <= p.lambda_lo <= p.lambda_hi <= 1:
            raise ValueError("need 0 <= lambda_lo <= lambda_hi <= 1")
        if not 0 < p.young < p.mature:
            raise ValueError("need 0 < young < mature")
        if p.mmr_mu < 0:
            raise ValueError("mmr_mu must be >= 0")
        return p

    def lambda_for(self, n_memories: int) -> float:
        """The default lambda for a tenant holding `n_memories`."""
        if n_memories <= self.young:
            return self.lambda_hi
        if n_memories >= self.mature:
            return self.lambda_lo
        t = math.log(n_memories / self.young) / math.log(self.mature / self.young)
        return self.lambda_hi + t * (self.lambda_lo - self.lambda_hi)

    def salience(self, rpe: float, utility: float) -> float:
        surprise = 1.0 - math.exp(-abs(rpe) / self.rpe_scale)
        credit = 0.5 + 0.5 * math.tanh(utility)
        return (1.0 - self.utility_weight) * surprise + self.utility_weight * credit

    def recency(self, created_ms: float, now_ms: float) -> float:
        age = max(0.0, now_ms - created_ms)
        return float(2.0 ** (-age / self.half_life_ms))


@dataclass(frozen=True)
class Ranked:
    row: Mapping[str, Any]
    semantic: float
    salience: float
    recency: float
    lam: float
    score: float


def rank(
    candidates: Sequence[Mapping[str, Any]],
    policy: RankPolicy,
    lam: float,
    now_ms: float,
    k: int,
    vectors: Mapping[str, np.ndarray] | None = None,
) -> list[Ranked]:
    """Re-rank ANN candidates (each with ``similarity``, ``rpe``, ``utility``,
    ``created_ts``, ``id``) and return the top `k`; MMR when `vectors` given."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must be in [0, 1], got {lam}")
    scored = []
    for row in candidates:
        sem = min(1.0, max(0.0, float(row.get("similarity", row.get("distance", 0.0)))))
        sal = policy.salience(float(row.get("rpe", 0.0)), float(row.get("utility", 0.0)))
        rec = policy.recency(float(row.get("created_ts", now_ms)), now_ms)
        score = lam * sem + (1.0 - lam) * sal * rec
        scored.append(Ranked(row, sem, sal, rec, lam, score))
    scored.sort(key=lambda r: (-r.score, str(r.row.get("id", ""))))
    if not vectors:
        return scored[:k]
    chosen: list[Ranked] = []
    chosen_vecs: list[np.ndarray] = []
    pool = list(scored)
    while pool and len(chosen) < k:
        best_i, best_v = 0, -math.inf
        for i, r in enumerate(pool):
            v = vectors.get(str(r.row.get("id")))
            redundancy = (
                max(float(np.dot(v, c)) for c in chosen_vecs)
                if chosen_vecs and v is not None
                else 0.0
            )
            mmr = r.score - policy.mmr_mu * redundancy
            if mmr > best_v:
                best_i, best_v = i, mmr
        pick = pool.pop(best_i)
        chosen.append(pick)
        vec = vectors.get(str(pick.row.get("id")))
        if vec is not None:
            chosen_vecs.append(vec)
    return chosen


def usage_weights(ranked: Sequence[Ranked]) -> list[float]:
    """Normalised weights of served hits (sum 1; uniform if all scores are 0)."""
    total = sum(max(r.score, 0.0) for r in ranked)
    if total <= 0:
        return [1.0 / len(ranked)] * len(ranked) if ranked else []
    return [max(r.score, 0.0) / total for r in ranked]
