"""`dmem bench chaos`: crash, outage and bad-input fault injection against the real stack.

What runs (all real, nothing mocked): the embedded Tansu broker (`LocalStack`),
a Milvus 2.3.5 standalone server (`EmbeddedMilvusServer`), ``workers``
``dmem worker --role write`` subprocesses in one consumer group (the ones that get
killed; each kill and each restart is a rebalance) and, after
the stream, one ``dmem worker --role jobs`` (credit job and utility applier;
maintenance off) for the hostile tenant's feedback.
The workers are black boxes: this driver only talks to them through topics,
their processes, the write worker's ``/health`` and ``/metrics`` pages, and Milvus.

Scenario, on a fixed seed (``--seed``):
- ``transitions`` valid transitions of ``tenants`` tenants (4 agents each,
  20-step episodes, noisy step costs N(-0.1, 1) with rare +-10 surprises, so the
  gate routes some to core, some to buffer and drops the rest) are published at
  ``rate`` per second, with one fuzzed bad record (`bad_record`) after every
  ``bad_every`` valid ones: random bytes, truncated JSON, huge strings, deep
  nesting, NaN/inf, wrong types, wrong vector dims, unknown schema_version,
  unknown fields, non-object JSON, tombstones.
- ``kills`` times, at random points of the stream, a write worker (a random one
  of ``workers``) gets SIGKILL and is restarted after a random 0.2-2 s pause.
  When ``kills >= 2`` one kill happens inside the Milvus outage (a fresh worker
  must start while Milvus is down and must not crash-loop).
- At 40 % of the stream (once a write worker answers ``/health``: one restarted
  just before may still be starting) the Milvus server is stopped for ``outage_s`` seconds
  and restarted on the same data dir and ports (`EmbeddedMilvusServer.restart`).
  During the outage the driver polls the workers' ``/health`` (expects 503) and
  ``/metrics`` (``dmem_store_healthy 0``).
- At 80 % of the stream the broker process is paused (SIGSTOP) for
  ``broker_pause_s`` seconds and resumed (a broker hiccup: connections hang).
- An unexpected worker exit (not one of our kills) is counted in
  ``worker_deaths`` and the worker is restarted so the run can finish.
- A hostile tenant (``HOSTILE``) reuses the other tenants' memory ids:
  one transition per ``hostile_every`` valid ones, with ``transition_id`` set to
  an id another tenant already published (surprising rewards, so most are
  stored), through the same kills and outage. After the drain the victims'
  rows are snapshotted (every field, the vector's bytes included) and the
  hostile tenant sends, over Kafka, ``hostile_feedback`` thumbs-down
  `Feedback` on victims' ids, ``hostile_episodes`` `MemoryUsage` reports naming
  10 victims' ids each plus their `EpisodeOutcome`, and ``hostile_forgets``
  forget requests (`forget_scope` + the ``forgotten`` notices on ``control``,
  exactly what ``dmem forget --tenant T --memory ID`` does) for victims' ids.
  Once the credit topic is drained by the applier the victims' rows are read
  again.
- Kafka auth is on for the whole run (`streams.auth.KafkaGuard`): every tenant,
  the hostile one included, holds its own token (`token_of`) and signs what it
  publishes; fuzzed records carry no credential. After the above, a respond
  worker starts, the victim ``KAFKA_VICTIM``'s own SDK searches once (the
  control: answered on its own reply topic), and ``kafka_hostile`` records go
  out against the victim (the victim's rows are snapshotted once the control's
  access stamps are flushed), each bare, signed with the intruder's token for the
  victim's tenant, or signed for the intruder's own: retrieval requests for the
  victim (reply topic unset, the shared one, the victim's, the intruder's),
  transitions reusing the victim's ids, thumbs-down, usage + outcomes, forged
  ``forgotten`` notices on ``control`` (dated far in the future), forged
  utility updates on ``credit`` and poisoned checkpoints on ``models`` (an RND
  net of 10^7 hidden units) under the victim's state keys. Then a write worker
  is killed and restarted (the rebalance restores states from ``models``).

Then the driver waits until the worker group has committed every published
offset, reads the whole ``memories`` and ``deadletter`` topics, and counts:

- ``expected_stored``: distinct memory ids with a ``written`` MemoryEvent (the
  gate routed them to a partition, in some run of the worker);
- ``stored``: distinct ids of those found in Milvus; ``lost`` = expected - stored;
- ``duplicated``: rows beyond one per transition (same id in both partitions,
  or the same (tenant, agent, episode, step) under two ids);
- ``unprocessed``: valid transitions with no MemoryEvent at all (must be 0);
- ``orphans``: rows in Milvus whose latest MemoryEvent says ``dropped`` (a
  replay after a kill re-routed a transition that was already upserted; see
  docs/guarantees/delivery.md: kept, not lost, reported);
- ``bad_inputs`` / ``dead_lettered``: bad records published / distinct source
  offsets of dead letters (a replay may dead-letter a record twice; counted
  once); ``good_dead_lettered`` (valid records dead-lettered, must be 0) and
  ``dead_letters_without_reason`` (must be 0);
- ``cross_tenant_hits``: after the stream, for every tenant, searches through
  the responder's code path (`Responder.answer` on the same Milvus) with
  hostile filter values (quotes, ``or``, operators, backslashes, unicode, JSON
  paths) return rows of another tenant; ``searches_rejected`` counts hostile
  requests refused by validation, ``plain_hits`` that unfiltered searches do
  find rows (the check is not vacuous);
- ``hostile_writes``: hostile records and requests sent (all of the above);
  ``cross_tenant_writes``: rows of a victim tenant changed or removed by the
  hostile traffic: victims' ids the hostile transitions reused whose victim
  row is missing or no longer holds the victim's own transition, plus victim
  rows that differ in any byte (or are gone) after the hostile feedback,
  usage, outcomes and forgets; ``hostile_rows_credited`` /
  ``hostile_rows_forgotten``: the hostile tenant's own rows (every one holding a
  victim's id) whose utility moved / that its forgets deleted (the credit and
  forget paths ran on those very ids: the check is not vacuous);
  ``credit_drained``: the applier committed the whole credit topic;
- Kafka: ``kafka_hostile_attempts`` (records sent); ``kafka_cross_tenant_reads``:
  replies to the hostile requests on any responses topic, plus the hits they
  carry; ``kafka_cross_tenant_writes``: the victim's rows changed, removed or
  added, byte for byte, across the phase; ``forged_internal_accepted``: forged
  forgets that removed their row, forged credits that moved a utility, and
  worker deaths after the poisoned checkpoints; ``unauthenticated_dead_lettered``:
  dead letters of the phase with the reason "unauthenticated" (distinct source
  records), of ``kafka_agent_records`` hostile records on agent topics;
  ``kafka_victim_search_hits``: the control search's hits (the check is not
  vacuous); ``worker_deaths`` counts the whole run (the jobs and respond workers are
  checked at the end of the Kafka phase);
- ``max_rss_mb``: a write worker's peak resident set (sampled every 0.25 s);
  ``rss_before_outage_mb`` / ``rss_outage_max_mb`` and ``max_lag`` (summed over
  the workers) show backpressure: while Milvus is down the lag grows, the
  process does not.
- Scale-out, from the write workers' assignment log lines
  (`streams.write.consumer.assignments_in_log`, killed workers' logs included):
  ``workers``; ``rebalances``: rebalances after the group first formed (joins of
  the starting workers, each kill, each restart; one rebalance = one generation's
  assignments, one per worker, within ``REBALANCE_SPAN_MS``: the embedded broker
  numbers generations from 0 again once a group has emptied); ``state_restores``:
  (tenant, partition) states restored from checkpoints over all assignments
  (``state_seeds``: per-tenant checkpoints read as seeds); ``core_burst_ratio``:
  max over rebalances of the core rate in the 60 s after the rebalance divided
  by the steady rate in the 60 s before it, where a rate is core writes per
  transition judged (MemoryEvents by their processing time ``ts``): per
  transition, because after a kill the new owner works off the backlog faster
  than the stream arrives, which multiplies core writes per second without
  any RPE storm; a cold state shows as a higher core *share*. Rebalances with
  fewer than ``BURST_MIN_EVENTS`` judged transitions in either window (the
  group forming before the stream, the end of the run) are left out;
  ``core_burst_windows`` says how many were compared.

Results: one JSON object on the last stdout line; progress and a table on stderr.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import functools
import math
import random
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dmem.client import Client
from dmem_bench.common import (
    Progress,
    cleanup_on_signals,
    emit_json,
    machine_info,
    note,
    print_table,
    teardown,
)
from schemas import DECISION_KINDS, RetrievalRequest, Transition
from streams.local.stack import LocalStack, WorkerProcess, tail
from streams.settings import Settings
from streams.write.consumer import assignments_in_log

AGENTS = 4
EPISODE_LEN = 20
DIM = 64
#: the tenant that reuses other tenants' ids
HOSTILE = "intruder"
#: window before / after a rebalance for ``core_burst_ratio``
BURST_WINDOW_MS = 60_000
#: fewest judged transitions in either window for a rebalance to be compared
BURST_MIN_EVENTS = 200
#: longest a rebalance takes from its first member's assignment to its last
REBALANCE_SPAN_MS = 30_000
#: the victim of the Kafka hostile phase
KAFKA_VICTIM = "tenant-1"

#: (key, value, bad record kind or None, headers) of one published transition record
Record = tuple[bytes | None, bytes | None, str | None, list[tuple[str, bytes]] | None]


def token_of(tenant: str) -> str:
    """Each tenant's API token in the run's token map (the Kafka credential's source)."""
    return f"chaos-token-{tenant}"


class _Signers(dict[str, Any]):
    """tenant -> its signing function (headers for a record of a tenant), made on demand."""

    def __missing__(self, tenant: str) -> Any:
        from schemas.credentials import TenantSigner

        fn = self[tenant] = TenantSigner(token_of(tenant)).headers
        return fn


SIGNERS = _Signers()


def signed(t: Transition) -> Record:
    """A valid transition, signed with its own tenant's credential."""
    value = orjson.dumps(t.model_dump(mode="json"))
    return t.agent_id.encode(), value, None, SIGNERS[t.tenant](t.tenant, value)


@dataclass
class ChaosConfig:
    transitions: int = 20_000
    tenants: int = 3
    kills: int = 3
    outage_s: float = 30.0
    broker_pause_s: float = 5.0
    rate: float = 250.0
    bad_every: int = 20
    seed: int = 7
    batch_size: int = 256
    drain_timeout_s: float = 300.0
    hostile_every: int = 10
    hostile_feedback: int = 200
    hostile_episodes: int = 20
    hostile_forgets: int = 50
    workers: int = 1
    kafka_hostile: int = 1200


# --------------------------------------------------------------------------- workload


def good_transitions(cfg: ChaosConfig) -> list[Transition]:
    """Valid transitions of all tenants, interleaved, deterministic in the seed."""
    rng = random.Random(cfg.seed)
    per_tenant = math.ceil(cfg.transitions / cfg.tenants)
    streams_: list[list[Transition]] = []
    for tenant in tenant_names(cfg):
        rows = []
        for i in range(per_tenant):
            ep, k = divmod(i, EPISODE_LEN)
            agent = f"agent-{ep % AGENTS}"
            u = rng.random()
            reward = 10.0 if u < 0.03 else -10.0 if u < 0.06 else rng.gauss(-0.1, 1.0)
            cell = rng.randrange(400)
            rows.append(
                Transition(
                    tenant=tenant,
                    agent_id=agent,
                    episode_id=f"{tenant}-ep{ep}",
                    step=k,
                    observation=f"{tenant} corridor cell {cell} step {k}",
                    action=rng.choice(["left", "right", "forward", "jump"]),
                    reward=reward,
                    next_observation=f"{tenant} corridor cell {cell + 1}",
                    done=k == EPISODE_LEN - 1,
                    metadata={"secret": tenant, "k": k},
                )
            )
        streams_.append(rows)
    out = [row for group in zip(*streams_, strict=False) for row in group]
    return out[: cfg.transitions]


def tenant_names(cfg: ChaosConfig) -> list[str]:
    return [f"tenant-{t}" for t in range(cfg.tenants)]


def hostile_transition(rng: random.Random, n: int, victim_id: str,
                       surprise: bool) -> Transition:  # fmt: skip
    """A hostile transition that reuses a victim's memory id. ``surprise``: a +-10
    reward among noise, so the hostile tenant's own gate stores it (an overwrite
    attempt that reaches Milvus, not one its gate drops)."""
    return Transition(
        transition_id=victim_id,
        tenant=HOSTILE,
        agent_id="intruder-agent",
        episode_id=f"x-ep{n // EPISODE_LEN}",
        step=n % EPISODE_LEN,
        observation=f"{HOSTILE} overwrite attempt {n}",
        action="left",
        reward=rng.choice([10.0, -10.0]) if surprise else rng.gauss(-0.1, 1.0),
        metadata={"secret": HOSTILE, "k": n},
    )


def _valid_dict(rng: random.Random) -> dict[str, Any]:
    return {
        "tenant": "tenant-0",
        "agent_id": "fuzz",
        "episode_id": f"fz{rng.randrange(10**6)}",
        "step": rng.randrange(100),
        "observation": "a fuzzed record",
        "action": "left",
        "reward": -0.1,
    }


def _nest(depth: int) -> Any:
    obj: Any = 1
    for _ in range(depth):
        obj = {"a": obj}
    return obj


BAD_KINDS = (
    "random_bytes",
    "truncated_json",
    "huge_string",
    "deep_nesting",
    "deep_json",
    "nan_inf",
    "wrong_types",
    "wrong_vector_dims",
    "unknown_schema_version",
    "unknown_field",
    "not_an_object",
    "tombstone",
)


def bad_record(rng: random.Random, kind: str | None = None) -> tuple[str, bytes | None]:
    """One invalid record of a random (or the given) kind: (kind, value bytes or None)."""
    kind = kind or rng.choice(BAD_KINDS)
    d = _valid_dict(rng)
    if kind == "random_bytes":
        return kind, bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
    if kind == "truncated_json":
        raw = orjson.dumps(d)
        return kind, raw[: rng.randrange(1, len(raw) - 1)]
    if kind == "huge_string":
        field = rng.choice(["observation", "action", "agent_id", "next_observation"])
        d[field] = "x" * rng.choice([9_000, 50_000, 200_000])
        return kind, orjson.dumps(d)
    if kind == "deep_nesting":
        d["metadata"] = {"m": _nest(rng.randrange(2, 200))}
        return kind, orjson.dumps(d)
    if kind == "deep_json":  # deeper than any JSON parser's recursion limit
        n = rng.choice([2_000, 50_000])
        return kind, b"[" * n + b"]" * n
    if kind == "nan_inf":
        variant = rng.randrange(4)
        if variant == 0:  # a bare NaN token: not JSON
            return kind, orjson.dumps(d).replace(b'"reward":-0.1', b'"reward":NaN')
        if variant == 1:  # overflows a double
            return kind, orjson.dumps(d).replace(b'"reward":-0.1', b'"reward":1e999')
        if variant == 2:
            d["reward"] = rng.choice(["inf", "-inf", "NaN", "nan"])
        else:
            d.pop("observation")
            d["state"] = [0.1, rng.choice(["inf", "NaN"])]
        return kind, orjson.dumps(d)
    if kind == "wrong_types":
        field, value = rng.choice(
            [
                ("step", "three"),
                ("step", -1),
                ("step", [1]),
                ("reward", {"a": 1}),
                ("tenant", 123),
                ("action", True),
                ("metadata", [1, 2]),
                ("done", "maybe"),
                ("ts", -5),
                ("tenant", ""),
                ("agent_id", "bad id with spaces"),
                ("observation", 42),
                ("state", "vector"),
            ]
        )
        d[field] = value
        return kind, orjson.dumps(d)
    if kind == "wrong_vector_dims":
        n = rng.randrange(2, 50)
        d["state"] = [0.1] * n
        d["next_state"] = [0.2] * (n + rng.randrange(1, 5))
        if rng.random() < 0.3:
            d["state"] = [0.1] * 5000  # above the vector limit
            d.pop("next_state")
        return kind, orjson.dumps(d)
    if kind == "unknown_schema_version":
        d["schema_version"] = rng.choice([0, 2, 99, -1, 10**9])
        return kind, orjson.dumps(d)
    if kind == "unknown_field":
        d[rng.choice(["rewrad", "tenant_id", "__proto__", "$where"])] = 1
        return kind, orjson.dumps(d)
    if kind == "not_an_object":
        return kind, rng.choice([b"[]", b"42", b'"text"', b"null", b"true", b"[{}]"])
    if kind == "tombstone":
        return kind, None
    raise ValueError(kind)


#: hostile values for the metadata filter: each tries to escape the string literal
HOSTILE_VALUES = (
    '" or tenant != "',
    "' or 1==1 or '",
    '") or (tenant like "%',
    'x\\" || true || \\"',
    "tenant-1",
    'tenant-1" || metadata["user"]["secret"] != "',
    "\\",
    '"',
    "\u202e\u0000x",
    "𝔱𝔢𝔫𝔞𝔫𝔱",
    "%",
    "*",
    'a" in ["tenant-0","tenant-1","tenant-2"] or "',
)
HOSTILE_KEYS = ('secret" or "1"=="1', "secret || true", "user.secret", "a b", "secret]")


# --------------------------------------------------------------------------- probes


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def http_get(port: int, path: str, timeout_s: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except OSError:
        return 0, b""


def metric(text: bytes, name: str) -> float | None:
    for line in text.decode(errors="replace").splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            try:
                return float(line.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None


class Chaos:
    """The fault injector: owns the write workers and the Milvus server."""

    def __init__(self, stack: LocalStack, server: Any, cfg: ChaosConfig) -> None:
        self.stack, self.server, self.cfg = stack, server, cfg
        self.writers: list[WorkerProcess] = [w for w in stack.workers if w.role == "write"]
        self.started: list[WorkerProcess] = list(self.writers)  # every one, killed included
        self.kills = 0
        self.deaths = 0
        self.restarts = 0
        self.down: set[int] = set()  # ids of workers between our SIGKILL and the restart
        self.max_rss = 0.0
        self.rss_before_outage = 0.0
        self.rss_outage_max = 0.0
        self.in_outage = False
        self.outage_s = 0.0
        self.health_503 = 0
        self.health_polls = 0
        self.store_unhealthy_metric = 0
        self.max_lag = 0.0
        self.broker_paused_s = 0.0

    def port(self, w: WorkerProcess) -> int:
        return self.stack.web_ports[self.stack.workers.index(w)]

    def _restart(self, old: WorkerProcess) -> None:
        i = self.stack.workers.index(old)
        self.stack.workers.pop(i)
        self.stack.web_ports.pop(i)
        new = self.stack.start_worker("write")
        self.writers[self.writers.index(old)] = new
        self.started.append(new)
        self.restarts += 1

    async def kill(self, rng: random.Random) -> None:
        # one worker: no draw, so the one-worker run keeps its random sequence
        w = self.writers[rng.randrange(len(self.writers))] if len(self.writers) > 1 \
            else self.writers[0]  # fmt: skip
        self.down.add(id(w))
        pid = w.proc.pid if w.proc else None
        await asyncio.to_thread(w.kill)
        self.kills += 1
        note(f"  kill -9 #{self.kills} (worker pid {pid})")
        await asyncio.sleep(rng.uniform(0.2, 2.0))
        self._restart(w)
        self.down.discard(id(w))

    async def _until_reporting(self, timeout_s: float = 90.0) -> None:
        """Until a write worker answers /health: one restarted just before the outage may
        still be importing on a loaded machine, and the outage's report is under test."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for w in [w for w in self.writers if w.alive]:
                code, _ = await asyncio.to_thread(http_get, self.port(w), "/health", 6.0)
                if code == 200:
                    return
            await asyncio.sleep(0.25)

    async def outage(self, kill_inside: bool, rng: random.Random) -> None:
        await self._until_reporting()
        self.rss_before_outage = self.max_rss
        uri = self.server.uri
        note(f"  milvus outage: stopping {uri} for {self.cfg.outage_s:.0f}s")
        t0 = time.monotonic()
        self.in_outage = True
        await asyncio.to_thread(self.server.stop)
        if kill_inside:
            # kill once a running worker has reported the outage (/health 503), or
            # at 80 % of it: both the report and a start during the outage get tested
            deadline = t0 + 0.8 * self.cfg.outage_s
            await asyncio.sleep(min(2.0, self.cfg.outage_s / 5))
            while self.health_503 == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.25)
            await self.kill(rng)
        await asyncio.sleep(max(0.0, self.cfg.outage_s - (time.monotonic() - t0)))
        new_uri = await asyncio.to_thread(self.server.restart, 180.0)
        self.in_outage = False
        self.outage_s = time.monotonic() - t0
        note(f"  milvus back at {new_uri} after {self.outage_s:.1f}s")
        if new_uri != uri:
            note(f"  WARNING: milvus came back on another address ({new_uri} != {uri})")

    async def broker_pause(self) -> None:
        """SIGSTOP the broker (unreachable, connections hang), then SIGCONT."""
        broker = self.stack.broker
        if broker is None:
            return
        note(f"  broker pause: SIGSTOP for {self.cfg.broker_pause_s:.0f}s")
        broker.pause()
        try:
            await asyncio.sleep(self.cfg.broker_pause_s)
        finally:
            broker.resume()
        self.broker_paused_s = self.cfg.broker_pause_s

    async def _probe(self, w: WorkerProcess) -> tuple[int, float]:
        """(health status, consumer lag) of one worker; counts the outage reports."""
        port = self.port(w)
        # /health probes Milvus itself (about 1.2 s when it is away): a generous
        # timeout, so a loaded machine still gets its answer during the outage
        code, _ = await asyncio.to_thread(http_get, port, "/health", 6.0)
        code_m, body = await asyncio.to_thread(http_get, port, "/metrics")
        if self.in_outage and code:
            self.health_polls += 1
            self.health_503 += code == 503
        lag = 0.0
        if code_m == 200:
            if self.in_outage and metric(body, "dmem_store_healthy") == 0.0:
                self.store_unhealthy_metric += 1
            lag = _sum_metric(body, "dmem_consumer_lag")
        return code, lag

    async def watch(self, stop: asyncio.Event) -> None:
        """Sample RSS, health and metrics; count and repair unexpected deaths."""
        last_probe = 0.0
        while not stop.is_set():
            for w in list(self.writers):
                if w.proc is None:
                    continue
                if not w.alive and id(w) not in self.down:
                    self.deaths += 1
                    note(
                        f"  WORKER DIED (exit {w.proc.returncode}); log tail:\n" + tail(w.log_path)
                    )
                    self._restart(w)
                elif w.alive:
                    r = rss_mb(w.proc.pid) or 0.0
                    self.max_rss = max(self.max_rss, r)
                    if self.in_outage:
                        self.rss_outage_max = max(self.rss_outage_max, r)
            live = [w for w in self.writers if w.alive]
            if time.monotonic() - last_probe > 1.0 and live:
                last_probe = time.monotonic()
                probes = await asyncio.gather(*(self._probe(w) for w in live))
                self.max_lag = max(self.max_lag, sum(lag for _, lag in probes))
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.25)
            except TimeoutError:
                pass


def scale_out(
    logs: list[Path], events: list[dict[str, Any]], workers: int | None = None
) -> dict[str, Any]:
    """``rebalances``, ``state_restores``, ``state_seeds``, ``core_burst_ratio`` (see the
    module doc) from the write workers' logs and the MemoryEvents (dicts). ``workers``:
    the most members one rebalance can have (the group's size: a kill replaces one
    worker at a time). Without it, a single worker's restart that joins the emptied group
    at generation 0 within REBALANCE_SPAN_MS of the previous one was taken for another
    member of that rebalance (a CI run counted 0 rebalances after 2 kills)."""
    found: list[dict[str, Any]] = []
    for i, path in enumerate(logs):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        found += [a | {"worker": i} for a in assignments_in_log(text)]
    # one rebalance = the assignments of one generation, one per worker, within
    # REBALANCE_SPAN_MS: the embedded broker starts generations at 0 again once a
    # group has emptied, so a generation number alone does not name a rebalance
    rebalances: list[dict[str, Any]] = []  # {"generation", "at_ms", "workers"}
    for a in sorted(found, key=lambda a: a["at_ms"]):
        open_ = next((r for r in reversed(rebalances) if r["generation"] == a["generation"]
                      and a["at_ms"] - r["at_ms"] <= REBALANCE_SPAN_MS
                      and a["worker"] not in r["workers"]
                      and (workers is None or len(r["workers"]) < workers)), None)  # fmt: skip
        if open_ is None:
            rebalances.append({"generation": a["generation"], "at_ms": a["at_ms"],
                               "workers": {a["worker"]}})  # fmt: skip
        else:
            open_["workers"].add(a["worker"])
    judged = sorted(
        (e["ts"], e["route"] == "core")
        for e in events
        if e["kind"] in DECISION_KINDS and e.get("reason") != "retrospective"
    )
    ts = [t for t, _ in judged]
    core = np.cumsum([0] + [int(c) for _, c in judged])

    def share(lo: int, hi: int) -> tuple[int, float]:
        i, j = bisect.bisect_left(ts, lo), bisect.bisect_left(ts, hi)
        return j - i, float(core[j] - core[i]) / max(j - i, 1)

    ratios = []
    windows = []
    t_start = ts[0] if ts else 0
    for r in rebalances[1:]:
        t = r["at_ms"]
        n_before, before = share(t - BURST_WINDOW_MS, t)
        n_after, after = share(t, t + BURST_WINDOW_MS)
        windows.append(
            {
                "generation": r["generation"],
                "at_s": round((t - t_start) / 1000, 1),
                "judged_before": n_before,
                "core_share_before": round(before, 4),
                "judged_after": n_after,
                "core_share_after": round(after, 4),
            }
        )
        if n_before >= BURST_MIN_EVENTS and n_after >= BURST_MIN_EVENTS:
            ratios.append(after / before if before > 0 else (0.0 if after == 0 else math.inf))
    return {
        "rebalance_windows": windows,
        "rebalances": max(len(rebalances) - 1, 0),
        "state_restores": sum(a["restored"] for a in found),
        "state_seeds": sum(a["seeded"] for a in found),
        "core_burst_ratio": round(max(ratios), 3) if ratios else None,
        "core_burst_windows": len(ratios),
    }


def _sum_metric(text: bytes, name: str) -> float:
    total = 0.0
    for line in text.decode(errors="replace").splitlines():
        if line.startswith(name + "{"):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
    return total


# --------------------------------------------------------------------------- driver


async def publish_all(
    settings: Settings,
    records: list[Record],
    rate: float,
    progress: list[int],
) -> tuple[dict[int, int], set[tuple[int, int]], set[tuple[int, int]]]:
    """Paced sends; returns (partition -> end offset, bad (p, o), good (p, o))."""
    from streams.admin import kafka_client_kwargs

    kw = kafka_client_kwargs(settings.kafka)
    producer = AIOKafkaProducer(linger_ms=5, max_request_size=1 << 20, **kw)
    await producer.start()
    topic = settings.topic("transitions")
    futs = []
    try:
        t0 = time.perf_counter()
        for i, (key, value, kind, headers) in enumerate(records):
            due = t0 + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            futs.append((kind, await producer.send(topic, value, key=key, headers=headers)))
            progress[0] = i + 1
        await producer.flush()
        ends: dict[int, int] = {}
        bad: set[tuple[int, int]] = set()
        good: set[tuple[int, int]] = set()
        for kind, f in futs:
            md = await f
            ends[md.partition] = max(ends.get(md.partition, 0), md.offset + 1)
            (bad if kind else good).add((md.partition, md.offset))
        return ends, bad, good
    finally:
        await producer.stop()


async def wait_committed(
    settings: Settings, ends: dict[int, int], timeout_s: float, alive: Any
) -> bool:
    from streams.admin import kafka_client_kwargs

    kw = kafka_client_kwargs(settings.kafka)
    group = AIOKafkaConsumer(group_id=settings.group("write"), enable_auto_commit=False, **kw)
    await group.start()
    topic = settings.topic("transitions")
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            done = True
            for p, end in ends.items():
                off = await group.committed(TopicPartition(topic, p))
                if off is None or off < end:
                    done = False
                    break
            if done:
                return True
            alive()
            await asyncio.sleep(0.5)
        return False
    finally:
        await group.stop()


async def read_topic(settings: Settings, logical: str) -> list[Any]:
    """Every record of a topic, from the beginning to its current end."""
    return await read_topic_named(settings, settings.topic(logical))


async def read_topic_named(settings: Settings, name: str) -> list[Any]:
    """Every record of topic `name`, from the beginning to its current end."""
    from streams.admin import ReadEnds, kafka_client_kwargs

    kw = kafka_client_kwargs(settings.kafka)
    c = AIOKafkaConsumer(enable_auto_commit=False, max_partition_fetch_bytes=8 << 20, **kw)
    await c.start()
    try:
        parts = c.partitions_for_topic(name)
        if not parts:
            await c._client.force_metadata_update()
            parts = c.partitions_for_topic(name) or set()
        tps = [TopicPartition(name, p) for p in sorted(parts)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = ReadEnds(await c.end_offsets(tps))
        msgs: list[Any] = []

        async def behind() -> bool:
            for tp in tps:
                if await c.position(tp) < ends.of(c, tp):
                    return True
            return False

        while await behind():
            batch = await c.getmany(timeout_ms=500, max_records=50_000)
            for part in batch.values():
                msgs.extend(part)
        return msgs
    finally:
        await c.stop()


def count_store(uri: str, collection: str) -> list[dict[str, Any]]:
    """Every row, every field (the vector as bytes, so rows compare byte for byte)."""
    from milvus import MemoryStore

    store = MemoryStore(uri, collection=collection, dim=DIM).connect()
    try:
        rows = list(store.scan(with_vector=True))
    finally:
        store.close()
    for r in rows:
        r["vector"] = bytes(r["vector"].tobytes())
    return rows


async def hostile_requests(
    settings: Settings,
    uri: str,
    collection: str,
    cfg: ChaosConfig,
    rng: random.Random,
    victim_ids: list[str],
) -> int:
    """Feedback, usage + outcomes (Kafka) and forgets on victims' ids; returns how many."""
    from schemas import EpisodeOutcome, Feedback, MemoryUsage
    from streams.admin import kafka_client_kwargs
    from streams.jobs.forget import emit_events

    producer = AIOKafkaProducer(linger_ms=5, **kafka_client_kwargs(settings.kafka))
    await producer.start()
    sent = 0
    now = int(time.time() * 1000)
    own = SIGNERS[HOSTILE]  # its own credential: these records speak for its own tenant
    try:
        fb_topic, usage_topic = settings.topic("feedback"), settings.topic("usage")
        for i in range(cfg.hostile_feedback):
            mid = rng.choice(victim_ids)
            fb = Feedback(
                feedback_id=f"x-fb{i}",
                tenant=HOSTILE,
                memory_id=mid,
                kind=rng.choice(["thumbs_down", "thumbs_up"]),
                ts=now,
            )
            value = encode_model(fb)
            await producer.send(fb_topic, value, key=mid.encode(), headers=own(HOSTILE, value))
            sent += 1
        for e in range(cfg.hostile_episodes):
            ep = f"x-usage{e}"
            ids = rng.sample(victim_ids, min(10, len(victim_ids)))
            usage = MemoryUsage(
                tenant=HOSTILE,
                episode_id=ep,
                request_id=f"x-req{e}",
                memory_ids=ids,
                weights=[1.0 / len(ids)] * len(ids),
                ts=now,
                source="agent",
            )
            out = EpisodeOutcome(
                outcome_id=f"x-out{e}",
                tenant=HOSTILE,
                episode_id=ep,
                reward=rng.choice([-50.0, 50.0]),
                ts=now,
            )
            for topic, value in ((usage_topic, encode_model(usage)), (fb_topic, encode_model(out))):
                await producer.send(topic, value, key=ep.encode(), headers=own(HOSTILE, value))
            sent += 2
        await producer.flush()
    finally:
        await producer.stop()
    forgotten = []
    for mid in rng.sample(victim_ids, min(cfg.hostile_forgets, len(victim_ids))):
        forgotten += await asyncio.to_thread(_forget, uri, collection, mid)
        sent += 1
    if forgotten:
        await emit_events(settings, forgotten)
    return sent


def poisoned_checkpoint() -> bytes:
    """A write-path checkpoint whose RND net claims 10^7 hidden units: built as stated,
    it would allocate ~2.5 GB per restore (and a value model of such a size more)."""
    from streams.write.pipeline import TenantState

    header = orjson.loads(TenantState(Settings(), DIM).to_bytes())
    header["intrinsic"]["rnd"]["hidden"] = 10**7
    return orjson.dumps(header)


def kafka_hostile_records(
    settings: Settings, cfg: ChaosConfig, rng: random.Random, victim_ids: list[str]
) -> tuple[list[tuple[str, bytes | None, bytes, Any]], dict[str, set[str]]]:
    """``cfg.kafka_hostile`` records against `KAFKA_VICTIM`: reads, writes, forgets,
    credit, access counts and poison, each either bare or signed with the intruder's own
    token (for the victim's tenant or for its own); returns (topic, key, value, headers)
    and the targets of the forged internal records by kind (``request``: the request
    ids)."""
    from schemas import (
        AccessCount,
        EpisodeOutcome,
        Feedback,
        MemoryEvent,
        MemoryUsage,
        UtilityUpdate,
    )
    from schemas.credentials import reply_topic_for
    from streams.write.pipeline import state_key

    victim, now = KAFKA_VICTIM, int(time.time() * 1000)
    responses = settings.topic("responses")
    reply_to = [None, responses, reply_topic_for(responses, victim),
                reply_topic_for(responses, HOSTILE)]  # fmt: skip
    poison = poisoned_checkpoint()
    out: list[tuple[str, bytes | None, bytes, Any]] = []
    targets: dict[str, set[str]] = {"forget": set(), "credit": set(), "request": set()}
    kinds = ("read", "write", "feedback", "usage", "forget", "credit", "access", "poison")
    for i in range(cfg.kafka_hostile):
        kind, mid = kinds[i % len(kinds)], rng.choice(victim_ids)
        recs: list[tuple[str, bytes | None, Any]] = []
        add = functools.partial(_add_to, recs)
        if kind == "read":
            rid = f"kx-rq{i}"
            targets["request"].add(rid)
            add("requests", victim.encode(), RetrievalRequest.model_validate({
                "request_id": rid, "tenant": victim, "query": "corridor cell", "k": 50,
                "reply_topic": reply_to[i % len(reply_to)]}))  # fmt: skip
        elif kind == "write":
            add("transitions", b"intruder-agent", Transition(
                transition_id=mid, tenant=victim, agent_id="agent-0", episode_id="kx-ep",
                step=i % EPISODE_LEN, observation=f"{HOSTILE} kafka overwrite {i}",
                action="left", reward=rng.choice([10.0, -10.0])))  # fmt: skip
        elif kind == "feedback":
            add(
                "feedback",
                mid.encode(),
                Feedback(
                    feedback_id=f"kx-fb{i}",
                    tenant=victim,
                    memory_id=mid,
                    kind="thumbs_down",
                    ts=now,
                ),
            )
        elif kind == "usage":
            ep = f"kx-ep{i}"
            add("usage", ep.encode(), MemoryUsage(
                tenant=victim, episode_id=ep, request_id=f"kx-u{i}", memory_ids=[mid],
                weights=[1.0], ts=now, source="agent"))  # fmt: skip
            add(
                "feedback",
                ep.encode(),
                EpisodeOutcome(
                    outcome_id=f"kx-o{i}", tenant=victim, episode_id=ep, reward=-50.0, ts=now
                ),
            )
        elif kind == "forget":
            targets["forget"].add(mid)
            add(
                "control",
                victim.encode(),
                MemoryEvent(kind="forgotten", memory_id=mid, tenant=victim, ts=now + 10**12),
            )
        elif kind == "credit":
            targets["credit"].add(mid)
            add(
                "credit",
                mid.encode(),
                UtilityUpdate(
                    update_id=f"kx-cr{i}", memory_id=mid, tenant=victim, credit=-100.0, ts=now
                ),
            )
        elif kind == "access":  # retrieval counts as if served a thousand times
            add(
                "access",
                mid.encode(),
                AccessCount(
                    memory_id=mid, tenant=victim, n=1000, ts=now, publisher=f"{i:016x}", seq=1
                ),
            )
        else:
            recs.append(("models", state_key(victim, i % settings.kafka.partitions), poison))
        # bare, the intruder's token signing for the victim, or for itself
        as_tenant = (None, victim, HOSTILE)[(i // len(kinds)) % 3]
        for logical, key, value in recs:
            headers = SIGNERS[HOSTILE](as_tenant, value) if as_tenant else None
            out.append((settings.topic(logical), key, value, headers))
    return out, targets


def _add_to(recs: list[tuple[str, bytes | None, Any]], logical: str, key: bytes | None,
            model: Any) -> None:  # fmt: skip
    recs.append((logical, key, encode_model(model)))


async def kafka_hostile(
    cfg: ChaosConfig, stack: LocalStack, chaos: Chaos, rng: random.Random,
    uri: str, collection: str,
) -> dict[str, Any]:  # fmt: skip
    """The Kafka half of the hostile tenant: a producer with the intruder's credential
    and one with none read, write, forget, credit and poison `KAFKA_VICTIM`; then a write
    worker is killed (the rebalance restores states from the poisoned ``models``)."""
    from streams.admin import kafka_client_kwargs

    settings = stack.settings
    responder = stack.start_worker("respond")
    await asyncio.to_thread(stack.wait_ready, responder)
    # the control: the victim's own SDK, with its token, is answered on its own topic
    # (so the responder is consuming before the hostile requests go out)
    async with Client(settings.kafka.bootstrap, KAFKA_VICTIM, token=token_of(KAFKA_VICTIM),
                      topic_prefix=settings.kafka.topic_prefix, timeout_s=10.0,
                      retries=9) as own:  # fmt: skip
        own_hits = len(await own.search("corridor cell", k=5))
    # the baseline once the control's own access stamps are flushed: from here on, any
    # change to the victim's rows is the hostile traffic's
    await asyncio.sleep(settings.maintenance.access_flush_s + 3.0)
    await wait_credit_applied(settings, 30.0, 1, "access")  # the jobs role folded them in
    before = {(r["tenant"], r["id"]): r for r in await asyncio.to_thread(
        count_store, uri, collection) if r["tenant"] == KAFKA_VICTIM}  # fmt: skip
    victim_ids = sorted(k[1] for k in before) or ["none"]
    records, targets = kafka_hostile_records(settings, cfg, rng, victim_ids)
    agent_topics = {settings.topic(t) for t in ("transitions", "feedback", "usage", "requests")}
    since_ms = int(time.time() * 1000)
    producer = AIOKafkaProducer(linger_ms=5, max_request_size=8 << 20,
                                **kafka_client_kwargs(settings.kafka))  # fmt: skip
    await producer.start()
    try:
        for topic, key, value, headers in records:
            await producer.send(topic, value, key=key, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()
    note(f"  kafka hostile: {len(records)} records against {KAFKA_VICTIM}; rebalancing")
    stop = asyncio.Event()
    watcher = asyncio.create_task(chaos.watch(stop))
    deaths_before = chaos.deaths
    await chaos.kill(rng)  # the restarted worker restores from the poisoned `models`
    for w in list(chaos.writers):
        await asyncio.to_thread(stack.wait_ready, w)
    await asyncio.sleep(20.0)  # restores, the forget followers and the applier catch up
    await wait_credit_applied(settings, 60.0, 0)
    stop.set()
    await watcher
    # the watcher repairs write workers; the jobs and respond workers must still be up
    chaos.deaths += sum(1 for w in stack.workers if w.role != "write" and not w.alive)
    after = {(r["tenant"], r["id"]): r for r in await asyncio.to_thread(
        count_store, uri, collection) if r["tenant"] == KAFKA_VICTIM}  # fmt: skip
    changed = {k for k, r in before.items() if after.get(k) != r} | (set(after) - set(before))
    # which fields moved (a removed or added row counts as "row")
    fields: Counter[str] = Counter()
    for k in changed:
        old, new = before.get(k), after.get(k)
        if old is None or new is None:
            fields["row"] += 1
        else:
            fields.update(f for f in old if old.get(f) != new.get(f))
    forged = sum(1 for k in before if k[1] in targets["forget"] and k not in after)
    forged += sum(1 for k, r in before.items() if k[1] in targets["credit"] and k in after
                  and after[k]["utility"] != r["utility"])  # fmt: skip
    forged += chaos.deaths - deaths_before  # a poisoned restore that took a worker down
    reads = 0
    c = AIOKafkaConsumer(**kafka_client_kwargs(settings.kafka))
    await c.start()
    try:
        reply_topics = sorted(t for t in await c.topics()
                              if t.startswith(settings.topic("responses")))  # fmt: skip
    finally:
        await c.stop()
    for name in reply_topics:
        for m in await read_topic_named(settings, name):
            if m.key is not None and m.key.decode() in targets["request"]:
                reads += 1 + len(orjson.loads(m.value).get("hits", []))
    dead = [d for d in (orjson.loads(m.value) for m in await read_topic(settings, "deadletter"))
            if d["ts"] >= since_ms and d["reason"] == "unauthenticated"]  # fmt: skip
    return {
        "kafka_hostile_attempts": len(records),
        "kafka_cross_tenant_reads": reads,
        "kafka_cross_tenant_writes": len(changed),
        "forged_internal_accepted": forged,
        "unauthenticated_dead_lettered": len(
            {(d["topic"], d["partition"], d["offset"]) for d in dead}
        ),  # fmt: skip
        "kafka_agent_records": sum(1 for r in records if r[0] in agent_topics),
        "kafka_victim_rows": len(before),
        "kafka_changed_fields": dict(sorted(fields.items())),
        "kafka_victim_search_hits": own_hits,
    }


def _forget(uri: str, collection: str, memory_id: str) -> list[Any]:
    """`dmem forget --tenant HOSTILE --memory ID`: the CLI's store call."""
    from milvus import MemoryStore
    from streams.jobs.forget import forget_scope

    store = MemoryStore(uri, collection=collection, dim=DIM).connect()
    try:
        return forget_scope(store, HOSTILE, memory_id=memory_id)
    finally:
        store.close()


def encode_model(m: Any) -> bytes:
    return orjson.dumps(m.model_dump(mode="json", by_alias=True))


async def wait_credit_applied(settings: Settings, timeout_s: float, min_updates: int,
                              logical: str = "credit") -> bool:  # fmt: skip
    """Until the applier group has committed the whole credit topic (or ``logical``, the
    other topic it reads: ``access``), which has stopped growing and holds at least
    ``min_updates`` records."""
    from streams.admin import kafka_client_kwargs

    kw = kafka_client_kwargs(settings.kafka)
    c = AIOKafkaConsumer(group_id=settings.group("applier"), enable_auto_commit=False, **kw)
    await c.start()
    topic = settings.topic(logical)
    deadline = time.monotonic() + timeout_s
    last: dict[TopicPartition, int] = {}
    try:
        while time.monotonic() < deadline:
            parts = c.partitions_for_topic(topic)
            if not parts:
                await c._client.force_metadata_update()
                parts = c.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, p) for p in sorted(parts)]
            ends = await c.end_offsets(tps) if tps else {}
            done = bool(tps) and sum(ends.values()) >= min_updates and ends == last
            for tp in tps:
                off = await c.committed(tp)
                done = done and (ends[tp] == 0 or (off is not None and off >= ends[tp]))
            if done:
                return True
            last = dict(ends)
            await asyncio.sleep(2.0)
        return False
    finally:
        await c.stop()


def hostile_searches(
    uri: str, collection: str, settings: Settings, tenants: list[str]
) -> dict[str, int]:
    """Search every tenant with hostile filters through the responder's code path."""
    from milvus import MemoryStore
    from operators import build_encoder
    from schemas.errors import DmemError
    from streams.respond.responder import Responder

    enc = build_encoder("hash", dim=DIM, cache_size=0)
    store = MemoryStore(uri, collection=collection, dim=DIM).connect()
    out = {"searches": 0, "searches_rejected": 0, "cross_tenant_hits": 0, "plain_hits": 0}
    try:
        responder = Responder(store, enc, consistency_level="Strong")
        for tenant in tenants:
            bodies: list[dict[str, Any]] = [{}]
            bodies += [{"metadata_equals": {"secret": v}} for v in HOSTILE_VALUES]
            bodies += [{"metadata_equals": {k: "tenant-1"}} for k in HOSTILE_KEYS]
            for i, filters in enumerate(bodies):
                out["searches"] += 1
                body = {
                    "request_id": f"h{i}",
                    "tenant": tenant,
                    "query": "corridor cell",
                    "k": 50,
                    "filters": filters,
                }
                try:
                    req = RetrievalRequest.model_validate(body)
                    resp, _ = responder.answer(req, int(time.time() * 1000))
                except (DmemError, ValueError):
                    out["searches_rejected"] += 1
                    continue
                if resp.error:
                    out["searches_rejected"] += 1
                    continue
                # ids are shared across tenants (the hostile one reuses them): ownership
                # is in the text, which every tenant's transitions start with
                foreign = [h for h in resp.hits if not h.text.startswith(f"{tenant} ")]
                out["cross_tenant_hits"] += len(foreign)
                if not filters:
                    out["plain_hits"] += len(resp.hits)
    finally:
        store.close()
    return out


def run(cfg: ChaosConfig) -> dict[str, Any]:
    """Run the scenario; returns the result dict."""
    from milvus.server import EmbeddedMilvusServer

    tmp = Path(tempfile.mkdtemp(prefix="dmem-bench-chaos-"))
    server = None
    stack: LocalStack | None = None
    failed = True
    try:
        with cleanup_on_signals():
            note(
                f"bench chaos: {cfg.transitions} transitions, {cfg.tenants} tenants, "
                f"{cfg.workers} write worker(s), {cfg.kills} kills, "
                f"outage {cfg.outage_s:.0f}s, seed {cfg.seed}"
            )
            server = EmbeddedMilvusServer(tmp / "milvus", stop_grace_s=3, time_tick_ms=50)
            uri = server.start(timeout_s=180)
            note(f"  milvus server {uri} (started in {server.start_s:.1f}s)")
            run_id = uuid.uuid4().hex[:6]
            env = {
                "DMEM_MILVUS__URI": uri,
                "DMEM_MILVUS__COLLECTION": f"chaos_{run_id}",
                "DMEM_MILVUS__TIMEOUT_S": "5",
                "DMEM_ENCODER__NAME": "hash",
                "DMEM_ENCODER__DIM": str(DIM),
                "DMEM_WRITE__BATCH_SIZE": str(cfg.batch_size),
                "DMEM_WRITE__BATCH_WITHIN_S": "0.2",
                "DMEM_WRITE__CHECKPOINT_EVERY_S": "1.0",
                "DMEM_WRITE__RETRY_MAX_S": "2.0",
                "DMEM_KAFKA__COMMIT_INTERVAL_S": "0.5",
                "DMEM_APP_ID": f"dmem-chaos-{run_id}",
                "DMEM_KAFKA__TOPIC_PREFIX": f"chaos{run_id}.",
                "DMEM_MAINTENANCE__ENABLED": "false",
                "DMEM_LOG_LEVEL": "info",
                # the Kafka phase's baseline waits for one access flush of the control search
                "DMEM_MAINTENANCE__ACCESS_FLUSH_S": "2",
                # Kafka auth on: every tenant (the hostile one too) holds its own token
                "DMEM_AUTH__TOKENS": orjson.dumps(
                    {token_of(t): [t] for t in [*tenant_names(cfg), HOSTILE]}
                ).decode(),
                "DMEM_AUTH__SERVICE_SECRET": f"chaos-service-{uuid.uuid4().hex}",
            }
            stack = LocalStack(tmp / "stack", roles=("write",) * cfg.workers, extra_env=env)
            stack.start()
            note(f"  broker {stack.bootstrap}; {cfg.workers} write worker(s) up")
            out = asyncio.run(_scenario(cfg, stack, server, uri, env["DMEM_MILVUS__COLLECTION"]))
            out["machine"] = machine_info()
            failed = False
    finally:
        teardown(stack, server, tmp, failed)
    report(out)
    return out


async def _scenario(
    cfg: ChaosConfig, stack: LocalStack, server: Any, uri: str, collection: str
) -> dict[str, Any]:
    rng = random.Random(cfg.seed)
    settings = stack.settings
    victims = good_transitions(cfg)
    hostile: list[Transition] = []
    records: list[Record] = []
    bad_kinds: Counter[str] = Counter()
    hrng = random.Random(cfg.seed + 1)
    surprising: list[str] = []
    for i, t in enumerate(victims):
        records.append(signed(t))
        if abs(t.reward) >= 10.0:
            surprising.append(t.memory_id)  # likely stored by its tenant: worth attacking
        if cfg.hostile_every and i % cfg.hostile_every == cfg.hostile_every - 1:
            # a third: surprising ids (stored by their tenant) with a surprise of its own
            hit = bool(surprising) and hrng.random() < 0.33
            target = hrng.choice(surprising) if hit else victims[hrng.randrange(i + 1)].memory_id
            h = hostile_transition(hrng, len(hostile), target, hit)
            hostile.append(h)
            records.append(signed(h))
        if cfg.bad_every and i % cfg.bad_every == cfg.bad_every - 1:
            kind, value = bad_record(rng)
            bad_kinds[kind] += 1
            records.append((b"fuzz", value, kind, None))
    n = len(records)
    outage_at = int(0.4 * n) if cfg.outage_s > 0 else n + 1
    n_free = cfg.kills - 1 if (cfg.kills >= 2 and cfg.outage_s > 0) else cfg.kills
    kill_at = sorted(
        rng.randrange(int(0.05 * n), max(int(0.95 * n), int(0.05 * n) + 1))
        for _ in range(max(n_free, 0))
    )
    chaos = Chaos(stack, server, cfg)
    stop = asyncio.Event()
    watcher = asyncio.create_task(chaos.watch(stop))
    progress = [0]
    prog = Progress("published", n)
    t0 = time.monotonic()
    pub = asyncio.create_task(publish_all(settings, records, cfg.rate, progress))
    outage_task: asyncio.Task[None] | None = None
    pause_at = int(0.8 * n) if cfg.broker_pause_s > 0 else n + 1
    paused = False
    while not pub.done() or kill_at or (outage_task and not outage_task.done()):
        done = progress[0] if not pub.done() else n
        prog.update(done)
        if outage_task is None and done >= outage_at:
            outage_task = asyncio.create_task(chaos.outage(cfg.kills >= 2, rng))
        if not paused and done >= pause_at and not chaos.in_outage:
            paused = True
            await chaos.broker_pause()
        # no free kill shortly before the outage: the worker must be up to report it
        near_outage = outage_at - 0.15 * n <= done < outage_at
        if kill_at and done >= kill_at[0] and not chaos.in_outage and not near_outage:
            kill_at.pop(0)
            await chaos.kill(rng)
        await asyncio.sleep(0.1)
    ends, bad_offsets, good_offsets = await pub
    note(f"  published {n} records in {time.monotonic() - t0:.1f}s; draining")

    def alive() -> None:
        pass  # the watcher restarts dead workers

    committed = await wait_committed(settings, ends, cfg.drain_timeout_s, alive)
    drain_s = time.monotonic() - t0
    await asyncio.sleep(1.0)
    stop.set()
    await watcher
    events_raw = await read_topic(settings, "memories")
    dead_raw = await read_topic(settings, "deadletter")
    events = [orjson.loads(m.value) for m in events_raw]
    scale = scale_out([w.log_path for w in chaos.started], events, cfg.workers)

    # memory ids are unique per tenant only: everything is keyed by (tenant, id)
    Key = tuple[str, str]
    written: set[Key] = set()
    latest: dict[Key, str] = {}
    seen: set[Key] = set()
    for ev in events:
        mid = (ev["tenant"], ev["memory_id"])
        seen.add(mid)
        latest[mid] = ev["kind"]
        if ev["kind"] == "written":
            written.add(mid)
    dl_offsets: set[tuple[int, int]] = set()
    no_reason = 0
    for m in dead_raw:
        dl = orjson.loads(m.value)
        if dl.get("topic") != settings.topic("transitions"):
            continue
        if not dl.get("reason"):
            no_reason += 1
        dl_offsets.add((dl["partition"], dl["offset"]))
        _ = base64.b64decode(dl.get("original_b64", ""))

    rows = await asyncio.to_thread(count_store, uri, collection)
    by_id = Counter((r["tenant"], r["id"]) for r in rows)
    by_key = Counter((r["tenant"], r["agent_id"], r["episode_id"], r["step"]) for r in rows)
    stored_ids = set(by_id)
    duplicated = (sum(by_id.values()) - len(by_id)) + (len(by_id) - len(by_key))
    good = victims + hostile
    good_ids = {(t.tenant, t.memory_id) for t in good}
    # hostile transitions: every reused victim id the victim had stored must still
    # hold the victim's own transition
    own = {(t.tenant, t.memory_id): t for t in victims}
    row_of = {(r["tenant"], r["id"]): r for r in rows}
    targeted = {(v, h.memory_id) for h in hostile for v in {t.tenant for t in victims}}
    cross = 0
    for key in targeted & written:
        r, mine = row_of.get(key), own.get(key)
        if mine is None:
            continue
        if r is None or (
            r["text"],
            r["agent_id"],
            r["episode_id"],
            r["step"],
            (r["metadata"].get("user") or {}).get("secret"),
        ) != (mine.observation, mine.agent_id, mine.episode_id, mine.step, mine.tenant):
            cross += 1
    # hostile feedback, usage, outcomes and forgets on victims' ids: victims' rows
    # must be byte-for-byte what they were
    victim_rows = {k: r for k, r in row_of.items() if k[0] != HOSTILE}
    # targets: ids the victims stored, and the hostile tenant's own stored ids (each
    # one a victim's id too), so feedback and forgets also hit rows of its own
    hostile_own = sorted(k[1] for k in row_of if k[0] == HOSTILE)
    targets = sorted({k[1] for k in victim_rows}) + hostile_own or [victims[0].memory_id]
    # the jobs worker starts only now: it has nothing to do during the stream, and a
    # third process competing for the CPU during the outage is not what is tested
    jobs = stack.start_worker("jobs")
    await asyncio.to_thread(stack.wait_ready, jobs)
    note("  jobs worker up; hostile feedback, usage, outcomes and forgets")
    sent = await hostile_requests(settings, uri, collection, cfg, hrng, targets)
    applied = await wait_credit_applied(settings, 120.0, cfg.hostile_feedback)
    after = await asyncio.to_thread(count_store, uri, collection)
    after_of = {(r["tenant"], r["id"]): r for r in after}
    cross += sum(1 for k, r in victim_rows.items() if after_of.get(k) != r)
    credited = sum(
        1
        for k, r in after_of.items()
        if k[0] == HOSTILE and r["utility"] != row_of.get(k, {}).get("utility", r["utility"])
    )
    forgotten = sum(1 for k in row_of if k[0] == HOSTILE and k not in after_of)
    hostile_probe = await asyncio.to_thread(
        hostile_searches, uri, collection, settings, sorted({t.tenant for t in good})
    )
    kafka = await kafka_hostile(cfg, stack, chaos, hrng, uri, collection) if cfg.kafka_hostile \
        else {}  # fmt: skip
    out: dict[str, Any] = {
        "bench": "chaos",
        "config": asdict(cfg),
        "transitions": len(victims),
        "hostile_transitions": len(hostile),
        "records_published": n,
        "worker_kills": chaos.kills,
        "worker_restarts": chaos.restarts,
        "milvus_outage_s": round(chaos.outage_s, 1),
        "broker_paused_s": chaos.broker_paused_s,
        "expected_stored": len(written),
        "stored": len(written & stored_ids),
        "lost": len(written - stored_ids),
        "duplicated": duplicated,
        "unprocessed": len(good_ids - seen),
        "orphans": sum(1 for i in stored_ids - written if latest.get(i) == "dropped"),
        "unexpected_rows": len(stored_ids - good_ids),
        "bad_inputs": len(bad_offsets),
        "bad_kinds": dict(sorted(bad_kinds.items())),
        "dead_lettered": len(dl_offsets & bad_offsets),
        "good_dead_lettered": len(dl_offsets & good_offsets),
        "dead_letters_without_reason": no_reason,
        "worker_deaths": chaos.deaths,
        **kafka,
        "workers": cfg.workers,
        **scale,
        **hostile_probe,
        "hostile_writes": len(hostile) + sent,
        "cross_tenant_writes": cross,
        "hostile_rows_credited": credited,
        "hostile_rows_forgotten": forgotten,
        "credit_drained": applied,
        "max_rss_mb": round(chaos.max_rss, 1),
        "rss_before_outage_mb": round(chaos.rss_before_outage, 1),
        "rss_outage_max_mb": round(chaos.rss_outage_max, 1),
        "max_lag": chaos.max_lag,
        "health_polls_in_outage": chaos.health_polls,
        "health_503_in_outage": chaos.health_503,
        "store_unhealthy_metric_in_outage": chaos.store_unhealthy_metric,
        "all_committed": committed,
        "wall_s": round(drain_s, 1),
    }
    return out


def report(out: dict[str, Any]) -> None:
    keys = [
        "transitions",
        "workers",
        "worker_kills",
        "rebalances",
        "state_restores",
        "core_burst_ratio",
        "milvus_outage_s",
        "expected_stored",
        "stored",
        "lost",
        "duplicated",
        "unprocessed",
        "orphans",
        "bad_inputs",
        "dead_lettered",
        "good_dead_lettered",
        "worker_deaths",
        "cross_tenant_hits",
        "searches_rejected",
        "hostile_writes",
        "cross_tenant_writes",
        "hostile_rows_credited",
        "kafka_hostile_attempts",
        "kafka_cross_tenant_reads",
        "kafka_cross_tenant_writes",
        "forged_internal_accepted",
        "unauthenticated_dead_lettered",
        "max_rss_mb",
        "rss_before_outage_mb",
        "rss_outage_max_mb",
        "max_lag",
        "health_503_in_outage",
        "wall_s",
    ]
    print_table("dmem bench chaos", ["measure", "value"], [(k, out.get(k)) for k in keys])


def main(cfg: ChaosConfig, as_json: bool) -> dict[str, Any]:
    out = run(cfg)
    if as_json:
        emit_json(out)
    return out
