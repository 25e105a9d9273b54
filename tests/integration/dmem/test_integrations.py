"""MCP server (stdio and streamable HTTP with auth), LangGraph store, LangChain
retriever and the SDK's reads by id against the real embedded stack (Tansu broker,
worker with every role, Milvus Lite)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest

from dmem.client import Client, SyncClient
from schemas import ScoreBreakdown, Transition
from streams.local.stack import LocalStack
from tests.integration.broker_fixtures import isolated_env

pytestmark = pytest.mark.integration

TENANT = "mcp-tenant"
TRAP = "standing at the edge of crater 4"


@pytest.fixture
def stack(tmp_path: Path, broker: str, topic_prefix: str) -> Iterator[LocalStack]:
    env = isolated_env(topic_prefix, DMEM_WRITE__BATCH_WITHIN_S="0.2")
    s = LocalStack(tmp_path / "data", roles=("all",), extra_env=env, broker_bootstrap=broker)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def http_url(stack: LocalStack) -> str:
    return f"http://127.0.0.1:{stack.web_ports[0]}"


def worker_env(stack: LocalStack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMEM_")}
    env.update(stack.env(0))
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3])
    return env


def corridor(agent: str, n_eps: int = 4) -> list[Transition]:
    """Mundane steps and one trap per episode: the trap is what the gate keeps."""
    return [
        Transition(
            tenant=TENANT,
            agent_id=agent,
            episode_id=f"{agent}-ep{e}",
            step=k,
            observation=TRAP if k == 4 else f"walking on the quiet road mile {k}",
            action="jump" if k == 4 else "walk",
            reward=-20.0 if k == 4 else -0.1,
            next_observation=f"mile {k + 1}",
        )
        for e in range(n_eps)
        for k in range(10)
    ]


def text_of(result: Any) -> Any:
    """The JSON a tool answered (structured content when present, else its text)."""
    if result.structured_content is not None:
        sc = result.structured_content
        return sc.get("result", sc) if isinstance(sc, dict) else sc
    return json.loads(result.content[0].text)


def sdk(stack: LocalStack) -> Client:
    """The SDK on the test's stack and tenant (Kafka and HTTP)."""
    return Client(
        stack.bootstrap, TENANT, topic_prefix=stack.settings.kafka.topic_prefix,
        http_url=http_url(stack),
    )  # fmt: skip


async def mcp_session_checks(client: Any, stack: LocalStack) -> list[str]:
    """The transcript the closing note shows: list tools, remember, recall, outcome, ..."""
    lines: list[str] = []
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"remember", "recall", "report_outcome", "feedback", "forget",
                          "list_memories", "memory_history"}  # fmt: skip
    for t in tools.values():
        assert t.input_schema["type"] == "object" and t.input_schema.get("properties")
    # the tool's action is the stream's: free text, the same length bound, no pattern
    stream = Transition.model_json_schema()["properties"]["action"]
    action = tools["remember"].input_schema["properties"]["action"]
    assert "pattern" not in action and action["maxLength"] == stream["maxLength"]
    lines.append("tools/list -> " + ", ".join(sorted(tools)))

    for t in corridor("mcp-agent")[:10]:  # one episode through `remember`
        r = await client.call_tool(
            "remember",
            {
                "observation": t.observation,
                "action": t.action,
                "reward": t.reward,
                "next_observation": t.next_observation,
                "episode_id": t.episode_id,
                "step": t.step,
            },
        )
        assert not r.is_error, r
    ack = text_of(r)
    assert ack["accepted"] is True and ack["episode_id"] == "mcp-agent-ep0"
    lines.append(f"remember x10 -> last {ack}")

    r = await client.call_tool("remember", {"observation": "a locked door",
                                            "action": "use key on door"})  # fmt: skip
    assert not r.is_error, r
    bad = await client.call_tool("remember", {"observation": "x", "action": "x" * 100_000})
    assert bad.is_error and "action" in bad.content[0].text
    lines.append(f"remember (bad action) -> is_error: {bad.content[0].text.splitlines()[0]}")

    hits: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    # the mundane steps may be searchable (buffer) before the trap is: wait for it
    while not (hits and hits[0]["action"] == "jump") and time.monotonic() < deadline:
        r = await client.call_tool("recall", {"query": TRAP, "k": 3})
        assert not r.is_error, r
        hits = text_of(r)
        if not (hits and hits[0]["action"] == "jump"):
            await asyncio.sleep(0.5)
    assert hits and hits[0]["action"] == "jump" and hits[0]["valence"] == -1
    for key in ("semantic", "salience", "recency", "lambda", "score"):
        assert key in hits[0]["breakdown"]
    assert {"rpe", "utility", "memory_id"} <= set(hits[0])
    lines.append(
        f"recall '{TRAP}' -> {hits[0]['action']} score {hits[0]['score']:.3f} "
        f"breakdown {hits[0]['breakdown']} rpe {hits[0]['rpe']:.2f}"
    )

    # as of a time before the trap was written: it is not among the hits
    asked = {"query": TRAP, "k": 3, "as_of": hits[0]["created_ts"] - 1}
    r = await client.call_tool("recall", asked)
    assert not r.is_error
    assert hits[0]["memory_id"] not in {h["memory_id"] for h in text_of(r)}
    assert all(h["created_ts"] < hits[0]["created_ts"] for h in text_of(r))
    r = await client.call_tool("recall", {"query": "road", "filters": {"valence": 1}})
    assert not r.is_error and all(h["valence"] == 1 for h in text_of(r))
    r = await client.call_tool("recall", {"query": "road", "filters": {"valence": 7}})
    assert r.is_error  # outside the schema: a tool error, the server keeps serving

    r = await client.call_tool("list_memories", {"limit": 500})
    assert not r.is_error, r
    listed = text_of(r)["memories"]
    assert hits[0]["memory_id"] in {m["memory_id"] for m in listed}
    assert [m["created_ts"] for m in listed] == sorted((m["created_ts"] for m in listed),
                                                      reverse=True)  # fmt: skip
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while not any(e["kind"] == "written" for e in events) and time.monotonic() < deadline:
        r = await client.call_tool("memory_history", {"memory_id": hits[0]["memory_id"]})
        assert not r.is_error, r
        events = text_of(r)["events"]
        await asyncio.sleep(0.5)
    written = next(e for e in events if e["kind"] == "written")
    assert written["route"] in ("core", "buffer") and "theta_high" in written
    lines.append(f"memory_history -> {[e['kind'] for e in events]}")

    # a recall inside an episode records what it served; the episode's outcome credits it
    served = {"query": TRAP, "k": 3, "episode_id": "mcp-agent-ep1", "step": 0}
    r = await client.call_tool("recall", served)
    assert not r.is_error and text_of(r)
    used = text_of(r)[0]["memory_id"]
    r = await client.call_tool("report_outcome", {"episode_id": "mcp-agent-ep1", "reward": 1})
    assert not r.is_error and text_of(r)["accepted"] is True
    lines.append(f"recall in episode mcp-agent-ep1, report_outcome -> {text_of(r)}")
    async with sdk(stack) as c:
        uses, deadline = 0, time.monotonic() + 60
        while not uses and time.monotonic() < deadline:
            row = await c.get_memory(used)
            uses = int((row or {}).get("uses", 0) or 0)
            if not uses:
                await asyncio.sleep(0.5)
    assert uses >= 1, "the outcome of a recalled episode credited nothing"
    lines.append(f"memory {used} credited: uses {uses}")
    r = await client.call_tool("feedback", {"memory_id": hits[0]["memory_id"], "thumbs": "up"})
    assert not r.is_error and text_of(r)["kind"] == "thumbs_up"

    res = await client.read_resource("dmem://stats")
    stats = json.loads(res.contents[0].text)
    assert stats["tenant"] == TENANT and stats["total"] >= 1
    lines.append(f"resources/read dmem://stats -> {stats}")

    r = await client.call_tool("forget", {"memory_id": hits[0]["memory_id"]})
    assert not r.is_error and text_of(r)["forgotten"] == 1
    async with sdk(stack) as c:
        assert await c.get_memory(hits[0]["memory_id"]) is None
    lines.append(f"forget {hits[0]['memory_id']} -> {text_of(r)}")
    r = await client.call_tool("forget", {})
    assert r.is_error  # neither a memory nor an agent: refused with the reason
    return lines


def test_mcp_over_stdio_and_http_with_auth(stack: LocalStack, tmp_path: Path) -> None:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    env = worker_env(stack)
    args = [
        "-m",
        "dmem.cli",
        "mcp",
        "--tenant",
        TENANT,
        "--http",
        http_url(stack),
        "--timeout",
        "10",
    ]

    async def over_stdio() -> list[str]:
        params = StdioServerParameters(command=sys.executable, args=args, env=env)
        async with Client(params) as client:
            return await mcp_session_checks(client, stack)

    transcript = asyncio.run(over_stdio())
    (tmp_path / "mcp-transcript.txt").write_text("\n".join(transcript))
    print("\n".join(transcript))

    # streamable HTTP: refuses to start without a token, then 401 without/with a wrong one
    no_token = subprocess.run(
        [sys.executable, *args, "--transport", "http"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert no_token.returncode != 0 and "auth-token" in no_token.stderr
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            *args,
            "--transport",
            "http",
            "--port",
            str(port),
            "--auth-token",
            "s3cret",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and status is None:
            req = urllib.request.Request(
                url, data=b"{}", method="POST", headers={"content-type": "application/json"}
            )
            try:
                urllib.request.urlopen(req, timeout=5)
                status = 200
            except urllib.error.HTTPError as e:
                status = e.code
            except OSError:
                time.sleep(0.3)
        assert status == 401
        req = urllib.request.Request(
            url,
            data=b"{}",
            method="POST",
            headers={"content-type": "application/json", "authorization": "Bearer wrong"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 401

        async def over_http() -> None:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            http = httpx2.AsyncClient(headers={"Authorization": "Bearer s3cret"}, timeout=30)
            async with http, Client(streamable_http_client(url, http_client=http)) as client:
                tools = (await client.list_tools()).tools
                assert {t.name for t in tools} == {
                    "remember",
                    "recall",
                    "report_outcome",
                    "feedback",
                    "forget",
                    "list_memories",
                    "memory_history",
                }
                r = await client.call_tool("recall", {"query": "walking on the quiet road", "k": 3})
                assert not r.is_error

        asyncio.run(over_http())
    finally:
        proc.terminate()
        proc.wait(timeout=20)


class State(TypedDict):
    question: str
    answer: str


def test_langgraph_store_and_langchain_retriever(stack: LocalStack) -> None:
    from langgraph.config import get_store
    from langgraph.graph import END, START, StateGraph

    from dmem.integrations.langchain import DmemRetriever
    from dmem.integrations.langgraph import DmemStore

    prefix = stack.settings.kafka.topic_prefix
    sync = SyncClient(
        stack.bootstrap, TENANT, topic_prefix=prefix, http_url=http_url(stack), timeout_s=10
    )
    try:
        store = DmemStore(sync)
        ns = ("memories", "user-7")

        def remember(state: State) -> dict[str, Any]:
            s = get_store()
            for i in range(30):  # the mundane bulk, then the facts that matter
                s.put(
                    ns,
                    f"k{i}",
                    {
                        "text": f"small talk about the weather number {i}",
                        "reward": -0.1,
                        "topic": "chat",
                    },
                )
            for i in range(3):
                s.put(
                    ns,
                    f"allergy{i}",
                    {
                        "text": f"the user is allergic to nuts ({i})",
                        "reward": -20.0,
                        "topic": "health",
                    },
                )
            return {}

        def recall(state: State) -> dict[str, Any]:
            s = get_store()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # writes are asynchronous: poll
                found = s.search(ns, query=state["question"], limit=3)
                if found and "allergic" in found[0].value["text"]:
                    return {"answer": found[0].value["text"]}
                time.sleep(0.5)
            return {"answer": ""}

        g = StateGraph(State)
        g.add_node("remember", remember)
        g.add_node("recall", recall)
        g.add_edge(START, "remember")
        g.add_edge("remember", "recall")
        g.add_edge("recall", END)
        graph = g.compile(store=store)
        out = graph.invoke({"question": "what is the user allergic to", "answer": ""})
        assert "allergic to nuts" in out["answer"]

        item = store.get(ns, "allergy0")
        assert item is not None and item.key == "allergy0"
        assert item.value == {
            "text": "the user is allergic to nuts (0)",
            "reward": -20.0,
            "topic": "health",
        }
        health = store.search(ns, query="allergic", filter={"topic": "health"}, limit=5)
        assert health and all(i.value["topic"] == "health" for i in health)
        assert ns in store.list_namespaces(prefix=("memories",))
        store.delete(ns, "allergy0")
        assert store.get(ns, "allergy0") is None
        # the deployment refuses a forgotten id for its tombstone TTL: a put of the
        # key says so rather than vanishing
        with pytest.raises(ValueError, match="was deleted"):
            store.put(ns, "allergy0", {"text": "I am allergic to peanuts", "reward": -20.0})
        assert store.get(ns, "never-written") is None

        docs = DmemRetriever(client=sync, k=3).invoke("the user is allergic to nuts")
        assert docs and "allergic" in docs[0].page_content
        meta = docs[0].metadata
        # the whole breakdown the responder ranked by, under its wire names
        wire = {f.alias or name for name, f in ScoreBreakdown.model_fields.items()}
        assert set(meta["breakdown"]) == wire >= {"semantic", "lambda", "lane", "supersedes"}
        assert meta["breakdown"]["lane"] in ("main", "explore")
        assert meta["memory_id"] == docs[0].id and meta["valence"] == -1
        adocs = asyncio.run(
            DmemRetriever(client=sync, k=3, filters={"valence": -1}).ainvoke("allergic")
        )
        assert adocs and all(d.metadata["valence"] == -1 for d in adocs)
    finally:
        sync.close()


#: one trap per episode with the id under test; the traps differ, so neither folds
DOT_TRAPS = {".": "standing at the edge of crater 4", "..": "a lion sleeps in the cave mouth"}


def test_sdk_reads_forgets_and_histories_the_ids_dot_and_dot_dot(stack: LocalStack) -> None:
    # a URL's dot-segments are normalised away: the SDK sends these ids as %2E, and the
    # worker's router hands the handler the decoded id
    steps = [
        Transition(
            transition_id=mid if k == 4 else None,
            tenant=TENANT,
            agent_id="dots",
            episode_id=f"dots-ep{e}",
            step=k,
            observation=trap if k == 4 else f"walking on the quiet road mile {k}",
            action="jump" if k == 4 else "walk",
            reward=-20.0 if k == 4 else -0.1,
        )
        for e, (mid, trap) in enumerate(DOT_TRAPS.items())
        for k in range(10)
    ]

    async def go() -> None:
        async with sdk(stack) as c:
            await c.publish_many(steps)
            rows: dict[str, dict[str, Any] | None] = dict.fromkeys(DOT_TRAPS)
            deadline = time.monotonic() + 90
            while not all(rows.values()) and time.monotonic() < deadline:
                rows = {mid: await c.get_memory(mid) for mid in DOT_TRAPS}
                if not all(rows.values()):
                    await asyncio.sleep(0.5)
            for mid, trap in DOT_TRAPS.items():
                row = rows[mid]
                assert row is not None, f"memory {mid!r} never readable"
                assert row["memory_id"] == mid and row["text"] == trap, row
                kinds = [e["kind"] for e in await c.history(mid)]
                assert "written" in kinds, (mid, kinds)
            assert await c.forget(memory_id=".") == 1
            assert await c.get_memory(".") is None
            assert (await c.get_memory("..") or {}).get("memory_id") == ".."
            kinds, deadline = [], time.monotonic() + 60  # the history job records it
            while "forgotten" not in kinds and time.monotonic() < deadline:
                kinds = [e["kind"] for e in await c.history(".")]
                await asyncio.sleep(0.5)
            assert "forgotten" in kinds, kinds

    asyncio.run(go())


def test_sdk_over_http_publishes_without_kafka_and_finds_the_memory(stack: LocalStack) -> None:
    # the client's bootstrap is a closed port: every write goes to the worker's ingest
    # routes, and the memory it made is found by a search over HTTP
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    agent = "http-writer"

    async def go() -> None:
        async with Client(f"127.0.0.1:{closed}", TENANT, transport="http",
                          http_url=http_url(stack), timeout_s=10) as c:  # fmt: skip
            assert await c.publish_many(corridor(agent)) == 40
            await c.report_outcome(f"{agent}-ep0", reward=-20.0, success=False)
            hits: list[Any] = []
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                hits = await c.search(TRAP, k=3, agent_id=agent)
                if any(h.text == TRAP for h in hits):
                    break
                await asyncio.sleep(0.5)
            assert any(h.text == TRAP for h in hits), hits

    asyncio.run(go())
