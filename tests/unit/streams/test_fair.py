"""Per-tenant search turns (`streams.respond.fair.TenantLimiter`)."""

from __future__ import annotations

import asyncio

import pytest

from streams.respond.fair import TenantBusy, TenantLimiter


async def test_one_tenants_burst_neither_blocks_nor_refuses_another() -> None:
    lim = TenantLimiter(running=2, queue=3)
    release = asyncio.Event()
    running: list[str] = []

    async def search(tenant: str) -> None:
        async with lim.turn(tenant):
            running.append(tenant)
            await release.wait()

    burst = [asyncio.create_task(search("a")) for _ in range(5)]  # 2 run, 3 wait
    await asyncio.sleep(0)
    assert running == ["a", "a"] and lim.in_flight("a") == 5
    with pytest.raises(TenantBusy, match="busy: 5 searches of tenant 'a'"):
        async with lim.turn("a"):
            pass
    assert lim.refused == 1
    b = asyncio.create_task(search("b"))  # another tenant: runs at once
    await asyncio.sleep(0)
    assert running.count("b") == 1
    release.set()
    await asyncio.gather(*burst, b)
    assert running.count("a") == 5  # the waiting ones had their turn
    assert lim.in_flight("a") == 0 and lim._held == {} and lim._sems == {}  # state dropped


async def test_a_failing_search_gives_its_turn_back() -> None:
    lim = TenantLimiter(running=1, queue=0)
    with pytest.raises(RuntimeError):
        async with lim.turn("a"):
            raise RuntimeError("milvus away")
    async with lim.turn("a"):
        assert lim.in_flight("a") == 1
    assert TenantBusy("x").retriable
    with pytest.raises(ValueError):
        TenantLimiter(0, 1)
