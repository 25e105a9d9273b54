"""`dmem bench maintenance`: dedup/decay/capacities through the real pipeline,
and the cost of a decay pass as the memory grows.

Part 1 (live). A Q-learning agent in a Gymnasium toy_text world (fixed seed;
CliffWalking by default, whose 48 cells it revisits thousands of times) streams
`steps` transitions (event time = now) through the embedded stack: broker, one
worker with every role (write path, responder, credit, maintenance jobs) and
Milvus Lite, with small per-tenant capacities so that they bind. Transitions
are published in chunks, each awaited on ``dmem.memories`` before the next.
When all are written, the bench waits until the maintenance job has closed its
last dedup window and run two more decay passes, stops the worker and measures
the store directly:

- ``stored_before_jobs``: distinct memories the write path stored (``written``
  events), i.e. what would be stored without dedup/decay;
- ``stored_after_jobs``: rows in Milvus at the end;
- ``duplicate_pairs_remaining``: pairs the merge rules would merge (same merge
  scope, rewards that agree, cosine >= tau), by brute force over all stored vectors;
- ``critical_coverage``: as in the demo (distinct (state, action) pairs that got
  the rare reward, with a memory of that pair in core);
- ``core_over_capacity``: max(0, core rows - core capacity).

Part 2 (scale). For each size (default 1k, 10k, 100k) a fresh collection on a
Milvus server (the embedded 2.3.5 one, or ``--milvus-uri``; Milvus Lite when no
server is installed) is filled with synthetic memories of one tenant (ages
spread over 10 days, 20% core, capacities at 21% / 81% of the size: the steady
state, where each pass finds the few memories that crossed a threshold since the
last one), the `MaintenanceEngine` bootstraps its index (one scan, timed) and
`passes` decay passes are timed with the stream time (every agent's watermark)
advancing one hour per pass.
Top-level ``decay_pass_ms_p50/p99`` and ``memories`` are the largest size;
``scale`` lists every size (and the in-memory planning part alone), and
``live`` the passes of part 1.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from dmem_bench.common import (
    Progress,
    emit_json,
    machine_info,
    note,
    percentile,
    print_table,
    publish_lockstep,
    teardown,
)
from schemas import DECISION_KINDS
from schemas.errors import ServiceUnavailable
from streams.admin import kafka_client_kwargs
from streams.jobs.rows import dedup_tau
from streams.local.stack import LocalStack
from streams.settings import Settings

__all__ = ["emit_json", "run"]

CHUNK = 512
TENANT = "bench"


def _health(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
        return dict(json.loads(r.read()))


async def _drive(settings: Settings, env_name: str, steps: int, seed: int,
                 alive: Any) -> dict[str, Any]:  # fmt: skip
    from dmem_bench.demo import q_learning_transitions

    kw = kafka_client_kwargs(settings.kafka)
    producer = AIOKafkaProducer(linger_ms=5, **kw)
    consumer = AIOKafkaConsumer(settings.topic("memories"), auto_offset_reset="earliest",
                                enable_auto_commit=False, fetch_max_wait_ms=20, **kw)  # fmt: skip
    await producer.start()
    await consumer.start()
    seen: set[str] = set()
    written: set[str] = set()
    kinds: Counter[str] = Counter()
    critical: set[tuple[int, str]] = set()
    progress = Progress("published", steps)
    published = 0
    try:
        gen = q_learning_transitions(env_name, steps, seed, tenant=TENANT)
        done = False
        while not done:
            chunk = []
            for tr, crit, pair in gen:
                chunk.append(tr.model_copy(update={"ts": int(time.time() * 1000)}))
                if crit:
                    critical.add(pair)
                if len(chunk) >= CHUNK:
                    break
            else:
                done = True
            published += len(chunk)

            def on_event(m: Any) -> None:
                ev = orjson.loads(m.value)
                kinds[ev["kind"]] += 1
                if ev["kind"] in DECISION_KINDS:
                    seen.add(ev["memory_id"])
                if ev["kind"] == "written":
                    written.add(ev["memory_id"])

            def answered(n: int = published) -> bool:
                return len(seen) >= n

            await publish_lockstep(producer, consumer, settings.topic("transitions"), chunk,
                                   answered, on_event, alive)  # fmt: skip
            progress.update(published, f"written={len(written)}")
    finally:
        await producer.stop()
        await consumer.stop()
    return {"published": published, "written": len(written), "critical": critical,
            "kinds": dict(kinds)}  # fmt: skip


def _duplicate_pairs(rows: list[dict[str, Any]], tau: float, reward_tol: float) -> int:
    """Pairs the dedup job should have merged: same merge scope, rewards that agree,
    cosine >= tau (the merge rules of `operators.dedup`), by brute force."""
    from operators.dedup import merge_scope, reward_span, rewards_agree

    scopes: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        scopes.setdefault((r["tenant"], *merge_scope(r)), []).append(r)
    pairs = 0
    for members in scopes.values():
        if len(members) < 2:
            continue
        m = np.stack([np.asarray(r["vector"], dtype=np.float32) for r in members])
        m /= np.linalg.norm(m, axis=1, keepdims=True)
        spans = [reward_span(r) for r in members]
        for i, j in zip(*np.nonzero(np.triu(m @ m.T >= tau - 1e-6, k=1)), strict=True):
            lo, hi = min(spans[i][0], spans[j][0]), max(spans[i][1], spans[j][1])
            pairs += rewards_agree(lo, hi, reward_tol)
    return pairs


def live_run(steps: int, env_name: str, seed: int, core_capacity: int,
             buffer_capacity: int) -> dict[str, Any]:  # fmt: skip
    from milvus import MemoryStore

    tmp = Path(tempfile.mkdtemp(prefix="dmem-bench-maint-"))
    env = {
        "DMEM_ENCODER__NAME": "hash",
        "DMEM_APP_ID": f"dmem-bench-maint-{seed}",
        "DMEM_WRITE__BATCH_SIZE": str(CHUNK),
        "DMEM_WRITE__BATCH_WITHIN_S": "0.5",
        "DMEM_MAINTENANCE__CORE_CAPACITY": str(core_capacity),
        "DMEM_MAINTENANCE__BUFFER_CAPACITY": str(buffer_capacity),
        "DMEM_MAINTENANCE__DEDUP_WINDOW_S": "1",
        "DMEM_MAINTENANCE__DECAY_INTERVAL_S": "2",
        "DMEM_LOG_LEVEL": "info",
        # exact repeats reach the store, as they would without any dedup: the
        # write path's exact-repeat drop is itself a dedup (see the module doc)
        "DMEM_GATE__DROP_EXACT_REPEATS": "false",
    }
    stack = LocalStack(tmp, roles=("all",), extra_env=env)
    t0 = time.monotonic()
    failed = True
    try:
        note("part 1: embedded broker + one worker (all roles, Milvus Lite) ...")
        stack.start()
        settings = stack.settings
        worker, port = stack.workers[0], stack.web_ports[0]
        res = asyncio.run(_drive(settings, env_name, steps, seed, lambda: worker.alive))
        note("  all transitions written; waiting for the jobs to settle ...")
        passes0 = int(_health(port)["maintenance"].get("decay_passes", 0))
        deadline = time.monotonic() + 180
        while True:
            mt = _health(port)["maintenance"]
            if mt.get("pending", 1) == 0 and int(mt.get("decay_passes", 0)) >= passes0 + 2:
                break
            if time.monotonic() > deadline:
                raise ServiceUnavailable(f"maintenance did not settle: {mt}")
            time.sleep(0.5)
        elapsed = time.monotonic() - t0
        stack.stop_workers()
        store = MemoryStore(settings.milvus_uri, collection=settings.milvus.collection,
                            dim=settings.encoder.dim).connect()  # fmt: skip
        try:
            core = store.count("core", TENANT)
            buffer = store.count("buffer", TENANT)
            rows = list(
                store.scan(
                    tenant=TENANT,
                    with_vector=True,
                    output_fields=[
                        "id",
                        "tenant",
                        "agent_id",
                        "action",
                        "valence",
                        "reward",
                        "metadata",
                        "merged_count",
                    ],
                )
            )
        finally:
            store.close()
        failed = False
    finally:
        teardown(stack, None, tmp, failed)
    core_pairs = {(int(r["metadata"]["user"]["state"]), r["action"])
                  for r in rows if r["partition"] == "core"}  # fmt: skip
    critical = res["critical"]
    samples = mt.get("decay_samples") or []
    ms = [s[0] for s in samples]
    return {
        "published": res["published"],
        "stored_before_jobs": res["written"],
        "stored_after_jobs": core + buffer,
        "stored_core": core,
        "stored_buffer": buffer,
        "duplicate_pairs_remaining": _duplicate_pairs(
            rows, dedup_tau(settings), settings.maintenance.dedup_reward_tol
        ),
        "critical_seen": len(critical),
        "critical_in_core": len(critical & core_pairs),
        "critical_coverage": round(len(critical & core_pairs) / len(critical), 4)
        if critical
        else 1.0,
        "core_capacity": core_capacity,
        "buffer_capacity": buffer_capacity,
        "core_over_capacity": max(0, core - core_capacity),
        "buffer_over_capacity": max(0, buffer - buffer_capacity),
        "merged_rows_max": max((int(r.get("merged_count", 1)) for r in rows), default=0),
        "events": res["kinds"],
        "live": {
            "decay_pass_ms_p50": percentile(ms, 50) if ms else None,
            "decay_pass_ms_p99": percentile(ms, 99) if ms else None,
            "memories": int(samples[-1][1]) if samples else None,
            "passes": len(ms),
        },
        "tau": dedup_tau(settings),
        "elapsed_s": round(elapsed, 2),
    }


def _fill(store: Any, n: int, rng: np.random.Generator, now: int) -> None:
    dim = store.dim
    day = 24 * 3600 * 1000
    for start in range(0, n, 5000):
        m = min(5000, n - start)
        vecs = rng.standard_normal((m, dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        ages = rng.uniform(0, 10 * day, m).astype(np.int64)  # inside the 14-day TTL
        rpe = rng.standard_normal(m) * 1.5
        core = rng.random(m) < 0.2
        for part, mask in (("core", core), ("buffer", ~core)):
            idx = np.flatnonzero(mask)
            rows = [
                {
                    "id": f"s{start + i}",
                    "tenant": "scale",
                    "agent_id": f"a{i % 8}",
                    "episode_id": "e",
                    "step": int(start + i),
                    "vector": vecs[i],
                    "text": "x",
                    "action": str(i % 4),
                    "reward": 0.0,
                    "rpe": float(rpe[i]),
                    "rpe_smoothed": abs(float(rpe[i])),
                    "gate": 0.5,
                    "valence": 1,
                    "utility": float(rng.normal(0, 0.3)) if i % 10 == 0 else 0.0,
                    "created_ts": int(now - ages[i]),
                    "last_access_ts": int(now - ages[i]),
                    "metadata": {"access": {"n": int(i % 7)}} if i % 13 == 0 else {},
                }
                for i in idx
            ]
            if rows:
                store.upsert(rows, part)


def scale_run(sizes: list[int], passes: int, milvus_uri: str | None) -> dict[str, Any]:
    import uuid

    from milvus import EmbeddedMilvusServer, MemoryStore, milvus_lite_uri
    from operators.decay import MaintenancePolicy, plan_decay
    from schemas.errors import ConfigError
    from streams.jobs.scheduler import MaintenanceEngine

    tmp = Path(tempfile.mkdtemp(prefix="dmem-bench-scale-"))
    server = None
    backend = "server"
    try:
        if milvus_uri is None:
            server = EmbeddedMilvusServer(tmp / "milvus", stop_grace_s=3)
            try:
                server.check_installed()
                note("part 2: starting the embedded Milvus server ...")
                milvus_uri = server.start(timeout_s=180)
            except ConfigError as exc:
                note(f"part 2: no Milvus server ({exc}); using Milvus Lite")
                server, backend = None, "lite"
                milvus_uri = milvus_lite_uri(tmp / "lite", name="scale")
        results = []
        rng = np.random.default_rng(0)
        for n in sizes:
            store = MemoryStore(milvus_uri, collection=f"scale_{uuid.uuid4().hex[:8]}",
                                dim=16).connect()  # fmt: skip
            try:
                now = int(time.time() * 1000)
                t0 = time.perf_counter()
                _fill(store, n, rng, now)
                fill_s = time.perf_counter() - t0
                # capacities with a little headroom: steady state, not a one-off backlog
                policy = MaintenancePolicy(core_capacity=int(0.21 * n),
                                           buffer_capacity=int(0.81 * n))  # fmt: skip
                engine = MaintenanceEngine(store, policy)
                t0 = time.perf_counter()
                engine.bootstrap()
                boot_ms = (time.perf_counter() - t0) * 1e3
                times, plan_times, acted = [], [], []
                hour = 3600 * 1000
                for k in range(passes):
                    t = now + k * hour
                    tix = engine.index.tenant("scale")
                    for agent in list(tix.clocks):  # the stream moves on by an hour
                        tix.advance(agent, t)
                    p0 = time.perf_counter()
                    plan_decay(tix, policy)
                    plan_times.append((time.perf_counter() - p0) * 1e3)
                    p0 = time.perf_counter()
                    events = engine.decay("scale", t)
                    times.append((time.perf_counter() - p0) * 1e3)
                    acted.append(len(events))
                r = {
                    "memories": n,
                    "decay_pass_ms_p50": round(percentile(times, 50), 2),
                    "decay_pass_ms_p99": round(percentile(times, 99), 2),
                    "plan_ms_p50": round(percentile(plan_times, 50), 2),
                    "actions_per_pass_p50": percentile(acted, 50),
                    "actions_first_pass": acted[0],
                    "bootstrap_ms": round(boot_ms, 1),
                    "fill_s": round(fill_s, 1),
                }
                note(
                    f"  n={n:,}: pass p50 {r['decay_pass_ms_p50']} ms, p99 "
                    f"{r['decay_pass_ms_p99']} ms, plan {r['plan_ms_p50']} ms, "
                    f"bootstrap {r['bootstrap_ms']} ms"
                )
                results.append(r)
            finally:
                try:
                    store.drop()
                except Exception:  # noqa: BLE001
                    store.close()
        return {"backend": backend, "uri": milvus_uri, "sizes": results}
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def run(steps: int = 20_000, env_name: str = "cliffwalking", seed: int = 7,
        core_capacity: int = 150, buffer_capacity: int = 300,
        sizes: list[int] | None = None, passes: int = 20,
        milvus_uri: str | None = None) -> dict[str, Any]:  # fmt: skip
    out = live_run(steps, env_name, seed, core_capacity, buffer_capacity)
    scale = scale_run(sizes or [1000, 10_000, 100_000], passes, milvus_uri)
    big = scale["sizes"][-1] if scale["sizes"] else {}
    out.update(
        decay_pass_ms_p50=big.get("decay_pass_ms_p50"),
        decay_pass_ms_p99=big.get("decay_pass_ms_p99"),
        memories=big.get("memories"),
        scale=scale,
        env=env_name,
        seed=seed,
        machine=machine_info(),
    )
    print_table("dmem bench maintenance", ["metric", "value"], [
        ("published", out["published"]),
        ("stored before jobs", out["stored_before_jobs"]),
        ("stored after jobs", out["stored_after_jobs"]),
        ("duplicate pairs remaining", out["duplicate_pairs_remaining"]),
        ("critical coverage", float(out["critical_coverage"])),
        ("core over capacity", out["core_over_capacity"]),
        *[(f"decay pass p50/p99 ms @ {s['memories']:,}",
           f"{s['decay_pass_ms_p50']:.1f} / {s['decay_pass_ms_p99']:.1f}")
          for s in scale["sizes"]],
    ])  # fmt: skip
    return out


if __name__ == "__main__":  # python -m dmem_bench.maintenance [--json]
    import sys

    result = run(steps=int(sys.argv[sys.argv.index("--steps") + 1])
                 if "--steps" in sys.argv else 20_000)  # fmt: skip
    if "--json" in sys.argv:
        emit_json(result)
