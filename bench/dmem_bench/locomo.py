"""`dmem bench locomo`: conversational memory without rewards, scored by evidence recall.

What runs (embedded, in a temp dir removed at the end): the Tansu broker and one
worker with every role (write, respond, jobs: as `dmem up` runs it) on the
embedded Milvus server where its wheel is installed, else Milvus Lite (``--milvus``,
`LocalStack`; reported as ``milvus_mode``), with the encoder the benchmark names
(MiniLM by default).

1. Every turn of each LoCoMo conversation (`--data`, the
   folder of its ``*.json`` files; one tenant per conversation, agent = the
   conversation) is published in session order through the SDK's chat mapping
   (`dmem.chat_transitions`): ``"speaker: text"`` (plus ``[shares <caption>]``
   for a shared image), reward 0, the next turn of the session as
   next_observation, the session's date as event time (+30 s per turn).
2. Noise (`--noise p`, LoCoMo-Noise style): after each real turn, with
   probability p, a turn drawn at random from another conversation is inserted,
   spoken by the other speaker of this conversation (so only its content, not a
   stranger's name in the speaker field, gives it away). ``--noise 0.5`` = one
   noise turn per two real ones on average. Nothing published marks a noise turn:
   real and noise turns carry the same fields (speaker, text, an opaque message id
   by stream position, event time); which is which is known to the bench only.
   The worker runs on the product's defaults (forgetting included) except
   `worker_env` (the encoder; MiniLM's dedup threshold).
3. Settle: every published turn has a ``written``/``dropped`` MemoryEvent and
   the memories topic has been quiet for `SETTLE_QUIET_S` (dedup windows closed).
   ``merged`` events map a removed memory to its survivor, which then stands for it.
4. Every question (category 5, adversarial, has no evidence and is excluded) is
   asked over HTTP (`POST /v1/search`, k = 10, the tenant, the conversation as
   agent scope, the product's default ranking); recall@5 is the top 5 of that
   list. Evidence recall = share of the question's evidence turns (`dia_id`s
   that exist in the conversation) among the turns the hits stand for.
5. Baseline: store-everything cosine, the same encoder and text, every real
   turn, exact top-k in this process (`store_all_*`); with noise also over real +
   noise turns (`store_all_noisy_recall_at_10`).

``--conversations``, ``--turns`` (per conversation) and ``--questions`` cut the
run down (CI uses the hash encoder and a slice of one conversation).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from dmem.client import ChatTurn, Client, chat_transitions
from dmem_bench.common import Progress, emit_json, machine_info, note, print_table
from schemas import Transition

TURN_GAP_MS = 30_000
SETTLE_QUIET_S = 6.0
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


@dataclass(frozen=True)
class LocomoConfig:
    data: Path  # LoCoMo conversations: a folder of files or one file (`load`)
    conversations: int = 0  # 0 = all
    turns: int = 0  # per conversation, 0 = all
    questions: int = 0  # per conversation, 0 = all
    noise: float = 0.0
    encoder: str = "minilm"
    seed: int = 7
    plot: Path | None = Path(".dmem-bench/locomo.png")
    baseline_cache: Path | None = None  # store-all embeddings on disk (`BaselineCache`)
    # longest stall of the write path (no new decision): one 512-turn batch of MiniLM
    # encodes takes minutes on a loaded 2-core machine
    settle_timeout_s: float = 900.0
    #: Milvus of the embedded stack (`LocalStack`): "auto" = the embedded server when its
    #: wheel is installed (a search in a few ms), else Lite, whose unindexed search
    #: grows with the rows it holds (~1 question/s at 3,000 memories)
    milvus: str = "auto"

    def __post_init__(self) -> None:
        if not 0.0 <= self.noise <= 4.0:
            raise ValueError(f"noise must be in [0, 4], got {self.noise}")
        if self.milvus not in ("auto", "lite", "server"):
            raise ValueError(f"milvus must be auto, lite or server, got {self.milvus!r}")
        if min(self.conversations, self.turns, self.questions) < 0:
            raise ValueError("conversations, turns and questions must be >= 0")


@dataclass
class Conversation:
    cid: str
    speakers: tuple[str, str]
    sessions: list[tuple[int, int, list[dict[str, Any]]]]  # (n, date ms, turns)
    qa: list[dict[str, Any]]

    def turns(self) -> list[dict[str, Any]]:
        return [t for _, _, ts in self.sessions for t in ts]


@dataclass
class Item:
    """One published turn: its transition, and whether it is injected noise."""

    transition: Transition
    noise: bool
    dia_id: str | None


@dataclass
class Run:
    items: dict[str, list[Item]] = field(default_factory=dict)  # cid -> stream


def parse_date(text: str) -> int:
    """``1:56 pm on 8 May, 2023`` -> ms since epoch (UTC)."""
    dt = datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def render(turn: dict[str, Any]) -> str:
    text = str(turn.get("text", ""))
    if turn.get("blip_caption"):
        text += f" [shares {turn['blip_caption']}]"
    return text


def samples(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(conversation id, conversation object) of one LoCoMo file: one conversation
    (``speaker_a``, ``session_N``..., ``qa``: the unpacked per-conversation files) or
    the release's ``locomo10.json``, a list of samples that nest the sessions under
    ``conversation`` beside ``sample_id`` and ``qa``."""
    d = json.loads(path.read_text(encoding="utf-8"))
    items = d if isinstance(d, list) else [d]
    out = []
    for i, x in enumerate(items):
        if not isinstance(x, dict):
            raise ValueError(f"{path}: item {i} is not a LoCoMo conversation object")
        conv = x.get("conversation", x)
        cid = x.get("sample_id") or (path.stem if len(items) == 1 else f"{path.stem}-{i}")
        conv = {**conv, "qa": x.get("qa", conv.get("qa"))}
        missing = [k for k in ("speaker_a", "speaker_b", "qa") if conv.get(k) is None]
        if missing:
            raise ValueError(f"{path}: conversation {cid} has no {', '.join(missing)}")
        out.append((str(cid), conv))
    return out


def load(data: Path, limit: int = 0) -> list[Conversation]:
    """The conversations of ``data``: a folder of LoCoMo files (*.json) or one file
    (`samples`); ``limit`` > 0 keeps the first ``limit``."""
    files = [data] if data.is_file() else sorted(data.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no LoCoMo conversations (*.json) in {data}")
    out: list[Conversation] = []
    for cid, d in (x for f in files for x in samples(f)):
        if limit and len(out) >= limit:
            break
        sessions = []
        n = 1
        while f"session_{n}_date_time" in d:
            turns = d.get(f"session_{n}") or []
            if turns:
                sessions.append((n, parse_date(d[f"session_{n}_date_time"]), turns))
            n += 1
        out.append(Conversation(cid, (d["speaker_a"], d["speaker_b"]), sessions, d["qa"]))
    return out


def evidence_ids(ev: Sequence[str]) -> list[str]:
    """Evidence entries are ``D3:12``; a few hold several ids separated by ; or spaces."""
    return [x for e in ev for x in re.split(r"[\s;,]+", str(e)) if x]


def tenant_of(cid: str) -> str:
    return f"locomo-{cid}"


def build_streams(convs: Sequence[Conversation], cfg: LocomoConfig) -> Run:
    rng = np.random.default_rng(cfg.seed)
    pool = {c.cid: [t for t in c.turns()] for c in convs}
    run = Run()
    for conv in convs:
        others = [t for cid, ts in pool.items() if cid != conv.cid for t in ts]
        if cfg.noise > 0 and not others:
            # a single conversation: noise from its own far-away sessions is not noise
            raise ValueError("--noise needs at least two conversations")
        budget = cfg.turns or math.inf
        stream: list[Item] = []
        for n, date_ms, turns in conv.sessions:
            if budget <= 0:
                break
            chat: list[tuple[ChatTurn, bool, str | None]] = []
            for t in turns:
                if budget <= 0:
                    break
                budget -= 1
                chat.append((ChatTurn(t["speaker"], render(t)), False, t.get("dia_id")))
                k = int(rng.poisson(cfg.noise)) if cfg.noise > 0 else 0
                for _ in range(k):
                    other = others[int(rng.integers(len(others)))]
                    spk = conv.speakers[1] if t["speaker"] == conv.speakers[0] else conv.speakers[0]
                    chat.append((ChatTurn(spk, render(other)), True, None))
            # what the write path sees of a real and a noise turn is alike: speaker, text,
            # an opaque message id by position, event time; the labels stay in `Item`
            turns_ts = [
                ChatTurn(c.speaker, c.text, f"{conv.cid}-{n}-{j}", date_ms + j * TURN_GAP_MS)
                for j, (c, _, _) in enumerate(chat)
            ]
            trs = chat_transitions(
                turns_ts, tenant=tenant_of(conv.cid), conversation=f"conv-{conv.cid}", session=n
            )
            stream += [Item(tr, isn, dia) for tr, (_, isn, dia) in zip(trs, chat, strict=True)]
        run.items[conv.cid] = stream
    return run


def questions(conv: Conversation, limit: int) -> list[tuple[str, int, list[str]]]:
    """(question, category, evidence ids present in the published turns); no category 5."""
    out = []
    for qa in conv.qa:
        if int(qa.get("category", 0)) == 5:
            continue
        out.append((str(qa["question"]), int(qa["category"]), evidence_ids(qa.get("evidence", []))))
    return out[: limit or None]


def recall(hit_dias: Sequence[set[str]], evid: Sequence[set[str]]) -> list[float]:
    return [len(h & e) / len(e) for h, e in zip(hit_dias, evid, strict=True)]


async def settle(settings: Any, ids: set[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    """Read `memories` until every id has a write/drop event and the topic is quiet
    (an id's last written / dropped / evicted event is what ``decided`` holds).

    Fails when no new decision arrives for ``timeout_s`` (a stalled worker), not
    after a total time: MiniLM on a shared 2-core machine writes ~5-8 turns/s.
    """
    from aiokafka import AIOKafkaConsumer

    from streams.admin import kafka_client_kwargs

    consumer = AIOKafkaConsumer(
        settings.topic("memories"),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
        **kafka_client_kwargs(settings.kafka),
    )
    await consumer.start()
    decided: dict[str, dict[str, Any]] = {}
    merged: dict[str, str] = {}
    prog = Progress("write path", len(ids))
    last_event = last_progress = time.monotonic()
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=500)
            for msgs in batch.values():
                for m in msgs:
                    ev = orjson.loads(m.value)
                    last_event = time.monotonic()
                    mid = ev["memory_id"]
                    # the last of written / dropped / evicted is what is stored now
                    if ev["kind"] in ("written", "dropped", "evicted") and mid in ids:
                        if mid not in decided:
                            last_progress = last_event
                        decided[mid] = ev
                    elif ev["kind"] == "merged":
                        hit = re.match(r"into (\S+)", ev.get("reason", ""))
                        if hit:
                            merged[mid] = hit.group(1)
            prog.update(len(decided))
            done = len(decided) >= len(ids)
            if done and time.monotonic() - last_event >= SETTLE_QUIET_S:
                break
            if not done and time.monotonic() - last_progress > timeout_s:
                raise TimeoutError(
                    f"write path stalled at {len(decided)}/{len(ids)} turns "
                    f"(nothing new for {timeout_s:.0f} s)"
                )
    finally:
        await consumer.stop()
    return {"decided": decided, "merged": merged}  # type: ignore[dict-item]


class BaselineCache:
    """Embeddings of the store-all baseline, kept on disk between runs (bench side only).

    The baseline is exact cosine with the same encoder in this process; encoding
    every turn and question again costs as much as the run itself on a slow
    machine. Only this process reads the cache: the worker always encodes what it
    is given. The file is keyed by encoder name and checked with a probe text
    (a different model's cached vectors are discarded).
    """

    PROBE = "dmem locomo baseline cache probe"

    def __init__(self, encoder: Any, path: Path | None) -> None:
        self.encoder, self.path = encoder, path
        self.vecs: dict[str, np.ndarray] = {}
        if path is not None and path.exists():
            with np.load(path, allow_pickle=False) as z:
                texts, emb = z["texts"].tolist(), z["emb"]
            probe = self.encoder.encode([self.PROBE])[0]
            cached = dict(zip(texts, emb, strict=True))
            if self.PROBE in cached and np.allclose(cached[self.PROBE], probe, atol=1e-4):
                self.vecs = cached
        self.vecs.setdefault(self.PROBE, self.encoder.encode([self.PROBE])[0])
        self.added = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        missing = sorted({t for t in texts if t not in self.vecs})
        if missing:
            self.vecs.update(zip(missing, self.encoder.encode(missing), strict=True))
            self.added += len(missing)
        return np.stack([self.vecs[t] for t in texts]).astype(np.float32)

    def save(self) -> None:
        if self.path is None or not self.added:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        texts = list(self.vecs)
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, texts=np.array(texts), emb=np.stack([self.vecs[t] for t in texts]))
        tmp.replace(self.path)


def store_all_topk(
    encoder: Any, texts: Sequence[str], labels: Sequence[str | None], qs: Sequence[str], k: int
) -> list[list[str | None]]:
    """Exact cosine top-k over every text (the store-everything baseline)."""
    if not texts or not qs:
        return [[] for _ in qs]
    m = encoder.encode(list(texts))
    q = encoder.encode(list(qs))
    sims = q @ m.T
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return [[labels[j] for j in row] for row in order.tolist()]


def plot(path: Path, per_cat: dict[str, dict[str, float]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = list(per_cat)
    keys = [
        ("dmem_at_10", "dmem (gated) @10"),
        ("store_all_at_10", "store-all cosine @10"),
        ("dmem_at_5", "dmem (gated) @5"),
        ("store_all_at_5", "store-all cosine @5"),
    ]
    x = np.arange(len(cats))
    fig, ax = plt.subplots(figsize=(8, 4))
    for j, (key, label) in enumerate(keys):
        ax.bar(x + (j - 1.5) * 0.2, [per_cat[c].get(key, 0.0) for c in cats], 0.2, label=label)
    ax.set_xticks(x, cats)
    ax.set_ylabel("evidence recall")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def ask(
    bootstrap: str,
    url: str,
    convs: Sequence[Conversation],
    cfg: LocomoConfig,
    stands_for: dict[str, set[str]],
    in_flight: int = 4,
) -> dict[str, list[set[str]]]:
    """Every scored question over HTTP, ``in_flight`` at a time (results in question order)."""
    out: dict[str, list[set[str]]] = {}
    total = sum(len(questions(c, cfg.questions)) for c in convs)
    prog = Progress("questions", total)
    done = 0
    gate = asyncio.Semaphore(in_flight)
    for conv in convs:
        async with Client(
            bootstrap, tenant=tenant_of(conv.cid), transport="http", http_url=url, timeout_s=60.0
        ) as client:

            async def one(
                q: str, client: Client = client, agent: str = f"conv-{conv.cid}"
            ) -> list[set[str]]:
                nonlocal done
                async with gate:
                    hits = await client.search(q, k=10, agent_id=agent)
                ranked = [stands_for.get(h.memory_id, set()) for h in hits]
                done += 1
                prog.update(done)
                return [
                    set().union(*ranked[:5]) if ranked else set(),
                    set().union(*ranked) if ranked else set(),
                ]

            pairs = await asyncio.gather(*(one(q) for q, _, _ in questions(conv, cfg.questions)))
            out[conv.cid] = [x for pair in pairs for x in pair]
    return out


def worker_env(cfg: LocomoConfig) -> dict[str, str]:
    """The worker's settings: the product's defaults (forgetting included: its
    horizons follow each conversation's own span, ``span_factor``), except the
    encoder the run names and, with MiniLM, the dedup threshold 0.98
    (docs/concepts/maintenance.md: 0.95 is tuned for the hash encoder; MiniLM rates
    short sentences closer).
    """
    env = {"DMEM_ENCODER__NAME": cfg.encoder}
    if cfg.encoder == "minilm":
        env["DMEM_MAINTENANCE__DEDUP_TAU"] = "0.98"
    return env


def run(cfg: LocomoConfig) -> dict[str, Any]:
    from operators.encoders import build_encoder
    from streams.local.stack import LocalStack

    t0 = time.monotonic()
    convs = load(cfg.data, cfg.conversations)
    streams = build_streams(convs, cfg)
    all_items = [it for s in streams.items.values() for it in s]
    ids = {it.transition.memory_id for it in all_items}
    note(
        f"locomo: {len(convs)} conversations, {len(all_items)} turns "
        f"({sum(it.noise for it in all_items)} noise), encoder {cfg.encoder}"
    )
    tmp = Path(tempfile.mkdtemp(prefix="dmem-locomo-"))
    stack = LocalStack(tmp, roles=("all",), extra_env=worker_env(cfg), milvus=cfg.milvus)
    failed = True
    try:
        milvus_mode = stack.milvus_mode()  # before start: a started server reads "external"
        note(f"locomo: {milvus_mode} Milvus")
        stack.start()
        settings = stack.settings

        async def publish_and_settle() -> dict[str, Any]:
            for cid, s in streams.items.items():  # a tenant per conversation: its own client
                async with Client(stack.bootstrap or "", tenant=tenant_of(cid)) as client:
                    await client.publish_many(it.transition for it in s)
            return await settle(settings, ids, cfg.settle_timeout_s)

        t_pub = time.monotonic()
        settled = asyncio.run(publish_and_settle())
        write_s = time.monotonic() - t_pub
        decided, merged = settled["decided"], settled["merged"]
        # which published turns each surviving memory stands for
        stands_for: dict[str, set[str]] = defaultdict(set)
        label = {
            it.transition.memory_id: (it.dia_id or f"noise:{it.transition.memory_id}")
            for it in all_items
        }
        for mid, lab in label.items():
            if decided.get(mid, {}).get("kind") == "written":
                root = mid
                for _ in range(64):  # follow merge chains to the survivor
                    if root not in merged:
                        break
                    root = merged[root]
                stands_for[root].add(lab)
        url = f"http://127.0.0.1:{stack.web_ports[0]}"
        t_q = time.monotonic()
        answers = asyncio.run(ask(stack.bootstrap or "", url, convs, cfg, stands_for))
        query_s = time.monotonic() - t_q
        failed = False
    finally:
        from dmem_bench.common import teardown

        teardown(stack, None, tmp, failed)

    encoder = BaselineCache(build_encoder(cfg.encoder), cfg.baseline_cache)
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    all_scores: dict[str, list[float]] = defaultdict(list)
    for conv in convs:
        stream = streams.items[conv.cid]
        published = {it.dia_id for it in stream if it.dia_id}
        qs = questions(conv, cfg.questions)
        real = [it for it in stream if not it.noise]
        texts = [it.transition.text() for it in real]
        base = store_all_topk(encoder, texts, [it.dia_id for it in real], [q for q, _, _ in qs], 10)
        noisy = None
        if cfg.noise > 0:
            noisy = store_all_topk(
                encoder,
                [it.transition.text() for it in stream],
                [it.dia_id for it in stream],
                [q for q, _, _ in qs],
                10,
            )
        got = answers[conv.cid]
        for j, (_, cat, ev) in enumerate(qs):
            evid = set(ev) & published
            if not evid:
                continue
            name = CATEGORIES.get(cat, str(cat))
            vals = {
                "dmem_at_5": len(got[2 * j] & evid) / len(evid),
                "dmem_at_10": len(got[2 * j + 1] & evid) / len(evid),
                "store_all_at_5": len(set(base[j][:5]) & evid) / len(evid),
                "store_all_at_10": len(set(base[j]) & evid) / len(evid),
            }
            if noisy is not None:
                vals["store_all_noisy_at_10"] = len(set(noisy[j]) & evid) / len(evid)
            for key, v in vals.items():
                per[name][key].append(v)
                all_scores[key].append(v)

    def mean(xs: Sequence[float]) -> float:
        return float(np.mean(xs)) if xs else math.nan

    real_ids = {it.transition.memory_id for it in all_items if not it.noise}
    noise_ids = ids - real_ids
    written = {m for m, ev in decided.items() if ev["kind"] == "written"}
    reasons: dict[str, int] = defaultdict(int)
    for ev in decided.values():
        reasons[f"{ev['kind']}:{ev.get('reason', '')}"] += 1
    per_cat = {
        c: {k: mean(v) for k, v in d.items()} | {"questions": len(d["dmem_at_10"])}
        for c, d in sorted(per.items())
    }
    n_q = len(all_scores["dmem_at_10"])
    r10 = mean(all_scores["dmem_at_10"])
    result: dict[str, Any] = {
        "conversations": len(convs),
        "turns": len(real_ids),
        "published": len(ids),
        "questions": n_q,
        "encoder": cfg.encoder,
        "storage_ratio": len(written) / max(len(ids), 1),
        "real_storage_ratio": len(written & real_ids) / max(len(real_ids), 1),
        "evidence_recall_at_5": mean(all_scores["dmem_at_5"]),
        "evidence_recall_at_10": r10,
        "store_all_recall_at_5": mean(all_scores["store_all_at_5"]),
        "store_all_recall_at_10": mean(all_scores["store_all_at_10"]),
        "noise_ratio": cfg.noise,
        "noise_turns": len(noise_ids),
        "noise_storage_ratio": (len(written & noise_ids) / len(noise_ids)) if noise_ids else None,
        "noise_evidence_recall_at_10": r10 if cfg.noise > 0 else None,
        "store_all_noisy_recall_at_10": (
            mean(all_scores["store_all_noisy_at_10"]) if cfg.noise > 0 else None
        ),
        "merged": len(merged),
        "milvus_mode": milvus_mode,
        "worker_env": worker_env(cfg),
        "per_category": per_cat,
        "routes": dict(sorted(reasons.items())),
        "write_s": write_s,
        "query_s": query_s,
        "elapsed_s": time.monotonic() - t0,
        "seed": cfg.seed,
        "machine": machine_info(),
    }
    encoder.save()
    if cfg.plot is not None and per_cat:
        plot(cfg.plot, per_cat, f"LoCoMo evidence recall ({cfg.encoder}, noise {cfg.noise})")
        result["plot"] = str(cfg.plot)
    return result


def main(cfg: LocomoConfig, as_json: bool) -> dict[str, Any]:
    from dmem_bench.common import cleanup_on_signals

    with cleanup_on_signals():
        res = run(cfg)
    rows = [
        [
            c,
            d["questions"],
            d.get("dmem_at_5", math.nan),
            d.get("store_all_at_5", math.nan),
            d.get("dmem_at_10", math.nan),
            d.get("store_all_at_10", math.nan),
        ]
        for c, d in res["per_category"].items()
    ]
    rows.append(
        [
            "all",
            res["questions"],
            res["evidence_recall_at_5"],
            res["store_all_recall_at_5"],
            res["evidence_recall_at_10"],
            res["store_all_recall_at_10"],
        ]
    )
    print_table(
        f"LoCoMo evidence recall (storage ratio {res['storage_ratio']:.3f}, "
        f"noise stored {res['noise_storage_ratio']})",
        ["category", "questions", "dmem@5", "all@5", "dmem@10", "all@10"],
        rows,
    )
    if as_json:
        emit_json(res)
    return res
