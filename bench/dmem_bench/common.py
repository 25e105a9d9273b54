"""Shared helpers for every `dmem bench ...` command.

Conventions (so that all benchmarks read the same way):

- Humans read stderr: progress lines and a final table. Machines read stdout:
  exactly one JSON object, on the last line (`emit_json`).
- A measurement is repeated (`repeats` >= 1) and each repeat summarised by
  percentiles; the reported number is the median across repeats
  (`median_across`), so one noisy repeat does not move the result.
- Percentiles use linear interpolation between closest ranks (numpy's default
  "linear" method), so p50 of an even-sized sample is the mean of the middle two.
- `cleanup_on_signals` turns SIGTERM (and SIGHUP) into `KeyboardInterrupt`, so
  the ``finally`` blocks that stop servers, brokers and workers also run when
  the benchmark is killed politely, not just on Ctrl-C.
"""

from __future__ import annotations

import math
import os
import platform
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson

from dmem.progress import Progress

__all__ = [
    "NOTE_OBJECTS",
    "NOTE_SUBJECTS",
    "NOTE_VERBS",
    "Progress",
    "cleanup_on_signals",
    "publish_lockstep",
    "emit_json",
    "machine_info",
    "median_across",
    "note",
    "percentile",
    "print_table",
    "summarize_ms",
    "timed",
]


# Words of the synthetic agent notes (`dmem bench retrieval`, `dmem bench embedded`).
NOTE_SUBJECTS = (
    "user", "customer", "planner", "tool call", "web page", "calendar", "inventory",
    "shopping cart", "support ticket", "email thread", "database query", "api response",
)  # fmt: skip
NOTE_VERBS = (
    "asked about", "failed on", "returned", "mentioned", "rejected", "confirmed",
    "timed out on", "updated", "cancelled", "requested a refund for", "scheduled",
)  # fmt: skip
NOTE_OBJECTS = (
    "the budget", "order", "flight", "invoice", "the deadline", "password reset",
    "room booking", "shipment", "the quarterly report", "a discount code", "meeting",
    "the red door", "the blue key", "the north corridor", "a locked chest",
)  # fmt: skip


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; NaN when empty."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    xs = sorted(float(v) for v in values)
    if not xs:
        return math.nan
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


def summarize_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """Latency samples in seconds -> p50/p90/p99/mean/max in milliseconds, and n."""
    ms = [s * 1e3 for s in samples_s]
    if not ms:
        return {
            "n": 0,
            "p50": math.nan,
            "p90": math.nan,
            "p99": math.nan,
            "mean": math.nan,
            "max": math.nan,
        }
    return {
        "n": len(ms),
        "p50": percentile(ms, 50),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
        "mean": statistics.fmean(ms),
        "max": max(ms),
    }


def median_across(repeats: Sequence[Mapping[str, float]], key: str) -> float:
    """Median of one summary statistic across repeats (NaN-free inputs expected)."""
    vals = [float(r[key]) for r in repeats if not math.isnan(float(r[key]))]
    return statistics.median(vals) if vals else math.nan


def note(msg: str, out: TextIO | None = None) -> None:
    """One progress line for humans (stderr)."""
    print(msg, file=out or sys.stderr, flush=True)


def print_table(
    title: str, header: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO | None = None
) -> None:
    """A plain aligned table on stderr (floats with 2 decimals)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{v:,.2f}"
        return str(v)

    body = [[cell(v) for v in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)
    ]
    o = out or sys.stderr
    line = "  ".join("-" * w for w in widths)
    print(f"\n{title}", file=o)
    print(line, file=o)
    print(
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w)
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        ),
        file=o,
    )
    print(line, file=o)
    for r in body:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ),
            file=o,
        )
    print(line, file=o, flush=True)


def _clean(obj: Any) -> Any:
    """NaN/inf -> None (JSON has no NaN), recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def emit_json(result: Mapping[str, Any]) -> None:
    """Print `result` as one JSON line on stdout (must be the last stdout line)."""
    sys.stdout.write(orjson.dumps(_clean(result)).decode() + "\n")
    sys.stdout.flush()


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 0
    mem_gb = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
                    break
    except OSError:
        pass
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        load = []
    return {
        "cpus": cpus,
        "loadavg_1_5_15": load,
        "mem_gb": mem_gb,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


@contextmanager
def cleanup_on_signals(signals: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Within the block, SIGTERM/SIGHUP raise KeyboardInterrupt (so finally runs)."""

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous: dict[int, Any] = {}
    for sig in signals:
        try:
            previous[sig] = signal.signal(sig, _raise)
        except (ValueError, OSError):  # not the main thread, or unsupported
            pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call, with the monotonic high-resolution clock."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def teardown(stack: Any, server: Any, tmp: Any, failed: bool) -> None:
    """Stop what a bench started (showing the workers' log tails if it failed), drop tmp."""
    import shutil

    from streams.local.stack import tail

    if stack is not None:
        if failed:
            for w in stack.workers:
                note(tail(w.log_path))
        stack.stop()
    if server is not None:
        server.stop()
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


async def publish_lockstep(
    producer: Any,
    consumer: Any,
    topic: str,
    chunk: Sequence[Any],
    done: Callable[[], bool],
    on_message: Callable[[Any], None],
    alive: Callable[[], bool],
    timeout_s: float = 180.0,
) -> None:
    """Publish one chunk of transitions (keyed by agent) and consume until ``done()``.

    The lockstep loop of the benches whose figures must not depend on machine speed:
    the next chunk is published only once the worker answered for this one
    (``on_message`` sees every consumed record and updates what ``done`` reads). A
    worker that died or stopped answering within ``timeout_s`` raises
    `ServiceUnavailable` instead of hanging the bench.
    """
    from schemas import encode
    from schemas.errors import ServiceUnavailable

    for tr in chunk:
        await producer.send(topic, encode(tr), key=tr.agent_id.encode())
    await producer.flush()
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline or not alive():
            raise ServiceUnavailable(f"the worker stopped answering ({len(chunk)}-record chunk)")
        batch = await consumer.getmany(timeout_ms=500)
        for msgs in batch.values():
            for m in msgs:
                on_message(m)
