"""Delayed-reward credit assignment (Memory-R2 style), pure and time-injected.

An episode's `MemoryUsage` records (which memories a response served at step t,
with normalised weights w_i,t) are joined with its outcome by episode id.

- Returns: the outcome reward R arrives at the episode's end step T (the
  outcome's step if given, else the last usage step); the return at a usage
  step t is G_t = gamma^(T - t) * R (the usage step's own rewards are the write
  path's business; credit is about the late outcome). When the outcome names
  the step that earned it, a usage after that step is outside the outcome: no
  credit, no blame and no use (a use would end the memory's exploration bonus
  as if it had been tried without helping). Why: an agent that wanders after
  its last reward until a step limit uses memories closest to the end, and
  discounting from the last usage would give them the largest share of a good
  outcome; a return of 0 after the earning step ("reward to go") would blame
  them for a good episode instead.
- Reference: per (tenant, agent, task) (agent defaults to none, task to the
  tenant) a baseline b and a spread, taken before this outcome, so the advantage
  is A_t = (G_t - b) / spread, clipped to +-3 (`_Baseline`). b is what the agent
  gets without memory: the mean outcome of its episodes that acted on no memory
  (at least ``free_min`` of them, shrunk towards the agent's no-memory mean over all
  its tasks), else the mean of all its outcomes; a mean of all outcomes would rise
  once a memory solves the task and the memory that solved it would earn nothing
  from then on. The spread (root mean square deviation of outcomes from the
  baseline they were judged by) makes credit scale free: outcomes of +-1 and of
  0..100 give the same numbers. Per agent because the baseline is the policy's own
  usual outcome: with one baseline for a tenant, a weaker agent's episodes all end
  below it and every memory it uses is blamed, however much it helped.
- Credit to memory i: c_i = sum_t A_t * w_i,t, and the update carries the mean
  per use, c_i / n_i (n_i = number of steps that served i). The applier folds it
  into the memory's `CreditStats` (count, discounted mean and variance; the
  store's ``utility`` is the mean), so a memory is not rewarded for being
  retrieved often: a memory served in every episode collects positive and
  negative advantages that average out.
- Exactly-once effect: an outcome is identified by ``outcome_id`` (default
  ``episode_id:final``); a second copy is ignored and counted. Each update has
  a deterministic ``update_id`` (episode, outcome, memory), and the applier
  skips ids it has applied before, so replays change nothing.
- Order: usages that arrive after their outcome (within the TTL) are credited
  on arrival with the stored outcome; outcomes that never arrive expire with the
  window (``ttl_ms`` after the episode's last activity) and credit nothing.
- Served vs used: the responder records what a response *served*, weighted by
  normalised score. Only the agent knows what it actually *used*, so it may
  report its own record for the same request (``source="agent"``: its own
  split, 0 for memories it ignored). The agent's record replaces the served one
  whichever arrives first; a served record after an agent one is ignored.
  Memories with weight 0 get a use and no credit (``evidence=False``: the
  ranking's exploration bonus shrinks with uses, the utility stays), not blame.
  Without such reports co-served memories share credit by score. An agent
  record that arrives after its request was already credited cannot be
  re-split; it is counted in ``late_agent_reports`` and ignored.
- Step evidence: an agent record may carry the reward the agent observed right
  after acting on that decision. Where its sign contradicts the sign of the
  use's advantage A_t (a directly rewarded step with A_t < 0, or a directly
  punished one with A_t > 0) the outcome says nothing about that use, and like a
  use after the outcome's step it is left out: no credit, no blame, no use.
  Only the sign is used, so this is free of the reward's scale. Why: an outcome
  alone cannot tell which decision failed the episode, and one late mistake
  would otherwise wipe out the utility of the step that earned a reward.
- Where credit was earned: the responder's record names each served memory's
  similarity to the query. An update carries the weighted mean similarity of the
  uses that acted on the memory (an agent record takes the similarities from the
  served record of the same request), and the memory's `CreditStats` keep its
  discounted mean (``sim``). Ranking applies a memory's credit to queries about as
  close to it as those (`operators.retrieval.RankPolicy.fit`): what a step earned
  in one state says little about a state the memory only faintly resembles.

Cases behind these rules: docs/design/2026-12-02-closed-loop-credit.md.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from schemas.limits import LIMITS, newest_within

__all__ = [
    "CreditAssigner",
    "CreditStats",
    "CreditUpdate",
    "EpisodeWindows",
    "OutcomeRecord",
    "UsageRecord",
    "apply_utility",
    "is_mapping",
]


def is_mapping(x: Any) -> TypeGuard[Mapping[str, Any]]:
    """``x`` is a mapping (a row's metadata). ``type(x) is dict`` first: rows are plain
    dicts, and an ABC isinstance check per candidate is a measurable share of a
    search's ranking."""
    return type(x) is dict or isinstance(x, Mapping)


@dataclass(frozen=True)
class UsageRecord:
    request_id: str
    step: int
    memory_ids: tuple[str, ...]
    weights: tuple[float, ...]
    source: str = "served"  # "served" (responder) or "agent" (what was actually used)
    #: the reward the agent saw right after acting on this decision (step evidence), if known
    reward: float | None = None
    #: per memory, its similarity to the request's query (the responder's; empty: none
    #: known; NaN: not known for that memory)
    similarities: tuple[float, ...] = ()

    def similarity_of(self) -> dict[str, float]:
        """The known similarities by memory id."""
        pairs = zip(self.memory_ids, self.similarities, strict=False)
        return {m: s for m, s in pairs if not math.isnan(s)}

    def with_similarities(self, served: UsageRecord) -> UsageRecord:
        """This record (an agent's), with the similarities of ``served`` (the
        responder's record of the same request) for each memory that one served."""
        known = served.similarity_of()
        if not known:
            return self
        return replace(self, similarities=tuple(known.get(m, math.nan) for m in self.memory_ids))


@dataclass(frozen=True)
class OutcomeRecord:
    outcome_id: str
    reward: float
    step: int | None = None
    task: str | None = None
    agent: str | None = None


@dataclass(frozen=True)
class CreditUpdate:
    update_id: str
    tenant: str
    memory_id: str
    episode_id: str
    credit: float  # mean advantage-weighted credit per use in this episode
    uses: int
    #: False when every use in this batch had weight 0 (served or tried, not acted on):
    #: the uses count (the exploration bonus shrinks) but the utility does not move
    evidence: bool = True
    #: the weighted mean similarity to the query of the uses that acted on the memory
    #: (None: unknown)
    similarity: float | None = None


@dataclass
class _Episode:
    tenant: str
    usages: dict[str, UsageRecord] = field(default_factory=dict)
    outcome: OutcomeRecord | None = None
    advantage_base: float = 0.0
    scale: float = 1.0  # the spread of the (agent, task)'s outcomes the advantage is in
    last_ms: int = 0
    credited: set[str] = field(default_factory=set)  # request ids already credited


class EpisodeWindows:
    """The open episode windows, capped per tenant, each tenant's ordered by last activity.

    A tenant at ``per_tenant`` open episodes that opens another loses its own least
    recently active one; at ``total`` over all tenants the tenant holding the most
    loses its least recently active one. So one tenant's flood of new episodes only
    ever evicts its own windows, never another tenant's open episode (unless that
    tenant holds more). Each tenant's order is a heap of (last activity, episode)
    with lazy deletion (a touch pushes a new entry, the stale one is skipped when it
    surfaces; the heap is rebuilt from the live windows when stale entries outnumber
    them), so opening, touching and evicting are O(log n) amortised and `expire`
    costs O(expired log n) plus one step per tenant.
    """

    def __init__(self, per_tenant: int, total: int) -> None:
        if per_tenant < 1 or total < 1:
            raise ValueError("episode caps must be >= 1")
        self.per_tenant = per_tenant
        self.total = total
        self._tenants: dict[str, dict[str, _Episode]] = {}
        self._heaps: dict[str, list[tuple[int, int, str]]] = {}
        self._size = 0
        self._seq = 0
        self.evicted = 0

    def __len__(self) -> int:
        return self._size

    def get(self, key: tuple[str, str]) -> _Episode | None:
        return self._tenants.get(key[0], {}).get(key[1])

    def open_count(self, tenant: str) -> int:
        return len(self._tenants.get(tenant, ()))

    def _push(self, tenant: str, episode_id: str, last_ms: int) -> None:
        self._seq += 1
        heap = self._heaps.setdefault(tenant, [])
        heapq.heappush(heap, (last_ms, self._seq, episode_id))
        live = self._tenants[tenant]
        if len(heap) > 2 * len(live) + 16:  # mostly stale entries: rebuild from the live
            heap[:] = [(ep.last_ms, n, eid) for n, (eid, ep) in enumerate(live.items())]
            heapq.heapify(heap)

    def _remove(self, tenant: str, episode_id: str) -> _Episode:
        live = self._tenants[tenant]
        ep = live.pop(episode_id)
        self._size -= 1
        if not live:  # the tenant's last window: its bookkeeping goes too (bounded maps)
            del self._tenants[tenant]
            self._heaps.pop(tenant, None)
        return ep

    def _pop_until(self, tenant: str, before_ms: int | None) -> list[_Episode]:
        """Remove the tenant's least recently active window (``before_ms`` None), or
        every window last active before ``before_ms``."""
        out: list[_Episode] = []
        heap = self._heaps.get(tenant, [])
        while heap and (before_ms is None or heap[0][0] < before_ms):
            last_ms, _, eid = heapq.heappop(heap)
            ep = self._tenants.get(tenant, {}).get(eid)
            if ep is None or ep.last_ms != last_ms:
                continue  # stale: the window was touched later or is gone
            out.append(self._remove(tenant, eid))
            if before_ms is None:
                break
        return out

    def touch(self, tenant: str, episode_id: str, now_ms: int) -> _Episode:
        """The episode's window, opened (evicting per the caps) if new, marked active."""
        ep = self.get((tenant, episode_id))
        if ep is None:
            if self.open_count(tenant) >= self.per_tenant:
                self.evicted += len(self._pop_until(tenant, None))
            elif self._size >= self.total:
                largest = max(self._tenants, key=lambda t: (len(self._tenants[t]), t == tenant))
                self.evicted += len(self._pop_until(largest, None))
            ep = _Episode(tenant=tenant, last_ms=now_ms)
            self._tenants.setdefault(tenant, {})[episode_id] = ep
            self._size += 1
            self._push(tenant, episode_id, now_ms)
        elif now_ms > ep.last_ms:
            ep.last_ms = now_ms
            self._push(tenant, episode_id, now_ms)
        return ep

    def expire(self, before_ms: int) -> list[_Episode]:
        """Remove and return the windows last active before ``before_ms``."""
        return [ep for t in list(self._heaps) for ep in self._pop_until(t, before_ms)]


#: a normalised advantage is clipped to this many spreads (one freak outcome is not more)
ADV_CLIP = 3.0
#: the no-memory mean's EWMA rate bounds its weight against the prior (1 / rate outcomes)
FREE_ALPHA = 0.05


@dataclass
class _Baseline:
    """Outcomes of one (tenant, agent, task): what an episode is judged against.

    - ``mean``: every outcome (exact mean first, then an EWMA of rate ``alpha``);
    - ``free``: the outcomes of episodes that acted on no memory: what the agent
      gets without memory, the baseline. The all-outcomes mean rises as soon as a
      memory solves the task, and the memory that solved it would then earn 0 and
      fade back to neutral. Few such episodes are a noisy estimate (three lucky
      guesses would make a win worth nothing) and a task solved by memory from its
      first episode has none, so the task's own are weighed against the agent's
      no-memory mean over all its tasks (``prior``, once it has ``free_min``
      outcomes) with the weight of ``free_min`` episodes; without a prior, the
      task's own once there are ``free_min``; else the mean of all outcomes;
    - ``sq``: mean squared deviation of outcomes from the baseline they were judged
      by; its root is the spread advantages are divided by (scale free).
    """

    mean: float = 0.0
    n: int = 0
    free: float = 0.0
    free_n: int = 0
    sq: float = 0.0
    sq_n: int = 0

    def reference(
        self, free_min: int, prior: _Baseline | None = None
    ) -> tuple[float, float | None]:
        if prior is not None and prior.free_n >= free_min and prior is not self:
            # the task's own no-memory outcomes (none where a memory solved it from
            # the first episode on) against the agent's over all its tasks
            n = min(float(self.free_n), 1.0 / FREE_ALPHA)
            base = (n * self.free + free_min * prior.free) / (n + free_min)
        elif self.free_n >= free_min:
            base = self.free
        else:
            base = self.mean if self.n else 0.0
        if not self.sq_n:
            return base, None
        spread = math.sqrt(max(self.sq, 0.0))
        return base, spread if spread > 1e-9 else None

    def fold(self, reward: float, acted: bool, alpha: float, base: float) -> None:
        if self.n:  # the first outcome had no baseline to deviate from
            w = max(1.0 / (self.sq_n + 1), alpha)
            self.sq += w * ((reward - base) ** 2 - self.sq)
            self.sq_n += 1
        w = max(1.0 / (self.n + 1), alpha)
        self.mean += w * (reward - self.mean)
        self.n += 1
        if not acted:
            w = max(1.0 / (self.free_n + 1), alpha)
            self.free += w * (reward - self.free)
            self.free_n += 1


def _uid(*parts: str) -> str:
    return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=12).hexdigest()


class CreditAssigner:
    """State in (windows, baselines), updates out. One instance per jobs worker."""

    def __init__(
        self,
        gamma: float = 0.99,
        ttl_ms: int = 3_600_000,
        baseline_alpha: float = 0.05,
        max_episodes: int = 100_000,
        max_episodes_per_tenant: int = 10_000,
        free_min: int = 3,
    ) -> None:
        if not 0.0 <= gamma <= 1.0:
            raise ValueError("gamma must be in [0, 1]")
        if ttl_ms <= 0 or not 0.0 < baseline_alpha <= 1.0:
            raise ValueError("ttl_ms must be > 0 and baseline_alpha in (0, 1]")
        self.gamma = gamma
        self.ttl_ms = ttl_ms
        self.baseline_alpha = baseline_alpha
        self.max_episodes = max_episodes
        self.episodes = EpisodeWindows(min(max_episodes_per_tenant, max_episodes), max_episodes)
        self.baselines: dict[tuple[str, str, str], _Baseline] = {}
        self.free_min = free_min
        self.duplicate_outcomes = 0
        self.expired_without_outcome = 0
        self.late_agent_reports = 0

    @staticmethod
    def _baseline_key(tenant: str, task: str | None, agent: str | None) -> tuple[str, str, str]:
        return (tenant, agent or "", task or tenant)

    def baseline(self, tenant: str, task: str | None, agent: str | None = None) -> float:
        """The running mean of every outcome of (tenant, agent, task)."""
        b = self.baselines.get(self._baseline_key(tenant, task, agent))
        return b.mean if b is not None and b.n else 0.0

    def reference(
        self, tenant: str, task: str | None, agent: str | None = None
    ) -> tuple[float, float | None]:
        """(baseline, spread) an outcome of (tenant, agent, task) is judged by now
        (spread None until one outcome was judged)."""
        b = self.baselines.get(self._baseline_key(tenant, task, agent)) or _Baseline()
        return b.reference(self.free_min, self.baselines.get(self._prior_key(tenant, agent)))

    @staticmethod
    def _prior_key(tenant: str, agent: str | None) -> tuple[str, str, str]:
        return (tenant, agent or "", "\x00any task")

    def _episode(self, tenant: str, episode_id: str, now_ms: int) -> _Episode:
        return self.episodes.touch(tenant, episode_id, now_ms)

    def on_usage(
        self, tenant: str, episode_id: str, usage: UsageRecord, now_ms: int
    ) -> list[CreditUpdate]:
        ep = self._episode(tenant, episode_id, now_ms)
        prev = ep.usages.get(usage.request_id)
        if prev is None:
            ep.usages[usage.request_id] = usage
        elif usage.source == "agent" and prev.source != "agent":
            if usage.request_id in ep.credited:
                self.late_agent_reports += 1
            else:  # what was used beats what was served; the query's similarities stay
                ep.usages[usage.request_id] = usage.with_similarities(prev)
        elif prev.source == "agent" and usage.source != "agent":
            ep.usages[usage.request_id] = prev.with_similarities(usage)
        if ep.outcome is None:
            return []
        return self._credit(episode_id, ep)  # late usage: credit it now

    def on_outcome(
        self, tenant: str, episode_id: str, outcome: OutcomeRecord, now_ms: int
    ) -> list[CreditUpdate]:
        ep = self._episode(tenant, episode_id, now_ms)
        if ep.outcome is not None:
            self.duplicate_outcomes += 1
            return []
        ep.outcome = outcome
        # reference *before* this outcome: an episode is judged against the past
        ep.advantage_base, spread = self.reference(tenant, outcome.task, outcome.agent)
        # no spread known yet (the first outcome): the outcome's own distance is one unit
        ep.scale = spread or abs(outcome.reward - ep.advantage_base) or 1.0
        key = self._baseline_key(tenant, outcome.task, outcome.agent)
        acted = any(w > 0 for u in ep.usages.values() for w in u.weights)
        b = self.baselines.setdefault(key, _Baseline())
        b.fold(outcome.reward, acted, self.baseline_alpha, ep.advantage_base)
        if not acted:  # the agent's no-memory outcomes over all its tasks: the prior
            prior = self.baselines.setdefault(self._prior_key(tenant, outcome.agent), _Baseline())
            prior.fold(outcome.reward, False, self.baseline_alpha, 0.0)
        return self._credit(episode_id, ep)

    def _credit(self, episode_id: str, ep: _Episode) -> list[CreditUpdate]:
        assert ep.outcome is not None
        todo = [u for rid, u in ep.usages.items() if rid not in ep.credited]
        if not todo:
            return []
        end = ep.outcome.step
        if end is None:
            end = max(u.step for u in ep.usages.values())
        sums: dict[str, float] = {}
        uses: dict[str, int] = {}
        acted: set[str] = set()
        sim: dict[str, list[float]] = {}  # memory -> [sum of w * similarity, sum of w]
        named_end = ep.outcome.step is not None
        for u in todo:
            ep.credited.add(u.request_id)
            if named_end and u.step > end:
                continue  # used after the step that earned the outcome: outside it
            g = (self.gamma ** max(0, end - u.step)) * ep.outcome.reward
            adv = max(-ADV_CLIP, min(ADV_CLIP, (g - ep.advantage_base) / ep.scale))
            if u.reward is not None and u.reward * adv < 0:
                continue  # the step's own reward contradicts its advantage: outside it
            known = u.similarity_of()
            for mid, w in zip(u.memory_ids, u.weights, strict=True):
                sums[mid] = sums.get(mid, 0.0) + adv * w
                uses[mid] = uses.get(mid, 0) + 1
                if w > 0:
                    acted.add(mid)
                    if mid in known:
                        acc = sim.setdefault(mid, [0.0, 0.0])
                        acc[0] += w * known[mid]
                        acc[1] += w
        batch_key = ",".join(sorted(u.request_id for u in todo))
        return [
            CreditUpdate(
                update_id=_uid(ep.tenant, episode_id, ep.outcome.outcome_id, batch_key, mid),
                tenant=ep.tenant,
                memory_id=mid,
                episode_id=episode_id,
                credit=sums[mid] / uses[mid],
                uses=uses[mid],
                evidence=mid in acted,
                similarity=min(1.0, sim[mid][0] / sim[mid][1]) if mid in sim else None,
            )
            for mid in sorted(sums)
        ]

    def expire(self, now_ms: int) -> int:
        """Drop windows idle for longer than the TTL; returns how many."""
        dead = self.episodes.expire(now_ms - self.ttl_ms)
        self.expired_without_outcome += sum(1 for ep in dead if ep.outcome is None)
        return len(dead)


@dataclass(frozen=True)
class CreditStats:
    """A memory's credit statistics: acted-on uses and the discounted mean and
    variance of their normalised advantage (stored in ``metadata.credit``).

    ``n`` counts updates with evidence (the memory was acted on, or a thumb), ``w``
    is their discounted weight (``w <- discount * w + 1``), ``mean`` and ``m2`` the
    discounted mean and sum of squared deviations. The advantage is in units of
    the spread of its (agent, task)'s outcomes, so the same numbers mean the same
    for outcomes of +-1 and of 0..100. ``sim`` is the discounted mean similarity
    of the queries in which the memory was acted on (``sim_w`` its weight; 0: not
    known, as for a memory credited only by thumbs).
    """

    n: int = 0
    w: float = 0.0
    mean: float = 0.0
    m2: float = 0.0
    sim: float = 0.0
    sim_w: float = 0.0

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> CreditStats:
        """The stats stored in a row (none: an untried memory)."""
        meta = row.get("metadata")
        raw = meta.get("credit") if is_mapping(meta) else None
        if not is_mapping(raw):
            return NO_CREDIT
        return cls(int(raw.get("n", 0)), float(raw.get("w", 0.0)),
                   float(raw.get("mean", 0.0)), float(raw.get("m2", 0.0)),
                   float(raw.get("sim", 0.0)), float(raw.get("sim_w", 0.0)))  # fmt: skip

    def fold(self, x: float, discount: float, similarity: float | None = None) -> CreditStats:
        w = discount * self.w + 1.0
        mean = self.mean + (x - self.mean) / w
        m2 = discount * self.m2 + (x - self.mean) * (x - mean)
        sim, sim_w = self.sim, self.sim_w
        if similarity is not None:
            sim_w = discount * sim_w + 1.0
            sim += (similarity - sim) / sim_w
        return CreditStats(self.n + 1, w, mean, max(0.0, m2), sim, sim_w)

    def stderr(self, prior_var: float = 1.0) -> float:
        """Standard error of the mean, with one pseudo-observation of variance
        ``prior_var`` (one spread): two equal advantages are not certainty."""
        if self.w <= 0:
            return math.inf
        return math.sqrt((self.m2 + prior_var) / (self.w + 1.0) / self.w)

    def established(self, min_uses: int, z: float = 1.0) -> float:
        """The established effect: the lower confidence bound ``mean - z * se`` where
        it is above 0, the upper one where it is below 0, over at least ``min_uses``
        acted-on uses; else 0 (not established: one blame demotes nothing)."""
        if self.n < max(1, min_uses):
            return 0.0
        se = z * self.stderr()
        if self.mean - se > 0:
            return self.mean - se
        if self.mean + se < 0:
            return self.mean + se
        return 0.0

    def to_dict(self) -> dict[str, float | int]:
        out: dict[str, float | int] = {"n": self.n, "w": self.w, "mean": self.mean, "m2": self.m2}
        if self.sim_w > 0:
            out.update(sim=self.sim, sim_w=self.sim_w)
        return out


#: the statistics of a memory without credit (shared: `CreditStats` is immutable)
NO_CREDIT = CreditStats()


def apply_utility(
    row: dict[str, Any],
    update_id: str,
    credit: float,
    uses: int,
    discount: float = 0.95,
    remember: int = LIMITS.max_credit_ids,
    evidence: bool = True,
    similarity: float | None = None,
) -> bool:
    """Fold one update into a stored row in place; False if it was applied before.

    With ``evidence`` the normalised advantage ``credit`` is folded into the row's
    `CreditStats` (``metadata.credit``) and ``utility`` becomes their discounted
    mean; ``uses`` is added either way. An update without ``evidence`` (every use
    had weight 0: the memory was served or considered and not acted on) adds its
    uses and leaves the statistics alone: the outcome says nothing about a memory
    nobody followed. ``similarity`` (where known) is folded into the statistics'
    ``sim`` with the advantage. The last `remember` update ids that fit
    ``LIMITS.max_credit_ids_bytes`` live in the row's metadata (``credit_ids``),
    which is what makes a replayed update a no-op (the byte bound keeps the row
    within Milvus' JSON limit: `schemas.limits`).
    """
    meta = row.setdefault("metadata", {}) or {}
    row["metadata"] = meta
    applied: list[str] = list(meta.get("credit_ids", []))
    key = applied_key(update_id)
    if key in applied or update_id in applied:
        return False
    if evidence:
        stats = CreditStats.of(row).fold(float(credit), discount, similarity)
        meta["credit"] = stats.to_dict()
        row["utility"] = stats.mean
    else:
        row["utility"] = float(row.get("utility", 0.0))
    row["uses"] = int(row.get("uses", 0)) + int(uses)
    applied.append(key)
    meta["credit_ids"] = newest_within(applied, remember, LIMITS.max_credit_ids_bytes)
    return True


#: the longest update id ``credit_ids`` keeps as it is (the credit job's own ids are 24
#: hex characters); a longer one (a thumbs update of a long client id) is kept as its
#: digest, so ``remember`` ids always fit ``LIMITS.max_credit_ids_bytes``
APPLIED_KEY_CHARS = 32


def applied_key(update_id: str) -> str:
    """What ``metadata.credit_ids`` holds for ``update_id``: the id itself up to
    `APPLIED_KEY_CHARS`, else ``h:`` and a 96-bit digest of it (26 characters). The
    list's byte budget then holds `LIMITS.max_credit_ids` ids of any length, so a
    replay of any of the last ones is a no-op; a row written before keeps its full ids,
    which `apply_utility` still recognises."""
    if len(update_id) <= APPLIED_KEY_CHARS:
        return update_id
    return "h:" + hashlib.blake2b(update_id.encode(), digest_size=12).hexdigest()
