"""pymilvus' per-scan warning about the 2.3.5 server's missing MVCC timestamp is dropped
(it reads as a fault in every worker log); its other warnings pass."""

from __future__ import annotations

import logging

import pytest

import milvus.store  # noqa: F401  (installs the filter)


def test_the_mvcc_ts_notice_is_dropped_and_others_pass(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("pymilvus.client.iterator.query_iterator")
    with caplog.at_level(logging.WARNING, logger=log.name):
        log.warning("failed to get mvccTs from milvus server, use client-side ts instead")
        log.warning("something else went wrong")
    assert [r.getMessage() for r in caplog.records] == ["something else went wrong"]
