"""Inspecting a tenant (``dmem inspect``): counts, distributions, recent maintenance.

Operator tools, not part of a running role: `inspect_tenant` scans the tenant
once (O(n)) and shows what the next decay pass would do; `recent_events` reads
the tail of ``dmem.memories``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from milvus import MemoryStore
from operators.decay import (
    PART_NAME,
    MaintenancePolicy,
    TenantIndex,
    entry_from_row,
    plan_decay,
    tenant_priorities,
)
from streams.admin import ReadEnds, kafka_client_kwargs, topic_partitions
from streams.jobs.rows import SCAN_FIELDS, unique_rows
from streams.settings import Settings

__all__ = ["inspect_tenant", "recent_events"]


async def recent_events(
    settings: Settings, tenant: str, kinds: Sequence[str] = ("merged", "evicted", "demoted",
    "promoted", "forgotten"), per_partition: int = 5000, limit: int = 20,
) -> list[dict[str, Any]]:  # fmt: skip
    """The latest maintenance events of `tenant` from the tail of ``dmem.memories``.

    The consumer is closed on every path, a failed or cancelled start included."""
    c = AIOKafkaConsumer(enable_auto_commit=False, **kafka_client_kwargs(settings.kafka))
    out: list[dict[str, Any]] = []
    try:
        await c.start()
        name = settings.topic("memories")
        tps = [TopicPartition(name, p) for p in sorted(await topic_partitions(c, name))]
        if not tps:
            return []
        c.assign(tps)
        ends = await c.end_offsets(tps)
        read_ends = ReadEnds(ends)
        begins = await c.beginning_offsets(tps)
        for tp in tps:
            c.seek(tp, max(begins[tp], ends[tp] - per_partition))
        todo = {tp for tp in tps if ends[tp] > begins[tp]}
        while todo:
            batch = await c.getmany(timeout_ms=1000, max_records=5000)
            if not batch:
                break
            for tp, msgs in batch.items():
                for m in msgs:
                    try:
                        ev = orjson.loads(m.value)
                    except orjson.JSONDecodeError:
                        continue
                    if ev.get("tenant") == tenant and ev.get("kind") in kinds:
                        out.append(ev)
                    if m.offset >= read_ends.of(c, tp) - 1:
                        todo.discard(tp)
    finally:
        await c.stop()
    out.sort(key=lambda e: (e.get("ts", 0), e.get("memory_id", "")))
    return out[-limit:]


def _quantiles(xs: np.ndarray) -> dict[str, float | None]:
    if xs.size == 0:
        return {k: None for k in ("min", "p50", "p90", "p99", "max")}
    q = np.percentile(xs, [0, 50, 90, 99, 100])
    return {k: round(float(v), 4) for k, v in zip(("min", "p50", "p90", "p99", "max"), q,
                                                   strict=True)}  # fmt: skip


def inspect_tenant(store: MemoryStore, tenant: str, policy: MaintenancePolicy,
                   top: int = 10) -> dict[str, Any]:  # fmt: skip
    """Counts, age/priority distributions, top memories, and what the next pass would do.

    Scans the tenant once (an operator tool, O(n)). Ages are stream time as the
    jobs measure them, with the clocks derived from the stored rows (the newest
    stored event time per clock; the running job has also seen dropped ones).
    """
    fields = [*SCAN_FIELDS, "text", "action", "merged_count", "uses", "valence"]
    rows = list(unique_rows(store.scan(tenant=tenant, output_fields=fields)).values())
    t = TenantIndex(per_agent_clock=policy.clock == "agent")
    for r in rows:
        t.upsert(str(r["id"]), entry_from_row(r))
    by_id = {str(r["id"]): r for r in rows}
    p, _ = tenant_priorities(t, policy)
    v = t.view()
    age_s = (t.stream_now() - v["created_ts"]) / 1000.0
    out: dict[str, Any] = {
        "tenant": tenant,
        "stream_time_ms": t.stream_time(),
        "clock": policy.clock,
        "counts": {"core": store.count("core", tenant), "buffer": store.count("buffer", tenant)},
        "age_s": {"all": _quantiles(age_s)},
        "priority": {"all": _quantiles(p)},
        "merged_rows": int(sum(1 for r in rows if int(r.get("merged_count", 1)) > 1)),
        "merged_total": int(sum(int(r.get("merged_count", 1)) - 1 for r in rows)),
    }
    for code, name in enumerate(PART_NAME):
        sel = v["partition"] == code
        out["age_s"][name] = _quantiles(age_s[sel])
        out["priority"][name] = _quantiles(p[sel])
    order = np.argsort(-p, kind="stable")[:top]
    out["top"] = [
        {
            "id": t.ids[i],
            "partition": PART_NAME[int(v["partition"][i])],
            "priority": round(float(p[i]), 4),
            "rpe": round(float(by_id[t.ids[i]].get("rpe", 0.0)), 4),
            "utility": round(float(by_id[t.ids[i]].get("utility", 0.0)), 4),
            "merged_count": int(by_id[t.ids[i]].get("merged_count", 1)),
            "hits": int(v["hits"][i]),
            "agent_id": by_id[t.ids[i]].get("agent_id"),
            "action": by_id[t.ids[i]].get("action"),
            "text": str(by_id[t.ids[i]].get("text", ""))[:120],
        }
        for i in order
    ]
    plan = plan_decay(t, policy)
    next_pass: dict[str, int] = {}
    for a in plan.actions:
        next_pass[f"{a.kind}:{a.reason}"] = next_pass.get(f"{a.kind}:{a.reason}", 0) + 1
    out["next_pass"] = next_pass
    out["capacity"] = {"core": policy.core_capacity, "buffer": policy.buffer_capacity}
    return out
