import asyncio

import pytest

from streams.backoff import Backoff


def test_backoff_doubles_up_to_the_cap_and_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def fake_sleep(s: float) -> None:
        slept.append(s)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    b = Backoff(0.2, 1.0)

    async def run() -> None:
        for _ in range(5):
            await b.wait()

    asyncio.run(run())
    assert slept == [0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert b.delay == 0.2


@pytest.mark.parametrize("initial,cap", [(0.0, 1.0), (2.0, 1.0), (-1.0, 5.0)])
def test_backoff_refuses_a_bad_schedule(initial: float, cap: float) -> None:
    with pytest.raises(ValueError):
        Backoff(initial, cap)
