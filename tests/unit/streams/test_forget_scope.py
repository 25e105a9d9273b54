"""`forget_scope` refuses an empty agent or memory id before it reads anything: taken as
"no agent" it would forget the whole tenant."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.errors import InvalidRecord, StoreUnavailable
from streams.jobs.forget import ForgetIncomplete, forget_scope


class _Untouchable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was used: {name}")


@pytest.mark.parametrize("scope", [{"agent_id": ""}, {"memory_id": ""},
                                   {"agent_id": "", "memory_id": "m1"}])  # fmt: skip
def test_an_empty_id_names_no_scope(scope: dict[str, str]) -> None:
    with pytest.raises(InvalidRecord, match="empty agent or memory id"):
        forget_scope(_Untouchable(), "acme", **scope)  # type: ignore[arg-type]


class _FailsLater:
    """A store that finds one row, deletes it, then fails on the next read."""

    def __init__(self) -> None:
        self.reads = 0
        self.forgotten: list[str] = []

    def get(self, ids: list[str], **_: Any) -> list[dict[str, Any]]:
        self.reads += 1
        if self.reads > 2:  # the first round's two reads, then the second round's
            raise StoreUnavailable("Milvus went away")
        return [{"id": "m1", "tenant": "acme", "agent_id": "a", "partition": "core"}]

    def forget(self, ids: list[str], **_: Any) -> int:
        self.forgotten += ids
        return len(ids)


def test_a_store_failing_after_a_delete_hands_back_what_was_forgotten() -> None:
    store = _FailsLater()
    with pytest.raises(ForgetIncomplete) as exc:
        forget_scope(store, "acme", memory_id="m1")  # type: ignore[arg-type]
    assert store.forgotten == ["m1"]
    assert [(e.kind, e.memory_id) for e in exc.value.events] == [("forgotten", "m1")]
    assert exc.value.retriable and "1 memories were forgotten before it" in str(exc.value)
