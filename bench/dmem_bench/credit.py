"""`dmem bench credit`: the delayed-credit task, through the real pipeline.

The task ("vaults"). A world has `scenarios` vaults. The first time an agent
visits a vault it is briefed: one decisive observation ("the guide says: take
the LEFT passage") followed by `distractors` turns that mention the vault and
its treasure and are therefore *semantically closer* to the decision query
than the briefing. Every episode ends at a fork: the agent asks dmem "which way
does the treasure lie in the <vault>?" (k = 3, scoped to the vault by a
structured metadata filter), takes the side named by a retrieved briefing, or
guesses when none was retrieved. It then reports which served memory its
decision rested on (`Client.report_usage`: the briefing it followed, or
none when it guessed). The outcome (+1 right, -1 wrong, ``task`` = the vault,
so the credit baseline is the vault's own running mean) is reported *late*:
after the next episode has started, and twice (a duplicate the credit job must
ignore).

Everything runs through the real stack: embedded broker, one worker with every
role (write path gate, responder, credit job + utility applier), Milvus Lite.
The same episodes (same seed) run twice, in separate tenants: with the default
hybrid ranking, and with lambda = 1 (pure semantic ranking).

Reported: `utility_auc` (ROC AUC of utility, decisive vs distractor memories of
the hybrid run), `decisive_in_core_ratio`, `success_last100_hybrid`,
`success_last100_semantic`, `duplicate_outcomes_ignored`, and a success-rate
curve (PNG + JSON under `.dmem-bench/`).
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dmem.client import Client
from dmem_bench.common import Progress, emit_json, note
from schemas import EpisodeOutcome, Transition, encode
from streams.local.stack import LocalStack

VAULTS = [
    "ruby",
    "amber",
    "jade",
    "onyx",
    "pearl",
    "opal",
    "topaz",
    "garnet",
    "coral",
    "ivory",
    "cobalt",
    "copper",
    "silver",
    "golden",
    "crimson",
    "violet",
    "azure",
    "ebony",
    "scarlet",
    "emerald",
    "sapphire",
    "bronze",
    "marble",
    "granite",
]
DISTRACTORS = [
    "In the {v} vault the treasure chest glitters behind iron bars",
    "The {v} vault treasure is guarded by a sleeping dragon",
    "Stories say the {v} vault holds the largest treasure of the kingdom",
    "A map of the {v} vault shows where treasure hunters camped",
    "The walls of the {v} vault are carved with treasure symbols",
    "Echoes in the {v} vault make the treasure hard to locate",
    "Dust covers the {v} vault floor near the treasure room",
    "The {v} vault door creaks as you walk toward the treasure",
]


@dataclass(frozen=True)
class CreditConfig:
    episodes: int = 300
    scenarios: int = 20
    distractors: int = 6
    k: int = 3
    seed: int = 7
    out_dir: Path = Path(".dmem-bench")


def query(vault: str) -> str:
    return f"In the {vault} vault, which way does the treasure lie: left or right?"


def briefing(vault: str, side: str) -> str:
    # Names its vault (briefings of different vaults are different memories, as in
    # life; identical texts would be merged by the dedup job), yet stays farther
    # from the fork query than every distractor (checked in tests/unit/test_credit.py).
    return f"Briefing ({vault}): the guide says take the {side.upper()} passage"


def plan(cfg: CreditConfig) -> tuple[dict[str, str], list[str]]:
    rng = random.Random(cfg.seed)
    vaults = VAULTS[: cfg.scenarios]
    sides = {v: rng.choice(["left", "right"]) for v in vaults}
    order = [rng.choice(vaults) for _ in range(cfg.episodes)]
    return sides, order


def briefing_transitions(
    tenant: str, vault: str, side: str, cfg: CreditConfig, episode: str
) -> list[Transition]:
    texts = [briefing(vault, side)] + [
        DISTRACTORS[j % len(DISTRACTORS)].format(v=vault) for j in range(cfg.distractors)
    ]
    return [
        Transition(
            transition_id=f"{tenant}-{vault}-{'brief' if i == 0 else f'd{i}'}",
            tenant=tenant,
            agent_id="explorer",
            episode_id=episode,
            step=i,
            observation=text,
            action="listen",
            reward=0.0,
            next_observation=text,
            metadata={"vault": vault, "decisive": i == 0},
        )
        for i, text in enumerate(texts)
    ]


async def run_condition(
    stack: LocalStack,
    tenant: str,
    lam: float | None,
    cfg: CreditConfig,
    progress: Progress | None,
    trace: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Play every episode; returns 1/0 success per episode."""
    sides, order = plan(cfg)
    s = stack.settings
    rng = random.Random(cfg.seed + 1)  # guesses: identical in both conditions
    briefed: set[str] = set()
    successes: list[int] = []
    pending: list[EpisodeOutcome] = []
    processed_before = int(health(stack).get("write", {}).get("processed", 0))
    assert stack.bootstrap is not None
    async with Client(
        stack.bootstrap, tenant, topic_prefix=s.kafka.topic_prefix, timeout_s=10
    ) as c:
        producer = c._producer  # noqa: SLF001 - raw publish, duplicates included
        assert producer is not None
        for e, vault in enumerate(order):
            ep = f"{tenant}-ep{e}"
            if vault not in briefed:
                sent = await c.publish_many(
                    briefing_transitions(tenant, vault, sides[vault], cfg, ep)
                )
                briefed.add(vault)
                # the briefing is processed by the write path before the fork
                target = processed_before + sent
                for _ in range(600):
                    if int(health(stack).get("write", {}).get("processed", 0)) >= target:
                        break
                    await asyncio.sleep(0.1)
                processed_before = target
            rid = f"{ep}-fork"
            hits = await c.search(
                query(vault),
                cfg.k,
                lambda_=lam,
                episode_id=ep,
                step=cfg.distractors + 1,
                request_id=rid,
                metadata_equals={"vault": vault},
            )
            choice, used = None, None
            for h in hits:
                if h.text.startswith("Briefing ("):
                    choice = "left" if "LEFT" in h.text else "right"
                    used = h.memory_id
                    break
            if hits:  # what the decision actually rested on (nothing, when guessing)
                await c.report_usage(
                    ep,
                    rid,
                    {h.memory_id: float(h.memory_id == used) for h in hits},
                    step=cfg.distractors + 1,
                )
            if trace is not None:
                trace.append(
                    {
                        "episode": e,
                        "vault": vault,
                        "hits": [
                            [
                                h.text[:24],
                                round(h.score, 3),
                                round(h.breakdown.lambda_, 3),
                                round(h.breakdown.salience, 3),
                                round(h.utility, 3),
                            ]
                            for h in hits
                        ],
                    }
                )
            guess = rng.choice(["left", "right"])
            won = (choice or guess) == sides[vault]
            successes.append(int(won))
            for old in pending:  # late: the previous episode's outcome, sent twice
                for _ in range(2):
                    await producer.send(
                        s.topic("feedback"), encode(old), key=old.episode_id.encode()
                    )
            # task = the vault: the credit job's baseline is then the running mean outcome
            # of this vault's episodes (what the agent achieves there without help)
            pending = [
                EpisodeOutcome(
                    tenant=tenant,
                    episode_id=ep,
                    reward=1.0 if won else -1.0,
                    task=vault,
                    outcome_id=f"{ep}:final",
                    ts=int(time.time() * 1000),
                )
            ]
            await asyncio.sleep(0.05)
            if progress:
                rate = sum(successes) / len(successes)
                progress.update(e + 1, f"{tenant} success so far {rate:.2f}")
        for old in pending:
            await producer.send(s.topic("feedback"), encode(old), key=old.episode_id.encode())
        await producer.flush()
    return successes


def auc(pos: list[float], neg: list[float]) -> float:
    """ROC AUC by pairwise comparison (ties count half)."""
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def health(stack: LocalStack) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.web_ports[0]}/health", timeout=10) as r:
        return dict(json.loads(r.read()))


def plot(curves: dict[str, list[int]], path: Path, window: int = 25) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for name, s in curves.items():
        xs, ys = [], []
        for i in range(len(s)):
            lo = max(0, i - window + 1)
            xs.append(i + 1)
            ys.append(sum(s[lo : i + 1]) / (i + 1 - lo))
        ax.plot(xs, ys, label=name)
    ax.set_xlabel("episode")
    ax.set_ylabel(f"success (moving mean, {window})")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.set_title("dmem bench credit: delayed credit vs semantic ranking")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(cfg: CreditConfig, as_json: bool) -> dict[str, Any]:
    from milvus import MemoryStore

    data = Path(tempfile.mkdtemp(prefix="dmem-bench-credit-"))
    env = {
        "DMEM_ENCODER__NAME": "hash",
        "DMEM_APP_ID": "dmem-bench-credit",
        "DMEM_WRITE__BATCH_WITHIN_S": "0.1",
    }
    stack = LocalStack(data, roles=("all",), extra_env=env)
    t0 = time.monotonic()
    try:
        note("bench credit: starting broker + worker (all roles, Milvus Lite) ...")
        stack.start()
        curves: dict[str, list[int]] = {}
        traces: dict[str, list[dict[str, Any]]] = {}
        for name, lam in (("hybrid", None), ("semantic", 1.0)):
            prog = Progress(f"credit {name}", cfg.episodes)
            traces[name] = []
            curves[name] = asyncio.run(
                run_condition(stack, f"bench-{name}", lam, cfg, prog, traces[name])
            )
        time.sleep(5)  # let the last credit land
        dup = int(health(stack).get("jobs", {}).get("duplicate_outcomes_ignored", 0))
        stack.stop_workers()
        s = stack.settings
        store = MemoryStore(s.milvus_uri, collection=s.milvus.collection, dim=s.encoder.dim)
        store.connect()
        try:
            rows = list(
                store.scan(tenant="bench-hybrid", output_fields=["id", "utility", "metadata"])
            )
        finally:
            store.close()
    finally:
        stack.stop()
    decisive = [r for r in rows if r["metadata"]["user"].get("decisive")]
    distract = [r for r in rows if not r["metadata"]["user"].get("decisive")]
    last = min(100, cfg.episodes)
    result = {
        "episodes": cfg.episodes,
        "scenarios": cfg.scenarios,
        "utility_auc": round(
            auc([r["utility"] for r in decisive], [r["utility"] for r in distract]), 4
        ),
        "decisive_in_core_ratio": round(
            sum(r["partition"] == "core" for r in decisive) / max(cfg.scenarios, 1), 4
        ),
        "success_last100_hybrid": sum(curves["hybrid"][-last:]) / last,
        "success_last100_semantic": sum(curves["semantic"][-last:]) / last,
        "duplicate_outcomes_ignored": dup,
        "decisive_stored": len(decisive),
        "distractors_stored": len(distract),
        "elapsed_s": round(time.monotonic() - t0, 1),
    }
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    plot(curves, cfg.out_dir / "credit_success.png")
    (cfg.out_dir / "credit.json").write_text(
        json.dumps({"result": result, "curves": curves, "served": traces})
    )
    note(f"plot: {cfg.out_dir / 'credit_success.png'}")
    emit_json(result) if as_json else note(json.dumps(result, indent=2))
    return result
