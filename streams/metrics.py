"""Prometheus metrics for every worker role, served at ``GET /metrics`` on the faust web server.

One module-level registry (`REGISTRY`) holds every dmem metric; `install_metrics`
adds the ``/metrics`` page to a faust app (text exposition format 0.0.4).

Two kinds of metric:
- event metrics, updated where the event happens (the write consumer calls
  `record_batch` once per micro-batch and times its Milvus upserts with
  `milvus_timer`): gate decisions, dead letters, Milvus latency, thresholds;
- state metrics, refreshed from the process's `RoleContext` on each scrape
  (`refresh`): smoothed-RPE quantiles of each tenant's gate sketch (merged over the
  tenant's input partitions held by the worker: `tenant_sketch`), the value
  model's last TD loss, store health, consumer lag of the partitions assigned
  to this worker, and Milvus partition sizes (cached for ``SIZE_TTL_S``,
  a count is a query).

Names and labels (all prefixed ``dmem_``):

| metric | type | labels |
|---|---|---|
| gate_decisions_total | counter | route (core/buffer/drop), tenant |
| gate_rpe | gauge | tenant, name (theta_low, theta_high, q50, q90, q99) |
| value_loss | gauge | tenant |
| milvus_latency_seconds | histogram | op (write, search) |
| dead_letters_total | counter | reason (short category, see `reason_category`) |
| consumer_lag | gauge | topic, partition |
| credit_updates_applied_total | counter | tenant |
| memories | gauge | partition (core, buffer) |
| store_healthy / store_failures | gauge | |
| batches_total / records_total | counter | |

Consumer lag: for each assigned partition of faust's consumer and of the
consumers registered in ``RoleContext.consumers`` (the write consumer),
high-water mark minus the committed offset (all of the partition counts as lag
before the group's first commit). The respond and jobs roles' own aiokafka
consumers are not included.
Tenants are labels, so very many tenants mean many series: keep tenant ids a
bounded set (they are ids, not user input).

``/metrics`` needs no token (scrapers), so by default it does not name tenants:
the ``tenant`` label is ``t-`` and 12 hex digits of a BLAKE2b hash of the tenant id
(``metrics_tenant_labels=hash``; `tenant_label` computes it, and ``GET /v1/stats``
returns a tenant's own label to its token). A hash hides names from whoever reads
the page, but a guessed name can be confirmed: ``none`` drops the tenant from the
labels (one series for all), ``name`` keeps the ids where only trusted scrapers
reach the port.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import math
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from schemas import DECISION_KINDS

if TYPE_CHECKING:
    from streams.context import RoleContext

log = logging.getLogger("dmem.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4"
SIZE_TTL_S = 15.0
QUANTILES = (("q50", 0.5), ("q90", 0.9), ("q99", 0.99))

REGISTRY = CollectorRegistry(auto_describe=True)

#: how the ``tenant`` label is written: "hash" (default), "name" or "none"
#: (`install_metrics` sets it from the settings of the process)
TENANT_LABELS = ["hash"]


def tenant_label(tenant: str, mode: str | None = None) -> str:
    """The ``tenant`` label value of a tenant id (see the module doc)."""
    mode = mode or TENANT_LABELS[0]
    if mode == "name":
        return tenant
    if mode == "none":
        return "*"
    return "t-" + hashlib.blake2b(tenant.encode(), digest_size=6).hexdigest()


class _ByTenant:
    """A labelled metric whose ``tenant`` label goes through `tenant_label`."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric

    def labels(self, **labels: str) -> Any:
        if "tenant" in labels:
            labels["tenant"] = tenant_label(labels["tenant"])
        return self.metric.labels(**labels)


GATE_DECISIONS = _ByTenant(Counter(
    "dmem_gate_decisions",
    "Write-path gate decisions by route",
    ["route", "tenant"],
    registry=REGISTRY,
))  # fmt: skip
GATE_RPE = _ByTenant(Gauge(
    "dmem_gate_rpe",
    "Current gate thresholds and smoothed |RPE| quantiles of each tenant's sketch",
    ["tenant", "name"],
    registry=REGISTRY,
))  # fmt: skip
VALUE_LOSS = _ByTenant(Gauge(
    "dmem_value_loss",
    "Last TD (Huber) loss of the tenant's value model",
    ["tenant"],
    registry=REGISTRY,
))  # fmt: skip
MILVUS_LATENCY = Histogram(
    "dmem_milvus_latency_seconds",
    "Milvus call latency (write: one acknowledged batch upsert, retries included)",
    ["op"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "dmem_dead_letters",
    "Records sent to the dead-letter topic, by reason category",
    ["reason"],
    registry=REGISTRY,
)
CONSUMER_LAG = Gauge(
    "dmem_consumer_lag",
    "High-water mark minus committed offset, per assigned partition",
    ["topic", "partition"],
    registry=REGISTRY,
)
CREDIT_UPDATES = _ByTenant(Counter(
    "dmem_credit_updates_applied",
    "Utility updates (credit) applied to memories",
    ["tenant"],
    registry=REGISTRY,
))  # fmt: skip
PARTITION_SIZE = Gauge(
    "dmem_memories",
    "Rows in each Milvus partition of the collection",
    ["partition"],
    registry=REGISTRY,
)
STORE_HEALTHY = Gauge(
    "dmem_store_healthy", "1 when the last Milvus call or probe succeeded", registry=REGISTRY
)
STORE_FAILURES = Gauge(
    "dmem_store_failures", "Failed Milvus calls since start (retried)", registry=REGISTRY
)
BATCHES = Counter("dmem_batches", "Write-path micro-batches processed", registry=REGISTRY)
RECORDS = Counter("dmem_records", "Write-path records consumed", registry=REGISTRY)

# Short, bounded reason categories; the full text stays in the DeadLetter record.
_REASONS: tuple[tuple[str, str], ...] = (
    ("malformed json", "malformed_json"),
    ("unsupported schema_version", "schema_version"),
    ("schema_version", "schema_version"),
    ("tombstone", "empty"),
    ("empty record", "empty"),
    ("differ in dimension", "vector_dim"),
    ("vector dim", "vector_dim"),
    ("passthrough encoder", "vector_dim"),
    ("finite", "non_finite"),
    ("at most", "too_large"),
    ("invalid record", "invalid_record"),
    ("unauthenticated", "unauthenticated"),
)


def count_dead_letter(dl: Any) -> None:
    """One dead letter in ``dmem_dead_letters_total``, whichever role wrote it."""
    DEAD_LETTERS.labels(reason=reason_category(dl.reason)).inc()


def reason_category(reason: str) -> str:
    """Map a dead letter's free-text reason to a short, bounded label value."""
    low = reason.lower()
    for needle, cat in _REASONS:
        if needle in low:
            return cat
    return "other"


@contextmanager
def milvus_timer(op: str) -> Iterator[None]:
    """Observe the wall time of a Milvus call into ``dmem_milvus_latency_seconds{op}``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        MILVUS_LATENCY.labels(op=op).observe(time.perf_counter() - t0)


def record_batch(
    events: Iterable[Any],
    dead: Iterable[Any],
    n_records: int = 0,
    write_s: float | None = None,
) -> None:
    """Count one write-path batch: gate routes per tenant, dead letters, thresholds.

    ``events`` are `MemoryEvent`s, ``dead`` the ``(key, DeadLetter)`` pairs of a
    `BatchResult`. The thresholds gauges take the last event of each tenant.
    ``write_s`` is the time the batch's Milvus upserts took until acknowledged
    (observed only when the batch wrote something).
    """
    last: dict[str, Any] = {}
    wrote = False
    # one inc per (route, tenant), not per event
    routes: collections.Counter[tuple[str, str]] = collections.Counter()
    for ev in events:
        if ev.kind not in DECISION_KINDS:  # not a gate decision (an eviction)
            continue
        routes[(ev.route or "none", ev.tenant)] += 1
        last[ev.tenant] = ev
        wrote = wrote or ev.kind == "written"
    for (route, tenant), n in routes.items():
        GATE_DECISIONS.labels(route=route, tenant=tenant).inc(n)
    if write_s is not None and wrote:
        MILVUS_LATENCY.labels(op="write").observe(write_s)
    for tenant, ev in last.items():
        if ev.theta_low is not None:
            GATE_RPE.labels(tenant=tenant, name="theta_low").set(ev.theta_low)
        if ev.theta_high is not None:
            GATE_RPE.labels(tenant=tenant, name="theta_high").set(ev.theta_high)
    for item in dead:
        count_dead_letter(item[1] if isinstance(item, tuple) else item)
    BATCHES.inc()
    RECORDS.inc(n_records)


def _refresh_pipeline(pipeline: Any) -> None:
    for tenant, st in list(getattr(pipeline, "tenants", {}).items()):
        loss = getattr(st, "last_loss", None)
        if loss is not None and math.isfinite(loss):
            VALUE_LOSS.labels(tenant=tenant).set(loss)
        sketch = tenant_sketch(pipeline, tenant, st)
        if sketch is None:
            continue
        for name, q in QUANTILES:
            v = sketch.quantile(q)
            if math.isfinite(v):
                GATE_RPE.labels(tenant=tenant, name=name).set(v)


def tenant_sketch(pipeline: Any, tenant: str, first: Any) -> Any:
    """The gate-score sketch of a tenant over every state of it this worker holds (one
    per input partition its agents' records came in on; ``first``: its lowest), merged
    into a copy; a tenant whose chat and rewarded agent hash to two partitions has two
    gates, and the lowest alone would describe only one of them."""
    of_tenant = getattr(pipeline, "of_tenant", None)
    states = of_tenant(tenant) if of_tenant is not None else [first]
    sketches = [
        sk
        for st in states
        if (sk := getattr(getattr(st, "gate_state", None), "sketch", None)) is not None
    ]
    if len(sketches) <= 1:
        return sketches[0] if sketches else None
    merged = type(sketches[0]).from_dict(sketches[0].to_dict())
    for other in sketches[1:]:
        merged.merge(other)
    return merged


def _refresh_lag(app: Any, ctx: RoleContext) -> None:
    # faust's own consumer (never create one just to scrape) with the committed
    # offsets it keeps, and the plain aiokafka consumers the roles registered
    faust_consumer = getattr(app, "_consumer", None)
    pairs = [(faust_consumer, getattr(faust_consumer, "_committed_offset", {}))]
    pairs += [get() for get in ctx.consumers]
    for consumer, committed in pairs:
        if consumer is None:
            continue
        for tp in consumer.assignment():
            try:
                high = consumer.highwater(tp)
            except Exception:  # noqa: BLE001 - not fetched yet / rebalancing
                continue
            if high is None:
                continue
            done = committed.get(tp) or 0
            CONSUMER_LAG.labels(topic=tp.topic, partition=str(tp.partition)).set(
                max(high - done, 0)
            )


class _Sizes:
    at = 0.0


async def _refresh_sizes(store_service: Any) -> None:
    store = getattr(store_service, "store", None)
    if store is None or not getattr(store_service, "healthy", False):
        return
    if time.monotonic() - _Sizes.at < SIZE_TTL_S:
        return
    _Sizes.at = time.monotonic()
    for part in ("core", "buffer"):
        try:
            n = await asyncio.wait_for(asyncio.to_thread(store.count, part), timeout=5.0)
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail on a slow store
            log.debug("partition size of %s unavailable: %s", part, exc)
            return
        PARTITION_SIZE.labels(partition=part).set(n)


async def refresh(app: Any, ctx: RoleContext) -> None:
    """Update the state metrics from the process's live objects (called per scrape)."""
    if ctx.pipeline is not None:
        _refresh_pipeline(ctx.pipeline)
    store = ctx.store
    await store.probe()
    STORE_HEALTHY.set(1.0 if store.healthy else 0.0)
    STORE_FAILURES.set(store.failures)
    try:
        _refresh_lag(app, ctx)
    except Exception as exc:  # noqa: BLE001 - lag is best effort
        log.debug("consumer lag unavailable: %s", exc)
    await _refresh_sizes(store)


def exposition() -> bytes:
    """The registry in Prometheus text format."""
    return generate_latest(REGISTRY)


def install_metrics(app: Any, ctx: RoleContext) -> None:
    """Add ``GET /metrics`` (Prometheus text format) to the faust app."""
    TENANT_LABELS[0] = ctx.settings.metrics_tenant_labels

    @app.page("/metrics")
    async def metrics_page(web: Any, request: Any) -> Any:
        await refresh(app, ctx)
        return web.bytes(exposition(), content_type=CONTENT_TYPE)

    _ = metrics_page
