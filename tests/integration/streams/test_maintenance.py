"""Maintenance against real Milvus (Lite and server): merges, decay, forget, access;
and end to end through the broker with the jobs running, `dmem inspect` and `dmem forget`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from milvus import MemoryStore
from operators.decay import DAY_MS, MaintenancePolicy
from schemas import Transition, encode
from streams.jobs.access import AccessRead, AccessReads
from streams.jobs.credit import UtilityApplier
from streams.jobs.forget import forget_scope
from streams.jobs.scheduler import MaintenanceEngine
from streams.local.stack import REPO_ROOT, LocalStack
from tests.integration.broker_fixtures import collect, decode_all, isolated_env, produce
from tests.integration.milvus_fixtures import make_record, unit_vector

pytestmark = pytest.mark.integration
NOW = 1_800_000_000_000
PUB = "0123456789abcdef"  # a responder's id


def ids_of(store: MemoryStore, tenant: str = "acme") -> set[str]:
    return {r["id"] for r in store.scan(tenant=tenant, output_fields=["id"])}


def test_merge_arithmetic_search_and_replay(store_factory: Callable[..., MemoryStore]) -> None:
    store = store_factory(dim=8)
    base = unit_vector(8, 1)
    old = make_record(
        "old",
        vector=base,
        reward=1.0,
        rpe=0.5,
        created_ts=1000,
        last_access_ts=1000,
        utility=0.4,
        uses=2,
    )
    news = [
        make_record(
            f"new{i}",
            vector=unit_vector(8, 10 + i, base=base, noise=0.01),
            reward=1.0,
            rpe=-2.0 - i,
            created_ts=2000 + i,
            last_access_ts=2000 + i,
        )
        for i in range(2)
    ]
    other_action = make_record("act", vector=base, action="jump", created_ts=3000)
    far = make_record("far", vector=unit_vector(8, 99), created_ts=3000)
    # never merged with `old`: another route, another reward, a terminal step
    in_buffer = make_record("buf", vector=base, reward=1.0, created_ts=3000)
    rewarded = make_record("rewarded", vector=base, reward=25.0, created_ts=3001)
    terminal = make_record(
        "terminal", vector=base, reward=1.0, created_ts=3002, metadata={"done": True}
    )
    store.upsert([in_buffer], "buffer")
    store.upsert([old, *news, other_action, far, rewarded, terminal], "core")
    eng = MaintenanceEngine(store, MaintenancePolicy(tau=0.95))
    assert eng.bootstrap() == 8
    window = ["new0", "new1", "act", "far", "buf", "rewarded", "terminal"]
    events = eng.dedup("acme", window, NOW)
    kinds = sorted((e.kind, e.memory_id) for e in events)
    assert kinds == [("merged", "new0"), ("merged", "new1")]
    (row,) = store.get(["old"], tenant="acme")
    assert row["partition"] == "core"
    assert row["merged_count"] == 3
    assert row["reward"] == pytest.approx(1.0)
    assert row["rpe"] == pytest.approx(-3.0)  # the strongest signal is kept
    assert row["utility"] == pytest.approx(0.4) and row["uses"] == 2
    assert row["created_ts"] == 1000 and row["metadata"]["merge"]["last_seen_ts"] == 2001
    assert row["metadata"]["merge"]["ids"] == ["new0", "new1"]
    assert ids_of(store) == {"old", "act", "far", "buf", "rewarded", "terminal"}
    hits = store.search(news[0]["vector"], tenant="acme", k=8)
    assert not {"new0", "new1"} & {h["id"] for h in hits}
    # a lookup of a folded transition finds the memory that stands for it
    into = store.survivors_of("acme", ["new1", "far", "nope"])
    assert set(into) == {"new1"} and into["new1"]["id"] == "old"
    assert store.survivors_of("zeta", ["new1"]) == {}  # never across tenants
    # ... and so does the fold index, by primary key
    assert store.history.folded_into("acme", ["new1", "far", "nope"]) == {"new1": "old"}
    assert store.history.folded_into("zeta", ["new1"]) == {}
    assert "new0" not in eng.index.tenant("acme") and len(eng.index) == 6
    # the write path replays new0 (crash before its commit): merging again changes nothing
    store.upsert([news[0]], "core")
    events = eng.dedup("acme", ["new0"], NOW)
    assert [(e.kind, e.memory_id) for e in events] == [("merged", "new0")]
    (again,) = store.get(["old"], tenant="acme")
    assert again["merged_count"] == 3 and again["reward"] == pytest.approx(row["reward"])
    assert ids_of(store) == {"old", "act", "far", "buf", "rewarded", "terminal"}


def test_a_rewarded_step_identical_in_text_survives_dedup(
    store_factory: Callable[..., MemoryStore],
) -> None:
    """The issue's lost step: reward 25 after an earlier reward-0 step with the same
    observation, action, valence and route (the old scope merged it into the older,
    unrewarded one). It survives, as does a failing terminal step of reward 0; the
    true repeats (same observation, action, reward) still merge."""
    store = store_factory(dim=8)
    vec = unit_vector(8, 3)
    obs = {
        "text": "You are in the kitchen. A fridge is here.",
        "action": "open fridge",
        "vector": vec,
        "valence": 1,
        "rpe": 1.0,
    }

    def step(mid: str, ts: int, reward: float, done: bool = False) -> dict[str, Any]:
        return make_record(
            mid,
            created_ts=ts,
            last_access_ts=ts,
            reward=reward,
            metadata={"done": done, "next": "The fridge is open."},
            **obs,
        )

    rows = [
        step("plain-1", 100, 0.0),
        step("scored", 200, 25.0),
        step("plain-2", 300, 0.0),
        step("failed", 400, 0.0, done=True),
        step("plain-3", 500, 0.0),
        step("scored-again", 600, 25.0),
    ]
    store.upsert(rows, "core")
    eng = MaintenanceEngine(store, MaintenancePolicy(tau=0.95))
    eng.bootstrap()
    events = eng.dedup("acme", [r["id"] for r in rows], NOW)
    merged = {e.memory_id: e.reason.split()[1] for e in events if e.kind == "merged"}
    assert merged == {"plain-2": "plain-1", "plain-3": "plain-1", "scored-again": "scored"}
    got = {r["id"]: r for r in store.scan(tenant="acme", output_fields=[
        "id", "reward", "merged_count", "metadata"])}  # fmt: skip
    assert set(got) == {"plain-1", "scored", "failed"}
    assert got["scored"]["reward"] == 25.0 and got["scored"]["merged_count"] == 2
    assert got["failed"]["metadata"]["done"] is True
    assert got["plain-1"]["merged_count"] == 3 and got["plain-1"]["reward"] == 0.0


def test_a_survivor_stands_for_what_it_folded(store_factory: Callable[..., MemoryStore]) -> None:
    """Search hits say which transitions they stand for; credit for a folded
    transition reaches its survivor."""
    from types import SimpleNamespace

    from operators import PassthroughEncoder
    from schemas import RetrievalRequest, UtilityUpdate
    from streams.jobs.credit import UtilityApplier
    from streams.respond.responder import Responder
    from streams.settings import Settings

    store = store_factory(dim=8)
    base = unit_vector(8, 7)
    rows = [make_record(f"r{i}", vector=base, reward=1.0, created_ts=100 + i) for i in range(3)]
    store.upsert(rows, "core")
    eng = MaintenanceEngine(store, MaintenancePolicy(tau=0.95))
    eng.bootstrap()
    assert len(eng.dedup("acme", ["r0", "r1", "r2"], NOW)) == 2
    resp, _ = Responder(store, PassthroughEncoder(dim=8)).answer(
        RetrievalRequest(request_id="q", tenant="acme", vector=base.tolist(), k=3), NOW
    )
    (hit,) = resp.hits
    assert (hit.memory_id, hit.merged_count, hit.merged_ids) == ("r0", 3, ["r1", "r2"])
    applier = UtilityApplier(Settings(), SimpleNamespace(store=store))
    ups = [
        UtilityUpdate(update_id="u1", memory_id="r2", tenant="acme", credit=1.0, ts=NOW),
        UtilityUpdate(update_id="u2", memory_id="r2", tenant="zeta", credit=1.0, ts=NOW),
        UtilityUpdate(update_id="u3", memory_id="gone", tenant="acme", credit=1.0, ts=NOW),
    ]
    assert applier.apply(ups) == 1 and applier.skipped == 2
    (row,) = store.get(["r0"], tenant="acme")
    # r2's credit reached its survivor r0 (its first acted-on use: the mean is the credit)
    assert row["uses"] == 1 and row["utility"] == pytest.approx(1.0)
    assert row["metadata"]["credit"]["n"] == 1


def test_duplicates_inside_one_window_merge(store_factory: Callable[..., MemoryStore]) -> None:
    store = store_factory(dim=8)
    base = unit_vector(8, 5)
    rewards = [1.0] * 6 + [1.005] * 3 + [2.0] * 3  # 1.005 agrees with 1.0 (1 %), 2.0 does not
    rows = [
        make_record(f"w{i:02d}", vector=base, created_ts=100 + i, reward=r)
        for i, r in enumerate(rewards)
    ]
    store.upsert(rows, "buffer")
    eng = MaintenanceEngine(store, MaintenancePolicy(), dedup_k=4)
    events = eng.dedup("acme", [r["id"] for r in rows], NOW)
    assert len(events) == 10
    one, two = store.get(["w00", "w09"], tenant="acme")
    assert one["merged_count"] == 9 and one["reward"] == pytest.approx((6 + 3 * 1.005) / 9)
    assert one["metadata"]["merge"]["reward_min"] == 1.0
    assert one["metadata"]["merge"]["reward_max"] == 1.005
    assert two["merged_count"] == 3 and two["reward"] == 2.0
    assert ids_of(store) == {"w00", "w09"}


def test_ttl_and_capacity_evict_lowest_priority(store_factory: Callable[..., MemoryStore]) -> None:
    store = store_factory(dim=8)

    def rec(mid: str, age_days: float, rpe: float) -> dict[str, Any]:
        ts = int(NOW - age_days * DAY_MS)
        return make_record(mid, seed=hash(mid) % 1000, rpe=rpe, created_ts=ts, last_access_ts=ts)

    store.upsert(
        [rec("c1", 0, 5.0), rec("c2", 0, 3.0), rec("c3", 0, 2.0), rec("c4", 0, 1.0)], "core"
    )
    store.upsert(
        [
            rec("expired", 20, 9.0),
            rec("b-hi", 1, 2.0),
            rec("b-mid", 1, 1.0),
            rec("b-lo", 1, 0.6),
            rec("other", 1, 0.1) | {"tenant": "zeta"},
        ],
        "buffer",
    )
    # fixed horizons: this checks the TTL rule (span-following horizons are unit-tested)
    pol = MaintenancePolicy(core_capacity=2, buffer_capacity=3, span_factor=0.0)
    eng = MaintenanceEngine(store, pol)
    eng.bootstrap()
    events = eng.decay("acme", NOW)
    got = {(e.kind, e.memory_id, e.reason.split()[0]) for e in events}
    # TTL: the expired one despite its large |rpe|. Core over 2: c3 (p=2) and c4 (p=1)
    # demoted. The buffer then holds b-hi (p=1.81), b-mid (0.91), b-lo (0.54), c3, c4
    # (5 > 3): the two lowest, b-lo and b-mid, are evicted.
    assert got == {
        ("evicted", "expired", "ttl"),
        ("demoted", "c3", "core_capacity"),
        ("demoted", "c4", "core_capacity"),
        ("evicted", "b-mid", "buffer_capacity"),
        ("evicted", "b-lo", "buffer_capacity"),
    }
    assert {r["id"] for r in store.scan(tenant="acme", partition="core", output_fields=["id"])} == {
        "c1",
        "c2",
    }
    assert {
        r["id"] for r in store.scan(tenant="acme", partition="buffer", output_fields=["id"])
    } == {"b-hi", "c3", "c4"}
    assert ids_of(store, "zeta") == {"other"}  # other tenants untouched
    assert eng.decay("acme", NOW) == []  # converged


def test_forget_removes_exactly_the_scope(store_factory: Callable[..., MemoryStore]) -> None:
    store = store_factory(dim=8)
    rows = [make_record(f"a1-{i}", agent_id="a1", seed=i) for i in range(3)]
    rows += [make_record(f"a2-{i}", agent_id="a2", seed=10 + i) for i in range(3)]
    rows += [make_record(f"z-{i}", tenant="zeta", agent_id="a1", seed=20 + i) for i in range(2)]
    store.upsert(rows[:4], "core")
    store.upsert(rows[4:], "buffer")
    ev = forget_scope(store, "acme", agent_id="a1", now=NOW)
    assert sorted(e.memory_id for e in ev) == ["a1-0", "a1-1", "a1-2"]
    assert all(e.kind == "forgotten" and e.tenant == "acme" for e in ev)
    assert ids_of(store) == {"a2-0", "a2-1", "a2-2"}
    ev = forget_scope(store, "acme", memory_id="z-0")  # another tenant's id: nothing
    assert ev == [] and ids_of(store, "zeta") == {"z-0", "z-1"}
    ev = forget_scope(store, "acme", memory_id="a2-1")
    assert [e.memory_id for e in ev] == ["a2-1"]
    forget_scope(store, "acme")
    assert ids_of(store) == set() and ids_of(store, "zeta") == {"z-0", "z-1"}


def access_fold(store: MemoryStore, reads: AccessReads) -> int:
    """The jobs role's fold of access counts read from ``dmem.access``."""
    from types import SimpleNamespace

    from streams.settings import Settings

    return UtilityApplier(Settings(), SimpleNamespace(store=store)).apply([], access=reads)  # type: ignore[arg-type]


def test_access_counts_are_folded_in_one_batch(store_factory: Callable[..., MemoryStore]) -> None:
    store = store_factory(dim=8)
    store.upsert([make_record("m1", uses=1, utility=0.3), make_record("m2", seed=3)], "core")
    reads = {("acme", "m1"): [AccessRead(PUB, 4, 3, NOW)],
             ("acme", "m2"): [AccessRead(PUB, 2, 1, NOW - 5)],
             ("zeta", "m2"): [AccessRead(PUB, 3, 1, NOW)]}  # fmt: skip
    assert access_fold(store, reads) == 2
    assert access_fold(store, reads) == 0  # read again: already in the rows
    rows = {r["id"]: r for r in store.get(["m1", "m2"], tenant="acme")}
    assert rows["m1"]["metadata"]["access"] == {"n": 3, "seen": [[PUB, 4]]}
    assert rows["m1"]["last_access_ts"] == NOW
    assert rows["m1"]["uses"] == 1 and rows["m1"]["utility"] == pytest.approx(0.3)
    assert rows["m1"]["metadata"]["task"] == "demo" and rows["m1"]["partition"] == "core"
    assert rows["m2"]["metadata"]["access"]["n"] == 1


def test_maintenance_never_touches_another_tenants_same_ids(
    store_factory: Callable[..., MemoryStore],
) -> None:
    """Merge, access flush, decay eviction and forget of one tenant's ids leave another
    tenant's rows with the same ids byte-for-byte as they were (issue 21)."""
    store = store_factory(dim=8)
    base = unit_vector(8, 7)
    old = int(NOW - 20 * DAY_MS)
    store.upsert([make_record(m, vector=base, created_ts=old, last_access_ts=old)
                  for m in ("dup-a", "dup-b")], "buffer")  # fmt: skip
    store.upsert([make_record("dup-c", vector=unit_vector(8, 70), created_ts=NOW,
                              last_access_ts=NOW)], "core")  # fmt: skip
    store.upsert([make_record(m, tenant="zeta", vector=base, created_ts=NOW, last_access_ts=NOW,
                              text=f"zeta {m}") for m in ("dup-a", "dup-b", "dup-c")],
                 "buffer")  # fmt: skip

    def zeta() -> list[Any]:
        rows = store.get(["dup-a", "dup-b", "dup-c"], tenant="zeta", with_vector=True)
        return [{**r, "vector": r["vector"].tobytes()} for r in rows]

    before = zeta()
    eng = MaintenanceEngine(store, MaintenancePolicy(tau=0.95, span_factor=0.0))  # TTL evicts
    eng.bootstrap()
    merged = eng.dedup("acme", ["dup-b"], NOW)
    assert [(e.kind, e.memory_id, e.tenant) for e in merged] == [("merged", "dup-b", "acme")]
    evicted = eng.decay("acme", NOW)
    # a move and an eviction, both of ids zeta holds too
    assert sorted((e.kind, e.memory_id, e.tenant) for e in evicted) == [
        ("demoted", "dup-c", "acme"),
        ("evicted", "dup-a", "acme"),
    ]
    reads = {("acme", "dup-c"): [AccessRead(PUB, 1, 2, NOW)],
             ("acme", "dup-a"): [AccessRead(PUB, 2, 1, NOW)]}  # fmt: skip
    assert access_fold(store, reads) == 1
    assert store.get(["dup-c"], tenant="acme")[0]["metadata"]["access"]["n"] == 2
    forgot = forget_scope(store, "acme", memory_id="dup-c", now=NOW)
    assert [(e.memory_id, e.tenant) for e in forgot] == [("dup-c", "acme")]
    assert ids_of(store) == set()
    assert zeta() == before


def _health(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
        return dict(json.loads(r.read()))


def _cli(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    full = {**os.environ, **env, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "dmem.cli", *args, "--json"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_pipeline_merges_and_cli(
    tmp_path: Path, broker: str, topic_prefix: str, milvus_server_uri: str
) -> None:
    env = isolated_env(
        topic_prefix,
        DMEM_MILVUS__URI=milvus_server_uri,
        DMEM_MAINTENANCE__DEDUP_WINDOW_S="0.5",
        DMEM_MAINTENANCE__DECAY_INTERVAL_S="1",
        DMEM_GATE__WARMUP="1000",  # the warm-up rule stores (nearly) everything
        DMEM_GATE__DROP_EXACT_REPEATS="false",  # exact repeats reach the store: dedup's job here
    )
    stack = LocalStack(tmp_path / "data", roles=("all",), extra_env=env, broker_bootstrap=broker)
    stack.start()
    s = stack.settings
    port = stack.web_ports[0]
    try:
        trs = [
            Transition(
                tenant="acme",
                agent_id="a" if i % 2 else "b",
                episode_id=f"e{i // 10}",
                step=i % 10,
                observation=f"the door number {i % 5} is locked",
                action="open",
                reward=-1.0 if i % 5 == 0 else 1.0,
            )
            for i in range(40)
        ]
        trs += [
            Transition(
                tenant="zeta",
                agent_id="a",
                episode_id="z",
                step=i,
                observation="the door number 1 is locked",
                action="open",
                reward=1.0,
            )
            for i in range(3)
        ]
        asyncio.run(produce(broker, s.topic("transitions"), [(b"k", encode(t)) for t in trs]))

        def settled(msgs: list[Any]) -> bool:
            evs = decode_all(msgs)
            seen = {e["memory_id"] for e in evs if e["kind"] in ("written", "dropped")}
            return len(seen) >= len(trs)

        evs = decode_all(asyncio.run(collect(broker, [s.topic("memories")], settled)))
        written = {e["memory_id"]: e for e in evs if e["kind"] == "written"}
        assert len(written) >= 20
        text = {t.memory_id: t.observation for t in trs}
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            mt = _health(port)["maintenance"]
            if mt.get("ready") and mt["pending"] == 0 and mt.get("merged", 0) > 0:
                break
            time.sleep(0.5)
        report = _cli(["inspect", "--tenant", "acme"], env | {"DMEM_KAFKA__BROKER": broker})
        # one memory per (agent, door, valence, route) survives; the rest merged into it
        acme = [e for e in written.values() if e["tenant"] == "acme"]
        scopes = {(e["agent_id"], text[e["memory_id"]], e["valence"], e["partition"]) for e in acme}
        assert report["counts"]["core"] + report["counts"]["buffer"] == len(scopes)
        assert report["merged_total"] == len(acme) - len(scopes)
        assert report["recent"] and {e["kind"] for e in report["recent"]} >= {"merged"}
        out = _cli(
            ["forget", "--tenant", "acme", "--agent", "a"], env | {"DMEM_KAFKA__BROKER": broker}
        )
        assert out["forgotten"] == len({sc for sc in scopes if sc[0] == "a"})
        after = _cli(
            ["inspect", "--tenant", "acme", "--no-events"], env | {"DMEM_KAFKA__BROKER": broker}
        )
        assert after["counts"]["core"] + after["counts"]["buffer"] == len(
            {sc for sc in scopes if sc[0] == "b"}
        )
        zeta = _cli(
            ["inspect", "--tenant", "zeta", "--no-events"], env | {"DMEM_KAFKA__BROKER": broker}
        )
        assert zeta["counts"]["core"] + zeta["counts"]["buffer"] >= 1
        # the running job's index drops the forgotten memories (from the audit events)
        want = (
            len({sc for sc in scopes if sc[0] == "b"})
            + zeta["counts"]["core"]
            + zeta["counts"]["buffer"]
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _health(port)["maintenance"]["indexed"] != want:
            time.sleep(0.5)
        assert _health(port)["maintenance"]["indexed"] == want
        # every write worker clears its operator state from the `control` notices
        deadline = time.monotonic() + 20
        while (
            time.monotonic() < deadline
            and _health(port)["write"]["forgets_applied"] < out["forgotten"]
        ):
            time.sleep(0.5)
        assert _health(port)["write"]["forgets_applied"] == out["forgotten"]
    finally:
        stack.stop()
        store = MemoryStore(milvus_server_uri, collection=env["DMEM_MILVUS__COLLECTION"], dim=256)
        try:
            store.drop()
        except Exception:  # noqa: BLE001
            pass
    _ = np


def _chain_store(store_factory: Callable[..., MemoryStore]) -> MemoryStore:
    """a ~ b ~ c, a !~ c (cosine 0.966, 0.966, 0.866 at tau 0.95), all three written
    before any is decided (event times 100, 200, 300)."""
    store = store_factory(dim=8)
    vecs = {}
    for name, deg in (("a", 0.0), ("b", 15.0), ("c", 30.0)):
        v = np.zeros(8, dtype=np.float32)
        v[0], v[1] = np.cos(np.radians(deg)), np.sin(np.radians(deg))
        vecs[name] = v
    store.upsert([make_record(n, vector=v, created_ts=100 * (i + 1))
                  for i, (n, v) in enumerate(vecs.items())], "buffer")  # fmt: skip
    return store


ADD_C, ADD_A, ADD_B = ("add", "c", 300), ("add", "a", 100), ("add", "b", 200)
CLOSE, FLUSH = ("close", "", 0), ("flush", "", 0)


@pytest.mark.parametrize(
    "ops",
    [
        [ADD_C, ADD_A, ADD_B, FLUSH],
        [ADD_C, ADD_A, ADD_B, ("advance", "", 450), CLOSE, FLUSH],
        [ADD_C, CLOSE, ADD_A, ("advance", "", 400), CLOSE, ADD_B, CLOSE, FLUSH],
        [ADD_A, ADD_B, ADD_C, ("advance", "", 10_000), CLOSE, FLUSH],
    ],
)
def test_event_time_dedup_folds_a_chain_alike_however_it_arrives_and_is_cut(
    store_factory: Callable[..., MemoryStore], ops: list[tuple[str, str, int]]
) -> None:
    """The job's windows (`EventTimeWindows`, lateness 250 ms) and `dedup(..., as_of)` on
    a real store, arrivals out of order within the lateness, the timer firing anywhere:
    every time a folds b and c stays (in event time, c meets only the survivor a)."""
    from operators.dedup import EventTimeWindows

    store = _chain_store(store_factory)
    eng = MaintenanceEngine(store, MaintenancePolicy(tau=0.95), dedup_k=4)
    windows = EventTimeWindows(lateness_ms=250)
    for op, mid, ts in ops:
        if op == "add":
            windows.add("acme", mid, ts)
        elif op == "advance":  # a dropped transition's event time
            windows.advance("acme", ts)
        elif due := windows.due("acme", flush=op == "flush"):
            eng.dedup("acme", [m for _, m, _ in due], NOW, due[-1][2])
    assert ids_of(store) == {"a", "c"}
    (a,) = store.get(["a"], tenant="acme")
    assert a["merged_count"] == 2 and a["metadata"]["merge"]["ids"] == ["b"]


@pytest.mark.parametrize("bounded", [True, False])
def test_a_window_never_sees_rows_of_later_windows(
    store_factory: Callable[..., MemoryStore], bounded: bool
) -> None:
    """x (t=100, reward 1.0) is decided while z (t=300, 1.009) is already stored and y
    (t=200, 0.995) is still on its way (within the lateness); all three are repeats.
    In event time y joins x, and z then does not (the group's rewards would span 1.4 %
    > 1 %). Deciding x against the store as it is (no bound) folds z into x first, and y
    is left out instead: which memory survives depends on when the timer fired."""
    store = store_factory(dim=8)
    v = unit_vector(8, 3)
    store.upsert([make_record("x", vector=v, created_ts=100, reward=1.0),
                  make_record("z", vector=v, created_ts=300, reward=1.009)], "buffer")  # fmt: skip
    eng = MaintenanceEngine(store, MaintenancePolicy(tau=0.95), dedup_k=4)
    eng.dedup("acme", ["x"], NOW, 100 if bounded else None)
    store.upsert([make_record("y", vector=v, created_ts=200, reward=0.995)], "buffer")
    eng.dedup("acme", ["y", "z"], NOW, 300 if bounded else None)
    assert ids_of(store) == ({"x", "z"} if bounded else {"x", "y"})


def test_decay_leaves_memories_whose_dedup_is_pending(
    store_factory: Callable[..., MemoryStore],
) -> None:
    """A memory still waiting for its dedup decision is not evicted yet (whether it is
    merged or evicted first must not depend on when the pass ran); once decided, it is."""
    store = store_factory(dim=8)
    old = int(NOW - 20 * DAY_MS)
    store.upsert([make_record("fresh", seed=1, created_ts=NOW, last_access_ts=NOW),
                  make_record("stale", seed=2, created_ts=old, last_access_ts=old)],
                 "buffer")  # fmt: skip
    eng = MaintenanceEngine(store, MaintenancePolicy(span_factor=0.0))  # 14-day TTL
    eng.bootstrap()
    assert eng.decay("acme", NOW, hold=frozenset({"stale"})) == []
    assert ids_of(store) == {"fresh", "stale"}
    events = eng.decay("acme", NOW)
    assert [(e.kind, e.memory_id) for e in events] == [("evicted", "stale")]
