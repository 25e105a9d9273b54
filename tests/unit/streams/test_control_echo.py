"""The store half of a forget notice (`streams.control.echo_to_store`) through a store
outage: the tombstone is set before the delete, so the delete is retried in place."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from schemas import MemoryEvent
from schemas.errors import StoreError, StoreUnavailable
from streams.control import echo_to_store


class Tombstones:
    ttl_s = 3600.0

    def __init__(self) -> None:
        self.keys: set[str] = set()

    def dead(self, keys: list[str]) -> set[str]:
        return self.keys & set(keys)


class FlakyStore:
    """`forget` tombstones, then fails its delete ``fail`` times with ``exc``."""

    def __init__(self, fail: int, exc: Exception) -> None:
        self.tombstones = Tombstones()
        self.fail, self.exc = fail, exc
        self.deleted: list[tuple[str, list[str]]] = []

    def forget(self, ids: list[str], *, tenant: str, at: float) -> None:
        self.tombstones.keys.update(f"{tenant}|{i}" for i in ids)
        if self.fail:
            self.fail -= 1
            raise self.exc
        self.deleted.append((tenant, ids))


def notice(mid: str) -> MemoryEvent:
    import time

    return MemoryEvent(kind="forgotten", memory_id=mid, tenant="t", agent_id="a",
                       partition="buffer", ts=int(time.time() * 1000))  # fmt: skip


def test_a_delete_the_store_could_not_do_is_retried_until_it_is_done() -> None:
    store = FlakyStore(2, StoreUnavailable("Milvus away"))
    slept: list[float] = []
    handle = echo_to_store(SimpleNamespace(store=store), sleep=slept.append)  # type: ignore[arg-type]
    handle([notice("m1")])
    assert store.deleted == [("t", ["m1"])] and slept == [1.0, 2.0]


@pytest.mark.parametrize(("exc", "retry_s"), [(StoreError("refused"), 60.0),
                                              (StoreUnavailable("away"), 0.5)])  # fmt: skip
def test_a_failure_that_retrying_cannot_mend_is_raised(exc: Exception, retry_s: float) -> None:
    store = FlakyStore(99, exc)
    slept: list[Any] = []
    handle = echo_to_store(SimpleNamespace(store=store), retry_s=retry_s,  # type: ignore[arg-type]
                           sleep=slept.append)  # fmt: skip
    with pytest.raises(type(exc)):
        handle([notice("m1")])
    assert store.deleted == [] and slept == []
