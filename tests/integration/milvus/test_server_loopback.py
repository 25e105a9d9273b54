"""The embedded Milvus server with ``loopback_only``: reachable through the relay on the
host's 127.0.0.1 only, across a restart on the same port, with owner-only files."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pymilvus import MilvusClient

from milvus.server import EmbeddedMilvusServer
from schemas.errors import ConfigError
from tests.integration.procs import command_name, descendants, listeners

pytestmark = pytest.mark.integration


def test_loopback_only_server(tmp_path: Path) -> None:
    srv = EmbeddedMilvusServer(tmp_path / "m", stop_grace_s=3, loopback_only=True)
    try:
        srv.check_installed()
    except ConfigError as exc:
        pytest.skip(str(exc))
    try:
        uri = srv.start(timeout_s=240)
        if srv.isolation_error:
            pytest.skip(f"no user namespaces here: {srv.isolation_error}")
        assert srv._proc is not None
        tree = descendants(srv._proc.pid)
        assert any(command_name(p) == "milvus" for p in tree), "no milvus under the launcher"
        assert listeners(tree) == ["127.0.0.1"]  # the relay; nothing else is reachable
        c = MilvusClient(uri)
        c.create_collection("loop", dimension=4)
        c.insert("loop", [{"id": 1, "vector": [0.1, 0.2, 0.3, 0.4]}])
        assert c.query("loop", filter="id == 1", output_fields=["id"], consistency_level="Strong")
        c.close()
        assert srv.restart(timeout_s=240) == uri  # clients keep their URI
        assert MilvusClient(uri).list_collections() == ["loop"]
        assert stat.S_IMODE((tmp_path / "m").stat().st_mode) == 0o700
        assert stat.S_IMODE((tmp_path / "m" / "launcher.log").stat().st_mode) == 0o600
    finally:
        srv.stop()
