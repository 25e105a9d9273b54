"""Store micro-benchmark: ``python -m milvus.bench [--rows 10000] [--dim 256] [--server]``.

Upserts ``rows`` random unit vectors into a temporary collection (Lite file, or
an embedded server with ``--server``, or ``--uri``), then times ``count`` and
``search`` (k=10, tenant filter, both partitions). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid

import numpy as np

from milvus.server import EmbeddedMilvusServer, milvus_lite_uri
from milvus.store import MemoryStore


def run(
    uri: str, rows: int, dim: int, queries: int, consistency: str = "Strong"
) -> dict[str, float | int | str]:
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((rows, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    recs = [
        {
            "id": f"m{i}", "tenant": f"t{i % 4}", "agent_id": "a", "episode_id": "e",
            "step": i, "vector": vecs[i], "text": f"memory {i}", "action": "x",
            "reward": 0.0, "rpe": 0.0, "rpe_smoothed": 0.0, "gate": 0.5, "valence": 0,
            "created_ts": i, "last_access_ts": i,
        }  # fmt: skip
        for i in range(rows)
    ]
    name = f"bench_{uuid.uuid4().hex[:8]}"
    store = MemoryStore(uri, collection=name, dim=dim, consistency_level=consistency).connect()
    try:
        t0 = time.perf_counter()
        store.upsert(recs[: rows // 2], "buffer")
        store.upsert(recs[rows // 2 :], "core")
        upsert_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        n = store.count()
        count_s = time.perf_counter() - t0
        lat = []
        for q in range(queries):
            t0 = time.perf_counter()
            store.search(vecs[q], tenant=f"t{q % 4}", k=10)
            lat.append(time.perf_counter() - t0)
        return {
            "uri": uri, "consistency": consistency, "rows": n, "dim": dim,
            "upsert_s": round(upsert_s, 3),
            "upsert_rows_per_s": round(rows / upsert_s), "count_ms": round(count_s * 1e3, 1),
            "search_p50_ms": round(statistics.median(lat) * 1e3, 1),
            "search_max_ms": round(max(lat) * 1e3, 1),
        }  # fmt: skip
    finally:
        store.drop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--server", action="store_true", help="start an embedded server")
    ap.add_argument("--uri")
    ap.add_argument("--consistency", default="Strong", help="search consistency level")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.uri:
            print(json.dumps(run(args.uri, args.rows, args.dim, args.queries, args.consistency)))
        elif args.server:
            with EmbeddedMilvusServer(tmp, stop_grace_s=3) as srv:
                out = run(srv.uri, args.rows, args.dim, args.queries, args.consistency)
                out["server_start_s"] = round(srv.start_s or 0.0, 2)
                print(json.dumps(out))
        else:
            uri = milvus_lite_uri(tmp)
            print(json.dumps(run(uri, args.rows, args.dim, args.queries, args.consistency)))


if __name__ == "__main__":
    main()
