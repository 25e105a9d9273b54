import os
from collections.abc import Iterator

import pytest

from dmem_bench.backends import ENV_VAR, BackendChoice, backend_from_env
from tests.integration.broker_fixtures import *  # noqa: F403
from tests.integration.milvus_fixtures import *  # noqa: F403

# Tansu answers a new consumer group's first JoinGroup after half the member's session
# timeout, and a worker with every role joins four groups one after another: at the
# product's 10 s that is ~20 s of every worker start. A 4 s session (heartbeats every
# 0.5 s) makes it ~8 s. Only on the embedded broker: Apache Kafka refuses sessions
# below its group.min.session.timeout.ms (6 s). A value set by the caller is kept.
FAST_GROUPS = {"DMEM_KAFKA__SESSION_TIMEOUT_S": "4", "DMEM_KAFKA__HEARTBEAT_INTERVAL_S": "0.5"}


def pytest_report_header(config: pytest.Config) -> str:
    """One line naming the services' backend, and why (auto says what it probed)."""
    choice = backend_from_env()
    state = "" if choice.available else " (UNAVAILABLE: its tests are skipped)"
    return f"dmem integration backend ({ENV_VAR}): {choice.name}{state} - {choice.reason}"


@pytest.fixture(scope="package", autouse=True)
def fast_group_joins(test_backend: BackendChoice) -> Iterator[None]:
    """`FAST_GROUPS` in the environment of every integration test, the workers, CLIs and
    benches it starts (they inherit it); gone again before the next tier's tests."""
    if test_backend.name != "embedded":
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        for key, value in FAST_GROUPS.items():
            if key not in os.environ:
                mp.setenv(key, value)
        yield
