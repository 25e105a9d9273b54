"""`dmem bench retrieval`: read-path latency at scale and retrieval quality.

What runs (everything embedded, in a temp dir, removed at the end):
- a Milvus 2.3.5 standalone server (`EmbeddedMilvusServer`),
- the Tansu broker and one ``respond`` worker (`LocalStack`), configured with
  ``DMEM_MILVUS__URI`` = the server, ``DMEM_MILVUS__SEARCH_CONSISTENCY=Bounded``
  and the same encoder the benchmark embeds with (hash, dim 256, by default).

Latency block:
- ``--memories`` N rows are loaded for tenant ``bench-load`` straight into the
  store with `MemoryStore.upsert` (fast path, not through Kafka). Rows are a
  50/50 mix of Gymnasium observations (Q-learning runs in CliffWalking, Taxi,
  FrozenLake, so many texts repeat as they do for real agents) and synthetic
  free-text "agent notes"; |RPE| is Laplace distributed, rows with |RPE| >= 1.5
  go to ``core`` (about 22 %), the rest to ``buffer``; ages are spread over 60
  days. The collection is flushed (segments sealed, HNSW built) before measuring.
- Then, per repeat and in a rotating order: ``--requests`` sequential searches
  (k=5) over Kafka (`Client`, request/reply), the same over HTTP
  (``POST /v1/search``), and the responder's candidate query issued directly by
  this process (`MemoryStore.search`, k = C = max(4k, 32), both partitions,
  Bounded) = ``milvus_raw``. Queries are observation texts and agent notes
  sampled with a per-repeat seed; a few warm-up requests per transport are not
  timed. Latency is client-side wall time per request. The JSON reports the
  median across repeats of each repeat's p50/p99.

Quality block (critical-event probes):
- For each env (default: CliffWalking and Taxi, seed 7, 3000 steps each: the
  ``dmem demo`` run) the Q-learning agent's transitions go through the real
  write-path operators in-process (`WritePipeline`, micro-batches of 256 as in
  the demo), and three tenants are built: ``gated`` (what dmem stores:
  core + buffer with their RPEs), and ``all`` (every transition, the
  store-everything baseline). Timestamps of the run are re-based to end at
  the benchmark's start (the run happened "just now", as it does for a live
  agent; the demo's fixed 2023 timestamps would make every memory years old,
  and recency would zero the salience term).
- A probe is a distinct critical (state, action) pair of the run (CliffWalking:
  a step into the cliff, -100; Taxi: +20 or -10). Query = the observation text
  of that state; hit = a memory with that same text and action in the top 5.
  hybrid = gated tenant, default lambda schedule; semantic = gated tenant,
  lambda = 1; store_all = all tenant, lambda = 1. All probes go through the
  respond worker over HTTP. The headline numbers pool every probe of every env;
  ``quality_by_env`` has the per-env numbers and ``probe_stored_gated`` (the
  fraction of probes with at least one memory in the gated store: an upper
  bound of any ranking on that store).
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dmem_bench.common import (
    NOTE_OBJECTS,
    NOTE_SUBJECTS,
    NOTE_VERBS,
    Progress,
    cleanup_on_signals,
    emit_json,
    machine_info,
    median_across,
    note,
    print_table,
    summarize_ms,
)
from operators.encoders import encoder_dim
from schemas import DECISION_KINDS

LOAD_TENANT = "bench-load"
QUALITY_BATCH = 256  # write-path micro-batch, as in `dmem demo`
LOAD_ACTIONS = ("search", "open", "ask", "plan", "summarise", "click", "reply", "wait")
DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class BenchConfig:
    memories: int = 100_000
    requests: int = 300
    repeats: int = 3
    encoder: str = "hash"
    k: int = 5
    warmup: int = 20
    envs: tuple[str, ...] = ("cliffwalking", "taxi")
    steps: int = 3000
    seed: int = 7
    load_batch: int = 2000
    timeout_s: float = 10.0
    backend: str = "embedded"  # or "containers": Apache Kafka + Milvus standalone
    embedded: bool = False  # also measure `dmem up`'s default stack (dmem_bench.embedded)

    @property
    def dim(self) -> int:
        return encoder_dim(self.encoder, 256)

    @property
    def candidates(self) -> int:
        return max(4 * self.k, 32)


@dataclass
class QualityResult:
    env: str
    probes: int
    stored_gated: int
    gated_rows: int
    all_rows: int
    hits: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------
def _chunks(seq: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def _env_observations(n: int, seed: int) -> Iterator[tuple[str, str, float]]:
    """(text, action, reward) from Q-learning runs, round-robin over three envs."""
    from dmem_bench.demo import q_learning_transitions

    if n <= 0:
        return
    names = ("cliffwalking", "taxi", "frozenlake")
    gens = [
        q_learning_transitions(name, n, seed + i, tenant=LOAD_TENANT)
        for i, name in enumerate(names)
    ]
    made = 0
    while made < n:
        for g in gens:
            tr, _crit, _pair = next(g)
            yield tr.text(), tr.action, float(tr.reward)
            made += 1
            if made >= n:
                return


def _note(rng: np.random.Generator) -> str:
    s = NOTE_SUBJECTS[int(rng.integers(len(NOTE_SUBJECTS)))]
    v = NOTE_VERBS[int(rng.integers(len(NOTE_VERBS)))]
    o = NOTE_OBJECTS[int(rng.integers(len(NOTE_OBJECTS)))]
    return f"{s} {v} {o} #{int(rng.integers(100_000))}"


def load_rows(
    n: int, encoder: Any, seed: int, now_ms: int, batch: int
) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Yield (core_rows, buffer_rows) batches of realistic memories for LOAD_TENANT."""
    rng = np.random.default_rng(seed)
    env_iter = _env_observations(n - n // 2, seed + 1000)
    i = 0
    while i < n:
        m = min(batch, n - i)
        texts: list[str] = []
        actions: list[str] = []
        rewards: list[float] = []
        for j in range(m):
            if (i + j) % 2 == 0:
                t, a, r = next(env_iter)
            else:
                t = _note(rng)
                a = LOAD_ACTIONS[int(rng.integers(len(LOAD_ACTIONS)))]
                r = float(np.round(rng.normal(0.0, 1.0), 3))
            texts.append(t)
            actions.append(a)
            rewards.append(r)
        vecs = encoder.encode(texts)
        rpe = rng.laplace(0.0, 1.0, size=m)
        ages = rng.uniform(0, 60 * DAY_MS, size=m).astype(np.int64)
        core: list[dict[str, Any]] = []
        buf: list[dict[str, Any]] = []
        for j in range(m):
            idx = i + j
            z = float(rpe[j])
            created = int(now_ms - ages[j])
            row = {
                "id": f"load-{idx:08d}",
                "tenant": LOAD_TENANT,
                "agent_id": f"agent-{idx % 16}",
                "episode_id": f"ep-{idx // 200}",
                "step": idx % 200,
                "vector": vecs[j],
                "text": texts[j],
                "action": actions[j],
                "reward": rewards[j],
                "rpe": z,
                "rpe_smoothed": abs(z),
                "gate": 1.0 / (1.0 + math.exp(-(2.0 * abs(z) - 2.0))),
                "valence": int(np.sign(z)),
                "utility": 0.0,
                "uses": 0,
                "merged_count": 1,
                "created_ts": created,
                "last_access_ts": created,
                "metadata": {"user": {"source": "bench"}},
            }
            (core if abs(z) >= 1.5 else buf).append(row)
        yield core, buf
        i += m


def query_texts(n: int, seed: int) -> list[str]:
    """Latency queries: half observations (mostly present), half agent notes."""
    rng = np.random.default_rng(seed)
    obs = [t for t, _a, _r in _env_observations(max(n, 30), seed + 50_000)]
    out = []
    for i in range(n):
        out.append(obs[int(rng.integers(len(obs)))] if i % 2 == 0 else _note(rng))
    return out


@dataclass
class QualityData:
    env: str
    gated: dict[str, list[dict[str, Any]]]
    every: list[dict[str, Any]]
    probes: list[tuple[str, str]]  # (query text, critical action)
    gated_tenant: str
    all_tenant: str


def quality_data(env: str, steps: int, seed: int, encoder: Any, now_ms: int) -> QualityData:
    """Run the Gymnasium agent through the real write-path operators (in-process)."""
    from dmem_bench.demo import q_learning_transitions
    from schemas import encode
    from streams.settings import Settings
    from streams.write.pipeline import RawRecord, WritePipeline

    gated_tenant, all_tenant = f"bench-q-{env}-gated", f"bench-q-{env}-all"
    items = list(q_learning_transitions(env, steps, seed, tenant=gated_tenant))
    base = now_ms - len(items) * 100  # re-based: the run ends "now"
    trs = [tr.model_copy(update={"ts": base + i * 100}) for i, (tr, _c, _p) in enumerate(items)]
    critical: dict[tuple[int, str], str] = {}
    for tr, (_old, crit, pair) in zip(trs, items, strict=True):
        if crit:
            critical.setdefault(pair, tr.text())
    pipe = WritePipeline(Settings(), encoder)
    gated: dict[str, list[dict[str, Any]]] = {"core": [], "buffer": []}
    every: list[dict[str, Any]] = []
    offset = 0
    for chunk in _chunks(trs, QUALITY_BATCH):
        raws = [
            RawRecord(encode(t), t.agent_id.encode(), "dmem.transitions", 0, offset + j, t.ts)
            for j, t in enumerate(chunk)
        ]
        offset += len(chunk)
        res = pipe.process(raws, int(chunk[-1].ts or now_ms))
        gone = {mid for _, mid in res.retract}  # evicted by the write path's second look
        for part in ("core", "buffer"):
            gated[part].extend(res.upserts[part])  # type: ignore[index]
            if gone:
                gated[part] = [r for r in gated[part] if r["id"] not in gone]
        by_id = {t.memory_id: t for t in chunk}
        vecs = encoder.encode([t.text() for t in chunk])
        vec_of = {t.memory_id: vecs[j] for j, t in enumerate(chunk)}
        for ev in res.events:  # store_all: every transition, same row layout
            if ev.kind not in DECISION_KINDS:
                continue
            t = by_id[ev.memory_id]
            every.append({  # own ids: the gated rows keep theirs
                "id": f"all-{t.memory_id}", "tenant": all_tenant, "agent_id": t.agent_id,
                "episode_id": t.episode_id, "step": t.step, "vector": vec_of[t.memory_id],
                "text": t.text(), "action": t.action, "reward": float(t.reward),
                "rpe": float(ev.rpe or 0.0), "rpe_smoothed": float(ev.rpe_smoothed or 0.0),
                "gate": float(ev.gate or 0.0), "valence": int(ev.valence or 0),
                "created_ts": int(t.ts or now_ms), "last_access_ts": int(t.ts or now_ms),
                "metadata": {"user": dict(t.metadata)},
            })  # fmt: skip
    probes = [(text, action) for (_s, action), text in sorted(critical.items())]
    return QualityData(env, gated, every, probes, gated_tenant, all_tenant)


# ---------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------
async def _timed_requests(
    fn: Callable[[str], Any], queries: Sequence[str], label: str
) -> tuple[list[float], int]:
    """Sequential requests; returns (latencies in s, empty answers)."""
    lat: list[float] = []
    empty = 0
    prog = Progress(label, len(queries), every_frac=0.5)
    for i, q in enumerate(queries):
        t0 = time.perf_counter()
        hits = await fn(q)
        lat.append(time.perf_counter() - t0)
        empty += not hits
        prog.update(i + 1)
    return lat, empty


def _upsert_all(
    store: Any,
    batches: Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]]]],
    total: int,
    label: str,
) -> None:
    """Upsert (core, buffer) batches; the next batch is built while one is written."""
    prog = Progress(label, total)
    done = 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-load") as pool:
        pending = None
        for core, buf in batches:
            if pending is not None:
                done += pending.result()
                prog.update(done)

            def write(c: list[dict[str, Any]] = core, b: list[dict[str, Any]] = buf) -> int:
                return (store.upsert(c, "core") if c else 0) + (
                    store.upsert(b, "buffer") if b else 0
                )

            pending = pool.submit(write)
        if pending is not None:
            done += pending.result()
            prog.update(done)


def run_retrieval(cfg: BenchConfig) -> dict[str, Any]:
    """Run the whole benchmark; returns the result dict (the JSON line)."""
    from dmem.client import Client
    from dmem_bench.backends import bench_services
    from milvus import EmbeddedMilvusServer, MemoryStore
    from operators import build_encoder
    from streams.local.stack import LocalStack, tail
    from streams.respond.responder import OUTPUT

    t_start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="dmem-bench-retrieval-"))
    collection = "dmem_bench"
    info: dict[str, Any] = {"loadavg_at_start": machine_info()["loadavg_1_5_15"]}
    with cleanup_on_signals(), ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, True)
        note(
            f"dmem bench retrieval: {cfg.memories:,} memories, {cfg.requests} requests x "
            f"{cfg.repeats} repeats, encoder {cfg.encoder}; work dir {tmp}"
        )
        bootstrap, container_uri = stack.enter_context(bench_services(cfg.backend))
        info["backend"] = cfg.backend
        if container_uri:
            uri = container_uri
            note(f"containers backend: Kafka {bootstrap}, Milvus {uri}")
        else:
            note("starting Milvus 2.3.5 server ...")
            server = EmbeddedMilvusServer(tmp / "milvus", stop_grace_s=5)
            stack.callback(server.stop)
            uri = server.start(timeout_s=180)
            info["milvus_start_s"] = round(server.start_s or 0.0, 2)
            note(f"  {uri} (started in {server.start_s:.1f}s)")
        encoder = build_encoder(cfg.encoder, dim=256)
        store = MemoryStore(
            uri, collection=collection, dim=encoder.dim, timeout_s=60.0, batch_size=cfg.load_batch
        )
        stack.callback(store.close)
        store.connect()

        env = {
            "DMEM_MILVUS__URI": uri,
            "DMEM_MILVUS__COLLECTION": collection,
            "DMEM_MILVUS__SEARCH_CONSISTENCY": "Bounded",
            "DMEM_ENCODER__NAME": cfg.encoder,
            "DMEM_ENCODER__DIM": "256",
            "DMEM_APP_ID": "dmem-bench",
            "DMEM_LOG_LEVEL": "warn",
        }
        note("starting broker and respond worker ...")
        t0 = time.monotonic()
        local = LocalStack(
            tmp / "stack", roles=("respond",), extra_env=env, broker_bootstrap=bootstrap
        )
        stack.callback(local.stop)
        try:
            local.start()
        except Exception:
            for w in local.workers:
                note(tail(w.log_path))
            raise
        info["stack_start_s"] = round(time.monotonic() - t0, 2)
        settings = local.settings
        info["read_config"] = {  # what the latency depends on (docs/concepts/retrieval.md)
            "search_consistency": env["DMEM_MILVUS__SEARCH_CONSISTENCY"],
            "respond_fetch_max_wait_ms": settings.respond.fetch_max_wait_ms,
            "client_fetch_max_wait_ms": Client("-", "-").fetch_max_wait_ms,
            "respond_concurrency": settings.respond.concurrency,
        }
        http_url = f"http://127.0.0.1:{local.web_ports[0]}"
        note(f"  broker {local.bootstrap}, worker http {http_url}")

        # quality stores (small) first, then the big load
        now_ms = int(time.time() * 1000)
        qdata: list[QualityData] = []
        for env_name in cfg.envs:
            note(
                f"quality: {env_name} ({cfg.steps} steps, seed {cfg.seed}) through the "
                "write-path operators ..."
            )
            qd = quality_data(env_name, cfg.steps, cfg.seed, encoder, now_ms)
            for part in ("core", "buffer"):
                if qd.gated[part]:
                    store.upsert(qd.gated[part], part)  # type: ignore[arg-type]
            store.upsert(qd.every, "buffer")
            qdata.append(qd)
            note(
                f"  gated: core {len(qd.gated['core'])}, buffer {len(qd.gated['buffer'])}; "
                f"store_all {len(qd.every)}; probes {len(qd.probes)}"
            )

        note(f"loading {cfg.memories:,} memories into tenant {LOAD_TENANT!r} ...")
        t0 = time.monotonic()
        _upsert_all(
            store,
            load_rows(cfg.memories, encoder, cfg.seed, now_ms, cfg.load_batch),
            cfg.memories,
            "  upsert",
        )
        load_s = time.monotonic() - t0
        t0 = time.monotonic()
        store.client.flush(collection, timeout=600)
        flush_s = time.monotonic() - t0
        # measure the steady state, not the bulk load's background index builds and
        # compactions (they take a whole core for ~30-60 s at 100k rows)
        note("  waiting for compaction and the HNSW builds to finish ...")
        settle = store.wait_indexed(timeout_s=900)
        info.update(
            compact_wait_s=round(settle["compact_s"], 1), index_wait_s=round(settle["index_s"], 1)
        )
        loaded = store.count(tenant=LOAD_TENANT)
        total_rows = store.count()
        info.update(
            load_s=round(load_s, 1),
            load_rows_per_s=round(cfg.memories / load_s),
            flush_s=round(flush_s, 1),
            collection_rows=total_rows,
        )
        note(
            f"  loaded {loaded:,} in {load_s:.1f}s ({cfg.memories / load_s:,.0f}/s), "
            f"flush {flush_s:.1f}s, index wait {settle['index_s']:.1f}s; collection holds "
            f"{total_rows:,} rows"
        )
        if loaded != cfg.memories:
            raise RuntimeError(f"expected {cfg.memories} memories, store counts {loaded}")

        # ------------------------------------------------------------------
        qvec_cache: dict[str, np.ndarray] = {}

        def raw_search(q: str) -> list[dict[str, Any]]:
            vec = qvec_cache.get(q)
            if vec is None:
                vec = qvec_cache[q] = encoder.encode([q])[0]
            t0 = time.perf_counter()
            hits = store.search(
                vec,
                tenant=LOAD_TENANT,
                k=cfg.candidates,
                partitions=("core", "buffer"),
                output_fields=OUTPUT,
                consistency_level="Bounded",
            )
            raw_lat.append(time.perf_counter() - t0)
            return hits

        raw_lat: list[float] = []
        kw: dict[str, Any] = {
            "topic_prefix": settings.kafka.topic_prefix,
            "timeout_s": cfg.timeout_s,
        }

        async def measure() -> dict[str, Any]:
            kc = Client(local.bootstrap or "", LOAD_TENANT, **kw)
            hc = Client(
                local.bootstrap or "", LOAD_TENANT, transport="http", http_url=http_url, **kw
            )
            await kc.start()
            await hc.start()
            try:
                return await _measure(cfg, kc, hc, raw_search, raw_lat, qdata)
            finally:
                await kc.stop()
                await hc.stop()

        m = asyncio.run(measure())

    result = _assemble(cfg, m, qdata, info, time.monotonic() - t_start)
    return result


async def _search_took(client: Any, query: str, k: int, took: list[float]) -> list[Any]:
    """What `Client.search` does, keeping the responder's own ``took_ms``
    (encode + Milvus + rank inside the worker) to split latency into parts."""
    from dmem.client import SearchError
    from schemas import RetrievalRequest

    req = RetrievalRequest.model_validate(
        {"request_id": uuid.uuid4().hex, "tenant": client.tenant, "query": query, "k": k}
    )
    resp = await (
        client._search_http(req) if client.transport == "http" else client._search_kafka(req)
    )
    if resp.error:
        raise SearchError(resp.error)
    took.append(resp.took_ms / 1e3)
    return list(resp.hits)


async def _measure(
    cfg: BenchConfig,
    kc: Any,
    hc: Any,
    raw_search: Callable[[str], Any],
    raw_lat: list[float],
    qdata: Sequence[QualityData],
) -> dict[str, Any]:
    took: dict[str, list[float]] = {"kafka": [], "http": []}

    async def kafka(q: str) -> Any:
        return await _search_took(kc, q, cfg.k, took["kafka"])

    async def http(q: str) -> Any:
        return await _search_took(hc, q, cfg.k, took["http"])

    async def raw(q: str) -> Any:
        return raw_search(q)

    transports: dict[str, Callable[[str], Any]] = {"kafka": kafka, "http": http, "milvus_raw": raw}
    note(f"warm-up: {cfg.warmup} requests per transport")
    for fn in transports.values():
        for text in query_texts(cfg.warmup, cfg.seed + 999):
            await fn(text)
    raw_lat.clear()
    for lst in took.values():
        lst.clear()
    per: dict[str, list[dict[str, float]]] = {name: [] for name in transports}
    per_took: dict[str, list[dict[str, float]]] = {"kafka": [], "http": []}
    empty: dict[str, int] = dict.fromkeys(transports, 0)
    names = list(transports)
    loads: list[float] = []  # 1-min load average at the start of each repeat
    for rep in range(cfg.repeats):
        queries = query_texts(cfg.requests, cfg.seed + rep)
        order = names[rep % len(names) :] + names[: rep % len(names)]
        loads.append(round(os.getloadavg()[0], 2))
        note(
            f"repeat {rep + 1}/{cfg.repeats} (order: {', '.join(order)}; "
            f"load average {loads[-1]:.2f})"
        )
        for name in order:
            if name == "milvus_raw":
                raw_lat.clear()
                _lat, e = await _timed_requests(transports[name], queries, f"  {name}")
                lat = list(raw_lat)  # the store call alone, without query encoding
            else:
                took[name].clear()
                lat, e = await _timed_requests(transports[name], queries, f"  {name}")
                per_took[name].append(summarize_ms(took[name]))
            empty[name] += e
            s = summarize_ms(lat)
            per[name].append(s)
            extra = (
                f" (responder {per_took[name][-1]['p50']:.2f} ms p50)" if name in per_took else ""
            )
            note(f"    {name}: p50 {s['p50']:.2f} ms, p99 {s['p99']:.2f} ms{extra}")

    note("quality probes over HTTP ...")
    quality: list[QualityResult] = []
    for q in qdata:
        qr = QualityResult(
            q.env,
            len(q.probes),
            0,
            sum(len(v) for v in q.gated.values()),
            len(q.every),
            {"hybrid": 0, "semantic": 0, "store_all": 0},
        )
        stored = {(r["text"], r["action"]) for part in q.gated.values() for r in part}
        for text, action in q.probes:
            qr.stored_gated += (text, action) in stored
            for mode, tenant, lam in (
                ("hybrid", q.gated_tenant, None),
                ("semantic", q.gated_tenant, 1.0),
                ("store_all", q.all_tenant, 1.0),
            ):
                hc.tenant = tenant
                hits = await hc.search(text, cfg.k, lambda_=lam)
                qr.hits[mode] += any(h.text == text and h.action == action for h in hits)
        hc.tenant = LOAD_TENANT
        quality.append(qr)
    return {"per": per, "per_took": per_took, "empty": empty, "quality": quality, "loads": loads}


def _assemble(
    cfg: BenchConfig,
    m: dict[str, Any],
    quality_data_: Sequence[QualityData],
    info: dict[str, Any],
    elapsed: float,
) -> dict[str, Any]:
    per: dict[str, list[dict[str, float]]] = m["per"]
    quality: list[QualityResult] = m["quality"]

    def med(name: str, key: str) -> float:
        return round(median_across(per[name], key), 3)

    kafka_p50, raw_p50 = med("kafka", "p50"), med("milvus_raw", "p50")
    probes = sum(q.probes for q in quality)

    def rate(mode: str) -> float:
        return round(sum(q.hits[mode] for q in quality) / probes, 4) if probes else math.nan

    result: dict[str, Any] = {
        "bench": "retrieval",
        "memories": cfg.memories,
        "requests": cfg.requests,
        "repeats": cfg.repeats,
        "k": cfg.k,
        "candidates": cfg.candidates,
        "encoder": cfg.encoder,
        "kafka_p50_ms": kafka_p50,
        "kafka_p99_ms": med("kafka", "p99"),
        "http_p50_ms": med("http", "p50"),
        "http_p99_ms": med("http", "p99"),
        "milvus_raw_p50_ms": raw_p50,
        "milvus_raw_p99_ms": med("milvus_raw", "p99"),
        "overhead_ratio_p50": round(kafka_p50 / raw_p50, 3) if raw_p50 > 0 else math.nan,
        "http_overhead_ratio_p50": round(med("http", "p50") / raw_p50, 3)
        if raw_p50 > 0
        else math.nan,
        "responder_p50_ms": {  # inside the worker: encode + Milvus search + rank
            name: round(median_across(m["per_took"][name], "p50"), 3) for name in m["per_took"]
        },
        "responder_p99_ms": {
            name: round(median_across(m["per_took"][name], "p99"), 3) for name in m["per_took"]
        },
        "empty_responses": m["empty"],
        "probe_hit_at_5_hybrid": rate("hybrid"),
        "probe_hit_at_5_semantic": rate("semantic"),
        "probe_hit_at_5_store_all": rate("store_all"),
        "probes": probes,
        "probe_stored_gated": round(sum(q.stored_gated for q in quality) / probes, 4)
        if probes
        else math.nan,
        "quality_by_env": {
            q.env: {
                "probes": q.probes,
                "hit_at_5_hybrid": round(q.hits["hybrid"] / q.probes, 4) if q.probes else None,
                "hit_at_5_semantic": round(q.hits["semantic"] / q.probes, 4) if q.probes else None,
                "hit_at_5_store_all": round(q.hits["store_all"] / q.probes, 4)
                if q.probes
                else None,
                "stored_gated": round(q.stored_gated / q.probes, 4) if q.probes else None,
                "gated_rows": q.gated_rows,
                "all_rows": q.all_rows,
            }
            for q in quality
        },
        "quality_run": {"envs": list(cfg.envs), "steps": cfg.steps, "seed": cfg.seed},
        "latency_repeats": {
            name: [{k: round(v, 3) for k, v in s.items()} for s in reps]
            for name, reps in per.items()
        },
        "responder_repeats": {
            name: [{k: round(v, 3) for k, v in s.items()} for s in reps]
            for name, reps in m["per_took"].items()
        },
        "loadavg_per_repeat": m["loads"],
        "setup": info,
        "machine": machine_info(),
        "elapsed_s": round(elapsed, 1),
    }
    return result


def print_report(r: dict[str, Any]) -> None:
    rows = []
    series = [(name, r["latency_repeats"][name]) for name in ("kafka", "http", "milvus_raw")]
    series += [(f"{name}: in worker", reps) for name, reps in r["responder_repeats"].items()]
    for name, reps in series:
        rows.append(
            [
                name,
                statistics.median(x["p50"] for x in reps),
                statistics.median(x["p90"] for x in reps),
                statistics.median(x["p99"] for x in reps),
                statistics.median(x["mean"] for x in reps),
                max(x["max"] for x in reps),
            ]
        )
    print_table(
        f"latency at {r['memories']:,} memories (ms; median over {r['repeats']} repeats of "
        f"{r['requests']} sequential requests, k={r['k']}, C={r['candidates']})",
        ["path", "p50", "p90", "p99", "mean", "max"],
        rows,
    )
    qrows = [
        [
            "all (pooled)",
            r["probes"],
            r["probe_hit_at_5_hybrid"],
            r["probe_hit_at_5_semantic"],
            r["probe_hit_at_5_store_all"],
            r["probe_stored_gated"],
        ]
    ]
    for env, q in r["quality_by_env"].items():
        qrows.append(
            [
                env,
                q["probes"],
                q["hit_at_5_hybrid"],
                q["hit_at_5_semantic"],
                q["hit_at_5_store_all"],
                q["stored_gated"],
            ]
        )
    print_table(
        "critical-event probes: hit@5",
        ["env", "probes", "hybrid", "semantic", "store_all", "stored(gated)"],
        qrows,
    )
    checks = [
        ("kafka_p99_ms <= 50", r["kafka_p99_ms"] <= 50),
        ("http_p99_ms <= 30", r["http_p99_ms"] <= 30),
        ("overhead_ratio_p50 <= 3", r["overhead_ratio_p50"] <= 3),
        ("hybrid >= 0.9", r["probe_hit_at_5_hybrid"] >= 0.9),
        (
            "hybrid >= store_all + 0.2",
            r["probe_hit_at_5_hybrid"] >= r["probe_hit_at_5_store_all"] + 0.2,
        ),
        ("hybrid >= semantic", r["probe_hit_at_5_hybrid"] >= r["probe_hit_at_5_semantic"]),
    ]
    print_table(
        "targets", ["target", "met"], [[name, "yes" if ok else "NO"] for name, ok in checks]
    )


EMBEDDED_KEYS = ("milvus_mode", "memories", "ingest_per_s", "search_p50_ms", "search_p99_ms",
                 "server_took_p50_ms", "encode_p50_ms", "milvus_p50_ms")  # fmt: skip


def run_embedded_block(cfg: BenchConfig) -> dict[str, Any]:
    """`--embedded`: the same search load on the stack `dmem up` starts (its default
    Milvus), loaded through HTTP ingest: `dmem_bench.embedded`, figures side by side."""
    from dmem_bench.embedded import EmbeddedConfig, run_embedded

    r = run_embedded(EmbeddedConfig(memories=cfg.memories, queries=cfg.requests,
                                    repeats=cfg.repeats, warmup=cfg.warmup,
                                    encoder=cfg.encoder, seed=cfg.seed))  # fmt: skip
    return {k: r.get(k) for k in EMBEDDED_KEYS}


def main(cfg: BenchConfig, as_json: bool) -> dict[str, Any]:
    result = run_retrieval(cfg)
    if cfg.embedded:
        emb = result["embedded"] = run_embedded_block(cfg)
        note(
            f"embedded default ({emb['milvus_mode']}): HTTP search p50 "
            f"{emb['search_p50_ms']} ms, p99 {emb['search_p99_ms']} ms at "
            f"{emb['memories']:,} memories; server stack: HTTP p50 {result['http_p50_ms']} ms"
        )
    print_report(result)
    note(f"done in {result['elapsed_s']:.0f}s")
    if as_json:
        emit_json(result)
    return result


__all__ = ["BenchConfig", "main", "run_retrieval"]
