"""`forget_scope` refuses an empty agent or memory id before it reads anything: taken as
"no agent" it would forget the whole tenant."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.errors import InvalidRecord
from streams.jobs.forget import forget_scope


class _Untouchable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was used: {name}")


@pytest.mark.parametrize("scope", [{"agent_id": ""}, {"memory_id": ""},
                                   {"agent_id": "", "memory_id": "m1"}])  # fmt: skip
def test_an_empty_id_names_no_scope(scope: dict[str, str]) -> None:
    with pytest.raises(InvalidRecord, match="empty agent or memory id"):
        forget_scope(_Untouchable(), "acme", **scope)  # type: ignore[arg-type]
