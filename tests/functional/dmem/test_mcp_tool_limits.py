"""The MCP tools' input schemas carry the limits the stream enforces, as `dmem.integrations.mcp`
promises: an MCP client sees them before it calls, not as a refusal after."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("mcp")

from dmem.integrations.mcp import build_server  # noqa: E402
from schemas import Transition  # noqa: E402
from tests.functional.dmem.test_mcp_restart_ids import FakeClient  # noqa: E402


def _bounds(schema: dict[str, Any]) -> dict[str, Any]:
    """The numeric and length bounds of a property (first branch of an ``anyOf``)."""
    s = schema["anyOf"][0] if "anyOf" in schema else schema
    keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "maxLength")
    return {k: s[k] for k in keys if k in s}


def test_the_tools_show_the_limits_the_stream_enforces() -> None:
    # the module promises input schemas with the stream's limits; `reward`, `step`, `k`,
    # `lambda_`, `as_of` and the page limits were unbounded there (refused only later)
    from mcp import Client as McpClient

    from schemas import EpisodeOutcome, MemoryListQuery, RetrievalRequest

    async def tools() -> dict[str, Any]:
        async with McpClient(build_server(lambda: FakeClient([]))) as c:
            return {t.name: t.input_schema["properties"] for t in (await c.list_tools()).tools}

    got = asyncio.run(tools())
    t, r = Transition.model_json_schema()["properties"], RetrievalRequest.model_json_schema()
    o, q = EpisodeOutcome.model_json_schema()["properties"], MemoryListQuery.model_json_schema()
    want = {
        ("remember", "reward"): t["reward"],
        ("remember", "step"): t["step"],
        ("recall", "k"): r["properties"]["k"],
        ("recall", "lambda_"): r["properties"]["lambda"],
        ("recall", "as_of"): r["properties"]["as_of"],
        ("recall", "step"): r["properties"]["step"],
        ("report_outcome", "reward"): o["reward"],
        ("list_memories", "limit"): q["properties"]["limit"],
        ("list_memories", "cursor"): q["properties"]["cursor"],
    }
    for (tool, arg), stream in want.items():
        assert _bounds(got[tool][arg]) == _bounds(stream) != {}, (tool, arg)
    assert _bounds(got["memory_history"]["limit"]) == {"minimum": 1, "maximum": 10_000}
