"""Scrape ``GET /metrics`` of a real write worker (Tansu broker, Milvus Lite, hash encoder)."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

import pytest

from schemas import encode
from streams.local.stack import LocalStack
from streams.metrics import tenant_label
from tests.integration.broker_fixtures import collect, isolated_env, produce
from tests.integration.streams.test_write_path import corridor

pytestmark = pytest.mark.integration

#: the default `metrics_tenant_labels=hash`: the page never names the tenant
ACME = tenant_label("acme", "hash")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text format -> {(name, labels): value}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, line
        name, labels, value = m.groups()
        pairs = frozenset(re.findall(r'(\w+)="([^"]*)"', labels or ""))
        out[(name, pairs)] = float(value)
    return out


def samples(
    parsed: dict[tuple[str, frozenset[tuple[str, str]]], float], metric: str, /, **labels: str
) -> list[float]:
    want = set(labels.items())
    return [v for (n, ls), v in parsed.items() if n == metric and want <= set(ls)]


def test_metrics_endpoint_exposes_gate_dead_letters_thresholds(
    tmp_path: Path, broker: str, topic_prefix: str
) -> None:
    env = isolated_env(
        topic_prefix,
        DMEM_WRITE__BATCH_WITHIN_S="0.2",
    )
    good = corridor(12)
    records: list[tuple[bytes | None, bytes]] = [(t.agent_id.encode(), encode(t)) for t in good]
    records.insert(7, (b"bad", b'{"tenant": "acme", "agent_id": '))  # malformed JSON
    stack = LocalStack(tmp_path / "data", roles=("write",), extra_env=env, broker_bootstrap=broker)
    with stack as st:
        s = st.settings
        asyncio.run(produce(broker, s.topic("transitions"), records))
        out = asyncio.run(
            collect(
                broker,
                [s.topic("memories"), s.topic("deadletter")],
                lambda m: len(m) >= len(records),
            )
        )
        assert len(out) == len(records)
        url = f"http://127.0.0.1:{st.web_ports[0]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            ctype = resp.headers["Content-Type"]
            text = resp.read().decode()
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype
    m = parse(text)
    routes = {
        r: sum(samples(m, "dmem_gate_decisions_total", route=r, tenant=ACME))
        for r in ("core", "buffer", "drop")
    }
    assert sum(routes.values()) == len(good), routes
    assert routes["core"] > 0 and routes["drop"] > 0
    assert samples(m, "dmem_dead_letters_total", reason="malformed_json") == [1.0]
    low = samples(m, "dmem_gate_rpe", tenant=ACME, name="theta_low")
    high = samples(m, "dmem_gate_rpe", tenant=ACME, name="theta_high")
    assert len(low) == 1 and len(high) == 1 and 0.0 < low[0] <= high[0]
    assert samples(m, "dmem_gate_rpe", tenant=ACME, name="q50")
    loss = samples(m, "dmem_value_loss", tenant=ACME)
    assert len(loss) == 1 and loss[0] >= 0.0
    assert samples(m, "dmem_milvus_latency_seconds_count", op="write")[0] >= 1
    assert samples(m, "dmem_store_healthy") == [1.0]
    assert samples(m, "dmem_memories", partition="core") == [routes["core"]]
    assert samples(m, "dmem_records_total") == [float(len(records))]
    # lag of the transitions partitions assigned to this worker: present, not negative
    lag = samples(m, "dmem_consumer_lag", topic=s.topic("transitions"))
    assert lag and all(v >= 0 for v in lag)
    assert "acme" not in text  # open to scrapers: tenant ids are hashed
    # declared even when unused by this role
    assert "# TYPE dmem_credit_updates_applied_total counter" in text
    assert "# TYPE dmem_milvus_latency_seconds histogram" in text
