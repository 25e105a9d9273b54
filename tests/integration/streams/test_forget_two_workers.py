"""A forget through one worker is gone from another worker's reads, end to end.

Two processes share the Tansu broker and a Milvus 2.3.5 server: an ``all`` worker
(write path, jobs, responder) and a ``respond`` worker that serves reads only. A
memory is forgotten over the ``all`` worker's HTTP API; the ``respond`` worker
hears the notice on ``control`` (its `ForgetFollower`), tombstones the key, and from
then on every read it serves leaves the memory out: by id, in a list, in a search
(its ``/health`` shows the notice applied and the tombstone held).
The audit trail (the ``forgotten`` event in the memory's history) is readable
through the other worker too.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streams.local.stack import LocalStack
from tests.integration.broker_fixtures import isolated_env

pytestmark = pytest.mark.integration

TENANT = "alpha"


def call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def episode(ep: str) -> list[dict[str, Any]]:
    return [{"tenant": TENANT, "agent_id": "agent-1", "episode_id": ep, "step": k,
             "ts": 1_700_000_000_000 + 1000 * k,
             "observation": "the cellar door is locked" if k == 4
             else f"walking down the long hall past painting {k}",
             "action": "use key on door" if k == 4 else "walk",
             "reward": 10.0 if k == 4 else 0.0} for k in range(10)]  # fmt: skip


@pytest.fixture
def stack(tmp_path: Path, broker: str, topic_prefix: str,
          milvus_server_uri: str) -> Iterator[LocalStack]:  # fmt: skip
    env = isolated_env(topic_prefix, DMEM_WRITE__BATCH_WITHIN_S="0.2",
                       DMEM_MILVUS__URI=milvus_server_uri)  # fmt: skip
    s = LocalStack(tmp_path / "data", roles=("all", "respond"), extra_env=env,
                   broker_bootstrap=broker)  # fmt: skip
    s.start()
    try:
        yield s
    finally:
        s.stop()


def reads(base: str, mid: str) -> dict[str, bool]:
    """Whether each kind of read the ``base`` worker serves still shows ``mid``."""
    code, _ = call(base, "GET", f"/v1/memories/{mid}?tenant={TENANT}")
    assert code in (200, 404)
    _, listed = call(base, "GET", f"/v1/memories?tenant={TENANT}&limit=500")
    _, found = call(base, "POST", "/v1/search",
                    {"tenant": TENANT, "query": "the cellar door is locked", "k": 5})  # fmt: skip
    return {
        "get": code == 200,
        "list": any(m["memory_id"] == mid for m in listed["memories"]),
        "search": any(h["memory_id"] == mid for h in found["hits"]),
    }


def test_a_forget_on_one_worker_hides_the_memory_on_the_other(stack: LocalStack) -> None:
    origin, other = (f"http://127.0.0.1:{p}" for p in stack.web_ports)
    assert [w.role for w in stack.workers] == ["all", "respond"]
    for e in range(2):
        code, body = call(origin, "POST", "/v1/transitions", episode(f"ep{e}"))
        assert code == 202, body
    deadline = time.monotonic() + 90
    mid = None
    while mid is None and time.monotonic() < deadline:
        code, body = call(other, "GET", f"/v1/memories?tenant={TENANT}&limit=500")
        assert code == 200, body
        mid = next((m["memory_id"] for m in body["memories"]
                    if m["action"] == "use key on door"), None)  # fmt: skip
        time.sleep(0.3)
    assert mid is not None, "the rewarded step never reached the other worker's reads"
    assert reads(other, mid) == {"get": True, "list": True, "search": True}
    _, health = call(other, "GET", "/health")
    assert "forgets" in health, f"the respond worker follows no forget notices: {health}"
    applied_before = health["forgets"]["applied"]

    code, body = call(origin, "POST", "/v1/forget", {"tenant": TENANT, "memory_id": mid})
    assert code == 200, body
    t0 = time.monotonic()
    while any(reads(other, mid).values()) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    hidden_after_s = time.monotonic() - t0
    assert hidden_after_s < 5, f"the other worker still served it {hidden_after_s:.1f} s later"
    # it heard the notice itself and holds the key's tombstone (the count rises once the
    # re-delete behind the tombstone is done)
    deadline = time.monotonic() + 10
    while True:
        _, health = call(other, "GET", "/health")
        if health["forgets"]["applied"] > applied_before or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert health["forgets"]["applied"] > applied_before, health["forgets"]
    assert health["forgets"]["tombstones"] >= 1, health["forgets"]
    for _ in range(10):  # and it never comes back
        assert reads(other, mid) == {"get": False, "list": False, "search": False}
        assert reads(origin, mid) == {"get": False, "list": False, "search": False}
        time.sleep(0.2)

    # the audit trail, through the worker that did not run the forget
    kinds: list[str] = []
    deadline = time.monotonic() + 60
    while "forgotten" not in kinds and time.monotonic() < deadline:
        code, body = call(other, "GET", f"/v1/memories/{mid}/history?tenant={TENANT}")
        kinds = [e["kind"] for e in body.get("events", [])] if code == 200 else []
        time.sleep(0.3)
    assert "forgotten" in kinds, kinds
    assert kinds[0] == "written" and kinds[-1] == "forgotten", kinds
