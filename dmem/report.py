"""`dmem report --out report.html`: one self-contained HTML page about what the gate does.

Data sources (settings from ``DMEM_*`` env vars, so it works against `dmem up`
or a production deployment):

- the ``memories`` topic, read from the beginning to its end at start (capped
  by ``max_events``, newest kept): every MemoryEvent carries route, reason,
  rpe_smoothed, theta_low/theta_high, partition and processing time ``ts``.
  Gives the RPE distribution with the current thresholds (those of the newest
  event per tenant), routing decisions over time and partition sizes over time
  (replayed from written/moved/promoted/demoted/merged/evicted/forgotten events).
- Milvus (``utility`` of every stored row) for the utility distribution. Milvus
  Lite is a single-process file store: while a worker holds the file (as under
  `dmem up`) the scan can fail; the report then replays the ``credit`` topic
  (utility = EMA of credit per use with ``jobs.utility_beta``, as the applier
  computes it) and says which source it used.
- benchmark results: ``.dmem-bench/*.json`` (written by `dmem bench ...`) and any
  ``--bench-json`` files; the newest file per benchmark name is shown, as a bar
  chart of its throughput numbers and a table of every scalar.

Plots are matplotlib PNGs embedded as base64 ``data:`` URIs: the page needs no
network and no other file, and opens in any browser (checked in the tests with
headless Chromium).
"""

from __future__ import annotations

import asyncio
import base64
import html
import io
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from streams.settings import Settings

ROUTE_COLORS = {"core": "#d62728", "buffer": "#ff7f0e", "drop": "#7f7f7f"}
DEFAULT_BENCH_DIR = Path(".dmem-bench")


@dataclass
class ReportData:
    events: list[dict[str, Any]] = field(default_factory=list)
    utilities: list[float] = field(default_factory=list)
    utility_source: str = "none"
    benches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- reading


async def read_topic(
    settings: Settings, logical: str, max_records: int, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """Decoded JSON values of a topic from the beginning to its end at start (newest kept)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from streams.admin import kafka_client_kwargs

    topic = settings.topic(logical)
    consumer = AIOKafkaConsumer(
        enable_auto_commit=False, fetch_max_wait_ms=50, **kafka_client_kwargs(settings.kafka)
    )
    await consumer.start()
    out: list[dict[str, Any]] = []
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return out
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        begins = await consumer.beginning_offsets(tps)
        # newest max_records overall: start each partition at most max_records from its end
        for tp in tps:
            consumer.seek(tp, max(begins[tp], ends[tp] - max_records))
        pending = {tp for tp in tps if ends[tp] > begins[tp]}
        deadline = time.monotonic() + timeout_s
        # Read past the end offsets until the topic goes quiet: the embedded
        # broker's ListOffsets can report a batch's base offset rather than the
        # high watermark, so `ends` is a lower bound here, not the exact end.
        quiet = False
        while (pending or not quiet) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300, max_records=10_000)
            quiet = not any(batch.values())
            for tp, msgs in batch.items():
                for m in msgs:
                    try:
                        out.append(orjson.loads(m.value))
                    except orjson.JSONDecodeError:
                        continue
                if msgs and msgs[-1].offset >= ends[tp] - 1:
                    pending.discard(tp)
    finally:
        await consumer.stop()
    out.sort(key=lambda e: e.get("ts", 0))
    return out[-max_records:]


def milvus_utilities(settings: Settings) -> list[float]:
    from milvus import MemoryStore

    store = MemoryStore(
        settings.milvus_uri, collection=settings.milvus.collection, token=settings.milvus.token
    )
    store.connect()
    try:
        return [float(r.get("utility") or 0.0) for r in store.scan(output_fields=["utility"])]
    finally:
        store.close()


def credit_utilities(updates: Iterable[dict[str, Any]], beta: float) -> list[float]:
    """Utility per memory replayed from UtilityUpdates: EMA of credit per use."""
    util: dict[str, float] = {}
    seen: set[str] = set()
    for u in sorted(updates, key=lambda x: x.get("ts", 0)):
        uid, mid = str(u.get("update_id")), u.get("memory_id")
        if mid is None or uid in seen:
            continue
        seen.add(uid)
        per_use = float(u.get("credit", 0.0)) / max(int(u.get("uses", 1) or 1), 1)
        util[mid] = util.get(mid, 0.0) + beta * (per_use - util.get(mid, 0.0))
    return list(util.values())


def load_benches(paths: Sequence[Path], bench_dir: Path | None) -> list[tuple[str, dict[str, Any]]]:
    files = list(paths)
    if bench_dir is not None and bench_dir.is_dir():
        files += sorted(bench_dir.glob("*.json"))
    out = []
    seen: set[Path] = set()
    for p in sorted(files, key=lambda x: x.stat().st_mtime if x.exists() else 0, reverse=True):
        rp = p.resolve()
        if rp in seen or not p.is_file():
            continue
        seen.add(rp)
        try:
            data = orjson.loads(p.read_bytes().strip().splitlines()[-1])
        except (orjson.JSONDecodeError, IndexError, OSError):
            continue
        if isinstance(data, dict):
            out.append((p.name, data))
    return out


def collect(
    settings: Settings,
    max_events: int = 200_000,
    bench_json: Sequence[Path] = (),
    bench_dir: Path | None = DEFAULT_BENCH_DIR,
    timeout_s: float = 30.0,
) -> ReportData:
    data = ReportData()
    data.events = asyncio.run(read_topic(settings, "memories", max_events, timeout_s))
    try:
        data.utilities = milvus_utilities(settings)
        data.utility_source = f"Milvus ({settings.milvus.collection})"
    except Exception as exc:  # noqa: BLE001 - fall back to the credit topic
        data.notes.append(f"Milvus scan failed ({type(exc).__name__}: {exc}); "
                          "utility replayed from the credit topic")
        credit = asyncio.run(read_topic(settings, "credit", max_events, timeout_s))
        data.utilities = credit_utilities(credit, settings.jobs.utility_beta)
        data.utility_source = "credit topic (replayed EMA)"
    data.benches = load_benches(bench_json, bench_dir)
    return data


# --------------------------------------------------------------------------- plots


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _fig(title: str) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.set_title(title)
    return fig, ax


def _empty(ax: Any, msg: str) -> None:
    ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def latest_thresholds(events: Sequence[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    for e in events:
        if e.get("theta_low") is not None and e.get("theta_high") is not None:
            out[e.get("tenant", "?")] = (float(e["theta_low"]), float(e["theta_high"]))
    return out


def plot_rpe(events: Sequence[dict[str, Any]]) -> str:
    import numpy as np

    fig, ax = _fig("Smoothed |RPE| (gate score) by route, with the current thresholds")
    scores = [(e["rpe_smoothed"], e.get("route") or "drop") for e in events
              if e.get("rpe_smoothed") is not None and e.get("kind") in ("written", "dropped")]
    if not scores:
        _empty(ax, "no gate decisions on the memories topic yet")
        return _png(fig)
    allv = np.array([s for s, _ in scores])
    hi = float(np.quantile(allv, 0.995)) if len(allv) > 10 else float(allv.max())
    bins = np.linspace(0.0, max(hi, 1e-6) * 1.05, 60)
    stacks = [np.clip([s for s, r in scores if r == route], 0, bins[-1])
              for route in ("drop", "buffer", "core")]
    ax.hist(stacks, bins=bins, stacked=True, label=["drop", "buffer", "core"],
            color=[ROUTE_COLORS[r] for r in ("drop", "buffer", "core")])
    for i, (tenant, (lo, hi_t)) in enumerate(sorted(latest_thresholds(events).items())[:4]):
        ax.axvline(lo, color="#1f77b4", ls="--", lw=1.2,
                   label=f"theta_low {lo:.2f} ({tenant})" if i < 4 else None)
        ax.axvline(hi_t, color="#9467bd", ls="-", lw=1.2,
                   label=f"theta_high {hi_t:.2f} ({tenant})" if i < 4 else None)
    ax.set_xlabel("rpe_smoothed (units of the tenant's RPE sigma)")
    ax.set_ylabel("transitions")
    ax.legend(fontsize=7)
    return _png(fig)


def _time_bins(ts: Sequence[int], n: int = 40) -> Any:
    import numpy as np

    lo, hi = min(ts), max(ts)
    return np.linspace(lo, hi if hi > lo else lo + 1000, n + 1)


def _as_dates(ms: Any) -> Any:
    import numpy as np

    return np.array(ms, dtype="datetime64[ms]")


def plot_routes(events: Sequence[dict[str, Any]]) -> str:
    import numpy as np

    fig, ax = _fig("Routing decisions over time")
    dec = [(e["ts"], e.get("route") or "drop") for e in events
           if e.get("kind") in ("written", "dropped") and e.get("ts") is not None]
    if not dec:
        _empty(ax, "no gate decisions yet")
        return _png(fig)
    edges = _time_bins([t for t, _ in dec])
    bottom = np.zeros(len(edges) - 1)
    width = (edges[1] - edges[0]) * 0.9
    mids = (edges[:-1] + edges[1:]) / 2
    for route in ("drop", "buffer", "core"):
        h, _ = np.histogram([t for t, r in dec if r == route], bins=edges)
        ax.bar(_as_dates(mids), h, width=np.timedelta64(max(int(width), 1), "ms"),
               bottom=bottom, color=ROUTE_COLORS[route], label=route)
        bottom += h
    ax.set_ylabel("transitions per bin")
    ax.legend(fontsize=8)
    fig.autofmt_xdate()
    return _png(fig)


def partition_sizes(events: Sequence[dict[str, Any]]) -> tuple[list[int], dict[str, list[int]]]:
    """(ts, {partition: size}) after each event, replaying the memory event kinds."""
    where: dict[str, str] = {}
    size: Counter[str] = Counter()
    ts: list[int] = []
    series: dict[str, list[int]] = {"core": [], "buffer": []}
    for e in events:
        kind, mid, part = e.get("kind"), e.get("memory_id"), e.get("partition")
        if mid is None or e.get("ts") is None:
            continue
        old = where.get(mid)
        if kind in ("written", "moved", "promoted", "demoted", "merged") and part in series:
            if old != part:
                if old:
                    size[old] -= 1
                size[part] += 1
                where[mid] = part
        elif kind in ("evicted", "forgotten") and old:
            size[old] -= 1
            del where[mid]
        else:
            continue
        ts.append(int(e["ts"]))
        for p in series:
            series[p].append(size[p])
    return ts, series


def plot_partitions(events: Sequence[dict[str, Any]]) -> str:
    fig, ax = _fig("Partition sizes over time (replayed from MemoryEvents)")
    ts, series = partition_sizes(events)
    if not ts:
        _empty(ax, "nothing stored yet")
        return _png(fig)
    for part, ys in series.items():
        ax.step(_as_dates(ts), ys, where="post", label=part, color=ROUTE_COLORS[part])
    ax.set_ylabel("memories")
    ax.legend(fontsize=8)
    fig.autofmt_xdate()
    return _png(fig)


def plot_utility(utilities: Sequence[float], source: str) -> str:
    fig, ax = _fig(f"Utility distribution ({source})")
    if not utilities:
        _empty(ax, "no stored memories / no credit yet")
        return _png(fig)
    ax.hist(utilities, bins=40, color="#2ca02c")
    ax.set_xlabel("utility (EMA of credit per use)")
    ax.set_ylabel("memories")
    return _png(fig)


def bench_series(data: dict[str, Any]) -> dict[str, float]:
    """Throughput-like numbers of a bench result (keys ending in _tps)."""
    return {k: float(v) for k, v in data.items()
            if k.endswith("_tps") and isinstance(v, int | float) and v is not None}


def plot_bench(name: str, data: dict[str, Any]) -> str | None:
    series = bench_series(data)
    if not series:
        return None
    fig, ax = _fig(f"{name}: throughput (transitions or rows per second)")
    keys = list(series)
    colors = ["#1f77b4" if k.startswith("pipeline") else "#aec7e8" for k in keys]
    ax.barh(keys, [series[k] for k in keys], color=colors)
    for i, k in enumerate(keys):
        ax.text(series[k], i, f" {series[k]:,.0f}", va="center", fontsize=8)
    ax.set_xlabel("per second")
    return _png(fig)


# --------------------------------------------------------------------------- html


def _img(b64: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


def _scalars(data: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in data.items() if isinstance(v, str | int | float | bool)]


def render(data: ReportData, settings: Settings, title: str = "dmem report") -> str:
    ev = data.events
    decisions = [e for e in ev if e.get("kind") in ("written", "dropped")]
    routes = Counter(e.get("route") or "drop" for e in decisions)
    reasons = Counter(f"{e.get('route')}: {e.get('reason')}" for e in decisions)
    th = latest_thresholds(ev)
    parts = []
    parts.append(f"<h1>{html.escape(title)}</h1>")
    parts.append(
        f"<p class=meta>generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} from broker "
        f"<code>{html.escape(settings.kafka.bootstrap)}</code>, topic "
        f"<code>{html.escape(settings.topic('memories'))}</code> ({len(ev):,} events) and "
        f"utility source {html.escape(data.utility_source)}.</p>"
    )
    for n in data.notes:
        parts.append(f"<p class=note>{html.escape(n)}</p>")
    summary = [("gate decisions", f"{len(decisions):,}")]
    for r in ("core", "buffer", "drop"):
        share = routes[r] / max(len(decisions), 1)
        summary.append((f"routed to {r}", f"{routes[r]:,} ({share:.1%})"))
    for tenant, (lo, hi) in sorted(th.items()):
        summary.append(
            (f"current thresholds ({tenant})", f"theta_low {lo:.3f}, theta_high {hi:.3f}")
        )
    parts.append(_table(["", ""], summary))
    parts.append("<h2>Gate</h2>")
    parts.append(_img(plot_rpe(ev), "RPE distribution with thresholds"))
    parts.append(_img(plot_routes(ev), "routing decisions over time"))
    parts.append(_table(["route: reason", "count"], sorted(reasons.items())))
    parts.append("<h2>Store</h2>")
    parts.append(_img(plot_partitions(ev), "partition sizes over time"))
    parts.append(_img(plot_utility(data.utilities, data.utility_source), "utility distribution"))
    parts.append("<h2>Latest benchmarks</h2>")
    if not data.benches:
        parts.append("<p class=note>no benchmark results found (run <code>dmem bench write "
                     "--json</code>; results land in <code>.dmem-bench/</code>).</p>")
    for name, b in data.benches:
        parts.append(f"<h3>{html.escape(name)}</h3>")
        img = plot_bench(name, b)
        if img:
            parts.append(_img(img, f"benchmark {name}"))
        parts.append(_table(["measure", "value"], _scalars(b)))
    css = (
        "body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222}"
        "img{display:block;max-width:100%;margin:1em 0}table{border-collapse:collapse;"
        "margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;font-size:13px}"
        ".meta,.note{color:#555;font-size:13px}"
    )
    return (
        "<!doctype html><html><head><meta charset=utf-8>"
        f"<title>{html.escape(title)}</title><style>{css}</style></head><body>"
        + "\n".join(parts)
        + "</body></html>\n"
    )


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3f}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def build_report(
    settings: Settings,
    out: Path,
    bench_json: Sequence[Path] = (),
    bench_dir: Path | None = DEFAULT_BENCH_DIR,
    max_events: int = 200_000,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Collect, render and write the report; returns a small summary."""
    data = collect(settings, max_events=max_events, bench_json=bench_json,
                   bench_dir=bench_dir, timeout_s=timeout_s)
    page = render(data, settings)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    by_route: defaultdict[str, int] = defaultdict(int)
    for e in data.events:
        if e.get("kind") in ("written", "dropped"):
            by_route[e.get("route") or "drop"] += 1
    return {
        "out": str(out),
        "events": len(data.events),
        "routes": dict(by_route),
        "utilities": len(data.utilities),
        "utility_source": data.utility_source,
        "benches": [n for n, _ in data.benches],
        "images": page.count("<img "),
        "bytes": len(page.encode()),
    }
