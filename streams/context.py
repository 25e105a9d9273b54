"""`RoleContext`: what the roles of one worker process share, in one typed object.

`streams.app.build_app` creates one context per process and hands it to each
role's entry point (`wire_write_path`, `wire_respond`, `wire_jobs`,
`wire_maintenance`, `wire_access`, ...). A role reads the shared components from
it (settings, the store service, the encoder) and registers what other roles or
the process-wide endpoints need from it:

- ``settle``: each component's pending work, reported by ``/health``;
- ``maintenance_touch``: set by the maintenance job when it runs in this process;
  writers report the rows they changed through `RoleContext.touch`;
- ``access``: set by the access tracker; the responder reports served memories
  through `RoleContext.record_access`;
- ``pipeline``, ``consumers``: what ``/metrics`` reads on each scrape;
- ``services``: the roles' long-running services (`RoleContext.run`); `build_app`
  starts them together (`StartTogether`), since each first consumer-group join waits
  on the broker and the groups are independent of one another.

Callbacks go through the context at call time, so the order in which roles are
wired does not matter.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mode import Service, ServiceT

if TYPE_CHECKING:
    from operators import Encoder
    from streams.settings import Settings
    from streams.store import StoreService
    from streams.write.pipeline import WritePipeline

#: ``{"settled": bool, "pending": {...}}``: one component's pending work
SettleState = dict[str, Any]
#: reports a component's pending work (``/health``, ``dmem wait --settled``)
SettleFn = Callable[[], Awaitable[SettleState]]
#: a role's health details for ``/health``
StatusFn = Callable[[], dict[str, Any]]
#: (tenant, memory id)s whose rows a writer of this process changed
TouchFn = Callable[[Iterable[tuple[str, str]]], None]
#: (tenant, served memory ids, stream time of their clock)
AccessFn = Callable[[str, list[str], int], None]
#: a consumer to report lag for: (aiokafka consumer or None, committed offsets)
ConsumerProbe = Callable[[], tuple[Any, Mapping[Any, int]]]

__all__ = [
    "AccessFn",
    "ConsumerProbe",
    "RoleContext",
    "SettleFn",
    "SettleState",
    "StartTogether",
    "StatusFn",
    "TouchFn",
]


@dataclass
class RoleContext:
    """The components the roles of one process share (see the module doc)."""

    settings: Settings
    store: StoreService
    encoder: Encoder
    settle: dict[str, SettleFn] = field(default_factory=dict)
    maintenance_touch: TouchFn | None = None
    access: AccessFn | None = None
    pipeline: WritePipeline | None = None
    consumers: list[ConsumerProbe] = field(default_factory=list)
    services: list[ServiceT] = field(default_factory=list)

    def run(self, service: ServiceT) -> None:
        """Run `service` with the worker: started with the other roles' services."""
        self.services.append(service)

    def touch(self, keys: Iterable[tuple[str, str]]) -> None:
        """Rows changed in this process: the maintenance job re-reads them, when it runs here."""
        if self.maintenance_touch is not None:
            self.maintenance_touch(keys)

    def record_access(self, tenant: str, ids: list[str], now: int) -> None:
        """Served memories: counted by the access tracker, when it runs here."""
        if self.access is not None:
            self.access(tenant, ids, now)


class StartTogether(Service):
    """Starts its services concurrently and stops them one by one, in reverse order.

    mode starts a service's dependencies one after another, and a role service's start
    returns once its consumer joined its group (the broker answers a new group's first
    join after a delay: half the session timeout on Tansu). The roles' groups, topics and
    offsets are independent, so joining them at once costs one such delay instead of
    one per group. What each service does once started is unchanged.
    """

    def __init__(self, services: Sequence[ServiceT], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.services = list(services)
        for service in self.services:
            self.add_dependency(service)  # stopped (reversed) and shown with this service

    async def on_start(self) -> None:
        # every start runs to its end before the first failure is raised, so no start
        # is left running in the background while the worker stops
        results = await asyncio.gather(
            *(s.maybe_start() for s in self.services), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
