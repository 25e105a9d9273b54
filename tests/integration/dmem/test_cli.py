"""The `dmem` command line against real services (subprocesses, as a user runs it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from streams.local.embedded import free_port
from tests.integration.dmem import DMEM, REPO, spawn_up

pytestmark = pytest.mark.integration


def run(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        DMEM + args,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_demo_json_is_reproducible_and_meets_its_contract() -> None:
    args = ["demo", "--json", "--steps", "700", "--seed", "11", "--encoder", "hash"]
    first = run(args)
    assert first.returncode == 0, first.stderr[-3000:]
    a = json.loads(first.stdout.strip().splitlines()[-1])
    for key in (
        "published",
        "stored_core",
        "stored_buffer",
        "dropped",
        "dead_lettered",
        "critical_seen",
        "critical_in_core",
        "critical_coverage",
        "storage_ratio",
        "elapsed_s",
        "transitions_per_s",
    ):
        assert key in a
    assert a["published"] == 700
    assert a["stored_core"] + a["stored_buffer"] + a["dropped"] == 700
    assert a["dead_lettered"] == 0
    assert a["critical_seen"] > 0
    assert a["critical_coverage"] == pytest.approx(
        a["critical_in_core"] / a["critical_seen"], abs=1e-4
    )
    assert a["storage_ratio"] <= 0.3
    second = run(args)
    assert second.returncode == 0, second.stderr[-3000:]
    b = json.loads(second.stdout.strip().splitlines()[-1])
    for volatile in ("elapsed_s", "transitions_per_s"):
        a.pop(volatile)
        b.pop(volatile)
    assert a == b


def test_unreachable_broker_is_one_clear_line() -> None:
    port = free_port()
    res = run(["topics", "create"], env={"DMEM_KAFKA__BROKER": f"127.0.0.1:{port}"}, timeout=60)
    assert res.returncode == 2
    assert f"127.0.0.1:{port}" in res.stderr
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_bad_setting_is_reported() -> None:
    res = run(["topics", "create"], env={"DMEM_GATE__Q_LOW": "0.95"}, timeout=60)
    assert res.returncode != 0
    assert "q_low" in res.stderr and "Traceback" not in res.stderr


def test_schemas_export(tmp_path: Path) -> None:
    res = run(["schemas", "export", str(tmp_path / "out")], timeout=60)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "out" / "Transition.schema.json").exists()


def test_up_prints_addresses_and_stops_cleanly(tmp_path: Path) -> None:
    from streams.local.embedded import free_port

    data = tmp_path / "stack"
    kafka_port, http_port = free_port(), free_port()
    proc = spawn_up(data, {**os.environ, "DMEM_ENCODER__NAME": "hash"},
                    "--kafka-port", str(kafka_port), "--http-port", str(http_port))  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        info = json.loads(line)
        assert set(info) >= {"kafka", "milvus", "http", "milvus_mode"}
        # the ports asked for: a restart keeps the addresses clients were given
        assert info["kafka"] == f"127.0.0.1:{kafka_port}"
        assert info["http"] == f"http://127.0.0.1:{http_port}"
        host, port = info["kafka"].split(":")
        import socket

        with socket.create_connection((host, int(port)), timeout=5):
            pass
        assert info["http"].startswith("http://127.0.0.1:")
        import urllib.request

        with urllib.request.urlopen(info["http"] + "/health", timeout=10) as resp:
            assert json.loads(resp.read())["ok"] is True
    finally:
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        rc = proc.wait(timeout=60)
    assert rc == 0, proc.stderr.read() if proc.stderr else ""
    assert time.monotonic() - t0 < 60
    if info["milvus_mode"] == "server":  # `--milvus auto` with the server wheel installed
        assert info["milvus"].startswith("http://127.0.0.1:")
        assert (data / "milvus-server").is_dir()
    else:
        assert info["milvus_mode"] == "lite" and (data / "milvus.db").exists()


def test_migrate_rewrites_a_collection_keyed_by_memory_id(tmp_path: Path) -> None:
    """A pre-issue-21 collection: `dmem inspect` refuses it in one line naming
    `dmem migrate`; `dmem migrate` rewrites it; a second run is a no-op."""
    from tests.integration.milvus.test_store_tenants import _legacy_collection
    from tests.integration.milvus_fixtures import make_record

    db = str(tmp_path / "legacy.db")
    rows = [make_record(f"m{i}", tenant="alpha", seed=i, utility=0.0, uses=0, merged_count=1)
            | {"partition": "core"} for i in range(3)]  # fmt: skip
    _legacy_collection(db, "mem", rows)
    from milvus_lite.server_manager import server_manager_instance

    server_manager_instance.release_server(db)  # the file lock: the CLI opens it next
    env = {
        "DMEM_MILVUS__URI": db,
        "DMEM_MILVUS__COLLECTION": "mem",
        "DMEM_ENCODER__NAME": "hash",
        "DMEM_ENCODER__DIM": "8",
    }
    refused = run(["inspect", "--tenant", "alpha", "--no-events", "--json"], env)
    assert refused.returncode == 2 and "dmem migrate" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    out = run(["migrate", "--json"], env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["rows"] == {"core": 3, "buffer": 0}
    report = run(["inspect", "--tenant", "alpha", "--no-events", "--json"], env)
    assert report.returncode == 0, report.stderr[-3000:]
    assert json.loads(report.stdout.strip().splitlines()[-1])["counts"] == {"core": 3, "buffer": 0}
    again = run(["migrate", "--json"], env)
    assert json.loads(again.stdout.strip().splitlines()[-1])["status"] == "current"


def test_store_commands_on_the_lite_file_of_a_running_up_say_what_to_do(tmp_path: Path) -> None:
    """Milvus Lite opens in one process only: `dmem inspect` and `dmem forget` on the
    file a running `dmem up` holds answer one line naming that stack and what to do."""
    data = tmp_path / "stack"
    env = {**os.environ, "DMEM_ENCODER__NAME": "hash", "DMEM_RUNTIME_DIR": str(tmp_path / "run")}
    proc = spawn_up(data, env, "--milvus", "lite")
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["milvus_mode"] == "lite"
        client = {"DMEM_KAFKA__BROKER": f"kafka://{info['kafka']}", "DMEM_DATA_DIR": str(data),
                  "DMEM_ENCODER__NAME": "hash"}  # fmt: skip
        for args in (["inspect", "--tenant", "t1"], ["forget", "--tenant", "t1", "--memory", "m"]):
            res = run(args, client, timeout=120)
            assert res.returncode == 2, (args, res.stdout, res.stderr)
            lines = res.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
            assert f"running `dmem up` (pid {proc.pid}" in lines[0], lines[0]
            assert "dmem up --milvus server" in lines[0] and f"dmem {args[0]}`" in lines[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def test_a_lite_file_another_process_holds_is_one_clear_line(tmp_path: Path) -> None:
    from milvus import MemoryStore

    db = str(tmp_path / "held.db")
    held = MemoryStore(db, collection="mem", dim=8).connect()  # this process has it open
    try:
        env = {"DMEM_MILVUS__URI": db, "DMEM_MILVUS__COLLECTION": "mem",
               "DMEM_ENCODER__NAME": "hash", "DMEM_ENCODER__DIM": "8"}  # fmt: skip
        res = run(["inspect", "--tenant", "t1", "--no-events"], env, timeout=120)
    finally:
        held.close()
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert f"the Milvus Lite file {db} is in use by another process" in line, line
    assert "dmem up --milvus server" in line and "DMEM_MILVUS__URI" in line


def test_client_commands_find_the_running_up(tmp_path: Path) -> None:
    """With no DMEM_* deployment settings, `dmem search` and `dmem wait` talk to the one
    running `dmem up` (its state file), as `dmem report` does; explicit settings win."""
    from tests.integration.broker_fixtures import FAST_GROUPS

    env = {k: v for k, v in os.environ.items() if not k.startswith("DMEM_") or k in FAST_GROUPS}
    env.update(DMEM_ENCODER__NAME="hash", DMEM_RUNTIME_DIR=str(tmp_path / "run"))
    proc = spawn_up(tmp_path / "stack", env, "--milvus", "lite")
    try:
        assert proc.stdout is not None
        json.loads(proc.stdout.readline())
        bare = {k: v for k, v in env.items() if k != "DMEM_ENCODER__NAME"}

        def dmem(args: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(DMEM + args, cwd=tmp_path, env={**bare, **extra},
                                  capture_output=True, text=True, timeout=120)  # fmt: skip

        found = dmem(["search", "locked door", "--tenant", "t1", "--json", "--timeout", "30"])
        assert found.returncode == 0 and json.loads(found.stdout) == [], found.stderr
        settled = dmem(["wait", "--settled", "--timeout", "60", "--json"])
        assert settled.returncode == 0, settled.stderr
        assert json.loads(settled.stdout.strip().splitlines()[-1])["waited_s"] >= 0
        elsewhere = dmem(
            ["search", "x", "--tenant", "t1"], DMEM_KAFKA__BROKER="kafka://127.0.0.1:1"
        )
        assert elsewhere.returncode == 2 and "127.0.0.1:1" in elsewhere.stderr, elsewhere.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
