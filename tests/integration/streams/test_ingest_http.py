"""HTTP ingest and librdkafka clients against the real stack (its own Tansu broker,
Milvus Lite, one `dmem worker --role all` with bearer tokens and a small ingest budget).

- ``POST /v1/transitions`` (JSON array), ``/v1/outcomes`` (NDJSON), ``/v1/feedback``:
  202 with the ids after the broker's ack; each transition lands once on the topic,
  and the surprising ones are stored (``GET /v1/memories/{id}``).
- 422 lists every reason of every bad record and produces nothing; 413 over the
  batch limit; 401 / 403 with the token scoping of search (a mixed batch is refused).
- Backpressure: with the broker paused (SIGSTOP), a request that fills the budget
  ends in 503 + Retry-After and one arriving meanwhile gets 429 + Retry-After;
  after the broker resumes, ingest answers 202 again.
- ``GET /openapi.json`` passes `openapi-spec-validator`.
- librdkafka: the system kcat's failure is pinned when it links librdkafka < 2.2
  (the Tansu/librdkafka tagged-field mismatch, `dmem_bench.kafka_clients`); kcat on a
  librdkafka >= 2.2 and confluent-kafka publish transitions that get stored, and a
  confluent-kafka consumer (session.timeout.ms 6 s) reads its group's records.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from schemas import Transition, stable_transition_id
from streams.local.embedded import EmbeddedBroker
from streams.local.stack import LocalStack
from tests.integration.broker_fixtures import collect, decode_all, isolated_env

pytestmark = pytest.mark.integration

TOKENS = {"tok-alpha": ["alpha"], "tok-ops": ["*"]}
BATCH = 20


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    b = EmbeddedBroker(log_path=Path(tmp_path_factory.mktemp("ingest-broker")) / "tansu.log")
    b.start()
    try:
        yield b
    finally:
        b.resume()
        b.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, own_broker: EmbeddedBroker) -> Any:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    env = isolated_env(
        prefix,
        DMEM_WRITE__BATCH_WITHIN_S="0.2",
        DMEM_AUTH__TOKENS=json.dumps(TOKENS),
        # the HTTP edge with tokens, and plain librdkafka clients producing unsigned
        # records: Kafka record credentials are off here (they are tested on their own
        # in test_kafka_credentials.py)
        DMEM_AUTH__KAFKA="false",
        DMEM_INGEST__MAX_BATCH=str(BATCH),
        DMEM_INGEST__MAX_INFLIGHT=str(2 * BATCH),
        DMEM_INGEST__MAX_INFLIGHT_PER_TENANT=str(BATCH),
        DMEM_INGEST__ACK_TIMEOUT_S="3",
        DMEM_INGEST__RETRY_AFTER_S="1",
    )
    s = LocalStack(
        tmp_path_factory.mktemp("ingest") / "data",
        roles=("all",),
        extra_env=env,
        broker_bootstrap=own_broker.bootstrap,
    )
    s.start()
    try:
        yield s
    finally:
        s.stop()


def call(stack: LocalStack, method: str, path: str, body: bytes | None = None,
         token: str | None = "tok-ops", ctype: str = "application/json",
         ) -> tuple[int, Any, dict[str, str]]:  # fmt: skip
    headers = {"content-type": ctype}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    url = f"http://127.0.0.1:{stack.web_ports[0]}{path}"
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, json.loads(raw) if raw else None, dict(e.headers)


def episode(tenant: str, ep: str, n: int = 10) -> list[dict[str, Any]]:
    """Transitions as plain JSON dicts; step 4 is a trap (surprising: stored)."""
    return [{"tenant": tenant, "agent_id": "agent", "episode_id": ep, "step": k,
             "observation": f"edge of crater {k} in {ep}" if k == 4 else f"quiet road {k}",
             "action": "jump" if k == 4 else "walk", "reward": -20.0 if k == 4 else -0.1}
            for k in range(n)]  # fmt: skip


def topic_records(stack: LocalStack, logical: str, until: Any) -> list[dict[str, Any]]:
    msgs = asyncio.run(
        collect(
            stack.bootstrap,
            [stack.settings.topic(logical)],
            lambda m: until(decode_all(m)),
            timeout_s=30,
        )
    )
    return decode_all(msgs)


def wait_stored(stack: LocalStack, tenant: str, memory_id: str, timeout_s: float = 90) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code, row, _ = call(stack, "GET", f"/v1/memories/{memory_id}?tenant={tenant}")
        if code == 200:
            return row
        time.sleep(0.5)
    raise AssertionError(f"{memory_id} not stored within {timeout_s}s")


def test_ingest_forms_ack_ids_and_store(stack: LocalStack) -> None:
    recs = episode("alpha", "ep-http", n=BATCH)
    for r in recs[5:]:  # a body of several socket reads (~100 kB)
        r["observation"] += " " + "far " * 1500
    code, body, _ = call(
        stack, "POST", "/v1/transitions", json.dumps(recs).encode(), token="tok-alpha"
    )
    assert code == 202, body
    want = [stable_transition_id("alpha", "agent", "ep-http", k) for k in range(BATCH)]
    assert body["ids"] == want and body["accepted"] == BATCH

    on_topic = topic_records(
        stack, "transitions", lambda rs: sum(r.get("episode_id") == "ep-http" for r in rs) >= BATCH
    )
    ids = [r["transition_id"] for r in on_topic if r.get("episode_id") == "ep-http"]
    assert sorted(ids) == sorted(want)  # each once: nothing lost, nothing doubled
    row = wait_stored(stack, "alpha", want[4])
    assert row["action"] == "jump" and row["tenant"] == "alpha"

    nd = b"\n".join(
        json.dumps(
            {"tenant": "alpha", "episode_id": f"ep-o{i}", "reward": 1.0, "outcome_id": f"o{i}"}
        ).encode()
        for i in range(3)
    )
    code, body, _ = call(
        stack, "POST", "/v1/outcomes", nd, token="tok-alpha", ctype="application/x-ndjson"
    )
    assert (code, body["ids"]) == (202, ["o0", "o1", "o2"])
    code, body, _ = call(
        stack,
        "POST",
        "/v1/feedback",
        json.dumps(
            {"tenant": "alpha", "memory_id": want[4], "kind": "thumbs_up", "value": 1}
        ).encode(),
        token="tok-alpha",
    )
    assert code == 202 and len(body["ids"]) == 1
    fb_id = body["ids"][0]
    fb = topic_records(stack, "feedback", lambda rs: any(r.get("feedback_id") == fb_id for r in rs))
    assert {r.get("outcome_id") for r in fb} >= {"o0", "o1", "o2"}
    assert [r["memory_id"] for r in fb if r.get("feedback_id") == fb_id] == [want[4]]

    # what the agent acted on, for credit: one usage record on the usage topic
    usage = {"tenant": "alpha", "episode_id": "ep-http", "request_id": "req-u1", "step": 4,
             "memory_ids": [want[4]], "weights": [1.0], "source": "agent", "ts": 5}  # fmt: skip
    code, body, _ = call(stack, "POST", "/v1/usage", json.dumps(usage).encode(),
                         token="tok-alpha")  # fmt: skip
    assert (code, body["ids"]) == (202, ["req-u1"])
    used = topic_records(stack, "usage", lambda rs: any(r.get("request_id") == "req-u1"
                                                       for r in rs))  # fmt: skip
    assert [(r["memory_ids"], r["source"]) for r in used if r["request_id"] == "req-u1"] == [
        ([want[4]], "agent")
    ]
    bad = {**usage, "weights": [-1.0]}
    assert call(stack, "POST", "/v1/usage", json.dumps(bad).encode(), token="tok-alpha")[0] == 422
    other = {**usage, "tenant": "beta"}
    assert call(stack, "POST", "/v1/usage", json.dumps(other).encode(), token="tok-alpha")[0] == 403


def test_ingest_rejects_with_every_reason(stack: LocalStack) -> None:
    good = episode("alpha", "ep-bad", n=1)[0]
    bad = [
        {**good, "step": -1},
        good,
        {**good, "step": 2, "observation": None, "action": None},
        "not an object",
    ]
    code, body, _ = call(stack, "POST", "/v1/transitions", json.dumps(bad).encode())
    assert code == 422
    by_index: dict[int, list[Any]] = {}
    for e in body["detail"]:
        by_index.setdefault(e["index"], []).append(e["loc"])
    assert sorted(by_index) == [0, 2, 3]
    assert ["step"] in by_index[0] and ["action"] in by_index[2]
    lines = json.dumps(good).encode() + b"\n{broken\n"
    code, body, _ = call(stack, "POST", "/v1/transitions", lines, ctype="application/x-ndjson")
    assert code == 422 and body["detail"][0]["line"] == 2
    too_many = json.dumps(episode("alpha", "ep-big", n=BATCH + 1)).encode()
    assert call(stack, "POST", "/v1/transitions", too_many)[0] == 413
    # none of it was produced: the good record of the rejected batches is not on the topic
    # before a record accepted after them (the same key: the same partition, so behind
    # anything the ingest producer had sent for them)
    after = json.dumps(episode("alpha", "ep-after-bad", n=1)).encode()
    assert call(stack, "POST", "/v1/transitions", after)[0] == 202

    def closed(rs: list[dict[str, Any]]) -> bool:
        return any(r.get("episode_id") == "ep-after-bad" for r in rs)

    seen = topic_records(stack, "transitions", closed)
    assert closed(seen), "the record accepted after the rejected batches is not on the topic"
    assert not [r for r in seen if r.get("episode_id") in ("ep-bad", "ep-big")]


def test_ingest_auth_scopes_tenants(stack: LocalStack) -> None:
    one = json.dumps(episode("beta", "ep-auth", n=1)).encode()
    assert call(stack, "POST", "/v1/transitions", one, token=None)[0] == 401
    assert call(stack, "POST", "/v1/transitions", one, token="nope")[0] == 401
    assert call(stack, "POST", "/v1/transitions", one, token="tok-alpha")[0] == 403
    mixed = json.dumps(episode("alpha", "ep-mix", n=1) + episode("beta", "ep-mix", n=1))
    assert call(stack, "POST", "/v1/transitions", mixed.encode(), token="tok-alpha")[0] == 403
    assert call(stack, "POST", "/v1/transitions", one, token="tok-ops")[0] == 202


def test_ingest_backpressure_when_broker_away(
    stack: LocalStack, own_broker: EmbeddedBroker
) -> None:
    full = json.dumps(episode("alpha", "ep-bp", n=BATCH)).encode()
    one = json.dumps(episode("alpha", "ep-bp1", n=1)).encode()
    assert call(stack, "POST", "/v1/transitions", one)[0] == 202  # producer connected
    out: dict[str, Any] = {}
    own_broker.pause()
    try:
        t = threading.Thread(
            target=lambda: out.setdefault("full", call(stack, "POST", "/v1/transitions", full))
        )
        t0 = time.monotonic()
        t.start()
        time.sleep(1.0)  # the first request holds alpha's whole share of the budget now
        code, body, headers = call(stack, "POST", "/v1/transitions", one)
        assert code == 429 and headers.get("Retry-After") == "1", body
        assert "tenant 'alpha'" in body["error"]
        # another tenant keeps its share: not refused, it waits for the broker like alpha's
        other = json.dumps(episode("beta", "ep-bp-beta", n=1)).encode()
        code, body, _ = call(stack, "POST", "/v1/transitions", other)
        assert code == 503 and "broker unavailable" in body["error"], body
        assert "127.0.0.1" not in body["error"]  # no internal address in an error body
        t.join(30)
        code, body, headers = out["full"]
        assert code == 503 and headers.get("Retry-After") == "1", body
        assert time.monotonic() - t0 < 15
    finally:
        own_broker.resume()
    deadline = time.monotonic() + 30
    while (code := call(stack, "POST", "/v1/transitions", one)[0]) != 202:
        assert code == 503 and time.monotonic() < deadline
        time.sleep(1)


def test_openapi_document_is_valid(stack: LocalStack) -> None:
    from openapi_spec_validator import validate

    code, doc, _ = call(stack, "GET", "/openapi.json", token=None)
    assert code == 200
    validate(doc)
    assert doc["openapi"].startswith("3.1")
    body = doc["paths"]["/v1/transitions"]["post"]["requestBody"]["content"]
    assert body["application/json"]["schema"]["oneOf"][1]["maxItems"] == BATCH
    assert set(doc["components"]["schemas"]["Transition"]["required"]) >= {
        "tenant",
        "agent_id",
        "episode_id",
        "step",
        "action",
    }


def test_librdkafka_clients_publish_to_the_embedded_broker(
    stack: LocalStack, tmp_path: Path
) -> None:
    from dmem_bench import kafka_clients as kc

    kcat = kc.kcat_command(tmp_path / "rdk")
    if isinstance(kcat, str):
        pytest.skip(kcat)
    topic = stack.settings.topic("transitions")
    if kc._tuple(kcat.system_librdkafka) < kc.MIN_LIBRDKAFKA:  # pin the limitation
        err = kc.system_kcat_error(stack.bootstrap, topic)
        assert err is not None and "Read underflow" in err
    tk = [Transition.model_validate(r) for r in episode("alpha", "ep-kcat")]
    res = kc.kcat_produce(
        kcat, stack.bootstrap, topic, [(t.agent_id, t.model_dump_json()) for t in tk]
    )
    assert res.returncode == 0, res.stderr
    tc = [Transition.model_validate(r) for r in episode("alpha", "ep-ck")]
    acked = kc.confluent_produce(
        stack.bootstrap, topic, [(t.agent_id.encode(), t.model_dump_json().encode()) for t in tc]
    )
    assert acked == len(tc)
    for t in (tk[4], tc[4]):  # the traps of both episodes are stored
        assert wait_stored(stack, "alpha", t.memory_id)["action"] == "jump"
    got, first_s = kc.confluent_consume(
        stack.bootstrap, topic, f"g-{uuid.uuid4().hex[:6]}", n=len(tk) + len(tc), timeout_s=30
    )
    assert got >= len(tk) + len(tc) and 0 <= first_s < 20
