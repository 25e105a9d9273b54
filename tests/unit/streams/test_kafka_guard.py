"""`streams.auth.KafkaGuard`: when Kafka credentials are enforced, and what passes."""

from __future__ import annotations

import pytest

from schemas import RetrievalRequest
from schemas.credentials import ServiceSigner, TenantSigner
from schemas.errors import InvalidRecord
from streams.auth import KafkaGuard
from streams.respond.replies import KafkaReplies
from streams.settings import Settings


def _settings(**auth: object) -> Settings:
    return Settings(auth=auth)


def test_off_when_auth_is_disabled_or_no_tokens_unless_forced() -> None:
    assert not KafkaGuard.from_settings(_settings(disabled=True, tokens={"t": ["a"]})).enabled
    assert not KafkaGuard.from_settings(_settings()).enabled  # no tokens: as before
    assert KafkaGuard.from_settings(_settings(tokens={"t": ["a"]})).enabled
    assert KafkaGuard.from_settings(_settings(kafka=True)).enabled  # fail closed
    assert not KafkaGuard.from_settings(_settings(tokens={"t": ["a"]}, kafka=False)).enabled


def test_disabled_guard_trusts_everything_and_signs_nothing() -> None:
    g = KafkaGuard(False, {}, None)
    assert g.agent_ok("b", None, b"x", [])
    assert g.internal_ok(b"k", b"x", [], "control")
    assert g.sign(b"k", b"x") == []


def test_enabled_guard_checks_agents_and_internal_records() -> None:
    g = KafkaGuard(True, {"ta": frozenset({"a"})}, "s3cret")
    v = b'{"tenant":"a"}'
    assert g.agent_ok("a", b"k", v, TenantSigner("ta").headers("a", v))
    assert not g.agent_ok("b", b"k", v, TenantSigner("ta").headers("b", v))
    assert not g.agent_ok("a", b"k", v, [])
    assert g.refused_agent == 2
    # the service may act for any tenant (an operator's import)
    assert g.agent_ok("b", b"k", v, g.sign(b"k", v))
    assert g.internal_ok(b"k", v, g.sign(b"k", v), "control")
    assert not g.internal_ok(b"k", v, ServiceSigner(b"guess").headers(b"k", v), "control")
    assert not g.internal_ok(b"k", v, TenantSigner("ta").headers("a", v), "control")
    assert g.refused_internal == 2


def test_every_worker_derives_the_same_service_key() -> None:
    tokens = {"ta": frozenset({"a"}), "tb": frozenset({"b"})}
    one = KafkaGuard(True, tokens, None)
    two = KafkaGuard(True, dict(reversed(tokens.items())), None)
    assert two.internal_ok(b"k", b"v", one.sign(b"k", b"v"), "control")
    other = KafkaGuard(True, {"ta": frozenset({"a"})}, None)
    assert not other.internal_ok(b"k", b"v", one.sign(b"k", b"v"), "control")
    explicit = KafkaGuard(True, tokens, "s")
    assert KafkaGuard(True, {}, "s").internal_ok(b"k", b"v", explicit.sign(b"k", b"v"), "x")


def test_reply_topics_with_credentials_on_stay_within_the_tenant() -> None:
    def req(tenant: str, reply_topic: str | None = None) -> RetrievalRequest:
        return RetrievalRequest(request_id="r", tenant=tenant, query="q", reply_topic=reply_topic)

    s = _settings(tokens={"t": ["a"]})
    on = KafkaReplies(None, s, KafkaGuard.from_settings(s))  # type: ignore[arg-type]
    shared = s.topic("responses")
    assert on.name(req("a")) == f"{shared}.a"
    assert on.name(req("a.b")) == f"{shared}.a_2eb"
    assert on.name(req("a", f"{shared}.a.mine")) == f"{shared}.a.mine"
    for foreign in (shared, f"{shared}.b", f"{shared}.ab", f"{shared}.a_2eb"):
        with pytest.raises(InvalidRecord):
            on.name(req("a", foreign))
    off = KafkaReplies(None, Settings(), KafkaGuard.from_settings(Settings()))  # type: ignore[arg-type]
    assert off.name(req("a")) == shared  # as before: the shared topic
    assert off.name(req("a", f"{shared}.a")) == f"{shared}.a"
    with pytest.raises(InvalidRecord):
        off.name(req("a", "dmem.memories"))
    for replies in (on, off):  # an id may hold ":@/", a Kafka topic name may not
        with pytest.raises(InvalidRecord, match="only letters"):
            replies.name(req("a", f"{shared}.a.x:y/z"))
