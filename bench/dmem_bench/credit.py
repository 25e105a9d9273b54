"""`dmem bench credit`: the delayed-credit task, through the real pipeline.

The task ("vaults"). A world has `scenarios` vaults. The first time an agent
visits a vault it is briefed: one decisive observation (a briefing in one of
several phrasings: "Scout report for the jade vault: go LEFT at the fork")
followed by `distractors` turns that mention the vault and its treasure and are
therefore *semantically closer* to the decision query than the briefing. Every
episode ends at a fork: the agent asks dmem "which way does the treasure lie in
the <vault>?" (k = 3, scoped to the vault by a structured metadata filter), reads
the served memories best first and takes the side the first one that names a side
says, or guesses when none does. It then reports which served memory its
decision rested on (`Client.report_usage`: weight 1 for the memory it followed,
0 for the others; nothing followed when it guessed). The outcome (+1 right, -1
wrong, ``task`` = the vault, so the credit baseline is the vault's own) is
reported *late*: after the next episode has started, and twice (a duplicate the
credit job must ignore).

Everything runs through the real stack: embedded broker, one worker with every
role (write path gate, responder, credit job + utility applier), Milvus Lite,
with the encoder under test (default minilm-static). Each seed plays its own
world (sides, visit order, phrasings) twice, in separate tenants: with the
default ranking (two lanes, credit in play: "hybrid") and with lambda = 1 (pure
semantic ranking, no lanes).

Reported (one JSON object): ``episodes``, ``seeds``, ``encoder``;
``decisive_stored_any`` (share of briefings stored in any tier, hybrid),
``decisive_in_core_ratio`` and ``distractors_in_core_ratio`` (after credit),
``visits_to_first_serve_median`` (visits of a vault until its briefing is first
served; never served counts as one more than the vault's visits),
``decisive_served_ratio`` (share of stored briefings served at least once),
``success_last100_hybrid_min`` and ``success_last100_semantic_max`` over seeds,
``utility_auc`` (ROC AUC of the established-evidence statistic,
`operators.credit.CreditStats.established`, decisive vs distractors),
``slot_monopoly_max`` (the largest share of one vault's queries in which one
memory held the exploration slot), ``dropped_briefings`` (why each briefing the
write path did not keep was dropped), and a success curve (PNG + JSON under
`.dmem-bench/`).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import statistics
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmem.client import Client
from dmem_bench.common import Progress, emit_json, note
from operators.credit import CreditStats
from operators.encoders import encoder_dim
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
#: phrasings of a briefing: each names its vault (briefings of different vaults are
#: different memories, as in life; identical texts would be merged by the dedup job)
#: and one side, in capitals; none says "treasure" or "vault" twice
BRIEFINGS = [
    "Briefing ({v}): the guide says take the {S} passage",
    "Scout report for the {v} vault: go {S} at the fork",
    "The old guide whispered that in {v} you keep to the {S} side",
    "Note from the mapmaker ({v}): the {S} tunnel is the safe one",
    "A traveller back from {v} insists the {S} corridor is the one",
    "Remember for {v}: at the split, {S} is right",
]
SIDE = re.compile(r"\b(LEFT|RIGHT)\b")


@dataclass(frozen=True)
class CreditConfig:
    episodes: int = 300
    scenarios: int = 20
    distractors: int = 6
    k: int = 3
    seeds: tuple[int, ...] = (7, 8, 9)
    encoder: str = "minilm-static"
    out_dir: Path = Path(".dmem-bench")


@dataclass
class World:
    """One seed's world: each vault's side and briefing text, and the visit order."""

    sides: dict[str, str]
    briefs: dict[str, str]
    order: list[str]


@dataclass
class Trace:
    """What one condition served: per vault, the visits and what each served."""

    successes: list[int] = field(default_factory=list)
    #: vault -> per visit, the served (memory id, lane) pairs
    served: dict[str, list[list[tuple[str, str]]]] = field(default_factory=dict)


def query(vault: str) -> str:
    return f"In the {vault} vault, which way does the treasure lie: left or right?"


def briefing(vault: str, side: str, phrasing: int = 0) -> str:
    return BRIEFINGS[phrasing % len(BRIEFINGS)].format(v=vault, S=side.upper())


def plan(cfg: CreditConfig, seed: int) -> World:
    rng = random.Random(seed)
    vaults = VAULTS[: cfg.scenarios]
    sides = {v: rng.choice(["left", "right"]) for v in vaults}
    briefs = {v: briefing(v, sides[v], rng.randrange(len(BRIEFINGS))) for v in vaults}
    order = [rng.choice(vaults) for _ in range(cfg.episodes)]
    return World(sides, briefs, order)


def brief_id(tenant: str, vault: str) -> str:
    return f"{tenant}-{vault}-brief"


def briefing_transitions(
    tenant: str, vault: str, world: World, cfg: CreditConfig, episode: str
) -> list[Transition]:
    texts = [world.briefs[vault]] + [
        DISTRACTORS[j % len(DISTRACTORS)].format(v=vault) for j in range(cfg.distractors)
    ]
    return [
        Transition(
            transition_id=brief_id(tenant, vault) if i == 0 else f"{tenant}-{vault}-d{i}",
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
    seed: int,
    progress: Progress | None,
) -> Trace:
    """Play every episode of `seed`'s world; returns successes and what was served."""
    world = plan(cfg, seed)
    s = stack.settings
    rng = random.Random(seed + 1)  # guesses: identical in both conditions
    briefed: set[str] = set()
    trace = Trace()
    pending: list[EpisodeOutcome] = []
    processed_before = int(health(stack).get("write", {}).get("processed", 0))
    assert stack.bootstrap is not None
    async with Client(
        stack.bootstrap, tenant, topic_prefix=s.kafka.topic_prefix, timeout_s=10
    ) as c:
        producer = c._producer  # noqa: SLF001 - raw publish, duplicates included
        assert producer is not None
        for e, vault in enumerate(world.order):
            ep = f"{tenant}-ep{e}"
            if vault not in briefed:
                sent = await c.publish_many(briefing_transitions(tenant, vault, world, cfg, ep))
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
            trace.served.setdefault(vault, []).append(
                [(h.memory_id, h.breakdown.lane) for h in hits]
            )
            choice, used = None, None
            for h in hits:  # the agent reads best first and follows the first side named
                found = SIDE.search(h.text)
                if found:
                    choice, used = found.group(1).lower(), h.memory_id
                    break
            if hits:  # what the decision actually rested on (nothing, when guessing)
                await c.report_usage(
                    ep,
                    rid,
                    {h.memory_id: float(h.memory_id == used) for h in hits},
                    step=cfg.distractors + 1,
                )
            guess = rng.choice(["left", "right"])
            won = (choice or guess) == world.sides[vault]
            trace.successes.append(int(won))
            for old in pending:  # late: the previous episode's outcome, sent twice
                for _ in range(2):
                    await producer.send(
                        s.topic("feedback"), encode(old), key=old.episode_id.encode()
                    )
            # task = the vault: the credit job's baseline is this vault's own outcomes
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
                rate = sum(trace.successes) / len(trace.successes)
                progress.update(e + 1, f"{tenant} success so far {rate:.2f}")
        for old in pending:
            await producer.send(s.topic("feedback"), encode(old), key=old.episode_id.encode())
        await producer.flush()
    return trace


def auc(pos: list[float], neg: list[float]) -> float:
    """ROC AUC by pairwise comparison (ties count half)."""
    if not pos or not neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def health(stack: LocalStack) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.web_ports[0]}/health", timeout=10) as r:
        return dict(json.loads(r.read()))


def first_serves(trace: Trace, tenant: str) -> dict[str, int | None]:
    """Per vault, the visit (1-based) at which its briefing was first served."""
    out: dict[str, int | None] = {}
    for vault, visits in trace.served.items():
        bid = brief_id(tenant, vault)
        out[vault] = next((i + 1 for i, v in enumerate(visits) if any(m == bid for m, _ in v)),
                          None)  # fmt: skip
    return out


def slot_monopoly(trace: Trace) -> float:
    """The largest share of one vault's queries in which one memory held the
    exploration slot."""
    worst = 0.0
    for visits in trace.served.values():
        held = Counter(m for v in visits for m, lane in v if lane == "explore")
        if held and visits:
            worst = max(worst, max(held.values()) / len(visits))
    return worst


def dropped_reasons(stack: LocalStack, dim: int, ids: dict[str, list[str]]) -> dict[str, int]:
    """Why each briefing the store does not hold is not there (its last history
    event's kind and reason; "unrecorded" when the history has none)."""
    from milvus import MemoryStore

    s = stack.settings
    store = MemoryStore(s.milvus_uri, collection=s.milvus.collection, dim=dim)
    store.connect()
    reasons: Counter[str] = Counter()
    try:
        for tenant, missing in ids.items():
            for mid in missing:
                try:
                    events = store.history.events(tenant, mid)
                except Exception:  # noqa: BLE001 - a report, never a failure of the bench
                    events = []
                last = events[-1] if events else None
                reasons[f"{last['kind']}:{last.get('reason') or ''}" if last else "unrecorded"] += 1
    finally:
        store.close()
    return dict(reasons)


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
        "DMEM_ENCODER__NAME": cfg.encoder,
        "DMEM_APP_ID": "dmem-bench-credit",
        "DMEM_WRITE__BATCH_WITHIN_S": "0.1",
    }
    stack = LocalStack(data, roles=("all",), extra_env=env)
    t0 = time.monotonic()
    traces: dict[tuple[str, int], Trace] = {}
    try:
        note(f"bench credit: starting broker + worker (all roles, Milvus Lite, {cfg.encoder}) ...")
        stack.start()
        dim = encoder_dim(cfg.encoder, stack.settings.encoder.dim)
        for seed in cfg.seeds:
            for name, lam in (("hybrid", None), ("semantic", 1.0)):
                prog = Progress(f"credit {name} seed {seed}", cfg.episodes)
                traces[(name, seed)] = asyncio.run(
                    run_condition(stack, f"bench-{name}-s{seed}", lam, cfg, seed, prog)
                )
        time.sleep(5)  # let the last credit land
        dup = int(health(stack).get("jobs", {}).get("duplicate_outcomes_ignored", 0))
        stack.stop_workers()
        s = stack.settings
        store = MemoryStore(s.milvus_uri, collection=s.milvus.collection, dim=dim)
        store.connect()
        rows: dict[int, list[dict[str, Any]]] = {}
        try:
            for seed in cfg.seeds:
                rows[seed] = list(
                    store.scan(
                        tenant=f"bench-hybrid-s{seed}",
                        output_fields=["id", "utility", "uses", "metadata"],
                    )
                )
        finally:
            store.close()
        missing = {
            f"bench-hybrid-s{seed}": sorted(
                set(brief_id(f"bench-hybrid-s{seed}", v) for v in set(plan(cfg, seed).order))
                - {str(r["id"]) for r in rows[seed]}
            )
            for seed in cfg.seeds
        }
        dropped = dropped_reasons(stack, dim, missing)
    finally:
        stack.stop()
    result = summarise(cfg, traces, rows, dup, dropped)
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    curves = {f"{n} s{seed}": t.successes for (n, seed), t in traces.items()}
    plot(curves, cfg.out_dir / "credit_success.png")
    (cfg.out_dir / "credit.json").write_text(
        json.dumps(
            {
                "result": result,
                "curves": curves,
                "served": {f"{n} s{seed}": t.served for (n, seed), t in traces.items()},
            }
        )
    )
    note(f"plot: {cfg.out_dir / 'credit_success.png'}")
    emit_json(result) if as_json else note(json.dumps(result, indent=2))
    return result


def summarise(
    cfg: CreditConfig,
    traces: dict[tuple[str, int], Trace],
    rows: dict[int, list[dict[str, Any]]],
    duplicates: int,
    dropped: dict[str, int],
) -> dict[str, Any]:
    """The contract's keys from the traces and the hybrid tenants' stored rows."""
    min_uses = 2  # `DMEM_RESPOND__PROMOTE_MIN_USES`'s default: what ranking calls established
    last = min(100, cfg.episodes)
    briefs_total = stored = in_core = served_any = 0
    distract_total = distract_core = 0
    visits: list[int] = []
    est_pos: list[float] = []
    est_neg: list[float] = []
    monopoly = 0.0
    for seed in cfg.seeds:
        tenant = f"bench-hybrid-s{seed}"
        trace = traces[("hybrid", seed)]
        by_id = {str(r["id"]): r for r in rows[seed]}
        firsts = first_serves(trace, tenant)
        monopoly = max(monopoly, slot_monopoly(trace))
        for vault, n_visits in ((v, len(x)) for v, x in trace.served.items()):
            briefs_total += 1
            distract_total += cfg.distractors
            row = by_id.get(brief_id(tenant, vault))
            first = firsts.get(vault)
            visits.append(first if first is not None else n_visits + 1)
            if row is not None:
                stored += 1
                in_core += row["partition"] == "core"
                served_any += first is not None
        for r in rows[seed]:
            est = CreditStats.of(r).established(min_uses)
            if (r.get("metadata") or {}).get("user", {}).get("decisive"):
                est_pos.append(est)
            else:
                est_neg.append(est)
                distract_core += r["partition"] == "core"

    def rate(name: str, seed: int) -> float:
        return sum(traces[(name, seed)].successes[-last:]) / last

    return {
        "episodes": cfg.episodes,
        "seeds": len(cfg.seeds),
        "encoder": cfg.encoder,
        "scenarios": cfg.scenarios,
        "decisive_stored_any": round(stored / max(briefs_total, 1), 4),
        "decisive_in_core_ratio": round(in_core / max(briefs_total, 1), 4),
        "distractors_in_core_ratio": round(distract_core / max(distract_total, 1), 4),
        "visits_to_first_serve_median": statistics.median(visits) if visits else None,
        "decisive_served_ratio": round(served_any / max(stored, 1), 4),
        "success_last100_hybrid_min": min(rate("hybrid", s) for s in cfg.seeds),
        "success_last100_semantic_max": max(rate("semantic", s) for s in cfg.seeds),
        "success_last100_hybrid": [rate("hybrid", s) for s in cfg.seeds],
        "success_last100_semantic": [rate("semantic", s) for s in cfg.seeds],
        "utility_auc": round(auc(est_pos, est_neg), 4),
        "slot_monopoly_max": round(monopoly, 4),
        "duplicate_outcomes_ignored": duplicates,
        "decisive_stored": stored,
        "distractors_stored": sum(len(r) for r in rows.values()) - stored,
        "dropped_briefings": dropped,
    }
