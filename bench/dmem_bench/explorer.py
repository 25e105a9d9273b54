"""Headless-Chromium check of the memory explorer (``/ui/#tenant=T``).

`explorer_check(base_url, token, tenant, memory_id)` drives the page the way a
person does, over the Chrome DevTools Protocol (Chromium started with
``--remote-debugging-port``, one websocket, ``Runtime.evaluate`` for clicks and
reads): open the page on the tenant, find the memory's row in the explorer's
table (refreshing while the write path has not stored it yet), open it, press
thumbs up and wait until the panel shows a different utility (the credit job
applied the feedback), press forget (and confirm) and see the row gone; then
``GET /v1/memories/{id}`` must answer 404. Returns (ok, reason, timings).
``screenshot`` saves a PNG of the page with the detail panel open (docs).
Used by `dmem bench embedded` (``explorer_ok``) and the integration test.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from dmem_bench.ui import chromium_path

__all__ = ["Page", "explorer_check", "in_chromium"]

T = TypeVar("T")
_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


class Page:
    """One page target over CDP: ``js`` evaluates an expression and returns its value."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.n = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.n += 1
        mid = self.n
        await self.ws.send_str(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = await self.ws.receive(timeout=60)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"devtools socket closed: {msg.type}")
            data = json.loads(msg.data)
            if data.get("id") == mid:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                return dict(data.get("result") or {})

    async def js(self, expr: str) -> Any:
        res = await self.call("Runtime.evaluate", expression=expr, returnByValue=True,
                              awaitPromise=True)  # fmt: skip
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails']}")
        return (res.get("result") or {}).get("value")

    async def until(self, expr: str, timeout_s: float, step_s: float = 0.25,
                    every: str | None = None) -> Any:  # fmt: skip
        """Poll ``expr`` until truthy; run ``every`` (a refresh click) each second."""
        deadline = time.monotonic() + timeout_s
        last_kick = time.monotonic()
        while True:
            v = await self.js(expr)
            if v:
                return v
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s:.0f} s for {expr}")
            if every and time.monotonic() - last_kick > 1.0:
                await self.js(every)
                last_kick = time.monotonic()
            await asyncio.sleep(step_s)


def _row(mid: str) -> str:
    return f"document.querySelector('#memories tr[data-memory-id={json.dumps(mid)}]')"


async def _drive(page: Page, url: str, mid: str, shot: Path | None,
                 timeout_s: float) -> dict[str, float]:  # fmt: skip
    t: dict[str, float] = {}
    t0 = time.monotonic()
    await page.call("Page.enable")
    await page.call("Page.navigate", url=url)
    await page.until("document.body && document.body.dataset.explorer === 'ready'", timeout_s)
    await page.until(
        f"!!{_row(mid)}", timeout_s, every="document.getElementById('mem-refresh').click()"
    )
    t["find_s"] = time.monotonic() - t0
    await page.js(f"{_row(mid)}.focus(); {_row(mid)}.dispatchEvent(new KeyboardEvent('keydown', "
                  "{key: 'Enter', bubbles: true})); true")  # fmt: skip
    opened = (
        f"document.body.dataset.detail === 'ready' && "
        f"document.getElementById('mem-detail').dataset.memoryId === {json.dumps(mid)}"
    )
    await page.until(opened, timeout_s)
    before = float(await page.js("document.getElementById('mem-detail').dataset.utility"))
    t1 = time.monotonic()
    await page.js("document.getElementById('d-up').click(); true")
    state = await page.until("['applied', 'pending', 'error'].includes(document.body.dataset."
                             "rating) && document.body.dataset.rating", timeout_s + 30)  # fmt: skip
    if state != "applied":
        raise RuntimeError(f"thumbs up: rating state {state!r}, the utility did not move")
    after = float(await page.js("document.getElementById('mem-detail').dataset.utility"))
    if not after > before:
        raise RuntimeError(f"thumbs up moved the utility from {before} to {after}")
    t["rate_s"] = time.monotonic() - t1
    if shot is not None:
        await page.js("document.getElementById('mem-detail').scrollIntoView(); true")
        await page.call("Emulation.setDeviceMetricsOverride", width=1100, height=1300,
                        deviceScaleFactor=1, mobile=False)  # fmt: skip
        await page.js("document.getElementById('explorer-sec').scrollIntoView(); true")
        png = await page.call("Page.captureScreenshot", format="png")
        shot.write_bytes(base64.b64decode(png["data"]))
    t2 = time.monotonic()
    await page.js("document.getElementById('d-forget').click(); "
                  "document.getElementById('d-forget-yes').click(); true")  # fmt: skip
    gone = (
        f"document.body.dataset.forgot === {json.dumps(mid)} && "
        f"document.body.dataset.explorer === 'ready' && !{_row(mid)}"
    )
    await page.until(gone, timeout_s)
    t["forget_s"] = time.monotonic() - t2
    t["utility_before"], t["utility_after"] = before, after
    return t


async def in_chromium(chromium: str, drive: Callable[[Page], Awaitable[T]]) -> T:
    """``drive(page)`` on a fresh headless Chromium's one page (about:blank: ``drive``
    navigates), then the browser is stopped whatever happened."""
    # chromium's helper processes may still write into the profile as it exits: the
    # whole process group is stopped, and a leftover file never fails the check
    tmp = tempfile.TemporaryDirectory(prefix="dmem-explorer-", ignore_cleanup_errors=True)
    with tmp as profile:
        proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--disable-background-networking", "--disable-component-update", "--no-first-run",
             "--remote-debugging-port=0", f"--user-data-dir={Path(profile)}",
             "--window-size=1100,1300", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True)  # fmt: skip
        try:
            assert proc.stderr is not None
            deadline = time.monotonic() + 60
            browser = None
            while browser is None and time.monotonic() < deadline:
                line = await asyncio.to_thread(proc.stderr.readline)
                if not line and proc.poll() is not None:
                    raise RuntimeError(f"chromium exited {proc.returncode}")
                if m := _LISTENING.search(line):
                    browser = m.group(1)
            if browser is None:
                raise RuntimeError("chromium did not open its devtools port")
            port = urllib.parse.urlparse(browser).port
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    targets = await r.json()
                target = next(x for x in targets if x.get("type") == "page")
                async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    return await drive(Page(ws))
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to chromium's process group, SIGKILL after 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _status(base_url: str, token: str | None, tenant: str, mid: str) -> int:
    q = urllib.parse.quote
    req = urllib.request.Request(
        f"{base_url.rstrip('/')}/v1/memories/{q(mid)}?tenant={q(tenant)}",
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def explorer_check(base_url: str, token: str | None, tenant: str, memory_id: str, *,
                   screenshot: Path | None = None, timeout_s: float = 60.0,
                   ) -> tuple[bool, str, dict[str, float]]:  # fmt: skip
    """(ok, reason, timings) of the scenario in the module doc."""
    chromium = chromium_path()
    if chromium is None:
        return False, "no chromium on PATH (scripts/setup.sh installs it)", {}
    frag = f"#tenant={urllib.parse.quote(tenant, safe='')}"
    if token:
        frag += f"&token={urllib.parse.quote(token, safe='')}"
    url = f"{base_url.rstrip('/')}/ui/{frag}"
    try:
        t = asyncio.run(
            in_chromium(chromium, lambda page: _drive(page, url, memory_id, screenshot, timeout_s))
        )
    except (RuntimeError, TimeoutError, OSError, aiohttp.ClientError, StopIteration) as exc:
        return False, f"explorer scenario failed: {exc}", {}
    # reads are bounded-stale (DMEM_MILVUS__SEARCH_CONSISTENCY), but a forgotten id is
    # left out of every read at once (milvus.tombstones): the first read must miss it
    code = _status(base_url, token, tenant, memory_id)
    if code != 404:
        return False, f"right after forget, GET /v1/memories/{memory_id} answered {code}", t
    return True, (f"found {memory_id!r}, thumbs up moved utility {t['utility_before']:.3f} -> "
                  f"{t['utility_after']:.3f}, forgotten and gone"), t  # fmt: skip
