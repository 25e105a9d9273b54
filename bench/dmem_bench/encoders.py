"""`dmem bench encoders`: speed and real-text retrieval quality of every encoder, in one run.

Per encoder (``hash``, ``minilm``, ``minilm-static`` by default):
- ``raw_per_s``: texts/s of the bare encoder (no LRU cache) on real conversation
  turns (LoCoMo, up to 2,048; a repeat ends after ~30 s), batches of 256, torch on
  ``--threads`` threads (2 by default); median over ``--repeats``.
- ``pipeline_tps``: write-path transitions/s with one write worker, measured
  exactly as ``dmem bench write`` measures it (`dmem_bench.write.run`: embedded
  broker, Milvus 2.3.5 server shared by all encoders, the Taxi workload with
  mostly unique texts); median over ``--repeats``. The same run's raw baselines
  come with it (``pipeline_raw_encoder_tps``: the worker's encoder with its LRU
  cache on the workload's texts; ``pipeline_raw_milvus_tps``) and the ratios
  ``pipeline_vs_raw_encoder`` and ``pipeline_vs_bottleneck``: on a shared machine
  the ratios are what compare, absolute rates move with the load. torch MiniLM
  runs at most ``minilm_transitions`` per repeat (a rate, and it is ~50x slower).
- ``cache_hit_rate``: share of the write workload's texts (observation and next
  observation of each transition) that the worker's LRU cache serves: the next
  observation of step t is the observation of step t+1.
- ``hit_at_5`` / ``mrr_at_10``: retrieval quality on real text: every LoCoMo
  question with evidence (categories 1-4) is the query, the turns of its own
  conversation (``"speaker: text"``) are the candidates, cosine ranking; a hit is
  an evidence turn among the top 5. This is store-everything cosine, so it
  measures the encoder alone, not the gate or the ranking.

``default`` is the encoder the settings pick when ``DMEM_ENCODER__NAME`` is unset;
``default_hit_at_5_delta`` = its hit@5 minus torch MiniLM's. One JSON object on the
last stdout line; progress and a table on stderr.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dmem_bench.common import emit_json, machine_info, note, print_table, teardown


def load_locomo(
    data: Path, limit: int | None = None
) -> list[tuple[list[tuple[str, str]], list[tuple[str, set[str]]]]]:
    """Per conversation: its turns (dia_id, "speaker: text") and questions with evidence."""
    from dmem_bench.locomo import load

    out = []
    for conv in load(data, limit or 0):
        turns = [(str(t["dia_id"]), f"{t['speaker']}: {t['text']}") for t in conv.turns()]
        qs = [
            (q["question"], set(q["evidence"]))
            for q in conv.qa
            if q.get("category") != 5 and q.get("evidence")
        ]
        out.append((turns, qs))
    return out


def quality(enc: Any, convs: Sequence[Any]) -> tuple[float, float, int]:
    """(hit@5, MRR@10, questions) of cosine over each conversation's turns."""
    hits: list[float] = []
    rr: list[float] = []
    for turns, qs in convs:
        if not qs:
            continue
        t = enc.encode([x for _, x in turns])
        q = enc.encode([x for x, _ in qs])
        ids = [d for d, _ in turns]
        for (_, ev), row in zip(qs, q @ t.T, strict=True):
            top = [ids[i] for i in np.argsort(-row, kind="stable")[:10]]
            hits.append(float(any(x in ev for x in top[:5])))
            rank = next((k + 1 for k, x in enumerate(top) if x in ev), None)
            rr.append(1.0 / rank if rank else 0.0)
    return float(np.mean(hits)), float(np.mean(rr)), len(hits)


def raw_rate(
    enc: Any, texts: Sequence[str], repeats: int, batch: int = 256, max_s: float = 30.0
) -> float:
    """Median texts/s over repeats; a repeat stops after the batch that passes ``max_s``
    (torch MiniLM does ~10 texts/s on a loaded 2-core machine: a rate needs no 2,048)."""
    rates = []
    for r in range(repeats):
        tagged = [f"[{r}] {t}" for t in texts]  # fresh texts: no cache anywhere helps
        done = 0
        t0 = time.perf_counter()
        for i in range(0, len(tagged), batch):
            chunk = tagged[i : i + batch]
            enc.encode(chunk)
            done += len(chunk)
            if time.perf_counter() - t0 > max_s:
                break
        rates.append(done / (time.perf_counter() - t0))
    return statistics.median(rates)


def cache_hit_rate(name: str, rows: Sequence[dict[str, Any]]) -> float:
    from operators.encoders import CachedEncoder, HashingEncoder

    # the hit rate depends on the texts only: a hashing inner encoder keeps it cheap
    c = CachedEncoder(HashingEncoder(16), maxsize=50_000)
    for i in range(0, len(rows), 512):
        chunk = rows[i : i + 512]
        c.encode([r["observation"] for r in chunk] + [r["next_observation"] for r in chunk])
    return c.hits / max(1, c.hits + c.misses)


def run(
    encoders: Sequence[str] = ("hash", "minilm", "minilm-static"),
    repeats: int = 3,
    transitions: int = 4000,
    threads: int = 2,
    data: Path | None = None,
    conversations: int | None = None,
    pipeline: bool = True,
    minilm_transitions: int = 2000,
    milvus_uri: str | None = None,
) -> dict[str, Any]:
    """Measure every encoder in one run (module doc); ``milvus_uri``: reuse a server."""
    import torch

    from dmem_bench import write as bw
    from milvus.server import EmbeddedMilvusServer
    from operators.encoders import build_encoder
    from streams.settings import Settings

    torch.set_num_threads(threads)
    t_start = time.perf_counter()
    if data is None:
        raise FileNotFoundError("no LoCoMo data: pass the folder of its conversations (--data)")
    convs = load_locomo(data, conversations)
    texts = [x for turns, _ in convs for _, x in turns][:2048]
    workload = bw.make_workload(min(transitions, 4000))
    out: dict[str, Any] = {
        "encoders": {},
        "default": Settings().encoder.name,
        "conversations": len(convs),
        "turns": sum(len(turns) for turns, _ in convs),
        "questions": sum(len(qs) for _, qs in convs),
        "texts": len(texts),
        "threads": threads,
    }
    tmp = Path(tempfile.mkdtemp(prefix="dmem-bench-encoders-"))
    server = None
    failed = True
    try:
        uri = milvus_uri
        if pipeline and uri is None:
            server = EmbeddedMilvusServer(tmp / "milvus", stop_grace_s=3)
            uri = server.start(timeout_s=120)
        for name in encoders:
            note(f"bench encoders: {name}")
            enc = build_encoder(name, cache_size=0)
            enc.encode(["warm up"])
            res: dict[str, Any] = {"raw_per_s": round(raw_rate(enc, texts, repeats), 1)}
            hit5, mrr10, nq = quality(enc, convs)
            res.update(
                hit_at_5=round(hit5, 4),
                mrr_at_10=round(mrr10, 4),
                questions=nq,
                cache_hit_rate=round(cache_hit_rate(name, workload), 4),
            )
            note(f"  raw {res['raw_per_s']}/s  hit@5 {hit5:.3f}  mrr@10 {mrr10:.3f}")
            if pipeline:
                n = transitions if name != "minilm" else min(transitions, minilm_transitions)
                w = bw.run(
                    transitions=n,
                    encoder=name,
                    repeats=repeats,
                    milvus_uri=uri,
                    results_dir=None,
                    torch_threads=threads,
                    warmup=min(512, n),
                    latency_transitions=min(200, n),
                )
                tps, raw_enc = w["pipeline_tps"], w["raw_encoder_tps"]
                res.update(
                    pipeline_tps=tps,
                    pipeline_transitions=n,
                    pipeline_per_repeat=w["per_repeat"]["pipeline"],
                    pipeline_raw_encoder_tps=raw_enc,
                    pipeline_raw_milvus_tps=w["raw_milvus_insert_tps"],
                    pipeline_vs_raw_encoder=round(tps / raw_enc, 3) if raw_enc else None,
                    pipeline_vs_bottleneck=w["ratio_vs_bottleneck"],
                    pipeline_bottleneck=w["bottleneck"],
                )
                note(f"  pipeline {tps}/s (raw encoder in the same run {raw_enc}/s)")
            out["encoders"][name] = res
        failed = False
    finally:
        teardown(None, server, tmp, failed)
    e = out["encoders"]
    d = out["default"]
    if "minilm" in e:
        out["minilm_pipeline_tps"] = e["minilm"].get("pipeline_tps")
        if d in e:
            out["default_hit_at_5_delta"] = round(e[d]["hit_at_5"] - e["minilm"]["hit_at_5"], 4)
    if d in e:
        out["default_pipeline_tps"] = e[d].get("pipeline_tps")
        if out.get("minilm_pipeline_tps") and out["default_pipeline_tps"]:
            out["default_vs_minilm_pipeline"] = round(
                out["default_pipeline_tps"] / out["minilm_pipeline_tps"], 2
            )
    out["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    out["machine"] = machine_info()
    print_table(
        "encoders",
        ["encoder", "raw/s", "pipeline/s", "hit@5", "mrr@10", "cache hit"],
        [
            [
                k,
                v["raw_per_s"],
                v.get("pipeline_tps", "-"),
                v["hit_at_5"],
                v["mrr_at_10"],
                v["cache_hit_rate"],
            ]
            for k, v in e.items()
        ],
    )
    return out


def main(**kw: Any) -> None:
    emit_json(run(**kw))
