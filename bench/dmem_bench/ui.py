"""Headless-Chromium check of a respond worker's live page (`streams.respond.ui`).

`ui_check(base_url, token, tenant)` opens ``<base_url>/ui/?tenant=T&q=QUERY#token=...``
in headless Chromium (``--dump-dom`` after ``--virtual-time-budget``: timers run in
virtual time, network fetches are waited for), so the page's own JavaScript
fetches ``/v1/live`` and runs one search with the token as a bearer header. From
the resulting DOM it checks that the page reached ``data-state="ready"``, that the
tenant's row shows the same core/buffer counts as ``GET /v1/stats`` (read just
before and just after, so a stack that is still writing can pass), and, when the
tenant has memories, that the search rendered hits with their score-breakdown bars.
Used by `dmem bench embedded` (``ui_ok``) and by the integration test of the page.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
DEFAULT_QUERY = "what happened here"


def chromium_path() -> str | None:
    for name in CHROMIUM_NAMES:
        if found := shutil.which(name):
            return found
    return None


class PageDom(HTMLParser):
    """What `ui_check` reads from the dumped DOM (attributes the page's script sets)."""

    def __init__(self) -> None:
        super().__init__()
        self.body: dict[str, str] = {}
        self.tenants: dict[str, dict[str, str]] = {}
        self.hits: list[dict[str, str]] = []
        self.bars = 0
        self.status = ""
        self._in_status = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "body":
            self.body = a
        elif tag == "tr" and "data-tenant" in a:
            self.tenants[a["data-tenant"]] = a
        elif tag == "li" and "hit" in classes:
            self.hits.append(a)
        elif tag == "rect" and "bar-semantic-part" in classes:
            self.bars += 1
        elif a.get("id") == "status":
            self._in_status = True

    def handle_endtag(self, tag: str) -> None:
        self._in_status = False

    def handle_data(self, data: str) -> None:
        if self._in_status:
            self.status += data


def stats(base_url: str, token: str | None, tenant: str, timeout_s: float = 20.0) -> dict[str, Any]:
    """``GET /v1/stats?tenant=T`` (raises `urllib.error.URLError` / `HTTPError`)."""
    url = f"{base_url.rstrip('/')}/v1/stats?tenant={urllib.parse.quote(tenant)}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                timeout=timeout_s) as r:  # fmt: skip
        return dict(json.loads(r.read()))


def page_url(base_url: str, token: str | None, tenant: str, query: str) -> str:
    q = urllib.parse.urlencode({"tenant": tenant, "q": query})
    frag = f"#token={urllib.parse.quote(token, safe='')}" if token else ""
    return f"{base_url.rstrip('/')}/ui/?{q}{frag}"


def dump_dom(url: str, budget_ms: int = 20_000, timeout_s: float = 120.0) -> str:
    chromium = chromium_path()
    if chromium is None:
        raise FileNotFoundError("no chromium on PATH (scripts/setup.sh installs it)")
    with tempfile.TemporaryDirectory(prefix="dmem-ui-check-") as profile:
        flags = [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--disable-background-networking", "--disable-component-update", "--no-first-run",
            f"--user-data-dir={Path(profile)}", f"--virtual-time-budget={budget_ms}",
            "--dump-dom", url,
        ]  # fmt: skip
        proc = subprocess.run([chromium, *flags], capture_output=True, text=True,
                              timeout=timeout_s)  # fmt: skip
    if proc.returncode != 0 or "<body" not in proc.stdout:
        raise RuntimeError(f"chromium exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def ui_check(
    base_url: str, token: str | None, tenant: str, query: str = DEFAULT_QUERY
) -> tuple[bool, str]:
    """(ok, reason): the live page loads, shows the tenant's counts and renders a search."""
    try:
        before = stats(base_url, token, tenant)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, f"GET /v1/stats failed before the page was opened: {exc}"
    try:
        dom = PageDom()
        dom.feed(dump_dom(page_url(base_url, token, tenant, query)))
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return False, f"chromium could not render the page: {exc}"
    try:
        after = stats(base_url, token, tenant)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, f"GET /v1/stats failed after the page was opened: {exc}"
    state = dom.body.get("data-state")
    if state != "ready":
        return False, f"page state {state!r}, not 'ready': {dom.status.strip()!r}"
    row = dom.tenants.get(tenant)
    if row is None:
        return False, f"tenant {tenant!r} not in the page's table (has {sorted(dom.tenants)})"
    try:
        shown = (int(row["data-core"]), int(row["data-buffer"]))
    except (KeyError, ValueError):
        return False, f"tenant {tenant!r} row has no counts: {row}"
    expected = {(s["core"], s["buffer"]) for s in (before, after)}
    if shown not in expected:
        return False, f"page shows core/buffer {shown}, /v1/stats said {sorted(expected)}"
    msg = f"page ready; {tenant!r} shows core {shown[0]}, buffer {shown[1]} like /v1/stats"
    if after["total"] == 0:
        return True, msg + "; no memories, so no search hits expected"
    if dom.body.get("data-search") != "done":
        return False, msg + f"; search state {dom.body.get('data-search')!r}: {dom.status!r}"
    if not dom.hits or dom.bars < len(dom.hits):
        return False, msg + f"; search rendered {len(dom.hits)} hits, {dom.bars} score bars"
    return True, msg + f"; search {query!r} rendered {len(dom.hits)} hits with score bars"
