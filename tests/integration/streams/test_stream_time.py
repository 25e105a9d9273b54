"""One notion of time, through the real write path and the real maintenance job
(`WritePipeline` -> Milvus Lite -> `MaintenanceEngine` dedup windows and decay
passes), with the wall clock running as it does: shifting every timestamp of a
stream by a constant (400 days into the past, years into the future) leaves the
stored set and the routes exactly as they were, and one agent's skewed clock does
not delete another agent's memories."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from dmem_bench.demo import q_learning_transitions
from milvus import MemoryStore, milvus_lite_uri
from operators import HashingEncoder
from operators.decay import DAY_MS, MaintenancePolicy
from schemas import Transition, encode
from streams.clock import now_ms
from streams.jobs.scheduler import MaintenanceEngine
from streams.settings import Settings
from streams.write.pipeline import RawRecord, WritePipeline

pytestmark = pytest.mark.integration
DIM = 32
STEP_MS = 40 * 60 * 1000  # 40 min of stream time per step: 700 steps span ~19 days
T0 = 1_760_000_000_000
CHUNK = 100


def stream(agent: str, steps: int, seed: int) -> list[Transition]:
    return [tr.model_copy(update={"ts": T0 + i * STEP_MS})
            for i, (tr, _, _) in enumerate(q_learning_transitions(
                "cliffwalking", steps, seed, tenant="acme", agent_id=agent))]  # fmt: skip


def interleave(*streams: list[Transition]) -> list[Transition]:
    out = []
    for group in zip(*streams, strict=True):
        out.extend(group)
    return out


def shifted(trs: Iterable[Transition], by: dict[str, int]) -> list[Transition]:
    return [t.model_copy(update={"ts": int(t.ts or 0) + by.get(t.agent_id, 0)}) for t in trs]


def replay(tmp: Path, trs: list[Transition], policy: MaintenancePolicy) -> dict[str, Any]:
    """The stream through the write path and the jobs, chunk by chunk (a dedup window
    and a decay pass after each chunk, as the running job does), then passes until
    the decay job has nothing left to do."""
    store = MemoryStore(milvus_lite_uri(tmp, name="m"), collection="t", dim=DIM).connect()
    try:
        # exact repeats reach the store (dedup's job) and the buffer band is wide
        settings = Settings(gate={"floor": 0.0, "drop_exact_repeats": False})
        pipe = WritePipeline(settings, HashingEncoder(dim=DIM))
        engine = MaintenanceEngine(store, policy, dedup_k=4)
        routes: dict[str, str] = {}
        kinds: dict[str, int] = {}
        for c in range(0, len(trs), CHUNK):
            raws = [RawRecord(encode(t), t.agent_id.encode(), "dmem.transitions", 0, c + i)
                    for i, t in enumerate(trs[c : c + CHUNK])]  # fmt: skip
            res = pipe.process(raws, now_ms())
            # the episodes that ended in this chunk get their outcome: hindsight writes
            ended = {t.episode_id for t in trs[c : c + CHUNK]} - {
                trs[c + CHUNK - 1].episode_id if c + CHUNK < len(trs) else ""
            }
            later = [pipe.rescore("acme", ep, -10.0, now_ms()) for ep in sorted(ended)]
            written = []
            for r in [res, *later]:
                for part, rows in r.upserts.items():
                    if rows:
                        store.upsert(rows, part)
                if r.promote:
                    store.move(r.promote, "core", tenant="acme")
                for ev in r.events:
                    engine.observe(ev)
                    routes.setdefault(ev.memory_id, f"{ev.route}:{ev.reason}")
                    kinds[f"{ev.kind}:{ev.reason}"] = kinds.get(f"{ev.kind}:{ev.reason}", 0) + 1
                written += [e.memory_id for e in r.events if e.kind == "written"]
            events = engine.dedup("acme", written, now_ms()) + engine.decay("acme", now_ms())
            for ev in events:
                kinds[ev.kind] = kinds.get(ev.kind, 0) + 1
        for _ in range(10):
            events = engine.decay("acme", now_ms())
            if not events:
                break
            for ev in events:
                kinds[ev.kind] = kinds.get(ev.kind, 0) + 1
        else:
            raise AssertionError("decay did not reach a fixed point")
        stored = {r["id"]: r["partition"] for r in store.scan(tenant="acme", output_fields=["id"])}
        return {"stored": stored, "routes": routes, "kinds": kinds}
    finally:
        store.close()


POLICY = MaintenancePolicy(tau=0.95, core_capacity=60, buffer_capacity=120)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return replay(tmp_path_factory.mktemp("live"), stream("a", 700, seed=5), POLICY)


def test_the_live_stream_exercises_every_job(live: dict[str, Any]) -> None:
    # the stream spans ~19 days of event time: TTL, fading, floors and capacities act
    assert live["stored"]
    assert live["kinds"].get("merged", 0) > 0
    assert live["kinds"].get("evicted", 0) > 0 and live["kinds"].get("demoted", 0) > 0
    assert live["kinds"].get("written:retrospective", 0) > 0  # hindsight writes too


@pytest.mark.parametrize(
    "shift_ms", [-400 * DAY_MS, -3 * 365 * DAY_MS + 12_345, 2 * 365 * DAY_MS, -7_777]
)
def test_shifting_every_timestamp_changes_nothing(tmp_path: Path, live: dict[str, Any],
                                                  shift_ms: int) -> None:  # fmt: skip
    got = replay(tmp_path, shifted(stream("a", 700, seed=5), {"a": shift_ms}), POLICY)
    assert got["stored"] == live["stored"]  # same ids, same partitions
    assert got["routes"] == live["routes"]
    assert got["kinds"] == live["kinds"]


def test_one_agents_skewed_clock_deletes_nothing_of_another(tmp_path: Path) -> None:
    both = interleave(stream("a", 350, seed=5), stream("b", 350, seed=6))
    year = 365 * DAY_MS
    straight = replay(tmp_path / "straight", both, POLICY)
    skewed = replay(tmp_path / "skewed", shifted(both, {"b": year}), POLICY)
    assert skewed["stored"] == straight["stored"]
    assert skewed["routes"] == straight["routes"]
    # with one clock per tenant the agent running a year ahead ages everyone's memories:
    # why the default is a clock per agent (docs/guarantees/delivery.md)
    # (fixed horizons: span-following ones would stretch with the skewed clock too)
    tenant = MaintenancePolicy(tau=0.95, core_capacity=60, buffer_capacity=120,
                               clock="tenant", span_factor=0.0)  # fmt: skip
    lost = replay(tmp_path / "tenant-clock", shifted(both, {"b": year}), tenant)
    a_ids = {t.memory_id for t in both if t.agent_id == "a"}
    assert len(a_ids & set(lost["stored"])) < len(a_ids & set(straight["stored"]))
