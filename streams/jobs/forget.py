"""Forgetting a scope (``dmem forget``, ``POST /v1/forget``): delete and audit.

`forget_scope` deletes one memory, one agent's memories or a whole tenant's,
tombstoned under the store's exclusive guard so no write in flight brings them
back. One memory named by an id dedup folded into another is its survivor: reads of
that id answer with the survivor's row (`streams.respond.browse`), which holds its
content now, so forgetting the id forgets the survivor (and with it every id folded
into it); a forget that deleted nothing while the id still read back would leave
what the user asked to be forgotten in place. `emit_events` publishes the
``forgotten`` events on ``memories`` (the audit trail) and on ``control``, from which
every process that caches rows clears its state (`streams.control`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer

from milvus import MemoryStore
from schemas import MemoryEvent, encode
from schemas.errors import DmemError, InvalidRecord, ServiceUnavailable
from streams.admin import kafka_client_kwargs
from streams.auth import KafkaGuard
from streams.clock import now_ms
from streams.jobs.rows import memory_event, unique_rows
from streams.respond.browse import MAX_HOPS
from streams.settings import Settings

__all__ = ["FORGET_FIELDS", "ForgetIncomplete", "emit_events", "forget_scope", "survivor"]

FORGET_FIELDS = ["id", "tenant", "agent_id", "episode_id", "step", "reward", "rpe", "valence"]


def forget_scope(
    store: MemoryStore, tenant: str, agent_id: str | None = None, memory_id: str | None = None,
    now: int | None = None, rounds: int = 5,
) -> list[MemoryEvent]:  # fmt: skip
    """Delete every memory of the scope; returns one ``forgotten`` event per deleted row.

    Repeats (up to `rounds`) until the scope is empty, so rows written while it
    ran are caught too. An empty ``agent_id`` or ``memory_id`` is refused
    (`InvalidRecord`): read as "no agent" it would widen the scope to the whole tenant.
    """
    if agent_id == "" or memory_id == "":
        raise InvalidRecord("forget: an empty agent or memory id names no scope (omit it "
                            "to forget more)")  # fmt: skip
    now = now or now_ms()
    events: list[MemoryEvent] = []
    target = memory_id
    if memory_id is not None and not _rows_of(store, tenant, memory_id, agent_id):
        target = survivor(store, tenant, memory_id) or memory_id
    scope = f"tenant={tenant}" + (f" agent={agent_id}" if agent_id else "") + (
        f" memory={memory_id}" if memory_id else "") + (
        f" (folded into {target})" if target != memory_id else "")  # fmt: skip
    # the named id too when it stands for its survivor: a replay or a re-publish of it
    # (its id is stable) must not store again what the user asked to forget
    named = [memory_id] if memory_id is not None and target != memory_id else []
    try:
        for _ in range(rounds):
            if target is not None:
                rows = _rows_of(store, tenant, target, agent_id)
            else:
                extra = {"agent_id": agent_id} if agent_id else None
                rows = list(store.scan(tenant=tenant, extra_filter=extra,
                                       output_fields=FORGET_FIELDS))  # fmt: skip
            found = unique_rows(rows)
            if not found:
                break
            # tombstoned under the store's exclusive guard: no write in flight (this
            # module's read-modify-writes included) can bring them back
            store.forget(sorted([*found, *named]), tenant=tenant, at=now / 1000.0)
            named = []
            events += [memory_event("forgotten", r, r.get("partition"), f"forget {scope}", now)
                       for r in found.values()]  # fmt: skip
    except DmemError as exc:
        if events:  # deleted already: their audit trail and notices must still go out
            raise ForgetIncomplete(exc, events) from exc
        raise
    return events


class ForgetIncomplete(ServiceUnavailable):
    """The store failed after some rows of the scope were deleted: ``events`` are
    theirs, to be emitted as every forget's are; calling the forget again is safe."""

    def __init__(self, cause: DmemError, events: list[MemoryEvent]) -> None:
        super().__init__(f"{cause}; {len(events)} memories were forgotten before it, "
                         "forget again for the rest")  # fmt: skip
        self.events = events


def _rows_of(store: MemoryStore, tenant: str, memory_id: str,
             agent_id: str | None) -> list[dict[str, Any]]:  # fmt: skip
    """The stored rows of one memory of the tenant (and agent, where given)."""
    return [r for r in store.get([memory_id], tenant=tenant, output_fields=FORGET_FIELDS,
                                 include_forgotten=True)
            if r.get("tenant") == tenant
            and (agent_id is None or r.get("agent_id") == agent_id)]  # fmt: skip


def survivor(store: MemoryStore, tenant: str, memory_id: str) -> str | None:
    """The stored memory ``memory_id`` was folded into, along its chain of folds (at
    most `MAX_HOPS`, as reads follow them); None when it was never folded or its
    survivor is gone too."""
    c = memory_id
    for _ in range(MAX_HOPS):
        into = store.history.folded_into(tenant, [c], "Strong").get(c)
        if into is None:
            return None
        if store.get([into], tenant=tenant, output_fields=["id"]):
            return into
        c = into
    return None


async def emit_events(settings: Settings, events: Sequence[MemoryEvent]) -> None:
    producer = AIOKafkaProducer(linger_ms=5, **kafka_client_kwargs(settings.kafka))
    guard = KafkaGuard.from_settings(settings)
    await producer.start()
    try:
        topic, control = settings.topic("memories"), settings.topic("control")
        for ev in events:
            value, key, tkey = encode(ev), ev.memory_id.encode(), ev.tenant.encode()
            await producer.send(topic, value, key=key, headers=guard.sign(key, value))
            if ev.kind == "forgotten":  # write workers clear their state from `control`
                await producer.send(control, value, key=tkey, headers=guard.sign(tkey, value))
        await producer.flush()
    finally:
        await producer.stop()
