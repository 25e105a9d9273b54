"""`StartTogether`: the roles' services start concurrently and stop in reverse order."""

from __future__ import annotations

import asyncio

import pytest
from mode import Service

from streams.context import StartTogether


class Joiner(Service):
    """Starts only once every member of `barrier` is starting (like a group join)."""

    def __init__(self, name: str, barrier: asyncio.Barrier, log: list[str],
                 fail: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.name, self.barrier, self.events, self.fail = name, barrier, log, fail

    async def on_start(self) -> None:
        await asyncio.wait_for(self.barrier.wait(), timeout=2.0)
        if self.fail:
            raise RuntimeError(f"{self.name} refused")
        self.events.append(f"started {self.name}")

    async def on_stop(self) -> None:
        self.events.append(f"stopped {self.name}")


async def test_starts_all_at_once_and_stops_in_reverse() -> None:
    log: list[str] = []
    barrier = asyncio.Barrier(3)  # one after another, the first start would time out
    members = [Joiner(n, barrier, log) for n in ("a", "b", "c")]
    group = StartTogether(members)
    await group.start()
    assert sorted(log) == ["started a", "started b", "started c"]
    assert all(m._started.is_set() for m in members)
    log.clear()
    await group.stop()
    assert log == ["stopped c", "stopped b", "stopped a"]


async def test_a_failed_start_is_raised_after_the_others_finished() -> None:
    log: list[str] = []
    barrier = asyncio.Barrier(2)
    group = StartTogether([Joiner("bad", barrier, log, fail=True), Joiner("ok", barrier, log)])
    with pytest.raises(RuntimeError, match="bad refused"):
        await group.start()
    assert log == ["started ok"]  # the other start ran to its end, not left in the background
