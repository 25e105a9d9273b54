"""Value-aware re-ranking of ANN candidates (pure; no Milvus, no faust).

score = lambda * semantic + (1 - lambda) * salience * recency

- semantic: cosine similarity of query and memory, clipped to [0, 1] (vectors
  are unit; negative cosine means unrelated, not "anti-relevant").
- salience: how much the memory mattered, in [0, 1]:
  ``(1 - w_u) * surprise + w_u * (0.5 + 0.5 * tanh(u))``
  with the optimistic utility ``u = utility + explore / (1 + uses)^2``
  (w_u defaults to 0.5). surprise is the write path's verdict, scale free: 1
  for a core memory (the gate, hindsight or credit judged that it matters,
  each against this tenant's own distribution), else ``1 - exp(-s / rpe_scale)``
  with s = max(|rpe|, rpe_smoothed) (``rpe_scale`` = 2 puts a 2-sigma surprise
  at 0.63). Not the reward's magnitude for core memories: a larger reward is no
  evidence that a memory is more relevant to a query; what separates equally
  similar memories is whether they mattered at all (core vs buffer vs mundane)
  and what using them earned. Utility is the credit job's EMA of advantage per
  use; 0 sits at the neutral 0.5.
- exploration (optimistic initial values, count-based): ``uses`` counts a
  memory's credited uses. An untried memory gets the bonus ``explore`` (default
  1.0), shrinking as 1/(1 + uses)^2: after one fruitless try it is explore/4,
  below what a memory that helped earns in one or two uses, so a memory that
  helped keeps its place by its utility and one that did not makes room quickly
  (faster than UCB's 1/sqrt(n) on purpose). In a store nobody credits every
  memory has the same bonus, so the ranking changes only through recency.
- evidence-adaptive lambda (``adapt``, ``lambda_with_evidence``): the count
  schedule below keeps meaning dominant while a store is young, so a
  semantically weaker memory could never be served and prove itself. Once the
  memories meaning alone would serve (the semantic top k of this request's
  candidates) have been tried without earning credit (uses > 0, utility <= 0),
  lambda moves towards ``lambda_evidence`` (default 0.1) in proportion to the
  share of them that did not help. Three limits keep this an exploration of
  *neighbours*, never a trade of proven meaning for a bonus:
  - positive evidence does not lower lambda: a top-k memory that earned credit
    is meaning's pick *and* the outcome's, so exploiting it is right;
  - the spread floor: lambda never falls below 1 / (1 + spread), spread = the
    cosine of meaning's best candidate minus that of its k-th, per query. A
    memory can then climb only over memories more similar by less than that
    spread: among exact ties evidence re-orders the ties and nothing else, and
    an exact match is never traded for another observation's better evidence;
  - the exploration window: when evidence lowered lambda, only the
    ``explore_ranks * k`` candidates nearest in meaning (and every candidate
    tied with the last of them) can be served, whatever the pool size or the
    encoder's cosine scale.
  A request that sets lambda explicitly (e.g. 1.0 for pure semantic search) is
  never adapted.
- recency: 2^(-age / half_life), age = stream time - the memory's event time
  (``created_ts``), counted in whole steps of ``half_life / RECENCY_STEPS``
  (1000: 43 minutes for the default 30 days), so milliseconds between two
  memories of one session are not a difference in age and equal evidence stays
  an exact tie. On the memory's own clock, never the wall clock: the responder
  passes, per agent, the highest event time it has read from that agent's
  memories (`StreamClock`), so a replayed or shifted stream ranks as it did
  live and one agent's skewed clock does not age another's memories.
- lambda schedule: lambda(n) interpolates log-linearly from ``hi`` (0.97) at
  ``young`` memories to ``lo`` (0.9) at ``mature`` memories of the tenant; a
  request may override it. Why so high: salience * recency is in [0, 1], so it
  can lift a memory over one at most (1 - lambda) / lambda more similar (0.03
  of cosine in a young store, 0.11 in a mature one). Surprise, outcome evidence
  and recency break near-ties of meaning (identical observations above all) and
  never trade a clearly closer memory for a surprising one.
- MMR (optional): greedy maximal marginal relevance on the re-ranked list,
  ``mmr_score = score - mu * max cosine to already-selected``.
- Weights of the served hits (for credit) are the scores normalised to sum 1.
- Updates (`supersede`): a memory the write path recorded as an update of an older
  one (``metadata.updates``: the same agent's nearest memory, far above the
  unrelated level; "I moved my sneakers to the closet" after "I keep my sneakers
  under the bed") is ranked directly above that memory when both are candidates,
  whatever their scores: the later statement is the current one. The hit's
  breakdown names the memory it superseded.
- Ties: wherever candidates are ordered, exactly equal values are ordered by
  memory id (`tie_key`), never by the order the store returned them in, so the
  same query over the same store gets the same answer.

Cases behind these choices: docs/design/2026-12-01-ranking-lambda.md.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "RECENCY_STEPS",
    "Ranked",
    "RankPolicy",
    "StreamClock",
    "explore_window",
    "rank",
    "tie_key",
    "tried_without_credit",
    "usage_weights",
]

#: recency's resolution: ages are counted in steps of half_life / RECENCY_STEPS
RECENCY_STEPS = 1000


@dataclass(frozen=True)
class RankPolicy:
    """Ranking knobs, validated at construction (use the named constructor)."""

    rpe_scale: float = 2.0
    utility_weight: float = 0.5
    half_life_ms: float = 30 * 24 * 3600 * 1000.0
    lambda_hi: float = 0.97
    lambda_lo: float = 0.9
    young: int = 200
    mature: int = 20_000
    mmr_mu: float = 0.5
    explore: float = 1.0
    lambda_evidence: float = 0.1
    explore_ranks: int = 2

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
        if p.explore < 0:
            raise ValueError("explore must be >= 0")
        if not 0 <= p.lambda_evidence <= 1:
            raise ValueError("lambda_evidence must be in [0, 1]")
        if p.explore_ranks < 1:
            raise ValueError("explore_ranks must be >= 1")
        return p

    def lambda_for(self, n_memories: int) -> float:
        """The default lambda for a tenant holding `n_memories`."""
        if n_memories <= self.young:
            return self.lambda_hi
        if n_memories >= self.mature:
            return self.lambda_lo
        t = math.log(n_memories / self.young) / math.log(self.mature / self.young)
        return self.lambda_hi + t * (self.lambda_lo - self.lambda_hi)

    def lambda_with_evidence(
        self, lam: float, candidates: Sequence[Mapping[str, Any]], k: int
    ) -> float:
        """Move `lam` towards ``lambda_evidence`` by the share of the semantic
        top-`k` candidates that were tried without earning credit (see the
        module docstring)."""
        if not candidates or k <= 0 or self.lambda_evidence >= lam:
            return lam
        top = by_meaning(candidates)[:k]
        share = sum(tried_without_credit(r) for r in top) / len(top)
        # the floor: a lift of at most the cosine spread of meaning's own top k
        spread = max(0.0, similarity(top[0]) - similarity(top[-1]))
        return max(lam + share * (self.lambda_evidence - lam), min(lam, 1.0 / (1.0 + spread)))

    def adapt(
        self, lam: float, candidates: Sequence[Mapping[str, Any]], k: int
    ) -> tuple[float, list[Mapping[str, Any]]]:
        """The default request's (lambda, candidates): `lam` (the count schedule)
        adapted to the evidence, and the candidates it may serve (the exploration
        window when the evidence lowered lambda, else all of them)."""
        adapted = self.lambda_with_evidence(lam, candidates, k)
        if adapted >= lam:
            return lam, list(candidates)
        return adapted, explore_window(candidates, self.explore_ranks * k)

    def salience(self, rpe: float, utility: float, uses: int = 0, core: bool = False) -> float:
        """Surprise (1 for a core memory, else from |rpe|) and optimistic credit."""
        surprise = 1.0 if core else 1.0 - math.exp(-abs(rpe) / self.rpe_scale)
        optimistic = utility + self.explore / (1.0 + max(0, uses)) ** 2
        credit = 0.5 + 0.5 * math.tanh(optimistic)
        return (1.0 - self.utility_weight) * surprise + self.utility_weight * credit

    def recency(self, created_ms: float, now_ms: float) -> float:
        step = self.half_life_ms / RECENCY_STEPS
        age = math.floor(max(0.0, now_ms - created_ms) / step) * step
        return float(2.0 ** (-age / self.half_life_ms))


def similarity(row: Mapping[str, Any]) -> float:
    return float(row.get("similarity", row.get("distance", 0.0)))


def tie_key(row: Mapping[str, Any]) -> str:
    """The stable order among exactly equal scores: the memory id. The store returns
    equal similarities in an order that varies from call to call (segments searched
    in parallel), so without it the same query could see another "top k" of tied
    memories (and another evidence-adapted lambda) and serve them in another order."""
    return str(row.get("id", ""))


def by_meaning(candidates: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Candidates most similar first; equal similarities by `tie_key`, not by the
    order the store happened to return them in."""
    return sorted(candidates, key=lambda r: (-similarity(r), tie_key(r)))


def tried_without_credit(row: Mapping[str, Any]) -> bool:
    """Served and credited at least once (uses > 0), and its utility is not positive."""
    return int(row.get("uses", 0) or 0) > 0 and float(row.get("utility", 0.0) or 0.0) <= 0.0


def explore_window(candidates: Sequence[Mapping[str, Any]], n: int) -> list[Mapping[str, Any]]:
    """The `n` candidates nearest in meaning, and every one tied with the n-th
    (a cut through identical texts would pick among them by pool order)."""
    ordered = by_meaning(candidates)
    if len(ordered) <= n:
        return ordered
    cut = similarity(ordered[n - 1])
    return [r for r in ordered if similarity(r) >= cut]


class StreamClock:
    """Stream time as a reader learns it: per (tenant, agent), or per tenant
    (``per_agent=False``), the highest event time (``created_ts``) among the rows it
    has read. A lower bound of the writers' watermark (it only knows what it read),
    monotone, and on the memories' own clock. At most ``max_keys`` clocks are kept
    (least recently advanced dropped first; a dropped one is relearned from the next
    rows, which can only make memories look fresher, never older).
    """

    def __init__(self, per_agent: bool = True, max_keys: int = 100_000) -> None:
        self.per_agent = per_agent
        self.max_keys = max_keys
        self._wm: OrderedDict[tuple[str, str], int] = OrderedDict()

    def _key(self, tenant: str, agent: Any) -> tuple[str, str]:
        return (tenant, str(agent or "") if self.per_agent else "")

    def observe(self, tenant: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
        """Advance with `rows`; returns ``{agent_id: stream time}`` for their agents
        (every agent maps to the tenant's clock when not ``per_agent``)."""
        out: dict[str, int] = {}
        for r in rows:
            if r.get("created_ts") is None:
                continue
            key = self._key(tenant, r.get("agent_id"))
            ts = int(r["created_ts"])
            if ts > self._wm.get(key, -1):
                self._wm[key] = ts
                self._wm.move_to_end(key)
        for r in rows:
            key = self._key(tenant, r.get("agent_id"))
            if key in self._wm:
                out[str(r.get("agent_id") or "")] = self._wm[key]
        while len(self._wm) > self.max_keys:
            self._wm.popitem(last=False)
        return out


@dataclass(frozen=True)
class Ranked:
    row: Mapping[str, Any]
    semantic: float
    salience: float
    recency: float
    lam: float
    score: float
    #: the id of an older candidate this memory updates and is ranked above
    supersedes: str | None = None


def updated_id(row: Mapping[str, Any]) -> str | None:
    """The memory id ``row`` updates (``metadata.updates``, set by the write path)."""
    meta = row.get("metadata")
    ref = meta.get("updates") if isinstance(meta, Mapping) else None
    return str(ref) if isinstance(ref, str) and ref else None


def supersede(scored: Sequence[Ranked]) -> list[Ranked]:
    """Order ``scored`` by score, a later statement directly above the older one it updates.

    A memory that updates another (``metadata.updates``) and is newer than it takes the
    older one's place when it scored lower: its sort score is the older one's, and of
    the two it comes first (chains follow in event-time order). Nothing else moves,
    and without updates among the candidates the order is exactly score then id.
    """
    by_id = {str(r.row.get("id")): r for r in scored}
    eff: dict[str, float] = {}
    lifted: dict[str, str] = {}
    for r in sorted(scored, key=lambda r: (int(r.row.get("created_ts", 0) or 0), tie_key(r.row))):
        rid = str(r.row.get("id"))
        eff[rid] = r.score
        ref = updated_id(r.row)
        if ref is None or ref == rid or (old := by_id.get(ref)) is None:
            continue
        if int(r.row.get("created_ts", 0) or 0) <= int(old.row.get("created_ts", 0) or 0):
            continue
        if eff.get(ref, old.score) >= r.score:
            eff[rid] = eff.get(ref, old.score)
            lifted[rid] = ref
    out = [
        Ranked(r.row, r.semantic, r.salience, r.recency, r.lam, r.score, lifted.get(rid))
        if (rid := str(r.row.get("id"))) in lifted
        else r
        for r in scored
    ]
    # a lifted memory sorts before the one it lifted to (equal sort score): rank by
    # (sort score, how many updates deep, id); the depth is 0 for everything not lifted
    depth: dict[str, int] = {}
    for rid in sorted(lifted, key=lambda i: int(by_id[i].row.get("created_ts", 0) or 0)):
        depth[rid] = depth.get(lifted[rid], 0) + 1
    out.sort(key=lambda r: (-eff[str(r.row.get("id"))], -depth.get(str(r.row.get("id")), 0),
                            tie_key(r.row)))  # fmt: skip
    return out


def rank(
    candidates: Sequence[Mapping[str, Any]],
    policy: RankPolicy,
    lam: float,
    now_ms: float | Mapping[str, float],
    k: int,
    vectors: Mapping[str, np.ndarray] | None = None,
) -> list[Ranked]:
    """Re-rank ANN candidates (each with ``similarity``, ``rpe``, ``utility``,
    ``uses``, ``created_ts``, ``id``) and return the top `k`; MMR when `vectors` given.

    `now_ms` is the stream time recency is measured against: one number, or per
    ``agent_id`` (`StreamClock.observe`; an agent missing from it: no decay)."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must be in [0, 1], got {lam}")
    scored = []
    for row in candidates:
        sem = min(1.0, max(0.0, float(row.get("similarity", row.get("distance", 0.0)))))
        sal = policy.salience(
            max(abs(float(row.get("rpe", 0.0))), float(row.get("rpe_smoothed", 0.0) or 0.0)),
            float(row.get("utility", 0.0)),
            int(row.get("uses", 0) or 0),
            row.get("partition") == "core",
        )
        if isinstance(now_ms, Mapping):
            ref = float(now_ms.get(str(row.get("agent_id") or ""), row.get("created_ts", 0)))
        else:
            ref = float(now_ms)
        rec = policy.recency(float(row.get("created_ts", ref)), ref)
        score = lam * sem + (1.0 - lam) * sal * rec
        scored.append(Ranked(row, sem, sal, rec, lam, score))
    # exact ties: by memory id; a later statement above the older one it updates
    scored = supersede(scored)
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
