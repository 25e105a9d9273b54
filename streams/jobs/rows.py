"""Row helpers shared by the maintenance jobs: the write lock, bounded reads, events.

Milvus has no partial updates, so a merge, a move or an access flush is a
read-modify-write of the row; the writers of `streams.jobs` (the credit applier
included) share one process-wide lock (`WRITE_LOCK`), and a merge re-reads its
rows under it, so a credit or an access count written since the merge planned
is folded into the survivor, not overwritten.

Memory ids are unique per tenant only, so every store call names the tenant:
no job ever reaches another tenant's row with the same id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from milvus import MemoryStore
from operators.decay import MaintenancePolicy
from operators.dedup import DEDUP_TAU_BY_ENCODER
from schemas import MemoryEvent
from streams.settings import Settings
from streams.store import WRITE_LOCK as STORE_WRITE_LOCK

__all__ = [
    "MOVED",
    "REMOVED",
    "SCAN_FIELDS",
    "WRITE_LOCK",
    "dedup_tau",
    "get_bounded",
    "memory_event",
    "policy_from",
    "unique_rows",
]

#: one writer at a time for the read-modify-writes of `streams.jobs`, per process
WRITE_LOCK = STORE_WRITE_LOCK  # the write path's edits of stored rows take it too
SCAN_FIELDS = [
    "id",
    "tenant",
    "agent_id",
    "created_ts",
    "last_access_ts",
    "rpe",
    "rpe_smoothed",
    "utility",
    "uses",
    "metadata",
]
REMOVED = ("merged", "evicted", "forgotten")
MOVED = ("moved", "promoted", "demoted")


def policy_from(settings: Settings) -> MaintenancePolicy:
    m = settings.maintenance
    return MaintenancePolicy(
        tau=dedup_tau(settings),
        reward_tol=m.dedup_reward_tol,
        half_life_ms=m.half_life_s * 1000.0,
        utility_weight=m.utility_weight,
        access_weight=m.access_weight,
        access_half_life_ms=m.access_half_life_s * 1000.0,
        buffer_floor=m.buffer_floor,
        buffer_ttl_ms=int(m.buffer_ttl_s * 1000),
        demote_below=m.demote_below,
        promote_above=m.promote_above,
        core_capacity=m.core_capacity,
        buffer_capacity=m.buffer_capacity,
        max_actions=m.max_actions_per_pass,
        clock=m.stream_clock,
        span_factor=m.span_factor,
    )


def dedup_tau(settings: Settings) -> float:
    """``DMEM_MAINTENANCE__DEDUP_TAU``, or the encoder's default (`DEDUP_TAU_BY_ENCODER`)."""
    tau = settings.maintenance.dedup_tau
    return tau if tau is not None else DEDUP_TAU_BY_ENCODER.get(settings.encoder.name, 0.95)


def unique_rows(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        out.setdefault(str(r["id"]), r)
    return out


def memory_event(kind: str, row: dict[str, Any], partition: str | None, reason: str,
           now: int) -> MemoryEvent:  # fmt: skip
    return MemoryEvent.model_validate(
        {
            "kind": kind,
            "memory_id": str(row["id"]),
            "tenant": str(row["tenant"]),
            "agent_id": row.get("agent_id") or None,
            "episode_id": row.get("episode_id") or None,
            "step": row.get("step"),
            "partition": partition,
            "reward": row.get("reward"),
            "rpe": row.get("rpe"),
            "valence": row.get("valence"),
            "reason": reason,
            "ts": now,
        }
    )


def get_bounded(store: MemoryStore, tenant: str, ids: Sequence[str],
                fields: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    """``tenant``'s rows by id with Bounded consistency (no wait for the next time
    tick), then a Strong read of the ids that were not found (they may be just written).

    Used for the index refresh and the re-read before acting: a value updated
    in the last moment may be missed and is seen by a later pass.
    """
    out = store.get(ids, tenant=tenant, output_fields=fields, consistency_level="Bounded")
    missing = set(ids) - {str(r["id"]) for r in out}
    if missing:
        out += store.get(sorted(missing), tenant=tenant, output_fields=fields)
    return out
