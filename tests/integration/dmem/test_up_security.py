"""`dmem up` checked from outside, as an attacker on the same machine or a web page would:
the real command with two tokens in the user's environment (Tansu broker, the embedded
Milvus server when its wheel is installed, else Lite, one worker with every role).

- the user's ``DMEM_AUTH__TOKENS`` is used and the first screen says so: 401 without a
  token, 403 with the other tenant's, 200 with the right one;
- a ``text/plain`` ingest (what any web page can post) is refused and nothing of it is
  stored, while the same record as JSON is;
- a foreign ``Host`` (DNS rebinding) and a foreign ``Origin`` are refused;
- ``/v1/forget`` answers 401 before it reads a body;
- the embedded Milvus server (server mode) listens on the host's loopback only.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas import Transition
from streams.metrics import tenant_label
from tests.integration.dmem import spawn_up
from tests.integration.procs import command_name, descendants, listeners

pytestmark = pytest.mark.integration

TOKENS = {"tok-one": ["t1"], "tok-two": ["t2"]}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], int]]:
    data = tmp_path_factory.mktemp("up-security") / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMEM_AUTH__")}
    env |= {"DMEM_ENCODER__NAME": "hash", "DMEM_AUTH__TOKENS": json.dumps(TOKENS),
            "DMEM_WRITE__BATCH_WITHIN_S": "0.1"}  # fmt: skip
    proc = spawn_up(data, env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(proc.stderr.read() if proc.stderr else "no output")
        yield json.loads(line), proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)


def call(base: str, method: str, path: str, body: bytes | None = None,
         token: str | None = None, **headers: str) -> tuple[int, Any]:  # fmt: skip
    h = {"Content-Type": "application/json", **{k.replace("_", "-"): v for k, v in headers.items()}}
    if token:
        h["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(base + path, data=body, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw) if raw else None
        except json.JSONDecodeError:  # a body that is not JSON: the assertion shows it
            return e.code, raw.decode(errors="replace")


def record(episode: str) -> Transition:
    return Transition(tenant="t1", agent_id="a1", episode_id=episode, step=0,
                      observation=f"the vault code is 4{len(episode)}71", action="note it",
                      reward=100.0)  # fmt: skip


def test_up_uses_the_users_tokens_and_says_so(up: tuple[dict[str, Any], int]) -> None:
    info, _ = up
    assert info["auth"].startswith("on (2 tokens"), info["auth"]
    base = info["http"]
    assert call(base, "GET", "/v1/stats?tenant=t1")[0] == 401
    assert call(base, "GET", "/v1/stats?tenant=t1", token="tok-two")[0] == 403
    code, body = call(base, "GET", "/v1/stats?tenant=t1", token="tok-one")
    assert code == 200 and body["tenant"] == "t1"
    assert body["metrics_label"] == tenant_label("t1", "hash")  # what /metrics shows for t1
    # /v1/forget: 401 before the (malformed) body is read
    assert call(base, "POST", "/v1/forget", b"{not json")[0] == 401


def test_an_import_signs_with_the_stacks_key_or_refuses_to_run(
    up: tuple[dict[str, Any], int], tmp_path: Path
) -> None:
    """Without the stack's DMEM_AUTH__* the workers would dead-letter every record while
    `dmem import` reported them stored: it refuses before publishing (exit 2). With them
    it signs for the service and the records are stored."""
    import subprocess

    from tests.integration.dmem import DMEM, REPO

    info, _ = up
    lines = tmp_path / "hist.jsonl"
    lines.write_text(record("import-signed").model_dump_json() + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMEM_")}
    env["DMEM_DATA_DIR"] = str(info["data_dir"])
    args = [*DMEM, "import", str(lines), "--json", "--wait", "60"]
    bare = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert bare.returncode == 2, bare.stderr
    assert "checks record credentials" in bare.stderr and "DMEM_API_TOKEN" in bare.stderr
    env["DMEM_AUTH__TOKENS"] = json.dumps(TOKENS)
    ok = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert ok.returncode == 0, ok.stderr
    base, mid = info["http"], record("import-signed").memory_id
    deadline = time.monotonic() + 60
    code = 0
    while time.monotonic() < deadline and code != 200:
        code, _ = call(base, "GET", f"/v1/memories/{mid}?tenant=t1", token="tok-one")
        time.sleep(0.5)
    assert code == 200


def test_text_plain_ingest_refused_and_nothing_stored(up: tuple[dict[str, Any], int]) -> None:
    base = up[0]["http"]
    plain, js = record("plain-e"), record("json-e")
    code, body = call(base, "POST", "/v1/transitions", plain.model_dump_json().encode(),
                      token="tok-one", Content_Type="text/plain")  # fmt: skip
    assert code == 415 and "application/json" in body["error"]
    code, _ = call(base, "POST", "/v1/transitions", js.model_dump_json().encode(), token="tok-one")
    assert code == 202
    deadline = time.monotonic() + 90
    while call(base, "GET", f"/v1/memories/{js.memory_id}?tenant=t1", token="tok-one")[0] != 200:
        assert time.monotonic() < deadline, "the JSON record was never stored"
        time.sleep(0.5)
    # the JSON record, sent after the refused one, is stored: the refused one is not
    assert call(base, "GET", f"/v1/memories/{plain.memory_id}?tenant=t1", token="tok-one")[0] == 404


def test_foreign_host_and_origin_refused(up: tuple[dict[str, Any], int]) -> None:
    base = up[0]["http"]
    port = base.rsplit(":", 1)[1]
    code, body = call(base, "GET", "/v1/stats?tenant=t1", token="tok-one",
                      Host=f"rebind.attacker.example:{port}")  # fmt: skip
    assert code == 421 and "not served here" in body["error"]
    assert call(base, "GET", "/metrics", Host="rebind.attacker.example")[0] == 421
    code, _ = call(base, "POST", "/v1/search", b'{"tenant":"t1","query":"vault"}',
                   token="tok-one", Origin="https://evil.example")  # fmt: skip
    assert code == 403
    # faust's pages are off; an unknown route or method answers JSON like every error
    assert call(base, "GET", "/router/", Host=f"localhost:{port}") == (404, {"error": "not found"})
    wrong_method = call(base, "GET", "/v1/search", token="tok-one")
    assert wrong_method == (405, {"error": "method not allowed"})


def test_embedded_milvus_listens_on_loopback_only(up: tuple[dict[str, Any], int]) -> None:
    info, up_pid = up
    if info["milvus_mode"] != "server":
        pytest.skip("the Milvus server wheel is not installed: `dmem up` runs Milvus Lite")
    assert info["milvus_loopback"] is True
    tree = descendants(up_pid)  # dmem up and every process under it
    milvus = {p for p in tree if command_name(p) == "milvus"}
    assert milvus, "no milvus process under dmem up"
    for p in milvus:  # milvus itself lives in a network namespace of its own
        assert os.readlink(f"/proc/{p}/ns/net") != os.readlink("/proc/self/ns/net")
        assert listeners({p}) == []
    # what the whole stack listens on (broker, worker, the Milvus relay): loopback only
    addrs = listeners(tree)
    assert len(addrs) >= 3 and set(addrs) == {"127.0.0.1"}, addrs
    assert info["milvus"] == f"http://127.0.0.1:{info['milvus'].rsplit(':', 1)[1]}"


def wait_healthy(base: str, timeout_s: float, ok: Any = lambda: True) -> int:
    """The last /health status seen until it is 200 and ``ok()`` (or time runs out)."""
    deadline = time.monotonic() + timeout_s
    code = 0
    while time.monotonic() < deadline:
        try:
            code = call(base, "GET", "/health")[0]
        except OSError:  # refused while a worker starts
            code = 0
        if code == 200 and ok():
            return code
        time.sleep(1.0)
    return code


def test_embedded_milvus_that_dies_is_restarted(up: tuple[dict[str, Any], int]) -> None:
    info, up_pid = up
    if info["milvus_mode"] != "server":
        pytest.skip("the Milvus server wheel is not installed: `dmem up` runs Milvus Lite")
    before = {p for p in descendants(up_pid) if command_name(p) == "milvus"}
    assert before
    for p in before:
        os.kill(p, signal.SIGKILL)

    def back() -> bool:
        return bool({p for p in descendants(up_pid) if command_name(p) == "milvus"} - before)

    assert wait_healthy(info["http"], 240, back) == 200 and back()
    # the same store on the same address: what an earlier test stored is still there. A
    # restarted Milvus may still be loading the collection when the worker reconnects:
    # the read answers 503 with Retry-After (retriable) until it is loaded, never 404
    stored = record("json-e").memory_id
    deadline, codes = time.monotonic() + 120, []
    while True:
        code, _ = call(info["http"], "GET", f"/v1/memories/{stored}?tenant=t1", token="tok-one")
        codes.append(code)
        if code != 503 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert code == 200 and set(codes) <= {200, 503}, codes


def test_a_worker_that_dies_comes_back_on_the_printed_address(
    up: tuple[dict[str, Any], int],
) -> None:
    # last in this module: it kills the stack's worker
    info, up_pid = up

    def workers() -> set[int]:
        out = set()
        for p in descendants(up_pid):
            try:
                if b"streams.worker" in Path(f"/proc/{p}/cmdline").read_bytes():
                    out.add(p)
            except OSError:  # gone meanwhile
                pass
        return out

    [dead] = workers()
    os.kill(dead, signal.SIGKILL)
    code = wait_healthy(info["http"], 150, lambda: bool(workers() - {dead}))
    assert code == 200 and workers() - {dead}, "no worker answers on the printed address"
