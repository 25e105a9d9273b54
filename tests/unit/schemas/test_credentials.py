"""Record credentials (`schemas.credentials`): derivation, signing, verification."""

from __future__ import annotations

import pytest

from schemas.credentials import (
    AGENT_HEADER,
    SERVICE_HEADER,
    ServiceSigner,
    TenantSigner,
    TenantVerifier,
    header,
    hkdf_sha256,
    reply_topic_for,
    tenant_key,
    token_id,
    topic_part,
)


def test_hkdf_matches_rfc5869_test_case_1() -> None:
    ikm = bytes.fromhex("0b" * 22)
    salt = bytes.fromhex("000102030405060708090a0b0c")
    info = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9")
    okm = hkdf_sha256(ikm, info, salt=salt, length=42)
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def test_keys_differ_per_tenant_and_token_and_ids_hide_the_token() -> None:
    assert tenant_key("tok", "a") != tenant_key("tok", "b")
    assert tenant_key("tok", "a") != tenant_key("tok2", "a")
    assert tenant_key("tok", "a") == tenant_key("tok", "a")
    kid = token_id("s3cret-token")
    assert len(kid) == 16 and "s3cret" not in kid and kid != token_id("other")


def test_a_token_signs_only_the_tenants_it_lists() -> None:
    verifier = TenantVerifier({"ta": ["a"], "ops": ["*"]})
    value = b'{"tenant":"a"}'
    assert verifier.tenant_ok("a", value, TenantSigner("ta").headers("a", value))
    # tenant A's token signing for B: a valid MAC of a token that does not list B
    assert not verifier.tenant_ok("b", value, TenantSigner("ta").headers("b", value))
    assert verifier.tenant_ok("b", value, TenantSigner("ops").headers("b", value))
    # an unknown token, no header, a garbled header
    assert not verifier.tenant_ok("a", value, TenantSigner("nope").headers("a", value))
    assert not verifier.tenant_ok("a", value, [])
    assert not verifier.tenant_ok("a", value, [(AGENT_HEADER, b"\xff\x00")])
    assert not verifier.tenant_ok("a", value, [(AGENT_HEADER, b"v1.x")])


def test_the_mac_covers_every_byte_of_the_value() -> None:
    verifier = TenantVerifier({"ta": ["a"]})
    value = b'{"tenant":"a","reward":1}'
    headers = TenantSigner("ta").headers("a", value)
    assert verifier.tenant_ok("a", value, headers)
    assert not verifier.tenant_ok("a", value.replace(b"1", b"9"), headers)
    # the verifier reads faust's mapping form too
    assert verifier.tenant_ok("a", value, dict(headers))


def test_service_signatures_bind_key_and_value_and_secret() -> None:
    svc = ServiceSigner(b"secret")
    h = svc.headers(b"acme|0", b"state")
    assert svc.ok(b"acme|0", b"state", h)
    assert not svc.ok(b"other|0", b"state", h)  # replayed under another tenant's key
    assert not svc.ok(b"acme|0", b"state2", h)
    assert not ServiceSigner(b"guess").ok(b"acme|0", b"state", h)
    assert not svc.ok(b"acme|0", b"state", [(SERVICE_HEADER, b"v1.")])
    assert not svc.ok(b"acme|0", b"state", None)
    assert header(h, SERVICE_HEADER).startswith(b"v1.")


@pytest.mark.parametrize("tenant", ["acme", "a.b", "a_2eb", "a_b", "x:y@z/w", "A-Z_09"])
def test_reply_topics_are_per_tenant_dot_free_and_injective(tenant: str) -> None:
    part = topic_part(tenant)
    assert "." not in part
    assert all(c.isalnum() or c in "-_" for c in part)
    others = ["acme", "a.b", "a_2eb", "a_b", "x:y@z/w", "A-Z_09", "a__b", "a", "ab"]
    assert sum(topic_part(o) == part for o in others) == (1 if tenant in others else 0)
    assert reply_topic_for("dmem.retrieval.responses", tenant) == (
        f"dmem.retrieval.responses.{part}"
    )


def test_long_tenants_stay_within_kafka_topic_limits() -> None:
    t1, t2 = "x:" * 64, "x:" * 63 + "y:"
    assert len(reply_topic_for("dmem.retrieval.responses", t1)) <= 249
    assert topic_part(t1) != topic_part(t2)
