"""`dmem demo`: an epsilon-greedy Q-learning agent in a Gymnasium toy_text world
publishes its transitions through the real embedded stack, and the summary says
what the dopamine gate kept and why.

Reproducibility: the agent's trajectory depends only on the seed, and
transitions are published in lockstep chunks of exactly the worker's batch size
(each chunk is awaited before the next is sent, with a long take window), so
the write path sees identical micro-batches on every run with the same seed.

"Critical" means a distinct (state, action) pair that produced the
environment's rare reward (CliffWalking -100, Taxi +20 or -10, FrozenLake
reaching the goal or falling into a hole).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from dmem_bench.common import teardown
from operators.encoders import encoder_dim
from schemas import Transition, encode
from schemas.errors import ServiceUnavailable
from streams.admin import kafka_client_kwargs
from streams.local.stack import LocalStack
from streams.settings import Settings

DEMO_BATCH = 256


@dataclass(frozen=True)
class EnvSpec:
    gym_id: str
    actions: tuple[str, ...]
    max_steps: int


ENVS = {
    "cliffwalking": EnvSpec("CliffWalking-v1", ("up", "right", "down", "left"), 200),
    "taxi": EnvSpec("Taxi-v4", ("south", "north", "east", "west", "pickup", "dropoff"), 200),
    "frozenlake": EnvSpec("FrozenLake-v1", ("left", "down", "right", "up"), 100),
}


def describe(env_name: str, env: Any, s: int) -> str:
    """Observation text for a discrete state (what gets embedded and shown)."""
    if env_name == "cliffwalking":
        r, c = divmod(int(s), 12)
        return f"cliff walk grid: agent at row {r} column {c}"
    if env_name == "frozenlake":
        r, c = divmod(int(s), 4)
        return f"frozen lake: agent at row {r} column {c}"
    row, col, pas, dest = env.unwrapped.decode(int(s))
    where = "in the taxi" if pas == 4 else f"waiting at stand {pas}"
    return f"taxi at row {row} column {col}, passenger {where}, destination stand {dest}"


def is_critical(env_name: str, reward: float, terminated: bool) -> bool:
    if env_name == "cliffwalking":
        return reward <= -100
    if env_name == "taxi":
        return reward in (20.0, -10.0)
    return terminated  # frozenlake: goal (+1) or hole (reported as -1) both end it


def q_learning_transitions(
    env_name: str, steps: int, seed: int, tenant: str = "demo", agent_id: str = "agent-0"
) -> Iterator[tuple[Transition, bool, tuple[int, str]]]:
    """Yield (transition, critical, (state, action)) for `steps` environment steps."""
    import gymnasium as gym

    spec = ENVS[env_name]
    kwargs: dict[str, Any] = {"is_slippery": False} if env_name == "frozenlake" else {}
    env = gym.make(spec.gym_id, **kwargs)
    rng = np.random.default_rng(seed)
    n_s, n_a = env.observation_space.n, env.action_space.n  # type: ignore[attr-defined]
    q = np.zeros((n_s, n_a))
    alpha, gamma, eps = 0.5, 0.99, 0.1
    episode, t = 0, 0
    s, _ = env.reset(seed=seed)
    for i in range(steps):
        if rng.random() < eps:
            a = int(rng.integers(n_a))
        else:
            best = np.flatnonzero(q[s] == q[s].max())
            a = int(rng.choice(best))
        s2, r, terminated, truncated, _ = env.step(a)
        if env_name == "frozenlake" and terminated and r == 0:
            r = -1.0  # a hole is a painful lesson: the demo agent reports it as -1
        truncated = truncated or t + 1 >= spec.max_steps
        done = bool(terminated or truncated)
        target = float(r) + (0.0 if terminated else gamma * q[s2].max())
        q[s, a] += alpha * (target - q[s, a])
        tr = Transition(
            tenant=tenant,
            agent_id=agent_id,
            episode_id=f"{env_name}-{seed}-{episode}",
            step=t,
            observation=describe(env_name, env, s),
            action=spec.actions[a],
            reward=float(r),
            next_observation=describe(env_name, env, s2),
            done=bool(terminated),
            ts=1_700_000_000_000 + i * 100,
            metadata={"state": int(s), "env": env_name},
        )
        yield tr, is_critical(env_name, float(r), bool(terminated)), (int(s), spec.actions[a])
        s, t = s2, t + 1
        if done:
            episode, t = episode + 1, 0
            s, _ = env.reset()
    env.close()


class Progress:
    """A one-line progress bar on stderr (quiet when stderr is not a terminal)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.t0 = total, enabled, time.monotonic()

    def update(self, done: int, extra: str = "") -> None:
        if not self.enabled:
            return
        frac = done / max(self.total, 1)
        bar = "#" * int(frac * 30)
        rate = done / max(time.monotonic() - self.t0, 1e-9)
        sys.stderr.write(f"\r[{bar:<30}] {done}/{self.total} {rate:,.0f}/s {extra}   ")
        sys.stderr.flush()
        if done >= self.total:
            sys.stderr.write("\n")


async def drive(
    settings: Settings,
    env_name: str,
    steps: int,
    seed: int,
    progress: Progress,
    worker_alive: Any,
) -> dict[str, Any]:
    """Publish in lockstep chunks; collect one outcome (event or dead letter) per transition."""
    kw = kafka_client_kwargs(settings.kafka)
    producer = AIOKafkaProducer(linger_ms=5, **kw)
    consumer = AIOKafkaConsumer(
        settings.topic("memories"),
        settings.topic("deadletter"),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=20,
        **kw,
    )
    await producer.start()
    await consumer.start()
    outcomes: dict[str, dict[str, Any]] = {}
    dead = 0
    critical: set[tuple[int, str]] = set()
    crit_ids: dict[str, tuple[int, str]] = {}
    published = 0
    t0 = time.monotonic()
    try:
        chunk: list[Transition] = []
        gen = q_learning_transitions(env_name, steps, seed)
        exhausted = False
        while not exhausted:
            chunk.clear()
            for tr, crit, pair in gen:
                chunk.append(tr)
                if crit:
                    critical.add(pair)
                    crit_ids[tr.memory_id] = pair
                if len(chunk) >= DEMO_BATCH:
                    break
            else:
                exhausted = True
            if not chunk:
                break
            for tr in chunk:
                await producer.send(
                    settings.topic("transitions"), encode(tr), key=tr.agent_id.encode()
                )
            await producer.flush()
            published += len(chunk)
            want = published
            deadline = time.monotonic() + 120
            while len(outcomes) + dead < want:
                if time.monotonic() > deadline or not worker_alive():
                    raise ServiceUnavailable(
                        f"write worker stopped answering after {len(outcomes) + dead}/{want}"
                    )
                batch = await consumer.getmany(timeout_ms=500)
                for msgs in batch.values():
                    for m in msgs:
                        if m.topic == settings.topic("deadletter"):
                            dead += 1
                        else:
                            ev = orjson.loads(m.value)
                            outcomes[ev["memory_id"]] = ev
            progress.update(
                published, f"core={sum(o.get('partition') == 'core' for o in outcomes.values())}"
            )
    finally:
        await producer.stop()
        await consumer.stop()
    elapsed = time.monotonic() - t0
    return {
        "outcomes": outcomes,
        "dead": dead,
        "critical": critical,
        "crit_ids": crit_ids,
        "published": published,
        "elapsed": elapsed,
    }


def run_demo(
    env_name: str = "cliffwalking",
    steps: int = 3000,
    seed: int = 7,
    encoder: str | None = None,
    data_dir: Path | None = None,
    as_json: bool = False,
) -> dict[str, Any]:
    import logging

    from milvus import MemoryStore

    # pymilvus warns on every query_iterator against Lite ("failed to get mvccTs"): noise here
    logging.getLogger("pymilvus").setLevel(logging.ERROR)

    tmp = None
    if data_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="dmem-demo-"))
        data_dir = tmp
    env = {
        "DMEM_WRITE__BATCH_SIZE": str(DEMO_BATCH),
        "DMEM_WRITE__BATCH_WITHIN_S": "5",
        "DMEM_WRITE__LINGER_S": "5",  # a lockstep chunk is exactly one micro-batch
        "DMEM_APP_ID": f"dmem-demo-{seed}",
    }
    if encoder:
        env["DMEM_ENCODER__NAME"] = encoder
    stack = LocalStack(Path(data_dir), roles=("write",), extra_env=env)
    interactive = sys.stderr.isatty()

    def note(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    failed = True
    try:
        note("dmem demo: starting embedded broker and write worker (Milvus Lite) ...")
        stack.start()
        settings = stack.settings
        note(f"  broker {stack.bootstrap}, milvus {settings.milvus_uri}")
        note(f"dmem demo: {env_name}, {steps} steps, seed {seed}")
        worker = stack.workers[0]
        res = asyncio.run(
            drive(
                settings,
                env_name,
                steps,
                seed,
                Progress(steps, interactive or not as_json),
                lambda: worker.alive,
            )
        )
        stack.stop_workers()
        store = MemoryStore(
            settings.milvus_uri, collection=settings.milvus.collection, dim=_dim(settings)
        )
        store.connect()
        try:
            core = store.count("core")
            buffer = store.count("buffer")
            core_pairs = {
                (int(row["metadata"]["user"]["state"]), row["action"])
                for row in store.scan(partition="core", output_fields=["action", "metadata"])
            }
        finally:
            store.close()
        failed = False
    finally:
        teardown(stack, None, tmp, failed)
    outcomes = res["outcomes"]
    critical = res["critical"]
    crit_in_core = len(critical & core_pairs)
    published = res["published"]
    reasons = Counter((o.get("route"), o.get("reason")) for o in outcomes.values())
    summary = {
        "env": env_name,
        "seed": seed,
        "encoder": encoder or settings.encoder.name,
        "published": published,
        "stored_core": core,
        "stored_buffer": buffer,
        "dropped": sum(1 for o in outcomes.values() if o.get("kind") == "dropped"),
        "dead_lettered": res["dead"],
        "critical_seen": len(critical),
        "critical_in_core": crit_in_core,
        "critical_coverage": round(crit_in_core / len(critical), 4) if critical else 1.0,
        "storage_ratio": round((core + buffer) / max(published, 1), 4),
        "elapsed_s": round(res["elapsed"], 3),
        "transitions_per_s": round(published / max(res["elapsed"], 1e-9), 1),
        "reasons": {f"{r}:{why}": n for (r, why), n in sorted(reasons.items(), key=str)},
    }
    if not as_json or interactive:
        # the table is the result of a plain run (stdout); with --json it is
        # commentary next to the JSON line, so it goes to stderr
        print_summary(summary, sys.stderr if as_json else sys.stdout)
    return summary


def _dim(settings: Settings) -> int:
    return encoder_dim(settings.encoder.name, settings.encoder.dim)


EXPLAIN = {
    "above_high": "smoothed |RPE| at or above the running high quantile",
    "outlier": "robust outlier (median + k*MAD), kept in core even when frequent",
    "between": "between the low and high quantiles: parked in the buffer",
    "above_bulk": "clearly above the mundane bulk but under the floor: parked in the buffer",
    "below_low": "below the running low quantile: expected, not stored",
    "below_floor": "below the absolute floor: nothing new, not stored",
    "warmup": "decided by the fixed warm-up rule while the sketch fills",
    "repeat": "exact repeat of a memory already stored: not stored again",
}


def print_summary(s: dict[str, Any], out: Any = sys.stdout) -> None:
    rows = [
        ("published", s["published"]),
        ("stored in core", s["stored_core"]),
        ("stored in buffer", s["stored_buffer"]),
        ("dropped", s["dropped"]),
        ("dead-lettered", s["dead_lettered"]),
        ("storage ratio", f"{s['storage_ratio']:.1%}"),
        ("critical (state, action) seen", s["critical_seen"]),
        ("critical with a memory in core", s["critical_in_core"]),
        ("critical coverage", f"{s['critical_coverage']:.1%}"),
        ("throughput", f"{s['transitions_per_s']:,.0f} transitions/s"),
    ]
    w = max(len(k) for k, _ in rows)
    print("\n" + "-" * (w + 20), file=out)
    for k, v in rows:
        print(f"{k:<{w}}  {v}", file=out)
    print("-" * (w + 20), file=out)
    print("why (route: reason -> count):", file=out)
    for key, n in s["reasons"].items():
        route, why = key.split(":", 1)
        print(f"  {route:<6} {why:<12} {n:>6}  {EXPLAIN.get(why, '')}", file=out)
