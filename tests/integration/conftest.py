import pytest

from dmem_bench.backends import ENV_VAR, backend_from_env
from tests.integration.broker_fixtures import *  # noqa: F403
from tests.integration.milvus_fixtures import *  # noqa: F403


def pytest_report_header(config: pytest.Config) -> str:
    """One line naming the services' backend, and why (auto says what it probed)."""
    choice = backend_from_env()
    state = "" if choice.available else " (UNAVAILABLE: its tests are skipped)"
    return f"dmem integration backend ({ENV_VAR}): {choice.name}{state} - {choice.reason}"
