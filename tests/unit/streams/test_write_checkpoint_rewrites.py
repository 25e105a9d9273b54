"""A write worker's checkpoint never snapshots a hindsight re-score whose rows are not
stored yet (`WriteConsumer.rewriting`): the re-score marks its steps done in the state,
and a checkpoint holding those marks before the write would, after a crash, replay the
outcome onto steps marked done and never write its rows."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from streams.settings import Settings
from streams.write.consumer import WriteConsumer


class Pipeline:
    def __init__(self) -> None:
        self.dirty = {("t", 0)}
        self.states = {("t", 0): object()}
        self.snapshots: list[str] = []
        self.marks = "none"
        self.guard = SimpleNamespace(sign=lambda key, data: [])

    def snapshot(self, tenant: str, part: int) -> bytes:
        self.snapshots.append(self.marks)
        return b"state"


async def _sent(*_: Any, **__: Any) -> asyncio.Future[Any]:
    fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    fut.set_result(None)
    return fut


def test_a_checkpoint_waits_for_the_rewrite_in_flight() -> None:
    async def go() -> list[str]:
        pipe = Pipeline()
        w = WriteConsumer(Settings(), pipe, SimpleNamespace(store=None),  # type: ignore[arg-type]
                          now_ms=lambda: 0)  # fmt: skip
        w.producer = SimpleNamespace(send=_sent)  # type: ignore[assignment]
        w.owned = {0}
        stored = asyncio.Event()

        async def hindsight() -> None:
            async with w.rewriting():
                pipe.marks = "marked"  # the re-score
                pipe.dirty.add(("t", 0))
                await stored.wait()  # the store write, acknowledged later
                pipe.marks = "marked, rows stored"

        task = asyncio.create_task(hindsight())
        await asyncio.sleep(0)
        ckpt = asyncio.create_task(w.checkpoint())
        await asyncio.sleep(0.05)
        assert not ckpt.done() and pipe.snapshots == []  # held while the rows are not stored
        stored.set()
        await asyncio.wait_for(asyncio.gather(task, ckpt), 5)
        return pipe.snapshots

    assert asyncio.run(go()) == ["marked, rows stored"]
