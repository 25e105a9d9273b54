"""Exponential backoff, written once for every retry loop of the processor.

Milvus writes (`StoreService`), produce resends and partition lookups (the write
consumer) all wait out an outage the same way: start at ``initial_s``, double after
each failure, never more than ``max_s`` (``DMEM_WRITE__RETRY_INITIAL_S`` /
``..._MAX_S``). No jitter: one worker retries one thing at a time, so there is no
herd to spread, and fixed delays keep the chaos bench reproducible.
"""

from __future__ import annotations

import asyncio


class Backoff:
    """The delay before the next retry; `wait` sleeps it and doubles it (capped)."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        if initial_s <= 0 or max_s < initial_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {initial_s}, {max_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self.delay = initial_s

    async def wait(self) -> None:
        await asyncio.sleep(self.step())

    def step(self) -> float:
        """The delay to wait now (a caller that cannot await sleeps it itself); the next
        one is doubled (capped)."""
        now, self.delay = self.delay, min(self.delay * 2, self.max_s)
        return now

    def reset(self) -> None:
        self.delay = self.initial_s
