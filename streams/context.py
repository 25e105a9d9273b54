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
- ``pipeline``, ``consumers``: what ``/metrics`` reads on each scrape.

Callbacks go through the context at call time, so the order in which roles are
wired does not matter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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

    def touch(self, keys: Iterable[tuple[str, str]]) -> None:
        """Rows changed in this process: the maintenance job re-reads them, when it runs here."""
        if self.maintenance_touch is not None:
            self.maintenance_touch(keys)

    def record_access(self, tenant: str, ids: list[str], now: int) -> None:
        """Served memories: counted by the access tracker, when it runs here."""
        if self.access is not None:
            self.access(tenant, ids, now)
