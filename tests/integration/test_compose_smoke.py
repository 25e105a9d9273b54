"""docker-compose.yml itself, started by testcontainers' compose support.

Runs only on the containers backend (``DMEM_TEST_BACKEND=containers`` or ``auto``
where a Docker engine answers): ``up --build --wait`` (every healthcheck green),
publish one transition to the compose Kafka with the SDK, find it over HTTP with the
compose token, ``down --volumes``. Elsewhere it is skipped with the reason (on this
project's CI: no Docker engine). The compose file publishes fixed host ports
(9094 Kafka, 6067 respond, 19530 Milvus): they must be free.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest

from dmem import SyncClient, Transition
from dmem_bench.backends import REPO_ROOT, BackendChoice

TENANT = "compose-smoke"


def _skip_unless_containers(choice: BackendChoice) -> None:
    if choice.skip_reason:
        pytest.skip(choice.skip_reason)
    if choice.name != "containers":
        pytest.skip(f"the compose smoke test needs the containers backend ({choice.reason})")


def test_compose_up_publish_search_down(test_backend: BackendChoice, tmp_path: Path) -> None:
    _skip_unless_containers(test_backend)
    from testcontainers.compose import DockerCompose

    token = secrets.token_hex(16)
    env_file = tmp_path / "compose.env"
    env_file.write_text(f"DMEM_API_TOKEN={token}\nDMEM_ENCODER__NAME=hash\n")
    compose = DockerCompose(REPO_ROOT, compose_file_name="docker-compose.yml", build=True,
                            wait=True, env_file=str(env_file))  # fmt: skip
    with compose:
        assert {c.Service for c in compose.get_containers()} >= {
            "kafka",
            "milvus",
            "write",
            "respond",
            "jobs",
        }
        client = SyncClient("localhost:9094", TENANT, http_url="http://localhost:6067",
                            transport="http", token=token)  # fmt: skip
        try:
            marker = f"compose smoke marker {secrets.token_hex(4)}"
            client.publish(Transition(tenant=TENANT, agent_id="a", episode_id="e", step=0,
                                      observation=marker, action="jump", reward=-50.0,
                                      next_observation="after"))  # fmt: skip
            deadline, hits = time.monotonic() + 120, []
            while time.monotonic() < deadline:
                hits = client.search(marker, k=5)
                if any(h.text == marker for h in hits):
                    break
                time.sleep(1.0)
            assert any(h.text == marker for h in hits), f"not found over HTTP: {hits}"
        finally:
            client.close()
    assert compose.get_containers(include_all=True) == [], "down left containers behind"
