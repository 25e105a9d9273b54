"""The maintenance engine's priority index (jobs role).

On start, one scan of the collection's scalar fields builds an in-memory
columnar index per tenant (`operators.decay.PriorityIndex`, about 60 bytes
of arrays + one dict slot per memory). From then on the ``memories`` topic keeps
it current: ``written`` adds, ``merged``/``evicted``/``forgotten`` remove,
``moved``/``promoted``/``demoted`` change the partition. Values written by other
processes (utility from the credit applier, access counts from the responders)
reach it through a round-robin refresh of ``refresh_per_pass`` rows per pass,
and every row is re-read just before an action is taken on it.

The index also keeps the stream clocks: the watermark of every clock (per
tenant and agent, or per tenant), advanced by the bootstrap scan and by the
``event_ts`` of every ``written``/``dropped`` event. Ages are measured on them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from milvus import MemoryStore
from operators.decay import Entry, MaintenancePolicy, PriorityIndex, entry_from_row
from schemas import DECISION_KINDS, MemoryEvent
from streams.jobs.rows import MOVED, REMOVED, SCAN_FIELDS, get_bounded, unique_rows

__all__ = ["IndexedEngine"]


class IndexedEngine:
    """The index part of the maintenance engine: the per-tenant priority index, built by
    one scan on start and kept current from ``memories`` events and bounded re-reads.

    Sync (runs in a worker thread); `DedupEngine` and `DecayEngine` act on it.
    """

    def __init__(
        self,
        store: MemoryStore,
        policy: MaintenancePolicy,
        *,
        dedup_k: int = 8,
        refresh_per_pass: int = 2000,
    ) -> None:
        self.store = store
        self.policy = policy
        self.dedup_k = dedup_k
        self.refresh_per_pass = refresh_per_pass
        self.index = PriorityIndex(per_agent_clock=policy.clock == "agent")
        self.counters: dict[str, int] = {}
        self.touched: dict[str, set[str]] = {}  # tenant -> ids to re-read next pass
        self.last_deferred = 0  # actions the last pass left for the next one
        self.pass_samples: deque[tuple[float, int]] = deque(maxlen=512)  # (ms, memories)

    def _count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    # -- index ---------------------------------------------------------------------
    def bootstrap(self, tenant: str | None = None) -> int:
        """One scan of the scalar fields into the index (on start only)."""
        n = 0
        for row in self.store.scan(tenant=tenant, output_fields=SCAN_FIELDS, batch_size=4096):
            self.index.upsert(str(row["tenant"]), str(row["id"]), entry_from_row(row))
            n += 1
        return n

    def observe(self, ev: MemoryEvent) -> bool:
        """Keep the index and the stream clocks current from one ``memories`` event;
        True when something a decay plan depends on changed.

        The clocks (watermarks) advance with the event time of every ``written``
        and ``dropped`` event: a dropped transition is stream time seen too.
        """
        changed = False
        if ev.kind in DECISION_KINDS and ev.event_ts is not None:
            changed = self.index.tenant(ev.tenant).advance(ev.agent_id, ev.event_ts)
        if ev.kind == "written" and ev.partition is not None and ev.event_ts is not None:
            t = self.index.tenant(ev.tenant)
            if ev.memory_id not in t:  # approximate until the dedup window reads the row
                ts = ev.event_ts  # (an event without one waits for the row: its ``ts`` is
                # processing time, which must never reach a clock)
                t.upsert(ev.memory_id, Entry(0 if ev.partition == "core" else 1, ts, ts,
                                             max(abs(ev.rpe or 0.0), ev.rpe_smoothed or 0.0),
                                             0.0, 0, ts, ev.agent_id or ""))  # fmt: skip
                changed = True
        elif ev.kind in REMOVED:
            changed = self.index.remove(ev.tenant, ev.memory_id) or changed
        elif ev.kind in MOVED and ev.partition is not None:
            changed = self.index.set_partition(ev.tenant, ev.memory_id, ev.partition) or changed
        return changed

    def touch(self, keys: Iterable[tuple[str, str]]) -> None:
        """(tenant, id)s whose row another writer of this process changed (utility,
        access counts): re-read by the next pass instead of waiting for the round robin."""
        for tenant, mid in keys:
            self.touched.setdefault(tenant, set()).add(mid)

    def refresh(self, tenant: str, ids: Sequence[str]) -> set[str]:
        """Re-read `ids` into the index; ids gone from Milvus leave it. Returns those found."""
        if not ids:
            return set()
        rows = unique_rows(get_bounded(self.store, tenant, list(ids), SCAN_FIELDS))
        t = self.index.tenant(tenant)
        found = set()
        for mid in ids:
            row = rows.get(mid)
            if row is None or row.get("tenant") != tenant:
                t.remove(mid)
            else:
                t.upsert(mid, entry_from_row(row))
                found.add(mid)
        return found
