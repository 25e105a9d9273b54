"""Decay: which memories fade, move between core and buffer, or leave the store.

Pure logic: no Kafka, no Milvus, no clock. The maintenance jobs (`streams.jobs`)
feed it from the ``memories`` topic and the store.

Stream time: every age is measured against the **watermark** of the memory's
clock (the highest event time seen from its agent of its tenant, or from the
whole tenant with ``clock="tenant"``; `TenantIndex.advance`), never as wall
clock minus event time. So a replayed log, an import, a backfill or an agent
whose clock is off by a constant keeps exactly what the live stream keeps, one
agent's skewed clock never ages another agent's memories, and once input stops
decay reaches a fixed point instead of fading everything. A tenant clock ages a
silent agent's memories with the tenant's stream, at the price that a clock
running ahead ages everyone's.

Priority (higher = more worth keeping)::

    p = |rpe| * 2^(-age / half_life)                     surprise, fading with age
                                                         (|rpe| = max(|rpe|, rpe_smoothed))
      + w_u * tanh(utility)                              earned by credit (bounded, signed:
                                                         memories that misled lose priority)
      + w_a * log2(1 + hits) * 2^(-since_access / h_a)   recent, frequent retrieval

``age`` runs from ``last_seen`` (the latest time the situation recurred; a merge
refreshes it), so a situation the agent keeps meeting does not fade. ``hits``
counts the retrievals that served the memory (``metadata.access.n``);
``since_access`` runs from ``last_access_ts`` (stamped by the responder on the
same clock); retrievals the agent reported ignoring (credited uses without
evidence) are not counted (`earned_hits`). The earned part (utility and access
terms) alone decides promotion.

Horizons follow each clock's span (`span_horizons`): the half-life and the buffer
TTL of an entry are ``max(policy value, span_factor * (watermark - origin))`` of
its clock, where the origin is the earliest ``created_ts`` of the clock's memories.
An agent whose stream spans months decays on months; one that spans hours on the
policy's fixed values. At ``span_factor`` >= 1 no entry is older than its clock's
span, so the TTL never fires and value and capacity decide what goes. A memory with
a bogus early ``created_ts`` (0, seconds for milliseconds) stretches its clock's
span to match it; with ``clock="tenant"`` one clock, and so one span, serves every
agent of the tenant.

Rules per tenant (`plan_decay`):

- buffer entries neither seen nor accessed for the buffer TTL are evicted
  (``ttl``); buffer entries with p below ``buffer_floor`` too (``below_floor``);
- core entries with p below ``demote_below`` are demoted (``faded``);
- buffer entries whose earned value reaches ``promote_above`` are promoted
  (``earned``), unless their utility is negative (retrievals alone do not lift a
  memory that misled when acted on); ``promote_above > demote_below`` (hysteresis:
  p >= earned, so a just-promoted entry is never demoted by the next pass);
- capacities: core keeps its top ``core_capacity`` by p (the rest are demoted,
  ``core_capacity``; a promotion that would not make the top is not made), then
  the buffer keeps its top ``buffer_capacity`` (the rest are evicted,
  ``buffer_capacity``). Stable sorts: a plan is a deterministic function of the
  index.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from operators.credit import CreditStats

__all__ = [
    "BUFFER",
    "CORE",
    "DAY_MS",
    "PART_CODE",
    "PART_NAME",
    "DecayAction",
    "DecayPlan",
    "Entry",
    "MaintenancePolicy",
    "PriorityIndex",
    "TenantIndex",
    "earned_hits",
    "entry_from_row",
    "horizons",
    "plan_decay",
    "priority",
    "span_horizons",
    "tenant_priorities",
]

CORE, BUFFER = 0, 1
PART_CODE = {"core": CORE, "buffer": BUFFER}
PART_NAME = ("core", "buffer")
DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class MaintenancePolicy:
    """Every knob of the maintenance jobs: decay's, and dedup's ``tau`` and
    ``reward_tol`` (`operators.dedup`)."""

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
    #: horizons follow the clock's own span: half-life and buffer TTL are at least
    #: ``span_factor`` x (watermark - the earliest event time of that clock); 0: fixed
    span_factor: float = 1.0

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
        if not (np.isfinite(self.span_factor) and self.span_factor >= 0.0):
            raise ValueError(f"span_factor must be a finite number >= 0, got {self.span_factor}")
        if self.core_capacity < 0 or self.buffer_capacity < 0 or self.max_actions < 1:
            raise ValueError("capacities must be >= 0 and max_actions >= 1")


def horizons(
    span_ms: np.ndarray | float, policy: MaintenancePolicy
) -> tuple[np.ndarray, np.ndarray]:
    """(half-life, buffer TTL) in ms for clocks that span ``span_ms``: the policy's,
    or ``span_factor`` x the span where that is longer."""
    span = policy.span_factor * np.maximum(np.asarray(span_ms, dtype=np.float64), 0.0)
    return np.maximum(policy.half_life_ms, span), np.maximum(float(policy.buffer_ttl_ms), span)


def priority(
    abs_rpe: np.ndarray | float,
    age_ms: np.ndarray | float,
    utility: np.ndarray | float,
    hits: np.ndarray | float,
    since_access_ms: np.ndarray | float,
    policy: MaintenancePolicy,
    half_life_ms: np.ndarray | float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(priority, earned) arrays; see the module doc for the formula. ``half_life_ms``:
    per entry (`horizons`); None: the policy's."""
    age = np.maximum(np.asarray(age_ms, dtype=np.float64), 0.0)
    since = np.maximum(np.asarray(since_access_ms, dtype=np.float64), 0.0)
    half = policy.half_life_ms if half_life_ms is None else np.asarray(half_life_ms, np.float64)
    surprise = np.abs(np.asarray(abs_rpe, dtype=np.float64)) * np.exp2(-age / half)
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


def earned_hits(row: Mapping[str, Any], hits: int) -> int:
    """Retrievals that count as earned: every one, less those the agent reported
    ignoring (credited uses without evidence, `operators.credit.CreditStats`). A
    memory served again and again and never acted on (a near neighbour that keeps
    being found) has shown it is not what decisions rest on; without usage reports
    nothing is subtracted."""
    ignored = max(0, int(row.get("uses", 0) or 0) - CreditStats.of(row).n)
    return max(0, hits - ignored)


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
        # surprise), so decay does not undo the gate's core routes
        abs_rpe=max(abs(float(row.get("rpe", 0.0))), float(row.get("rpe_smoothed", 0.0) or 0.0)),
        utility=float(row.get("utility", 0.0)),
        hits=earned_hits(row, int(access.get("n", 0)) if isinstance(access, Mapping) else 0),
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
_NEVER = np.iinfo(np.int64).max


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
        self.origin = np.full(4, _NEVER, dtype=np.int64)  # code -> earliest event time
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
                first = np.full(bigger.shape[0], _NEVER, dtype=np.int64)
                first[: self.origin.shape[0]] = self.origin
                self.origin = first
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

    def origin_now(self) -> np.ndarray:
        """Per entry: its clock's origin, the earliest ``created_ts`` of any memory of
        that clock this index has held (`span_horizons`). Only stored memories count,
        not dropped events, so a rebuild from the stored rows after a restart finds
        the same origin unless the oldest memories were evicted since."""
        return self.origin[self.clock_col[: len(self.ids)]]

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
        if e.created_ts < self.origin[code]:
            self.origin[code] = e.created_ts
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
        span_horizons(t, policy, now)[0],
    )


def span_horizons(
    t: TenantIndex, policy: MaintenancePolicy, now: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per entry: (half-life, buffer TTL) from its clock's span up to ``now``."""
    first = t.origin_now()
    span = np.where(first == _NEVER, 0, now - np.minimum(first, now))
    return horizons(span, policy)


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
    ttl_ms = span_horizons(t, policy, now)[1]
    stale = ((now - v["last_seen_ts"]) > ttl_ms) & ((now - v["last_access_ts"]) > ttl_ms)
    ttl = buf & stale
    floor = buf & ~ttl & (p < policy.buffer_floor)
    faded = core & (p < policy.demote_below)
    # never a memory whose credit is negative, however often it is found: its
    # retrievals could outweigh the utility it lost when acted on (or thumbed down)
    promote = buf & ~ttl & ~floor & (earned >= policy.promote_above) & (v["utility"] >= 0.0)

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
