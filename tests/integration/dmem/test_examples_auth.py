"""The integration examples against a stack with auth on, run as a user runs them:
`examples/langgraph_agent.py` and `examples/mcp_agent.py` with ``--kafka --http
--token``. With the tenant's token the LangGraph agent recalls the allergy it was
told and the MCP transcript reaches its outcome; with another tenant's token the
first write fails, saying the deployment refuses the token (its records would
otherwise be dead-lettered as unauthenticated, unseen by the agent)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.local.stack import REPO_ROOT, LocalStack
from tests.integration.broker_fixtures import tokened_stack

pytestmark = pytest.mark.integration
TOKENS = {"tok-lg": ["lg"], "tok-mcp": ["mcp"], "tok-other": ["other"]}


@pytest.fixture
def stack(tmp_path: Path, broker: str) -> Iterator[LocalStack]:
    # the examples speak to the deployment's default topics ("dmem."), as a user's would
    with tokened_stack(tmp_path / "data", broker, "dmem.", TOKENS) as s:
        yield s


def run_example(stack: LocalStack, script: str, tenant: str, token: str) -> tuple[int, str]:
    assert stack.bootstrap is not None
    args = ["--kafka", stack.bootstrap, "--http", f"http://127.0.0.1:{stack.web_ports[0]}",
            "--tenant", tenant, "--token", token]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "DMEM_API_TOKEN"}
    out = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / script), *args],
                         capture_output=True, text=True, timeout=240, env=env,
                         check=False)  # fmt: skip
    return out.returncode, out.stdout + out.stderr


def test_examples_with_the_tenants_token_and_with_another(stack: LocalStack) -> None:
    rc, out = run_example(stack, "langgraph_agent.py", "lg", "tok-lg")
    assert rc == 0, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert "bot:" in last and "allergic to nuts" in last, out[-2000:]

    rc, out = run_example(stack, "mcp_agent.py", "mcp", "tok-mcp")
    assert rc == 0, out[-3000:]
    assert "recall -> 'jump'" in out and "report_outcome ->" in out, out[-2000:]

    rc, out = run_example(stack, "langgraph_agent.py", "lg", "tok-other")
    assert rc != 0
    assert "Unauthorized" in out and "refuses this client's credentials" in out, out[-2000:]

    rc, out = run_example(stack, "mcp_agent.py", "mcp", "tok-other")
    assert rc != 0 and "dmem mcp answered an error" in out, out[-2000:]
