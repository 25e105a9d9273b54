"""Decay (jobs role): demote, promote and evict by priority, within capacities.

Every ``decay_interval_s``, per tenant, `DecayEngine.decay`: refresh a slice of
the index, plan (`operators.decay.plan_decay`, O(n) numpy over the
index), re-read the chosen rows, act (move / delete, at most
``max_actions_per_pass``), one event per action. Ages are stream time (the
index's watermarks); the wall clock only decides when a pass runs and stamps
the events.

Cost of a pass for a tenant with n memories: O(n) vectorised arithmetic in
memory, plus Milvus I/O bounded by ``refresh_per_pass + 2 * max_actions_per_pass``
rows, independent of n.
"""

from __future__ import annotations

import time
from typing import Any

from operators.decay import CORE, TenantIndex, entry_from_row, plan_decay
from schemas import MemoryEvent
from streams.jobs.index import IndexedEngine
from streams.jobs.rows import WRITE_LOCK, get_bounded, memory_event, unique_rows

__all__ = ["DecayEngine"]


class DecayEngine(IndexedEngine):
    """Decay passes over the index (sync, runs in a worker thread)."""

    def decay(self, tenant: str, now: int, refresh: bool = True,
              hold: frozenset[str] = frozenset()) -> list[MemoryEvent]:  # fmt: skip
        """One decay pass for one tenant; bounded Milvus I/O (see module doc).

        `hold`: memories whose dedup is not decided yet (their event time is not due):
        no action on them, so whether a row is merged or evicted first does not depend
        on when the pass ran.

        Ages are the tenant's stream time (the index's watermarks); `now` only
        stamps the events (processing time). ``refresh=False`` (a settling pass)
        skips the round-robin re-read: it plans on the index the events keep
        current, so a pass with nothing to do costs no Milvus I/O.
        """
        t0 = time.perf_counter()
        t = self.index.tenant(tenant)
        touched = sorted(self.touched.pop(tenant, set()))
        self.refresh(tenant, touched + t.next_refresh(self.refresh_per_pass if refresh else 0))
        plan = plan_decay(t, self.policy)
        events: list[MemoryEvent] = []
        if hold:
            plan.actions = [a for a in plan.actions if a.memory_id not in hold]
        if plan.actions:
            chosen = [a.memory_id for a in plan.actions]
            rows = unique_rows(get_bounded(self.store, tenant, chosen, [
                "id", "tenant", "agent_id", "episode_id", "step", "reward", "rpe", "valence",
                "created_ts", "last_access_ts", "utility", "metadata"]))  # fmt: skip
            fresh = set()
            for mid in chosen:
                r = rows.get(mid)
                if r is None or r.get("tenant") != tenant:
                    t.remove(mid)
                else:
                    t.upsert(mid, entry_from_row(r))
                    fresh.add(mid)
            plan = plan_decay(t, self.policy)  # with the fresh values
            actions = [a for a in plan.actions if a.memory_id in fresh and a.memory_id not in hold]
            events = self._execute(tenant, t, actions, rows, now)
        self.last_deferred = plan.deferred
        ms = (time.perf_counter() - t0) * 1e3
        self.pass_samples.append((ms, len(t)))
        self._count("decay_passes")
        return events

    def _execute(self, tenant: str, t: TenantIndex, actions: list[Any],
                 rows: dict[str, dict[str, Any]], now: int) -> list[MemoryEvent]:  # fmt: skip
        demote = [a for a in actions if a.kind == "demoted"]
        promote = [a for a in actions if a.kind == "promoted"]
        evict = [a for a in actions if a.kind == "evicted"]
        with WRITE_LOCK:
            if demote:
                self.store.move([a.memory_id for a in demote], "buffer", tenant=tenant)
            if promote:
                self.store.move([a.memory_id for a in promote], "core", tenant=tenant)
            if evict:
                self.store.delete([a.memory_id for a in evict], tenant=tenant)
        events = []
        for a in demote + promote + evict:
            row = rows[a.memory_id]
            if a.kind == "evicted":
                t.remove(a.memory_id)
                part = a.partition
            else:
                part = "buffer" if a.kind == "demoted" else "core"
                t.set_partition(a.memory_id, 1 if part == "buffer" else CORE)
            events.append(memory_event(a.kind, row, part, f"{a.reason} p={a.priority:.4f}", now))
            self._count(a.kind)
            self._count(f"{a.kind}:{a.reason}")
        return events
