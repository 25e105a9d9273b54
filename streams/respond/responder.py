"""Query responder core: `RetrievalRequest` -> `RetrievalResponse` (+ `MemoryUsage`).

Plain object, no faust: the Kafka agent and the HTTP view both call `answer`
in a worker thread. Decisions:
- Candidates: ANN top-C (C = max(4k, 32)) over the requested partitions with
  the tenant filter (and the agent scope when given), then `operators.retrieval`
  re-ranks them. Unknown tenants simply have no rows: the answer is empty.
- Filters are structured (`SearchFilters`) and become `MemoryStore` filter
  dicts, which validate field names and escape values; metadata keys must be
  plain identifiers. No client text ever becomes expression syntax.
- The default lambda comes from the tenant's memory count (cached for
  `count_ttl_s`), per `RankPolicy.lambda_for`; a default request is ranked in two
  lanes (`operators.retrieval`: the main lane with its promotion bonus for an
  established credit effect, and the exploration slot), a request that sets
  lambda without them.
- Every answer to a request with an `episode_id` yields a `MemoryUsage` with the
  served ids, their normalised score weights, the lane that served each and its
  serve probability.
- A request's ``as_of`` (the question's date, event time) leaves out memories
  written after it and measures recency from it.
- Time: recency and the access stamps are stream time on the memories' own
  clock, never the wall clock: per (tenant, agent) (or per tenant, with
  ``DMEM_MAINTENANCE__STREAM_CLOCK=tenant``) the highest event time this
  responder has read from that clock's memories (`operators.retrieval.StreamClock`).
  A retrieval is stamped (``last_access_ts``) with the served memory's clock, so
  the jobs measure "time since access" on the same clock as every other age.
  ``now_ms`` (the wall clock) only stamps the `MemoryUsage` (credit windows are
  ingestion time, see `streams.jobs.credit`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from operators import Encoder, PassthroughEncoder
from operators.retrieval import RankPolicy, StreamClock, rank, usage_weights
from schemas import (
    Hit,
    MemoryUsage,
    RetrievalRequest,
    RetrievalResponse,
    ScoreBreakdown,
    SearchFilters,
)
from schemas.errors import InvalidRecord
from schemas.models import META_KEY
from streams.metrics import MILVUS_LATENCY

OUTPUT = [
    "id",
    "tenant",
    "agent_id",
    "episode_id",
    "step",
    "text",
    "action",
    "reward",
    "rpe",
    "rpe_smoothed",
    "utility",
    "uses",
    "valence",
    "created_ts",
    "merged_count",
    "metadata",
]


def store_filter(req: RetrievalRequest) -> dict[str, Any]:
    """Structured filters -> the store's validated filter dict."""
    return filter_terms(req.filters, req.as_of)


def filter_terms(f: SearchFilters, as_of: int | None = None) -> dict[str, Any]:
    """`SearchFilters` (and a question's ``as_of``) -> the store's filter dict."""
    out: dict[str, Any] = {}
    if f.valence is not None:
        out["valence"] = f.valence
    rng: dict[str, int] = {}
    if f.since_ms is not None:
        rng[">="] = f.since_ms
    until = [x for x in (f.until_ms, as_of) if x is not None]
    if until:  # nothing written after the question was asked
        rng["<="] = min(until)
    if rng:
        out["created_ts"] = rng
    if f.min_utility is not None:
        out["utility"] = {">=": f.min_utility}
    for key, value in f.metadata_equals.items():
        if not META_KEY.match(key):
            raise InvalidRecord(f"metadata filter key {key!r} must be a plain identifier")
        out[f"metadata.user.{key}"] = value
    return out


class SeenRequests:
    """The last ``size`` (tenant, request_id) pairs answered, thread-safe: a retried
    search (the SDK retries a timed-out one with the same id) counts its hits once."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._lock = threading.Lock()

    def first(self, tenant: str, request_id: str) -> bool:
        """True the first time the pair is seen (within the last ``size``)."""
        key = (tenant, request_id)
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return False
            self._seen[key] = None
            if len(self._seen) > self.size:
                self._seen.popitem(last=False)
            return True


class Responder:
    """Answers retrieval requests from the store (see the module doc).

    ``on_access`` is called as (tenant, served memory ids, stream time of their
    clock) after each answer, once per clock among the served memories, and once per
    request id (`SeenRequests`: a retry is not a second retrieval); the respond role
    passes the batching access tracker (`streams.jobs.access`).
    """

    def __init__(
        self,
        store: Any,
        encoder: Encoder,
        policy: RankPolicy | None = None,
        count_ttl_s: float = 30.0,
        consistency_level: str | None = None,
        per_agent_clock: bool = True,
        on_access: Callable[[str, list[str], int], None] | None = None,
    ) -> None:
        self.store = store
        self.on_access = on_access
        self.clock = StreamClock(per_agent=per_agent_clock)
        self.encoder = encoder
        self.policy = policy or RankPolicy.hybrid()
        self.count_ttl_s = count_ttl_s
        self.consistency_level = consistency_level
        self._counts: dict[str, tuple[float, int]] = {}
        self.answered = 0
        self.seen = SeenRequests()

    def tenant_size(self, tenant: str) -> int:
        now = time.monotonic()
        hit = self._counts.get(tenant)
        if hit and now - hit[0] < self.count_ttl_s:
            return hit[1]
        # with the searches' consistency: a Strong count waits for a time tick per
        # partition (the search that refreshes it would pay ~0.8 s), and lambda only needs
        # the count's order of magnitude
        n = int(
            self.store.count(tenant=tenant, consistency_level=self.consistency_level or "Strong")
        )
        self._counts[tenant] = (now, n)
        return n

    def query_vector(self, req: RetrievalRequest) -> np.ndarray:
        if req.vector is not None:
            if len(req.vector) != self.encoder.dim:
                raise InvalidRecord(
                    f"wrong vector dim: query has {len(req.vector)}, store expects "
                    f"{self.encoder.dim}"
                )
            v = np.asarray(req.vector, dtype=np.float32)
            n = float(np.linalg.norm(v))
            if n == 0:
                raise InvalidRecord("query vector is all zeros")
            return v / n
        if isinstance(self.encoder, PassthroughEncoder):
            raise InvalidRecord("this deployment stores state vectors: send `vector`, not text")
        assert req.query is not None
        return self.encoder.encode([req.query])[0]

    @staticmethod
    def merged_ids(rows: list[Any]) -> dict[str, list[str]]:
        """The folded transition ids of the served survivors, from the rows' own
        metadata (the search returns it: no second read)."""
        out: dict[str, list[str]] = {}
        for r in rows:
            if int(r.get("merged_count", 1) or 1) > 1:
                merge = (r.get("metadata") or {}).get("merge") or {}
                out[str(r["id"])] = [str(i) for i in merge.get("ids", [])]
        return out

    def answer(
        self, req: RetrievalRequest, now_ms: int
    ) -> tuple[RetrievalResponse, MemoryUsage | None]:
        t0 = time.perf_counter()
        vec = self.query_vector(req)
        parts = (req.filters.partition,) if req.filters.partition else ("core", "buffer")
        t_search = time.perf_counter()
        cands = self.store.search(
            vec,
            tenant=req.tenant,
            k=max(4 * req.k, 32),
            partitions=parts,
            agent_id=req.agent_id,
            extra_filter=store_filter(req) or None,
            output_fields=OUTPUT,
            consistency_level=self.consistency_level,
        )
        MILVUS_LATENCY.labels(op="search").observe(time.perf_counter() - t_search)
        pool: list[Any] = list(cands)
        lanes = req.lambda_ is None  # credit takes part only in the default ranking
        if req.lambda_ is not None:
            lam = req.lambda_
        else:  # the count schedule (operators/retrieval.py)
            lam = self.policy.lambda_for(self.tenant_size(req.tenant))
        vectors = None
        if req.mmr and pool:
            rows = self.store.get(
                [c["id"] for c in pool],
                tenant=req.tenant,
                with_vector=True,
                output_fields=["id", "vector"],
            )
            vectors = {r["id"]: np.asarray(r["vector"], dtype=np.float32) for r in rows}
        stream_now = self.clock.observe(req.tenant, cands)
        # recency from the question's own time where it says one; the access stamps
        # (`on_access`) stay on the memories' clock
        now_rank: float | dict[str, int] = stream_now if req.as_of is None else float(req.as_of)
        spans = {a: float(self.clock.span(req.tenant, a, req.as_of)) for a in stream_now}
        ranked = rank(pool, self.policy, lam, now_rank, req.k, vectors, lanes=lanes, spans=spans)
        folded = self.merged_ids([r.row for r in ranked])
        hits = [
            Hit(
                memory_id=str(r.row["id"]),
                text=str(r.row.get("text", "")),
                action=str(r.row.get("action", "")),
                reward=float(r.row.get("reward", 0.0)),
                rpe=float(r.row.get("rpe", 0.0)),
                valence=int(r.row.get("valence", 0)),
                utility=float(r.row.get("utility", 0.0)),
                partition=r.row["partition"],
                episode_id=str(r.row.get("episode_id", "")),
                agent_id=str(r.row.get("agent_id", "")),
                step=int(r.row.get("step", 0)),
                created_ts=int(r.row.get("created_ts", 0)),
                metadata=dict((r.row.get("metadata") or {}).get("user") or {}),
                merged_count=int(r.row.get("merged_count", 1) or 1),
                merged_ids=folded.get(str(r.row["id"]), []),
                score=r.score,
                breakdown=ScoreBreakdown.model_validate(
                    {
                        "semantic": r.semantic,
                        "salience": r.salience,
                        "recency": r.recency,
                        "lambda": r.lam,
                        "score": r.score,
                        "supersedes": r.supersedes,
                        "lane": r.lane,
                        "bonus": r.bonus,
                    }
                ),
            )
            for r in ranked
        ]
        resp = RetrievalResponse(
            request_id=req.request_id,
            tenant=req.tenant,
            hits=hits,
            took_ms=(time.perf_counter() - t0) * 1e3,
        )
        usage = None
        if req.episode_id is not None and hits:
            usage = MemoryUsage(
                tenant=req.tenant,
                episode_id=req.episode_id,
                request_id=req.request_id,
                agent_id=req.agent_id,
                step=req.step or 0,
                memory_ids=[h.memory_id for h in hits],
                weights=usage_weights(ranked),
                lanes=[r.lane for r in ranked],
                propensities=[1.0] * len(ranked),  # both lanes choose deterministically
                similarities=[r.semantic for r in ranked],
                ts=now_ms,
            )
        hook = self.on_access
        if hook is not None and hits and self.seen.first(req.tenant, req.request_id):
            by_clock: dict[int, list[str]] = {}
            for h in hits:
                by_clock.setdefault(stream_now.get(h.agent_id, h.created_ts),
                                    []).append(h.memory_id)  # fmt: skip
            for stamp, ids in by_clock.items():
                hook(req.tenant, ids, stamp)
        self.answered += 1
        return resp, usage
