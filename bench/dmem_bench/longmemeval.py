"""LongMemEval in process: what a chat memory keeps of long user/assistant histories.

Data (`load`, the path is always given): LongMemEval (Wu et al., ICLR 2025), one question
object per line (``.jsonl`` or ``.jsonl.gz``) with ``question_id``, ``question_type``,
``question``, ``question_date``, ``haystack_sessions`` (lists of ``{"role", "content",
"has_answer"}`` turns), ``haystack_session_ids``, ``haystack_dates`` and
``answer_session_ids``.

What runs (`run`): every question's history is one tenant's conversation (tenant and
agent named after the question), published session by session in time order as the
SDK's chat mapping publishes it (`dmem.client.chat_transitions`: observation
``"role: content"``, action ``say``, reward 0, the session's date as event time plus
`TURN_GAP_MS` per turn), through the real write pipeline (`streams.write.WritePipeline`,
`Settings()` read from the environment as the worker reads it) in batches of ``batch``.
Then forgetting: the decay plan the maintenance job would reach once input is quiet
(`operators.decay.plan_decay` with the settings' policy, passes at the agent's
watermark until one finds nothing to do; ages, priorities and TTLs are monotone in
stream time, so the passes the live job runs while the stream goes on evict nothing
this final state keeps). Dedup merges are not simulated.

Scoring: the question is asked as exact cosine top-k over what is searchable
(``k`` = 5 and 10, the same encoder and text for dmem and the store-all baseline).
Turn recall@k: the share of the question's ``has_answer`` turns among the turns the
hits stand for; session recall@k: the share of its answer sessions with at least one
turn among them; ``turns_returned_at_10``: how many turns the top 10 hits stand for
(10 where every row is one turn). Abstention questions (``_abs``) and questions
without evidence turns count for storage only (session recall still counts a question
with answer sessions). Storage is what a search can return over the turns published.

Embeddings are cached in memory (the histories share many sessions) and, with
``cache`` (a folder), on disk as ``longmemeval-embed-<encoder>.npz``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

import numpy as np

from dmem.client import ChatTurn, chat_transitions
from schemas import Transition
from schemas.limits import LIMITS
from schemas.models import Partition

TURN_GAP_MS = 30_000
KS = (5, 10)
METRICS = (
    "storage_ratio",
    "evidence_stored_ratio",
    "turn_recall_at_5",
    "turn_recall_at_10",
    "store_all_turn_recall_at_5",
    "store_all_turn_recall_at_10",
    "session_recall_at_5",
    "session_recall_at_10",
    "store_all_session_recall_at_5",
    "store_all_session_recall_at_10",
    "cosine_turn_recall_at_10",
    "cosine_session_recall_at_10",
)


@dataclass
class Question:
    qid: str
    qtype: str
    question: str
    question_date: int  # ms since epoch
    sessions: list[tuple[str, int, list[dict[str, Any]]]]  # (session id, date ms, turns)
    answer_sessions: frozenset[str]

    @property
    def abstention(self) -> bool:
        return self.qid.endswith("_abs")


@dataclass
class Turn:
    """One published turn: its transition and what the bench knows about it."""

    transition: Transition
    session: str
    evidence: bool


@dataclass
class QuestionRun:
    """A question's published turns and what the write path and forgetting left."""

    question: Question
    turns: list[Turn]
    kept: set[str] = field(default_factory=set)  # memory ids searchable at the end
    routes: dict[str, str] = field(default_factory=dict)
    #: the kept memories' rows as the store holds them at the end (final partition)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)


def parse_date(text: str) -> int:
    """``2023/05/20 (Sat) 03:18`` -> ms since epoch (UTC)."""
    day, _, clock = text.strip().partition(" (")
    hhmm = clock.partition(") ")[2] or "00:00"
    dt = datetime.strptime(f"{day} {hhmm}", "%Y/%m/%d %H:%M").replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


#: the fields of a question object the bench reads (``answer_session_ids`` is optional)
NEEDED = (
    "question_id",
    "question_type",
    "question",
    "question_date",
    "haystack_session_ids",
    "haystack_dates",
    "haystack_sessions",
)


def records(path: Path) -> Iterator[dict[str, Any]]:
    """The question objects of ``path``, gzip by suffix: one JSON object a line (the
    development subset) or one JSON array of them (the benchmark's own release,
    ``longmemeval_s.json``)."""
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        array = f.read(4096).lstrip().startswith("[")
        f.seek(0)
        if array:
            items = json.load(f)
            if not all(isinstance(d, dict) for d in items):
                raise ValueError(f"{path}: a JSON array of question objects expected")
            yield from items
            return
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(
                    f"{path}, line {n}: neither one JSON object a line nor a JSON array "
                    f"of question objects ({e.msg})"
                ) from None
            yield d


def load(path: Path, limit: int = 0, per_type: int = 0) -> list[Question]:
    """The questions of ``path`` (`records`).

    ``per_type`` > 0 keeps the first ``per_type`` questions of each type (a stratified
    subset in file order); ``limit`` > 0 then keeps the first ``limit``.
    """
    out: list[Question] = []
    seen: dict[str, int] = defaultdict(int)
    for n, d in enumerate(records(path), 1):
        missing = [k for k in NEEDED if k not in d]
        if missing:
            raise ValueError(f"{path}: question {n} has no {', '.join(missing)}")
        qtype = str(d["question_type"])
        if per_type and seen[qtype] >= per_type:
            continue
        seen[qtype] += 1
        sessions = [
            (str(sid), parse_date(date), list(turns))
            for sid, date, turns in zip(
                d["haystack_session_ids"],
                d["haystack_dates"],
                d["haystack_sessions"],
                strict=True,
            )
        ]
        sessions.sort(key=lambda s: s[1])  # stable: same-date sessions keep file order
        out.append(
            Question(
                str(d["question_id"]),
                qtype,
                str(d["question"]),
                parse_date(str(d["question_date"])),
                sessions,
                frozenset(map(str, d.get("answer_session_ids") or ())),
            )
        )
        if limit and len(out) >= limit:
            break
    if not out:
        raise ValueError(f"no LongMemEval questions in {path}")
    return out


def _fit(role: str, text: str) -> str:
    """The content, cut to what a transition may carry with its ``"role: "`` prefix."""
    room = LIMITS.max_text_chars - len(role) - 2
    return text if len(text) <= room else text[:room]


def tenant_of(q: Question) -> str:
    return f"lme-{q.qid}"


def transitions(q: Question) -> list[Turn]:
    """The question's history as the chat mapping publishes it, in time order."""
    out: list[Turn] = []
    for n, (sid, date_ms, turns) in enumerate(q.sessions):
        chat = [
            ChatTurn(
                str(t["role"]),
                _fit(str(t["role"]), str(t["content"]) or " "),
                f"{n}-{j}",
                date_ms + j * TURN_GAP_MS,
            )
            for j, t in enumerate(turns)
        ]
        if not chat:
            continue
        trs = chat_transitions(chat, tenant=tenant_of(q), conversation=f"lme-{q.qid}", session=n)
        out += [Turn(tr, sid, bool(t.get("has_answer"))) for tr, t in zip(trs, turns, strict=True)]
    return out


def replay_question(
    pipe: Any,
    q: Question,
    turns: Sequence[Turn],
    batch: int,
    settings: Any,
) -> QuestionRun:
    """Feed one question's turns through ``pipe``, then forget as the product would."""
    from dmem_bench.locomo_replay import decisions, forget_partitions

    run = QuestionRun(q, list(turns))
    rows: dict[str, dict[str, Any]] = {}
    events = decisions(pipe, [t.transition for t in turns], batch, "longmemeval", rows,
                       kinds=("written", "dropped", "evicted", "promoted"))  # fmt: skip
    # a referred write comes after its off-context drop: the write stands
    run.routes = {ev.memory_id: f"{ev.kind}:{ev.reason}" for ev in events
                  if ev.kind != "promoted"}  # fmt: skip
    parts = forget_partitions(events, settings)
    if missing := parts.keys() - rows.keys():
        raise AssertionError(f"{q.qid}: kept memories without a written row: {sorted(missing)[:5]}")
    run.kept = set(parts)
    run.rows = {mid: {**rows[mid], "partition": part} for mid, part in parts.items()}
    return run


#: the store's partitions (`schemas.models.Partition`)
PARTS = get_args(Partition)


class KeptStore:
    """The store a responder reads, over one question's kept rows in memory: exact
    cosine top-k (Milvus Lite's FLAT index is exact too) with the filters a bench
    question's request makes (the tenant, the question's date as ``created_ts <=``)."""

    def __init__(self, tenant: str, rows: Sequence[dict[str, Any]]) -> None:
        self.tenant = tenant
        self.rows = list(rows)
        self.vecs = np.asarray([r["vector"] for r in self.rows], dtype=np.float32)

    def count(self, tenant: str, **_: Any) -> int:
        return len(self.rows) if tenant == self.tenant else 0

    def search(self, vector: Any, tenant: str, k: int, partitions: Sequence[str] = PARTS,
               agent_id: str | None = None, extra_filter: dict[str, Any] | None = None,
               **_: Any) -> list[dict[str, Any]]:  # fmt: skip
        flt = dict(extra_filter or {})
        ts = flt.pop("created_ts", {})
        if flt or set(ts) - {"<="}:
            raise ValueError(f"the bench's store filters by tenant and date only: {extra_filter}")
        if tenant != self.tenant or not self.rows:
            return []
        sims = self.vecs @ np.asarray(vector, dtype=np.float32)
        ok = [i for i, r in enumerate(self.rows)
              if r["partition"] in partitions and (agent_id is None or r["agent_id"] == agent_id)
              and int(r["created_ts"]) <= ts.get("<=", int(r["created_ts"]))]  # fmt: skip
        ok.sort(key=lambda i: (-float(sims[i]), str(self.rows[i]["id"])))
        return [{**{f: v for f, v in self.rows[i].items() if f != "vector"},
                 "distance": float(sims[i]), "similarity": float(sims[i])}
                for i in ok[:k]]  # fmt: skip


def served(run: QuestionRun, encoder: Any, settings: Any,
           as_of: bool = False) -> Callable[[int], list[list[int]]]:  # fmt: skip
    """``k -> the turns of the top k hits`` as the respond role serves them: a
    `streams.respond.responder.Responder` with the role's ranking (`policy_from` the
    settings) over the kept rows, asked the question as a client asks it by default
    (recency on the memories' own clock), or, with ``as_of``, with the question's date
    (memories written after it left out, recency measured from it)."""
    from schemas import RetrievalRequest
    from streams.respond.http import policy_from
    from streams.respond.responder import Responder

    tenant = tenant_of(run.question)
    index = {t.transition.memory_id: i for i, t in enumerate(run.turns)}
    responder = Responder(
        KeptStore(tenant, list(run.rows.values())),
        encoder,
        policy_from(settings),
        per_agent_clock=settings.maintenance.stream_clock == "agent",
    )

    date = run.question.question_date if as_of else None

    def search(k: int) -> list[list[int]]:
        req = RetrievalRequest(request_id=f"q{k}", tenant=tenant, query=run.question.question,
                               k=k, as_of=date)  # fmt: skip
        resp, _ = responder.answer(req, now_ms=run.question.question_date)
        return [[index[h.memory_id]] for h in resp.hits]

    return search


#: ``searchable(run, vecs) -> (rows, stands_for)``: the searchable rows of a question
#: (embeddings) and, per row, the indices of the turns a hit on it stands for
Searchable = Callable[[QuestionRun, np.ndarray], tuple[np.ndarray, list[list[int]]]]


def kept_rows(run: QuestionRun, vecs: np.ndarray) -> tuple[np.ndarray, list[list[int]]]:
    """One row per kept turn (its own embedding)."""
    idx = [i for i, t in enumerate(run.turns) if t.transition.memory_id in run.kept]
    return vecs[idx], [[i] for i in idx]


def _topk(rows: np.ndarray, q: np.ndarray, k: int) -> list[int]:
    if rows.shape[0] == 0:
        return []
    return np.argsort(-(rows @ q), kind="stable")[:k].tolist()


def score_question(
    run: QuestionRun,
    vecs: np.ndarray,
    qvec: np.ndarray,
    searchable: Searchable = kept_rows,
    fold: str = "all",
    search: Callable[[int], list[list[int]]] | None = None,
) -> dict[str, float]:
    """Storage and recall of one question (recall keys only where they are defined).

    ``fold``: what a hit on a row that stands for several turns returns: ``all`` of
    them, or the ``best`` one, the turn closest to the question by a sign-quantised
    copy of their embeddings (one bit per dimension and turn kept with the row).
    ``search``: ``k -> the turns of the top k hits`` as dmem serves them (`served`);
    None: exact cosine over the searchable rows. The ``cosine_`` keys are exact cosine
    over the searchable rows either way: what the gate and forgetting left, whatever
    the ranking.
    """
    if fold not in ("all", "best"):
        raise ValueError(f"fold must be 'all' or 'best', got {fold!r}")
    turns = run.turns
    rows, stands = searchable(run, vecs)
    if fold == "best":
        bits = np.sign(vecs) @ qvec
        stands = [[max(st, key=lambda i: float(bits[i]))] for st in stands]
    ev = {i for i, t in enumerate(turns) if t.evidence}
    ans = {s for s in run.question.answer_sessions if any(t.session == s for t in turns)}
    out: dict[str, float] = {
        "turns": float(len(turns)),
        "stored": float(rows.shape[0]),
        "evidence": float(len(ev)),
        "evidence_stored": float(
            sum(t.transition.memory_id in run.kept for t in turns if t.evidence)
        ),
    }
    if run.question.abstention:
        return out

    def cosine(r: np.ndarray, st: list[list[int]]) -> Callable[[int], list[list[int]]]:
        return lambda k: [st[j] for j in _topk(r, qvec, k)]

    all_stands = [[i] for i in range(len(turns))]
    kept_cosine = cosine(rows, stands)
    served_at = {k: (search or kept_cosine)(k) for k in KS}  # one request per k
    out["turns_returned_at_10"] = float(sum(len(h) for h in served_at[10]))
    for name, hits, ks in (("", served_at.__getitem__, KS),
                           ("store_all_", cosine(vecs, all_stands), KS),
                           ("cosine_", kept_cosine, (10,))):  # fmt: skip
        for k in ks:
            hit = {i for h in hits(k) for i in h}
            if ev:
                out[f"{name}turn_recall_at_{k}"] = len(hit & ev) / len(ev)
            if ans:
                sess = {turns[i].session for i in hit}
                out[f"{name}session_recall_at_{k}"] = len(sess & ans) / len(ans)
    return out


def summarise(per_q: Sequence[tuple[str, dict[str, float]]]) -> dict[str, Any]:
    """Totals (storage over all turns) and means of the recall keys over the questions
    that define them."""
    out: dict[str, Any] = {"questions": len(per_q)}
    tot: dict[str, float] = defaultdict(float)
    for _, m in per_q:
        for k in ("turns", "stored", "evidence", "evidence_stored"):
            tot[k] += m[k]
    out["turns"] = int(tot["turns"])
    out["stored"] = int(tot["stored"])
    out["evidence_turns"] = int(tot["evidence"])
    out["storage_ratio"] = tot["stored"] / max(tot["turns"], 1.0)
    out["evidence_stored_ratio"] = (
        tot["evidence_stored"] / tot["evidence"] if tot["evidence"] else None
    )
    for key in (*METRICS[2:], "turns_returned_at_10"):
        xs = [m[key] for _, m in per_q if key in m]
        out[key] = float(np.mean(xs)) if xs else None
    out["recall_questions"] = sum("turn_recall_at_10" in m for _, m in per_q)
    for key in ("turn", "session"):
        a, b = out[f"{key}_recall_at_10"], out[f"store_all_{key}_recall_at_10"]
        out[f"{key}_recall_ratio"] = a / b if a is not None and b else None
    return out


class _Cache:
    """Exact text -> unit embedding, in memory (histories share many sessions), and on
    disk between runs when ``path`` is given (keyed by the text's SHA-1: the texts
    themselves are long)."""

    def __init__(self, encoder_name: str, path: Path | None) -> None:
        from operators.encoders import build_encoder

        self.encoder = build_encoder(encoder_name, cache_size=0)
        self.name, self.path = encoder_name, path
        self.vecs: dict[str, np.ndarray] = {}
        self.added = 0
        if path is not None and path.exists():
            with np.load(path, allow_pickle=False) as z:
                if str(z["encoder"]) == encoder_name:
                    self.vecs = dict(zip(z["keys"].tolist(), z["emb"], strict=True))
        self.dim = int(self.encoder.encode(["probe"]).shape[-1])

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha1(text.encode()).hexdigest()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        keys = [self.key(t) for t in texts]
        missing = {k: t for k, t in zip(keys, texts, strict=True) if k not in self.vecs}
        if missing:
            emb = self.encoder.encode(list(missing.values()))
            self.vecs.update(zip(missing, emb, strict=True))
            self.added += len(missing)
        return np.stack([self.vecs[k] for k in keys]).astype(np.float32)

    def save(self) -> None:
        if self.path is None or not self.added:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(
            tmp,
            encoder=np.array(self.name),
            keys=np.array(list(self.vecs)),
            emb=np.stack(list(self.vecs.values())),
        )
        tmp.replace(self.path)


def run(
    data: Path,
    *,
    questions: int = 0,
    per_type: int = 0,
    encoder: str = "minilm-static",
    batch: int = 64,
    cache: Path | None = None,
    settings: Any = None,
    pipeline: Callable[[Any, Any], Any] | None = None,
    searchable: Searchable = kept_rows,
    fold: str = "all",
    ranking: str = "served",
    as_of: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Replay ``data``'s questions through the write path; storage and recall per type.

    ``settings``: the write path's and the decay's (default `Settings()` from the
    environment, with ``encoder`` as the encoder name). ``pipeline(settings, encoder)``
    builds the write pipeline (default `WritePipeline`; a prototype score plugs in
    here). ``searchable`` says what a search can return of a question's history
    (`kept_rows`: the kept turns). ``fold``: see
    `score_question`. ``ranking``: dmem's hits as the respond role ranks them
    (``served``, `served`; with `kept_rows` only) or by exact ``cosine``; ``as_of``:
    the served search passes the question's date.
    """
    if ranking not in ("served", "cosine"):
        raise ValueError(f"ranking must be 'served' or 'cosine', got {ranking!r}")
    if as_of and ranking != "served":
        raise ValueError("as_of is the served search's: it needs ranking 'served'")
    if ranking == "served" and searchable is not kept_rows:
        raise ValueError("ranking 'served' reads the kept rows; another searchable: 'cosine'")
    from streams.settings import Settings
    from streams.write.pipeline import WritePipeline

    t0 = time.monotonic()
    qs = load(data, questions, per_type)
    if settings is None:
        settings = Settings()
        settings.encoder.name = encoder  # type: ignore[assignment]
    enc = _Cache(encoder, None if cache is None else cache / f"longmemeval-embed-{encoder}.npz")
    build = pipeline or (lambda s, e: WritePipeline(s, e))
    per_q: list[tuple[str, dict[str, float]]] = []
    reasons: dict[str, int] = defaultdict(int)
    by_role: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for n, q in enumerate(qs):
        turns = transitions(q)
        texts = [t.transition.text() for t in turns]
        enc.encode(texts + [t.transition.next_text() for t in turns] + [q.question])
        pipe = build(settings, enc)  # one tenant per question: a fresh state each time
        res = replay_question(pipe, q, turns, batch, settings)
        for r in res.routes.values():
            reasons[r] += 1
        for t in turns:
            role = str((t.transition.metadata or {}).get("speaker", ""))
            by_role[role][0] += 1
            by_role[role][1] += t.transition.memory_id in res.kept
        vecs = enc.encode(texts)
        search = served(res, enc, settings, as_of) if ranking == "served" else None
        m = score_question(res, vecs, enc.encode([q.question])[0], searchable, fold, search)
        per_q.append((q.qtype, m))
        if progress is not None and (n + 1) % 10 == 0:
            progress(f"longmemeval: {n + 1}/{len(qs)} questions, {time.monotonic() - t0:.0f}s")
    enc.save()
    out = summarise(per_q)
    out["by_type"] = {
        qt: {k: v for k, v in summarise([x for x in per_q if x[0] == qt]).items()}
        for qt in sorted({qt for qt, _ in per_q})
    }
    out["storage_by_role"] = {r: c[1] / max(c[0], 1) for r, c in sorted(by_role.items())}
    out["encoder"] = encoder
    out["ranking"] = ranking
    out["as_of"] = as_of
    out["batch"] = batch
    out["routes"] = dict(sorted(reasons.items()))
    out["decay"] = {
        "half_life_s": settings.maintenance.half_life_s,
        "buffer_ttl_s": settings.maintenance.buffer_ttl_s,
        "span_factor": settings.maintenance.span_factor,
        "enabled": settings.maintenance.enabled,
    }
    out["elapsed_s"] = time.monotonic() - t0
    return out


def plot(path: Path, res: dict[str, Any]) -> None:
    """Turn and session recall@10 per question type, dmem against store-all cosine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [*res["by_type"].items(), ("all", res)]
    names = [n.replace("single-session-", "ss-") for n, _ in groups]
    served = res.get("ranking", "cosine") == "served"
    keys = [
        ("turn_recall_at_10", "dmem turn@10" + (" (served)" if served else "")),
        *([("cosine_turn_recall_at_10", "dmem turn@10 (cosine)")] if served else []),
        ("store_all_turn_recall_at_10", "store-all turn@10"),
        ("session_recall_at_10", "dmem session@10"),
        ("store_all_session_recall_at_10", "store-all session@10"),
    ]
    x = np.arange(len(groups))
    width = 0.8 / len(keys)
    fig, ax = plt.subplots(figsize=(10, 4))
    for j, (key, label) in enumerate(keys):
        vals = [float(r.get(key) or 0.0) for _, r in groups]
        ax.bar(x + (j - (len(keys) - 1) / 2) * width, vals, width, label=label)
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylim(0, 1.25)
    ax.set_ylabel("evidence recall@10")
    ax.set_title(
        f"LongMemEval: {res['questions']} questions, storage {res['storage_ratio']:.2f} "
        f"({res['encoder']}, product defaults{', as of the question' if res.get('as_of') else ''})"
    )
    ax.legend(fontsize=7, ncol=len(keys), loc="upper center")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(res: dict[str, Any]) -> None:
    """The per-type table on stderr."""
    from dmem_bench.common import print_table

    def f(x: float | None) -> float:
        return math.nan if x is None else float(x)

    rows = []
    for name, r in [*res["by_type"].items(), ("all", res)]:
        rows.append(
            [
                name,
                r["questions"],
                f(r["storage_ratio"]),
                f(r["evidence_stored_ratio"]),
                f(r["turn_recall_at_10"]),
                f(r["store_all_turn_recall_at_10"]),
                f(r["session_recall_at_10"]),
                f(r["store_all_session_recall_at_10"]),
            ]
        )
    print_table(
        "LongMemEval (in process)",
        [
            "type",
            "questions",
            "storage",
            "evidence stored",
            "turn@10",
            "all turn@10",
            "session@10",
            "all session@10",
        ],
        rows,
    )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """``python -m dmem_bench.longmemeval --data PATH [--json] [--questions N]
    [--per-type N] [--encoder NAME]``."""
    import argparse

    from dmem_bench.common import emit_json, note

    p = argparse.ArgumentParser(prog="python -m dmem_bench.longmemeval")
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--json", action="store_true")
    p.add_argument("--questions", type=int, default=0)
    p.add_argument("--per-type", type=int, default=0)
    p.add_argument("--encoder", default="minilm-static")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--cache", type=Path, default=None)
    p.add_argument("--ranking", choices=("served", "cosine"), default="served",
                   help="dmem's hits as the respond role serves them, or by cosine")  # fmt: skip
    p.add_argument("--as-of", action="store_true", help="served: ask with the question's date")
    a = p.parse_args(argv)
    res = run(
        a.data,
        questions=a.questions,
        per_type=a.per_type,
        encoder=a.encoder,
        batch=a.batch,
        cache=a.cache,
        ranking=a.ranking,
        as_of=a.as_of,
        progress=note,
    )
    table(res)
    if a.json:
        emit_json(res)
    return res


if __name__ == "__main__":
    main()
