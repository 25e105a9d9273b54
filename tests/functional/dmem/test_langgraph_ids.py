"""`DmemStore`'s namespace -> agent id mapping against an in-memory fake client:
distinct namespaces are distinct agent scopes, and any namespace maps to a valid id."""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
from collections.abc import Coroutine
from typing import Any

import pytest

pytest.importorskip("langgraph")

from dmem.integrations.langgraph import DmemStore, agent_for  # noqa: E402
from schemas import LIMITS, Hit, Transition  # noqa: E402
from schemas.models import IDENT_PATTERN  # noqa: E402
from tests.functional.dmem.fake_hits import hit_for  # noqa: E402


class FakeClient:
    """What `DmemStore` calls on the async client; search filters by agent scope."""

    http_url = "http://fake"
    tenant = "acme"

    def __init__(self) -> None:
        self.published: list[Transition] = []

    async def publish(self, t: Transition) -> None:
        self.published.append(t)

    async def search(self, query: str, k: int, *, agent_id: str, **kw: Any) -> list[Hit]:
        return [hit_for(t, metadata=t.metadata) for t in self.published if t.agent_id == agent_id][
            :k
        ]

    async def list_page(
        self, *, limit: int, cursor: str | None, agent_id: str, filters: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The listing's rows, newest first, ``limit`` a page (the cursor: an offset)."""
        want = filters.get("metadata_equals") or {}
        rows = [{"text": t.observation, "created_ts": t.ts or 0,
                 "metadata": {"user": dict(t.metadata)}}
                for t in reversed(self.published) if t.agent_id == agent_id
                and all(t.metadata.get(k) == v for k, v in want.items())]  # fmt: skip
        start = int(cursor or 0)
        nxt = start + limit
        return rows[start:nxt], (str(nxt) if nxt < len(rows) else None)


class FakeSync:
    def __init__(self) -> None:
        self.client = FakeClient()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_result(asyncio.run(coro))
        return fut


def store() -> tuple[DmemStore, FakeClient]:
    sync = FakeSync()
    return DmemStore(sync), sync.client  # type: ignore[arg-type]


def test_a_slash_inside_a_part_is_not_a_namespace_separator() -> None:
    assert agent_for(("a/b",)) != agent_for(("a", "b"))
    s, _ = store()
    s.put(("a/b",), "k1", {"text": "one"})
    s.put(("a", "b"), "k2", {"text": "two"})
    assert [i.key for i in s.search(("a/b",), query="x")] == ["k1"]
    assert [i.key for i in s.search(("a", "b"), query="x")] == ["k2"]


def test_the_mapping_is_injective_and_keeps_plain_ids() -> None:
    # namespaces LangGraph accepts whose parts hold no "/" keep today's ids
    assert agent_for(("memories", "user-7")) == "memories/user-7"
    assert agent_for(("u@x-com:1_2",)) == "u@x-com:1_2"
    spaces = [
        ("a/b",),
        ("a", "b"),
        ("a.2Fb",),
        ("a.b",),
        ("a", "", "b"),
        ("a/", "b"),
        ("a", "/b"),
        ("a b",),
        ("é",),
        ("x" * 200,),
        ("x" * 199, "x"),
    ]
    ids = [agent_for(ns) for ns in spaces]
    assert len(set(ids)) == len(spaces)
    assert all(re.match(IDENT_PATTERN, i) and len(i) <= LIMITS.max_id_chars for i in ids)


def test_a_long_namespace_works() -> None:
    ns = ("n" * 200,)
    s, fake = store()
    s.put(ns, "k", {"text": "long"})
    t = fake.published[0]
    assert len(t.agent_id) <= LIMITS.max_id_chars and t.agent_id == agent_for(ns)
    assert [i.key for i in s.search(ns, query="x")] == ["k"]
    assert s.list_namespaces() == [ns]


def test_a_namespace_prefix_is_refused_not_an_empty_answer() -> None:
    # documented as `ValueError`: it searched the prefix as an agent scope of its own and
    # answered [] for memories stored under the longer namespaces
    s, _ = store()
    s.put(("users", "alice"), "k1", {"text": "alice likes tea"})
    with pytest.raises(ValueError, match="not a namespace prefix"):
        s.search(("users",), query="tea")
    assert [i.key for i in s.search(("users", "alice"), query="tea")] == ["k1"]
    s.put(("users",), "k0", {"text": "shared"})  # written itself: a scope of its own
    assert [i.key for i in s.search(("users",), query="x")] == ["k0"]


def test_a_value_over_the_metadata_budget_is_refused_in_its_own_terms() -> None:
    # each scalar field is a metadata key: 30 fields (310 characters of JSON, within the
    # documented 512) failed with "metadata has 33 keys", naming keys the caller never wrote
    s, c = store()
    with pytest.raises(ValueError, match="30 scalar fields besides its text; at most 29"):
        s.put(("a",), "k", {"text": "x", **{f"f{i}": i for i in range(30)}})
    with pytest.raises(ValueError, match="longer than 124 characters"):
        s.put(("a",), "k", {"text": "x", "n" * 125: 1})
    s.put(("a",), "k", {"text": "x", "n" * 124: 1, **{f"f{i}": i for i in range(28)}})
    assert len(c.published) == 1
    with pytest.raises(ValueError, match="reward is outside"):
        s.put(("a",), "k2", {"text": "x", "reward": 10**400})  # was an OverflowError


def test_a_page_past_the_search_limit_is_refused_in_its_own_terms() -> None:
    # it was the SDK's "invalid RetrievalRequest: k: ... at most 100", a k never named
    s, _ = store()
    s.put(("a",), "k", {"text": "x"})
    with pytest.raises(ValueError, match="limit \\+ offset is 105"):
        s.search(("a",), query="x", limit=10, offset=95)
    assert [i.key for i in s.search(("a",), query="x", limit=10, offset=90)] == []


def test_a_field_metadata_cannot_hold_stays_in_the_value_only() -> None:
    """An integer beyond INT64 (or a non-finite float) in a value is stored with the value
    but is no filterable key: it failed the put with an error naming ``lgv_n``."""
    s, c = store()
    s.put(("a",), "k", {"text": "x", "n": 2**70, "m": 3})
    (t,) = c.published
    assert "lgv_n" not in t.metadata and t.metadata["lgv_m"] == 3
    assert str(2**70) in t.metadata["lg_rest"]


def test_a_search_without_a_query_lists_the_namespace_newest_first() -> None:
    """LangGraph lists a namespace by a search without a query; it failed with "query
    is empty" (a RetrievalRequest the caller never built)."""
    s, _ = store()
    for i in range(4):
        s.put(("users", "u1"), f"k{i}", {"text": f"fact {i}", "kind": "a" if i % 2 else "b"})
    s.put(("users", "u2"), "other", {"text": "another user"})
    got = s.search(("users", "u1"), limit=2, offset=1)
    assert [i.key for i in got] == ["k2", "k1"] and all(i.score is None for i in got)
    assert got[0].value == {"text": "fact 2", "kind": "b"}
    assert [i.key for i in s.search(("users", "u1"), filter={"kind": "a"})] == ["k3", "k1"]


def test_a_filter_on_a_field_no_filter_can_name_says_so() -> None:
    """A field is stored whatever its name, but a filter names only plain identifiers:
    the server's refusal named ``lgv_user-id``, a key the caller never wrote."""
    s, _ = store()
    s.put(("a",), "k", {"text": "x", "user-id": "u1", "ok_field": "y"})
    with pytest.raises(ValueError, match="'user-id' cannot be filtered on"):
        s.search(("a",), query="x", filter={"user-id": "u1"})
    assert [i.key for i in s.search(("a",), query="x", filter={"ok_field": "y"})] == ["k"]


def test_a_separator_inside_a_part_gives_another_memory_id() -> None:
    from dmem.integrations.langgraph import memory_id

    assert memory_id(("a\x1fb",), "k") != memory_id(("a", "b"), "k")
    assert memory_id(("a\x1e", "b"), "k") != memory_id(("a", "\x1eb"), "k")
    # the ids of namespaces without either character are the ones stored before
    assert memory_id(("users", "u1"), "k") == "lg-34b70e3beceac98ff678ed83fd8846e3"
