"""The write-path operator chain (`WritePipeline`) without Kafka or Milvus."""

from __future__ import annotations

import base64
from collections import Counter

import numpy as np
import orjson
import pytest

from dmem_bench.demo import q_learning_transitions
from operators import HashingEncoder
from schemas import Transition, encode
from streams.settings import Settings
from streams.write.pipeline import RawRecord, WritePipeline


def raws_of(transitions: list[Transition], start: int = 0) -> list[RawRecord]:
    return [
        RawRecord(encode(t), t.agent_id.encode(), "dmem.transitions", 0, start + i)
        for i, t in enumerate(transitions)
    ]


def run(p: WritePipeline, raws: list[RawRecord], batch: int = 128) -> list:
    out = []
    for i in range(0, len(raws), batch):
        out.append(p.process(raws[i : i + batch], now_ms=1_000 + i))
    return out


@pytest.fixture(scope="module")
def cliff() -> list[tuple[Transition, bool, tuple[int, str]]]:
    return list(q_learning_transitions("cliffwalking", 1500, seed=3))


def pipeline() -> WritePipeline:
    return WritePipeline(Settings(), HashingEncoder(dim=64))


def test_same_input_same_decisions(cliff: list) -> None:
    raws = raws_of([t for t, _, _ in cliff])
    a = [e.model_dump() for r in run(pipeline(), raws) for e in r.events]
    b = [e.model_dump() for r in run(pipeline(), raws) for e in r.events]
    assert a == b


def test_critical_transitions_reach_core_and_most_are_dropped(cliff: list) -> None:
    results = run(pipeline(), raws_of([t for t, _, _ in cliff]))
    events = [e for r in results for e in r.events]
    critical = {pair for _, c, pair in cliff if c}
    in_core = {pair for (_, c, pair), e in zip(cliff, events, strict=True) if e.route == "core"}
    assert critical, "the seed must produce cliff falls"
    assert critical <= in_core
    stored = sum(r.stored for r in results)
    assert stored / len(cliff) <= 0.3
    assert all(
        e.valence == -1
        for (_, c, _), e in zip(cliff, events, strict=True)
        if c and e.route == "core"
    )


def test_snapshot_restore_continues_exactly(cliff: list) -> None:
    raws = raws_of([t for t, _, _ in cliff])
    straight = [e.model_dump() for r in run(pipeline(), raws) for e in r.events]
    first = pipeline()
    part1 = [e.model_dump() for r in run(first, raws[:768]) for e in r.events]
    blob = first.snapshot("demo")
    second = pipeline()
    second.restore("demo", blob)
    part2 = [e.model_dump() for r in run(second, raws[768:]) for e in r.events]
    # batch boundaries differ after the split, so compare the routes at the split:
    # the restored pipeline continues from learned state (no warm-up, no burst).
    assert part1 == straight[:768]
    assert not any(e["reason"] == "warmup" for e in part2)
    core_after = sum(e["route"] == "core" for e in part2[:256])
    cold = pipeline()
    cold_events = [e.model_dump() for r in run(cold, raws[768:]) for e in r.events]
    core_cold = sum(e["route"] == "core" for e in cold_events[:256])
    assert core_after <= core_cold


BAD = {
    "malformed JSON": b"{not json",
    "tenant": orjson.dumps(
        {"agent_id": "a", "episode_id": "e", "step": 0, "observation": "x", "action": "a"}
    ),
    "finite number": b'{"tenant":"t","agent_id":"a","episode_id":"e","step":0,'
    b'"observation":"x","action":"a","reward":"nan"}',
    "unsupported schema_version": orjson.dumps(
        {
            "schema_version": 7,
            "tenant": "t",
            "agent_id": "a",
            "episode_id": "e",
            "step": 0,
            "observation": "x",
            "action": "a",
        }
    ),
    "at most 8192": orjson.dumps(
        {
            "tenant": "t",
            "agent_id": "a",
            "episode_id": "e",
            "step": 0,
            "observation": "y" * 10_000,
            "action": "a",
        }
    ),
    "empty record": None,
}


@pytest.mark.parametrize("marker", list(BAD))
def test_bad_records_become_dead_letters_and_good_ones_pass(marker: str) -> None:
    good = [
        Transition(
            tenant="t",
            agent_id="a",
            episode_id="e",
            step=i,
            observation=f"o{i}",
            action="go",
            reward=float(i % 3),
        )
        for i in range(5)
    ]
    raws = raws_of(good[:2])
    raws.append(RawRecord(BAD[marker], b"k", "dmem.transitions", 3, 99))
    raws += raws_of(good[2:], start=2)
    res = pipeline().process(raws, now_ms=5)
    assert len(res.events) == len(good)
    assert len(res.dead) == 1
    key, dl = res.dead[0]
    assert key == b"k"
    assert marker in dl.reason
    assert (dl.topic, dl.partition, dl.offset) == ("dmem.transitions", 3, 99)
    assert base64.b64decode(dl.original_b64) == (BAD[marker] or b"")


def test_wrong_vector_dim_with_passthrough_encoder() -> None:
    from operators import PassthroughEncoder

    p = WritePipeline(Settings(), PassthroughEncoder(dim=4))
    ok = Transition(
        tenant="t",
        agent_id="a",
        episode_id="e",
        step=0,
        state=[1, 0, 0, 0],
        next_state=[0, 1, 0, 0],
        action="x",
    )
    bad = Transition(tenant="t", agent_id="a", episode_id="e", step=1, state=[1, 0, 0], action="x")
    res = p.process(raws_of([ok, bad]), now_ms=1)
    assert len(res.events) == 1 and len(res.dead) == 1
    assert "wrong vector dim" in res.dead[0][1].reason


@pytest.mark.parametrize(
    ("state", "reason"),
    [([0.0, 0.0, 0.0, 0.0], "zero-norm"), ([1e-200, 0.0, 0.0, 0.0], "zero-norm"),
     ([1e300, 1e300, 0.0, 0.0], "overflows")],
)  # fmt: skip
def test_a_state_vector_the_encoder_cannot_normalise_is_dead_lettered_alone(
    state: list[float], reason: str
) -> None:
    """A vector with a zero (or overflowing) norm is refused per record: in the batch's
    encoding it would raise for the whole batch, again after every restart."""
    from operators import PassthroughEncoder

    p = WritePipeline(Settings(), PassthroughEncoder(dim=4))
    ok = Transition(tenant="t", agent_id="a", episode_id="e", step=0, state=[1, 0, 0, 0],
                    action="x")  # fmt: skip
    bad = ok.model_copy(update={"step": 1, "state": state, "transition_id": None})
    res = p.process(raws_of([ok, bad]), now_ms=1)
    assert [e.memory_id for e in res.events] == [ok.memory_id] and len(res.dead) == 1
    assert "invalid state vector" in res.dead[0][1].reason and reason in res.dead[0][1].reason


def test_a_checkpoint_of_open_episodes_at_the_text_limits_fits_a_message() -> None:
    """16 open episodes of 48 dropped steps at the text limit (768 x 16 KB, 12 MB):
    the checkpoint keeps the newest of them within its byte budget, under the write
    producer's 8 MiB message limit, and a restored state still holds the newest step
    for hindsight."""
    from streams.write.pipeline import CHECKPOINT_RECENT_BYTES

    p = pipeline()
    text = "x" * 8_000
    ts = [Transition(tenant="t", agent_id="a", episode_id=f"e{e}", step=k, action="go",
                     observation=f"{k} {text}", next_observation=text, reward=0.0)
          for k in range(48) for e in range(16)]  # fmt: skip
    run(p, raws_of(ts), batch=256)
    blob = p.snapshot("t")
    assert CHECKPOINT_RECENT_BYTES < len(blob) < 8 * 1024 * 1024
    q = pipeline()
    q.restore("t", blob)
    recent = q.tenant("t").recent
    assert 0 < len(recent) < len(ts) and ts[-1].memory_id in recent


def test_a_checkpointed_transition_outside_the_bounds_costs_only_itself(cliff: list) -> None:
    """A checkpoint from before the number bounds may hold a dropped transition they
    refuse: restoring skips it (its hindsight write) and keeps the tenant's state."""
    p = pipeline()
    run(p, raws_of([t for t, _, _ in cliff][:300]))
    d = orjson.loads(p.snapshot("demo"))
    recent = d["hindsight"]["recent"]
    assert len(recent) >= 2
    recent[0]["ts"] = 2**63  # beyond today's bounds
    q = pipeline()
    q.restore("demo", orjson.dumps(d))
    st = q.tenant("demo")
    assert recent[0]["transition_id"] not in st.recent and recent[1]["transition_id"] in st.recent
    assert st.gate_state.sketch.count == p.tenant("demo").gate_state.sketch.count > 0


def test_replay_in_one_batch_is_one_memory() -> None:
    t = Transition(
        tenant="t", agent_id="a", episode_id="e", step=0, observation="o", action="a", reward=-50.0
    )
    res = pipeline().process(raws_of([t, t, t]), now_ms=1)
    assert len(res.events) == 1
    assert Counter(e.memory_id for e in res.events)[t.memory_id] == 1


def test_late_outcome_writes_dropped_transitions_retrospectively() -> None:
    """A quiet episode is dropped as it happens; a huge late outcome reveals that
    its last steps mattered, and the hindsight score writes them to core."""
    p = pipeline()
    # warm the gate and value model on ordinary traffic with some surprises
    warm = [
        Transition(
            tenant="t",
            agent_id="w",
            episode_id=f"w{e}",
            step=k,
            observation=f"hall {k}",
            action="go",
            reward=-25.0 if (e + k) % 7 == 0 else -0.1,
        )
        for e in range(30)
        for k in range(10)
    ]
    run(p, raws_of(warm))
    quiet = [  # the rewarded agent's own quiet episode (a new agent would start at w = 1)
        Transition(
            tenant="t",
            agent_id="w",
            episode_id="quiet",
            step=k,
            observation=f"quiet room {k}",
            action="wait",
            reward=0.0,
        )
        for k in range(6)
    ]
    first = p.process(raws_of(quiet, start=10_000), now_ms=50)
    assert all(e.route == "drop" for e in first.events)
    assert p.rescore("t", "no-such-episode", 100.0, now_ms=60).events == []
    res = p.rescore("t", "quiet", 500.0, now_ms=60)
    written = [e for e in res.events if e.kind == "written"]
    assert written, "a large late outcome must reveal something"
    assert all(e.reason == "retrospective" and e.partition == "core" for e in written)
    ids = {row["id"] for row in res.upserts["core"]}
    assert ids == {e.memory_id for e in written} <= {t.memory_id for t in quiet}
    # the step closest to the outcome is discounted least: it is among the written
    assert quiet[-1].memory_id in ids
    assert all(e.valence == 1 for e in written)
    # an ordinary outcome reveals nothing new
    p2 = pipeline()
    run(p2, raws_of(warm))
    p2.process(raws_of(quiet, start=10_000), now_ms=50)
    assert p2.rescore("t", "quiet", 0.0, now_ms=60).upserts["core"] == []


def test_late_outcome_after_a_later_episode_writes_the_whole_quiet_episode() -> None:
    """All-zero rewards (a briefing: nothing surprising as it happens); the outcome
    arrives after the next episode was processed. Every step of the first episode,
    the earliest (most discounted) included, is written once, with a bounded z.
    The reward-free surprise is off here: with it, a briefing's new lines are kept
    as they arrive (test_write_pipeline_intrinsic.py); this test is about hindsight."""
    from streams.settings import IntrinsicSettings
    from streams.write.pipeline import RETRO_Z_MAX

    p = WritePipeline(Settings(intrinsic=IntrinsicSettings(enabled=False)), HashingEncoder(dim=64))
    brief = [
        Transition(
            tenant="t",
            agent_id="a",
            episode_id="e1",
            step=k,
            observation=f"briefing line {k}",
            action="listen",
            reward=0.0,
        )
        for k in range(7)
    ]
    later = [
        Transition(
            tenant="t",
            agent_id="a",
            episode_id="e2",
            step=k,
            observation=f"another day {k}",
            action="listen",
            reward=0.0,
        )
        for k in range(7)
    ]
    assert all(e.route == "drop" for e in p.process(raws_of(brief), now_ms=10).events)
    p.process(raws_of(later, start=100), now_ms=20)
    res = p.rescore("t", "e1", -1.0, now_ms=30)
    assert {r["id"] for r in res.upserts["core"]} == {t.memory_id for t in brief}
    assert all(
        e.rpe is not None and abs(e.rpe) <= RETRO_Z_MAX and e.valence == -1 for e in res.events
    )
    assert p.rescore("t", "e1", -1.0, now_ms=40).upserts["core"] == []  # duplicate outcome


def test_hindsight_is_bounded_and_selective() -> None:
    """A long successful episode with a large outcome: at most `hindsight_max` rows,
    the steps nearest the outcome (least discounted), each routed to core by the gate."""
    s = Settings()
    s.write.hindsight_max = 3
    p = WritePipeline(s, HashingEncoder(dim=64))
    warm = [
        Transition(
            tenant="t",
            agent_id="w",
            episode_id=f"w{e}",
            step=k,
            observation=f"hall {k}",
            action="go",
            reward=-25.0 if (e + k) % 7 == 0 else -0.1,
        )
        for e in range(30)
        for k in range(10)
    ]
    run(p, raws_of(warm))
    long_ep = [
        Transition(
            tenant="t",
            agent_id="w",  # the rewarded agent: its w is 0
            episode_id="long",
            step=k,
            observation=f"corridor {k}",
            action="walk",
            reward=0.0,
        )
        for k in range(40)
    ]
    p.process(raws_of(long_ep, start=10_000), now_ms=50)
    res = p.rescore("t", "long", 500.0, now_ms=60)
    moved = [e for e in res.events if e.kind in ("written", "promoted")]
    assert 0 < len(moved) <= 3
    steps = sorted(e.step for e in moved)
    assert steps[-1] == 39  # the least discounted step first
    plan = p.gate.plan(p.tenants["t"].gate_state)
    assert all(p.gate.route(plan, e.rpe_smoothed)[0] == "core" for e in moved)


def test_hindsight_usual_outcome_writes_nothing() -> None:
    """Once a tenant's outcomes are known, an outcome like the usual ones reveals nothing;
    a far better one does (the ScienceWorld failure mode: every success copied)."""
    p = pipeline()
    warm = [
        Transition(
            tenant="t",
            agent_id="w",
            episode_id=f"w{e}",
            step=k,
            observation=f"hall {k}",
            action="go",
            reward=-25.0 if (e + k) % 7 == 0 else -0.1,
        )
        for e in range(30)
        for k in range(10)
    ]
    run(p, raws_of(warm))
    written = []
    for e in range(12):
        ep = [
            Transition(
                tenant="t",
                agent_id="w",  # the rewarded agent: its w is 0
                episode_id=f"ep{e}",
                step=k,
                observation=f"corridor {e} {k}",
                action="walk",
                reward=0.0,
            )
            for k in range(10)
        ]
        p.process(raws_of(ep, start=10_000 + 100 * e), now_ms=50 + e)
        res = p.rescore("t", f"ep{e}", 100.0 if e % 2 else 0.0, now_ms=60 + e)
        written.append(len(res.events))
    assert sum(written[4:]) == 0  # 0/100 alternating: nothing new once that is known
    ep = [
        Transition(
            tenant="t",
            agent_id="w",  # the rewarded agent: its w is 0
            episode_id="rare",
            step=k,
            observation=f"vault {k}",
            action="walk",
            reward=0.0,
        )
        for k in range(10)
    ]
    p.process(raws_of(ep, start=20_000), now_ms=100)
    assert p.rescore("t", "rare", 5000.0, now_ms=110).events


def test_forget_clears_repeat_keys_and_windows() -> None:
    from streams.write.pipeline import content_key

    p = pipeline()
    first = Transition(
        tenant="t",
        agent_id="a",
        episode_id="e1",
        step=0,
        observation="the stove is hot",
        action="touch",
        reward=-80.0,
    )
    other = Transition(
        tenant="t",
        agent_id="a",
        episode_id="e1",
        step=1,
        observation="the oven is hot",
        action="touch",
        reward=-90.0,
    )
    quiet = [
        Transition(
            tenant="t",
            agent_id="a",
            episode_id="e0",
            step=k,
            observation=f"kitchen {k}",
            action="look",
            reward=0.0,
        )
        for k in range(60)
    ]
    run(p, raws_of(quiet))
    events = p.process(raws_of([first, other], start=100), now_ms=10).events
    assert [e.route for e in events] == ["core", "core"]
    st = p.tenants["t"]
    assert content_key(first) in st.repeats and content_key(other) in st.repeats
    p.forget("t", first.memory_id, "e1")
    assert content_key(first) not in st.repeats  # same content is judged afresh
    assert content_key(other) in st.repeats  # nothing else is touched
    window = {e.transition_id for e in st.eligibility.get("e1")}
    assert first.memory_id not in window and other.memory_id in window
    assert ("t", 0) in p.dirty  # the next checkpoint carries the change


def test_same_id_of_two_tenants_in_one_batch_is_not_a_replay() -> None:
    """Memory ids are unique per tenant only (issue 21): a batch holding tenant B's record
    with tenant A's id processes both, each with its own event and row."""
    mk = [Transition(transition_id="shared-id-1", tenant=tenant, agent_id="a", episode_id="e",
                     step=0, observation=f"{tenant} secret", action="x", reward=r)
          for tenant, r in (("tenant-a", 5.0), ("tenant-b", -5.0))]  # fmt: skip
    replay = mk[1].model_copy(update={"observation": "tenant-b again"})
    (res,) = run(pipeline(), raws_of([mk[0], mk[1], replay]))
    assert sorted((e.tenant, e.memory_id) for e in res.events) == [
        ("tenant-a", "shared-id-1"),
        ("tenant-b", "shared-id-1"),
    ]
    rows = [r for part in res.upserts.values() for r in part]
    by_tenant = {r["tenant"]: r["text"] for r in rows}
    # whatever the gate routed: no row carries another tenant's text; the replay won in B
    assert all(text.startswith(tenant) for tenant, text in by_tenant.items())
    assert by_tenant.get("tenant-b", "tenant-b again") == "tenant-b again"


def test_another_tenant_interleaved_changes_none_of_a_tenants_routes(cliff: list) -> None:
    """Tenant B interleaved record by record with tenant A in the same partition and
    batches (B with A's very ids, rewards 7x, and a chat): every A event is as with A
    alone. State is per (tenant, partition), nothing of B reaches A's."""
    from dmem.client import ChatTurn, chat_transitions

    a = [t for t, _, _ in cliff[:600]]
    b = [t.model_copy(update={"tenant": "b", "reward": 7 * t.reward}) for t in a]
    turns = [ChatTurn("Ann" if i % 2 else "Bob", f"turn {i} about {i % 7}") for i in range(60)]
    b += chat_transitions(turns, tenant="b", conversation="c", session=1)
    mixed = [t for pair in zip(a, b, strict=False) for t in pair] + b[len(a) :]

    def of_a(ts: list[Transition]) -> list[dict]:
        # ``ts`` is the processing time, which `run` derives from the batch's offset
        return [e.model_dump(exclude={"ts"}) for r in run(pipeline(), raws_of(ts), batch=64)
                for e in r.events if e.tenant == a[0].tenant]  # fmt: skip

    alone = of_a(a)
    assert len(alone) == len(a)  # one event per transition of A: the comparison is not empty
    assert of_a(mixed) == alone


def test_same_words_in_another_context_are_not_a_repeat() -> None:
    """The exact-repeat key includes metadata: a search filtered by task must find each."""
    from streams.write.pipeline import content_key

    a = Transition(
        tenant="t",
        agent_id="a",
        episode_id="e1",
        step=0,
        observation="The door is now open.",
        action="open door",
        reward=8.0,
        metadata={"task": "find-plant"},
    )
    b = a.model_copy(
        update={"episode_id": "e2", "transition_id": None, "metadata": {"task": "find-animal"}}
    )
    c = a.model_copy(update={"episode_id": "e3", "transition_id": None})
    assert content_key(a) != content_key(b)
    assert content_key(a) == content_key(c)


def test_value_model_does_not_depend_on_how_the_stream_was_batched(cliff: list) -> None:
    """One step at a time, batches of 37 or one batch of everything: the pipeline cuts
    at the value model's update boundaries (`ValueSettings.update_every`), so the model
    trains on the same transitions at the same points and ends bit-identical (before,
    it took one TD step per micro-batch: 1500 updates against 1)."""
    raws = raws_of([t for t, _, _ in cliff])
    tenant = cliff[0][0].tenant
    learners, deltas = [], []
    for batch in (1, 37, len(raws)):
        p = pipeline()
        run(p, raws, batch=batch)
        st = p.state(tenant)
        learners.append(st.learner)
        # every transition's TD error (the eligibility window keeps each episode's last
        # steps): scored by the model as of the last update, whatever the cut
        deltas.append(
            {
                e.transition_id: e.delta
                for ep in st.eligibility.episodes()
                for e in st.eligibility.get(ep)
            }
        )
    every = Settings().value.update_every
    probe = HashingEncoder(dim=64).encode([t.observation or "" for t, _, _ in cliff[:50]])
    for m, d in zip(learners, deltas, strict=True):
        assert m.updates == len(raws) // every and m.pending == len(raws) % every
        np.testing.assert_array_equal(m.values(probe), learners[0].values(probe))
        assert len(d) > 100 and d.keys() == deltas[0].keys()
        # float32 matmuls of other batch shapes differ in the last bits, not more
        assert d == pytest.approx(deltas[0], rel=1e-5, abs=1e-6)


def test_a_partition_copied_from_a_sibling_does_not_retrain_its_pending_rows(
    cliff: list,
) -> None:
    p = pipeline()
    run(p, raws_of([t for t, _, _ in cliff[:100]]))
    tenant = cliff[0][0].tenant
    assert p.state(tenant, 0).learner.pending == 100
    other = p.state(tenant, 1)  # a new partition starts from partition 0's state
    assert other.learner.pending == 0 and p.state(tenant, 0).learner.pending == 100


def test_routes_do_not_depend_on_how_the_stream_was_batched(cliff: list) -> None:
    """One record at a time, batches of 7, 64 or everything at once: every transition
    gets the same route, reason and thresholds (the gate and the RPE scale learn one
    record at a time), so the same stream stores the same memories however a consumer
    batched it."""
    raws = raws_of([t for t, _, _ in cliff])
    runs = []
    for batch in (1, 7, 64, len(raws)):
        events = [e for r in run(pipeline(), raws, batch=batch) for e in r.events]
        runs.append([(e.memory_id, e.route, e.reason) for e in events])
        thresholds = [x for e in events for x in (e.theta_low, e.theta_high, e.rpe_smoothed)]
        if batch == 1:
            first = thresholds
        # float32 matmuls of other batch shapes differ in the last bits, not more
        assert thresholds == pytest.approx(first, rel=1e-5, abs=1e-6)
    assert all(r == runs[0] for r in runs)
    routes = Counter(route for _, route, _ in runs[0])
    assert routes["drop"] > routes["core"] > 0


def rare_and_huge(n: int = 1200) -> list[Transition]:
    """A corridor that pays 0, and 10^6 about once in 300 steps (the first at step 79,
    after only exact zeros)."""
    rng = np.random.default_rng(5)
    return [Transition(tenant="t", agent_id="a", episode_id=f"e{i // 50}", step=i % 50,
                       observation=f"corridor {rng.integers(40)}", action=str(rng.integers(2)),
                       reward=1e6 if i == 79 or (i > 79 and rng.random() < 1 / 300) else 0.0,
                       done=i % 50 == 49) for i in range(n)]  # fmt: skip


@pytest.mark.parametrize("c", [1e-3, 1e3])
@pytest.mark.parametrize("stream", ["cliff", "rare_and_huge"])
def test_routes_do_not_depend_on_the_reward_scale(cliff: list, stream: str, c: float) -> None:
    """Every reward times a constant: the same routes and reasons, across the value
    model's first update (before it the TD error is in reward units; the gate's scale
    must not see a change of unit there) and at a first reward after only zeros."""
    trs = [t for t, _, _ in cliff] if stream == "cliff" else rare_and_huge()
    scaled = [t.model_copy(update={"reward": t.reward * c}) for t in trs]
    base = [e for r in run(pipeline(), raws_of(trs)) for e in r.events]
    got = [e for r in run(pipeline(), raws_of(scaled)) for e in r.events]
    assert len(trs) > 2 * Settings().value.update_every
    assert [(e.route, e.reason) for e in got] == [(e.route, e.reason) for e in base]
    # the scores stored with the memories (decay and ranking read them) are scale free too
    assert [e.rpe for e in got] == pytest.approx([e.rpe for e in base], rel=1e-4, abs=1e-6)


def test_a_checkpoint_in_reward_stds_restores_in_reward_units(cliff: list) -> None:
    """A checkpoint without ``rpe_unit`` holds its RPE scale and its episodes' TD errors
    and sigmas in the value model's reward stds: restored, they are in reward units,
    the state the same stream leaves today."""
    p = pipeline()
    run(p, raws_of([t for t, _, _ in cliff[:700]]))
    st = p.tenant("demo")
    assert st.learner.reward_scale > 2.0  # -1 per step, -100 a fall
    old = orjson.loads(p.snapshot("demo"))
    del old["rpe_unit"]
    old["normalizer"]["mean_sq"] /= st.learner.reward_scale**2
    h = old["hindsight"]
    scales = {k: v[4] for k, v in h["scale"]}
    for _, v in h["scale"]:
        v[0] /= v[4]
    for ep in h["windows"]["episodes"]:
        for e in ep["entries"]:
            e["delta"] /= scales[ep["key"]]
    q = pipeline()
    q.restore("demo", orjson.dumps(old))
    got = q.tenant("demo")
    assert got.normalizer.sigma == pytest.approx(st.normalizer.sigma, rel=1e-9)
    assert len(got.episode_scale) > 1
    for ep, v in got.episode_scale.items():
        assert v == pytest.approx(st.episode_scale[ep], rel=1e-9)
        want = [e.delta for e in st.eligibility.get(ep)]
        assert [e.delta for e in got.eligibility.get(ep)] == pytest.approx(want, rel=1e-9)
    # written again, the checkpoint is in reward units: read back, it converts nothing
    again = q.snapshot("demo")
    r = pipeline()
    r.restore("demo", again)
    assert r.snapshot("demo") == again


def test_content_key_tells_text_moved_across_the_separator_apart() -> None:
    """Two transitions whose text and action differ only in where a unit separator
    splits them are different content; a transition without one keeps its key."""
    import hashlib

    from streams.write.pipeline import content_key

    def t(obs: str, action: str) -> Transition:
        return Transition(tenant="t", agent_id="a", episode_id="e", step=0,
                          observation=obs, action=action, reward=0.0)  # fmt: skip

    assert content_key(t("door\x1fopen", "go")) != content_key(t("door", "open\x1fgo"))
    plain = t("door", "go")
    joined = f"a\x1f{plain.text()}\x1fgo\x1f0.0\x1f".encode()
    assert content_key(plain) == hashlib.blake2b(joined, digest_size=12).hexdigest()
