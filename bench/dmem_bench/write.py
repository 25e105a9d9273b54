"""`dmem bench write`: write-path throughput and latency against raw baselines, in one run.

What runs: the embedded Tansu broker (`LocalStack`), a Milvus 2.3.5 standalone
server (`EmbeddedMilvusServer`, never Milvus Lite: Lite is not a performance
reference) and 1 or 2 `dmem worker --role write` processes in one consumer
group. Everything shares this machine's cores, including this driver process;
on a 2-core machine two workers measure contention, not scale-out.

Workload (`workload`): Q-learning agents in Gymnasium's Taxi (8 agents, keys
spread over the topic's partitions). Rewards follow the environment (-1 per
step, -10 illegal pickup/dropoff, +20 delivery), so the gate drops most
transitions, as it would in production. Observation texts carry the step
("... ; step 17"), as an LLM agent's observations carry fresh context: they
are mostly unique, so the encoder does real work (the next observation of
step t is the observation of step t+1, which the worker's LRU cache serves).
Each repeat re-keys the episodes and tags the texts (``[r1] ...``), so every
repeat writes new memory ids and the worker's LRU cache holds none of its texts
(otherwise repeats 2+ of an encoder-bound run measure the cache, not the encoder).

Per repeat (interleaved, so drifting machine load hits every number alike):
- ``raw_kafka_tps``: one aiokafka producer (fire-and-forget sends, linger 5 ms)
  publishes the same payloads to a fresh topic with the same partition count
  while one aiokafka consumer reads them; transitions / (last consumed - first
  sent).
- ``raw_encoder_tps``: the worker's encoder configuration (same encoder, same
  LRU cache size, fresh cache) on the same texts (observation + next
  observation of each transition) in the worker's batch size; transitions/s.
- ``raw_milvus_insert_tps``: pymilvus ``insert`` of rows with the memory schema
  and the encoder's dim into a fresh collection, in batches of the worker's
  batch size (at most 20,000 rows: a rate, not a capacity test); rows/s.
- ``pipeline_tps``: publish all transitions as fast as one producer can, then
  wait until every transition has an outcome on the ``memories`` or
  ``deadletter`` topic *and* the worker group's committed offsets cover every
  published record; transitions / (that moment - first send).

``ratio_vs_bottleneck`` = median pipeline_tps / min(median raws). Latency is
measured afterwards with paced publishing at ``latency_rate_frac`` (50 %) of
the median pipeline rate: publish time (wall clock, at send) to the moment the
driver reads the transition's MemoryEvent; p50/p99 over all paced transitions.

Results: one JSON object on the last stdout line (see ``run``), also written
to ``.dmem-bench/write-<encoder>-w<workers>.json`` for `dmem report`.

Scaling (``--workers 1,2,3``, `run_scaling`): the whole measurement above once
per worker count, in one run against one Milvus server (a fresh broker, topics
and collection each time, so no count inherits another's lag or rows). Per
count: ``pipeline_tps``, ``speedup`` = pipeline_tps / pipeline_tps(1 worker),
``efficiency`` = speedup / workers (1.0 = linear), and the drift-robust
``speedup_vs_bottleneck`` = ratio_vs_bottleneck / ratio_vs_bottleneck(1 worker)
(each count's pipeline rate against the raw baselines measured in its own
repeats) with ``efficiency_vs_bottleneck`` = that / workers. Honest for the
machine: the workers, the broker, Milvus and this driver share its cores, so on
2 cores extra workers add no CPU capacity (they can only overlap Milvus round
trips); more workers pay off where each has cores of its own (docs/operations/scaling.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from dmem_bench.common import (
    Progress,
    cleanup_on_signals,
    emit_json,
    machine_info,
    note,
    percentile,
    print_table,
    teardown,
)
from operators.encoders import encoder_dim
from schemas.models import stable_transition_id
from streams.local.stack import LocalStack
from streams.settings import Settings

N_AGENTS = 8
RAW_MILVUS_MAX_ROWS = 20_000
RESULTS_DIR = Path(".dmem-bench")


# --------------------------------------------------------------------------- workload


def make_workload(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` Taxi Q-learning transitions as JSON-ready dicts, agents interleaved."""
    from dmem_bench.demo import q_learning_transitions

    per_agent = math.ceil(n / N_AGENTS)
    streams_ = []
    for a in range(N_AGENTS):
        rows = []
        for tr, _crit, _pair in q_learning_transitions(
            "taxi", per_agent, seed + a, tenant="bench", agent_id=f"agent-{a}"
        ):
            d = tr.model_dump(mode="json", exclude_none=True)
            d["observation"] = f"{d['observation']}; step {tr.step}"
            d["next_observation"] = f"{d['next_observation']}; step {tr.step + 1}"
            d.pop("transition_id", None)
            rows.append(d)
        streams_.append(rows)
    out: list[dict[str, Any]] = []
    for i in range(per_agent):
        for rows in streams_:
            if i < len(rows):
                out.append(rows[i])
    return out[:n]


def rekey(rows: Sequence[dict[str, Any]], tag: str) -> tuple[list[bytes], list[bytes], list[str]]:
    """(keys, payloads, memory ids) of `retag(rows, tag)`."""
    keys, payloads, ids = [], [], []
    for e in retag(rows, tag):
        mid = stable_transition_id(e["tenant"], e["agent_id"], e["episode_id"], e["step"])
        e["transition_id"] = mid
        keys.append(e["agent_id"].encode())
        payloads.append(orjson.dumps(e))
        ids.append(mid)
    return keys, payloads, ids


def retag(rows: Sequence[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """`rows` with episodes and texts renamed by `tag`: new memory ids, and texts
    that no earlier repeat put into the worker's LRU cache."""
    out = []
    for d in rows:
        e = dict(d)
        e["episode_id"] = f"{tag}-{d['episode_id']}"
        e["observation"] = f"[{tag}] {d['observation']}"
        e["next_observation"] = f"[{tag}] {d['next_observation']}"
        out.append(e)
    return out


# --------------------------------------------------------------------------- raw baselines


async def raw_kafka(settings: Settings, keys: list[bytes], payloads: list[bytes]) -> float:
    """Transitions/s of one aiokafka producer + one consumer on a fresh topic."""
    from streams.admin import kafka_client_kwargs

    kw = kafka_client_kwargs(settings.kafka)
    topic = f"{settings.kafka.topic_prefix}bench.raw.{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(**kw)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(topic, num_partitions=settings.kafka.partitions, replication_factor=1)]
        )
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(
        enable_auto_commit=False, fetch_max_wait_ms=20, max_partition_fetch_bytes=4 << 20, **kw
    )
    producer = AIOKafkaProducer(linger_ms=5, max_batch_size=256 * 1024, **kw)
    await consumer.start()
    await producer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        n = len(payloads)
        got = 0

        async def consume() -> float:
            nonlocal got
            while got < n:
                batch = await consumer.getmany(timeout_ms=200, max_records=10_000)
                for msgs in batch.values():
                    got += len(msgs)
            return time.perf_counter()

        task = asyncio.create_task(consume())
        t0 = time.perf_counter()
        for k, v in zip(keys, payloads, strict=True):
            await producer.send(topic, v, key=k)
        await producer.flush()
        t1 = await asyncio.wait_for(task, timeout=300)
        return n / (t1 - t0)
    finally:
        await producer.stop()
        await consumer.stop()


def raw_encoder(settings: Settings, rows: Sequence[dict[str, Any]], batch: int) -> float:
    """Transitions/s of the worker's encoder config on the same texts and batches."""
    import torch

    from streams.app import make_encoder

    # the worker's torch thread count (streams.app: DMEM_TORCH_THREADS, default 1)
    torch.set_num_threads(max(1, int(os.environ.get("DMEM_TORCH_THREADS", "1"))))
    enc = make_encoder(settings)
    enc.encode(["warm up the model"])  # load weights outside the timing
    if hasattr(enc, "clear"):
        enc.clear()
    t0 = time.perf_counter()
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        enc.encode([r["observation"] for r in chunk] + [r["next_observation"] for r in chunk])
    return len(rows) / (time.perf_counter() - t0)


def raw_milvus(uri: str, dim: int, rows: Sequence[dict[str, Any]], batch: int) -> float:
    """Rows/s of batched pymilvus inserts of memory-shaped rows (fresh collection)."""
    from milvus import MemoryStore

    n = min(len(rows), RAW_MILVUS_MAX_ROWS)
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    recs = []
    for i in range(n):
        r = rows[i]
        recs.append({
            "id": uuid.uuid4().hex, "tenant": r["tenant"], "agent_id": r["agent_id"],
            "episode_id": r["episode_id"], "step": r["step"], "vector": vecs[i].tolist(),
            "text": r["observation"], "action": r["action"], "reward": float(r["reward"]),
            "rpe": 0.0, "rpe_smoothed": 0.0, "gate": 0.5, "valence": 0, "utility": 0.0,
            "uses": 0, "merged_count": 1, "created_ts": r["ts"], "last_access_ts": r["ts"],
            "metadata": {"user": r.get("metadata", {})},
        })  # fmt: skip
    name = f"bench_raw_{uuid.uuid4().hex[:8]}"
    store = MemoryStore(uri, collection=name, dim=dim).connect()
    try:
        recs = [store._row(r) for r in recs]
        t0 = time.perf_counter()
        for i in range(0, n, batch):
            store.client.insert(name, recs[i : i + batch], partition_name="core", timeout=60)
        return n / (time.perf_counter() - t0)
    finally:
        store.drop()
        store.close()


# --------------------------------------------------------------------------- pipeline


class Observer:
    """Reads `memories` + `deadletter` from their current end; counts outcomes."""

    def __init__(self, settings: Settings) -> None:
        from streams.admin import kafka_client_kwargs

        self.settings = settings
        self.kw = kafka_client_kwargs(settings.kafka)
        self.topics = [settings.topic("memories"), settings.topic("deadletter")]
        self.consumer = AIOKafkaConsumer(
            enable_auto_commit=False,
            fetch_max_wait_ms=10,
            max_partition_fetch_bytes=4 << 20,
            **self.kw,
        )
        # committed offsets of the workers' group, read without joining it
        self.group = AIOKafkaConsumer(
            group_id=settings.group("write"), enable_auto_commit=False, **self.kw
        )
        self.seen: dict[str, float] = {}  # memory id -> wall time read
        self.want: set[str] = set()
        self.hits = 0  # distinct wanted ids seen
        self.dead = 0
        self.routes: dict[str, int] = {}

    async def start(self) -> None:
        await self.consumer.start()
        await self.group.start()
        tps = []
        for t in self.topics:
            parts = self.consumer.partitions_for_topic(t)
            if not parts:
                await self.consumer._client.force_metadata_update()
                parts = self.consumer.partitions_for_topic(t) or set()
            tps += [TopicPartition(t, p) for p in sorted(parts)]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:  # resolve the lazy seek now, not at the first getmany
            await self.consumer.position(tp)

    async def stop(self) -> None:
        await self.consumer.stop()
        await self.group.stop()

    async def poll(self, timeout_ms: int = 50) -> int:
        batch = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=20_000)
        now = time.time()
        n = 0
        dl = self.topics[1]
        for tp, msgs in batch.items():
            for m in msgs:
                n += 1
                if tp.topic == dl:
                    self.dead += 1
                    continue
                ev = orjson.loads(m.value)
                mid = ev["memory_id"]
                if mid not in self.seen:
                    self.seen[mid] = now
                    self.hits += mid in self.want
                r = ev.get("route") or "?"
                self.routes[r] = self.routes.get(r, 0) + 1
        return n

    async def committed_all(self, topic: str, ends: dict[int, int]) -> bool:
        for p, end in ends.items():
            off = await self.group.committed(TopicPartition(topic, p))
            if off is None or off < end:
                return False
        return True


async def publish(
    producer: AIOKafkaProducer,
    topic: str,
    keys: Sequence[bytes],
    payloads: Sequence[bytes],
    sent_at: list[float] | None = None,
) -> dict[int, int]:
    """Fire-and-forget sends; returns partition -> end offset (next offset) after flush."""
    futs = []
    for i, (k, v) in enumerate(zip(keys, payloads, strict=True)):
        if sent_at is not None:
            sent_at[i] = time.time()
        futs.append(await producer.send(topic, v, key=k))
    await producer.flush()
    ends: dict[int, int] = {}
    for f in futs:
        md = await f
        ends[md.partition] = max(ends.get(md.partition, 0), md.offset + 1)
    return ends


async def pipeline_once(
    settings: Settings,
    producer: AIOKafkaProducer,
    keys: list[bytes],
    payloads: list[bytes],
    ids: list[str],
    alive: Any,
    label: str,
    timeout_s: float = 600.0,
) -> float:
    """Publish everything at once; transitions/s until all outcomes seen and committed."""
    obs = Observer(settings)
    await obs.start()
    topic = settings.topic("transitions")
    obs.want = want = set(ids)
    prog = Progress(label, len(ids))
    try:
        t0 = time.perf_counter()
        pub = asyncio.create_task(publish(producer, topic, keys, payloads))
        deadline = time.monotonic() + timeout_s
        while True:
            await obs.poll()
            done = obs.hits
            prog.update(min(done + obs.dead, len(ids)))
            if done + obs.dead >= len(want):
                break
            if time.monotonic() > deadline or not alive():
                raise RuntimeError(f"write workers stopped at {done + obs.dead}/{len(want)}")
        ends = await pub
        while not await obs.committed_all(topic, ends):
            if time.monotonic() > deadline:
                raise RuntimeError("offsets not committed")
            await asyncio.sleep(0.02)
        return len(ids) / (time.perf_counter() - t0)
    finally:
        await obs.stop()


async def latency_run(
    settings: Settings,
    producer: AIOKafkaProducer,
    keys: list[bytes],
    payloads: list[bytes],
    ids: list[str],
    rate: float,
    alive: Any,
) -> list[float]:
    """Paced publishing at `rate`/s; publish -> MemoryEvent read, in seconds."""
    obs = Observer(settings)
    await obs.start()
    obs.want = set(ids)
    topic = settings.topic("transitions")
    n = len(ids)
    sent_at = [0.0] * n
    try:
        t0 = time.perf_counter()
        i = 0
        while i < n:
            due = min(n, int((time.perf_counter() - t0) * rate) + 1)
            while i < due:
                sent_at[i] = time.time()
                await producer.send(topic, payloads[i], key=keys[i])
                i += 1
            await obs.poll(timeout_ms=5)
        deadline = time.monotonic() + 120
        while obs.hits + obs.dead < n:
            if time.monotonic() > deadline or not alive():
                break
            await obs.poll()
        return [obs.seen[x] - sent_at[j] for j, x in enumerate(ids) if x in obs.seen]
    finally:
        await obs.stop()


# --------------------------------------------------------------------------- driver


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of processes (Linux /proc; 0 where unreadable)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def dim_of(encoder: str, settings: Settings) -> int:
    return encoder_dim(encoder, settings.encoder.dim)


def run(
    transitions: int = 50_000,
    encoder: str = "hash",
    workers: int = 1,
    repeats: int = 3,
    batch_size: int = 1024,
    batch_within_s: float = 0.1,
    latency_rate_frac: float = 0.5,
    latency_transitions: int | None = None,
    milvus_uri: str | None = None,
    results_dir: Path | None = RESULTS_DIR,
    torch_threads: int | None = None,
    warmup: int = 4096,
    backend: str = "embedded",
) -> dict[str, Any]:
    """Run the benchmark; returns the result dict (also emitted by the CLI).

    ``backend="containers"`` runs it on Apache Kafka and Milvus standalone containers
    (`dmem_bench.backends`) instead of the embedded broker and server.
    """
    from dmem_bench.backends import bench_services
    from milvus.server import EmbeddedMilvusServer

    tmp = Path(tempfile.mkdtemp(prefix="dmem-bench-write-"))
    server = None
    stack: LocalStack | None = None
    failed = True
    services = contextlib.ExitStack()
    try:
        bootstrap, container_milvus = services.enter_context(bench_services(backend))
        milvus_uri = milvus_uri or container_milvus
        with cleanup_on_signals():
            note(
                f"bench write: {transitions} transitions, encoder {encoder}, workers {workers}, "
                f"repeats {repeats}, batch {batch_size}"
            )
            t = time.perf_counter()
            base = make_workload(transitions + max(warmup, 1))
            warm_rows, rows = base[transitions:], base[:transitions]
            note(f"  workload: {len(base)} taxi transitions in {time.perf_counter() - t:.1f}s")
            if milvus_uri is None:
                server = EmbeddedMilvusServer(tmp / "milvus", stop_grace_s=3)
                milvus_uri = server.start(timeout_s=120)
                note(f"  milvus server {milvus_uri} (started in {server.start_s:.1f}s)")
            run_id = uuid.uuid4().hex[:6]
            env = {
                "DMEM_MILVUS__URI": milvus_uri,
                "DMEM_MILVUS__COLLECTION": f"bench_{run_id}",
                "DMEM_ENCODER__NAME": encoder,
                "DMEM_WRITE__BATCH_SIZE": str(batch_size),
                "DMEM_WRITE__BATCH_WITHIN_S": str(batch_within_s),
                "DMEM_KAFKA__COMMIT_INTERVAL_S": "0.2",
                "DMEM_APP_ID": f"dmem-bench-{run_id}",
                "DMEM_KAFKA__TOPIC_PREFIX": f"bench{run_id}.",
                "DMEM_LOG_LEVEL": "info",
            }
            if torch_threads:
                os.environ["DMEM_TORCH_THREADS"] = env["DMEM_TORCH_THREADS"] = str(torch_threads)
            stack = LocalStack(
                tmp / "stack", roles=("write",) * workers, extra_env=env, broker_bootstrap=bootstrap
            )
            stack.start()
            settings = stack.settings
            note(f"  broker {stack.bootstrap}; {workers} write worker(s) up")
            alive = lambda: all(w.alive for w in stack.workers)  # noqa: E731
            pids = [w.proc.pid for w in stack.workers if w.proc is not None]
            out = asyncio.run(
                _measure(
                    settings,
                    rows,
                    warm_rows,
                    encoder,
                    repeats,
                    batch_size,
                    latency_rate_frac,
                    latency_transitions,
                    milvus_uri,
                    alive,
                    lambda: cpu_seconds(pids),
                )
            )
            logs = [str(w.log_path) for w in stack.workers]
            out.update(
                workers=workers,
                batch_size=batch_size,
                batch_within_s=batch_within_s,
                machine=machine_info(),
                backend=backend,
            )
            out["worker_batch_stats"] = worker_batch_stats(logs)
            failed = False
    finally:
        teardown(stack, server, tmp, failed)
        services.close()
    report(out)
    if results_dir is not None:
        results_dir.mkdir(parents=True, exist_ok=True)
        (results_dir / f"write-{encoder}-w{workers}.json").write_bytes(
            orjson.dumps(out, option=orjson.OPT_INDENT_2)
        )
    return out


async def _measure(
    settings: Settings,
    rows: list[dict[str, Any]],
    warm_rows: list[dict[str, Any]],
    encoder: str,
    repeats: int,
    batch_size: int,
    latency_rate_frac: float,
    latency_transitions: int | None,
    milvus_uri: str,
    alive: Any,
    worker_cpu: Any = None,
) -> dict[str, Any]:
    from streams.admin import kafka_client_kwargs

    kw = kafka_client_kwargs(settings.kafka)
    producer = AIOKafkaProducer(linger_ms=5, max_batch_size=256 * 1024, **kw)
    await producer.start()
    try:
        k, v, ids = rekey(warm_rows, "warm")
        note(f"  warm-up: {len(ids)} transitions")
        await pipeline_once(settings, producer, k, v, ids, alive, "warm-up")
        per: dict[str, list[float]] = {"pipeline": [], "kafka": [], "encoder": [], "milvus": []}
        cpu_us: list[float] = []  # worker CPU per transition: robust to a shared machine
        for r in range(repeats):
            k, v, ids = rekey(rows, f"r{r}")
            per["kafka"].append(await raw_kafka(settings, k, v))
            per["encoder"].append(
                await asyncio.to_thread(raw_encoder, settings, retag(rows, f"e{r}"), batch_size)
            )
            per["milvus"].append(
                await asyncio.to_thread(
                    raw_milvus, milvus_uri, dim_of(encoder, settings), rows, batch_size
                )
            )
            c0 = worker_cpu() if worker_cpu else 0.0
            per["pipeline"].append(
                await pipeline_once(settings, producer, k, v, ids, alive, f"pipeline {r + 1}")
            )
            if worker_cpu:
                cpu_us.append((worker_cpu() - c0) / len(ids) * 1e6)
            note(
                f"  repeat {r + 1}/{repeats}: pipeline {per['pipeline'][-1]:,.0f}/s, "
                f"kafka {per['kafka'][-1]:,.0f}/s, encoder {per['encoder'][-1]:,.0f}/s, "
                f"milvus {per['milvus'][-1]:,.0f} rows/s"
            )
        med = {name: statistics.median(xs) for name, xs in per.items()}
        rate = latency_rate_frac * med["pipeline"]
        n_lat = latency_transitions or int(min(len(rows), max(2000, rate * 15)))
        k, v, ids = rekey(rows[:n_lat], "lat")
        note(f"  latency: {n_lat} transitions paced at {rate:,.0f}/s")
        lat = await latency_run(settings, producer, k, v, ids, rate, alive)
    finally:
        await producer.stop()
    raws = {"kafka": med["kafka"], "encoder": med["encoder"], "milvus": med["milvus"]}
    bottleneck = min(raws, key=lambda x: raws[x])
    lat_ms = [x * 1e3 for x in lat]
    return {
        "bench": "write",
        "transitions": len(rows),
        "encoder": encoder,
        "pipeline_tps": round(med["pipeline"], 1),
        "raw_kafka_tps": round(med["kafka"], 1),
        "raw_encoder_tps": round(med["encoder"], 1),
        "raw_milvus_insert_tps": round(med["milvus"], 1),
        "bottleneck": bottleneck,
        "ratio_vs_bottleneck": round(med["pipeline"] / raws[bottleneck], 3),
        "latency_p50_ms": round(percentile(lat_ms, 50), 1),
        "latency_p99_ms": round(percentile(lat_ms, 99), 1),
        "latency_rate_tps": round(rate, 1),
        "latency_n": len(lat_ms),
        "latency_missing": n_lat - len(lat_ms),
        "repeats": repeats,
        "per_repeat": {name: [round(x, 1) for x in xs] for name, xs in per.items()},
        # CPU seconds the write worker processes spent per transition during the
        # pipeline runs (user + sys, all threads): what the code costs, which the
        # wall-clock rates above hide on a loaded machine
        "worker_cpu_us_per_transition": round(statistics.median(cpu_us), 1) if cpu_us else None,
        "worker_cpu_us_per_repeat": [round(x, 1) for x in cpu_us],
    }


def worker_batch_stats(log_paths: Sequence[str]) -> dict[str, Any]:
    """Median per-batch stage times from the workers' 'batch n=...' info lines."""
    import re

    pat = re.compile(
        r"batch n=(\d+) stored=(\d+) dead=(\d+) process=([\d.]+)ms store=([\d.]+)ms "
        r"produce=([\d.]+)ms"
    )
    rows = []
    for p in log_paths:
        try:
            text = Path(p).read_text(errors="replace")
        except OSError:
            continue
        rows += [tuple(float(x) for x in m.groups()) for m in pat.finditer(text)]
    if not rows:
        return {}
    arr = np.array(rows)
    return {
        "batches": len(rows),
        "median_n": float(np.median(arr[:, 0])),
        "mean_n": round(float(arr[:, 0].mean()), 1),
        "median_process_ms": round(float(np.median(arr[:, 3])), 1),
        "median_store_ms": round(float(np.median(arr[:, 4])), 1),
        "median_produce_ms": round(float(np.median(arr[:, 5])), 1),
        "stored_frac": round(float(arr[:, 1].sum() / max(arr[:, 0].sum(), 1)), 4),
    }


def report(out: dict[str, Any]) -> None:
    rows = [
        ("pipeline (published -> outcome + commit)", out["pipeline_tps"]),
        ("raw kafka produce+consume", out["raw_kafka_tps"]),
        ("raw encoder", out["raw_encoder_tps"]),
        ("raw milvus insert (rows/s)", out["raw_milvus_insert_tps"]),
        ("ratio vs bottleneck (" + out["bottleneck"] + ")", out["ratio_vs_bottleneck"]),
        (f"latency p50 ms @ {out['latency_rate_tps']:,.0f}/s", out["latency_p50_ms"]),
        (f"latency p99 ms @ {out['latency_rate_tps']:,.0f}/s", out["latency_p99_ms"]),
    ]
    if out.get("worker_cpu_us_per_transition"):
        rows.append(("worker CPU us / transition", out["worker_cpu_us_per_transition"]))
    print_table(
        f"dmem bench write: {out['encoder']}, {out['workers']} worker(s), "
        f"{out['transitions']} transitions, batch {out['batch_size']}",
        ["measure", "median"],
        [(a, float(b)) for a, b in rows],
    )


def run_scaling(workers: Sequence[int], milvus_uri: str | None = None, **kw: Any) -> dict[str, Any]:
    """`run` once per worker count against one Milvus server; efficiency vs the first count."""
    from milvus.server import EmbeddedMilvusServer

    counts = list(dict.fromkeys(workers))
    if len(counts) == 1:
        return run(workers=counts[0], milvus_uri=milvus_uri, **kw)
    tmp = Path(tempfile.mkdtemp(prefix="dmem-bench-write-scaling-"))
    server = None
    per: dict[int, dict[str, Any]] = {}
    failed = True
    try:
        with cleanup_on_signals():
            if milvus_uri is None and kw.get("backend", "embedded") == "embedded":
                server = EmbeddedMilvusServer(tmp / "milvus", stop_grace_s=3)
                milvus_uri = server.start(timeout_s=120)
                note(f"bench write scaling: milvus server {milvus_uri}")
            for n in counts:
                per[n] = run(workers=n, milvus_uri=milvus_uri, **kw)
            failed = False
    finally:
        teardown(None, server, tmp, failed)
    return scaling_summary(per)


def scaling_summary(per: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Speedup and efficiency of every worker count against the first (see module doc)."""
    base_n = next(iter(per))
    base = per[base_n]
    out: dict[str, Any] = {
        "bench": "write_scaling",
        "workers": list(per),
        "encoder": base["encoder"],
        "transitions": base["transitions"],
        "repeats": base["repeats"],
        "baseline_workers": base_n,
        "by_workers": {},
    }
    for n, r in per.items():
        speedup = r["pipeline_tps"] / base["pipeline_tps"]
        rel = r["ratio_vs_bottleneck"] / base["ratio_vs_bottleneck"]
        out["by_workers"][str(n)] = {
            "pipeline_tps": r["pipeline_tps"],
            "ratio_vs_bottleneck": r["ratio_vs_bottleneck"],
            "bottleneck": r["bottleneck"],
            "speedup": round(speedup, 3),
            "efficiency": round(speedup * base_n / n, 3),
            "speedup_vs_bottleneck": round(rel, 3),
            "efficiency_vs_bottleneck": round(rel * base_n / n, 3),
            "worker_cpu_us_per_transition": r.get("worker_cpu_us_per_transition"),
            "latency_p50_ms": r["latency_p50_ms"],
            "latency_p99_ms": r["latency_p99_ms"],
        }
    out["machine"] = base.get("machine")
    print_table(
        "dmem bench write: scaling",
        ["workers", "tps", "speedup", "efficiency"],
        [
            (n, v["pipeline_tps"], v["speedup"], v["efficiency"])
            for n, v in out["by_workers"].items()
        ],
    )
    return out


def main(**kw: Any) -> None:
    emit_json(run(**kw))


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
