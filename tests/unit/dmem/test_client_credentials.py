"""The SDK's Kafka credential: what a client with a token signs and where it reads."""

from __future__ import annotations

import asyncio
from typing import Any

from dmem.client import Client
from schemas import Transition
from schemas.credentials import TenantVerifier, reply_topic_for


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, Any]]] = []

    async def send(self, topic: str, value: bytes, key: bytes, **kw: Any) -> None:
        self.sent.append((topic, value, kw))

    async def send_and_wait(self, topic: str, value: bytes, key: bytes, **kw: Any) -> None:
        self.sent.append((topic, value, kw))

    async def flush(self) -> None:
        pass


def _run(client: Client) -> list[tuple[str, bytes, dict[str, Any]]]:
    producer = FakeProducer()
    client._producer = producer  # type: ignore[assignment]
    client._started = True  # noqa: SLF001
    t = Transition(tenant="acme", agent_id="a", episode_id="e", step=0, observation="x",
                   action="go")  # fmt: skip

    async def go() -> None:
        await client.publish(t)
        await client.report_outcome("e", 1.0)
        await client.feedback(memory_id=t.memory_id)
        await client.report_usage("e", "r1", {t.memory_id: 1.0})

    asyncio.run(go())
    return producer.sent


def test_a_client_with_a_token_signs_every_record_for_its_tenant() -> None:
    client = Client("127.0.0.1:9092", "acme", token="tok")
    sent = _run(client)
    assert [topic.rsplit(".", 1)[-1] for topic, _, _ in sent] == [
        "transitions", "feedback", "feedback", "usage"]  # fmt: skip
    verifier = TenantVerifier({"tok": ["acme"]})
    assert all(verifier.tenant_ok("acme", value, kw["headers"]) for _, value, kw in sent)
    assert not any(verifier.tenant_ok("other", value, kw["headers"]) for _, value, kw in sent)
    assert client.reply_topic == reply_topic_for("dmem.retrieval.responses", "acme")
    assert client._own_reply() == client.reply_topic


def test_a_client_without_a_token_sends_no_credential_and_reads_the_shared_topic() -> None:
    client = Client("127.0.0.1:9092", "acme")
    sent = _run(client)
    assert sent and all("headers" not in kw for _, _, kw in sent)
    assert client.reply_topic == "dmem.retrieval.responses"
    assert client._own_reply() is None


def test_a_long_tenant_still_names_its_own_reply_topic() -> None:
    # its reply topic passes 128 characters; the request left it out (an id's limit), a
    # deployment with credentials off then answered on the shared topic, which this
    # client does not read: every Kafka search timed out
    from schemas import RetrievalRequest

    tenant = "org:acme.co.uk/team:research.and.development/user:jane.q.public@mail.example.co.uk"
    client = Client("127.0.0.1:9092", tenant, token="tok")
    assert len(client.reply_topic) > 128
    assert client._own_reply() == client.reply_topic
    sent = _run_search(client)
    req = RetrievalRequest.model_validate_json(sent)
    assert req.reply_topic == client.reply_topic


def _run_search(client: Client) -> bytes:
    producer = FakeProducer()
    client._producer = producer  # type: ignore[assignment]
    client._started = True  # noqa: SLF001
    client.retries, client.timeout_s = 0, 0.01

    async def go() -> None:
        try:
            await client.search("where?")
        except Exception:  # noqa: BLE001 - no responder here: only the request matters
            pass

    asyncio.run(go())
    ((_topic, value, _kw),) = producer.sent
    return value
