"""`dmem bench locomo --replay`: the write path's decisions on LoCoMo, offline, in minutes.

What it measures: the gate (value model, intrinsic score, percentile gate, repeat
keys, context guard and its suspects: the real `streams.write.WritePipeline`, with
`Settings()` read from the environment as the worker reads it, so any
``DMEM_INTRINSIC__*`` knob can be varied) on the same streams as the live bench
(`dmem_bench.locomo.build_streams`: the same seed, noise drawn from the other
conversations loaded), and evidence recall by exact cosine top-k over what it kept.

Forgetting: the decay job's fixed point on the settings' maintenance policy once
input is quiet (`forget`). What it leaves out, and why that is
acceptable for developing the gate: no broker, no Milvus, no dedup job and no hybrid
ranking (live, these moved recall by ~0.02;
BENCHMARKS.md "LoCoMo"); the turns are fed one conversation (tenant) after the other
in batches of ``batch`` (64: the live worker's batches are smaller; the intrinsic
score is per turn and batch-independent, the gate's thresholds are fixed per batch).

Embeddings are cached on disk (`BaselineCache`, default
``.dmem-bench/locomo-embed-<encoder>.npz``, checked by a probe text), so after
the first run (MiniLM encodes ~15k texts: minutes on 2 cores) a replay of all ten
conversations is the pipeline's own CPU time. Nothing is read that the write path
would not see: the noise labels are used only to count what was stored.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dmem_bench.locomo import (
    BaselineCache,
    Conversation,
    Item,
    LocomoConfig,
    build_streams,
    load,
    questions,
)

DEFAULT_CACHE = Path(".dmem-bench")


class CacheEncoder:
    """The `Encoder` protocol over a `BaselineCache` (exact text -> cached unit row)."""

    def __init__(self, cache: BaselineCache, name: str) -> None:
        self.cache, self.name = cache, name
        self.dim = int(cache.vecs[cache.PROBE].shape[-1])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.cache.encode(list(texts))


def decisions(pipe: Any, transitions: Sequence[Any], batch: int, label: str,
              rows: dict[str, dict[str, Any]] | None = None,
              kinds: Collection[str] = ("written", "dropped", "evicted")) -> list[Any]:  # fmt: skip
    """Feed ``transitions`` through ``pipe`` in batches of ``batch``, in process; the
    MemoryEvents of ``kinds`` in order (the write path evicts what its warm context
    guard takes back, and promotes to core what an outcome shows mattered). A dead
    letter is an error. ``rows``, where given, receives each memory's last row as
    written (its final partition is the decay plan's, `forget_partitions`)."""
    from streams.write.pipeline import RawRecord

    out: list[Any] = []
    for lo in range(0, len(transitions), batch):
        raws = [
            RawRecord(
                value=tr.model_dump_json().encode(),
                key=None,
                topic="transitions",
                partition=0,
                offset=lo + j,
            )
            for j, tr in enumerate(transitions[lo : lo + batch])
        ]
        res = pipe.process(raws, now_ms=0)
        if res.dead:
            raise ValueError(f"{label}: {len(res.dead)} records dead-lettered ({res.dead[0][1]})")
        if rows is not None:
            rows.update((r["id"], r) for written in res.upserts.values() for r in written)
        out += [ev for ev in res.events if ev.kind in kinds]
    return out


def forget(events: Iterable[Any], settings: Any) -> set[str]:
    """Memory ids still searchable once the decay job is done with ``events``
    (`forget_partitions`)."""
    return set(forget_partitions(events, settings))


def forget_partitions(events: Iterable[Any], settings: Any) -> dict[str, str]:
    """Memory id -> partition (``core``, ``buffer``) of what is still searchable once
    the decay job is done with ``events``.

    ``events``: the write path's MemoryEvents of one tenant, in order (``written``,
    ``evicted``, ``promoted``; others are passed over). The index is
    the maintenance job's (`operators.decay.TenantIndex`) with its per-agent
    watermarks; passes of `plan_decay` run at the final watermarks until one plans
    nothing (evicted rows leave, demoted and promoted rows change partition).
    """
    from operators.decay import BUFFER, CORE, Entry, TenantIndex
    from streams.jobs.rows import policy_from

    policy = policy_from(settings)
    idx = TenantIndex(per_agent_clock=policy.clock == "agent")
    events = list(events)
    for ev in events:
        ts = int(ev.event_ts)
        idx.advance(ev.agent_id, ts)
        if ev.kind == "evicted":
            idx.remove(ev.memory_id)
        elif ev.kind == "promoted" and idx.get(ev.memory_id) is not None:
            idx.set_partition(ev.memory_id, CORE)
        elif ev.kind == "written":
            idx.upsert(
                ev.memory_id,
                Entry(
                    partition=CORE if ev.partition == "core" else BUFFER,
                    created_ts=ts,
                    last_seen_ts=ts,
                    abs_rpe=max(abs(float(ev.rpe)), float(ev.rpe_smoothed)),
                    last_access_ts=ts,
                    agent=str(ev.agent_id or ""),
                ),
            )
    if settings.maintenance.enabled:
        _decay_until_quiet(idx, policy)
    return {mid: "core" if e.partition == CORE else "buffer"
            for mid in idx.ids if (e := idx.get(mid)) is not None}  # fmt: skip


def _decay_until_quiet(idx: Any, policy: Any) -> None:
    from operators.decay import BUFFER, CORE, plan_decay

    for _ in range(1000):
        plan = plan_decay(idx, policy)
        if not plan.actions:
            break
        for a in plan.actions:
            if a.kind == "evicted":
                idx.remove(a.memory_id)
            elif a.kind == "demoted":
                idx.set_partition(a.memory_id, BUFFER)
            elif a.kind == "promoted":
                idx.set_partition(a.memory_id, CORE)


def replay_stream(
    pipe: Any, stream: Sequence[Item], batch: int, settings: Any = None
) -> tuple[dict[str, str], set[str]]:
    """Feed one conversation's turns through ``pipe``: (memory id -> final route
    reason, the ids still stored once the decay job is done with them on
    ``settings``' maintenance policy, `forget`; without
    ``settings``, every written id).

    The last ``written``/``dropped`` event wins: a ``referred`` write supersedes the
    ``dropped: off_context`` event of a suspect, as in the live `memories` topic.
    """
    events = decisions(pipe, [it.transition for it in stream], batch, "replay")
    final = {ev.memory_id: f"{ev.kind}:{ev.reason}" for ev in events}
    if settings is None:
        return final, {m for m, r in final.items() if r.startswith("written")}
    return final, forget(events, settings)


def topk_labels(
    emb: np.ndarray, labels: Sequence[str | None], q: np.ndarray, k: int
) -> list[set[str]]:
    """Exact cosine top-k over ``emb`` (rows of the kept turns), as label sets."""
    if emb.shape[0] == 0:
        return [set() for _ in range(q.shape[0])]
    order = np.argsort(-(q @ emb.T), axis=1, kind="stable")[:, :k]
    return [{labels[j] for j in row if labels[j]} for row in order.tolist()]


def replay(
    cfg: LocomoConfig,
    cache: Path | None = None,
    batch: int = 64,
    convs: Sequence[Conversation] | None = None,
) -> dict[str, Any]:
    """One replay of ``cfg``'s streams; the live bench's keys plus ``recall_ratio``."""
    from operators.encoders import build_encoder
    from streams.settings import Settings
    from streams.write.pipeline import WritePipeline, intrinsic_config

    t0 = time.monotonic()
    convs = list(convs) if convs is not None else load(cfg.data, cfg.conversations)
    streams = build_streams(convs, cfg)
    path = (cache or DEFAULT_CACHE) / f"locomo-embed-{cfg.encoder}.npz"
    emb_cache = BaselineCache(build_encoder(cfg.encoder, cache_size=0), path)
    enc = CacheEncoder(emb_cache, cfg.encoder)
    # every text the pipeline and the scoring will ask for, encoded in one batched call
    texts = [
        x
        for s in streams.items.values()
        for it in s
        for x in (it.transition.text(), it.transition.next_text())
    ]
    texts += [q for c in convs for q, _, _ in questions(c, cfg.questions)]
    enc.encode(texts)
    emb_cache.save()
    settings = Settings()
    # the encoder the worker would name (its calibrations follow it, as live)
    settings.encoder.name = cfg.encoder  # type: ignore[assignment]
    guard = intrinsic_config(settings)
    pipe = WritePipeline(settings, enc)
    reasons: dict[str, int] = defaultdict(int)
    scores: dict[str, list[float]] = defaultdict(list)
    n_real = n_noise = kept_real = kept_noise = 0
    for conv in convs:
        stream = streams.items[conv.cid]
        final, kept_ids = replay_stream(pipe, stream, batch, settings)
        for r in final.values():
            reasons[r] += 1
        kept = [it for it in stream if it.transition.memory_id in kept_ids]
        real = [it for it in stream if not it.noise]
        n_real += len(real)
        n_noise += len(stream) - len(real)
        kept_real += sum(not it.noise for it in kept)
        kept_noise += sum(it.noise for it in kept)
        qs = questions(conv, cfg.questions)
        if not qs:
            continue
        q = enc.encode([x for x, _, _ in qs])
        published = {it.dia_id for it in real if it.dia_id}

        def top(items: Sequence[Item], k: int, q: np.ndarray = q) -> list[set[str]]:
            emb = (
                enc.encode([it.transition.text() for it in items])
                if items
                else np.zeros((0, enc.dim), np.float32)
            )
            return topk_labels(emb, [it.dia_id for it in items], q, k)

        got5, got10 = top(kept, 5), top(kept, 10)
        all5, all10 = top(real, 5), top(real, 10)
        noisy10 = top(stream, 10) if cfg.noise > 0 else None
        for j, (_, _, ev) in enumerate(qs):
            evid = set(ev) & published
            if not evid:
                continue
            n = len(evid)
            scores["at5"].append(len(got5[j] & evid) / n)
            scores["at10"].append(len(got10[j] & evid) / n)
            scores["all5"].append(len(all5[j] & evid) / n)
            scores["all10"].append(len(all10[j] & evid) / n)
            if noisy10 is not None:
                scores["noisy10"].append(len(noisy10[j] & evid) / n)

    def mean(key: str) -> float | None:
        return float(np.mean(scores[key])) if scores[key] else None

    r10, a10 = mean("at10"), mean("all10")
    return {
        "mode": "replay",
        "conversations": len(convs),
        "turns": n_real,
        "published": n_real + n_noise,
        "questions": len(scores["at10"]),
        "encoder": cfg.encoder,
        "batch": batch,
        "storage_ratio": (kept_real + kept_noise) / max(n_real + n_noise, 1),
        "real_storage_ratio": kept_real / max(n_real, 1),
        "evidence_recall_at_5": mean("at5"),
        "evidence_recall_at_10": r10,
        "store_all_recall_at_5": mean("all5"),
        "store_all_recall_at_10": a10,
        "recall_ratio": (r10 / a10) if r10 is not None and a10 else None,
        "noise_ratio": cfg.noise,
        "noise_turns": n_noise,
        "noise_storage_ratio": kept_noise / n_noise if n_noise else None,
        "noise_evidence_recall_at_10": r10 if cfg.noise > 0 else None,
        "store_all_noisy_recall_at_10": mean("noisy10"),
        # the settings as resolved for the encoder (unset ones follow it)
        "intrinsic": settings.intrinsic.model_dump()
        | {k: getattr(guard, k) for k in ("recheck_cold", "off_posterior")},
        "routes": dict(sorted(reasons.items())),
        "elapsed_s": time.monotonic() - t0,
        "seed": cfg.seed,
    }


def main(
    cfg: LocomoConfig, as_json: bool, cache: Path | None = None, batch: int = 64
) -> dict[str, Any]:
    """The replay of ``cfg`` (clean when ``cfg.noise`` is 0), printed as the live bench's."""
    from dmem_bench.common import emit_json, note, print_table

    res = replay(cfg, cache=cache, batch=batch)

    def f(x: float | None) -> float:
        return math.nan if x is None else x

    print_table(
        f"LoCoMo replay (noise {cfg.noise}, {res['conversations']} conversations)",
        ["storage", "noise stored", "recall@10", "store-all@10", "ratio"],
        [
            [
                res["storage_ratio"],
                f(res["noise_storage_ratio"]),
                f(res["evidence_recall_at_10"]),
                f(res["store_all_recall_at_10"]),
                f(res["recall_ratio"]),
            ]
        ],
    )
    note(f"routes: {res['routes']}")
    if as_json:
        emit_json(res)
    return res
