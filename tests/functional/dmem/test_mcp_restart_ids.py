"""`remember` through two MCP servers on one episode (a restarted server, or two hosts).

Without a ``step`` each server counts the episode's steps from 0; with the stable id of
(tenant, agent, episode, step) the second server's memories took the first one's ids and
replaced them (seen on a local stack: 5 remembers, 3 memories, the first session's gone).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

pytest.importorskip("mcp")

from dmem.client import Client  # noqa: E402
from dmem.integrations.mcp import build_server  # noqa: E402
from schemas import Transition, stable_transition_id  # noqa: E402
from schemas.errors import ServiceUnavailable  # noqa: E402
from schemas.limits import LIMITS  # noqa: E402


class FakeClient(Client):
    """Records what `remember` publishes; no broker."""

    def __init__(self, sent: list[Transition]) -> None:
        super().__init__("127.0.0.1:1", "acme")
        self.sent = sent

    async def start(self) -> Client:
        return self

    async def stop(self) -> None:
        return None

    async def publish(self, transition: Transition) -> None:
        self.sent.append(transition)


def _session(sent: list[Transition], calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from mcp import Client as McpClient

    async def go() -> list[dict[str, Any]]:
        server = build_server(lambda: FakeClient(sent), agent_id="mcp")
        out = []
        async with McpClient(server) as c:
            for args in calls:
                r = await c.call_tool("remember", {"action": "note", **args})
                assert not r.is_error, r
                out.append(json.loads(r.content[0].text))
        return out

    return asyncio.run(go())


def test_a_restarted_server_adds_to_an_episode_instead_of_replacing_it() -> None:
    sent: list[Transition] = []
    first = _session(sent, [{"observation": f"one {i}", "episode_id": "ep"} for i in range(3)])
    second = _session(sent, [{"observation": f"two {i}", "episode_id": "ep"} for i in range(2)])
    assert [a["step"] for a in first + second] == [0, 1, 2, 0, 1]  # counted per server
    ids = [a["memory_id"] for a in first + second]
    assert len(set(ids)) == 5 and ids == [t.memory_id for t in sent]


def test_a_given_step_keeps_the_stable_id() -> None:
    # a caller numbering its own steps retries idempotently across servers
    sent: list[Transition] = []
    for _ in range(2):
        (ack,) = _session(sent, [{"observation": "x", "episode_id": "ep", "step": 7}])
        assert ack["memory_id"] == stable_transition_id("acme", "mcp", "ep", 7)


def test_concurrent_first_calls_start_one_client() -> None:
    # each started its own client; only the last was stopped with the server
    from mcp import Client as McpClient

    made: list[Client] = []
    stopped: list[Client] = []

    class Slow(FakeClient):
        async def start(self) -> Client:
            await asyncio.sleep(0.1)
            return self

        async def stop(self) -> None:
            stopped.append(self)

    def make() -> Client:
        made.append(Slow([]))
        return made[-1]

    async def go() -> None:
        async with McpClient(build_server(make)) as c:
            calls = [{"observation": f"o{i}", "action": "a"} for i in range(3)]
            await asyncio.gather(*[c.call_tool("remember", a) for a in calls])

    asyncio.run(go())
    assert len(made) == 1 and stopped == made


def test_a_failed_call_takes_no_step() -> None:
    # a call refused by validation, or whose publish fails, leaves the episode's count
    # where it was: the next successful call gets the step the failed one would have had
    from mcp import Client as McpClient

    sent: list[Transition] = []

    tried: list[Transition] = []

    class Flaky(FakeClient):
        async def publish(self, transition: Transition) -> None:
            tried.append(transition)
            if transition.observation == "c":
                raise ServiceUnavailable("broker unreachable")
            await super().publish(transition)

    too_many = {f"k{i}": i for i in range(LIMITS.max_metadata_keys + 1)}
    calls = [
        {"observation": "a", "episode_id": "ep"},
        {"observation": "b", "episode_id": "ep", "metadata": too_many},  # refused
        {"observation": "c", "episode_id": "ep"},  # its publish fails
        {"observation": "d", "episode_id": "ep"},
    ]

    async def go() -> list[Any]:
        async with McpClient(build_server(lambda: Flaky(sent))) as c:
            return [await c.call_tool("remember", {"action": "note", **a}) for a in calls]

    results = asyncio.run(go())
    assert [r.is_error for r in results] == [False, True, True, False]
    assert "metadata has 33 keys" in results[1].content[0].text
    assert "broker unreachable" in results[2].content[0].text
    assert [json.loads(r.content[0].text)["step"] for r in (results[0], results[3])] == [0, 1]
    assert [(t.observation, t.step) for t in sent] == [("a", 0), ("d", 1)]
    # "c" may have reached the broker all the same: "d" does not take its memory id
    assert [(t.observation, t.step) for t in tried] == [("a", 0), ("c", 1), ("d", 1)]
    assert len({t.memory_id for t in tried}) == 3
