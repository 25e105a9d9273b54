"""`dmem report --out report.html`: one self-contained HTML page about what the gate does.

Which deployment (`locate`): ``--data-dir D`` reads the state file of the `dmem up`
running on ``D`` (``D/up.json``, `streams.local.announce`); without it, a
``DMEM_KAFKA__BROKER`` or ``DMEM_MILVUS__URI`` in the environment means "this
deployment, as configured by ``DMEM_*``"; otherwise the one running `dmem up` announced
in ``DMEM_RUNTIME_DIR`` (``~/.cache/dmem/up``) is used. None or several: an error
that names what to pass. The stack's addresses fill in only the ``DMEM_*`` settings
left unset, as for the client commands (`dmem.cli.common.stack_settings`).

Data sources:

- the ``memories`` topic, read from the beginning to its end at start (capped
  by ``max_events``, newest kept): every MemoryEvent carries route, reason,
  rpe_smoothed, theta_low/theta_high, partition and processing time ``ts``.
  Gives the distribution of the gate score per tenant with that tenant's current
  thresholds (those of its newest decision), routing decisions over time and
  partition sizes over time (replayed from written/moved/promoted/demoted/merged/
  evicted/forgotten events). The plotted score is ``rpe_smoothed``, which the write
  path sets to the gate score ``max(extrinsic, w * intrinsic)`` (`operators.surprise.
  gate_score`): the quantity the thresholds are compared with. Its axis ends at
  `streams.respond.live.histogram_top` (2 x theta_high or 1.2 x q90), with larger
  scores in the last bin, and counts are on a log scale: on a sparse-reward stream
  a quantile-only axis put every mundane score in the first bin.
- Milvus (``utility`` of every stored row) for the utility distribution. Milvus
  Lite is a single-process file store: while the `dmem up` worker holds the file
  the report does not try it and replays the ``credit`` topic instead (utility =
  the discounted mean of credit, `operators.credit.apply_utility` as the applier
  folds it with ``jobs.credit_discount``);
  it says which source it used.
- benchmark results: ``.dmem-bench/*.json`` (written by `dmem bench ...`; other JSON
  there is passed over) and any ``--bench-json`` files (`read_bench`: one JSON object,
  or the last line of a saved ``--json`` output; a file that holds no result is an
  error naming it); the newest file per benchmark name is shown, as a bar
  chart of its throughput numbers and a table of every scalar (nested objects
  flattened to ``a.b``); a file without numbers gets one line saying so.

Time axes are the browser-independent local time of the machine that renders the
report, ``HH:MM:SS`` (tenths added when the whole axis spans under 10 s).

Plots are matplotlib PNGs embedded as base64 ``data:`` URIs: the page needs no
network and no other file, and opens in any browser (checked in the tests with
headless Chromium).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import html
import io
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from operators.credit import apply_utility
from schemas import DECISION_KINDS
from schemas.errors import ConfigError
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
    source: str = "DMEM_* settings"
    up: dict[str, Any] | None = None


# --------------------------------------------------------------------------- locating


def locate(data_dir: Path | None = None) -> tuple[Settings, dict[str, Any] | None]:
    """The deployment to report on: (settings, the `dmem up` state or None).

    The client commands' rule (`dmem.cli.common.stack_settings`): a DMEM_* setting that
    names a deployment (`named_deployment`) means that deployment; otherwise the stack
    found, under the DMEM_* variables set (`up_settings`). Raises `ConfigError` with what
    to pass when it cannot decide.
    """
    from dmem.cli.common import named_deployment, settings_with, up_settings
    from streams.local.announce import STATE_NAME, client_env, read_state, the_running

    named = named_deployment()
    if data_dir is None and not named and os.environ.get("DMEM_DATA_DIR"):
        data_dir = Settings().data_dir  # picks one stack, as for the client commands
    if data_dir is not None:
        state = read_state(data_dir / STATE_NAME)
        if state is None:
            raise ConfigError(
                f"no running `dmem up` on {data_dir} ({data_dir / STATE_NAME} is missing or "
                f"its process is gone): start `dmem up --data-dir {data_dir}`"
            )
        # one deployment: not the stack's broker beside another's Milvus (the stack's own
        # values, as its `export` line sets them, name the same one)
        mine, own = Settings(), settings_with(client_env(state))
        pairs = (("DMEM_KAFKA__BROKER", mine.kafka.bootstrap, own.kafka.bootstrap),
                 ("DMEM_MILVUS__URI", mine.milvus_uri, own.milvus_uri))  # fmt: skip
        other = [k for k, a, b in pairs if os.environ.get(k) and a != b]
        if other:
            raise ConfigError(
                f"--data-dir {data_dir} picks a running `dmem up`, but {other[0]} names another "
                f"deployment: unset {other[0]}, or leave out --data-dir"
            )
        return up_settings(state), state
    if named:
        return Settings(), None
    runtime_dir = Settings().runtime_dir
    found = the_running(runtime_dir, "--data-dir {}")
    if found is not None:
        return up_settings(found), found
    raise ConfigError(
        f"no running `dmem up` found (none announced in {runtime_dir}): start `dmem up`, "
        "pass --data-dir DIR of a running one, or set DMEM_KAFKA__BROKER (and "
        "DMEM_MILVUS__URI or DMEM_DATA_DIR) for another deployment"
    )


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
    out: list[dict[str, Any]] = []
    try:  # a start that fails (no broker) still closes what it opened
        await consumer.start()
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
    from operators.encoders import encoder_dim

    # the collection's dim is the deployment's encoder's: a store opened with another
    # refuses the collection (the default 256 against minilm-static's 384)
    store = MemoryStore(
        settings.milvus_uri,
        collection=settings.milvus.collection,
        dim=encoder_dim(settings.encoder.name, settings.encoder.dim),
        token=settings.milvus.token,
    )
    store.connect()
    try:
        return [float(r.get("utility") or 0.0) for r in store.scan(output_fields=["utility"])]
    finally:
        store.close()


def credit_utilities(updates: Iterable[dict[str, Any]], discount: float) -> list[float]:
    """Utility per memory replayed from UtilityUpdates, folded as the applier folds them."""
    rows: dict[str, dict[str, Any]] = {}
    for u in sorted(updates, key=lambda x: x.get("ts", 0)):
        mid = u.get("memory_id")
        if mid is None:
            continue
        apply_utility(
            rows.setdefault(str(mid), {}),
            str(u.get("update_id")),
            float(u.get("credit", 0.0)),
            int(u.get("uses", 0) or 0),
            discount=discount,
            evidence=bool(u.get("evidence", True)),
        )
    return [float(r.get("utility", 0.0)) for r in rows.values()]


def read_bench(path: Path) -> dict[str, Any]:
    """The result in a benchmark file: the whole file as one JSON object (as the files in
    bench/results hold it), or the last line of a saved `dmem bench ... --json` output.

    Raises `ConfigError` naming the file and why it holds no result: it cannot be read,
    holds no JSON object, holds several (JSON Lines, such as records for `dmem import`),
    or holds a dmem record (an object with a ``tenant``; no result has one).
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read: {exc.strerror or exc}") from None
    try:
        data = orjson.loads(raw)
        why = "it holds JSON that is not an object"
    except orjson.JSONDecodeError:
        lines = raw.strip().splitlines()
        objects = sum(isinstance(_json_line(line), dict) for line in lines)
        data = _json_line(lines[-1]) if objects == 1 else None
        if objects > 1:
            why = (f"it holds {objects} JSON objects, one a line (JSON Lines, such as records "
                   "for `dmem import`), where a result is one object")  # fmt: skip
        else:
            why = "its last line is not a JSON object (`dmem bench ... --json` prints one)"
    if isinstance(data, dict) and "tenant" in data:
        why = "it holds a dmem record (an object with a tenant), not a result"
    elif isinstance(data, dict):
        return data
    raise ConfigError(f"{path} is not a dmem benchmark result: {why}")


def _json_line(line: bytes) -> Any:
    """One line's JSON value, or None where the line is not JSON."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return None


def load_benches(paths: Sequence[Path], bench_dir: Path | None) -> list[tuple[str, dict[str, Any]]]:
    """(file name, result) of the files named (`read_bench`: one that holds none raises
    `ConfigError`) and of the ``*.json`` in ``bench_dir`` that hold one (a bench also keeps
    other JSON there), newest first."""
    named = {p.resolve() for p in paths}
    files = list(paths)
    if bench_dir is not None and bench_dir.is_dir():
        files += sorted(bench_dir.glob("*.json"))
    out = []
    seen: set[Path] = set()
    for p in sorted(files, key=lambda x: x.stat().st_mtime if x.exists() else 0, reverse=True):
        rp = p.resolve()
        if rp in seen or (rp not in named and not p.is_file()):
            continue
        seen.add(rp)
        try:
            out.append((p.name, read_bench(p)))
        except ConfigError:
            if rp in named:
                raise
    return out


def collect(
    settings: Settings,
    max_events: int = 200_000,
    bench_json: Sequence[Path] = (),
    bench_dir: Path | None = DEFAULT_BENCH_DIR,
    timeout_s: float = 30.0,
    up: dict[str, Any] | None = None,
) -> ReportData:
    data = ReportData(up=up)
    if up is not None:
        data.source = f"the running `dmem up` (pid {up.get('pid')}, data dir {up['data_dir']})"
    data.events = asyncio.run(read_topic(settings, "memories", max_events, timeout_s))
    lite_held = up is not None and "://" not in settings.milvus_uri
    try:
        if lite_held:
            raise ConfigError(
                "the Milvus Lite file is held by the running `dmem up` worker "
                "(a single-process file store)"
            )
        data.utilities = milvus_utilities(settings)
        data.utility_source = f"Milvus ({settings.milvus.collection})"
    except Exception as exc:  # noqa: BLE001 - fall back to the credit topic
        why = str(exc) if lite_held else f"Milvus scan failed ({type(exc).__name__}: {exc})"
        data.notes.append(f"utility replayed from the credit topic: {why}")
        credit = asyncio.run(read_topic(settings, "credit", max_events, timeout_s))
        data.utilities = credit_utilities(credit, settings.jobs.credit_discount)
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
    """Each tenant's (theta_low, theta_high) of its newest gate decision."""
    out: dict[str, tuple[float, float]] = {}
    for e in events:
        if e.get("theta_low") is not None and e.get("theta_high") is not None:
            out[e.get("tenant", "?")] = (float(e["theta_low"]), float(e["theta_high"]))
    return out


def gate_scores(events: Sequence[dict[str, Any]]) -> dict[str, list[tuple[float, str]]]:
    """(gate score, route) of every gate decision, per tenant."""
    out: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for e in events:
        if e.get("rpe_smoothed") is not None and e.get("kind") in DECISION_KINDS:
            out[e.get("tenant", "?")].append((float(e["rpe_smoothed"]), e.get("route") or "drop"))
    return dict(out)


MAX_TENANT_PLOTS = 4


def gate_overview(events: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per tenant: decisions, how many gate scores are > 0, thresholds, histogram axis end."""
    from streams.respond.live import histogram_top

    th = latest_thresholds(events)
    out = {}
    for tenant, scores in gate_scores(events).items():
        lo, hi = th.get(tenant, (None, None))
        out[tenant] = {
            "decisions": len(scores), "nonzero": sum(1 for v, _ in scores if v > 0),
            "theta_low": lo, "theta_high": hi,
            "axis_top": histogram_top(sorted(v for v, _ in scores), hi),
        }  # fmt: skip
    return out


def plot_rpe(events: Sequence[dict[str, Any]]) -> str:
    """Histogram of the gate score per tenant (the busiest few) with its thresholds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from streams.respond.live import histogram_top

    per = gate_scores(events)
    tenants = sorted(per, key=lambda t: -len(per[t]))[:MAX_TENANT_PLOTS]
    if not tenants:
        fig, ax = _fig("Gate score by route, with the thresholds")
        _empty(ax, "no gate decisions on the memories topic yet")
        return _png(fig)
    th = latest_thresholds(events)
    fig, axes = plt.subplots(len(tenants), 1, figsize=(8, 2.9 * len(tenants)), squeeze=False)
    for ax, tenant in zip(axes[:, 0], tenants, strict=True):
        scores = per[tenant]
        lo, hi_t = th.get(tenant, (None, None))
        top = histogram_top(sorted(v for v, _ in scores), hi_t)
        bins = np.linspace(0.0, top, 41)
        stacks = [np.clip([v for v, r in scores if r == route], 0, top) for route in
                  ("drop", "buffer", "core")]  # fmt: skip
        ax.hist(stacks, bins=bins, stacked=True, label=["drop", "buffer", "core"], log=True,
                color=[ROUTE_COLORS[r] for r in ("drop", "buffer", "core")])  # fmt: skip
        if lo is not None and hi_t is not None:
            ax.axvline(lo, color="#1f77b4", ls="--", lw=1.4, label=f"theta_low {lo:.3f}")
            ax.axvline(hi_t, color="#9467bd", ls="-", lw=1.4, label=f"theta_high {hi_t:.3f}")
        beyond = sum(1 for v, _ in scores if v > top)
        ax.set_title(f"{tenant}: {len(scores):,} decisions"
                     + (f" ({beyond:,} above {top:.2f}, in the last bin)" if beyond else ""),
                     fontsize=10)  # fmt: skip
        ax.set_xlim(0, top)
        ax.set_ylabel("transitions (log)")
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("gate score = max(extrinsic, w * intrinsic), the quantity the "
                           "thresholds compare")  # fmt: skip
    fig.suptitle("Gate score by route, with each tenant's current thresholds")
    fig.tight_layout()
    return _png(fig)


def _time_bins(ts: Sequence[int], n: int = 40) -> Any:
    import numpy as np

    lo, hi = min(ts), max(ts)
    return np.linspace(lo, hi if hi > lo else lo + 1000, n + 1)


def _as_dates(ms: Any) -> list[dt.datetime]:
    """Epoch milliseconds as naive local datetimes (matplotlib's date axis)."""
    return [dt.datetime.fromtimestamp(float(m) / 1000.0) for m in ms]


def time_label(d: dt.datetime, span_ms: float) -> str:
    """HH:MM:SS; tenths when the whole axis spans under 10 s."""
    return d.strftime("%H:%M:%S") + (f".{d.microsecond // 100_000}" if span_ms < 10_000 else "")


def _time_axis(ax: Any, ts_ms: Sequence[float]) -> None:
    """Readable local-time ticks (not matplotlib's ``08:55.500000``)."""
    import matplotlib.dates as mdates
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    span = (max(ts_ms) - min(ts_ms)) if ts_ms else 0.0

    def fmt(x: float, _pos: int | None = None) -> str:
        # the plotted datetimes are naive local times, which matplotlib keeps as if
        # UTC: the wall-clock fields of num2date are the local time
        return time_label(mdates.num2date(x), span)

    ax.xaxis.set_major_locator(MaxNLocator(nbins=7))
    ax.xaxis.set_major_formatter(FuncFormatter(fmt))
    ax.set_xlabel(f"local time ({time.strftime('%Z')}), HH:MM:SS")


def plot_routes(events: Sequence[dict[str, Any]]) -> str:
    import numpy as np

    fig, ax = _fig("Routing decisions over time")
    dec = [
        (e["ts"], e.get("route") or "drop")
        for e in events
        if e.get("kind") in DECISION_KINDS and e.get("ts") is not None
    ]
    if not dec:
        _empty(ax, "no gate decisions yet")
        return _png(fig)
    edges = _time_bins([t for t, _ in dec])
    bottom = np.zeros(len(edges) - 1)
    width = (edges[1] - edges[0]) * 0.9
    mids = (edges[:-1] + edges[1:]) / 2
    for route in ("drop", "buffer", "core"):
        h, _ = np.histogram([t for t, r in dec if r == route], bins=edges)
        ax.bar(_as_dates(mids), h, width=dt.timedelta(milliseconds=max(float(width), 1.0)),
               bottom=bottom, color=ROUTE_COLORS[route], label=route)  # fmt: skip
        bottom += h
    ax.set_ylabel("transitions per bin")
    ax.legend(fontsize=8)
    _time_axis(ax, [float(edges[0]), float(edges[-1])])
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
        # merged: the memory named was folded into another, which stays where it is
        if kind in ("written", "moved", "promoted", "demoted") and part in series:
            if old != part:
                if old:
                    size[old] -= 1
                size[part] += 1
                where[mid] = part
        elif kind in ("evicted", "forgotten", "merged") and old:
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
    _time_axis(ax, [float(ts[0]), float(ts[-1])])
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
    return {
        k: float(v)
        for k, v in data.items()
        if k.endswith("_tps") and isinstance(v, int | float) and v is not None
    }


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


def _scalars(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Every scalar of a bench result, nested objects flattened to ``a.b``."""
    out: list[tuple[str, Any]] = []
    for k, v in data.items():
        if isinstance(v, str | int | float | bool):
            out.append((prefix + k, v))
        elif isinstance(v, dict):
            out += _scalars(v, f"{prefix}{k}.")
    return out


def _table_or(header: Sequence[str], rows: Sequence[Sequence[Any]], why_empty: str) -> str:
    """A table, or one line saying why there is nothing to tabulate (never an empty table)."""
    if not rows:
        return f"<p class=note>no data because {html.escape(why_empty)}</p>"
    return _table(header, rows)


def render(data: ReportData, settings: Settings, title: str = "dmem report") -> str:
    ev = data.events
    decisions = [e for e in ev if e.get("kind") in DECISION_KINDS]
    routes = Counter(e.get("route") or "drop" for e in decisions)
    reasons = Counter(f"{e.get('route')}: {e.get('reason')}" for e in decisions)
    th = latest_thresholds(ev)
    parts = []
    parts.append(f"<h1>{html.escape(title)}</h1>")
    parts.append(
        f"<p class=meta>generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} from "
        f"{html.escape(data.source)}: broker "
        f"<code>{html.escape(settings.kafka.bootstrap)}</code>, topic "
        f"<code>{html.escape(settings.topic('memories'))}</code> ({len(ev):,} events) and "
        f"utility source {html.escape(data.utility_source)}.</p>"
    )
    if data.up and data.up.get("ui"):
        ui = html.escape(str(data.up["ui"]))
        parts.append(f'<p class=meta>live page of this stack: <a href="{ui}">{ui}</a></p>')
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
    parts.append(_img(plot_rpe(ev), "gate score distribution with thresholds"))
    parts.append(_img(plot_routes(ev), "routing decisions over time"))
    parts.append(
        _table_or(
            ["route: reason", "count"],
            sorted(reasons.items()),
            "no gate decision is on the memories topic yet",
        )
    )
    parts.append("<h2>Store</h2>")
    parts.append(_img(plot_partitions(ev), "partition sizes over time"))
    parts.append(_img(plot_utility(data.utilities, data.utility_source), "utility distribution"))
    parts.append("<h2>Latest benchmarks</h2>")
    if not data.benches:
        parts.append(
            "<p class=note>no benchmark results found (run <code>dmem bench write "
            "--json</code>; results land in <code>.dmem-bench/</code>).</p>"
        )
    for name, b in data.benches:
        parts.append(f"<h3>{html.escape(name)}</h3>")
        img = plot_bench(name, b)
        if img:
            parts.append(_img(img, f"benchmark {name}"))
        kinds = ", ".join(sorted({type(v).__name__ for v in b.values()})) or "nothing"
        parts.append(
            _table_or(
                ["measure", "value"],
                _scalars(b),
                f"this result holds no numbers or strings (only {kinds})",
            )
        )
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
    up: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Collect, render and write the report; returns a small summary."""
    data = collect(
        settings,
        max_events=max_events,
        bench_json=bench_json,
        bench_dir=bench_dir,
        timeout_s=timeout_s,
        up=up,
    )
    page = render(data, settings)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    by_route: defaultdict[str, int] = defaultdict(int)
    for e in data.events:
        if e.get("kind") in DECISION_KINDS:
            by_route[e.get("route") or "drop"] += 1
    return {
        "out": str(out),
        "events": len(data.events),
        "routes": dict(by_route),
        "utilities": len(data.utilities),
        "utility_source": data.utility_source,
        "source": data.source,
        "benches": [n for n, _ in data.benches],
        "gate": gate_overview(data.events),
        "images": page.count("<img "),
        "bytes": len(page.encode()),
    }
