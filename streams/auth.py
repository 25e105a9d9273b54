"""HTTP API authentication: bearer tokens mapped to the tenants they may read.

Settings (`AuthSettings`, ``DMEM_AUTH__*``):
- ``DMEM_AUTH__TOKENS``: JSON object ``{"<token>": ["tenant-a", "tenant-b"]}``;
  ``"*"`` in a token's list allows every tenant (an operator token).
- ``DMEM_AUTH__TOKENS_FILE``: a JSON file of the same shape (merged with
  ``TOKENS``; read once at start). Suits Kubernetes Secrets mounted as files.
- ``DMEM_AUTH__DISABLED=true``: no checks at all, for local use.

Decisions:
- Default: enabled, fail closed. A respond worker with no tokens configured
  and auth not disabled answers every ``/v1/*`` request with 401 (and logs a
  warning at start): a forgotten setting never exposes memories. The embedded
  stack (`streams.local.stack.LocalStack`: ``dmem up``, ``dmem demo``, tests) binds to
  127.0.0.1 and sets ``DMEM_AUTH__DISABLED=true`` unless the caller configures
  ``DMEM_AUTH__*`` itself, so the two quickstart commands keep working.
- Missing, malformed or unknown token (one that is not UTF-8 text included):
  401 with ``WWW-Authenticate: Bearer``;
  a known token asking for a tenant it does not list: 403. Both JSON bodies.
- ``/health`` and ``/metrics`` stay open (probes and scrapers carry no tenant
  data).
- Kafka (`KafkaGuard`, `schemas.credentials`): with HTTP auth on and tokens
  configured (or ``DMEM_AUTH__KAFKA=true``), every agent record must carry an
  HMAC under a key derived from a token that lists its tenant, and every
  internal record the service's signature; others are dead-lettered
  ("unauthenticated") or dropped and counted, with no effect. Off (auth
  disabled, or no tokens and ``DMEM_AUTH__KAFKA`` unset): whoever can produce
  to a topic is trusted, as the broker's SASL/ACLs alone decide
  (`streams.admin.kafka_client_kwargs`, `streams.app.faust_credentials`).
- Tokens are compared with `hmac.compare_digest` against every configured
  token (no early exit on the first byte).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from schemas.credentials import Headers, ServiceSigner, TenantVerifier
from schemas.errors import ConfigError

log = logging.getLogger("dmem.auth")

ALL_TENANTS = "*"


@dataclass(frozen=True)
class Denied:
    status: int  # 401 or 403
    error: str


def load_tokens(
    tokens: dict[str, list[str]], tokens_file: Path | None
) -> dict[str, frozenset[str]]:
    out = {t: frozenset(v) for t, v in tokens.items()}
    if tokens_file is not None:
        try:
            data = orjson.loads(Path(tokens_file).read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ConfigError(f"auth tokens file {tokens_file}: {exc}") from exc
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(x, str) for x in v)
            for k, v in data.items()
        ):
            raise ConfigError(f"auth tokens file {tokens_file}: expected {{token: [tenants]}}")
        for k, v in data.items():
            out[k] = out.get(k, frozenset()) | frozenset(v)
    if any(not t for t in out):
        raise ConfigError("auth: empty token")
    return out


class Authorizer:
    """Checks an ``Authorization`` header against the token map."""

    def __init__(self, disabled: bool, tokens: dict[str, frozenset[str]]) -> None:
        self.disabled = disabled
        self.tokens = tokens
        if not disabled and not tokens:
            log.warning(
                "HTTP auth is enabled but no tokens are configured: every /v1 request "
                "gets 401 (set DMEM_AUTH__TOKENS, or DMEM_AUTH__DISABLED=true locally)"
            )

    @classmethod
    def from_settings(cls, settings: object) -> Authorizer:
        a = settings.auth  # type: ignore[attr-defined]
        return cls(a.disabled, load_tokens(a.tokens, a.tokens_file))

    def _lookup(self, header: str | None) -> frozenset[str] | None:
        if not header:
            return None
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        try:  # a header byte that is not UTF-8 reaches us as a lone surrogate
            given = token.encode()
        except UnicodeEncodeError:
            return None  # no configured token is such text: unknown, 401
        found: frozenset[str] | None = None
        for known, tenants in self.tokens.items():
            if hmac.compare_digest(known.encode(), given):
                found = tenants
        return found

    def scope(self, header: str | None) -> frozenset[str] | None:
        """The tenants an authenticated header may read; None = every tenant.

        For listings (the live page's tenant table): call `check` first, an
        unknown token gets the empty set here.
        """
        if self.disabled:
            return None
        tenants = self._lookup(header) or frozenset()
        return None if ALL_TENANTS in tenants else tenants

    def check(self, header: str | None, tenant: str | None = None) -> Denied | None:
        """None when allowed; ``tenant=None`` only authenticates."""
        if self.disabled:
            return None
        tenants = self._lookup(header)
        if tenants is None:
            return Denied(401, "missing or invalid bearer token")
        if tenant is not None and ALL_TENANTS not in tenants and tenant not in tenants:
            return Denied(403, f"token not allowed for tenant {tenant!r}")
        return None


#: the dead-letter reason of an agent record without a valid credential for its tenant
UNAUTHENTICATED = "unauthenticated"


def _service_secret(tokens: dict[str, frozenset[str]], configured: str | None) -> bytes:
    """The configured service secret, else one derived from the token map (every worker
    holds the same map: the same key everywhere)."""
    if configured:
        return configured.encode()
    canon = orjson.dumps({t: sorted(v) for t, v in tokens.items()}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(b"dmem service secret from tokens\x00" + canon).digest()


def _kafka_on(auth: Any, tokens: dict[str, frozenset[str]]) -> bool:
    """Record credentials on Kafka: ``DMEM_AUTH__KAFKA`` where set, else HTTP auth on
    with tokens configured (module doc)."""
    return (not auth.disabled and bool(tokens)) if auth.kafka is None else bool(auth.kafka)


def service_key_id(settings: Any) -> str | None:
    """A fingerprint of the key the service signs internal records with under
    ``settings`` (`ServiceSigner.key_id`), or None where Kafka auth is off: two
    processes sign alike exactly when their fingerprints are equal."""
    a = settings.auth
    tokens = load_tokens(a.tokens, a.tokens_file)
    if not _kafka_on(a, tokens):
        return None
    return ServiceSigner(_service_secret(tokens, a.service_secret)).key_id()


class KafkaGuard:
    """Record credentials on Kafka (module doc): verifies agent records, signs and
    verifies internal ones. Disabled: everything passes and nothing is signed."""

    def __init__(
        self, enabled: bool, tokens: dict[str, frozenset[str]], service_secret: str | None
    ) -> None:
        self.enabled = enabled
        self.verifier = TenantVerifier(tokens)
        if enabled and not service_secret:
            log.warning(
                "Kafka auth: no DMEM_AUTH__SERVICE_SECRET; the service key is derived "
                "from the token map (set a secret so token changes keep checkpoints)"
            )
        self.service = ServiceSigner(_service_secret(tokens, service_secret))
        if enabled and not tokens:
            log.warning("Kafka auth is on but no tokens are configured: every agent "
                        "record is dead-lettered as unauthenticated")  # fmt: skip
        self.refused_agent = 0  # agent records without a valid credential
        self.refused_internal = 0  # internal records without the service's signature

    @classmethod
    def from_settings(cls, settings: Any) -> KafkaGuard:
        a = settings.auth
        tokens = load_tokens(a.tokens, a.tokens_file)
        return cls(_kafka_on(a, tokens), tokens, a.service_secret)

    def agent_ok(self, tenant: str, key: bytes | None, value: bytes | None, headers: Any) -> bool:
        """May this agent record act for `tenant`? (The service may act for any tenant.)"""
        if not self.enabled:
            return True
        v = value or b""
        if self.verifier.tenant_ok(tenant, v, headers) or self.service.ok(key, v, headers):
            return True
        self.refused_agent += 1
        return False

    def sign(self, key: bytes | None, value: bytes) -> Headers:
        """Headers for a record the service produces (none when disabled)."""
        return self.service.headers(key, value) if self.enabled else []

    def internal_ok(self, key: bytes | None, value: bytes | None, headers: Any, what: str) -> bool:
        """Did the service produce this internal record? A refusal is logged and counted."""
        if not self.enabled or self.service.ok(key, value, headers):
            return True
        self.refused_internal += 1
        n = self.refused_internal
        if n <= 10 or n % 1000 == 0:  # a flood of forgeries must not flood the log
            log.warning("refused an unsigned or forged %s record (key %r; %d refused here)",
                        what, (key or b"")[:64], n)  # fmt: skip
        return False
