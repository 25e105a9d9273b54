import os
from collections.abc import Iterator

import pytest

from dmem_bench.backends import ENV_VAR, BackendChoice, backend_from_env
from tests.integration.broker_fixtures import *  # noqa: F403
from tests.integration.broker_fixtures import FAST_GROUPS
from tests.integration.milvus_fixtures import *  # noqa: F403


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
