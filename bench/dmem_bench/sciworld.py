"""`dmem bench sciworld`: dmem on a real text environment (ScienceWorld), end to end.

What it does (the environment side is `dmem_bench.sciworld_env`):

1. Plays the chosen tasks in one JVM: on each *train* variation a gold, a noisy and
   a random episode (the stored stream); on each *test* variation a gold episode
   (the probes). Deterministic for a ``--seed``.
2. Starts the embedded stack (broker + one ``all`` worker + Milvus Lite) and
   publishes the train stream with the SDK, one transition per step: observation
   = the step's observation text, action, reward = score delta, metadata
   ``{"task", "variation"}`` (the structured task context), in lockstep: each
   episode (``--publish step``: each transition) is processed before the next is
   sent, so the write path's micro-batches do not depend on the machine's speed.
   Then it scans the store: the ``*_gate`` numbers (before any outcome).
3. Sends each train episode's outcome (its final score) on the feedback topic and
   waits until the store settles (hindsight writes, dedup, decay): ``*_final``.
4. Probes over HTTP: the observation just before each rewarded gold step of a test
   variation, filtered to its task (``metadata_equals``). Relevant: the stored
   rewarded steps of the same task that completed the same rubric subgoal. dmem
   (default ranking), semantic over the same stored set (lambda = 1), and
   store-all (cosine over every published step, same encoder and text, in
   process). Tie-aware hit@5 and MRR@10 (expected values over a random order
   of equal scores; the server lists are asked for 20 hits so ties at the cut
   are visible). ``top_k_unchanged_before_credit``: the share of probes whose
   default top 5 (two lanes) equals the ranking without lanes at the same lambda;
   no credit exists yet, so it must be 1.0.
5. Closed loop (no LLM) on each test variation, ``loop_repeats`` times (2), same
   seeds per condition (repeat r has its own): before
   each step ask dmem for k = 5 memories of the same task with the observation
   as query, take the action of the best-ranked hit that is valid now, else a
   random valid action drawn with common random numbers (`fallback_action`: seeded
   by the decision point, so conditions in the same state draw the same action,
   whatever happened earlier in their episodes); report which memory was used and
   the outcome. "Valid now": the simulator accepts it here, it was not tried from this observation
   already in the episode, and no retrieved memory records it failing (a hit
   with reward < 0 is a warning: its action is neither replayed nor drawn at
   random; the no-memory agent has no such warnings). No
   memory / semantic (lambda = 1) / hybrid (default). Semantic is the baseline
   "cosine over the stored set": it runs before hybrid and reports neither usage
   nor outcomes, so it sees the store as the loop found it and leaves no credit
   (its searches still stamp the hits' access count and time, as every search does;
   those feed maintenance's priority and promotion, so the store hybrid searches may
   differ from semantic's by what maintenance did with them; not measured apart).
   (When hybrid ran first, the credit of its episodes made maintenance demote and
   evict blamed memories, and semantic then searched a store without them:
   ``loop_store_removed_<condition>`` counts the rows each condition's episodes
   removed.) A failed task scores
   0 (ScienceWorld reports -100 internally); success = score 100. The means
   (``score_*``) are over every episode; ``score_diff_<a>_<b>`` (with ``_se``, its
   standard error, and ``episodes_<a>_won_<b>`` / ``_lost_``) is the paired
   difference over the same (task, variation, repeat) episodes, which is what
   says whether a gap between conditions is more than one episode's luck.

Coverage counts distinct critical events: a critical step is covered when it, or
a step with the same (task, variation, observation, action), is stored.

Outputs under ``.dmem-bench/``, named by ``--env`` (``sciworld`` or a TextWorldExpress
game, `dmem_bench.twx_env`): ``<env>.json`` (result, per-episode loop scores and
every loop step's action, source memory and reward), ``<env>-probes.json`` (each
probe's top hits per ranking with relevance, reward, salience, policy, subgoal) and
``<env>.png``.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dmem.client import Client
from dmem_bench.common import Progress, cleanup_on_signals, emit_json, note
from dmem_bench.sciworld_env import (
    DEFAULT_TASKS,
    TASKS,
    Episode,
    SciWorld,
    Step,
    World,
    play,
    rng_for,
)
from dmem_bench.twx_env import ENVS, TWXWorld
from operators.dedup import DEDUP_TAU_BY_ENCODER
from schemas import Transition
from streams.local.stack import LocalStack

TENANT = "sciworld"
#: one agent plays every policy (an agent that explores, follows a guide, errs): its
#: exact repeats (the gold and noisy episodes of a variation share their rewarded steps)
#: are the write path's `repeat` drops, as for any agent that does the same thing twice
AGENT = "explorer"
#: ScienceWorld asks which object was meant ("0" picks the first)
AMBIGUOUS = "Ambiguous request"
#: fixed-lambda rankings of the same stored set, reported as diagnostics (``lambda_*``)
DIAG_LAMBDAS = (("lambda_0.97", 0.97), ("lambda_0.9", 0.9), ("lambda_0.7", 0.7))


@dataclass(frozen=True)
class SciConfig:
    tasks: tuple[str, ...] = DEFAULT_TASKS
    #: "sciworld", or a TextWorldExpress game (`twx_env.ENVS`: "twx-coin", ...)
    env: str = "sciworld"
    train_variations: int = 4
    test_variations: int = 2
    random_steps: int = 20
    loop_max_steps: int = 30
    #: closed-loop episodes per test variation and condition; repeat r draws its
    #: random actions from its own seeds, the same for every condition (paired)
    loop_repeats: int = 2
    seed: int = 0
    encoder: str = "minilm"
    settle_s: float = 25.0
    out_dir: Path = Path(".dmem-bench")
    #: reuse the played train/test episodes of an earlier run with the same settings
    #: (JSON written there on first use); the closed loop is always played afresh
    play_cache: Path | None = None
    #: the stored stream in lockstep per "episode", or per "step" (one transition, then
    #: wait for the worker: how a live agent publishes; micro-batches of one)
    publish: str = "episode"
    #: closed loop, credited condition: "settled" waits after each episode until the
    #: worker has applied its usage and outcome (credit job and applier settled), as
    #: an agent whose episodes are seconds apart sees it, so a run does not depend on
    #: how the credit job's timing falls against the next episode's searches; "async"
    #: goes on at once
    credit_between: str = "settled"

    def __post_init__(self) -> None:
        if self.publish not in ("episode", "step"):
            raise ValueError(f"publish must be 'episode' or 'step', got {self.publish!r}")
        if self.credit_between not in ("settled", "async"):
            raise ValueError(
                f"credit_between must be 'settled' or 'async', got {self.credit_between!r}"
            )
        if self.env != "sciworld" and self.env not in ENVS:
            raise ValueError(f"unknown env {self.env!r} (sciworld or one of {sorted(ENVS)})")
        allowed = TASKS if self.env == "sciworld" else (ENVS[self.env],)
        if self.loop_repeats < 1:
            raise ValueError("loop_repeats must be >= 1")
        bad = [t for t in self.tasks if t not in allowed]
        if bad:
            raise ValueError(f"tasks not allowed in this benchmark: {bad}")


@dataclass
class Played:
    train: list[Episode] = field(default_factory=list)
    test: list[Episode] = field(default_factory=list)
    test_variations: dict[str, list[int]] = field(default_factory=dict)


def step_id(st: Step) -> str:
    return f"{st.episode}:{st.step}"


def event_key(st: Step) -> tuple[str, int, str, str]:
    return (st.task, st.variation, st.observation, st.action)


def to_transition(st: Step, i: int, t0_ms: int) -> Transition:
    return Transition(
        transition_id=step_id(st),
        tenant=TENANT,
        agent_id=AGENT,
        episode_id=st.episode,
        step=st.step,
        observation=st.observation,
        action=st.action,
        reward=st.reward,
        next_observation=st.next_observation,
        done=st.done,
        ts=t0_ms + i * 10,  # a live agent's memories: minutes old, not from 2023
        metadata={"task": st.task, "variation": st.variation},
    )


def make_world(cfg: SciConfig) -> World:
    return SciWorld() if cfg.env == "sciworld" else TWXWorld()


def play_all(sw: World, cfg: SciConfig, progress: Progress | None) -> Played:
    out = Played()
    for n, task in enumerate(cfg.tasks):
        train, test = sw.variations(task)
        for v in train[: cfg.train_variations]:
            for pol in ("gold", "noisy", "random"):
                out.train.append(
                    play(
                        sw,
                        task,
                        v,
                        pol,
                        cfg.seed,
                        f"{task}-{v}-{pol}",
                        random_steps=cfg.random_steps,
                    )
                )
        out.test_variations[task] = test[: cfg.test_variations]
        for v in out.test_variations[task]:
            out.test.append(play(sw, task, v, "gold", cfg.seed, f"{task}-{v}-test"))
        if progress:
            progress.update(n + 1, task)
    return out


def _key(cfg: SciConfig) -> dict[str, Any]:
    # older caches: ScienceWorld with HotSpot's default identity hashes, whose episodes
    # depended on the ones before them (`sciworld_env.FIXED_IDENTITY_HASH`): not reused
    env = {"jvm": "fixed-hash"} if cfg.env == "sciworld" else {"env": cfg.env}
    return {
        **env,
        "tasks": list(cfg.tasks),
        "train": cfg.train_variations,
        "test": cfg.test_variations,
        "random_steps": cfg.random_steps,
        "seed": cfg.seed,
    }


def cached_play(sw: World, cfg: SciConfig) -> Played:
    import dataclasses

    path = cfg.play_cache
    if path is not None and path.is_file():
        d = json.loads(path.read_text())
        if d["key"] == _key(cfg):

            def eps(items: list[dict[str, Any]]) -> list[Episode]:
                return [
                    Episode(
                        e["task"],
                        e["variation"],
                        e["policy"],
                        e["episode"],
                        [Step(**st) for st in e["steps"]],
                    )
                    for e in items
                ]

            return Played(
                eps(d["train"]),
                eps(d["test"]),
                {k: list(v) for k, v in d["test_variations"].items()},
            )
    played = play_all(sw, cfg, Progress("sciworld play", len(cfg.tasks)))
    if path is not None:
        path.write_text(json.dumps({"key": _key(cfg), **dataclasses.asdict(played)}))
    return played


# ---------------------------------------------------------------- metrics


def hit_prob(scores: Sequence[float], rel: Sequence[bool], k: int) -> float:
    """P(at least one relevant in the top k) over random orders of equal scores."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    if len(order) <= k:
        return float(any(rel))
    cut = scores[order[k - 1]]
    above = [i for i in order if scores[i] > cut]
    if any(rel[i] for i in above):
        return 1.0
    tied = [i for i in order if scores[i] == cut]
    g, slots = len(tied), k - len(above)
    r = sum(rel[i] for i in tied)
    if r == 0:
        return 0.0
    return 1.0 - math.comb(g - r, slots) / math.comb(g, slots)


def mrr(scores: Sequence[float], rel: Sequence[bool], k: int) -> float:
    """Expected reciprocal rank of the first relevant item within the top k (ties random)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    pos = 0
    while pos < len(order) and pos < k:
        s = scores[order[pos]]
        group = [i for i in order[pos:] if scores[i] == s]
        r = sum(rel[i] for i in group)
        g = len(group)
        if r:
            total = 0.0
            for off in range(g - r + 1):  # P(first relevant at offset off)
                if pos + off >= k:
                    break
                p = math.comb(g - 1 - off, r - 1) / math.comb(g, r)
                total += p / (pos + off + 1)
            return total
        pos += g
    return 0.0


def health(stack: LocalStack) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.web_ports[0]}/health", timeout=10) as r:
        return dict(json.loads(r.read()))


def scan(stack: LocalStack, dim: int) -> dict[str, tuple[str, tuple[str, ...]]]:
    """memory id -> (partition, ids merged into it) of every stored row of the tenant.

    The store is the Milvus 2.3.5 server (Milvus Lite is single-process: the bench
    could not read it while the worker holds it), read with Strong consistency.
    """
    from milvus import MemoryStore

    s = stack.settings
    store = MemoryStore(s.milvus_uri, collection=s.milvus.collection, dim=dim)
    store.connect()
    try:
        out = {}
        for r in store.scan(tenant=TENANT, output_fields=["id", "metadata"]):
            merge = (r.get("metadata") or {}).get("merge") or {}
            out[str(r["id"])] = (str(r["partition"]), tuple(merge.get("ids") or ()))
        return out
    finally:
        store.close()


def store_stats(
    rows: dict[str, tuple[str, tuple[str, ...]]], steps: dict[str, Step]
) -> dict[str, Any]:
    """Coverage of distinct critical events and the core's precision, from a scan.

    A row covers its own step's event and those of the steps the dedup job merged
    into it (``metadata.merge.ids``: the survivor stands for them).
    ``failure_terminal_coverage``: the share of episodes that ended in a failure (the
    step that failed the task, its last) whose failing step is covered;
    ``failure_terminal_silent`` counts those whose failing step paid no negative
    reward (a death scored 0: only the outcome says it was one).
    """
    stored_keys = {
        event_key(steps[m]) for i, (_, merged) in rows.items() for m in (i, *merged) if m in steps
    }
    crit = {event_key(s) for s in steps.values() if s.critical}
    up = {event_key(s) for s in steps.values() if s.reward > 0}
    core = [i for i, (p, _) in rows.items() if p == "core" and i in steps]
    deaths = [s for s in steps.values() if s.failed]
    return {
        "stored": len(rows),
        "core": len(core),
        "buffer": sum(p == "buffer" for p, _ in rows.values()),
        "critical_coverage": len(crit & stored_keys) / max(len(crit), 1),
        "reward_up_coverage": len(up & stored_keys) / max(len(up), 1),
        "precision_core": sum(steps[i].critical for i in core) / max(len(core), 1),
        "failure_terminal_coverage": sum(event_key(s) in stored_keys for s in deaths)
        / max(len(deaths), 1),
        "failure_terminal_silent": sum(s.reward >= 0 for s in deaths),
        "failed_episodes": len(deaths),
    }


async def wait_processed(
    stack: LocalStack, target: int, timeout_s: float = 600, poll_s: float = 0.5
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if int(health(stack).get("write", {}).get("processed", 0)) >= target:
            return
        await asyncio.sleep(poll_s)
    raise TimeoutError(f"write path did not process {target} transitions in {timeout_s} s")


async def settle(
    stack: LocalStack, dim: int, min_s: float, quiet_s: float = 6.0, timeout_s: float = 300.0
) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Wait at least `min_s`, then until the tenant's rows stop changing for `quiet_s`."""
    await asyncio.sleep(min_s)
    deadline = time.monotonic() + timeout_s
    last = await asyncio.to_thread(scan, stack, dim)
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(2.0)
        now = await asyncio.to_thread(scan, stack, dim)
        if now != last:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since >= quiet_s:
            break
    return last


# ---------------------------------------------------------------- probes


@dataclass
class Probe:
    task: str
    query: str
    subgoal: str


def probes_of(test: list[Episode]) -> list[Probe]:
    out = []
    for ep in test:
        for st in ep.steps:
            if st.reward > 0 and st.subgoal:
                out.append(Probe(st.task, st.observation, st.subgoal))
    return out


def relevant_ids(
    steps: dict[str, Step], rows: dict[str, tuple[str, tuple[str, ...]]], pr: Probe
) -> set[str]:
    """Stored rows that are (or absorbed, by a dedup merge) a rewarded step of the
    probe's task that completed the probe's subgoal."""

    def rel(i: str) -> bool:
        s = steps.get(i)
        return s is not None and s.task == pr.task and s.reward > 0 and s.subgoal == pr.subgoal

    return {i for i, (_, merged) in rows.items() if rel(i) or any(rel(m) for m in merged)}


def relevant_keys(steps: dict[str, Step], pr: Probe) -> set[tuple[str, int, str, str]]:
    return {
        event_key(s)
        for s in steps.values()
        if s.task == pr.task and s.reward > 0 and s.subgoal == pr.subgoal
    }


def _dump_hit(h: Any, rel: bool, steps: dict[str, Step]) -> dict[str, Any]:
    st = steps.get(h.memory_id)
    return {
        "id": h.memory_id,
        "score": round(h.score, 4),
        "rel": rel,
        "sem": round(h.breakdown.semantic, 4),
        "sal": round(h.breakdown.salience, 4),
        "reward": h.reward,
        "action": h.action,
        "text": h.text[:80],
        "merged": h.merged_count,
        "policy": st.policy if st else None,
        "subgoal": st.subgoal if st else None,
    }


async def unchanged_top_k(c: Client, pr: Probe, k: int = 5) -> float:
    """1.0 when the default search's top k (two lanes) is the ranking without lanes at
    the same lambda (what a request fixing lambda gets): before any credit the lanes
    must change nothing."""
    lanes = await c.search(pr.query, k, metadata_equals={"task": pr.task})
    if not lanes:
        return 1.0
    plain = await c.search(
        pr.query, k, lambda_=lanes[0].breakdown.lambda_, metadata_equals={"task": pr.task}
    )
    return float([h.memory_id for h in lanes] == [h.memory_id for h in plain])


async def run_probes(
    c: Client,
    encoder: Any,
    probes: list[Probe],
    steps: dict[str, Step],
    rows: dict[str, tuple[str, tuple[str, ...]]],
    dump: list[dict[str, Any]] | None = None,
) -> dict[str, float]:
    """Tie-aware hit@5 / MRR@10 per ranking; ``dump`` (when given) collects, per probe,
    the top hits of each ranking with their relevance (`.dmem-bench/sciworld-probes.json`)."""
    ids = list(steps)
    vecs = encoder.encode([steps[i].observation for i in ids])
    by_task: dict[str, list[int]] = defaultdict(list)
    for j, i in enumerate(ids):
        by_task[steps[i].task].append(j)
    acc: dict[str, list[float]] = defaultdict(list)
    for pr in probes:
        rel_stored = relevant_ids(steps, rows, pr)
        keys = relevant_keys(steps, pr)
        # store-all: every published step of the task, cosine, in process
        q = encoder.encode([pr.query])[0]
        cols = by_task[pr.task]
        sims = (vecs[cols] @ q).astype(float).tolist()
        rel_all = [event_key(steps[ids[j]]) in keys for j in cols]
        acc["hit_at_5_store_all"].append(hit_prob(sims, rel_all, 5))
        acc["mrr_at_10_store_all"].append(mrr(sims, rel_all, 10))
        entry: dict[str, Any] = {
            "task": pr.task,
            "subgoal": pr.subgoal,
            "query": pr.query[:120],
            "relevant_stored": sorted(rel_stored),
            "hit_at_5_store_all": acc["hit_at_5_store_all"][-1],
        }
        for name, lam in (("dmem", None), ("semantic_stored", 1.0), *DIAG_LAMBDAS):
            hits = await c.search(pr.query, 20, lambda_=lam, metadata_equals={"task": pr.task})
            sc = [h.score for h in hits]
            rel = [h.memory_id in rel_stored for h in hits]
            acc[f"hit_at_5_{name}"].append(hit_prob(sc, rel, 5))
            acc[f"mrr_at_10_{name}"].append(mrr(sc, rel, 10))
            entry[f"hit_at_5_{name}"] = acc[f"hit_at_5_{name}"][-1]
            if name in ("dmem", "semantic_stored"):
                entry[name] = [_dump_hit(h, r, steps) for h, r in zip(hits[:10], rel, strict=False)]
        acc["relevant_stored"].append(float(len(rel_stored) > 0))
        acc["top_k_unchanged_before_credit"].append(await unchanged_top_k(c, pr))
        if dump is not None:
            dump.append(entry)
    return {k: round(sum(v) / max(len(v), 1), 4) for k, v in acc.items()}


def fallback_action(
    seed: int,
    task: str,
    variation: int,
    repeat: int,
    obs: str,
    valid: Sequence[str],
    avoid: set[str],
    visit: int,
) -> str:
    """The closed-loop agent's random valid action, drawn with common random numbers.

    The draw is seeded by the decision point alone: (seed, task, variation, repeat,
    observation, sorted valid actions, visit), where ``visit`` counts the earlier
    fallbacks of this episode at the same (observation, valid actions). So two
    conditions (or two episodes) that stand in the same state draw the same action,
    whatever happened before; with one random stream per episode, one different step
    made every later draw differ, and the paired hybrid - semantic difference
    measured the draws' luck as much as the memories (BENCHMARKS.md "ScienceWorld"). The
    visit count keeps a revisited state from replaying its draw forever (a fixed
    state -> action map can cycle). Not the step index: paths that reach the same
    state one step apart would draw differently again. The seeded order is over
    every valid action and the first not in ``avoid`` is taken (all avoided: the
    first), so a condition whose memories warn against some other action still
    draws the same one; over one ``avoid`` it is uniform among the allowed actions.
    """
    ordered = sorted(valid)
    rng = rng_for(seed, "loop", task, variation, repeat, obs, "\n".join(ordered), visit)
    order = rng.sample(ordered, len(ordered))
    return next((a for a in order if a not in avoid), order[0])


def paired(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, int, int]:
    """Paired difference of two conditions played on the same (task, variation,
    repeat) episodes: (mean of a - b, its standard error, episodes a won, b won)."""
    if len(a) != len(b):
        raise ValueError("paired conditions need the same episodes")
    d = [x - y for x, y in zip(a, b, strict=True)]
    n = len(d)
    if n == 0:
        return 0.0, 0.0, 0, 0
    mean = sum(d) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n) if n > 1 else 0.0
    return mean, se, sum(x > 0 for x in d), sum(x < 0 for x in d)


# ---------------------------------------------------------------- closed loop


async def loop_episode(
    sw: World,
    c: Client | None,
    task: str,
    variation: int,
    lam: float | None,
    cfg: SciConfig,
    tag: str,
    trace: list[dict[str, Any]] | None = None,
    repeat: int = 0,
    credit: bool = True,
) -> tuple[int, bool]:
    """One closed-loop episode; returns (final score with failure as 0, success).
    ``trace`` (when given) collects each step: action, the memory it came from
    (None: random), reward, the ranking's lambda and the served hits (id, action,
    semantic, salience, reward, utility). ``repeat`` r is part of every fallback draw's seed
    (`fallback_action`; repeat 0 keeps the single-repeat episode ids).
    ``credit=False``: searches only (no episode id, usage or outcome), so the episode
    leaves no credit in the store (the searches' access stamps remain)."""
    sw.load(task, variation)
    obs = sw.reset()
    score, ep = 0, f"{task}-{variation}-loop-{tag}" + (f"-r{repeat}" if repeat else "")
    tried: set[tuple[str, str]] = set()
    visits: dict[tuple[str, tuple[str, ...]], int] = defaultdict(int)
    earned: int | None = None  # the step of the last score change (the outcome's step)
    for step in range(cfg.loop_max_steps):
        action, used, rid = None, None, f"{ep}-{step}"
        hits = []
        if c is not None:
            hits = await c.search(
                obs,
                5,
                lambda_=lam,
                episode_id=ep if credit else None,
                step=step,
                request_id=rid,
                metadata_equals={"task": task},
            )
        # a memory of a failure (reward < 0: it ended or set back the task) is a
        # warning, not a recipe: its action is not valid for this agent, neither
        # replayed nor drawn at random (the no-memory agent knows no such warning)
        avoid = {h.action for h in hits if h.reward < 0}
        result = None
        for h in hits:
            # a memory's action if the simulator accepts it here (an input it cannot
            # parse costs no move and changes nothing) and it was not already tried from
            # this very observation in this episode (no loops on a useless action)
            if h.action in avoid or (obs, h.action) in tried:
                continue
            attempt = sw.act(h.action)
            if not attempt[0].startswith(sw.invalid_prefixes):
                action, used, result = h.action, h.memory_id, attempt
                break
        if result is None:
            valid = tuple(sw.valid())
            action = fallback_action(
                cfg.seed, task, variation, repeat, obs, valid, avoid, visits[(obs, valid)]
            )
            visits[(obs, valid)] += 1
            result = sw.act(action)
        tried.add((obs, str(action)))
        obs, reward, score, done, failed = result
        if obs.startswith(AMBIGUOUS):
            obs, reward, score, done, failed = sw.act("0")
        if c is not None and hits and credit:
            # usage = the memory the agent acted on (weight 1), or nothing: a hit whose
            # action the simulator refused here, a warning it heeded or an action it had
            # already tried from this observation was not followed, and the outcome says
            # nothing about it (reported with weight 0 it would lose its exploration
            # bonus for a state it does not apply to). The record is sent even when
            # empty: it replaces the responder's score-weighted one, which would share
            # the outcome among all five hits (operators/credit.py). With the step's
            # reward as evidence: a failure the random fallback caused later does not
            # blame a memory whose action was just rewarded
            await c.report_usage(
                ep, rid, {used: 1.0} if used else {}, step=step, reward=float(reward)
            )
        if reward != 0:
            earned = step
        if trace is not None:
            trace.append(
                {
                    "step": step,
                    "action": action,
                    "memory": used,
                    "reward": reward,
                    "hits": len(hits),
                    "failed": failed,
                    "lambda": round(hits[0].breakdown.lambda_, 3) if hits else None,
                    "served": [
                        [
                            h.memory_id,
                            h.action,
                            round(h.breakdown.semantic, 3),
                            round(h.breakdown.salience, 3),
                            h.reward,
                            round(h.utility, 3),
                        ]
                        for h in hits
                    ],
                }
            )
        if done:
            break
    final = max(score, 0)
    if c is not None and credit:
        # the loop agent's own outcomes: credit judges them against its own usual
        # outcome on this task (operators/credit.py), not against the explorer's gold
        # episodes nor its outcomes on other tasks (without the task, find-animal's
        # +17, the most that task's loop earned, ran below the find-plant episodes'
        # +67 before it and blamed "go to hallway", the step that earned it);
        # and the step of its last score change: memories used after it (wandering
        # until the step limit) did not earn the outcome and get no share of it
        await c.report_outcome(
            ep, reward=float(final), agent_id=f"loop-{tag}", task=task, step=earned
        )
    return final, final >= 100


def credit_settled(stack: LocalStack) -> float:
    """Wait until the stack's credit job and applier are settled (the last episode's
    usage and outcome credited and applied; access stamps are flushed on their own
    30 s clock and are left to it); the seconds waited. Settled for 1 s in a row: a
    record just produced can hide from one poll, until the consumer's next fetch
    reports the new end offset."""
    from dmem.wait import wait_settled

    urls = [f"http://127.0.0.1:{p}" for p in stack.web_ports]
    done = wait_settled(urls, timeout_s=120.0, quiet_s=1.0, poll_s=0.1, components=["credit"])
    return float(done["waited_s"])


async def closed_loop(
    sw: World, stack: LocalStack, played: Played, cfg: SciConfig, dim: int
) -> dict[str, Any]:
    s = stack.settings
    res: dict[str, Any] = {}
    per: dict[str, list[int]] = {}
    traces: dict[str, list[dict[str, Any]]] = {}
    assert stack.bootstrap is not None
    async with Client(
        stack.bootstrap, TENANT, topic_prefix=s.kafka.topic_prefix, timeout_s=20
    ) as c:
        # semantic first and credit-free: the baseline searches the stored set as the
        # loop found it, and leaves no credit (only the access stamps of its searches)
        for name, lam, client, credit in (
            ("no_memory", None, None, False),
            ("semantic", 1.0, c, False),
            ("hybrid", None, c, True),
        ):
            before = set(await asyncio.to_thread(scan, stack, dim)) if client else set()
            scores, wins, waited = [], 0, 0.0
            for r in range(cfg.loop_repeats):
                for task, vs in played.test_variations.items():
                    for v in vs:
                        tr: list[dict[str, Any]] = []
                        sc, ok = await loop_episode(
                            sw, client, task, v, lam, cfg, name, tr, r, credit=credit
                        )
                        traces[f"{name}:{task}:{v}" + (f":r{r}" if r else "")] = tr
                        scores.append(sc)
                        wins += ok
                        if credit and cfg.credit_between == "settled":
                            waited += await asyncio.to_thread(credit_settled, stack)
            if client is not None:  # rows the condition's episodes removed (demoted
                # and evicted after blame; a later condition would not find them)
                after = set(await asyncio.to_thread(scan, stack, dim))
                res[f"loop_store_removed_{name}"] = len(before - after)
            per[name] = scores
            if credit:
                res[f"loop_credit_wait_s_{name}"] = round(waited, 1)
            res[f"success_{name}"] = round(wins / max(len(scores), 1), 4)
            res[f"score_{name}"] = round(sum(scores) / max(len(scores), 1), 2)
            note(
                f"closed loop {name}: success {res[f'success_{name}']}, "
                f"mean score {res[f'score_{name}']}"
            )
    res["loop_episodes"] = len(per["no_memory"])
    res["loop_repeats"] = cfg.loop_repeats
    for a, b in (("hybrid", "semantic"), ("hybrid", "no_memory"), ("semantic", "no_memory")):
        mean, se, won, lost = paired(per[a], per[b])
        res[f"score_diff_{a}_{b}"] = round(mean, 2)
        res[f"score_diff_{a}_{b}_se"] = round(se, 2)
        res[f"episodes_{a}_won_{b}"] = won
        res[f"episodes_{a}_lost_{b}"] = lost
    res["loop_scores"] = per
    res["loop_traces"] = traces
    return res


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    names = ["no_memory", "semantic", "hybrid"]
    axes[0].bar(names, [result[f"score_{n}"] for n in names], color=["#999", "#69c", "#c63"])
    axes[0].set_ylabel("mean final score (0-100)")
    axes[0].set_title("closed loop on test variations")
    keys = [
        ("store_all", "store-all cosine"),
        ("semantic_stored", "cosine over stored"),
        ("dmem", "dmem default"),
    ]
    axes[1].bar(
        [lbl for _, lbl in keys],
        [result[f"hit_at_5_{k}"] for k, _ in keys],
        color=["#999", "#69c", "#c63"],
    )
    axes[1].set_ylabel("tie-aware hit@5")
    axes[1].set_ylim(0, 1)
    axes[1].set_title(f"{result['probes']} probes from unseen variations")
    fig.suptitle(f"dmem bench sciworld --env {result.get('env', 'sciworld')}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(cfg: SciConfig, as_json: bool) -> dict[str, Any]:
    """Run the benchmark; SIGTERM/SIGHUP stop every process it started."""
    with cleanup_on_signals():
        return _main(cfg, as_json)


def _main(cfg: SciConfig, as_json: bool) -> dict[str, Any]:
    from milvus import EmbeddedMilvusServer

    t0 = time.monotonic()
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    data = Path(tempfile.mkdtemp(prefix="dmem-bench-sciworld-"))
    sw = make_world(cfg)
    server = EmbeddedMilvusServer(data / "milvus", stop_grace_s=5)
    stack: LocalStack | None = None
    try:
        note(f"bench sciworld: playing {len(cfg.tasks)} tasks ...")
        played = cached_play(sw, cfg)
        steps = {step_id(st): st for ep in played.train for st in ep.steps}
        note(f"bench sciworld: {len(steps)} steps; starting Milvus, broker + worker ...")
        uri = server.start(timeout_s=180)
        env = {
            "DMEM_ENCODER__NAME": cfg.encoder,
            "DMEM_APP_ID": "dmem-bench-sciworld",
            "DMEM_WRITE__BATCH_WITHIN_S": "0.1",
            "DMEM_MILVUS__URI": uri,
            # the README's dedup threshold for each encoder (0.95 is tuned for hash)
            "DMEM_MAINTENANCE__DEDUP_TAU": str(DEDUP_TAU_BY_ENCODER.get(cfg.encoder, 0.95)),
        }
        stack = LocalStack(data, roles=("all",), extra_env=env)
        stack.start()
        result = asyncio.run(_run(stack, sw, played, steps, cfg))
    finally:
        if stack is not None:
            stack.stop()
        server.stop()
        sw.close()
        shutil.rmtree(data, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - t0, 1)
    plot(result, cfg.out_dir / f"{cfg.env}.png")
    loop = result.pop("loop_scores")
    traces = result.pop("loop_traces")
    (cfg.out_dir / f"{cfg.env}.json").write_text(
        json.dumps({"result": result, "loop": loop, "loop_traces": traces})
    )
    note(f"plot: {cfg.out_dir / (cfg.env + '.png')}")
    emit_json(result) if as_json else note(json.dumps(result, indent=2))
    return result


async def _run(
    stack: LocalStack, sw: World, played: Played, steps: dict[str, Step], cfg: SciConfig
) -> dict[str, Any]:
    from operators import build_encoder

    s = stack.settings
    assert stack.bootstrap is not None
    t0_ms = int(time.time() * 1000) - 10 * len(steps)
    transitions = [to_transition(st, i, t0_ms) for i, st in enumerate(steps.values())]
    encoder = build_encoder(cfg.encoder, s.encoder.dim)
    async with Client(
        stack.bootstrap, TENANT, topic_prefix=s.kafka.topic_prefix, timeout_s=20
    ) as c:
        # episode by episode, in play order, each one processed before the next is
        # sent: the write path's micro-batches (and so its TD updates and gate
        # decisions) then do not depend on how fast this machine is (as the demo's
        # lockstep chunks; without it the same TextWorldExpress stream gave 7 to 51
        # buffer rows, BENCHMARKS.md)
        sent = int(health(stack).get("write", {}).get("processed", 0))
        for ep in played.train:
            mine = [t for t in transitions if t.episode_id == ep.episode]
            for part in [[t] for t in mine] if cfg.publish == "step" else [mine]:
                sent += await c.publish_many(part)
                await wait_processed(stack, sent, poll_s=0.02)
        gate_rows = await asyncio.to_thread(scan, stack, encoder.dim)
        gate = store_stats(gate_rows, steps)
        note(f"gate: {gate}")
        for ep in played.train:
            await c.report_outcome(
                ep.episode, reward=float(max(ep.final_score, 0)), agent_id=AGENT, task=ep.task
            )
        final_rows = await settle(stack, encoder.dim, cfg.settle_s)
        final = store_stats(final_rows, steps)
        note(f"final: {final}")
        # the most rows one task holds: a task-filtered search sees all of them when
        # this is within its ANN pool (max(4k, 32)), so no cut through exact ties
        per_task: dict[str, int] = defaultdict(int)
        for i in final_rows:
            if i in steps:
                per_task[steps[i].task] += 1
        probes = probes_of(played.test)
        http = f"http://127.0.0.1:{stack.web_ports[0]}"
        async with Client(
            stack.bootstrap, TENANT, transport="http", http_url=http, timeout_s=20
        ) as h:
            dump: list[dict[str, Any]] = []
            ranking = await run_probes(h, encoder, probes, steps, final_rows, dump)
        (cfg.out_dir / f"{cfg.env}-probes.json").write_text(json.dumps(dump, indent=1))
    loop = await closed_loop(sw, stack, played, cfg, encoder.dim)
    n = len(steps)
    return {
        "env": cfg.env,
        "publish": cfg.publish,
        "tasks": len(cfg.tasks),
        "episodes": len(played.train),
        "published": n,
        "critical_rate": round(sum(st.critical for st in steps.values()) / max(n, 1), 4),
        "storage_ratio_gate": round(gate["stored"] / max(n, 1), 4),
        "critical_coverage_gate": round(gate["critical_coverage"], 4),
        "reward_up_coverage_gate": round(gate["reward_up_coverage"], 4),
        "stored_core_gate": gate["core"],
        "stored_buffer_gate": gate["buffer"],
        "precision_core_gate": round(gate["precision_core"], 4),
        "failed_episodes": gate["failed_episodes"],
        "failure_terminal_silent": gate["failure_terminal_silent"],
        "failure_terminal_coverage_gate": round(gate["failure_terminal_coverage"], 4),
        "storage_ratio_final": round(final["stored"] / max(n, 1), 4),
        "critical_coverage_final": round(final["critical_coverage"], 4),
        "reward_up_coverage_final": round(final["reward_up_coverage"], 4),
        "stored_core_final": final["core"],
        "stored_buffer_final": final["buffer"],
        "precision_core_final": round(final["precision_core"], 4),
        "failure_terminal_coverage_final": round(final["failure_terminal_coverage"], 4),
        "stored_max_per_task": max(per_task.values(), default=0),
        "probes": len(probes),
        **ranking,
        **loop,
        "encoder": cfg.encoder,
        "seed": cfg.seed,
    }
