"""Maintenance operators: dedup/merge planning, merge arithmetic, priority, decay plans.

Pure logic, no Kafka and no Milvus; no clock is read here. `streams.jobs.maintenance`
feeds these from the ``memories`` topic and Milvus.

Time (one clock, from one source): every age below is measured in **stream time**,
never as wall clock minus event time. A memory's times (``created_ts``,
``last_seen``, ``last_access_ts``) are event times on its agent's clock, and
"now" for it is the **watermark** of its clock: the highest event time seen
from that agent of that tenant (``TenantIndex.advance``, fed with the event time
of every ``written``/``dropped`` event and of every row read). So a replayed
log, an import, a backfill or an agent whose clock is off by a constant keeps
exactly what the live stream keeps, and one agent's skewed clock never ages
another agent's memories. With ``clock="tenant"`` every agent of a tenant shares
one watermark (the highest event time of the tenant): a silent agent's memories
then age with the tenant's stream, at the price that a clock running ahead ages
everyone's memories. Once input stops the watermarks stop, so decay reaches a
fixed point instead of fading everything with the wall clock.

Priority (higher = more worth keeping)::

    p = |rpe| * 2^(-age / half_life)                     surprise, fading with age
                                                         (|rpe| = max(|rpe|, rpe_smoothed))
      + w_u * tanh(utility)                              earned by credit (bounded, signed:
                                                         memories that misled lose priority)
      + w_a * log2(1 + hits) * 2^(-since_access / h_a)   recent, frequent retrieval

``age`` is the stream time (the watermark of the memory's clock, see above)
minus ``last_seen`` (the latest time the situation recurred: a merge refreshes
it), not from the first sighting, so a situation the agent keeps meeting does
not fade. ``hits`` is the number of retrievals that served
the memory (access tracking, ``metadata.access.n``); ``since_access`` the time
since ``last_access_ts`` (stamped by the responder on the same clock, see
`streams.respond.responder`). The "earned" part (utility + access terms, without
the |rpe| term) decides promotion.

Decay rules per tenant (`plan_decay`):
- buffer entries past the TTL (not seen and not accessed for ``buffer_ttl_ms``)
  are evicted (reason ``ttl``); buffer entries with p below ``buffer_floor``
  are evicted (``below_floor``);
- core entries with p below ``demote_below`` are demoted (``faded``);
- buffer entries whose earned value reaches ``promote_above`` are promoted
  (``earned``). ``promote_above > demote_below`` (hysteresis: p >= earned, so a
  just-promoted entry is never demoted by the next pass);
- capacities: the core keeps its top ``core_capacity`` by p (the rest are
  demoted, ``core_capacity``; a promotion that would not make the top is not
  made), then the buffer keeps its top ``buffer_capacity`` (the rest are
  evicted, ``buffer_capacity``). Ties keep index order (stable sorts), so a
  plan is a deterministic function of the index.

Dedup: what may merge (`merge_scope`, `rewards_agree`, `plan_merges`). Dedup is
for true repeats (the same observation, action and reward met again, such as two
runs of one task variation), never for folding a salient memory into a bland one.
Two memories may merge only if all of these hold:

- same scope (`merge_scope`): tenant, agent, action, valence (the RPE's sign),
  partition (the route: a core memory never merges with a buffer one), terminal
  flag (``metadata.done``), the reward's sign (-, 0, +) and the context the agent
  declared (``metadata.user``, the transition's own metadata, compared whole, like
  the write path's exact-repeat key). The same words in another context are not a
  repeat (issue 13: "The door is now open." + "go to kitchen" of one ScienceWorld
  task was folded into another task's row, whose metadata the survivor keeps, so a
  search filtered to the first task (``metadata_equals``) no longer found it). Critical status
  (`is_critical`: reward != 0, or a terminal step such as a failure) is a
  function of the last two, so a critical memory never merges with a
  non-critical one;
- rewards agree (`rewards_agree`): every reward in the merged group lies within
  ``reward_tol`` (default 1 %) of every other, relative to the larger magnitude
  (complete linkage over ``metadata.merge.reward_min/max``, so a chain of small
  steps cannot drift: the group's rewards span at most the tolerance). Rewards of
  0 only merge with exactly 0;
- cosine >= ``tau``. Encoder dependent (``DMEM_MAINTENANCE__DEDUP_TAU``, default
  per encoder, `DEDUP_TAU_BY_ENCODER`: 0.98 for MiniLM, which rates different short
  sentences close, and for its static distillation, 0.95 for the hashing encoder;
  measured in BENCHMARKS.md).

Within one scope the items are visited oldest first (``created_ts``, then id);
each joins the first earlier survivor within ``tau`` whose rewards agree, else
becomes a survivor. The survivor is therefore always the oldest member, whatever
order the events arrived in, which makes merges deterministic under replay.

Merge arithmetic (`merge_rows`): the survivor keeps the strongest signal.
merged_count adds up; reward is the count-weighted mean (within the tolerance of
every member's, see above; ``metadata.merge.reward_min/max`` keep the span); rpe
is the member value with the largest |rpe| (sign kept), rpe_smoothed and gate the
max; the outcome evidence adds up: utility the uses-weighted mean (uses add up),
retrieval counts add up, applied credit ids are kept; created_ts the earliest
(first seen), ``metadata.merge.last_seen_ts`` the latest; last_access_ts the
latest; the survivor's vector, text and user metadata are kept. The ids of the
transitions folded in are kept in ``metadata.merge.ids`` (the last
`MERGE_IDS_KEPT`; merged_count still counts all): a search hit reports them
(`Hit.merged_ids`), a lookup of a folded id finds its survivor, and folding an id
twice (a replay after a crash between "write survivor" and "delete members")
changes nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "CORE",
    "BUFFER",
    "DEDUP_TAU_BY_ENCODER",
    "DecayAction",
    "DecayPlan",
    "MaintenancePolicy",
    "MergeGroup",
    "PriorityIndex",
    "TenantIndex",
    "entry_from_row",
    "is_critical",
    "merge_rows",
    "merge_scope",
    "user_context",
    "plan_decay",
    "plan_merges",
    "priority",
    "rewards_agree",
]

CORE, BUFFER = 0, 1
PART_CODE = {"core": CORE, "buffer": BUFFER}
PART_NAME = ("core", "buffer")
# ~36 bytes each in the row's JSON: 1000 ids stay far below Milvus' 64 KiB JSON limit
MERGE_IDS_KEPT = 1000
CREDIT_IDS_KEPT = 64  # as `operators.credit.apply_utility` remembers them
DAY_MS = 24 * 3600 * 1000
#: default dedup tau per encoder (BENCHMARKS.md "Dedup tau": false merges on real text)
DEDUP_TAU_BY_ENCODER = {"minilm": 0.98, "minilm-static": 0.98, "hash": 0.95, "passthrough": 0.95}


@dataclass(frozen=True)
class MaintenancePolicy:
    """Every knob of dedup and decay (defaults documented in the module doc)."""

    tau: float = 0.95
    reward_tol: float = 0.01  # rewards merge within 1 % of the larger magnitude (same sign)
    half_life_ms: float = 7 * DAY_MS
    utility_weight: float = 1.0
    access_weight: float = 0.25
    access_half_life_ms: float = 1 * DAY_MS
    buffer_floor: float = 0.05
    buffer_ttl_ms: int = 14 * DAY_MS
    demote_below: float = 0.3
    promote_above: float = 0.5
    core_capacity: int = 10_000
    buffer_capacity: int = 50_000
    max_actions: int = 5_000
    clock: str = "agent"  # "agent": one watermark per (tenant, agent); "tenant": one per tenant

    def __post_init__(self) -> None:
        if self.clock not in ("agent", "tenant"):
            raise ValueError(f"clock must be 'agent' or 'tenant', got {self.clock!r}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if not 0.0 <= self.reward_tol < 1.0:
            raise ValueError(f"reward_tol must be in [0, 1), got {self.reward_tol}")
        if self.half_life_ms <= 0 or self.access_half_life_ms <= 0:
            raise ValueError("half lives must be positive")
        if self.promote_above <= self.demote_below:
            raise ValueError(
                f"promote_above ({self.promote_above}) must exceed demote_below "
                f"({self.demote_below}) or entries flip between core and buffer"
            )
        if self.core_capacity < 0 or self.buffer_capacity < 0 or self.max_actions < 1:
            raise ValueError("capacities must be >= 0 and max_actions >= 1")


def priority(
    abs_rpe: np.ndarray | float,
    age_ms: np.ndarray | float,
    utility: np.ndarray | float,
    hits: np.ndarray | float,
    since_access_ms: np.ndarray | float,
    policy: MaintenancePolicy,
) -> tuple[np.ndarray, np.ndarray]:
    """(priority, earned) arrays; see the module doc for the formula."""
    age = np.maximum(np.asarray(age_ms, dtype=np.float64), 0.0)
    since = np.maximum(np.asarray(since_access_ms, dtype=np.float64), 0.0)
    surprise = np.abs(np.asarray(abs_rpe, dtype=np.float64)) * np.exp2(-age / policy.half_life_ms)
    h = np.maximum(np.asarray(hits, dtype=np.float64), 0.0)
    access = policy.access_weight * np.log2(1.0 + h) * np.exp2(-since / policy.access_half_life_ms)
    earned = policy.utility_weight * np.tanh(np.asarray(utility, dtype=np.float64)) + access
    return surprise + earned, earned


# -- the in-memory priority index ---------------------------------------------------------


@dataclass
class Entry:
    """What the decay planner needs of one memory (no vector, no text)."""

    partition: int
    created_ts: int
    last_seen_ts: int
    abs_rpe: float
    utility: float = 0.0
    hits: int = 0
    last_access_ts: int = 0
    agent: str = ""  # whose clock the times are on (`TenantIndex` maps it to a watermark)


def entry_from_row(row: Mapping[str, Any]) -> Entry:
    """An index entry from a stored row (``partition`` included, as the store returns it)."""
    meta = row.get("metadata") or {}
    merge = meta.get("merge") or {} if isinstance(meta, Mapping) else {}
    access = meta.get("access") or {} if isinstance(meta, Mapping) else {}
    created = int(row.get("created_ts", 0))
    return Entry(
        partition=PART_CODE[str(row.get("partition", "buffer"))],
        created_ts=created,
        last_seen_ts=max(created, int(merge.get("last_seen_ts", created))),
        # the surprise the gate stored it for (its score also carries the reward's
        # surprise, issue 13), so decay does not undo the gate's core routes
        abs_rpe=max(abs(float(row.get("rpe", 0.0))), float(row.get("rpe_smoothed", 0.0) or 0.0)),
        utility=float(row.get("utility", 0.0)),
        hits=int(access.get("n", 0)),
        last_access_ts=int(row.get("last_access_ts", created)),
        agent=str(row.get("agent_id") or ""),
    )


_COLS: tuple[tuple[str, Any], ...] = (
    ("partition", np.int8),
    ("created_ts", np.int64),
    ("last_seen_ts", np.int64),
    ("abs_rpe", np.float64),
    ("utility", np.float64),
    ("hits", np.int64),
    ("last_access_ts", np.int64),
)
_UNSEEN = np.iinfo(np.int64).min


class TenantIndex:
    """Columnar arrays of one tenant's entries; O(1) upsert/remove (swap with last).

    Also the tenant's stream clocks: one watermark (highest event time seen) per
    agent, or one for the whole tenant (``per_agent_clock=False``). Watermarks
    only move forward; removing an entry does not move them back.
    """

    def __init__(self, capacity: int = 1024, per_agent_clock: bool = True) -> None:
        self.ids: list[str] = []
        self.slot: dict[str, int] = {}
        self.cols: dict[str, np.ndarray] = {n: np.zeros(capacity, dtype=t) for n, t in _COLS}
        self.clock_col = np.zeros(capacity, dtype=np.int32)  # entry -> its clock
        self.per_agent_clock = per_agent_clock
        self.clocks: dict[str, int] = {}  # clock key (agent id, or "") -> code
        self.watermark = np.full(4, _UNSEEN, dtype=np.int64)  # code -> stream time
        self.cursor = 0  # round-robin refresh position

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, mid: object) -> bool:
        return mid in self.slot

    def _grow(self) -> None:
        for name, arr in [*self.cols.items(), ("", self.clock_col)]:
            bigger = np.zeros(max(1024, 2 * arr.shape[0]), dtype=arr.dtype)
            bigger[: arr.shape[0]] = arr
            if name:
                self.cols[name] = bigger
            else:
                self.clock_col = bigger

    # -- stream time ----------------------------------------------------------------
    def _clock(self, agent: str | None) -> int:
        key = (agent or "") if self.per_agent_clock else ""
        code = self.clocks.get(key)
        if code is None:
            code = self.clocks[key] = len(self.clocks)
            if code >= self.watermark.shape[0]:
                bigger = np.full(2 * self.watermark.shape[0], _UNSEEN, dtype=np.int64)
                bigger[: self.watermark.shape[0]] = self.watermark
                self.watermark = bigger
        return code

    def advance(self, agent: str | None, event_ts: int) -> bool:
        """An event time seen from `agent`: its clock's watermark moves up to it.
        True when it moved (ages changed)."""
        code = self._clock(agent)
        if event_ts > self.watermark[code]:
            self.watermark[code] = event_ts
            return True
        return False

    def stream_time(self, agent: str | None = None) -> int | None:
        """The watermark of `agent`'s clock (None: the highest of the tenant's clocks)."""
        if agent is None:
            seen = self.watermark[: len(self.clocks)]
            seen = seen[seen != _UNSEEN]
            return int(seen.max()) if seen.size else None
        code = self.clocks.get((agent or "") if self.per_agent_clock else "")
        if code is None or self.watermark[code] == _UNSEEN:
            return None
        return int(self.watermark[code])

    def stream_now(self) -> np.ndarray:
        """Per entry: the stream time of its clock (what its ages are measured against)."""
        return self.watermark[self.clock_col[: len(self.ids)]]

    def upsert(self, mid: str, e: Entry) -> None:
        i = self.slot.get(mid)
        if i is None:
            i = len(self.ids)
            if i >= self.cols["abs_rpe"].shape[0]:
                self._grow()
            self.ids.append(mid)
            self.slot[mid] = i
        for name, _ in _COLS:
            self.cols[name][i] = getattr(e, name)
        code = self._clock(e.agent)
        self.clock_col[i] = code
        self.advance(e.agent, max(e.created_ts, e.last_seen_ts))

    def set_partition(self, mid: str, partition: int) -> bool:
        i = self.slot.get(mid)
        if i is None or self.cols["partition"][i] == partition:
            return False
        self.cols["partition"][i] = partition
        return True

    def remove(self, mid: str) -> bool:
        i = self.slot.pop(mid, None)
        if i is None:
            return False
        last = len(self.ids) - 1
        if i != last:
            moved = self.ids[last]
            self.ids[i] = moved
            self.slot[moved] = i
            for arr in [*self.cols.values(), self.clock_col]:
                arr[i] = arr[last]
        self.ids.pop()
        return True

    def get(self, mid: str) -> Entry | None:
        i = self.slot.get(mid)
        if i is None:
            return None
        keys = {code: key for key, code in self.clocks.items()}
        return Entry(**{n: self.cols[n][i].item() for n, _ in _COLS},
                     agent=keys[int(self.clock_col[i])])  # fmt: skip

    def view(self) -> dict[str, np.ndarray]:
        n = len(self.ids)
        return {name: arr[:n] for name, arr in self.cols.items()}

    def next_refresh(self, budget: int) -> list[str]:
        """The next `budget` ids in round-robin order (the incremental refresh cursor)."""
        n = len(self.ids)
        if n == 0 or budget <= 0:
            return []
        if budget >= n:
            self.cursor = 0
            return list(self.ids)
        start = self.cursor % n
        out = self.ids[start : start + budget]
        if len(out) < budget:
            out += self.ids[: budget - len(out)]
        self.cursor = (start + budget) % n
        return out

    def counts(self) -> dict[str, int]:
        part = self.view()["partition"]
        core = int(np.count_nonzero(part == CORE))
        return {"core": core, "buffer": len(self.ids) - core}


class PriorityIndex:
    """Per-tenant `TenantIndex`es (each with its stream clocks)."""

    def __init__(self, per_agent_clock: bool = True) -> None:
        self.tenants: dict[str, TenantIndex] = {}
        self.per_agent_clock = per_agent_clock

    def tenant(self, tenant: str) -> TenantIndex:
        t = self.tenants.get(tenant)
        if t is None:
            t = self.tenants[tenant] = TenantIndex(per_agent_clock=self.per_agent_clock)
        return t

    def upsert(self, tenant: str, mid: str, e: Entry) -> None:
        self.tenant(tenant).upsert(mid, e)

    def remove(self, tenant: str, mid: str) -> bool:
        t = self.tenants.get(tenant)
        return t.remove(mid) if t is not None else False

    def set_partition(self, tenant: str, mid: str, partition: str) -> bool:
        t = self.tenants.get(tenant)
        if t is not None and partition in PART_CODE:
            return t.set_partition(mid, PART_CODE[partition])
        return False

    def __len__(self) -> int:
        return sum(len(t) for t in self.tenants.values())


# -- decay ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecayAction:
    memory_id: str
    kind: str  # "evicted" | "demoted" | "promoted"
    reason: str
    partition: str  # where the memory is now (before the action)
    priority: float


@dataclass
class DecayPlan:
    actions: list[DecayAction] = field(default_factory=list)
    deferred: int = 0  # actions beyond max_actions, left for the next pass
    priorities: np.ndarray | None = None

    def by_kind(self, kind: str) -> list[DecayAction]:
        return [a for a in self.actions if a.kind == kind]


StreamTime = int | np.ndarray | None


def _stream_now(t: TenantIndex, stream_ms: StreamTime) -> np.ndarray:
    if stream_ms is None:
        return t.stream_now()
    return np.broadcast_to(np.asarray(stream_ms, dtype=np.int64), (len(t),))


def tenant_priorities(
    t: TenantIndex, policy: MaintenancePolicy, stream_ms: StreamTime = None
) -> tuple[np.ndarray, np.ndarray]:
    """(priority, earned) per entry, ages against `stream_ms` (None: each entry's
    clock's watermark, the jobs' case; a number: one stream time for all)."""
    v = t.view()
    now = _stream_now(t, stream_ms)
    return priority(
        v["abs_rpe"],
        now - v["last_seen_ts"],
        v["utility"],
        v["hits"],
        now - v["last_access_ts"],
        policy,
    )


def plan_decay(t: TenantIndex, policy: MaintenancePolicy,
               stream_ms: StreamTime = None) -> DecayPlan:  # fmt: skip
    """One pass's actions for one tenant: O(n) vectorised, then sorting the few chosen.

    Ages are stream time (see the module doc; `stream_ms` as in `tenant_priorities`).
    """
    n = len(t)
    plan = DecayPlan()
    if n == 0:
        return plan
    v = t.view()
    ids = t.ids
    now = _stream_now(t, stream_ms)
    p, earned = tenant_priorities(t, policy, now)
    plan.priorities = p
    core = v["partition"] == CORE
    buf = ~core
    stale = ((now - v["last_seen_ts"]) > policy.buffer_ttl_ms) & (
        (now - v["last_access_ts"]) > policy.buffer_ttl_ms
    )
    ttl = buf & stale
    floor = buf & ~ttl & (p < policy.buffer_floor)
    faded = core & (p < policy.demote_below)
    promote = buf & ~ttl & ~floor & (earned >= policy.promote_above)

    # core after fading and promotions, capped at core_capacity by priority
    in_core = (core & ~faded) | promote
    demote_cap = np.zeros(n, dtype=bool)
    cand = np.flatnonzero(in_core)
    if cand.size > policy.core_capacity:
        order = cand[np.argsort(-p[cand], kind="stable")]
        drop = order[policy.core_capacity :]
        promote[drop] = False  # a promotion that does not make the top is not made
        demote_cap[drop] = core[drop]
    # buffer after all moves and evictions, capped at buffer_capacity by priority
    in_buf = (buf & ~ttl & ~floor & ~promote) | faded | demote_cap
    evict_cap = np.zeros(n, dtype=bool)
    cand = np.flatnonzero(in_buf)
    if cand.size > policy.buffer_capacity:
        order = cand[np.argsort(p[cand], kind="stable")]
        evict_cap[order[: cand.size - policy.buffer_capacity]] = True

    # actions in this order; only the first max_actions are materialised (the rest deferred)
    evict_cap_core = evict_cap & core
    groups: list[tuple[np.ndarray, np.ndarray, str, str, str]] = [
        (np.flatnonzero(ttl), p, "evicted", "ttl", "buffer"),
        (np.flatnonzero(floor), p, "evicted", "below_floor", "buffer"),
        (np.flatnonzero(evict_cap & ~core), p, "evicted", "buffer_capacity", "buffer"),
        (np.flatnonzero(evict_cap_core), p, "evicted", "buffer_capacity", "core"),
        (np.flatnonzero(faded & ~evict_cap), p, "demoted", "faded", "core"),
        (np.flatnonzero(demote_cap & ~evict_cap), p, "demoted", "core_capacity", "core"),
        (np.flatnonzero(promote), -p, "promoted", "earned", "buffer"),
    ]
    actions: list[DecayAction] = []
    total = sum(int(g[0].size) for g in groups)
    for idx, key, kind, reason, where in groups:
        room = policy.max_actions - len(actions)
        if room <= 0 or idx.size == 0:
            continue
        chosen = idx[np.argsort(key[idx], kind="stable")[:room]]
        actions += [DecayAction(ids[i], kind, reason, where, float(p[i])) for i in chosen.tolist()]
    plan.deferred = total - len(actions)
    plan.actions = actions
    return plan


# -- dedup ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeGroup:
    survivor: str
    members: tuple[str, ...]  # merged into the survivor (removed), oldest first
    similarity: tuple[float, ...]  # cosine of each member to the survivor


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _meta(row: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = row.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def is_critical(row: Mapping[str, Any]) -> bool:
    """A rewarded step (reward != 0) or a terminal one (``metadata.done``: a goal, a failure)."""
    return float(row.get("reward", 0.0) or 0.0) != 0.0 or bool(_meta(row).get("done"))


def user_context(row: Mapping[str, Any]) -> Mapping[str, Any]:
    """The metadata the agent sent with the transition (``metadata.user``)."""
    user = _meta(row).get("user")
    return user if isinstance(user, Mapping) else {}


def merge_scope(row: Mapping[str, Any]) -> tuple[str, str, int, str, bool, int, str]:
    """Only memories with equal scopes may merge (module doc): agent, action,
    valence, partition (route), terminal flag, reward sign and the agent's declared
    context (``metadata.user`` as canonical JSON; the tenant is implied)."""
    ctx = json.dumps(user_context(row), sort_keys=True, default=str, separators=(",", ":"))
    return (str(row.get("agent_id", "")), str(row.get("action", "")),
            int(row.get("valence", 0) or 0), str(row.get("partition", "")),
            bool(_meta(row).get("done")), _sign(float(row.get("reward", 0.0) or 0.0)),
            ctx)  # fmt: skip


def reward_span(row: Mapping[str, Any]) -> tuple[float, float]:
    """(lowest, highest) reward among the transitions a row stands for."""
    r = float(row.get("reward", 0.0) or 0.0)
    merge = _meta(row).get("merge")
    if isinstance(merge, Mapping) and "reward_min" in merge and "reward_max" in merge:
        return min(r, float(merge["reward_min"])), max(r, float(merge["reward_max"]))
    return r, r


def rewards_agree(lo: float, hi: float, tol: float) -> bool:
    """True when the rewards in [lo, hi] are one reward up to `tol`: same sign, and
    the span within `tol` of the larger magnitude (0 merges only with 0)."""
    if _sign(lo) != _sign(hi):
        return False
    return hi - lo <= tol * max(abs(lo), abs(hi))


def plan_merges(
    ids: Sequence[str],
    created_ts: Sequence[int],
    vectors: np.ndarray,
    tau: float,
    rewards: Sequence[tuple[float, float]] | None = None,
    reward_tol: float = 0.0,
) -> list[MergeGroup]:
    """Greedy oldest-first clustering of one scope's items (see module doc).

    ``vectors`` are unit rows aligned with ``ids``; ``rewards`` their reward spans
    (`reward_span`): an item joins a survivor only if the group's rewards then still
    agree (`rewards_agree` with `reward_tol`). Returns only groups with members.
    """
    n = len(ids)
    if n < 2:
        return []
    order = sorted(range(n), key=lambda i: (int(created_ts[i]), ids[i]))
    vecs = np.asarray(vectors, dtype=np.float32)[order]
    spans = [tuple(rewards[i]) for i in order] if rewards is not None else None
    survivors: list[int] = []  # positions in `order`
    group_span: dict[int, tuple[float, float]] = {}
    members: dict[int, list[tuple[int, float]]] = {}
    for pos in range(n):
        if survivors:
            sims = vecs[survivors] @ vecs[pos]
            joined = False
            for h in np.flatnonzero(sims >= tau - 1e-6).tolist():
                s = survivors[h]
                if spans is not None:
                    lo = min(group_span[s][0], spans[pos][0])
                    hi = max(group_span[s][1], spans[pos][1])
                    if not rewards_agree(lo, hi, reward_tol):
                        continue
                    group_span[s] = (lo, hi)
                members.setdefault(s, []).append((pos, float(sims[h])))
                joined = True
                break
            if joined:
                continue
        survivors.append(pos)
        if spans is not None:
            group_span[pos] = (float(spans[pos][0]), float(spans[pos][1]))
    return [
        MergeGroup(
            survivor=ids[order[s]],
            members=tuple(ids[order[m]] for m, _ in ms),
            similarity=tuple(min(1.0, sim) for _, sim in ms),
        )
        for s, ms in members.items()
    ]


def _count(row: Mapping[str, Any]) -> int:
    return max(1, int(row.get("merged_count", 1) or 1))


def merge_rows(
    survivor: Mapping[str, Any], members: Iterable[Mapping[str, Any]]
) -> tuple[dict[str, Any], list[str]]:
    """Fold `members` into a copy of `survivor`; returns (new row, ids folded now:
    the members' and those they stood for themselves).

    Members already folded in before (their id is in ``metadata.merge.ids``) are
    skipped, so a replayed merge is a no-op on the numbers. Pure arithmetic: which
    rows may merge is `plan_merges`' decision.
    """
    out = dict(survivor)
    meta = dict(out.get("metadata") or {})
    merge = dict(meta.get("merge") or {})
    seen_ids: list[str] = list(merge.get("ids", []))
    created = int(out.get("created_ts", 0))
    first = int(merge.get("first_seen_ts", created))
    last = int(merge.get("last_seen_ts", created))
    count = _count(out)
    reward_sum = float(out.get("reward", 0.0)) * count
    rpe = float(out.get("rpe", 0.0))
    rpe_s = float(out.get("rpe_smoothed", 0.0))
    gate = float(out.get("gate", 0.0))
    uses = int(out.get("uses", 0))
    util_sum = float(out.get("utility", 0.0)) * uses
    last_access = int(out.get("last_access_ts", created))
    partition = out.get("partition", "buffer")
    r_lo, r_hi = reward_span(out)
    credit_ids: list[str] = list(meta.get("credit_ids", []))
    folded: list[str] = []
    for m in members:
        mid = str(m["id"])
        if mid == out.get("id") or mid in seen_ids or mid in folded:
            continue
        folded.append(mid)
        c = _count(m)
        m_meta = m.get("metadata") or {}
        m_merge = m_meta.get("merge") or {} if isinstance(m_meta, Mapping) else {}
        m_created = int(m.get("created_ts", 0))
        first = min(first, int(m_merge.get("first_seen_ts", m_created)), m_created)
        last = max(last, int(m_merge.get("last_seen_ts", m_created)), m_created)
        count += c
        reward_sum += float(m.get("reward", 0.0)) * c
        m_lo, m_hi = reward_span(m)
        r_lo, r_hi = min(r_lo, m_lo), max(r_hi, m_hi)
        m_credit = m_meta.get("credit_ids", []) if isinstance(m_meta, Mapping) else []
        credit_ids += [c_id for c_id in m_credit if c_id not in credit_ids]
        folded += [f for f in m_merge.get("ids", []) if f not in seen_ids and f not in folded]
        if abs(float(m.get("rpe", 0.0))) > abs(rpe):
            rpe = float(m.get("rpe", 0.0))
        rpe_s = max(rpe_s, float(m.get("rpe_smoothed", 0.0)))
        gate = max(gate, float(m.get("gate", 0.0)))
        m_uses = int(m.get("uses", 0))
        uses += m_uses
        util_sum += float(m.get("utility", 0.0)) * m_uses
        last_access = max(last_access, int(m.get("last_access_ts", m_created)))
        if m.get("partition") == "core":
            partition = "core"
        m_access = (m_meta.get("access") or {}) if isinstance(m_meta, Mapping) else {}
        if m_access:
            acc = dict(meta.get("access") or {})
            acc["n"] = int(acc.get("n", 0)) + int(m_access.get("n", 0))
            meta["access"] = acc
    if not folded:
        return out, []
    out["merged_count"] = count
    out["reward"] = reward_sum / count
    out["rpe"] = rpe
    out["rpe_smoothed"] = rpe_s
    out["gate"] = gate
    out["uses"] = uses
    if uses > 0:
        out["utility"] = util_sum / uses
    out["created_ts"] = min(created, first)
    out["last_access_ts"] = last_access
    out["partition"] = partition
    merge.update(
        ids=(seen_ids + folded)[-MERGE_IDS_KEPT:],
        first_seen_ts=min(created, first),
        last_seen_ts=max(last, created),
        reward_min=r_lo,
        reward_max=r_hi,
    )
    meta["merge"] = merge
    if credit_ids:
        meta["credit_ids"] = credit_ids[-CREDIT_IDS_KEPT:]
    out["metadata"] = meta
    for k in ("reward", "rpe", "rpe_smoothed", "gate", "utility"):
        if not math.isfinite(float(out[k])):  # pragma: no cover - inputs are finite
            out[k] = 0.0
    return out, folded
