"""An MCP client session with dmem: list tools, remember, recall, report the outcome.

    .venv/bin/python examples/mcp_agent.py                       # starts its own stack
    .venv/bin/python examples/mcp_agent.py --kafka HOST:PORT --http URL   # a `dmem up`

With auth on (the tokens you gave ``DMEM_AUTH__TOKENS``), pass ``--token`` or export
``DMEM_API_TOKEN``.

It launches ``dmem mcp`` over stdio with the official MCP SDK's client (what an MCP
host such as an IDE or an agent framework does), walks a scripted agent down a
corridor with one trap, and prints every call and answer: a transcript.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from _stack import REPO_ROOT, deployment


def answer(result: Any) -> Any:
    if result.is_error:  # the transcript stops at the first refused call, saying why
        raise SystemExit(f"dmem mcp answered an error: {result.content[0].text}")
    sc = result.structured_content
    if sc is not None:
        return sc.get("result", sc) if isinstance(sc, dict) else sc
    return json.loads(result.content[0].text)


async def session(kafka: str, http: str, tenant: str, token: str | None = None) -> None:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    env = {**os.environ, "DMEM_KAFKA__BROKER": f"kafka://{kafka}", "PYTHONPATH": str(REPO_ROOT)}
    if token:
        env["DMEM_API_TOKEN"] = token  # `dmem mcp --token` reads it
    params = StdioServerParameters(
        command=sys.executable,
        env=env,
        args=["-m", "dmem.cli", "mcp", "--tenant", tenant, "--http", http],
    )
    async with Client(params) as mcp:
        tools = (await mcp.list_tools()).tools
        print("tools/list ->", ", ".join(t.name for t in tools))
        for step in range(10):  # one episode: mundane steps and one trap
            trap = step == 4
            args = {
                "observation": "the floor gives way at the edge of the pit"
                if trap
                else f"a quiet corridor, door {step} ahead",
                "action": "jump" if trap else "walk",
                "reward": -20.0 if trap else -0.1,
                "episode_id": "demo-ep1",
                "step": step,
            }
            r = answer(await mcp.call_tool("remember", args))
            print(f"remember {args['action']!r} reward {args['reward']} ->", r)
        hits: list[Any] = []
        asked = {"query": "edge of the pit", "k": 3}
        deadline = time.monotonic() + 30
        # the write role is asynchronous, and the mundane steps may be searchable first
        while not any(h["action"] == "jump" for h in hits) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            hits = answer(await mcp.call_tool("recall", asked))
        # asked inside the episode: what it serves is credited by the episode's outcome
        hits = answer(
            await mcp.call_tool("recall", {**asked, "episode_id": "demo-ep1", "step": 10})
        )
        for h in hits:
            print(
                f"recall -> {h['action']!r} valence {h['valence']:+d} rpe {h['rpe']:.2f} "
                f"score {h['score']:.3f} breakdown {h['breakdown']}"
            )
        print(
            "report_outcome ->",
            answer(
                await mcp.call_tool("report_outcome", {"episode_id": "demo-ep1", "reward": -20.0})
            ),
        )
        stats = await mcp.read_resource("dmem://stats")
        print("dmem://stats ->", stats.contents[0].text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kafka", help="Kafka bootstrap of a running `dmem up`")
    ap.add_argument("--http", help="HTTP base URL of a running `dmem up`")
    ap.add_argument("--tenant", default="mcp-example")
    ap.add_argument("--token", help="the tenant's API token [env DMEM_API_TOKEN]")
    ap.add_argument(
        "--encoder",
        default="hash",
        choices=["hash", "minilm"],
        help="encoder of the embedded stack this example starts",
    )
    a = ap.parse_args()
    with deployment(a.kafka, a.http, a.encoder) as (kafka, http):
        asyncio.run(session(kafka, http, a.tenant, a.token))


if __name__ == "__main__":
    main()
