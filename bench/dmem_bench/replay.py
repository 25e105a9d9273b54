"""`dmem bench replay`: the same stream makes the same memory, however it is processed.

Two streams, each with fixed event times:

- ``rewarded``: an epsilon-greedy Q-learning agent in a Gymnasium toy_text world
  (`dmem_bench.demo.q_learning_transitions`, fixed seed; CliffWalking by default), one
  step a second of event time; after each episode the agent's usage records (it acted on
  the memories of its `USED_STEPS` worst and last steps, ``source="agent"``) and its
  `EpisodeOutcome` (the return), stamped with the episode's last event time;
- ``chat``: a two-person conversation (`make_chat`, fixed seed) of sessions three days
  apart, a turn every 40 s, mapped by `dmem.client.chat_transitions`; people repeat
  themselves, so dedup has work.

Each stream goes through a fresh embedded stack (broker, one worker with every role:
write path, hindsight, responder, credit, maintenance, Milvus Lite; product defaults)
once per variant (`VARIANTS`):

- ``full``: every record published at full speed, in stream order;
- ``one``: one record at a time, each awaited (a transition until its ``memories``
  event, an outcome until the hindsight agent committed it);
- ``restart``: the first half at full speed, the worker stopped, the second half
  published while it is down, the worker started again: it reads the rest in bulk;
- ``shifted``: as ``full`` with every event time 400 days earlier;
- ``hog``: as ``full`` with a process spinning a core beside the stack;
- ``import``: the stream written to a JSON-lines log and published by ``dmem import``;
- ``lockstep`` and ``lockstep-shifted`` (not run by default): groups of `LOCKSTEP`
  transitions, each one micro-batch, its outcomes after it, the next group once the jobs
  settled: every run sees the same micro-batches, live and 400 days back.

After each run the bench waits until every job has settled and reads the store and the
``memories`` events. Between every pair of runs of a stream: the Jaccard similarity of
the stored ids, of the (id, partition) pairs, and the largest utility difference of a
memory stored by both.

The last stdout line (``--json``) has the contract keys: ``runs`` (the variants),
``same_ids_min`` and ``same_partitions_min`` (the smallest pairwise Jaccard over both
streams), ``utility_max_diff``, ``same_routes_min`` (the write path's own share: the
smallest pairwise share of transitions the gate routed alike), ``critical_merged_away``
(every run: critical transitions folded into a survivor that is not critical or whose
reward differs beyond the tolerance), ``merges_across_reward`` (every run), and from
the rewarded stream's ``lockstep`` and ``lockstep-shifted`` runs when they ran, else its
``full`` and ``shifted`` runs: ``published``, ``stored_live``, ``stored_shifted``,
``same_ids_ratio``, ``same_partitions``, ``routes_same``, ``critical_live``,
``merges``, ``evicted_live``, ``evicted_shifted``; ``settle_s`` (the slowest run: last
published record to settled); per stream, each run's details and the pairwise table.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dmem.client import ChatTurn, chat_transitions
from dmem.importer import run_import, wait_committed
from dmem.wait import wait_settled
from dmem_bench.common import emit_json, machine_info, note, print_table, teardown
from operators.decay import DAY_MS
from operators.dedup import is_critical, rewards_agree
from operators.encoders import encoder_dim
from schemas import DECISION_KINDS, EpisodeOutcome, MemoryUsage, Transition, encode
from schemas.errors import ServiceUnavailable
from streams.admin import ReadEnds, kafka_client_kwargs
from streams.local.stack import LocalStack
from streams.settings import Settings

__all__ = ["STREAMS", "VARIANTS", "emit_json", "make_chat", "make_stream", "pairwise", "run"]

TENANT = "replay"
SHIFT_MS = -400 * DAY_MS
BASE_TS = 1_764_547_200_000  # 2025-12-01T00:00Z: event times are part of the stream
STEP_MS = 1_000
USED_STEPS = 4
VARIANTS = ("full", "one", "restart", "shifted", "hog", "import", "lockstep", "lockstep-shifted")
DEFAULT_VARIANTS = VARIANTS[:6]
LOCKSTEP = 256
STREAMS = ("rewarded", "chat")
Record = Transition | EpisodeOutcome | MemoryUsage


def make_stream(env_name: str, steps: int, seed: int) -> list[Record]:
    """The agent's transitions (a step a second), and after each episode its usage
    records and its outcome (the return), at the episode's last event time."""
    from dmem_bench.demo import q_learning_transitions

    out: list[Record] = []
    episode: list[Transition] = []

    def close() -> None:
        last = episode[-1]
        # it acted on what it remembered of its most painful steps and its last ones
        worst = sorted(episode, key=lambda t: (t.reward, t.step))[:USED_STEPS]
        used = sorted({t.step: t for t in worst + episode[-USED_STEPS:]}.values(),
                      key=lambda t: t.step)  # fmt: skip
        for tr in used:
            out.append(MemoryUsage(tenant=TENANT, episode_id=last.episode_id,
                                   request_id=f"{tr.episode_id}:{tr.step}",
                                   agent_id=last.agent_id, step=tr.step,
                                   memory_ids=[tr.memory_id], weights=[1.0], ts=last.ts or 0,
                                   source="agent"))  # fmt: skip
        out.append(EpisodeOutcome(tenant=TENANT, episode_id=last.episode_id,
                                  agent_id=last.agent_id, ts=last.ts,
                                  reward=sum(t.reward for t in episode)))  # fmt: skip
        episode.clear()

    for i, (tr, _, _) in enumerate(q_learning_transitions(env_name, steps, seed, tenant=TENANT)):
        if episode and episode[-1].episode_id != tr.episode_id:  # it ended (or timed out)
            close()
        tr = tr.model_copy(update={"ts": BASE_TS + i * STEP_MS})
        out.append(tr)
        episode.append(tr)
    if episode:
        close()
    return out


PEOPLE = ("Ana", "Ben")
FACTS = (
    "I adopted a {pet} called {name} last week",
    "my sister is moving to {city} in {month}",
    "I signed up for a {sport} class on {day}s",
    "the {pet} chewed my {thing} again",
    "I'm reading a book about {topic} for my club",
    "we booked the trip to {city} for {month}",
    "work sent me to a {topic} training on {day}",
)
SLOTS = {
    "pet": ("dog", "cat", "parrot", "rabbit"),
    "name": ("Rex", "Miso", "Kiwi", "Bruno"),
    "city": ("Lisbon", "Osaka", "Denver", "Tunis"),
    "month": ("March", "June", "October"),
    "sport": ("climbing", "swimming", "salsa"),
    "day": ("Monday", "Thursday", "Saturday"),
    "thing": ("shoes", "charger", "headphones"),
    "topic": ("volcanoes", "tax law", "medieval cooking", "sleep"),
}
SMALL_TALK = ("haha ok", "cool", "same here", "sounds good", "lol", "really?")


def make_chat(turns: int, seed: int, per_session: int = 12) -> list[Record]:
    """A conversation of `turns` turns: facts, facts said again (verbatim or nearly),
    small talk; sessions three days apart, a turn every 40 s."""
    rng = random.Random(seed)
    said: list[str] = []
    out: list[Record] = []
    for session in range((turns + per_session - 1) // per_session):
        start = BASE_TS + session * 3 * DAY_MS
        chat = []
        for j in range(min(per_session, turns - session * per_session)):
            roll = rng.random()
            if said and roll < 0.3:  # a repeat: verbatim, or with a word more
                text = rng.choice(said) + rng.choice(("", "", " btw", " again"))
            elif roll < 0.55:
                text = rng.choice(SMALL_TALK)
            else:
                tmpl = rng.choice(FACTS)
                text = tmpl.format(**{k: rng.choice(v) for k, v in SLOTS.items()})
                said.append(text)
            chat.append(ChatTurn(speaker=PEOPLE[j % 2], text=text, ts=start + j * 40_000))
        out += chat_transitions(chat, tenant=TENANT, conversation="pair", session=session)
    return out


def _shifted(stream: list[Record], shift_ms: int) -> list[Record]:
    return [r.model_copy(update={"ts": (r.ts or 0) + shift_ms}) for r in stream]


def _route(settings: Settings, rec: Record) -> tuple[str, bytes]:
    if isinstance(rec, Transition):
        return settings.topic("transitions"), rec.agent_id.encode()
    if isinstance(rec, MemoryUsage):
        return settings.topic("usage"), rec.episode_id.encode()
    return settings.topic("feedback"), rec.episode_id.encode()


def _groups(records: list[Record], chunk: int) -> list[list[Record]]:
    """Up to `chunk` transitions each, with the records that follow them up to the next
    transition (usage and outcomes stay behind their episode)."""
    out: list[list[Record]] = []
    n = chunk  # transitions in the current group
    for rec in records:
        if isinstance(rec, Transition) and n >= chunk:
            out.append([])
            n = 0
        if not out:
            out.append([])
        out[-1].append(rec)
        n += isinstance(rec, Transition)
    return out


async def _publish(settings: Settings, records: list[Record], chunk: int | None = None,
                   settle_url: str | None = None) -> None:  # fmt: skip
    """Publish in stream order: at full speed, or in groups of `chunk` transitions, each
    awaited (its transitions until their ``memories`` events, then its outcomes until
    the hindsight agent committed them, then, with `settle_url`, until the jobs settled)."""
    kw = kafka_client_kwargs(settings.kafka)
    producer = AIOKafkaProducer(linger_ms=5, **kw)
    await producer.start()
    consumer = None
    seen: set[str] = set()
    if chunk is not None:
        consumer = AIOKafkaConsumer(
            settings.topic("memories"),
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=20,
            **kw,
        )
        await consumer.start()
    try:
        if consumer is None or chunk is None:
            for rec in records:
                topic, key = _route(settings, rec)
                await producer.send(topic, encode(rec), key=key)
            await producer.flush()
            return
        for group in _groups(records, chunk):
            trs = [r for r in group if isinstance(r, Transition)]
            for tr in trs:
                topic, key = _route(settings, tr)
                await producer.send(topic, encode(tr), key=key)
            await producer.flush()
            deadline = time.monotonic() + 180
            while any(tr.memory_id not in seen for tr in trs):
                if time.monotonic() > deadline:
                    raise ServiceUnavailable("the write path stopped answering")
                for msgs in (await consumer.getmany(timeout_ms=200)).values():
                    seen.update(orjson.loads(m.value)["memory_id"] for m in msgs)
            for rec in group:
                if isinstance(rec, Transition):
                    continue
                topic, key = _route(settings, rec)
                md = await (await producer.send(topic, encode(rec), key=key))
                if isinstance(rec, EpisodeOutcome):
                    ends = {TopicPartition(md.topic, md.partition): md.offset + 1}
                    if not await wait_committed(settings, settings.app_id, ends, 120):
                        raise ServiceUnavailable("the hindsight agent did not take the outcome")
            if settle_url is not None:
                await asyncio.to_thread(wait_settled, [settle_url], 300.0, 0.5)
    finally:
        await producer.stop()
        if consumer is not None:
            await consumer.stop()


async def _events(settings: Settings) -> list[dict[str, Any]]:
    """Every event on ``dmem.memories`` so far."""
    c = AIOKafkaConsumer(
        settings.topic("memories"),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **kafka_client_kwargs(settings.kafka),
    )
    await c.start()
    out: list[dict[str, Any]] = []
    try:
        ends = None
        while True:
            batch = await c.getmany(timeout_ms=1000, max_records=10_000)
            for msgs in batch.values():
                out += [orjson.loads(m.value) for m in msgs]
            if ends is None:
                ends = ReadEnds(await c.end_offsets(list(c.assignment())))
            positions = {tp: await c.position(tp) for tp in ends.ends}
            if all(positions[tp] >= ends.of(c, tp) for tp in ends.ends):
                return out
    finally:
        await c.stop()


def _spin() -> None:  # pragma: no cover - runs in the hog process
    while True:
        pass


def _import(settings: Settings, records: list[Record], tmp: Path) -> None:
    path = tmp / "log.jsonl"
    kinds = {Transition: "transition", EpisodeOutcome: "outcome", MemoryUsage: "usage"}
    path.write_bytes(b"".join(orjson.dumps({"type": kinds[type(r)], **r.model_dump(
        mode="json", exclude_none=True)}) + b"\n" for r in records))  # fmt: skip
    rep = run_import(settings, path)
    if rep.invalid:
        raise ValueError(f"the import refused {rep.invalid} lines: {rep.errors[:3]}")


def one_run(stream_name: str, variant: str, records: list[Record], encoder: str | None,
            seed: int) -> dict[str, Any]:  # fmt: skip
    """One fresh stack, one variant; the stored rows and the ``memories`` events."""
    from milvus import MemoryStore

    tmp = Path(tempfile.mkdtemp(prefix=f"dmem-bench-replay-{stream_name}-{variant}-"))
    env = {"DMEM_APP_ID": f"dmem-bench-replay-{seed}"}
    if variant.startswith("lockstep"):  # a group is exactly one micro-batch
        env.update(DMEM_WRITE__BATCH_SIZE=str(LOCKSTEP), DMEM_WRITE__BATCH_WITHIN_S="5",
                   DMEM_WRITE__LINGER_S="5")  # fmt: skip
    if encoder:
        env["DMEM_ENCODER__NAME"] = encoder
    stack = LocalStack(tmp, roles=("all",), extra_env=env)
    hog = None
    failed = True
    try:
        note(f"{stream_name} / {variant}: embedded broker + one worker (every role) ...")
        stack.start()
        settings = stack.settings
        if variant == "hog":
            hog = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
            hog.start()
        t0 = time.monotonic()
        url = f"http://127.0.0.1:{stack.web_ports[0]}"
        if variant == "one":
            asyncio.run(_publish(settings, records, chunk=1))
        elif variant.startswith("lockstep"):
            shift = SHIFT_MS if variant.endswith("shifted") else 0
            asyncio.run(_publish(settings, _shifted(records, shift), LOCKSTEP, url))
        elif variant == "restart":
            half = len(records) // 2
            asyncio.run(_publish(settings, records[:half]))
            wait_settled([f"http://127.0.0.1:{stack.web_ports[0]}"], 600.0, 1.0)
            stack.stop_workers()
            asyncio.run(_publish(settings, records[half:]))
            stack.wait_ready(stack.start_worker("all"))
        elif variant == "import":
            _import(settings, records, tmp)
        else:
            shift = SHIFT_MS if variant == "shifted" else 0
            asyncio.run(_publish(settings, _shifted(records, shift) if shift else records))
        published = time.monotonic()
        wait_settled([f"http://127.0.0.1:{stack.web_ports[0]}"], 900.0, 1.0)
        settle_s = time.monotonic() - published
        elapsed_s = time.monotonic() - t0
        events = asyncio.run(_events(settings))
        stack.stop_workers()
        dim = encoder_dim(settings.encoder.name, settings.encoder.dim)
        store = MemoryStore(settings.milvus_uri, collection=settings.milvus.collection,
                            dim=dim).connect()  # fmt: skip
        try:
            rows = {
                r["id"]: r
                for r in store.scan(
                    tenant=TENANT,
                    output_fields=[
                        "id",
                        "reward",
                        "merged_count",
                        "metadata",
                        "partition",
                        "utility",
                        "uses",
                    ],
                )
            }
        finally:
            store.close()
        tol = settings.maintenance.dedup_reward_tol
        failed = False
    finally:
        if hog is not None:
            hog.kill()
            hog.join()
        teardown(stack, None, tmp, failed)
    return {"events": events, "rows": rows, "settle_s": settle_s, "tol": tol,
            "elapsed_s": elapsed_s}  # fmt: skip


def judge(run: dict[str, Any], stream: list[Record]) -> dict[str, Any]:
    """Merges, losses and counts of one run (see the module doc)."""
    by_id = {t.memory_id: t for t in stream if isinstance(t, Transition)}
    rows, tol = run["rows"], run["tol"]
    into: dict[str, str] = {}
    routes: dict[str, str] = {}
    evicted = 0
    for ev in run["events"]:
        if ev["kind"] == "merged" and ev.get("reason", "").startswith("into "):
            into[ev["memory_id"]] = ev["reason"].split()[1]
        elif ev["kind"] == "evicted":
            evicted += 1
        elif ev["kind"] in DECISION_KINDS and ev["reason"] != "retrospective":
            routes.setdefault(ev["memory_id"], str(ev["route"]))

    def final(mid: str) -> str:
        seen = set()
        while mid in into and mid not in seen:
            seen.add(mid)
            mid = into[mid]
        return mid

    def facts(mid: str) -> dict[str, Any]:  # the survivor as stored, else as published
        if mid in rows:
            return rows[mid]
        t = by_id.get(mid)
        return {"reward": t.reward if t else 0.0, "metadata": {"done": bool(t and t.done)}}

    lost = across = 0
    for member, survivor in into.items():
        t = by_id.get(member)
        r_m = t.reward if t else 0.0
        m = {"reward": r_m, "metadata": {"done": bool(t and t.done)}}
        s = facts(final(survivor))
        r_s = float(s.get("reward", 0.0))
        agree = rewards_agree(min(r_m, r_s), max(r_m, r_s), tol)
        across += not agree
        if is_critical(m) and (not is_critical(s) or not agree):
            lost += 1
    critical_rows = [r for r in rows.values() if is_critical(r)]
    return {
        "stored": len(rows),
        "stored_core": sum(r["partition"] == "core" for r in rows.values()),
        "critical": sum(int(r.get("merged_count", 1) or 1) for r in critical_rows),
        "critical_rows": len(critical_rows),
        "critical_merged_away": lost,
        "merges": len(into),
        "merges_across_reward": across,
        "evicted": evicted,
        "written": sum(1 for r in routes.values() if r != "drop"),
        "routes": routes,
        "utility_nonzero": sum(float(r.get("utility") or 0.0) != 0.0 for r in rows.values()),
        "settle_s": round(run["settle_s"], 2),
        "elapsed_s": round(run["elapsed_s"], 1),
    }


def pairwise(rows: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """For every pair of runs (variant -> stored rows by id): Jaccard of the ids, of the
    (id, partition) pairs, and the largest utility difference on the common ids."""
    out = []
    for a, b in itertools.combinations(rows, 2):
        ra, rb = rows[a], rows[b]
        ids_a, ids_b = set(ra), set(rb)
        parts_a = {(i, r["partition"]) for i, r in ra.items()}
        parts_b = {(i, r["partition"]) for i, r in rb.items()}
        common = ids_a & ids_b
        diff = max((abs(float(ra[i].get("utility") or 0.0) - float(rb[i].get("utility") or 0.0))
                    for i in common), default=0.0)  # fmt: skip
        out.append(
            {
                "a": a,
                "b": b,
                "same_ids": _jaccard(ids_a, ids_b),
                "same_partitions": _jaccard(parts_a, parts_b),
                "utility_diff": diff,
            }
        )
    return out


def _jaccard(a: set[Any], b: set[Any]) -> float:
    return round(len(a & b) / len(a | b), 4) if a | b else 1.0


def run(steps: int = 600, env_name: str = "cliffwalking", seed: int = 7,
        encoder: str | None = None, chat_turns: int = 120,
        variants: tuple[str, ...] = DEFAULT_VARIANTS,
        streams: tuple[str, ...] = STREAMS) -> dict[str, Any]:  # fmt: skip
    t0 = time.monotonic()
    made = {"rewarded": lambda: make_stream(env_name, steps, seed),
            "chat": lambda: make_chat(chat_turns, seed)}  # fmt: skip
    per_stream: dict[str, Any] = {}
    judged_all: dict[str, dict[str, dict[str, Any]]] = {}
    for name in streams:
        stream = made[name]()
        runs = {v: one_run(name, v, stream, encoder, seed) for v in variants}
        judged = {v: judge(r, stream) for v, r in runs.items()}
        pairs = pairwise({v: r["rows"] for v, r in runs.items()})
        for p in pairs:  # the write path's own decisions (the gate's routes), for the cause
            ra, rb = judged[p["a"]]["routes"], judged[p["b"]]["routes"]
            keys = set(ra) | set(rb)
            p["same_routes"] = round(
                sum(ra.get(k) == rb.get(k) for k in keys) / max(1, len(keys)), 4
            )
        judged_all[name] = judged
        per_stream[name] = {
            "published": sum(isinstance(x, Transition) for x in stream),
            "outcomes": sum(isinstance(x, EpisodeOutcome) for x in stream),
            "same_ids_min": min((p["same_ids"] for p in pairs), default=1.0),
            "same_partitions_min": min((p["same_partitions"] for p in pairs), default=1.0),
            "utility_max_diff": max((p["utility_diff"] for p in pairs), default=0.0),
            "same_routes_min": min((p["same_routes"] for p in pairs), default=1.0),
            "runs": {v: {k: x for k, x in j.items() if k != "routes"} for v, j in judged.items()},
            "pairs": pairs,
            "rows": {v: r["rows"] for v, r in runs.items()},
        }
    every = [j for js in judged_all.values() for j in js.values()]
    out: dict[str, Any] = {
        "runs": list(variants),
        "streams": list(streams),
        "same_ids_min": min(s["same_ids_min"] for s in per_stream.values()),
        "same_partitions_min": min(s["same_partitions_min"] for s in per_stream.values()),
        "utility_max_diff": max(s["utility_max_diff"] for s in per_stream.values()),
        "same_routes_min": min(s["same_routes_min"] for s in per_stream.values()),
        "critical_merged_away": sum(j["critical_merged_away"] for j in every),
        "merges_across_reward": sum(j["merges_across_reward"] for j in every),
        "settle_s": max(j["settle_s"] for j in every),
    }
    main = per_stream.get("rewarded") or next(iter(per_stream.values()))
    js = judged_all.get("rewarded") or next(iter(judged_all.values()))
    # the legacy pair: lockstep when it ran (every run sees the same micro-batches)
    pair = ("lockstep", "lockstep-shifted") if "lockstep" in js else ("full", "shifted")
    live, shifted = js.get(pair[0]), js.get(pair[1])
    if live is not None and shifted is not None:
        rl, rs = main["rows"][pair[0]], main["rows"][pair[1]]
        common = set(rl) & set(rs)
        out.update({
            "published": main["published"], "outcomes": main["outcomes"],
            "stored_live": live["stored"], "stored_shifted": shifted["stored"],
            "same_ids_ratio": _jaccard(set(rl), set(rs)),
            "same_partitions": all(rl[i]["partition"] == rs[i]["partition"] for i in common),
            "routes_same": live["routes"] == shifted["routes"],
            "critical_live": live["critical"], "merges": live["merges"],
            "evicted_live": live["evicted"], "evicted_shifted": shifted["evicted"],
        })  # fmt: skip
    for s in per_stream.values():
        s.pop("rows")
    out.update({
        "per_stream": per_stream, "env": env_name, "steps": steps, "chat_turns": chat_turns,
        "seed": seed, "encoder": encoder or Settings().encoder.name,
        "elapsed_s": round(time.monotonic() - t0, 1), "machine": machine_info(),
    })  # fmt: skip
    for name, s in per_stream.items():
        print_table(f"dmem bench replay: {name}", ["variant", "stored", "core", "merges",
                    "evicted", "utility != 0", "settle s"], [
            (v, r["stored"], r["stored_core"], r["merges"], r["evicted"], r["utility_nonzero"],
             r["settle_s"]) for v, r in s["runs"].items()])  # fmt: skip
        note(
            f"  {name}: same ids (Jaccard) min {s['same_ids_min']}, same partitions min "
            f"{s['same_partitions_min']}, utility max diff {s['utility_max_diff']:.3g}, "
            f"same gate routes min {s['same_routes_min']}"
        )
    return out
