"""Dedup: which stored memories are one repeated situation, and how they fold into one.

Pure logic: no Kafka, no Milvus, no clock. Dedup is for true repeats (the same
observation, action and reward met again, such as two runs of one task), never
for folding a salient memory into a bland one. Two memories may merge only if
all of these hold:

- same scope (`merge_scope`): agent, action, valence (the RPE's sign), partition
  (a core memory never merges with a buffer one), terminal flag
  (``metadata.done``), the reward's sign and the context the agent declared
  (``metadata.user``, compared whole, like the write path's exact-repeat key).
  The same words in another context are not a repeat, and the survivor keeps
  only its own metadata, so a search filtered by the other context
  (``metadata_equals``) would no longer find it. Critical status
  (`is_critical`: reward != 0 or a terminal step) follows from the last two, so
  a critical memory never merges with a non-critical one;
- rewards agree (`rewards_agree`): every reward in the group lies within
  ``reward_tol`` (default 1 %) of every other, relative to the larger magnitude
  (complete linkage over ``metadata.merge.reward_min/max``, so a chain of small
  steps cannot drift); 0 merges only with 0;
- cosine >= ``tau``, which depends on the encoder (`DEDUP_TAU_BY_ENCODER`,
  overridden by ``DMEM_MAINTENANCE__DEDUP_TAU``): MiniLM rates different short
  sentences close, so it needs a higher tau than the hashing encoder.

Within one scope items are visited oldest first (``created_ts``, then id); each
joins the first earlier survivor within ``tau`` whose rewards agree, else
becomes a survivor. The survivor is always the oldest member whatever order
the events arrived in, so merges are deterministic under replay.

Merge arithmetic (`merge_rows`): the survivor keeps the strongest signal.
merged_count adds up; reward is the count-weighted mean (its span kept in
``metadata.merge.reward_min/max``); rpe is the member value with the largest
|rpe| (sign kept), rpe_smoothed and gate the max; utility the uses-weighted
mean (uses add up); retrieval counts add up; applied credit ids are kept;
created_ts is the earliest, ``metadata.merge.last_seen_ts`` and last_access_ts
the latest; the survivor's vector, text and user metadata stay. The folded
transition ids are kept in ``metadata.merge.ids``: a hit reports them
(`Hit.merged_ids`), a lookup of a folded id finds its survivor, and folding an id
twice (a replay after a crash between "write survivor" and "delete members")
changes nothing. Both id lists keep their newest entries within the row's byte
budget (`schemas.limits`): at most `MERGE_IDS_KEPT` folded ids in what the
survivor's user metadata leaves of Milvus' 64 KiB JSON field (at least
``LIMITS.min_merge_ids_bytes``), at most `CREDIT_IDS_KEPT` credit ids in
``LIMITS.max_credit_ids_bytes``; merged_count counts every fold.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.limits import LIMITS, bounded_lists

__all__ = [
    "CREDIT_IDS_KEPT",
    "DEDUP_TAU_BY_ENCODER",
    "MERGE_IDS_KEPT",
    "EventTimeWindows",
    "MergeGroup",
    "is_critical",
    "merge_rows",
    "merge_scope",
    "plan_merges",
    "reward_span",
    "rewards_agree",
    "user_context",
]

#: at most this many folded ids in ``metadata.merge.ids`` (and at most what the row's
#: byte budget leaves them: `schemas.limits.merge_ids_budget`)
MERGE_IDS_KEPT = LIMITS.max_merge_ids
#: at most this many applied credit ids, as `operators.credit.apply_utility` keeps them
CREDIT_IDS_KEPT = LIMITS.max_credit_ids
#: default dedup tau per encoder: the lowest with almost no false merges on real text
#: (docs/design/2026-12-01-dedup-tau.md)
DEDUP_TAU_BY_ENCODER = {"minilm": 0.98, "minilm-static": 0.98, "hash": 0.95, "passthrough": 0.95}


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


class EventTimeWindows:
    """Which new memories the dedup job decides on next, by event time (pure, no clock).

    Per tenant: the **watermark** is the highest event time seen (``written`` and
    ``dropped`` events), and a new memory is *due* once its event time is at or below
    the watermark minus the allowed lateness. Due memories come out sorted by
    (event time, id), so the order the dedup job folds them in is a function of the
    stream, not of how the fetcher interleaved partitions or when a timer fired.
    Greedy oldest-first clustering (`plan_merges`) over a sequence cut anywhere gives
    the clustering of the whole sequence as long as every cut's rows are newer than
    what was decided before and see only that (the job's ANN search is bounded by
    `due`'s ``as_of``): so any batching gives the same merges.

    A memory that arrives after its tenant's watermark passed its event time plus the
    lateness (``late``) is decided with the next due rows, against memories newer than
    itself: it still becomes the survivor of its repeats (the oldest wins), but a chain
    of near-threshold repeats may fold differently than in event-time order.
    ``flush`` makes everything pending due (the job calls it when its input is idle:
    a processing-time timer deciding *when*, at the price above for rows later still).

    ``pos`` (the record's partition and offset) lets the job commit below the oldest
    record still pending (`low_offsets`), so a restart re-reads exactly those.
    """

    def __init__(self, lateness_ms: int) -> None:
        if lateness_ms < 0:
            raise ValueError(f"lateness_ms must be >= 0, got {lateness_ms}")
        self.lateness_ms = lateness_ms
        self.pending: dict[str, dict[str, tuple[int, Any]]] = {}  # tenant -> id -> (ts, pos)
        self.watermark: dict[str, int] = {}
        self.closed: dict[str, int] = {}  # tenant -> highest event time decided so far
        self.late = 0

    def __len__(self) -> int:
        return sum(len(p) for p in self.pending.values())

    def advance(self, tenant: str, event_ts: int) -> None:
        """An event time seen on `tenant`'s stream: the watermark moves up to it."""
        if event_ts > self.watermark.get(tenant, event_ts - 1):
            self.watermark[tenant] = event_ts

    def add(self, tenant: str, memory_id: str, event_ts: int, pos: Any = None) -> None:
        """A new memory to decide on (a repeat of a pending id keeps its first position)."""
        self.advance(tenant, event_ts)
        if event_ts <= self.closed.get(tenant, event_ts - 1):
            self.late += 1
        self.pending.setdefault(tenant, {}).setdefault(memory_id, (event_ts, pos))

    def remove(self, tenant: str, memory_id: str) -> None:
        self.pending.get(tenant, {}).pop(memory_id, None)

    def bound(self, tenant: str) -> int | None:
        """Event times at or below this are due (None: nothing seen yet)."""
        wm = self.watermark.get(tenant)
        return None if wm is None else wm - self.lateness_ms

    def has_due(self) -> bool:
        for tenant, p in self.pending.items():
            b = self.bound(tenant)
            if b is not None and any(ts <= b for ts, _ in p.values()):
                return True
        return False

    def due(self, tenant: str, flush: bool = False) -> list[tuple[int, str, int]]:
        """The due memories as (event time, id, as_of) in (event time, id) order; they
        leave the pending set. ``as_of`` bounds what a memory is compared with: the
        stored memories with event times up to it, which are those decided before
        (the newest event time decided so far, or its own when that is newer)."""
        p = self.pending.get(tenant, {})
        b = self.bound(tenant)
        out = sorted((ts, mid) for mid, (ts, _) in p.items()
                     if flush or (b is not None and ts <= b))  # fmt: skip
        for _, mid in out:
            del p[mid]
        if not p:
            self.pending.pop(tenant, None)
        closed = self.closed.get(tenant)
        res = []
        for ts, mid in out:
            closed = ts if closed is None else max(closed, ts)
            res.append((ts, mid, closed))
        if closed is not None:
            self.closed[tenant] = closed
        return res

    def low_offsets(self) -> dict[Any, int]:
        """pos -> the lowest offset still pending, per partition (``pos`` = (partition,
        offset)); partitions without pending records are absent."""
        low: dict[Any, int] = {}
        for p in self.pending.values():
            for _, pos in p.values():
                if pos is not None:
                    part, off = pos
                    low[part] = min(low.get(part, off), off)
        return low


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
        ids=seen_ids + folded,
        first_seen_ts=min(created, first),
        last_seen_ts=max(last, created),
        reward_min=r_lo,
        reward_max=r_hi,
    )
    meta["merge"] = merge
    if credit_ids:
        meta["credit_ids"] = credit_ids
    out["metadata"] = bounded_lists(meta)  # the newest ids within the row's budget
    for k in ("reward", "rpe", "rpe_smoothed", "gate", "utility"):
        if not math.isfinite(float(out[k])):  # pragma: no cover - inputs are finite
            out[k] = 0.0
    return out, folded
