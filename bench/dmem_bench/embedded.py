"""`dmem bench embedded`: the stack `dmem up` starts, as a new user meets it.

What runs (in a temp dir, removed at the end): `LocalStack` exactly as `dmem up`
builds it (Tansu broker, one ``all`` worker, Milvus per ``--milvus``: ``auto`` =
the embedded Milvus server when its wheel is installed, else Lite), with the
default encoder unless ``--encoder`` says otherwise.

Steps, each a key of the JSON:
1. ``up_s``: from nothing to the worker answering HTTP.
2. Clients (small tenants, before the bulk load): ``kcat_ok`` = kcat published
   ``interop_n`` transitions and the write path processed all of them (each has a
   ``written``/``dropped``/``merged`` MemoryEvent); kcat runs on a librdkafka
   >= 2.2 (`dmem_bench.kafka_clients`: the system one when new enough, else the
   one bundled with confluent-kafka), ``kcat_librdkafka`` / ``kcat_system`` say
   which and what the system kcat does as is. ``confluent_kafka_ok`` = the same
   through a confluent-kafka producer, plus a confluent-kafka consumer group that
   reads them back (``confluent_join_s``: its first record). ``openapi_valid`` =
   ``/openapi.json`` passes `openapi-spec-validator`; ``ui_ok`` from
   ``dmem_bench.ui.ui_check`` when that module exists.
3. Load: synthetic agent notes (distinct texts, Laplace rewards) POSTed to
   ``/v1/transitions`` in batches of ``--batch``, in rounds, until the tenant holds
   ``--memories`` memories (the gate keeps only part of what it sees) or
   ``max_transitions_factor`` x memories were sent. ``ingest_per_s`` =
   transitions acknowledged (202, acks=all) per second of POSTing;
   ``memories`` = the tenant's stored count (``/v1/stats``) at the end.
4. Search: ``--queries`` sequential ``POST /v1/search`` (k = 5, after
   ``--warmup`` untimed ones) per repeat; ``search_p50_ms`` / ``search_p99_ms`` =
   the median across repeats of each repeat's client-side p50 / p99. Where the time
   goes: ``server_took_p50_ms`` (the responder's ``took_ms``: encode + Milvus +
   rank), ``encode_p50_ms`` (the same encoder in this process, one query a call)
   and ``raw_search_p50_ms`` (= ``milvus_p50_ms``): a raw pymilvus search of the
   same work (k = 32, the tenant filter and the responder's output fields) from
   this process, right after each timed HTTP search, so both see the same machine;
   ``search_p50_ratio`` = search p50 / raw p50 (server mode only: a Lite file has
   one owner, and then the raw keys are null).
5. Reads a person makes (``--queries`` of each): ``get_p50_ms`` / ``get_p99_ms``
   (``GET /v1/memories/{id}`` of stored ids), ``get_missing_p50_ms`` (dropped and
   unknown ids: 404), ``get_folded_p50_ms`` (40 new notes sent twice each with a
   large reward, for dedup to fold: the ids it folded, known from the ``merged``
   events on the memories topic, read once each, answered by the survivor;
   ``get_folded_n`` of them; the worker knows each edge from its own dedup or the
   ``merged`` events, so a first read is one store round trip;
   ``get_folded_again_p50_ms``: the same ids read a second time); the stack runs with
   ``DMEM_GATE__DROP_EXACT_REPEATS=false``
   so these repeats reach dedup, which changes nothing else: the load's notes are
   distinct), ``list_page_p50_ms`` (every page of 50 of a walk
   through the whole tenant, newest first), ``history_p50_ms``
   (``GET /v1/memories/{id}/history``); ``explorer_ok``: the explorer scenario in
   headless Chromium (`dmem_bench.explorer`: find, rate, forget). The same run's
   baseline, each raw call right after the HTTP read it stands for:
   ``raw_get_p50_ms`` (a raw pymilvus primary-key query of the stored id, both
   partitions, the API's fields), ``raw_fold_p50_ms`` (the fold index's
   primary-key read of a missing id); ``get_p50_ratio`` = get p50 / raw get p50;
   and the server's own share from its ``Server-Timing`` header:
   ``get_server_p50_ms`` (the whole handler) and ``get_store_p50_ms`` (the store
   read in its worker thread); the rest of ``get_p50_ms`` is HTTP and this client.
   ``raw_get_p99_ms`` / ``get_p99_ratio`` the same for p99; ``raw_page_p50_ms``: the
   page's 50 rows read by primary key right after each page (what a store ordered by
   time would read), ``list_page_p50_ratio`` = page p50 / that, and
   ``list_page_server_p50_ms`` the page handler's ``Server-Timing`` total.
6. A/B against another revision (``--ab-ref REV``, after everything above): the same
   stack and data, its ``all`` worker restarted on REV's code (``git archive`` of this
   checkout's REV) or this checkout's, in the order REV, this, this, REV per round
   (``--ab-rounds``), so a store that slows during the run weighs on both; after each
   start, once the worker has used at most 30 % of a core over ``ab_settle_s`` (its
   start-up work done: ``quiet_after_s``), ``--warmup`` + ``--queries`` searches as in 4.
   A fresh stack per revision would add the load's variance (how the rows fell into
   segments, what the server does after a load) to the code's. ``ab_search_p50_ms`` /
   ``ab_search_p99_ms`` ({"ref", "main"}: medians over that code's runs),
   ``ab_search_p50_ratio`` / ``ab_search_p99_ratio`` (this checkout / REV) and
   ``ab_runs`` (every run).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import select
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http import client as http_client
from pathlib import Path
from typing import Any

import numpy as np

from dmem.wait import wait_settled
from dmem_bench.common import (
    NOTE_OBJECTS,
    NOTE_SUBJECTS,
    NOTE_VERBS,
    cleanup_on_signals,
    emit_json,
    machine_info,
    note,
    summarize_ms,
)

TENANT = "bench-embedded"
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def agent_note(rng: np.random.Generator) -> str:
    """A short agent note: template words plus three pseudo-words (names, places).

    Distinct enough for MiniLM that neither dedup (cosine >= 0.98) nor the gate's
    near-repeat discount (>= 0.9) folds them: measured max pairwise cosine 0.78 over
    300 notes. (`dmem bench retrieval`'s notes differ only in a number, which MiniLM
    barely sees: 4,000 of them left 96 memories.)
    """

    def word() -> str:
        return "".join(SYLLABLES[int(rng.integers(len(SYLLABLES)))]
                       for _ in range(int(rng.integers(2, 4))))  # fmt: skip

    s = NOTE_SUBJECTS[int(rng.integers(len(NOTE_SUBJECTS)))]
    v = NOTE_VERBS[int(rng.integers(len(NOTE_VERBS)))]
    o = NOTE_OBJECTS[int(rng.integers(len(NOTE_OBJECTS)))]
    return f"{s} {v} {o} for {word()} {word()} near {word()}"


@dataclass(frozen=True)
class EmbeddedConfig:
    memories: int = 10_000
    queries: int = 200
    repeats: int = 3
    warmup: int = 20
    batch: int = 1000
    encoder: str | None = None  # None: the worker's default (what `dmem up` runs)
    milvus: str = "auto"
    interop_n: int = 20
    seed: int = 7
    max_transitions_factor: int = 6
    #: the timed calls over kept-alive connections (what the SDK's client does); False:
    #: a new connection per request
    keep_alive: bool = True
    #: a git revision whose worker the search is compared with on the same stack (step 6)
    ab_ref: str | None = None
    ab_rounds: int = 2
    #: after each A/B worker start: the worker at most 30 % of a core over this long
    ab_settle_s: float = 10.0


class KeepAlive:
    """One kept-alive HTTP/1.1 connection per base URL, as the SDK's client keeps them
    (an ``aiohttp`` session): the timed calls then measure the request, not a TCP
    connect per request.

    A kept connection the server has closed meanwhile (readable before a request: EOF)
    is reopened before it is used; a request on a reused connection that the server
    dropped before answering (reset, broken pipe, closed without a status line) is sent
    once more on a new one. A timeout or any error on a fresh connection is raised:
    the request may have been processed, so it is never sent twice for those."""

    def __init__(self) -> None:
        self.conns: dict[str, http_client.HTTPConnection] = {}

    def _conn(self, base: str, timeout_s: float) -> tuple[http_client.HTTPConnection, bool]:
        """(the connection to ``base``, whether it is a reused one)."""
        conn = self.conns.get(base)
        if conn is not None and conn.sock is not None:
            readable, _, _ = select.select([conn.sock], [], [], 0)
            if readable:  # EOF (or stray bytes) on an idle connection: not reusable
                conn.close()
                conn = None
        if conn is None:
            u = urllib.parse.urlsplit(base)
            conn = self.conns[base] = http_client.HTTPConnection(
                u.hostname or "127.0.0.1", u.port or 80, timeout=timeout_s
            )
            return conn, False
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn, True

    def request(self, base: str, method: str, path: str, data: bytes | None,
                timeout_s: float) -> tuple[int, bytes, http_client.HTTPMessage]:  # fmt: skip
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for _ in (0, 1):
            conn, reused = self._conn(base, timeout_s)
            try:
                conn.request(method, path, body=data, headers=headers)
                r = conn.getresponse()
                return r.status, r.read(), r.headers
            except (http_client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                self.conns.pop(base, None)
                if not reused:
                    raise
            except BaseException:
                conn.close()
                self.conns.pop(base, None)
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()


#: the connections of the timed calls: kept alive (the default) or None (a new
#: connection per request, as ``urllib`` opens them; ``--new-connections``)
KEEP: KeepAlive | None = None


def http(base: str, method: str, path: str, body: Any = None, raw: bytes | None = None,
         timeout_s: float = 60.0) -> tuple[int, Any]:  # fmt: skip
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    if KEEP is not None:
        code, payload, _ = KEEP.request(base, method, path, data, timeout_s)
        return code, json.loads(payload) if payload else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        payload = e.read()
        return e.code, json.loads(payload) if payload else None


def server_timing(value: str | None) -> dict[str, float]:
    """``Server-Timing: store;dur=1.2, total;dur=3.4`` -> ``{"store": 1.2, "total": 3.4}``."""
    out: dict[str, float] = {}
    for part in (value or "").split(","):
        name, _, dur = part.strip().partition(";dur=")
        try:
            out[name] = float(dur)
        except ValueError:
            continue
    return out


def http_get_timed(base: str, path: str,
                   timeout_s: float = 60.0) -> tuple[int, Any, dict[str, float]]:  # fmt: skip
    """GET -> (status, JSON body, the answer's ``Server-Timing`` in ms)."""
    if KEEP is not None:
        code, payload, headers = KEEP.request(base, "GET", path, None, timeout_s)
        body = json.loads(payload) if payload else None
        return code, body, server_timing(headers.get("Server-Timing"))
    try:
        with urllib.request.urlopen(base + path, timeout=timeout_s) as r:
            return r.status, json.loads(r.read()), server_timing(r.headers.get("Server-Timing"))
    except urllib.error.HTTPError as e:
        payload = e.read()
        return (e.code, json.loads(payload) if payload else None,
                server_timing(e.headers.get("Server-Timing")))  # fmt: skip


class RawBaseline:
    """The same Milvus work as the HTTP calls, straight through pymilvus from this
    process (server mode): the run's own measure of what the machine gives."""

    def __init__(self, store: Any) -> None:
        from milvus.history import FOLD_SLOT
        from milvus.schema import PARTITIONS, VECTOR_FIELD, search_params
        from streams.respond.browse import FIELDS
        from streams.respond.responder import OUTPUT

        self.store = store
        self.fold_slot = FOLD_SLOT
        self.partitions = list(PARTITIONS)
        self.vector_field = VECTOR_FIELD
        self.params = search_params(False, 32)
        self.fields = list(dict.fromkeys([*FIELDS, "tenant", "metadata"]))
        self.output = OUTPUT

    def get(self, memory_id: str) -> None:
        from milvus import expr as E
        from schemas import storage_key

        self.store.client.query(self.store.collection,
                                filter=E.ids_in([storage_key(TENANT, memory_id)], "key"),
                                output_fields=self.fields, partition_names=self.partitions,
                                consistency_level="Bounded")  # fmt: skip

    def page(self, memory_ids: list[str]) -> None:
        """The rows of a page by primary key: what a store ordered by time would read."""
        from milvus import expr as E
        from schemas import storage_key

        keys = [storage_key(TENANT, m) for m in memory_ids]
        self.store.client.query(self.store.collection, filter=E.ids_in(keys, "key"),
                                output_fields=self.fields, partition_names=self.partitions,
                                consistency_level="Bounded")  # fmt: skip

    def fold(self, memory_id: str) -> None:
        from milvus import expr as E
        from schemas import storage_key

        key = f"{storage_key(TENANT, memory_id)}|{self.fold_slot}"
        self.store.client.query(self.store.history.name, filter=E.ids_in([key], "key"),
                                output_fields=["memory_id", "body"],
                                consistency_level="Bounded")  # fmt: skip

    def search(self, vec: Any) -> None:
        from milvus import expr as E

        self.store.client.search(self.store.collection, data=[list(map(float, vec))],
                                 filter=E.build_filter(tenant=TENANT), limit=32,
                                 output_fields=self.output, search_params=self.params,
                                 anns_field=self.vector_field,
                                 consistency_level="Bounded")  # fmt: skip


def transitions(n: int, start: int, tenant: str, seed: int, tag: str) -> list[dict[str, Any]]:
    """``n`` transitions with distinct note texts and Laplace rewards."""
    rng = np.random.default_rng(seed + start)
    out = []
    for i in range(start, start + n):
        out.append({"tenant": tenant, "agent_id": f"agent-{i % 4}", "episode_id": f"{tag}{i // 50}",
                    "step": i % 50, "observation": agent_note(rng),
                    "action": f"act-{int(rng.integers(8))}",
                    "reward": round(float(rng.laplace(0.0, 1.0)), 3),
                    "done": i % 50 == 49})  # fmt: skip
    return out


def stored(base: str, tenant: str) -> int:
    code, body = http(base, "GET", f"/v1/stats?tenant={tenant}")
    return int(body["total"]) if code == 200 else 0


def processed_ids(bootstrap: str, topic: str, want: set[str], timeout_s: float) -> set[str]:
    """Memory ids of ``want`` that have a MemoryEvent on the memories topic."""
    from aiokafka import AIOKafkaConsumer

    async def run() -> set[str]:
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False)  # fmt: skip
        await c.start()
        seen: set[str] = set()
        deadline = time.monotonic() + timeout_s
        try:
            while seen < want and time.monotonic() < deadline:
                for msgs in (await c.getmany(timeout_ms=500)).values():
                    for m in msgs:
                        mid = json.loads(m.value).get("memory_id")
                        if mid in want:
                            seen.add(mid)
        finally:
            await c.stop()
        return seen

    return asyncio.run(run())


def _first_error(err: str | None) -> str | None:
    """The line of a kcat failure that names the cause (the underflow), else its last."""
    if err is None:
        return None
    lines = err.splitlines() or [""]
    return next((ln for ln in lines if "underflow" in ln.lower()), lines[-1])[:300]


def check_clients(cfg: EmbeddedConfig, stack: Any, scratch: Path) -> dict[str, Any]:
    from dmem_bench import kafka_clients as kc
    from schemas import Transition

    out: dict[str, Any] = {}
    topic = stack.settings.topic("transitions")
    memories = stack.settings.topic("memories")
    kcat = kc.kcat_command(scratch)
    if isinstance(kcat, str):
        out.update(kcat_ok=False, kcat_reason=kcat)
    else:
        out["kcat_librdkafka"] = kcat.librdkafka
        err = kc.system_kcat_error(stack.bootstrap, topic)
        out["kcat_system"] = {
            "librdkafka": kcat.system_librdkafka,
            "ok": err is None,
            "error": _first_error(err),
        }
        recs = [Transition.model_validate(r) for r in transitions(
            cfg.interop_n, 0, "bench-kcat", cfg.seed, "kc")]  # fmt: skip
        res = kc.kcat_produce(
            kcat, stack.bootstrap, topic, [(r.agent_id, r.model_dump_json()) for r in recs]
        )
        seen = processed_ids(stack.bootstrap, memories, {r.memory_id for r in recs}, 90) if (
            res.returncode == 0) else set()  # fmt: skip
        out["kcat_processed"] = len(seen)
        out["kcat_ok"] = res.returncode == 0 and len(seen) == len(recs)
        if not out["kcat_ok"]:
            out["kcat_reason"] = res.stderr.strip()[-300:] or f"processed {len(seen)}/{len(recs)}"
    try:
        recs = [Transition.model_validate(r) for r in transitions(
            cfg.interop_n, 0, "bench-ck", cfg.seed, "ck")]  # fmt: skip
        acked = kc.confluent_produce(stack.bootstrap, topic, [
            (r.agent_id.encode(), r.model_dump_json().encode()) for r in recs])  # fmt: skip
        seen = processed_ids(stack.bootstrap, memories, {r.memory_id for r in recs}, 90)
        got, first_s = kc.confluent_consume(stack.bootstrap, topic, f"bench-{uuid.uuid4().hex[:6]}",
                                            n=len(recs), timeout_s=60)  # fmt: skip
        out.update(confluent_acked=acked, confluent_processed=len(seen), confluent_read=got,
                   confluent_join_s=round(first_s, 2))  # fmt: skip
        out["confluent_kafka_ok"] = acked == len(seen) == len(recs) and got >= len(recs)
    except ImportError:
        out.update(confluent_kafka_ok=False, confluent_reason="confluent-kafka not installed")
    return out


def check_openapi(base: str) -> tuple[bool, str]:
    try:
        from openapi_spec_validator import validate
    except ImportError:
        return False, "openapi-spec-validator not installed"
    code, doc = http(base, "GET", "/openapi.json")
    if code != 200:
        return False, f"GET /openapi.json: {code}"
    try:
        validate(doc)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return False, f"invalid: {exc}"[:300]
    return True, "valid"


def check_ui(base: str) -> tuple[bool, str]:
    try:
        ui = importlib.import_module("dmem_bench.ui")
    except ImportError:
        return False, "ui check not available"
    ok, why = ui.ui_check(base, None, TENANT)
    return bool(ok), str(why)


def load(cfg: EmbeddedConfig, base: str) -> dict[str, Any]:
    """POST transitions in rounds until the tenant holds cfg.memories memories."""
    sent, post_s, rejected = 0, 0.0, 0
    cap = cfg.max_transitions_factor * cfg.memories
    have = 0
    t_load = time.monotonic()
    while have < cfg.memories and sent < cap:
        want = min(cap - sent, max(cfg.batch, 2 * (cfg.memories - have)))
        for start in range(sent, sent + want, cfg.batch):
            n = min(cfg.batch, sent + want - start)
            recs = transitions(n, start, TENANT, cfg.seed, "ep")
            t0 = time.perf_counter()
            code, body = http(base, "POST", "/v1/transitions", recs)
            while code in (429, 503):  # backpressure: honour it and resend the same batch
                rejected += 1
                time.sleep(1.0)
                code, body = http(base, "POST", "/v1/transitions", recs)
            post_s += time.perf_counter() - t0
            if code != 202:
                raise RuntimeError(f"ingest answered {code}: {body}")
        sent += want
        wait_settled([base], timeout_s=600, quiet_s=2.0)  # the write path worked it off
        have = stored(base, TENANT)
        note(f"load: sent {sent:,} transitions, {have:,} memories stored")
    return {
        "transitions": sent,
        "memories": have,
        "ingest_per_s": round(sent / post_s, 1),
        "ingest_retries": rejected,
        "load_s": round(time.monotonic() - t_load, 1),
    }


def ms_p50(samples_s: list[float]) -> float | None:
    return round(summarize_ms(samples_s)["p50"], 2) if samples_s else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def timed_search(base: str, query: str) -> tuple[float, float]:
    """One search over HTTP as an agent asks it (k = 5): (seconds it took, the
    responder's ``took_ms``); anything but 200 is an error."""
    t0 = time.perf_counter()
    code, body = http(base, "POST", "/v1/search", {"tenant": TENANT, "query": query, "k": 5})
    dt = time.perf_counter() - t0
    if code != 200:
        raise RuntimeError(f"search answered {code}: {body}")
    return dt, float(body.get("took_ms", 0.0))


def measure_search(cfg: EmbeddedConfig, base: str, raw: RawBaseline | None,
                   encoder: Any) -> dict[str, Any]:  # fmt: skip
    """Timed HTTP searches; after each, the raw search of the same query (server mode)."""
    rng = np.random.default_rng(cfg.seed + 99)
    p50s: list[float] = []
    p99s: list[float] = []
    took: list[float] = []
    enc: list[float] = []  # s, encoding one query in this process
    mil: list[float] = []  # s, the raw search of that query
    for rep in range(cfg.repeats):
        qs = [agent_note(rng) for _ in range(cfg.warmup + cfg.queries)]
        lat = []
        for i, q in enumerate(qs):
            dt, took_ms = timed_search(base, q)
            if i < cfg.warmup:
                continue
            lat.append(dt)
            took.append(took_ms)
            if raw is not None or len(enc) < 50:
                t0 = time.perf_counter()
                vec = encoder.encode([q])[0]
                enc.append(time.perf_counter() - t0)
            if raw is not None:
                t0 = time.perf_counter()
                raw.search(vec)
                mil.append(time.perf_counter() - t0)
        s = summarize_ms(lat)
        p50s.append(s["p50"])
        p99s.append(s["p99"])
        note(f"search repeat {rep + 1}: p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms")
    p50 = round(statistics.median(p50s), 2)
    raw_p50 = ms_p50(mil)
    return {
        "search_p50_ms": p50,
        "search_p99_ms": round(statistics.median(p99s), 2),
        "search_p50_ms_repeats": [round(x, 2) for x in p50s],
        "search_p99_ms_repeats": [round(x, 2) for x in p99s],
        "server_took_p50_ms": round(statistics.median(took), 2),
        "encode_p50_ms": ms_p50(enc),
        "raw_search_p50_ms": raw_p50,
        "raw_search_p99_ms": round(summarize_ms(mil)["p99"], 2) if mil else None,
        "milvus_p50_ms": raw_p50,
        "search_p50_ratio": ratio(p50, raw_p50),
    }


def merged_ids(bootstrap: str, topic: str, want: set[str], timeout_s: float) -> set[str]:
    """Those of ``want`` with a ``merged`` MemoryEvent: the whole memories topic, read
    to its end (as it is when called)."""
    from aiokafka import AIOKafkaConsumer

    from streams.admin import ReadEnds

    async def run() -> set[str]:
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False)  # fmt: skip
        await c.start()
        out: set[str] = set()
        end: ReadEnds | None = None
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                for msgs in (await c.getmany(timeout_ms=500)).values():
                    for m in msgs:
                        ev = json.loads(m.value)
                        if ev.get("kind") == "merged" and ev.get("memory_id") in want:
                            out.add(ev["memory_id"])
                parts = list(c.assignment())
                if not parts:
                    continue
                if end is None:
                    end = ReadEnds(await c.end_offsets(parts))
                if all([await c.position(tp) >= end.of(c, tp) for tp in parts]):
                    break
        finally:
            await c.stop()
        return out

    return asyncio.run(run())


def fold_some(cfg: EmbeddedConfig, base: str, bootstrap: str, topic: str,
              n: int = 40) -> list[str]:  # fmt: skip
    """``n`` pairs of new, strongly rewarded notes, each sent twice (same note, action
    and reward; two episodes) for dedup to fold one into the other; returns the ids
    it folded (a repeat the gate dropped is not one), found from the ``merged``
    events on the memories topic, so no read through the API has seen them yet."""
    from schemas import Transition

    rng = np.random.default_rng(cfg.seed + 11)
    recs = []
    for i in range(n):
        text = agent_note(rng)
        for copy in range(2):
            recs.append({"tenant": TENANT, "agent_id": "agent-fold", "episode_id":
                         f"fold{i}-{copy}", "step": 0, "observation": text,
                         "action": "act-fold", "reward": 25.0})  # fmt: skip
    code, body = http(base, "POST", "/v1/transitions", recs)
    if code != 202:
        raise RuntimeError(f"ingest answered {code}: {body}")
    wait_settled([base], timeout_s=300, quiet_s=2.0)
    ids = [Transition.model_validate(r).memory_id for r in recs]
    folded = merged_ids(bootstrap, topic, set(ids), 120)
    return [m for m in dict.fromkeys(ids) if m in folded]


@dataclass
class Timed:
    """Client latencies (s), the server's ``Server-Timing`` (ms) and raw calls (s)."""

    lat: list[float]
    total: list[float]
    store: list[float]
    raw: list[float]


def _timed(base: str, paths: list[str], want: int, raw: Callable[[str], None] | None = None,
           ids: list[str] | None = None) -> Timed:  # fmt: skip
    """GET each path (its status must be ``want``); after each, ``raw`` of its id if given."""
    out = Timed([], [], [], [])
    for i, p in enumerate(paths):
        t0 = time.perf_counter()
        code, body, st = http_get_timed(base, p)
        out.lat.append(time.perf_counter() - t0)
        if code != want:
            raise RuntimeError(f"GET {p} answered {code}, expected {want}: {body}")
        if "total" in st:
            out.total.append(st["total"] / 1e3)
            out.store.append(st.get("store", 0.0) / 1e3)
        if raw is not None and ids is not None:
            t0 = time.perf_counter()
            raw(ids[i])
            out.raw.append(time.perf_counter() - t0)
    return out


def measure_reads(cfg: EmbeddedConfig, base: str, sent: int, folded_asked: list[str],
                  raw: RawBaseline | None = None) -> dict[str, Any]:  # fmt: skip
    """Reads a person makes: by id (stored, missing, folded: `fold_some`'s ids), pages
    of 50, history; with `raw`, each stored and missing read is followed by its raw
    pymilvus counterpart."""
    from schemas import Transition

    rng = np.random.default_rng(cfg.seed + 7)
    pages, ids, cursor, raw_pages, page_server = [], [], None, [], []
    while True:  # the whole tenant, newest first, 50 a page
        path = f"/v1/memories?tenant={TENANT}&limit=50" + (f"&cursor={cursor}" if cursor else "")
        t0 = time.perf_counter()
        code, body, st = http_get_timed(base, path)
        pages.append(time.perf_counter() - t0)
        if code != 200:
            raise RuntimeError(f"GET {path} answered {code}: {body}")
        page_server += [st["total"] / 1e3] if "total" in st else []
        got = [m["memory_id"] for m in body["memories"]]
        ids += got
        if raw is not None and got:
            t0 = time.perf_counter()
            raw.page(got)
            raw_pages.append(time.perf_counter() - t0)
        cursor = body["next_cursor"]
        if cursor is None:
            break
    n = min(cfg.queries, len(ids))
    sample = [ids[int(i)] for i in rng.choice(len(ids), size=n, replace=False)] if n else []
    stored = set(ids)
    dropped = [m for m in (Transition.model_validate(r).memory_id
                           for r in transitions(min(sent, 4 * n), 0, TENANT, cfg.seed, "ep"))
               if m not in stored][: n // 2]  # fmt: skip
    unknown = [uuid.uuid4().hex for _ in range(n - len(dropped))]
    q = f"?tenant={TENANT}"
    get = _timed(base, [f"/v1/memories/{m}{q}" for m in sample], 200,
                 raw.get if raw else None, sample)  # fmt: skip
    gone = dropped + unknown
    missing = _timed(base, [f"/v1/memories/{m}{q}" for m in gone], 404,
                     raw.fold if raw else None, gone)  # fmt: skip
    fold = _timed(base, [f"/v1/memories/{m}{q}" for m in folded_asked], 200)
    # the same folded ids again: the worker has read their fold edges now
    warm = _timed(base, [f"/v1/memories/{m}{q}" for m in folded_asked], 200)
    hist = _timed(base, [f"/v1/memories/{m}/history{q}" for m in sample], 200)
    r2 = lambda v: round(v, 2)  # noqa: E731
    get_p50 = r2(summarize_ms(get.lat)["p50"])
    get_p99 = r2(summarize_ms(get.lat)["p99"])
    raw_get = ms_p50(get.raw)
    raw_get_p99 = r2(summarize_ms(get.raw)["p99"]) if get.raw else None
    page_p50 = r2(summarize_ms(pages)["p50"])
    raw_page = ms_p50(raw_pages)
    return {
        "get_p50_ms": get_p50,
        "get_p99_ms": get_p99,
        "get_missing_p50_ms": r2(summarize_ms(missing.lat)["p50"]),
        "get_folded_p50_ms": r2(summarize_ms(fold.lat)["p50"]) if fold.lat else None,
        "get_folded_n": len(fold.lat),
        "get_folded_again_p50_ms": r2(summarize_ms(warm.lat)["p50"]) if warm.lat else None,
        "list_page_p50_ms": page_p50,
        "list_page_p99_ms": r2(summarize_ms(pages)["p99"]),
        "list_pages": len(pages),
        "list_page_server_p50_ms": ms_p50(page_server),
        "raw_page_p50_ms": raw_page,
        "list_page_p50_ratio": ratio(page_p50, raw_page),
        "listed": len(ids),
        "history_p50_ms": r2(summarize_ms(hist.lat)["p50"]),
        "reads_sampled": n,
        "get_server_p50_ms": ms_p50(get.total),
        "get_store_p50_ms": ms_p50(get.store),
        "get_missing_server_p50_ms": ms_p50(missing.total),
        "get_folded_server_p50_ms": ms_p50(fold.total),
        "raw_get_p50_ms": raw_get,
        "raw_fold_p50_ms": ms_p50(missing.raw),
        "get_p50_ratio": ratio(get_p50, raw_get),
        "raw_get_p99_ms": raw_get_p99,
        "get_p99_ratio": ratio(get_p99, raw_get_p99),
    }


def check_explorer(base: str) -> tuple[bool, str]:
    """The explorer scenario (`dmem_bench.explorer`) on the tenant's newest memory."""
    from dmem_bench.explorer import explorer_check

    code, body = http(base, "GET", f"/v1/memories?tenant={TENANT}&limit=1")
    if code != 200 or not body["memories"]:
        return False, f"no memory to explore (list answered {code})"
    ok, why, _ = explorer_check(base, None, TENANT, body["memories"][0]["memory_id"])
    return ok, why


#: one round of the A/B: the reference revision, this checkout, this checkout, the reference
AB_ROUND = ("ref", "main", "main", "ref")


def ab_order(rounds: int) -> list[str]:
    """Which code each worker start of the A/B runs, in order."""
    return [code for _ in range(rounds) for code in AB_ROUND]


def export_revision(rev: str, dest: Path) -> Path:
    """This checkout's git revision ``rev``, written to ``dest`` (``git archive``)."""
    from schemas.errors import ConfigError
    from streams.local.stack import REPO_ROOT

    def git(*args: str) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(["git", "-C", str(REPO_ROOT), *args],
                                  capture_output=True, check=False)  # fmt: skip
        except FileNotFoundError as exc:
            raise ConfigError(f"--ab-ref needs git: {exc}") from exc

    # resolved first: a revision that starts with "-" is never read as an option
    found = git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}")
    if found.returncode != 0:
        raise ConfigError(f"--ab-ref {rev!r}: not a commit of this checkout ({REPO_ROOT})")
    arch = git("archive", "--format=tar", found.stdout.decode().strip())
    if arch.returncode != 0:
        why = arch.stderr.decode(errors="replace").strip()
        raise ConfigError(f"--ab-ref {rev!r}: git archive failed: {why}")
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch.stdout, check=True)
    return dest


def ab_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The A/B keys from its runs (each with ``code`` "ref" or "main", ``p50``, ``p99``)."""
    out: dict[str, Any] = {"ab_search_p50_ms": {}, "ab_search_p99_ms": {}}
    for key in ("p50", "p99"):
        for code in ("ref", "main"):
            xs = [r[key] for r in runs if r["code"] == code]
            out[f"ab_search_{key}_ms"][code] = round(statistics.median(xs), 2) if xs else None
        m, r = out[f"ab_search_{key}_ms"]["main"], out[f"ab_search_{key}_ms"]["ref"]
        out[f"ab_search_{key}_ratio"] = round(m / r, 3) if m and r else None
    out["ab_runs"] = runs
    return out


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), or None."""
    import os

    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_quiet(pid: int, busy_share: float, quiet_s: float, timeout_s: float) -> float:
    """Block until process ``pid`` itself (not its children nor the servers it talks to)
    used at most ``busy_share`` of a core over the last ``quiet_s`` seconds (a worker's
    start-up work done: state restores, its in-memory indexes), at most ``timeout_s``;
    returns the seconds waited. Without ``/proc``: ``quiet_s``."""
    t0 = time.monotonic()
    window: list[tuple[float, float]] = []
    while time.monotonic() - t0 < timeout_s:
        cpu = cpu_seconds(pid)
        if cpu is None:
            time.sleep(quiet_s)
            break
        now = time.monotonic()
        window.append((now, cpu))
        # keep the newest sample that is at least quiet_s old as the window's start
        while len(window) > 1 and now - window[1][0] >= quiet_s:
            window.pop(0)
        span = now - window[0][0]
        if span >= quiet_s and span > 0 and (cpu - window[0][1]) / span <= busy_share:
            break
        time.sleep(0.5)
    return round(time.monotonic() - t0, 1)


def measure_ab(cfg: EmbeddedConfig, stack: Any, tmp: Path) -> dict[str, Any]:
    """Step 6: search latency of ``cfg.ab_ref``'s worker and this checkout's, one stack."""
    assert cfg.ab_ref is not None
    ref_root = export_revision(cfg.ab_ref, tmp / "ab-ref")
    rng = np.random.default_rng(cfg.seed + 7)
    order = ab_order(cfg.ab_rounds)
    runs: list[dict[str, Any]] = []
    for i, code in enumerate(order):
        stack.stop_workers()
        worker = stack.start_worker("all", ref_root if code == "ref" else None)
        stack.wait_ready(worker)
        base = f"http://127.0.0.1:{stack.web_ports[0]}"
        # the worker's start-up work (more of it in one revision than in the other) is
        # not what the A/B compares: wait until the worker is idle
        assert worker.proc is not None  # started
        waited = wait_quiet(worker.proc.pid, 0.3, cfg.ab_settle_s, 180.0)
        lat, took = [], []
        for j in range(cfg.warmup + cfg.queries):
            dt, took_ms = timed_search(base, agent_note(rng))
            if j >= cfg.warmup:
                lat.append(dt)
                took.append(took_ms)
        s = summarize_ms(lat)
        runs.append({"code": code, "p50": round(s["p50"], 2), "p99": round(s["p99"], 2),
                     "took_p50": round(statistics.median(took), 2),
                     "quiet_after_s": waited})  # fmt: skip
        note(f"A/B {i + 1}/{len(order)} ({code}): p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms")
    return {"ab_ref": cfg.ab_ref, **ab_summary(runs)}


def run_embedded(cfg: EmbeddedConfig) -> dict[str, Any]:
    from milvus import MemoryStore
    from operators.encoders import build_encoder
    from streams.local.stack import LocalStack

    tmp = Path(tempfile.mkdtemp(prefix="dmem-bench-embedded-"))
    env = {"DMEM_ENCODER__NAME": cfg.encoder} if cfg.encoder else {}
    # the fold step's exact repeats must reach dedup; the load has no exact repeats
    env["DMEM_GATE__DROP_EXACT_REPEATS"] = "false"
    stack = LocalStack(tmp / "data", roles=("all",), extra_env=env, milvus=cfg.milvus)
    result: dict[str, Any] = {"config": cfg.__dict__, "machine": machine_info()}
    failed = True
    raw_store: MemoryStore | None = None
    raw: RawBaseline | None = None
    global KEEP
    KEEP = KeepAlive() if cfg.keep_alive else None
    try:
        t0 = time.monotonic()
        result["milvus_mode"] = stack.milvus_mode()
        stack.start()
        result["up_s"] = round(time.monotonic() - t0, 1)
        base = f"http://127.0.0.1:{stack.web_ports[0]}"
        settings = stack.settings
        result["encoder"] = settings.encoder.name
        note(f"up in {result['up_s']} s ({result['milvus_mode']} Milvus, {base})")
        result.update(check_clients(cfg, stack, tmp / "rdk"))
        result["openapi_valid"], result["openapi_reason"] = check_openapi(base)
        result.update(load(cfg, base))
        result["ui_ok"], result["ui_reason"] = check_ui(base)
        e = settings.encoder  # the worker's encoder, uncached: one query a call
        encoder = build_encoder(e.name, dim=e.dim, cache_size=0, static_path=e.static_path)
        if result["milvus_mode"] != "lite":  # the raw baseline reads the worker's collection
            raw_store = MemoryStore(settings.milvus_uri, collection=settings.milvus.collection,
                                    dim=encoder.dim).connect()  # fmt: skip
            raw = RawBaseline(raw_store)
        result.update(measure_search(cfg, base, raw, encoder))
        assert stack.bootstrap is not None  # started
        folded = fold_some(cfg, base, stack.bootstrap, settings.topic("memories"))
        result.update(measure_reads(cfg, base, int(result["transitions"]), folded, raw))
        result["explorer_ok"], result["explorer_reason"] = check_explorer(base)
        if cfg.ab_ref:
            result.update(measure_ab(cfg, stack, tmp))
        failed = False
    finally:
        from dmem_bench.common import teardown

        if raw_store is not None:
            raw_store.close()
        if KEEP is not None:
            KEEP.close()
            KEEP = None
        teardown(stack, None, tmp, failed)
    return result


def print_report(r: dict[str, Any]) -> None:
    from dmem_bench.common import print_table

    rows = [[k, r.get(k)] for k in (
        "milvus_mode", "encoder", "up_s", "memories", "transitions", "ingest_per_s",
        "search_p50_ms", "search_p99_ms", "server_took_p50_ms", "encode_p50_ms",
        "raw_search_p50_ms", "search_p50_ratio", "get_p50_ms", "get_p99_ms", "get_server_p50_ms",
        "raw_get_p50_ms", "get_p50_ratio", "get_missing_p50_ms", "get_folded_p50_ms",
        "list_page_p50_ms", "raw_page_p50_ms", "list_page_p50_ratio", "history_p50_ms",
        "kcat_ok", "confluent_kafka_ok", "openapi_valid",
        "ui_ok", "explorer_ok", "ab_ref", "ab_search_p50_ms", "ab_search_p99_ms",
        "ab_search_p50_ratio", "ab_search_p99_ratio")]  # fmt: skip
    print_table("Embedded stack (dmem up)", ["metric", "value"], rows)


def main(cfg: EmbeddedConfig, as_json: bool) -> dict[str, Any]:
    with cleanup_on_signals():  # SIGTERM still stops the stack it started
        r = run_embedded(cfg)
    if as_json:
        emit_json(r)
    else:
        print_report(r)
    return r
