"""The live page against a real stack: Tansu broker, one all-roles worker, Milvus Lite.

Two tenants are seeded over Kafka (plus one malformed record for the dead letters);
headless Chromium opens the page with a token in the URL fragment (`ui_check`, the
same check `dmem bench embedded` reports as ``ui_ok``): it loads, shows the seeded
tenant's counts as ``/v1/stats`` gives them, and a search renders hits with their
score bars. Auth: the shell is public, every data call needs the token, a token
sees only its tenants and no dead letters.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dmem_bench.demo import q_learning_transitions
from dmem_bench.ui import chromium_path, ui_check
from schemas import encode
from streams.local.stack import LocalStack
from tests.integration.broker_fixtures import produce, tokened_stack

pytestmark = pytest.mark.integration

TOKENS = {"tok-ops": ["*"], "tok-rep": ["rep"]}


def get(url: str, token: str | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token
                                 else {})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def live(base: str, token: str, tenant: str = "rep") -> dict[str, Any]:
    status, _, body = get(f"{base}/v1/live?tenant={tenant}", token)
    assert status == 200, body
    return dict(json.loads(body))


@pytest.fixture
def stack(tmp_path: Path, broker: str, topic_prefix: str) -> Iterator[LocalStack]:
    with tokened_stack(tmp_path / "data", broker, topic_prefix, TOKENS) as s:
        yield s


@pytest.mark.skipif(chromium_path() is None, reason="no chromium (scripts/setup.sh installs it)")
def test_live_page_in_headless_chromium(stack: LocalStack) -> None:
    s = stack.settings
    records = [(tr.agent_id.encode(), encode(tr)) for tenant in ("rep", "other")
               for tr, _c, _p in q_learning_transitions("cliffwalking", 300, seed=3,
                                                         tenant=tenant)]  # fmt: skip
    records.append((b"bad", b"{not json"))
    # with tokens configured, Kafka records carry the credential of a token
    asyncio.run(produce(s.kafka.bootstrap, s.topic("transitions"), records, token="tok-ops"))
    base = f"http://127.0.0.1:{stack.web_ports[0]}"

    deadline = time.monotonic() + 90
    data = live(base, "tok-ops")
    while time.monotonic() < deadline and (
        (data["gate"] or {}).get("decisions", 0) < 300
        or not data["dead_letters"]
        or len(data["tenants"]) < 2
    ):
        time.sleep(1)
        data = live(base, "tok-ops")
    gate = data["gate"]
    assert gate["decisions"] == 300, data["feed"]
    assert sum(gate["routes"].values()) == 300 and gate["routes"]["core"] > 0
    assert gate["theta_high"] is not None and gate["series"] and gate["histogram"]
    assert {d["reason"] for d in gate["latest"]} - {""}  # every decision says why
    assert any("malformed JSON" in d["reason"] for d in data["dead_letters"])
    assert {t["tenant"] for t in data["tenants"]} == {"rep", "other"}
    rep = next(t for t in data["tenants"] if t["tenant"] == "rep")
    # what was written, less what dedup merged since
    assert 0 < rep["total"] <= gate["routes"]["core"] + gate["routes"]["buffer"]

    # auth: the shell is public (and locked down by CSP), the data are not
    status, headers, page = get(f"{base}/ui/")
    assert status == 200 and b"/ui/static/ui.js" in page
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert get(f"{base}/ui/static/ui.js")[0] == 200 and get(f"{base}/ui/static/x.py")[0] == 404
    assert get(f"{base}/v1/live")[0] == 401
    assert get(f"{base}/v1/live?tenant=other", "tok-rep")[0] == 403
    scoped = live(base, "tok-rep")
    assert [t["tenant"] for t in scoped["tenants"]] == ["rep"] and scoped["dead_letters"] is None
    # counts over every tenant: an all-tenant token's, never a scoped one's or /health's
    assert "events_seen" not in scoped["feed"] and live(base, "tok-ops")["feed"]["events_seen"]
    _, _, health = get(f"{base}/health")
    assert b"events_seen" not in health and b"tenants_known" not in health

    ok, reason = ui_check(base, "tok-rep", "rep")
    assert ok, reason
    assert "like /v1/stats" in reason and "hits with score bars" in reason
    ok, reason = ui_check(base, None, "rep")  # no token: refused, and says why
    assert not ok and "401" in reason
