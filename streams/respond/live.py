"""The write path as the live page sees it: bounded rings of MemoryEvents and dead letters.

The respond role holds the store (counts, search) but not the write role's gate:
a respond worker usually runs in another process than the write workers, and the
write workers' addresses are not known to it. What the gate decided is on the
``memories`` topic anyway: every `MemoryEvent` carries the route, the reason, the
gate score (``rpe_smoothed`` = ``max(extrinsic, w * intrinsic)``, the quantity the
gate thresholds) and the thresholds that decision used. So the page's gate data
come from a background consumer in each respond worker (`LiveFeed`) that reads the
``memories`` and ``deadletter`` topics into `LiveRing`, an in-memory bounded ring:

- Decisions: the newest ``per_tenant`` events of each of the ``max_tenants`` most
  recently active tenants (least recently active ring evicted first; its name stays
  in the known-tenant set, itself bounded). Memory is bounded by
  ``per_tenant * max_tenants`` small records (defaults 2,000 x 64: ~25 MB at worst).
- Dead letters: the newest ``max_dead`` (reason, stage, topic/partition/offset, key;
  never the original bytes). A dead letter has no trustworthy tenant, so only
  tokens for every tenant may read them (`streams.respond.ui`).
- ``forgotten`` events remove the memory's decisions from the ring, so the page
  does not keep showing what `dmem forget` deleted.

Why a consumer and not the write workers' ``/metrics``: it works for any number
of write workers wherever they run, and it has the per-decision reasons that the
metrics aggregate away. Why it does not slow search: it is one consumer without a
group (no rebalances) with a long fetch wait (``FETCH_WAIT_MS``); decoding and
keeping an event costs about twice its ``orjson.loads``; it yields after each
fetched batch (<= 2,000 records); searches run in worker threads;
and every page query copies a tenant's ring (at most ``per_tenant`` references,
0.1 ms) on the loop and summarises it in a worker thread. An idle stack, as in the
search benchmarks, pays only the two empty fetches a second.
MemoryEvents are at least once: after a write-worker crash a decision can show twice.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import orjson
from mode import Service

from schemas import DECISION_KINDS
from streams.auth import KafkaGuard
from streams.settings import Settings

log = logging.getLogger("dmem.live")

FETCH_WAIT_MS = 500
ROUTES = ("core", "buffer", "drop")


class Decision(NamedTuple):
    """One MemoryEvent as the page needs it (a tuple: cheap to build, ~20 per ms of loop)."""

    ts: int
    tenant: str
    memory_id: str
    agent_id: str | None
    kind: str
    route: str | None
    reason: str
    score: float | None
    theta_low: float | None
    theta_high: float | None
    reward: float | None

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Decision | None:
        """From a decoded MemoryEvent; None when it is not one."""
        ts, tenant, mid, kind = (data.get("ts"), data.get("tenant"), data.get("memory_id"),
                                 data.get("kind"))  # fmt: skip
        if not (isinstance(ts, int) and isinstance(tenant, str) and isinstance(mid, str)
                and isinstance(kind, str)):  # fmt: skip
            return None
        get = data.get
        return cls(ts, tenant, mid, get("agent_id"), kind, get("route"), get("reason") or "",
                   _num(get("rpe_smoothed")), _num(get("theta_low")), _num(get("theta_high")),
                   _num(get("reward")))  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        return {
            "ts": self.ts, "tenant": self.tenant, "memory_id": self.memory_id,
            "agent_id": self.agent_id, "kind": self.kind, "route": self.route,
            "reason": self.reason, "score": self.score, "theta_low": self.theta_low,
            "theta_high": self.theta_high, "reward": self.reward,
        }  # fmt: skip


def _num(v: Any) -> float | None:
    if v.__class__ is float:  # the usual case first: orjson gives float or int
        return v if math.isfinite(v) else None
    if v.__class__ is int:
        return float(v)
    return None


DEAD_FIELDS = ("ts", "reason", "error_type", "stage", "topic", "partition", "offset", "key")


class LiveRing:
    """Bounded memory of recent gate decisions per tenant and of dead letters.

    Plain state, no I/O: `LiveFeed` feeds it decoded records, the page's view reads
    summaries from it. Times are the events' own ``ts`` (the write worker's
    processing time, ms), never this process's clock.
    """

    def __init__(
        self,
        per_tenant: int = 2000,
        max_tenants: int = 64,
        max_dead: int = 200,
        max_known: int = 10_000,
    ) -> None:
        if per_tenant < 1 or max_tenants < 1 or max_dead < 1 or max_known < max_tenants:
            raise ValueError("ring sizes must be >= 1 and max_known >= max_tenants")
        self.per_tenant = per_tenant
        self.max_tenants = max_tenants
        self.max_known = max_known
        self.rings: OrderedDict[str, deque[Decision]] = OrderedDict()
        self.known: OrderedDict[str, int] = OrderedDict()  # tenant -> newest event ts
        self.dead: deque[dict[str, Any]] = deque(maxlen=max_dead)
        self.events_seen = 0
        self.dead_seen = 0
        self.undecodable = 0

    # ------------------------------------------------------------------ feeding

    def add_events(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Add decoded MemoryEvents (one fetched batch); ``forgotten`` ones remove."""
        forgotten: dict[str, set[str]] = {}
        for data in items:
            d = Decision.parse(data)
            if d is None:
                self.undecodable += 1
                continue
            self.events_seen += 1
            self._touch(d.tenant, d.ts)
            if d.kind == "forgotten":
                forgotten.setdefault(d.tenant, set()).add(d.memory_id)
                continue
            ring = self.rings.get(d.tenant)
            if ring is None:
                ring = self.rings[d.tenant] = deque(maxlen=self.per_tenant)
                while len(self.rings) > self.max_tenants:
                    self.rings.popitem(last=False)
            else:
                self.rings.move_to_end(d.tenant)
            ring.append(d)
        for tenant, ids in forgotten.items():  # one rebuild per tenant and batch
            ring = self.rings.get(tenant)
            if ring is not None:
                kept = [d for d in ring if d.memory_id not in ids]
                if len(kept) != len(ring):
                    self.rings[tenant] = deque(kept, maxlen=self.per_tenant)

    def _touch(self, tenant: str, ts: int) -> None:
        self.known[tenant] = max(ts, self.known.get(tenant, ts))
        self.known.move_to_end(tenant)
        while len(self.known) > self.max_known:
            self.known.popitem(last=False)

    def add_dead(self, items: Iterable[Mapping[str, Any]]) -> None:
        for data in items:
            if not isinstance(data, Mapping) or "reason" not in data:
                self.undecodable += 1
                continue
            self.dead_seen += 1
            row = {k: data.get(k) for k in DEAD_FIELDS}
            if isinstance(row["key"], str) and len(row["key"]) > 64:
                row["key"] = row["key"][:64] + "..."
            self.dead.append(row)

    # ------------------------------------------------------------------ reading

    def snapshot(self, tenant: str) -> list[Decision]:
        """A copy of one tenant's ring (cheap; summarise it off the event loop)."""
        ring = self.rings.get(tenant)
        return list(ring) if ring is not None else []

    def thresholds(self, tenant: str) -> tuple[float | None, float | None]:
        """(theta_low, theta_high) of the tenant's newest decision in the ring."""
        for d in reversed(self.rings.get(tenant) or ()):
            if d.kind in DECISION_KINDS and d.theta_high is not None:
                return d.theta_low, d.theta_high
        return None, None

    def dead_letters(self, limit: int) -> list[dict[str, Any]]:
        return list(self.dead)[-limit:][::-1]

    def stats(self) -> dict[str, Any]:
        return {"events_seen": self.events_seen, "dead_letters_seen": self.dead_seen,
                "undecodable": self.undecodable, "tenants_in_ring": len(self.rings),
                "tenants_known": len(self.known)}  # fmt: skip


def _quantile(sorted_vals: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of an ascending, non-empty sequence."""
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def histogram_top(sorted_scores: Sequence[float], theta_high: float | None) -> float:
    """Right edge of a gate-score histogram: max(2 x theta_high, 1.2 x q90).

    The region that matters is around the thresholds. A quantile-only axis fails
    both ways on sparse-reward streams: q99.5 is a rare +/-100 surprise (every
    mundane score lands in the first bin), q50 is ~0 (the thresholds fall off).
    """
    q90 = _quantile(sorted_scores, 0.9) if sorted_scores else 0.0
    return max(2.0 * (theta_high or 0.0), 1.2 * q90, 1e-6)


def gate_summary(
    decisions: Sequence[Decision], bins: int = 40, latest: int = 30, hist_bins: int = 30
) -> dict[str, Any]:
    """What the page plots for one tenant, from a ring snapshot (oldest first).

    - ``series``: ``bins`` equal time bins from the first to the last decision, each
      with the count per route, the q10/q50/q90/max of the gate score and the
      thresholds of the bin's last decision (empty bins are left out);
    - ``histogram``: the gate scores of the ring per route over ``hist_bins`` bins
      from 0 to `histogram_top` (scores beyond go into the last bin, counted in
      ``clipped``), with the current thresholds: the plotted quantity is the one the
      gate compares with them;
    - ``latest``: the newest ``latest`` events (decisions, promotions, merges...),
      newest first.
    """
    dec = [d for d in decisions if d.kind in DECISION_KINDS and d.score is not None]
    out: dict[str, Any] = {
        "decisions": len(dec),
        "routes": {r: sum(1 for d in dec if (d.route or "drop") == r) for r in ROUTES},
        "latest": [d.as_json() for d in list(decisions)[-latest:][::-1]],
        "series": [], "histogram": None, "theta_low": None, "theta_high": None,
        "first_ts": dec[0].ts if dec else None, "last_ts": dec[-1].ts if dec else None,
    }  # fmt: skip
    if not dec:
        return out
    cur = next((d for d in reversed(dec) if d.theta_high is not None), None)
    if cur is not None:
        out["theta_low"], out["theta_high"] = cur.theta_low, cur.theta_high
    t0, t1 = dec[0].ts, dec[-1].ts
    width = max((t1 - t0) / bins, 1.0)
    groups: dict[int, list[Decision]] = {}
    for d in dec:
        groups.setdefault(min(int((d.ts - t0) / width), bins - 1), []).append(d)
    for i in sorted(groups):
        g = groups[i]
        vals = sorted(float(d.score or 0.0) for d in g)
        last = g[-1]
        out["series"].append({
            "t0": int(t0 + i * width), "t1": int(t0 + (i + 1) * width), "n": len(g),
            "routes": {r: sum(1 for d in g if (d.route or "drop") == r) for r in ROUTES},
            "q10": _quantile(vals, 0.1), "q50": _quantile(vals, 0.5),
            "q90": _quantile(vals, 0.9), "max": vals[-1],
            "theta_low": last.theta_low, "theta_high": last.theta_high,
        })  # fmt: skip
    scores = sorted(float(d.score or 0.0) for d in dec)
    top = histogram_top(scores, out["theta_high"])
    step = top / hist_bins
    counts = {r: [0] * hist_bins for r in ROUTES}
    for d in dec:
        counts[d.route or "drop"][min(int(float(d.score or 0.0) / step), hist_bins - 1)] += 1
    out["histogram"] = {"edges": [i * step for i in range(hist_bins + 1)], "counts": counts,
                        "clipped": sum(1 for s in scores if s > top)}  # fmt: skip
    return out


class LiveFeed(Service):
    """Reads ``memories`` and ``deadletter`` into a `LiveRing` (no consumer group).

    Starts ``per_tenant`` records back on each memories partition (and ``max_dead``
    back on the dead-letter topic), so a restarted respond worker shows recent
    history at once. A broker outage only pauses it (aiokafka reconnects); a
    record that does not decode is counted, never fatal.
    """

    def __init__(self, settings: Settings, ring: LiveRing, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.guard = KafkaGuard.from_settings(settings)  # memory events the service signed
        self.ring = ring
        self.consumer: Any = None
        self.running = False
        self.error: str | None = None  # why it paused, for the log
        self.error_kind: str | None = None  # the same without its text, for the page

    async def on_start(self) -> None:
        self.add_future(self._run())

    async def on_stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()

    async def _assign(self) -> dict[str, str]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from streams.admin import kafka_client_kwargs

        s = self.settings
        topics = {s.topic("memories"): "memories", s.topic("deadletter"): "deadletter"}
        self.consumer = c = AIOKafkaConsumer(
            enable_auto_commit=False, fetch_max_wait_ms=FETCH_WAIT_MS,
            max_partition_fetch_bytes=1 << 20, **kafka_client_kwargs(s.kafka),
        )  # fmt: skip
        await c.start()
        await c._client.set_topics(list(topics))  # track exactly these topics' metadata
        await c._client.force_metadata_update()
        tps = [TopicPartition(t, p) for t in topics for p in sorted(c.partitions_for_topic(t)
                                                                     or ())]  # fmt: skip
        c.assign(tps)
        ends = await c.end_offsets(tps)
        begins = await c.beginning_offsets(tps)
        for tp in tps:
            back = self.ring.per_tenant if topics[tp.topic] == "memories" else self.ring.dead.maxlen
            c.seek(tp, max(begins[tp], ends[tp] - int(back or 0)))
        return topics

    async def _run(self) -> None:
        from streams.backoff import Backoff

        backoff = Backoff(0.5, 10.0)
        while not self.should_stop:
            try:
                topics = await self._assign()
                self.running, self.error, self.error_kind = True, None, None
                backoff.reset()
                while not self.should_stop:
                    batch = await self.consumer.getmany(timeout_ms=1000, max_records=2000)
                    for tp, msgs in batch.items():
                        if topics[tp.topic] == "memories":
                            msgs = [m for m in msgs if self.guard.internal_ok(
                                m.key, m.value, m.headers, "memory event")]  # fmt: skip
                        items = [x for x in (_loads(m.value) for m in msgs) if x is not None]
                        self.ring.undecodable += len(msgs) - len(items)
                        if topics[tp.topic] == "memories":
                            self.ring.add_events(items)
                        else:
                            self.ring.add_dead(items)
                    await asyncio.sleep(0)  # let searches in between batches
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the page must never take the worker down
                self.running, self.error = False, f"{type(exc).__name__}: {exc}"
                self.error_kind = type(exc).__name__
                log.warning("live feed paused (%s); retry in %.1fs", self.error, backoff.delay)
                if self.consumer is not None:
                    try:
                        await self.consumer.stop()
                    except Exception:  # noqa: BLE001
                        pass
                    self.consumer = None
                await backoff.wait()


def _loads(value: bytes | None) -> Any:
    try:
        data = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None
