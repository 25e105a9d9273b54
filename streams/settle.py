"""Settling: how each component of a worker measures its pending work (``/health``).

After input stops, the write path, the hindsight agent, the credit job, the
maintenance job and the access flusher each reach a fixed point; every one
registers ``async () -> {"settled": bool, "pending": {...}}`` in
`streams.context.RoleContext.settle`, ``/health`` reports them all and
``settled`` (none pending anywhere in the process), and ``dmem wait --settled``
polls that. Unread input counts as pending: a consumer's backlog is its
high-water marks minus its positions (or its commits).
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["backlog"]


async def backlog(consumer: Any, done: Any = None) -> int | None:
    """Records of `consumer`'s assigned partitions not yet read (high-water mark minus
    position), or not yet committed when `done` (``{tp: next offset}``) is given; works
    for aiokafka's consumer and faust's. None while not known (no fetch answered yet)."""
    if consumer is None:
        return None
    total = 0
    for tp in consumer.assignment():
        high = consumer.highwater(tp)
        if high is None:
            return None
        if done is not None:
            pos = done.get(tp) or 0
        else:
            try:
                pos = await asyncio.wait_for(consumer.position(tp), 1.0)
            except Exception:  # noqa: BLE001 - rebalancing / no position yet
                return None
        total += max(int(high) - int(pos), 0)
    return total
