"""`DmemRetriever.filters` holds `SearchFilters` fields only, checked when it is built.

Any other key went to `Client.search` as an argument of its own: ``k`` was a TypeError
at every ``invoke`` ("got multiple values for argument 'k'"), ``request_id`` sent every
search under one id.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from dmem.client import Client  # noqa: E402
from dmem.integrations.langchain import DmemRetriever  # noqa: E402
from schemas import Hit  # noqa: E402


class FakeClient(Client):
    def __init__(self) -> None:
        super().__init__("127.0.0.1:1", "acme")
        self.calls: list[dict[str, Any]] = []

    async def search(self, query: str | None = None, k: int = 5, **kw: Any) -> list[Hit]:
        self.calls.append({"query": query, "k": k, **kw})
        return []


@pytest.mark.parametrize("bad", [{"k": 2}, {"request_id": "r"}, {"tenant": "other"},
                                 {"valence": 7}, {"query": "x"}])  # fmt: skip
def test_a_key_that_is_not_a_search_filter_is_refused_when_built(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        DmemRetriever(client=FakeClient(), filters=bad)


def test_search_filters_reach_the_search() -> None:
    c = FakeClient()
    r = DmemRetriever(client=c, k=3, agent_id="a1",
                      filters={"valence": 1, "metadata_equals": {"task": "x"}})  # fmt: skip
    assert asyncio.run(r.ainvoke("where?")) == []
    (call,) = c.calls
    assert call["k"] == 3 and call["agent_id"] == "a1" and call["valence"] == 1
    assert call["metadata_equals"] == {"task": "x"} and "request_id" not in call
