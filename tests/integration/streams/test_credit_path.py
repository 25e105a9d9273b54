"""Delayed credit end to end: usage -> late outcome -> utility in Milvus, with
duplicate outcomes and a jobs-worker restart in the middle of the window."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dmem.client import Client
from dmem.wait import health, wait_settled
from schemas import EpisodeOutcome, Transition, encode
from streams.local.stack import LocalStack
from tests.integration.broker_fixtures import collect, isolated_env, produce

pytestmark = pytest.mark.integration


def memory(port: int, mid: str, tenant: str) -> dict[str, Any]:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{port}/v1/memories/{mid}?tenant={tenant}", timeout=20
    ) as r:
        return dict(json.loads(r.read()))


def wait_for(pred: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def test_credit_survives_restart_and_ignores_duplicate_outcomes(
    tmp_path: Path, broker: str, topic_prefix: str
) -> None:
    env = isolated_env(
        topic_prefix,
        DMEM_JOBS__CREDIT_DISCOUNT="0.5",
        DMEM_LOG_LEVEL="info",
    )
    stack = LocalStack(tmp_path / "data", roles=("all",), extra_env=env, broker_bootstrap=broker)
    stack.start()
    s = stack.settings
    try:
        trs = [
            Transition(
                tenant="acme",
                agent_id="a",
                episode_id="hist",
                step=i,
                observation=f"the budget is {100 * i} dollars"
                if i % 3 == 0
                else f"chatting about weather {i}",
                action="note",
                reward=-30.0 if i % 3 == 0 else 0.0,
            )
            for i in range(30)
        ]
        asyncio.run(produce(broker, s.topic("transitions"), [(b"a", encode(t)) for t in trs]))
        asyncio.run(collect(broker, [s.topic("memories")], lambda m: len(m) >= len(trs)))

        async def use() -> list:
            async with Client(broker, "acme", topic_prefix=s.kafka.topic_prefix) as c:
                for _ in range(60):
                    hits = await c.search(
                        "the budget is 300 dollars", k=3, episode_id="live-1", step=2
                    )
                    if hits:
                        return hits
                    await asyncio.sleep(0.5)
            return []

        hits = asyncio.run(use())
        assert hits
        asyncio.run(collect(broker, [s.topic("usage")], lambda m: len(m) >= 1))
        # restart the jobs worker after the usage and before the outcome
        stack.stop_workers()
        w = stack.start_worker("all")
        stack.wait_ready(w)
        port = stack.web_ports[0]
        before = {h.memory_id: memory(port, h.memory_id, "acme") for h in hits}
        assert all(r["utility"] == 0.0 and r["uses"] == 0 for r in before.values())

        outcome = EpisodeOutcome(tenant="acme", episode_id="live-1", reward=10.0, ts=1)
        asyncio.run(produce(broker, s.topic("feedback"), [(b"live-1", encode(outcome))]))
        after = wait_for(
            lambda: (
                (rows := {m: memory(port, m, "acme") for m in before})
                and all(r["uses"] == 1 for r in rows.values())
                and rows
            )
        )
        assert after, "credit was not applied after the restart"
        assert all(r["utility"] > 0 for r in after.values())
        # the served weights split the credit: higher weight, more credit
        utilities = [after[h.memory_id]["utility"] for h in hits]
        assert utilities == sorted(utilities, reverse=True)

        # a duplicate outcome and another restart change nothing
        asyncio.run(produce(broker, s.topic("feedback"), [(b"live-1", encode(outcome))]))
        stack.stop_workers()
        w = stack.start_worker("all")
        stack.wait_ready(w)
        port = stack.web_ports[0]
        url = f"http://127.0.0.1:{port}"
        # until the restarted jobs worker recognised the replayed outcome, and then has
        # nothing pending: a duplicate that were credited would have landed by then
        skipped = wait_for(lambda: health(url)["jobs"].get("credit_skipped", 0) >= 1)
        wait_settled([url], timeout_s=60)
        final = {m: memory(port, m, "acme") for m in before}
        for m in before:
            assert final[m]["uses"] == 1
            assert final[m]["utility"] == pytest.approx(after[m]["utility"])
        assert skipped, "the duplicate outcome was not recognised"  # replayed ids
        assert health(url)["jobs"]["credit_skipped"] >= 1
    finally:
        stack.stop()
