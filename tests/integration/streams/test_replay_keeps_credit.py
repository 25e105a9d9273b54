"""A transition published again to a worker with no state of it (`dmem up` restarted:
its broker, topics and checkpoints are memory-only; a re-imported log) leaves the
stored memory as it was: what it earned (its utility and the ids of the feedback
applied) stays. Real
broker, Milvus server; the second stack has topics of its own and the same
collection, as a restarted `dmem up` has."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from dmem.wait import wait_settled
from schemas import Feedback, Transition, encode
from schemas.models import stable_transition_id
from streams.local.stack import LocalStack
from tests.integration.broker_fixtures import isolated_env, produce

pytestmark = pytest.mark.integration


def get(url: str, path: str, **query: str) -> Any:
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(query)}", timeout=30) as r:
        return json.loads(r.read())


def test_a_replay_keeps_what_the_memory_earned(tmp_path: Path, broker: str, topic_prefix: str,
                                               milvus_server_uri: str) -> None:  # fmt: skip
    env = isolated_env(topic_prefix, DMEM_MILVUS__URI=milvus_server_uri,
                       DMEM_GATE__WARMUP="1000", DMEM_GATE__FLOOR="0.0",
                       DMEM_WRITE__BATCH_WITHIN_S="0.2")  # fmt: skip
    trs = [Transition(tenant="acme", agent_id="a", episode_id="e", step=k,
                      observation=f"room {k}: a door and a lamp", action="look",
                      reward=5.0 if k == 3 else 0.0, ts=1_600_000_000_000 + k * 1000)
           for k in range(6)]  # fmt: skip
    mid = stable_transition_id("acme", "a", "e", 3)
    fb = Feedback(tenant="acme", memory_id=mid, kind="thumbs_up", feedback_id="fb-1",
                  ts=1_600_000_010_000)  # fmt: skip

    def run(n: int, feedback: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        fresh = isolated_env(f"{topic_prefix.rstrip('.')}r{n}.")  # topics, group, app id
        fresh["DMEM_MILVUS__COLLECTION"] = env["DMEM_MILVUS__COLLECTION"]  # the same store
        stack = LocalStack(tmp_path / f"run{n}", roles=("all",), broker_bootstrap=broker,
                           extra_env={**env, **fresh})  # fmt: skip
        stack.start()
        s, url = stack.settings, f"http://127.0.0.1:{stack.web_ports[0]}"
        try:
            asyncio.run(produce(broker, s.topic("transitions"), [(b"a", encode(t)) for t in trs]))
            wait_settled([url], timeout_s=90)
            if feedback:
                asyncio.run(produce(broker, s.topic("feedback"), [(mid.encode(), encode(fb))]))
                wait_settled([url], timeout_s=90)
            row = get(url, f"/v1/memories/{mid}", tenant="acme")
            events = get(url, f"/v1/memories/{mid}/history", tenant="acme")["events"]
            return row, events
        finally:
            stack.stop()

    first, _ = run(1, feedback=True)
    assert first["utility"] > 0 and first["partition"] == "core"
    assert first["metadata"]["credit_ids"]
    again, events = run(2, feedback=False)  # restarted, then the transitions sent again
    assert again["utility"] == pytest.approx(first["utility"])  # a fresh row has 0
    assert again["partition"] == "core" and again["text"] == first["text"]
    assert again["metadata"]["credit_ids"] == first["metadata"]["credit_ids"]
    assert [e["kind"] for e in events].count("fed_back") == 1, events
