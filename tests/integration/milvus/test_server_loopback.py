"""The embedded Milvus server with ``loopback_only``: reachable through the relay on the
host's 127.0.0.1 only, across a restart on the same port, with owner-only files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pymilvus import MilvusClient

from milvus.server import EmbeddedMilvusServer
from schemas.errors import ConfigError

pytestmark = pytest.mark.integration


def _host_listeners(pids: set[int]) -> list[str]:
    """Listening IPv4/IPv6 addresses, in this network namespace, held by `pids`."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:  # gone meanwhile
            continue
    out = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:
                out.append(cols[1].rsplit(":", 1)[0])
    return out


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
        tree = _descendants(srv._proc.pid)
        milvus = [p for p in tree if Path(f"/proc/{p}/comm").read_text().strip() == "milvus"]
        assert milvus, "no milvus process under the launcher"
        # 0100007F: 127.0.0.1 in /proc/net/tcp's byte order; nothing else is reachable
        assert _host_listeners(tree) == ["0100007F"]
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


def _descendants(root: int) -> set[int]:
    """`root` and every process under it."""
    parent: dict[int, int] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat_line = Path(f"/proc/{p}/stat").read_text()
            except OSError:
                continue
            parent[int(p)] = int(stat_line.rsplit(")", 1)[1].split()[1])
    tree, todo = {root}, [root]
    while todo:
        cur = todo.pop()
        kids = [p for p, pp in parent.items() if pp == cur and p not in tree]
        tree.update(kids)
        todo.extend(kids)
    return tree
