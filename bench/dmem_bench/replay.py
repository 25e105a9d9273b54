"""`dmem bench replay`: one real stream, live and 400 days in the past, through the
embedded stack with every job enabled; nothing may be lost to the clock or to a merge.

The stream: an epsilon-greedy Q-learning agent in a Gymnasium toy_text world
(`dmem_bench.demo.q_learning_transitions`, fixed seed; CliffWalking by default) with an
`EpisodeOutcome` (the episode's return) after each episode. Run 1 (live) stamps
every transition with the wall clock when it is published and records the stamps;
run 2 (shifted) publishes the same transitions with those stamps minus 400 days (a
logged run replayed a year later). Each run: a fresh embedded stack (broker, one
worker with every role: write path, hindsight, responder, credit, maintenance, Milvus
Lite) with the default job settings; transitions go out in lockstep chunks of the
worker's batch size (each awaited on ``dmem.memories``, as in the demo, so both runs
see identical micro-batches), each chunk's finished episodes' outcomes after it
(awaited until the hindsight agent has processed them), and the next chunk only once
the jobs have settled (`dmem wait --settled`): the dedup job clusters greedily, so
near-duplicate chains (a ~ b ~ c, a !~ c) fold into different survivors when rows
arrive in a different order, and lockstep gives both runs the same processing order
(without it: Jaccard 0.96 at 3,000 steps, every other number equal). After the last
chunk the bench waits until every worker reports ``settled`` (``settle_s``), reads the
store and the memory events.

The last stdout line (``--json``) has the contract keys: ``published``,
``stored_live``, ``stored_shifted``, ``same_ids_ratio`` (Jaccard of the two stored id
sets), ``critical_live`` (stored critical memories of the live run:
`operators.dedup.is_critical`, reward != 0 or terminal, counted with what they
stand for), ``critical_merged_away`` (both runs: critical transitions folded into a
survivor that is not critical or whose reward differs beyond the tolerance),
``merges`` (live), ``merges_across_reward`` (both runs), ``evicted_live``,
``evicted_shifted``, ``settle_s`` (the slower run: from the last published record to
settled), plus ``routes_same`` and each run's details.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dmem.importer import wait_committed
from dmem.wait import wait_settled
from dmem_bench.common import (
    Progress,
    emit_json,
    machine_info,
    note,
    print_table,
    publish_lockstep,
    teardown,
)
from operators.decay import DAY_MS
from operators.dedup import is_critical, rewards_agree
from operators.encoders import encoder_dim
from schemas import EpisodeOutcome, Transition, encode
from schemas.errors import ServiceUnavailable
from streams.admin import kafka_client_kwargs
from streams.local.stack import LocalStack
from streams.settings import Settings

__all__ = ["emit_json", "run"]

CHUNK = 256
TENANT = "replay"
SHIFT_MS = -400 * DAY_MS


def make_stream(env_name: str, steps: int, seed: int) -> list[Transition | EpisodeOutcome]:
    """The transitions with each episode's outcome (its return) right after its last step."""
    from dmem_bench.demo import q_learning_transitions

    out: list[Transition | EpisodeOutcome] = []
    ret = 0.0
    for tr, _, _ in q_learning_transitions(env_name, steps, seed, tenant=TENANT):
        prev = next((x for x in reversed(out) if isinstance(x, Transition)), None)
        if prev is not None and prev.episode_id != tr.episode_id:  # it ended (or timed out)
            out.append(EpisodeOutcome(tenant=TENANT, episode_id=prev.episode_id,
                                      agent_id=prev.agent_id, reward=ret))  # fmt: skip
            ret = 0.0
        out.append(tr)
        ret += tr.reward
    return out


async def _drive(settings: Settings, url: str, stream: list[Transition | EpisodeOutcome],
                 stamps: list[int] | None, alive: Any) -> dict[str, Any]:  # fmt: skip
    """Publish in lockstep; returns the stamps used, the routes and the last publish time."""
    kw = kafka_client_kwargs(settings.kafka)
    producer = AIOKafkaProducer(linger_ms=5, **kw)
    consumer = AIOKafkaConsumer(settings.topic("memories"), auto_offset_reset="earliest",
                                enable_auto_commit=False, fetch_max_wait_ms=20, **kw)  # fmt: skip
    await producer.start()
    await consumer.start()
    routes: dict[str, str] = {}
    used: list[int] = []
    n_tr = sum(isinstance(x, Transition) for x in stream)
    progress = Progress("published", n_tr)
    published = 0
    i = 0
    try:
        while i < len(stream):
            chunk: list[Transition] = []
            outcomes: list[EpisodeOutcome] = []
            while i < len(stream) and len(chunk) < CHUNK:
                item = stream[i]
                i += 1
                if isinstance(item, Transition):
                    ts = int(time.time() * 1000) if stamps is None else stamps[len(used)]
                    used.append(ts)
                    chunk.append(item.model_copy(update={"ts": ts}))
                else:
                    outcomes.append(item.model_copy(update={"ts": used[-1]}))
            while i < len(stream) and isinstance(stream[i], EpisodeOutcome):
                item = stream[i]
                assert isinstance(item, EpisodeOutcome)
                outcomes.append(item.model_copy(update={"ts": used[-1]}))
                i += 1
            published += len(chunk)

            def on_event(m: Any) -> None:
                ev = orjson.loads(m.value)
                if ev["kind"] in ("written", "dropped") and ev["reason"] != "retrospective":
                    routes.setdefault(ev["memory_id"], str(ev["route"]))

            def answered(n: int = published) -> bool:
                return len(routes) >= n

            await publish_lockstep(producer, consumer, settings.topic("transitions"), chunk,
                                   answered, on_event, alive)  # fmt: skip
            ends: dict[TopicPartition, int] = {}
            for o in outcomes:  # the hindsight agent re-scores them before the next chunk
                md = await (await producer.send(settings.topic("feedback"), encode(o),
                                                key=o.episode_id.encode()))  # fmt: skip
                tp = TopicPartition(md.topic, md.partition)
                ends[tp] = max(ends.get(tp, 0), md.offset + 1)
            # faust's group (the app id) commits what the hindsight agent has processed
            if ends and not await wait_committed(settings, settings.app_id, ends, 120):
                raise ServiceUnavailable("the hindsight agent did not take the outcomes")
            if i < len(stream):  # lockstep for the jobs too (see the module doc)
                await asyncio.to_thread(wait_settled, [url], 300.0, 0.5)
            progress.update(published)
    finally:
        await producer.stop()
        await consumer.stop()
    return {"stamps": used, "routes": routes, "published": published,
            "last_publish": time.monotonic()}  # fmt: skip


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
                ends = await c.end_offsets(list(c.assignment()))
            positions = {tp: await c.position(tp) for tp in ends}
            if all(positions[tp] >= end for tp, end in ends.items()):
                return out
    finally:
        await c.stop()


def one_run(label: str, stream: list[Transition | EpisodeOutcome], stamps: list[int] | None,
            encoder: str | None, seed: int) -> dict[str, Any]:  # fmt: skip
    from milvus import MemoryStore

    tmp = Path(tempfile.mkdtemp(prefix=f"dmem-bench-replay-{label}-"))
    env = {
        "DMEM_APP_ID": f"dmem-bench-replay-{seed}",
        "DMEM_WRITE__BATCH_SIZE": str(CHUNK),
        "DMEM_WRITE__BATCH_WITHIN_S": "5",
        "DMEM_WRITE__LINGER_S": "5",  # a lockstep chunk is exactly one micro-batch
    }
    if encoder:
        env["DMEM_ENCODER__NAME"] = encoder
    stack = LocalStack(tmp, roles=("all",), extra_env=env)
    failed = True
    try:
        note(f"run {label}: embedded broker + one worker (every role, Milvus Lite) ...")
        stack.start()
        settings = stack.settings
        worker, port = stack.workers[0], stack.web_ports[0]
        url = f"http://127.0.0.1:{port}"
        res = asyncio.run(_drive(settings, url, stream, stamps, lambda: worker.alive))
        note(f"  run {label}: all published; waiting until every job has settled ...")
        wait_settled([url], timeout_s=600, quiet_s=1.0)
        settle_s = time.monotonic() - res["last_publish"]
        events = asyncio.run(_events(settings))
        stack.stop_workers()
        dim = encoder_dim(settings.encoder.name, settings.encoder.dim)
        store = MemoryStore(settings.milvus_uri, collection=settings.milvus.collection,
                            dim=dim).connect()  # fmt: skip
        try:
            rows = {r["id"]: r for r in store.scan(tenant=TENANT, output_fields=[
                "id", "reward", "merged_count", "metadata", "partition"])}  # fmt: skip
        finally:
            store.close()
        policy_tol = settings.maintenance.dedup_reward_tol
        failed = False
    finally:
        teardown(stack, None, tmp, failed)
    return {"res": res, "events": events, "rows": rows, "settle_s": settle_s,
            "tol": policy_tol}  # fmt: skip


def judge(run: dict[str, Any], stream: list[Transition | EpisodeOutcome]) -> dict[str, Any]:
    """Merges, losses and counts of one run (see the module doc)."""
    by_id = {t.memory_id: t for t in stream if isinstance(t, Transition)}
    rows, tol = run["rows"], run["tol"]
    into: dict[str, str] = {}
    evicted = 0
    for ev in run["events"]:
        if ev["kind"] == "merged" and ev.get("reason", "").startswith("into "):
            into[ev["memory_id"]] = ev["reason"].split()[1]
        elif ev["kind"] == "evicted":
            evicted += 1

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
        "written": sum(1 for r in run["res"]["routes"].values() if r != "drop"),
        "settle_s": round(run["settle_s"], 2),
    }


def run(steps: int = 3000, env_name: str = "cliffwalking", seed: int = 7,
        encoder: str | None = None) -> dict[str, Any]:  # fmt: skip
    stream = make_stream(env_name, steps, seed)
    t0 = time.monotonic()
    live = one_run("live", stream, None, encoder, seed)
    shifted_stamps = [ts + SHIFT_MS for ts in live["res"]["stamps"]]
    shifted = one_run("shifted", stream, shifted_stamps, encoder, seed)
    a, b = judge(live, stream), judge(shifted, stream)
    ids_a, ids_b = set(live["rows"]), set(shifted["rows"])
    union = ids_a | ids_b
    out = {
        "published": live["res"]["published"],
        "outcomes": sum(isinstance(x, EpisodeOutcome) for x in stream),
        "stored_live": a["stored"],
        "stored_shifted": b["stored"],
        "same_ids_ratio": round(len(ids_a & ids_b) / len(union), 4) if union else 1.0,
        "same_partitions": all(
            live["rows"][i]["partition"] == shifted["rows"][i]["partition"] for i in ids_a & ids_b
        ),
        "routes_same": live["res"]["routes"] == shifted["res"]["routes"],
        "critical_live": a["critical"],
        "critical_merged_away": a["critical_merged_away"] + b["critical_merged_away"],
        "merges": a["merges"],
        "merges_across_reward": a["merges_across_reward"] + b["merges_across_reward"],
        "evicted_live": a["evicted"],
        "evicted_shifted": b["evicted"],
        "settle_s": max(a["settle_s"], b["settle_s"]),
        "shift_days": SHIFT_MS // DAY_MS,
        "live": a,
        "shifted": b,
        "env": env_name,
        "steps": steps,
        "seed": seed,
        "encoder": encoder or Settings().encoder.name,
        "elapsed_s": round(time.monotonic() - t0, 1),
        "machine": machine_info(),
    }
    print_table("dmem bench replay", ["metric", "live", "shifted 400 d"], [
        ("stored", a["stored"], b["stored"]),
        ("merges", a["merges"], b["merges"]),
        ("merges across reward", a["merges_across_reward"], b["merges_across_reward"]),
        ("critical merged away", a["critical_merged_away"], b["critical_merged_away"]),
        ("evicted", a["evicted"], b["evicted"]),
        ("settle s", a["settle_s"], b["settle_s"]),
        ("same ids (Jaccard)", out["same_ids_ratio"], ""),
    ])  # fmt: skip
    return out
