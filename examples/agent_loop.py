"""A Gymnasium agent that asks dmem what it remembers before each action.

    .venv/bin/python examples/agent_loop.py [--episodes N] [--seed S] [--json]

Starts the embedded stack (Tansu broker + one ``dmem worker --role all`` with
Milvus Lite in a temp dir, hash encoder by default) and runs the same agent in
CliffWalking-v1 twice, with the same per-episode seeds:

1. WITHOUT memory: a noisy heuristic walks the short path along the cliff edge
   (right along row 2, then down to the goal); with probability ``epsilon`` it
   takes a uniformly random action instead. It publishes every transition
   (through `Memory.add_memory`) but never reads memory.
2. WITH memory, in a fresh tenant (its memory starts empty): the same policy,
   but before acting it calls ``get_relevant_memories(observation,
   valence=-1)`` and vetoes every action that a retrieved memory of the *same*
   observation says led to a reward <= ``--avoid-reward`` (a cliff fall is
   -100). A vetoed action is replaced by the heuristic's action if that is
   allowed, else by a random allowed action.

Nothing is hand-fed to memory: the agent only sees what the write path's
dopamine gate kept (surprising transitions) and what the responder ranks into
the top k. Writes are asynchronous, so a fall becomes avoidable only once it
has been written (typically well under a second later).

The summary compares mean return and cliff falls per condition, over all
episodes and over the last ``--eval-last`` episodes; ``--json`` prints it as
one JSON object on the last stdout line.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # runnable as a plain script from a checkout
    sys.path.insert(0, str(REPO_ROOT))

from dmem.adapter import Memory  # noqa: E402
from dmem.client import SyncClient  # noqa: E402
from dmem_bench.demo import describe  # noqa: E402
from streams.local.stack import LocalStack, tail  # noqa: E402

ACTIONS = ("up", "right", "down", "left")  # CliffWalking's action ids 0..3
ROWS, COLS = 4, 12
MAX_STEPS = 100
FALL_REWARD = -100.0


def heuristic(state: int) -> int:
    """The short (risky) path: up from the start, right along row 2, down to the goal."""
    r, c = divmod(state, COLS)
    if c == COLS - 1:
        return 2  # down to the goal
    if r == ROWS - 1:
        return 0  # the start cell: up
    if r < ROWS - 2:
        return 2  # back down to the edge row
    return 1  # right along the edge


@dataclass
class Condition:
    name: str
    returns: list[float] = field(default_factory=list)
    falls: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    repeat_falls: int = 0
    vetoes: int = 0
    searches: int = 0
    search_ms: list[float] = field(default_factory=list)
    published: int = 0


def run_condition(
    name: str,
    memory: Memory | None,
    mem: Memory,
    episodes: int,
    seed: int,
    epsilon: float,
    k: int,
    avoid_reward: float,
    log: Any,
) -> Condition:
    """One condition. ``mem`` publishes transitions; ``memory`` (or None) is read."""
    import gymnasium as gym

    env = gym.make("CliffWalking-v1")
    out = Condition(name)
    fallen: set[tuple[int, int]] = set()  # (state, action) pairs that led off the cliff
    for ep in range(episodes):
        rng = np.random.default_rng([seed, ep])  # the same draws in both conditions
        s, _ = env.reset(seed=seed + ep)
        ret, falls, t = 0.0, 0, 0
        while True:
            obs = describe("cliffwalking", env, s)
            base = heuristic(int(s))
            a = int(rng.integers(4)) if rng.random() < epsilon else base
            if memory is not None:
                t0 = time.perf_counter()
                hits = memory.get_relevant_memories(obs, k=k, valence=-1)
                out.search_ms.append((time.perf_counter() - t0) * 1000)
                out.searches += 1
                avoid = {
                    h["action"]
                    for h in hits
                    if h["text"] == obs and h["valence"] == -1 and h["reward"] <= avoid_reward
                }
                if ACTIONS[a] in avoid:
                    out.vetoes += 1
                    allowed = [i for i in range(4) if ACTIONS[i] not in avoid]
                    if base in allowed:
                        a = base
                    elif allowed:
                        a = int(rng.choice(allowed))
            s2, r, terminated, truncated, _ = env.step(a)
            t += 1
            truncated = bool(truncated) or t >= MAX_STEPS
            ret += float(r)
            if float(r) <= FALL_REWARD:
                falls += 1
                if (int(s), a) in fallen:
                    out.repeat_falls += 1
                fallen.add((int(s), a))
            mem.add_memory(
                obs,
                ACTIONS[a],
                float(r),
                describe("cliffwalking", env, s2),
                done=bool(terminated),
                truncated=truncated and not terminated,
                metadata={"state": int(s), "env": "cliffwalking"},
            )
            out.published += 1
            s = s2
            if terminated or truncated:
                break
        out.returns.append(ret)
        out.falls.append(falls)
        out.steps.append(t)
        print(
            f"  [{name:>14}] episode {ep + 1:>3}/{episodes}: return {ret:7.1f}, "
            f"falls {falls}, steps {t}",
            file=log,
            flush=True,
        )
    env.close()
    return out


def episode_ids(tenant: str) -> Callable[[], str]:
    """Readable, reproducible episode ids: {tenant}-ep0, -ep1, ..."""
    counter = itertools.count()
    return lambda: f"{tenant}-ep{next(counter)}"


def run(
    episodes: int = 30,
    seed: int = 0,
    epsilon: float = 0.25,
    k: int = 5,
    avoid_reward: float = -50.0,
    eval_last: int | None = None,
    encoder: str = "hash",
    data_dir: Path | None = None,
    broker_bootstrap: str | None = None,
    topic_prefix: str | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Start the stack, run both conditions, return the summary dict."""
    eval_last = eval_last or max(1, episodes // 2)
    log = open(os.devnull, "w") if quiet else sys.stderr  # noqa: SIM115
    tmp = None
    if data_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="dmem-agent-loop-"))
        data_dir = tmp
    run_id = uuid.uuid4().hex[:8]
    env = {
        "DMEM_ENCODER__NAME": encoder,
        "DMEM_WRITE__BATCH_WITHIN_S": "0.1",
        "DMEM_APP_ID": f"dmem-agent-loop-{run_id}",
    }
    if topic_prefix:
        env["DMEM_KAFKA__TOPIC_PREFIX"] = topic_prefix
        env["DMEM_MILVUS__COLLECTION"] = topic_prefix.rstrip(".").replace(".", "_") + "_mem"
    stack = LocalStack(
        Path(data_dir), roles=("all",), extra_env=env, broker_bootstrap=broker_bootstrap
    )
    t_start = time.monotonic()
    try:
        print(
            "agent loop: starting the embedded stack (broker + worker --role all) ...",
            file=log,
            flush=True,
        )
        stack.start()
        prefix = stack.settings.kafka.topic_prefix
        assert stack.bootstrap is not None
        results: dict[str, Condition] = {}
        for name, use_memory in (("without memory", False), ("with memory", True)):
            # a fresh tenant per condition: the with-memory agent starts with an empty memory
            tenant = f"agentloop-{run_id}-{'with' if use_memory else 'without'}"
            client = SyncClient(
                stack.bootstrap, tenant, topic_prefix=prefix, timeout_s=5.0, retries=2
            )
            try:
                mem = Memory(
                    client, tenant, agent_id="cliff-agent", new_episode_id=episode_ids(tenant)
                )
                print(f"agent loop: {name} (tenant {tenant})", file=log, flush=True)
                results[name] = run_condition(
                    name,
                    mem if use_memory else None,
                    mem,
                    episodes,
                    seed,
                    epsilon,
                    k,
                    avoid_reward,
                    log,
                )
                if use_memory:
                    gate = gate_decisions(
                        stack.bootstrap,
                        stack.settings.topic("memories"),
                        tenant,
                        results[name].published,
                    )
            finally:
                client.close()
    except Exception:
        for w in stack.workers:
            print(tail(w.log_path), file=sys.stderr)
        raise
    finally:
        stack.stop()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if log is not sys.stderr:
            log.close()
    wo, wi = results["without memory"], results["with memory"]
    lat = sorted(wi.search_ms) or [0.0]
    return {
        "env": "CliffWalking-v1",
        "episodes": episodes,
        "seed": seed,
        "epsilon": epsilon,
        "k": k,
        "encoder": encoder,
        "eval_last": eval_last,
        "return_without_memory": round(statistics.fmean(wo.returns[-eval_last:]), 2),
        "return_with_memory": round(statistics.fmean(wi.returns[-eval_last:]), 2),
        "return_without_memory_all": round(statistics.fmean(wo.returns), 2),
        "return_with_memory_all": round(statistics.fmean(wi.returns), 2),
        "falls_without": sum(wo.falls),
        "falls_with": sum(wi.falls),
        "falls_without_last": sum(wo.falls[-eval_last:]),
        "falls_with_last": sum(wi.falls[-eval_last:]),
        "repeat_falls_without": wo.repeat_falls,
        "repeat_falls_with": wi.repeat_falls,
        "gate_falls": gate,
        "vetoes": wi.vetoes,
        "searches": wi.searches,
        "search_p50_ms": round(lat[len(lat) // 2], 2),
        "search_p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2),
        "published": wo.published + wi.published,
        "returns_without": wo.returns,
        "returns_with": wi.returns,
        "elapsed_s": round(time.monotonic() - t_start, 1),
    }


def gate_decisions(
    bootstrap: str, topic: str, tenant: str, expected: int, timeout_s: float = 30.0
) -> dict[str, int]:
    """What the write path decided for the tenant's cliff falls (from ``dmem.memories``).

    ``falls_kept``/``falls_dropped`` count distinct fall transitions; the
    ``fall_<route>:<reason>`` entries count every decision event.
    """
    import asyncio

    from aiokafka import AIOKafkaConsumer

    async def _collect() -> dict[str, int]:
        c = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await c.start()
        seen: set[str] = set()
        kept: set[str] = set()
        falls: set[str] = set()
        counts: dict[str, int] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(seen) < expected and time.monotonic() < deadline:
                for msgs in (await c.getmany(timeout_ms=500)).values():
                    for m in msgs:
                        ev = orjson.loads(m.value)
                        if ev.get("tenant") != tenant or ev.get("kind") not in (
                            "written",
                            "dropped",
                        ):
                            continue
                        mid = ev["memory_id"]
                        seen.add(mid)
                        if (ev.get("reward") or 0.0) <= FALL_REWARD:
                            falls.add(mid)
                            if ev["kind"] == "written":
                                kept.add(mid)
                            why = f"fall_{ev.get('route')}:{ev.get('reason')}"
                            counts[why] = counts.get(why, 0) + 1
        finally:
            await c.stop()
        # a fall first dropped and later written retrospectively (credit job) counts as kept
        return {"falls_kept": len(kept), "falls_dropped": len(falls - kept), **counts}

    return asyncio.run(_collect())


def print_table(s: dict[str, Any], out: Any) -> None:
    n, last = s["episodes"], s["eval_last"]
    rows = [
        ("", "without memory", "with memory"),
        (f"mean return, last {last} episodes", s["return_without_memory"], s["return_with_memory"]),
        (
            f"mean return, all {n} episodes",
            s["return_without_memory_all"],
            s["return_with_memory_all"],
        ),
        (f"cliff falls, last {last} episodes", s["falls_without_last"], s["falls_with_last"]),
        (f"cliff falls, all {n} episodes", s["falls_without"], s["falls_with"]),
    ]
    w = max(len(str(r[0])) for r in rows)
    print("", file=out)
    for a, b, c in rows:
        print(f"{a:<{w}}  {b!s:>15}  {c!s:>12}", file=out)
    print(
        f"\nCliffWalking-v1, seed {s['seed']}, epsilon {s['epsilon']}, k {s['k']}, "
        f"encoder {s['encoder']}; {s['vetoes']} actions vetoed by memory in "
        f"{s['searches']} searches (p50 {s['search_p50_ms']} ms, p99 {s['search_p99_ms']} ms); "
        f"{s['elapsed_s']} s",
        file=out,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--episodes", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--epsilon", type=float, default=0.25, help="probability of a random action (default 0.25)"
    )
    p.add_argument("-k", type=int, default=5, help="memories retrieved per step")
    p.add_argument(
        "--avoid-reward",
        type=float,
        default=-50.0,
        help="veto actions remembered with a reward at or below this",
    )
    p.add_argument(
        "--eval-last",
        type=int,
        default=None,
        help="episodes at the end that the headline means use (default: half)",
    )
    p.add_argument("--encoder", choices=("hash", "minilm"), default="hash")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="keep the stack's data here (default: a temp dir, removed)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object on the last stdout line (table on stderr)",
    )
    args = p.parse_args(argv)
    if args.episodes < 1:
        p.error("--episodes must be >= 1")
    summary = run(
        episodes=args.episodes,
        seed=args.seed,
        epsilon=args.epsilon,
        k=args.k,
        avoid_reward=args.avoid_reward,
        eval_last=args.eval_last,
        encoder=args.encoder,
        data_dir=args.data_dir,
    )
    print_table(summary, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(orjson.dumps(summary).decode(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
