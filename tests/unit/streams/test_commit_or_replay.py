"""A refused commit is a warning, not a worker crash (`streams.admin.commit_or_replay`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaConnectionError

from streams.admin import commit_or_replay


class FakeConsumer:
    def __init__(self, exc: Exception | None) -> None:
        self.exc, self.calls, self.offsets = exc, 0, "unset"

    async def commit(self, offsets: Any = None) -> None:
        self.calls += 1
        self.offsets = offsets
        if self.exc is not None:
            raise self.exc


@pytest.mark.parametrize("exc", [CommitFailedError("rebalanced"), IllegalStateError("no group")])
def test_a_refused_commit_is_logged(exc: Exception, caplog: pytest.LogCaptureFixture) -> None:
    c: Any = FakeConsumer(exc)
    assert asyncio.run(commit_or_replay(c, "maintenance")) is False
    assert c.calls == 1 and "maintenance: commit refused" in caplog.text


def test_a_good_commit_is_true_and_other_errors_still_raise() -> None:
    ok: Any = FakeConsumer(None)
    assert asyncio.run(commit_or_replay(ok, "credit applier")) is True
    assert ok.offsets is None  # the consumer's own positions
    asyncio.run(commit_or_replay(ok, "write consumer", {"tp": 7}))
    assert ok.offsets == {"tp": 7}  # the write consumer commits what it processed
    bad: Any = FakeConsumer(KafkaConnectionError("down"))
    with pytest.raises(KafkaConnectionError):
        asyncio.run(commit_or_replay(bad, "credit applier"))
