"""`dmem report`: generated from a real small run, rendered in headless Chromium.

The run: LocalStack (Tansu broker + one write worker, Milvus Lite, hash encoder)
processes a few hundred CliffWalking transitions. The worker is stopped before
the report (Milvus Lite is a single-process file), so the utility plot reads
the real rows. The page is opened with Chromium's ``--dump-dom`` after a tiny
script (added to a copy of the page) writes, for every <img>, whether it loaded
(``complete && naturalWidth > 0``) into the DOM; a screenshot must be a PNG.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from dmem_bench.demo import q_learning_transitions
from schemas import encode
from streams.local.stack import REPO_ROOT, LocalStack
from tests.integration.broker_fixtures import FAST_GROUPS

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

PROBE = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.map(function (i) { return i.complete && i.naturalWidth > 0 ? 1 : 0; });
  var p = document.createElement('pre');
  p.id = 'img-probe';
  p.textContent = 'IMGS=' + imgs.length + ' LOADED=' + ok.reduce(function (a, b) {
    return a + b; }, 0) + ' WIDTHS=' + imgs.map(function (i) { return i.naturalWidth; }).join(',');
  document.body.appendChild(p);
});
</script>"""


def _pythonpath() -> str:
    """The checkout first, then what this session was given (where the harness may be)."""
    return os.pathsep.join([str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


async def _run_agent(stack: LocalStack, n: int) -> None:
    s = stack.settings
    p = AIOKafkaProducer(bootstrap_servers=s.kafka.bootstrap, linger_ms=5)
    c = AIOKafkaConsumer(
        s.topic("memories"),
        bootstrap_servers=s.kafka.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await p.start()
    await c.start()
    try:
        for tr, _crit, _pair in q_learning_transitions("cliffwalking", n, seed=3, tenant="rep"):
            await p.send(s.topic("transitions"), encode(tr), key=tr.agent_id.encode())
        await p.flush()
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while len(seen) < n and time.monotonic() < deadline:
            for msgs in (await c.getmany(timeout_ms=300)).values():
                seen.update(orjson.loads(m.value)["memory_id"] for m in msgs)
        assert len(seen) >= n, f"only {len(seen)}/{n} MemoryEvents"
    finally:
        await p.stop()
        await c.stop()


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--no-first-run",
        f"--user-data-dir={tmp / 'chrome-profile'}",
    ]  # fmt: skip
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/setup.sh installs it)")
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    n = 400
    env = {
        "DMEM_ENCODER__NAME": "hash",
        "DMEM_WRITE__BATCH_SIZE": "128",
        "DMEM_WRITE__BATCH_WITHIN_S": "0.2",
        "DMEM_APP_ID": "dmem-report-test",
    }
    stack = LocalStack(tmp_path / "stack", roles=("write",), extra_env=env)
    bench = tmp_path / "bench.json"
    bench.write_bytes(orjson.dumps({
        "bench": "write", "encoder": "hash", "pipeline_tps": 5100.0, "raw_kafka_tps": 9000.0,
        "raw_encoder_tps": 20000.0, "raw_milvus_insert_tps": 8000.0,
        "ratio_vs_bottleneck": 0.64, "latency_p99_ms": 700.0,
    }))  # fmt: skip
    out = tmp_path / "report.html"
    try:
        stack.start()
        asyncio.run(_run_agent(stack, n))
        stack.stop_workers()  # release the Milvus Lite file
        child_env = {**os.environ, **stack.env(0)}
        child_env["PYTHONPATH"] = _pythonpath()
        proc = subprocess.run(
            [sys.executable, "-m", "dmem.cli", "report", "--out", str(out),
             "--bench-json", str(bench), "--bench-dir", str(tmp_path / "none"), "--json"],
            env=child_env, capture_output=True, text=True, timeout=90, cwd=tmp_path,
        )  # fmt: skip
    finally:
        stack.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = orjson.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["events"] >= n
    assert sum(summary["routes"].values()) >= n
    assert summary["utility_source"].startswith("Milvus")
    assert summary["utilities"] == summary["routes"].get("core", 0) + summary["routes"].get(
        "buffer", 0
    )
    assert summary["images"] >= 5  # rpe, routes, partitions, utility, bench

    page = out.read_text()
    assert "http://" not in page.replace("http://127.0.0.1", "")  # self-contained
    assert "theta_high" in page and "pipeline_tps" in page
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", PROBE + "</body>"))
    dom = _chromium(["--virtual-time-budget=5000", "--dump-dom", probe.as_uri()], tmp_path)
    m = re.search(r"IMGS=(\d+) LOADED=(\d+) WIDTHS=([\d,]*)", dom.stdout)
    assert m, f"probe not found in DOM; chromium stderr: {dom.stderr[-2000:]}"
    imgs, loaded = int(m.group(1)), int(m.group(2))
    assert imgs == summary["images"]
    assert loaded == imgs, f"only {loaded}/{imgs} images loaded: widths {m.group(3)}"
    assert all(int(w) > 100 for w in m.group(3).split(","))

    shot = tmp_path / "shot.png"
    _chromium([f"--screenshot={shot}", "--window-size=1100,2400", out.as_uri()], tmp_path)
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000  # a rendered page with plots, not a blank one


def _chat_turns(n: int) -> list[Any]:
    from dmem.client import ChatTurn

    words = ("apple river castle dragon engine forest guitar harbor island jungle kettle lemon "
             "mirror north ocean piano quartz rocket silver tiger").split()  # fmt: skip
    return [ChatTurn("Ann" if i % 2 else "Bob",
                     " ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 5)),
                     ts=1_700_000_000_000 + i * 1000) for i in range(n)]  # fmt: skip


def test_report_finds_a_running_dmem_up(tmp_path: Path) -> None:
    """`dmem report` with no DMEM_* deployment settings reports on the running `dmem up`:
    its state file says where the broker is; the Lite file it holds is not scanned; the
    chat tenant's gate scores (w * intrinsic, extrinsic 0) are what is plotted."""
    from dmem.client import chat_transitions

    # no deployment settings; the tier's consumer-group timing stays (it says nothing
    # about where the deployment is)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMEM_") or k in FAST_GROUPS}
    env.update(DMEM_RUNTIME_DIR=str(tmp_path / "run"), DMEM_ENCODER__NAME="minilm-static",
               PYTHONPATH=_pythonpath())  # fmt: skip
    data = tmp_path / "up"
    up = subprocess.Popen([sys.executable, "-m", "dmem.cli", "up", "--data-dir", str(data),
                           "--json"], env=env, stdout=subprocess.PIPE, text=True,
                          start_new_session=True)  # fmt: skip
    try:
        assert up.stdout is not None
        info = orjson.loads(up.stdout.readline())
        assert info["ui"] == info["http"] + "/ui/"
        assert (data / "up.json").is_file() and len(list((tmp_path / "run").glob("*.json"))) == 1

        async def publish() -> None:
            p = AIOKafkaProducer(bootstrap_servers=info["kafka"])
            await p.start()
            chat = chat_transitions(_chat_turns(100), tenant="chat", conversation="c1", session=1)
            grid = [tr for tr, _c, _p in q_learning_transitions("cliffwalking", 150, seed=3,
                                                                 tenant="grid")]  # fmt: skip
            for tr in chat + grid:
                await p.send("dmem.transitions", encode(tr), key=tr.agent_id.encode())
            await p.flush()
            await p.stop()

        asyncio.run(publish())
        deadline = time.monotonic() + 240  # a loaded machine is slow
        summary: dict[str, Any] = {}
        while time.monotonic() < deadline and summary.get("events", 0) < 250:
            proc = subprocess.run(
                [sys.executable, "-m", "dmem.cli", "report", "--out", str(tmp_path / "r.html"),
                 "--bench-dir", str(tmp_path / "none"), "--json"],
                env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-3000:]
            summary = orjson.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(timeout=60)
    assert summary["events"] >= 250 and "dmem up" in summary["source"], summary
    # Milvus Lite cannot be opened by a second process while `dmem up` holds it (the
    # report falls back to the credit topic); `dmem up`'s default embedded server can
    if info["milvus_mode"] == "lite":
        assert summary["utility_source"].startswith("credit topic"), summary
    else:
        assert summary["utility_source"].startswith("Milvus ("), summary
    page = (tmp_path / "r.html").read_text()
    assert "Milvus scan failed" not in page and info["ui"] in page
    chat = summary["gate"]["chat"]
    # not every score at 0 (routing varies with batching; off-context turns score 0)
    assert chat["decisions"] == 100 and chat["nonzero"] >= 10, summary["gate"]
    assert chat["theta_low"] <= chat["theta_high"] < chat["axis_top"]
    for table in re.findall(r"<table>.*?</table>", page, flags=re.S):
        assert "<td>" in table
    # stopped: the state files are gone, and the report says exactly what to pass
    assert not (data / "up.json").exists() and not list((tmp_path / "run").glob("*.json"))
    proc = subprocess.run([sys.executable, "-m", "dmem.cli", "report", "--out",
                           str(tmp_path / "r2.html")], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2
    assert "--data-dir" in proc.stderr and "DMEM_KAFKA__BROKER" in proc.stderr
