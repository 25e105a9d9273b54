"""`dmem mcp --no-auth` serves on a loopback address only."""

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
    assert out.exit_code != 0 and "needs --auth-token" in out.output
