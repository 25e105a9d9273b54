"""`Memory` (the agent-framework adapter) against an in-memory fake client."""

from __future__ import annotations

from typing import Any

import pytest

from dmem.adapter import Memory, MemoryClient
from schemas import LIMITS, Hit, Transition
from tests.functional.dmem.fake_hits import hit_for


class FakeClient:
    """Records what the adapter sends; `search` answers from what was published."""

    def __init__(self, tenant: str | None = "acme") -> None:
        if tenant is not None:
            self.tenant = tenant
        self.published: list[Transition] = []
        self.searches: list[dict[str, Any]] = []
        self.outcomes: list[tuple[str, float, dict[str, Any]]] = []

    def publish(self, transition: Transition) -> None:
        self.published.append(transition)

    def search(self, query: str | None = None, k: int = 5, **kw: Any) -> list[Hit]:
        self.searches.append({"query": query, "k": k, **kw})
        hits = []
        for t in self.published:
            if query is not None and t.observation != query:
                continue
            if "valence" in kw and (-1 if t.reward < 0 else 1) != kw["valence"]:
                continue
            hits.append(hit_for(t))
        return hits[:k]

    def report_outcome(self, episode_id: str, reward: float, **kw: Any) -> None:
        self.outcomes.append((episode_id, reward, kw))


class NoOutcomeClient:
    """Only the two required methods (no tenant, no report_outcome)."""

    def __init__(self) -> None:
        self.published: list[Transition] = []

    def publish(self, transition: Transition) -> None:
        self.published.append(transition)

    def search(self, query: str | None = None, k: int = 5, **kw: Any) -> list[Hit]:
        return []


def ids() -> Any:
    n = iter(range(1000))
    return lambda: f"ep{next(n)}"


def memory(client: Any = None, **kw: Any) -> Memory:
    kw.setdefault("new_episode_id", ids())
    kw.setdefault("clock_ms", lambda: 1_700_000_000_000)
    return Memory(client or FakeClient(), "acme", "bot", **kw)


def test_protocol_is_satisfied_by_fake_and_sync_client() -> None:
    from dmem.client import SyncClient

    assert isinstance(FakeClient(), MemoryClient)
    assert isinstance(NoOutcomeClient(), MemoryClient)
    for name in ("publish", "search"):
        assert callable(getattr(SyncClient, name))


def test_steps_count_up_and_episode_rolls_over_on_done() -> None:
    c = FakeClient()
    m = memory(c)
    assert (m.episode_id, m.step) == ("ep0", 0)
    m.add_memory("s0", "right", -1.0, "s1")
    m.add_memory("s1", 2, -1.0, "s2", metadata={"cell": 7})
    m.add_memory("s2", "down", 10.0, "goal", done=True)
    assert [(t.episode_id, t.step) for t in c.published] == [("ep0", 0), ("ep0", 1), ("ep0", 2)]
    assert c.published[1].action == "2" and c.published[1].metadata == {"cell": 7}
    assert c.published[2].done is True
    assert all(t.tenant == "acme" and t.agent_id == "bot" for t in c.published)
    assert all(t.ts == 1_700_000_000_000 for t in c.published)
    # new episode after done, return reported for the finished one
    assert (m.episode_id, m.step, m.episode_return) == ("ep1", 0, 0.0)
    assert c.outcomes == [("ep0", 8.0, {"agent_id": "bot"})]
    m.add_memory("s0", "up", -1.0, "s0")
    assert (c.published[-1].episode_id, c.published[-1].step) == ("ep1", 0)
    # distinct stable ids per (episode, step)
    assert len({t.memory_id for t in c.published}) == 4


def test_truncation_ends_the_episode_without_marking_it_terminal() -> None:
    c = FakeClient()
    m = memory(c)
    m.add_memory("s0", "left", -1.0, "s0", truncated=True)
    assert c.published[0].done is False
    assert m.episode_id == "ep1" and m.step == 0
    assert c.outcomes == [("ep0", -1.0, {"agent_id": "bot"})]


def test_vector_observations_become_states() -> None:
    c = FakeClient()
    m = memory(c)
    m.add_memory([0.1, 0.2], "push", 1.0, [0.3, 0.4])
    t = c.published[0]
    assert t.observation is None and t.state == [0.1, 0.2] and t.next_state == [0.3, 0.4]
    m.get_relevant_memories([1.0, 0.0], k=3)
    assert c.searches[-1]["query"] is None and c.searches[-1]["vector"] == [1.0, 0.0]


def test_get_relevant_memories_passes_usage_context_and_filters() -> None:
    c = FakeClient()
    m = memory(c, k=4)
    m.add_memory("edge", "down", -100.0, "start")
    m.add_memory("edge", "right", -1.0, "edge2")
    got = m.get_relevant_memories(
        "edge", valence=-1, lambda_=0.3, mmr=True, metadata_equals={"env": "cliff"}
    )
    s = c.searches[-1]
    assert s["query"] == "edge" and s["k"] == 4
    assert s["episode_id"] == "ep0" and s["step"] == 2  # the step about to be taken
    assert s["valence"] == -1 and s["lambda_"] == 0.3 and s["mmr"] is True
    assert s["metadata_equals"] == {"env": "cliff"}
    assert "agent_id" not in s  # whole tenant by default
    assert [g["action"] for g in got] == ["down", "right"]
    d = got[0]
    for key in (
        "memory_id",
        "text",
        "action",
        "reward",
        "rpe",
        "valence",
        "utility",
        "partition",
        "episode_id",
        "agent_id",
        "step",
        "created_ts",
        "score",
    ):
        assert key in d, key
    assert d["text"] == "edge" and d["reward"] == -100.0 and d["valence"] == -1
    assert d["breakdown"] == {
        "semantic": 1.0,
        "salience": 0.5,
        "recency": 1.0,
        "lambda": 0.8,
        "score": 0.9,
        "supersedes": None,
        "lane": "main",
        "bonus": 0.0,
    }
    assert m.last_memories == got
    m.get_relevant_memories("edge", k=1)
    assert c.searches[-1]["k"] == 1


def test_scope_to_agent_sends_agent_id() -> None:
    c = FakeClient()
    memory(c, scope_to_agent=True).get_relevant_memories("x")
    assert c.searches[-1]["agent_id"] == "bot"


def test_clear_starts_fresh_episode_but_deletes_nothing() -> None:
    c = FakeClient()
    m = memory(c)
    m.add_memory("a", "go", -5.0, "b")
    m.add_memory("b", "go", -5.0, "c")
    m.get_relevant_memories("a")
    assert m.last_memories
    m.clear()
    assert (m.episode_id, m.step, m.episode_return, m.last_memories) == ("ep1", 0, 0.0, [])
    assert c.outcomes == []  # an abandoned episode is not reported
    assert len(c.published) == 2  # nothing deleted or retracted
    assert m.get_relevant_memories("a")  # still retrievable after clear()
    m.add_memory("a", "go", -1.0, "b")
    assert (c.published[-1].episode_id, c.published[-1].step) == ("ep1", 0)
    assert "does NOT" in (Memory.clear.__doc__ or "")
    assert "dmem forget" in (Memory.clear.__doc__ or "")


def test_end_episode_with_explicit_outcome_and_without_report_support() -> None:
    c = FakeClient()
    m = memory(c)
    m.end_episode()  # empty episode: nothing to report
    assert c.outcomes == [] and m.episode_id == "ep1"
    m.add_memory("a", "go", -1.0, "b")
    assert m.end_episode(outcome=1.0) == "ep2"
    assert c.outcomes == [("ep1", 1.0, {"agent_id": "bot"})]
    quiet = FakeClient()
    m2 = memory(quiet, report_outcomes=False)
    m2.add_memory("a", "go", -1.0, "b", done=True)
    assert quiet.outcomes == []
    n = NoOutcomeClient()
    m3 = Memory(n, "acme", "bot")
    m3.add_memory("a", "go", 1.0, "b", done=True)  # no report_outcome: no error
    assert len(n.published) == 1 and m3.step == 0


def test_tenant_defaults_to_client_and_mismatch_is_refused() -> None:
    assert Memory(FakeClient("acme")).tenant == "acme"
    with pytest.raises(ValueError, match="differs"):
        Memory(FakeClient("acme"), "other")
    with pytest.raises(ValueError, match="tenant is required"):
        Memory(NoOutcomeClient())
    assert Memory(NoOutcomeClient(), "t1").tenant == "t1"
    with pytest.raises(ValueError):
        Memory(FakeClient(), k=0)


def test_default_episode_ids_are_valid_and_fresh() -> None:
    c = FakeClient()
    m = Memory(c, agent_id="bot")
    first = m.episode_id
    assert first.startswith("bot-")
    m.add_memory("a", "go", 0.0, "b", done=True)
    assert m.episode_id != first
    assert Memory(c, episode_id="mine").episode_id == "mine"


def test_invalid_transition_is_not_published_and_step_does_not_advance() -> None:
    c = FakeClient()
    m = memory(c)
    with pytest.raises(ValueError):
        m.add_memory("a", "go", float("nan"), "b")
    assert c.published == [] and m.step == 0


def test_langchain_style_aliases() -> None:
    c = FakeClient()
    m = memory(c)
    assert m.memory_variables == ["memories"]
    m.save_context(
        {"input": "the user asks for a refund"},
        {"output": "refuse", "reward": -3.0, "next_observation": "user angry"},
    )
    t = c.published[0]
    assert (t.observation, t.action, t.reward, t.next_observation) == (
        "the user asks for a refund",
        "refuse",
        -3.0,
        "user angry",
    )
    # reward may come with the inputs; done rolls the episode over
    m.save_context({"observation": "o2", "reward": 1.0}, {"action": "a2", "done": True})
    assert c.published[1].reward == 1.0 and c.published[1].done and m.episode_id == "ep1"
    # long LLM answers are cut to the action limit, not rejected
    m.save_context({"input": "o3"}, {"output": "x" * 5000})
    assert 0 < len(c.published[2].action) < 5000
    out = m.load_memory_variables(
        {"input": "the user asks for a refund", "filters": {"valence": -1}, "k": 2}
    )
    assert set(out) == {"memories"}
    assert isinstance(out["memories"], list) and out["memories"][0]["action"] == "refuse"
    s = c.searches[-1]
    assert s["query"] == "the user asks for a refund" and s["valence"] == -1 and s["k"] == 2
    assert s["episode_id"] == "ep1"
    # a single unnamed key is the query; explicit keys win; ambiguity is an error
    m.load_memory_variables({"question_text": "o3"})
    assert c.searches[-1]["query"] == "o3"
    keyed = memory(FakeClient(), input_key="q", output_key="a")
    keyed.save_context({"q": "qq", "input": "ignored"}, {"a": "aa", "output": "ignored"})
    assert keyed.client.published[0].observation == "qq"  # type: ignore[attr-defined]
    assert keyed.client.published[0].action == "aa"  # type: ignore[attr-defined]
    with pytest.raises(KeyError):
        m.load_memory_variables({"a": "1", "b": "2"})
    with pytest.raises(KeyError):
        keyed.load_memory_variables({"input": "x"})


def test_a_long_agent_id_still_gives_valid_default_episode_ids() -> None:
    c = FakeClient()
    agent = "a" * LIMITS.max_id_chars  # a valid agent id; over 115 characters overflowed
    m = Memory(c, "acme", agent, clock_ms=lambda: 1_700_000_000_000)
    m.add_memory("s0", "go", 1.0, "s1", done=True)
    m.add_memory("s1", "go", 1.0, "s2")
    first, second = (t.episode_id for t in c.published)
    assert first != second and all(len(e) <= LIMITS.max_id_chars for e in (first, second))
    assert all(t.agent_id == agent for t in c.published)
    # a short agent id keeps the readable "<agent>-<random hex>" form
    assert Memory(FakeClient(), "acme", "bot").episode_id.startswith("bot-")


def test_the_sync_client_offers_every_call_of_the_async_one() -> None:
    """The SDK reference lists one set of calls: each async one has a blocking twin
    (`publish_chat`, `report_feedback` and `list_page` were missing). Not mirrored: the
    lifecycle (the sync client starts and stops itself) and the async iterator, whose
    twin is `list_memories`."""
    import inspect

    from dmem.client import Client, SyncClient

    calls = {n for n, f in inspect.getmembers(Client) if not n.startswith("_") and
             (inspect.iscoroutinefunction(f) or inspect.isasyncgenfunction(f))}  # fmt: skip
    missing = calls - {n for n in dir(SyncClient) if callable(getattr(SyncClient, n))}
    assert missing == {"start", "stop", "iter_memories"}
    assert callable(SyncClient.list_memories)
