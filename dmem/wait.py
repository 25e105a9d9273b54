"""`dmem wait --settled`: wait until a deployment's jobs reached their fixed point.

Polls ``GET /health`` of every given worker (docs/guarantees/delivery.md: each worker
reports its components' pending work and ``settled``) until all of them say
``settled`` on every poll for ``quiet_s`` in a row (a record between two workers,
produced by one and not yet fetched by the other, can hide from a single poll). While
it waits it says, every `PROGRESS_EVERY_S`, what it still waits for (``progress``).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from schemas.errors import ServiceUnavailable

__all__ = ["PROGRESS_EVERY_S", "health", "wait_settled"]

#: seconds between two progress lines of a wait
PROGRESS_EVERY_S = 5.0


def health(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """One worker's /health body (also when it answers 503)."""
    req = urllib.request.Request(url.rstrip("/") + "/health")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return dict(json.loads(r.read()))
    except urllib.error.HTTPError as exc:  # 503: not ok, body still says why
        return dict(json.loads(exc.read() or b"{}"))


def _settled(bodies: Sequence[dict[str, Any]], components: Sequence[str] | None) -> bool:
    if components is None:
        return all(bool(h.get("settled")) for h in bodies)
    reports = [r for h in bodies if isinstance(r := h.get("settle"), dict)]
    if len(reports) < len(bodies):  # a worker that reports nothing yet
        return False
    for c in components:
        parts = [r[c] for r in reports if c in r]
        # a worker without the part (another role) has none of its work pending; a part
        # no worker reports is not done (a misspelled name, or its role is not up yet)
        if not parts or not all(bool(p.get("settled")) for p in parts):
            return False
    return True


def _pending(last: dict[str, Any], components: Sequence[str] | None) -> dict[str, Any]:
    """Per worker: why it is unreachable, or its unsettled parts (of ``components`` when
    given) with their pending work."""
    return {u: h["unreachable"] if "unreachable" in h else
            {k: v.get("pending") for k, v in (h.get("settle") or {}).items()
             if not v.get("settled") and (components is None or k in components)}
            for u, h in last.items()}  # fmt: skip


def wait_settled(urls: Sequence[str], timeout_s: float = 120.0, quiet_s: float = 1.0,
                 poll_s: float = 0.25, components: Sequence[str] | None = None,
                 progress: Callable[[str], None] | None = None,
                 every_s: float | None = None) -> dict[str, Any]:  # fmt: skip
    """Block until every worker is settled for `quiet_s`; returns the waited seconds and
    each worker's last settle report. ServiceUnavailable after `timeout_s`.

    ``components`` (names in ``/health``'s ``settle``, e.g. ``["credit"]``): wait for
    those only, in the workers that report them (at least one must); None: for
    everything the workers do. ``progress``: called every ``every_s`` (default
    `PROGRESS_EVERY_S`) of the wait with a line saying what it still waits for."""
    every = PROGRESS_EVERY_S if every_s is None else every_s
    t0 = time.monotonic()
    said = t0
    since: float | None = None
    last: dict[str, Any] = {}
    while True:
        now = time.monotonic()
        last, ok = {}, True
        for u in urls:
            try:
                last[u] = health(u)
            except (OSError, ValueError) as exc:  # not up yet / restarting: say which
                last[u], ok = {"unreachable": f"{u}/health: {exc}"}, False
        ok = ok and _settled(list(last.values()), components)
        if ok:
            since = now if since is None else since
            if now - since >= quiet_s:
                return {"settled": True, "waited_s": round(now - t0, 3),
                        "workers": {u: h.get("settle") for u, h in last.items()}}  # fmt: skip
        else:
            since = None
        if now - t0 > timeout_s:
            pending = json.dumps(_pending(last, components), default=str)
            raise ServiceUnavailable(f"not settled after {timeout_s:g} s; pending: {pending}")
        if progress is not None and now - said >= every:
            said = now
            if since is None:
                what = json.dumps(_pending(last, components), default=str)
            else:  # settled: the quiet period runs
                what = f"settled for {now - since:.1f} of {quiet_s:g} s in a row"
            progress(f"dmem wait: {now - t0:.0f} s of {timeout_s:g} s, still waiting for: {what}")
        time.sleep(poll_s)
