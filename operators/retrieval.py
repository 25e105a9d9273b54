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
  and what using them earned. Utility is the discounted mean of the memory's
  normalised advantage (`operators.credit.CreditStats`); 0 sits at the neutral 0.5.
- exploration (optimistic initial values, count-based): ``uses`` counts a
  memory's credited uses. An untried memory gets the bonus ``explore`` (default
  1.0), shrinking as 1/(1 + uses)^2: after one fruitless try it is explore/4,
  below what a memory that helped earns in one or two uses, so a memory that
  helped keeps its place by its utility and one that did not makes room quickly
  (faster than UCB's 1/sqrt(n) on purpose). In a store nobody credits every
  memory has the same bonus, so the ranking changes only through recency. This
  is the one-ranking form (``lanes=False``: a request that fixes lambda). With
  lanes the main lane counts no uses (every memory keeps the full bonus), and
  optimism lives in the exploration lane alone: a memory tried in another state,
  where it earned its credit, is not pushed below untried twins in this one.
- two lanes (``lanes=True``: the default request; one that fixes lambda, e.g. 1.0
  for pure semantic search, ranks without them):
  - main lane: the score above plus a promotion bonus for an *established*
    effect, ``promote_max * min(1, U / promote_full) * clip(e / 0.5, -1, 1)``: e is
    the memory's `CreditStats.established` (the lower confidence bound of its
    normalised advantage where above 0, the upper one where below 0, over at
    least ``promote_min_uses`` acted-on uses; else 0), U the uses recorded for
    the request's candidates, acted on or not (the context's evidence: the bonus
    anneals in as the context is tried and credited). Without evidence the bonus is 0
    and the main lane is exactly the ranking without lanes; one blame never moves a
    memory (an effect needs ``promote_min_uses`` uses and a bound past 0); an
    established negative effect demotes. ``promote_max`` (0.6 of cosine) bounds the lift.
  - exploration lane: for k >= 3 and more candidates than k, the last
    ``explore_slots`` (default 1) served hits are picked from the candidates the
    main lane did not serve, by
    `RankPolicy.optimism` (credited mean + ``explore_c / sqrt(1 + uses)``), ties
    by the main lane's order. Deterministic (serve probability 1). Without
    evidence every optimism is equal and the pick is the main lane's next: the
    served list is exactly today's. A memory served and not acted on spends its
    optimism (its uses grow, its mean does not), so a decisive memory far down
    in meaning is served after the nearer untried ones, earns evidence, and is
    then promoted into the main lane by that evidence, not by optimism.
  Every hit names its lane (`Ranked.lane`).
- where credit applies (`RankPolicy.fit`): a memory's credit (its utility in the
  salience, its promotion bonus, its credited mean in the exploration lane) counts
  in full for a query about as close to it as the queries in which it earned that
  credit were (``CreditStats.sim``), and fades to nothing for one ``2 * fit_margin``
  (0.2) less similar. A step that earned credit in one state ("go to outside" from
  the hallway) is no evidence for a state it faintly resembles (the kitchen with
  its door still closed, cosine 0.38). Memories whose statistics have no ``sim``
  (credited by thumbs only) keep their credit everywhere.
- recency: 2^(-age / half_life), age = stream time - the memory's event time
  (``created_ts``), counted in whole steps of ``half_life / RECENCY_STEPS``
  (1000: 43 minutes for a half-life of 30 days), so milliseconds between two
  memories of one session are not a difference in age and equal evidence stays
  an exact tie. On the memory's own clock, never the wall clock: the responder
  passes, per agent, the highest event time it has read from that agent's
  memories (`StreamClock`), so a replayed or shifted stream ranks as it did
  live and one agent's skewed clock does not age another's memories. The
  half-life follows the agent's own span as the decay's horizons do
  (``span_factor``, the maintenance setting): at least ``span_factor`` x (its stream
  time - the earliest event time read of it), so a chat whose sessions are months
  apart does not rank its early sessions down by age alone (its oldest memory keeps
  half the recency of its newest at factor 1), and a stream shorter than the fixed
  half-life (an RL run of hours) ranks on the fixed half-life.
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
from dataclasses import dataclass, replace
from typing import Any, Literal, cast

import numpy as np

from operators.credit import CreditStats, is_mapping

__all__ = [
    "RECENCY_STEPS",
    "Ranked",
    "RankPolicy",
    "StreamClock",
    "rank",
    "tie_key",
    "usage_weights",
]

#: recency's resolution: ages are counted in steps of half_life / RECENCY_STEPS
RECENCY_STEPS = 1000
#: an established effect of this many outcome spreads earns the full promotion bonus
EFFECT_FULL = 0.5


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
    explore_slots: int = 1
    explore_c: float = 1.0
    promote_max: float = 0.6
    promote_min_uses: int = 2
    promote_z: float = 1.0
    promote_full: int = 8
    fit_margin: float = 0.1
    #: the recency half-life follows the agent's own span: at least ``span_factor`` x
    #: (its stream time - its earliest event time read, `StreamClock.span`); 0: fixed
    #: (the product's value is the maintenance setting, `policy_from`)
    span_factor: float = 1.0

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
        if p.explore_slots < 0 or p.explore_c < 0:
            raise ValueError("explore_slots and explore_c must be >= 0")
        if p.promote_max < 0 or p.promote_z < 0:
            raise ValueError("promote_max and promote_z must be >= 0")
        if p.promote_min_uses < 1 or p.promote_full < 1:
            raise ValueError("promote_min_uses and promote_full must be >= 1")
        if p.fit_margin < 0:
            raise ValueError("fit_margin must be >= 0")
        if not (math.isfinite(p.span_factor) and p.span_factor >= 0):
            raise ValueError("span_factor must be a finite number >= 0")
        return p

    def lambda_for(self, n_memories: int) -> float:
        """The default lambda for a tenant holding `n_memories`."""
        if n_memories <= self.young:
            return self.lambda_hi
        if n_memories >= self.mature:
            return self.lambda_lo
        t = math.log(n_memories / self.young) / math.log(self.mature / self.young)
        return self.lambda_hi + t * (self.lambda_lo - self.lambda_hi)

    def fit(
        self, row: Mapping[str, Any], semantic: float, stats: CreditStats | None = None
    ) -> float:
        """The share of a memory's credit that applies to a query at cosine
        ``semantic``: 1 down to ``fit_margin`` below the similarity at which it earned
        its credit (`CreditStats.sim`), then linearly to 0 at twice that; 1 where
        that similarity is unknown, or with ``fit_margin`` 0. ``stats``: the row's
        `CreditStats` where the caller has them already."""
        if stats is None:
            stats = CreditStats.of(row)
        if self.fit_margin <= 0 or stats.sim_w <= 0:
            return 1.0
        return max(0.0, min(1.0, 2.0 - (stats.sim - semantic) / self.fit_margin))

    def promotion(
        self,
        row: Mapping[str, Any],
        context_uses: int,
        fit: float = 1.0,
        stats: CreditStats | None = None,
    ) -> float:
        """The main lane's bonus of an established effect (see the module doc)."""
        if self.promote_max <= 0 or fit <= 0:
            return 0.0
        if stats is None:
            stats = CreditStats.of(row)
        est = stats.established(self.promote_min_uses, self.promote_z)
        if est == 0.0:
            return 0.0
        anneal = min(1.0, context_uses / self.promote_full)
        return fit * self.promote_max * anneal * max(-1.0, min(1.0, est / EFFECT_FULL))

    def optimism(self, row: Mapping[str, Any], fit: float = 1.0) -> float:
        """The exploration lane's value: the credited mean times the share of it that
        applies to the query (`fit`) plus a bonus that shrinks with every credited
        use, served or acted on."""
        uses = max(0, int(row.get("uses", 0) or 0))
        return CreditStats.of(row).mean * fit + self.explore_c / math.sqrt(1.0 + uses)

    def salience(self, rpe: float, utility: float, uses: int = 0, core: bool = False) -> float:
        """Surprise (1 for a core memory, else from |rpe|) and optimistic credit."""
        surprise = 1.0 if core else 1.0 - math.exp(-abs(rpe) / self.rpe_scale)
        optimistic = utility + self.explore / (1.0 + max(0, uses)) ** 2
        credit = 0.5 + 0.5 * math.tanh(optimistic)
        return (1.0 - self.utility_weight) * surprise + self.utility_weight * credit

    def recency(self, created_ms: float, now_ms: float, span_ms: float = 0.0) -> float:
        """``2^(-age / half-life)``; the half-life is ``half_life_ms``, or
        ``span_factor`` x ``span_ms`` (the agent's span) where that is longer."""
        half = max(self.half_life_ms, self.span_factor * max(0.0, span_ms))
        step = half / RECENCY_STEPS
        age = math.floor(max(0.0, now_ms - created_ms) / step) * step
        return float(2.0 ** (-age / half))


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


class StreamClock:
    """Stream time as a reader learns it: per (tenant, agent), or per tenant
    (``per_agent=False``), the highest event time (``created_ts``) among the rows it
    has read. A lower bound of the writers' watermark (it only knows what it read),
    monotone, and on the memories' own clock. Beside it, the lowest event time read:
    the clock's span (`span`), which the recency half-life follows. At most
    ``max_keys`` clocks are kept (least recently read dropped first, so the clocks of
    the rows just read are kept; a dropped one is relearned from the next rows: its
    stream time can only be lower, and its span shorter, until the rows read reach
    back again).
    """

    def __init__(self, per_agent: bool = True, max_keys: int = 100_000) -> None:
        self.per_agent = per_agent
        self.max_keys = max_keys
        self._wm: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._origin: dict[tuple[str, str], int] = {}

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
            if key not in self._wm or ts > self._wm[key]:
                self._wm[key] = ts
            if key not in self._origin or ts < self._origin[key]:
                self._origin[key] = ts
            self._wm.move_to_end(key)
        for r in rows:
            key = self._key(tenant, r.get("agent_id"))
            if key in self._wm:
                out[str(r.get("agent_id") or "")] = self._wm[key]
        while len(self._wm) > self.max_keys:
            self._origin.pop(self._wm.popitem(last=False)[0], None)
        return out

    def span(self, tenant: str, agent: Any, until: float | None = None) -> int:
        """Stream time (or ``until``, a question's own time, where earlier) minus the
        earliest event time read, for ``agent``'s clock; 0 when nothing of it was read."""
        key = self._key(tenant, agent)
        if key not in self._wm:
            return 0
        end = self._wm[key] if until is None else min(self._wm[key], int(until))
        return max(0, end - self._origin.get(key, end))


Lane = Literal["main", "explore"]


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
    #: which lane served it: the main ranking or the exploration slot
    lane: Lane = "main"
    #: the main lane's bonus for an established effect (included in ``score``)
    bonus: float = 0.0
    #: the share of the memory's credit that applies to this query (`RankPolicy.fit`)
    fit: float = 1.0


def updated_id(row: Mapping[str, Any]) -> str | None:
    """The memory id ``row`` updates (``metadata.updates``, set by the write path)."""
    meta = row.get("metadata")
    ref = meta.get("updates") if is_mapping(meta) else None
    return str(ref) if isinstance(ref, str) and ref else None


def supersede(scored: Sequence[Ranked]) -> list[Ranked]:
    """Order ``scored`` by score, a later statement directly above the older one it updates.

    A memory that updates another (``metadata.updates``) and is newer than it takes the
    older one's place when it scored lower: its sort score is the older one's, and of
    the two it comes first (chains follow in event-time order). Nothing else moves,
    and without updates among the candidates the order is exactly score then id.
    """
    if not any(updated_id(r.row) for r in scored):  # the common case, in one sort
        return sorted(scored, key=lambda r: (-r.score, tie_key(r.row)))
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
        replace(r, supersedes=lifted[rid]) if (rid := str(r.row.get("id"))) in lifted else r
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
    lanes: bool = False,
    spans: Mapping[str, float] | None = None,
) -> list[Ranked]:
    """Re-rank ANN candidates (each with ``similarity``, ``rpe``, ``utility``,
    ``uses``, ``created_ts``, ``id``) and return the top `k`; MMR when `vectors` given.

    `now_ms` is the stream time recency is measured against: one number, or per
    ``agent_id`` (`StreamClock.observe`; an agent missing from it: no decay).
    ``spans``: per ``agent_id``, the span its recency half-life follows
    (`StreamClock.span`, `RankPolicy.span_factor`); missing: the fixed half-life.
    ``lanes``: credit evidence takes part (the main lane's promotion bonus and the
    exploration slots); a request that fixes lambda ranks without them."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must be in [0, 1], got {lam}")
    context_uses = sum(max(0, int(r.get("uses", 0) or 0)) for r in candidates) if lanes else 0
    clocks = now_ms if isinstance(now_ms, Mapping) else None
    scored = []
    for row in candidates:
        sem = min(1.0, max(0.0, float(row.get("similarity", row.get("distance", 0.0)))))
        stats = CreditStats.of(row)
        fit = policy.fit(row, sem, stats)
        # optimism is the exploration lane's: in the main lane every memory keeps the
        # untried bonus, so uses alone (tries where the memory earned nothing, in any
        # state) move nothing there; its credit does, through utility and promotion
        sal = policy.salience(
            max(abs(float(row.get("rpe", 0.0))), float(row.get("rpe_smoothed", 0.0) or 0.0)),
            float(row.get("utility", 0.0)) * fit,
            0 if lanes else int(row.get("uses", 0) or 0),
            row.get("partition") == "core",
        )
        if clocks is not None:
            ref = float(clocks.get(str(row.get("agent_id") or ""), row.get("created_ts", 0)))
        else:
            ref = float(cast(float, now_ms))
        span = spans.get(str(row.get("agent_id") or ""), 0.0) if spans is not None else 0.0
        rec = policy.recency(float(row.get("created_ts", ref)), ref, span)
        bonus = policy.promotion(row, context_uses, fit, stats) if context_uses else 0.0
        score = lam * sem + (1.0 - lam) * sal * rec + bonus
        scored.append(Ranked(row, sem, sal, rec, lam, score, bonus=bonus, fit=fit))
    # exact ties: by memory id; a later statement above the older one it updates
    scored = supersede(scored)
    slots = min(policy.explore_slots, k - 1) if lanes and k >= 3 else 0
    # without any credited use every optimism is equal: the picks are the next by order
    depth = k if slots == 0 or context_uses == 0 else len(scored)
    order = mmr_order(scored, policy.mmr_mu, vectors, depth) if vectors else scored[:depth]
    if slots == 0 or len(scored) <= k:
        # no more candidates than hits: every one is served whatever the lanes would
        # choose, in the main lane's order; an exploration slot with nothing to choose
        # from is not one (it would name its one candidate as explored in every query)
        return order[:k]
    return explore(order, k, slots, policy, evidence=context_uses > 0)


def explore(order: Sequence[Ranked], k: int, slots: int, policy: RankPolicy,
            evidence: bool = True) -> list[Ranked]:  # fmt: skip
    """The main lane's first ``k - slots`` of ``order``, then ``slots`` exploration
    picks from the rest: the highest `RankPolicy.optimism`, ties by the main
    lane's order, among the candidates whose action no served hit offers yet (all of
    them when none is new: a chat's turns all say "say"). A pick that repeats a
    served action gives the agent nothing new to try, however untried the memory is.
    Without credit evidence (``evidence`` False) the picks are the main lane's next
    ones, in its order: exactly the list without lanes."""
    main = list(order[: k - slots])
    rest = list(order[k - slots :])
    if not evidence:
        return main + [replace(r, lane="explore") for r in rest[:slots]]
    picks: list[Ranked] = []
    # a candidate's optimism does not change between picks: read its statistics once
    values = [policy.optimism(r.row, r.fit) for r in rest]
    while rest and len(picks) < slots:
        served = {_action(r.row) for r in (*main, *picks)}
        fresh = [i for i, r in enumerate(rest) if _action(r.row) not in served]
        best = max(fresh or range(len(rest)), key=lambda i: (values[i], -i))
        values.pop(best)
        picks.append(replace(rest.pop(best), lane="explore"))
    return main + picks


def _action(row: Mapping[str, Any]) -> str:
    return str(row.get("action", "") or "")


def mmr_order(
    scored: Sequence[Ranked], mu: float, vectors: Mapping[str, np.ndarray], n: int
) -> list[Ranked]:
    """Greedy maximal marginal relevance: the first ``n`` of ``scored`` by
    ``score - mu * max cosine to already-selected``."""
    chosen: list[Ranked] = []
    chosen_vecs: list[np.ndarray] = []
    pool = list(scored)
    while pool and len(chosen) < n:
        best_i, best_v = 0, -math.inf
        for i, r in enumerate(pool):
            v = vectors.get(str(r.row.get("id")))
            redundancy = (
                max(float(np.dot(v, c)) for c in chosen_vecs)
                if chosen_vecs and v is not None
                else 0.0
            )
            mmr = r.score - mu * redundancy
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
