"""Record credentials on Kafka: who may produce a record, carried in its headers.

Two kinds, both HMAC-SHA256 over the record's exact bytes (nothing is re-encoded,
so producer and verifier cannot disagree about a canonical form):

- Agent records (transitions, outcomes, feedback, usage, retrieval requests)
  carry ``dmem-auth: v1.<token id>.<mac>``. The MAC key is derived per
  (token, tenant) with HKDF (RFC 5869) from the API token, so a token listed for
  tenant A yields no valid MAC for tenant B; the token id is a keyed hash of the
  token (it names the token without revealing it). The verifier holds the token
  map (`streams.auth`) and checks that the named token lists the record's tenant.
  The MAC covers the value only: the value names the tenant, and a record moved
  to another topic still speaks for that tenant alone.
- Internal records (control notices, checkpoints, memory events, utility
  updates, the responder's usage) carry ``dmem-sig: v1.<mac>`` under a service
  key derived from the deployment's secret; the MAC covers key and value, so a
  checkpoint cannot be replayed under another tenant's state key.

Importable by agents: standard library only (the SDK has no crypto dependency).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from typing import Any

AGENT_HEADER = "dmem-auth"
SERVICE_HEADER = "dmem-sig"
VERSION = "v1"
#: the token map's wildcard: a token listing it may write for every tenant
ALL_TENANTS = "*"

_SALT = b"dmem kafka credentials v1"
_TENANT_INFO = b"dmem tenant key\x00"
_SERVICE_INFO = b"dmem service key\x00"
_KID_KEY = b"dmem token id"

#: Kafka topic names allow [A-Za-z0-9._-]; tenants may also hold ``:@/``
_TOPIC_SAFE = re.compile(r"[A-Za-z0-9-]")
#: longest tenant part of a topic name (Kafka allows 249 characters in all)
_MAX_TOPIC_PART = 160

Headers = list[tuple[str, bytes]]


def hkdf_sha256(ikm: bytes, info: bytes, salt: bytes = _SALT, length: int = 32) -> bytes:
    """HKDF-SHA256 (RFC 5869): extract, then expand to ``length`` bytes."""
    if length > 255 * 32:
        raise ValueError("HKDF output too long")
    prk = hmac.new(salt or b"\x00" * 32, ikm, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


def token_id(token: str) -> str:
    """A short public name of a token (keyed BLAKE2b): says which key to use."""
    return hashlib.blake2b(token.encode(), key=_KID_KEY, digest_size=8).hexdigest()


def tenant_key(token: str, tenant: str) -> bytes:
    """The MAC key of `tenant`'s records signed with `token`."""
    return hkdf_sha256(token.encode(), _TENANT_INFO + tenant.encode())


def service_key(secret: bytes) -> bytes:
    """The service's MAC key, from the deployment's secret."""
    return hkdf_sha256(secret, _SERVICE_INFO)


def _mac(key: bytes, *parts: bytes) -> str:
    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:  # length-prefixed: (key, value) pairs cannot be re-split
        h.update(len(p).to_bytes(8, "big"))
        h.update(p)
    return h.hexdigest()


def header(headers: Iterable[tuple[str, bytes]] | Mapping[str, bytes] | None, name: str) -> bytes:
    """The last value of header `name` (aiokafka gives pairs, faust may give a mapping)."""
    if not headers:
        return b""
    items = headers.items() if isinstance(headers, Mapping) else headers
    found = b""
    for k, v in items:
        if k == name and isinstance(v, bytes | bytearray):
            found = bytes(v)
    return found


class TenantSigner:
    """Signs an agent's records with its API token (the SDK, MCP server, adapters)."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("empty token")
        self.token = token
        self.kid = token_id(token)
        self._keys: dict[str, bytes] = {}

    def headers(self, tenant: str, value: bytes) -> Headers:
        key = self._keys.get(tenant)
        if key is None:
            key = self._keys[tenant] = tenant_key(self.token, tenant)
        return [(AGENT_HEADER, f"{VERSION}.{self.kid}.{_mac(key, value)}".encode())]


class TenantVerifier:
    """Checks agent credentials against a token map ``{token: tenants}``."""

    def __init__(self, tokens: Mapping[str, Iterable[str]]) -> None:
        self._by_kid: dict[str, tuple[str, frozenset[str]]] = {
            token_id(t): (t, frozenset(v)) for t, v in tokens.items()
        }
        self._keys: dict[tuple[str, str], bytes] = {}

    def tenant_ok(self, tenant: str, value: bytes, headers: Any) -> bool:
        """True when the record carries a valid MAC of a token that lists `tenant`."""
        raw = header(headers, AGENT_HEADER)
        try:
            version, kid, mac = raw.decode("ascii").split(".")
        except (UnicodeDecodeError, ValueError):
            return False
        found = self._by_kid.get(kid)
        if version != VERSION or found is None:
            return False
        token, tenants = found
        if tenant not in tenants and ALL_TENANTS not in tenants:
            return False
        key = self._keys.get((kid, tenant))
        if key is None:
            if len(self._keys) > 100_000:  # bounded: tenants named by records
                self._keys.clear()
            key = self._keys[(kid, tenant)] = tenant_key(token, tenant)
        return hmac.compare_digest(mac, _mac(key, value))


class ServiceSigner:
    """Signs and verifies the service's own records on internal topics."""

    def __init__(self, secret: bytes) -> None:
        self._key = service_key(secret)

    def headers(self, key: bytes | None, value: bytes) -> Headers:
        return [(SERVICE_HEADER, f"{VERSION}.{_mac(self._key, key or b'', value)}".encode())]

    def key_id(self) -> str:
        """A public fingerprint of the key (a MAC of a fixed text under it: it tells
        whether two signers agree, and nothing of the key)."""
        return _mac(self._key, b"dmem service key id")[:16]

    def ok(self, key: bytes | None, value: bytes | None, headers: Any) -> bool:
        raw = header(headers, SERVICE_HEADER)
        version, _, mac = raw.decode("ascii", "replace").partition(".")
        if version != VERSION or not mac:
            return False
        return hmac.compare_digest(mac, _mac(self._key, key or b"", value or b""))


def topic_part(tenant: str) -> str:
    """`tenant` as one component of a topic name, injective and free of dots.

    Letters, digits and ``-`` stay; ``_`` becomes ``__``; any other character
    ``_`` and its two hex digits (``a.b`` -> ``a_2eb``). No dot, so a prefixed
    ACL on ``<responses>.<part>.`` covers exactly one tenant's reply topics. A
    very long result is cut and suffixed with a hash of the tenant.
    """
    out = []
    for ch in tenant:
        if _TOPIC_SAFE.fullmatch(ch):
            out.append(ch)
        elif ch == "_":
            out.append("__")
        else:
            out.append("".join(f"_{b:02x}" for b in ch.encode()))
    part = "".join(out)
    if len(part) > _MAX_TOPIC_PART:
        digest = hashlib.blake2b(tenant.encode(), digest_size=8).hexdigest()
        part = part[: _MAX_TOPIC_PART - 17] + "-" + digest
    return part


def reply_topic_for(responses_topic: str, tenant: str) -> str:
    """The reply topic of `tenant`: ``<responses topic>.<topic_part(tenant)>``."""
    return f"{responses_topic}.{topic_part(tenant)}"


__all__ = [
    "AGENT_HEADER",
    "ALL_TENANTS",
    "SERVICE_HEADER",
    "ServiceSigner",
    "TenantSigner",
    "TenantVerifier",
    "header",
    "hkdf_sha256",
    "reply_topic_for",
    "service_key",
    "tenant_key",
    "token_id",
    "topic_part",
]
