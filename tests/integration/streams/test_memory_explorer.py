"""Reading, listing and managing a tenant's memories over HTTP and in the live page,
against a real stack (Tansu broker, one all-roles worker, Milvus Lite) with auth on.

Transitions are ingested over HTTP; then: a memory by id, several by id, a
newest-first walk with a cursor and the search's filters, its history (the
written event with the gate's reason and thresholds), 422 with reasons for bad
input, 404 for another tenant's id (never a leak), and the explorer in headless
Chromium: find the memory, rate it and see its utility move, forget it and see it
gone (`dmem_bench.explorer.explorer_check`, `dmem bench embedded`'s explorer_ok).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dmem_bench.explorer import explorer_check
from dmem_bench.ui import chromium_path
from streams.local.stack import LocalStack
from tests.integration.broker_fixtures import tokened_stack

pytestmark = pytest.mark.integration

TOKENS = {"tok-a": ["alpha"], "tok-b": ["beta"]}


def call(base: str, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def episode(tenant: str, ep: str) -> list[dict[str, Any]]:
    out = []
    for k in range(12):
        trap = k == 6
        out.append({"tenant": tenant, "agent_id": "agent-1" if k % 2 else "agent-2",
                    "episode_id": ep, "step": k, "ts": 1_700_000_000_000 + 1000 * k,
                    "observation": f"the cellar door is locked, step {k}" if trap
                    else f"walking down the long hall past painting {k}",
                    "action": "use key on door" if trap else "walk",
                    "reward": 10.0 if trap else 0.0,
                    "metadata": {"room": f"r{k % 3}"}})  # fmt: skip
    return out


@pytest.fixture
def stack(tmp_path: Path, broker: str, topic_prefix: str) -> Iterator[LocalStack]:
    with tokened_stack(tmp_path / "data", broker, topic_prefix, TOKENS) as s:
        yield s


def test_read_list_history_and_explorer(stack: LocalStack, tmp_path: Path) -> None:
    base = f"http://127.0.0.1:{stack.web_ports[0]}"
    for tenant, tok in (("alpha", "tok-a"), ("beta", "tok-b")):
        for e in range(3):
            code, body = call(base, "POST", "/v1/transitions", tok, episode(tenant, f"ep{e}"))
            assert code == 202, body
    deadline = time.monotonic() + 90
    mems: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        code, body = call(base, "GET", "/v1/memories?tenant=alpha&limit=500", "tok-a")
        assert code == 200, body
        mems = body["memories"]
        if any(m["action"] == "use key on door" for m in mems):
            break
        time.sleep(0.5)
    trap = next(m for m in mems if m["action"] == "use key on door")
    assert all(m["tenant"] == "alpha" for m in mems)
    stamps = [(m["created_ts"], m["memory_id"]) for m in mems]
    assert stamps == sorted(stamps, reverse=True)

    # by id, several by id, another tenant's id
    mid = trap["memory_id"]
    code, row = call(base, "GET", f"/v1/memories/{mid}?tenant=alpha", "tok-a")
    assert code == 200 and row["memory_id"] == mid and row["text"] == trap["text"]
    assert "vector" not in row and row["partition"] in ("core", "buffer")
    code, body = call(base, "GET", f"/v1/memories?tenant=alpha&ids={mid},nope", "tok-a")
    assert code == 200 and [m["memory_id"] for m in body["memories"]] == [mid]
    assert body["missing"] == ["nope"]
    code, body = call(base, "POST", "/v1/memories:batch_get", "tok-a",
                      {"tenant": "alpha", "ids": [mid, "nope"]})  # fmt: skip
    assert code == 200 and body["missing"] == ["nope"]
    code, _ = call(base, "GET", f"/v1/memories/{mid}?tenant=beta", "tok-b")
    assert code == 404  # beta's view of alpha's id: exactly like a missing one
    code, _ = call(base, "GET", f"/v1/memories/{mid}/history?tenant=beta", "tok-b")
    assert code == 404
    code, _ = call(base, "GET", f"/v1/memories/{mid}?tenant=alpha", "tok-b")
    assert code == 403

    # pages and filters
    walked: list[str] = []
    cursor = None
    while True:
        q = "/v1/memories?tenant=alpha&limit=2" + (f"&cursor={cursor}" if cursor else "")
        code, body = call(base, "GET", q, "tok-a")
        assert code == 200 and len(body["memories"]) <= 2
        walked += [m["memory_id"] for m in body["memories"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert walked == [m["memory_id"] for m in mems]
    code, body = call(base, "GET", "/v1/memories?tenant=alpha&agent_id=agent-2&meta.room=r0"
                      "&valence=1&limit=50", "tok-a")  # fmt: skip
    assert code == 200
    assert {m["memory_id"] for m in body["memories"]} == {
        m["memory_id"] for m in mems if m["agent_id"] == "agent-2"
        and m["metadata"]["user"]["room"] == "r0" and m["valence"] == 1}  # fmt: skip

    # bad input: 422 with reasons
    for bad in ("limit=0", "colour=red", "cursor=zzz", "valence=2", "partition=attic"):
        code, body = call(base, "GET", f"/v1/memories?tenant=alpha&{bad}", "tok-a")
        assert code == 422 and (body.get("detail") or body.get("error")), (bad, body)
    code, body = call(base, "POST", "/v1/memories:batch_get", "tok-a", {"tenant": "alpha"})
    assert code == 422 and body["detail"]
    code, body = call(base, "GET", f"/v1/memories/{mid}/history?tenant=alpha&limit=x", "tok-a")
    assert code == 422
    code, body = call(base, "GET", "/v1/live?tenant=%3Cimg%3E", "tok-a")
    assert code == 422 and "tenant must match" in body["error"]  # never echoed as a tenant
    code, body = call(base, "DELETE", f"/v1/memories/{mid}", "tok-a")
    assert code == 422 and body["error"] == "query parameter tenant is required"

    # history: why it was stored
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while not events and time.monotonic() < deadline:
        code, body = call(base, "GET", f"/v1/memories/{mid}/history?tenant=alpha", "tok-a")
        events = body.get("events", []) if code == 200 else []
        time.sleep(0.3)
    written = next(e for e in events if e["kind"] == "written")
    assert written["route"] == row["partition"] and written["reason"]
    assert {"theta_low", "theta_high", "rpe_smoothed"} <= set(written)
    assert written["ts"] == row["created_ts"]  # event time, not processing time

    if chromium_path() is None:
        pytest.skip("no chromium (scripts/setup.sh installs it)")
    shot = Path(os.environ["DMEM_EXPLORER_SHOT"]) if os.environ.get("DMEM_EXPLORER_SHOT") \
        else tmp_path / "explorer.png"  # fmt: skip
    ok, why, timings = explorer_check(base, "tok-a", "alpha", mid, screenshot=shot)
    assert ok, why
    assert timings["utility_after"] > timings["utility_before"]
    assert shot.stat().st_size > 10_000
    code, body = call(base, "GET", f"/v1/memories/{mid}/history?tenant=alpha", "tok-a")
    kinds = [e["kind"] for e in body["events"]] if code == 200 else []
    deadline = time.monotonic() + 30
    while "forgotten" not in kinds and time.monotonic() < deadline:
        time.sleep(0.5)
        code, body = call(base, "GET", f"/v1/memories/{mid}/history?tenant=alpha", "tok-a")
        kinds = [e["kind"] for e in body["events"]] if code == 200 else []
    assert "fed_back" in kinds and kinds[-1] == "forgotten", kinds


def test_the_page_keeps_tenants_apart_and_says_what_it_could_not_do(
    stack: LocalStack,
) -> None:
    """In headless Chromium, as a person uses the page: the token leaves the address bar
    (also from a link pasted into the open tab), the token form is hidden once signed in,
    a malformed metadata filter is said, not dropped, a second thumbs on a memory is
    reported applied (its history holds it, though the utility cannot move past 1), and
    a token that may not read the tenant asked for shows none of that tenant's memories:
    the page goes back to the token's own tenant and says why."""
    import asyncio

    from dmem_bench.explorer import Page, in_chromium

    chromium = chromium_path()
    if chromium is None:
        pytest.skip("no chromium (scripts/setup.sh installs it)")
    base = f"http://127.0.0.1:{stack.web_ports[0]}"
    ids: dict[str, set[str]] = {}
    for tenant, tok in (("alpha", "tok-a"), ("beta", "tok-b")):
        code, body = call(base, "POST", "/v1/transitions", tok, episode(tenant, "ep0"))
        assert code == 202, body
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (ids.get("alpha") and ids.get("beta")):
        for tenant, tok in (("alpha", "tok-a"), ("beta", "tok-b")):
            code, body = call(base, "GET", f"/v1/memories?tenant={tenant}&limit=500", tok)
            ids[tenant] = {m["memory_id"] for m in body.get("memories", [])}
        time.sleep(0.5)
    assert ids["alpha"] and ids["beta"]

    shown = (
        "Array.from(document.querySelectorAll('#memories tr.memory')).map(r => r.dataset.memoryId)"
    )
    explorer_on = "document.getElementById('explorer-tenant').textContent"

    async def drive(page: Page) -> None:
        await page.call("Page.enable")
        await page.call("Page.navigate", url=f"{base}/ui/#tenant=alpha&token=tok-a")
        await page.until("document.body && document.body.dataset.explorer === 'ready' && "
                         "document.querySelectorAll('#memories tr.memory').length > 0", 60,
                         every="document.getElementById('mem-refresh').click()")  # fmt: skip
        assert "token" not in await page.js("location.href")
        assert await page.js("getComputedStyle(document.getElementById('auth')).display") == "none"
        assert set(await page.js(shown)) <= ids["alpha"]
        # a memory of another day shows its date (a replayed chat of 2023 read as "later
        # today" when only the time of day was shown); today's shows the time of day
        assert re.fullmatch(r"2023-11-1[45] \d\d:\d\d",
                            await page.js("window.dmemUi.fmtWhen(1700000000000)"))  # fmt: skip
        assert re.fullmatch(r"\d\d:\d\d:\d\d", await page.js("window.dmemUi.fmtWhen(Date.now())"))

        # a metadata filter without a key: said, and the list is not reloaded unfiltered
        await page.js("document.getElementById('f-meta').value = '=x'; "
                      "document.getElementById('mem-filters').requestSubmit(); true")  # fmt: skip
        note = await page.until("document.body.dataset.explorer === 'error' && "
                                "document.getElementById('mem-note').textContent", 10)  # fmt: skip
        assert "key=value" in note
        await page.js("document.getElementById('f-meta').value = ''; "
                      "document.getElementById('mem-filters').requestSubmit(); true")  # fmt: skip
        await page.until("document.body.dataset.explorer === 'ready'", 30)

        # thumbs up twice: the second is applied too (history), at utility 1 already
        first = (await page.js(shown))[0]
        await page.js(f"document.querySelector('#memories tr[data-memory-id=\"{first}\"]')"
                      ".click(); true")  # fmt: skip
        await page.until("document.body.dataset.detail === 'ready'", 30)
        for _ in range(2):
            await page.js("document.body.dataset.rating = ''; "
                          "document.getElementById('d-up').click(); true")  # fmt: skip
            rated = (
                "['applied', 'pending', 'error'].includes(document.body.dataset.rating)"
                " && document.body.dataset.rating"
            )
            state = await page.until(rated, 60)
            assert state == "applied", state

        # a link with the other tenant's token pasted into this tab
        await page.js("location.hash = '#tenant=beta&token=tok-b'; true")
        await page.until(f"{explorer_on} === 'beta' && document.body.dataset.explorer === "
                         "'ready'", 30)  # fmt: skip
        assert "token" not in await page.js("location.href")
        assert set(await page.js(shown)) <= ids["beta"]
        # asking for alpha with beta's token: nothing of alpha, back to beta, and why
        await page.js("location.hash = '#tenant=alpha'; true")
        status = await page.until("document.getElementById('status').textContent.includes("
                                  "'not allowed') && document.getElementById('status')"
                                  ".textContent", 30)  # fmt: skip
        assert "alpha" in status
        await page.until(f"{explorer_on} === 'beta' && document.body.dataset.explorer === "
                         "'ready'", 30)  # fmt: skip
        assert not set(await page.js(shown)) & ids["alpha"]
        tenants = await page.js("Array.from(document.querySelectorAll('#tenants tbody tr'))"
                                ".map(r => r.dataset.tenant)")  # fmt: skip
        assert "alpha" not in tenants

    asyncio.run(in_chromium(chromium, drive))
