"""`dmem mcp --no-auth` serves on loopback only; the http transport's bearer check."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from dmem.cli.client import mcp

pytest.importorskip("mcp")


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "dmem.example", "::"])
def test_no_auth_refuses_a_non_loopback_host(host: str) -> None:
    out = CliRunner().invoke(
        mcp, ["--transport", "http", "--tenant", "t", "--no-auth", "--host", host]
    )
    assert out.exit_code == 2 and "loopback address only" in out.output, out.output


def test_a_token_may_serve_any_host_and_none_refuses() -> None:
    out = CliRunner().invoke(mcp, ["--transport", "http", "--tenant", "t", "--host", "0.0.0.0"])
    assert out.exit_code == 2 and "dmem: error: the http transport needs --auth-token" in out.output


@pytest.mark.parametrize(
    ("header", "status"),
    [(None, 401), (b"Bearer wrong", 401), (b"Basic s3cret", 401), (b"Bearer s3cret", 200),
     (b"bearer s3cret", 200), (b"BEARER  s3cret", 200)],
)  # fmt: skip
def test_the_bearer_scheme_is_case_insensitive(header: bytes | None, status: int) -> None:
    # as the HTTP API reads it (RFC 7235); "bearer <token>" was a 401
    import asyncio
    from typing import Any

    from dmem.integrations.mcp import BearerAuth

    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    headers = [(b"authorization", header)] if header else []
    asyncio.run(BearerAuth(app, "s3cret")({"type": "http", "headers": headers}, None, send))
    assert sent[0]["status"] == status
