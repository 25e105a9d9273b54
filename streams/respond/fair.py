"""Fair sharing of a respond worker's searches between tenants.

`TenantLimiter` gives each tenant at most ``respond.tenant_searches`` searches at
once (HTTP and Kafka together) and ``respond.tenant_search_queue`` more waiting their
turn; a search beyond that is refused at once with `TenantBusy` (HTTP 429, a Kafka
reply with a ``busy:`` error). Why: a search holds a worker thread for its Milvus
call, and the threads are few; without a per-tenant bound one tenant's burst takes
them all and every other tenant's search waits behind it. A tenant's state exists
only while it has a search in flight, so the maps stay as small as the traffic.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from schemas.errors import ServiceUnavailable


class TenantBusy(ServiceUnavailable):
    """Too many searches of one tenant in flight (retriable: try again shortly)."""


class TenantLimiter:
    """At most ``running`` searches of a tenant at once, ``queue`` more waiting."""

    def __init__(self, running: int, queue: int) -> None:
        if running < 1 or queue < 0:
            raise ValueError("running must be >= 1 and queue >= 0")
        self.running = running
        self.queue = queue
        self._sems: dict[str, asyncio.Semaphore] = {}
        self._held: dict[str, int] = {}  # running + waiting, per tenant
        self.refused = 0

    def in_flight(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    @asynccontextmanager
    async def turn(self, tenant: str) -> AsyncIterator[None]:
        held = self._held.get(tenant, 0)
        if held >= self.running + self.queue:
            self.refused += 1
            raise TenantBusy(
                f"busy: {held} searches of tenant {tenant!r} in flight (at most "
                f"{self.running} at once and {self.queue} waiting); retry shortly"
            )
        self._held[tenant] = held + 1
        sem = self._sems.setdefault(tenant, asyncio.Semaphore(self.running))
        try:
            async with sem:
                yield
        finally:
            left = self._held[tenant] - 1
            if left:
                self._held[tenant] = left
            else:  # nobody of this tenant runs or waits: drop its state
                del self._held[tenant]
                self._sems.pop(tenant, None)
