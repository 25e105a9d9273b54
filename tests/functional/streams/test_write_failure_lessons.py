"""Failures write lessons: the terminal steps of an episode whose outcome is a failure
for its (agent, task) context are kept (`WritePipeline._failure_terminal`)."""

from __future__ import annotations

from operators import HashingEncoder
from schemas import Transition, encode
from streams.settings import Settings
from streams.write.pipeline import BatchResult, RawRecord, WritePipeline

AGENT = "w"  # a rewarded agent: the reward-free surprise stays out of its routes


def raws_of(ts: list[Transition], start: int) -> list[RawRecord]:
    return [
        RawRecord(encode(t), t.agent_id.encode(), "dmem.transitions", 0, start + i)
        for i, t in enumerate(ts)
    ]


def hall(tenant: str = "t", agent: str = AGENT) -> list[Transition]:
    """A rewarded agent's history: reward-free steps after it are judged on TD noise."""
    return [
        Transition(
            tenant=tenant,
            agent_id=agent,
            episode_id=f"w{e}",
            step=k,
            observation=f"hall {k}",
            action="go",
            reward=-25.0 if (e + k) % 7 == 0 else -0.1,
            ts=1_000 + 10 * e + k,
        )
        for e in range(30)
        for k in range(10)
    ]


def warm(p: WritePipeline) -> None:
    ts = hall()
    for i in range(0, len(ts), 128):
        p.process(raws_of(ts[i : i + 128], i), now_ms=1_000 + i)


def episode(
    name: str,
    n: int = 6,
    done: bool = True,
    tenant: str = "t",
    agent: str = AGENT,
    ts0: int = 10_000,
) -> list[Transition]:
    """A reward-free episode: a death scored 0 looks like this until its outcome."""
    return [
        Transition(
            tenant=tenant,
            agent_id=agent,
            episode_id=name,
            step=k,
            observation=f"{name} kitchen {k}",
            action=f"act {k}",
            reward=0.0,
            done=done and k == n - 1,
            ts=ts0 + k,
            metadata={"task": "cooking"},
        )
        for k in range(n)
    ]


def lessons(res: BatchResult) -> dict[str, int]:
    """memory id -> steps from the end, of the rows written with reason failure_terminal."""
    return {
        r["id"]: r["metadata"]["failure"]["steps_from_end"]
        for r in res.upserts["buffer"]
        if r["metadata"]["gate"]["reason"] == "failure_terminal"
    }


def play(outcomes: list[tuple[str, float]], settings: Settings | None = None,
         done: bool = True, death_reward: float = 0.0,
         ) -> tuple[WritePipeline, dict[str, BatchResult]]:  # fmt: skip
    """Warm a pipeline, then play each (episode, outcome) in turn: its steps, its outcome
    (``death_reward``: the reward of a dead episode's terminal step)."""
    p = WritePipeline(settings or Settings(), HashingEncoder(dim=64))
    warm(p)
    got = {}
    for i, (name, x) in enumerate(outcomes):
        ep = episode(name, done=done)
        if name.startswith("dead"):
            ep[-1] = ep[-1].model_copy(update={"reward": death_reward})
        first = p.process(raws_of(ep, 10_000 + 100 * i), now_ms=50 + i)
        assert first.events[-2].route == "drop"  # the gate drops the step before the end
        assert death_reward or first.events[-1].route == "drop"  # and a silent death
        got[name] = p.rescore("t", name, x, now_ms=60 + i, event_ts=20_000 + i,
                              agent_id=AGENT, task="cooking")  # fmt: skip
    return p, got


SCRIPT = ["win0", "win1", "dead2", "win3", "dead4", "dead5", "win6"]


def script(hi: float, lo: float) -> list[tuple[str, float]]:
    return [(name, hi if name.startswith("win") else lo) for name in SCRIPT]


def kept(got: dict[str, BatchResult]) -> dict[str, set[int]]:
    """episode -> the steps (counted from its end) stored by hindsight or as a lesson."""
    out: dict[str, set[int]] = {}
    for name, res in got.items():
        steps = {int(r["step"]) for rows in res.upserts.values() for r in rows}
        steps |= {e.step for e in res.events if e.kind == "promoted" and e.step is not None}
        out[name] = {5 - s for s in steps}
    return out


def test_a_silent_death_keeps_its_terminal_steps_and_a_success_writes_none() -> None:
    _, got = play(script(100.0, 0.0))
    for name, res in got.items():
        if name.startswith("win"):
            assert lessons(res) == {}
            continue
        # the terminal step and the one before it (the default of 2) are stored: as
        # lessons, or by hindsight where the outcome alone made them surprising
        assert {0, 1} <= kept(got)[name] and set(lessons(res).values()) <= {0, 1}
        rows = {r["id"]: r for r in res.upserts["buffer"]}
        for mid, back in lessons(res).items():
            assert rows[mid]["metadata"]["failure"]["outcome"] == 0.0
            assert rows[mid]["metadata"]["done"] is (back == 0)
            assert rows[mid]["valence"] == -1 and rows[mid]["rpe"] == -rows[mid]["rpe_smoothed"]
            # scored at least as a buffer memory: maintenance keeps it like one
            assert rows[mid]["rpe_smoothed"] >= rows[mid]["metadata"]["gate"]["theta_low"] > 0
        ev = [e for e in res.events if e.reason == "failure_terminal"]
        assert {e.memory_id for e in ev} == set(lessons(res))
        assert all(e.kind == "written" and e.partition == "buffer" for e in ev)
        core = {r["id"] for r in res.upserts["core"]}
        assert not core & set(lessons(res))  # never two rows of one step
    assert any(lessons(got[n]) for n in SCRIPT if n.startswith("dead"))


def test_the_same_steps_are_kept_at_any_scale_of_outcomes() -> None:
    """Deaths keep the same steps whatever the scale (hindsight's rows for the first two
    outcomes, judged against the RPE scale before outcomes have a spread, may differ)."""

    def deaths(hi: float, lo: float) -> dict[str, set[int]]:
        got = play(script(hi, lo))[1]
        assert not any(lessons(got[n]) for n in SCRIPT if n.startswith("win"))
        return {n: k for n, k in kept(got).items() if n.startswith("dead")}

    want = deaths(100.0, 0.0)
    assert all({0, 1} <= k for k in want.values())
    assert deaths(1.0, -1.0) == want
    assert deaths(10_000.0, 0.0) == want


def test_the_first_outcome_of_a_context_is_no_failure_unless_it_says_so() -> None:
    _, got = play([("dead0", 0.0)])
    assert lessons(got["dead0"]) == {}
    p = WritePipeline(Settings(), HashingEncoder(dim=64))
    warm(p)
    p.process(raws_of(episode("dead0"), 10_000), now_ms=50)
    res = p.rescore("t", "dead0", 0.0, now_ms=60, agent_id=AGENT, task="cooking", success=False)
    assert sorted(lessons(res).values()) == [0, 1]


def test_redelivery_and_restart_write_the_same_ids_once() -> None:
    p, got = play(script(100.0, 0.0)[:3])
    ids = set(lessons(got["dead2"]))
    assert ids
    again = p.rescore("t", "dead2", 0.0, now_ms=99, event_ts=20_002, agent_id=AGENT,
                      task="cooking")  # fmt: skip
    assert lessons(again) == {}  # written already: nothing twice
    # a worker that restarts from a checkpoint taken before the outcome was processed
    q = WritePipeline(Settings(), HashingEncoder(dim=64))
    warm(q)
    for i, (name, x) in enumerate(script(100.0, 0.0)[:3]):
        q.process(raws_of(episode(name), 10_000 + 100 * i), now_ms=50 + i)
        if name != "dead2":
            q.rescore("t", name, x, now_ms=60 + i, event_ts=20_000 + i, agent_id=AGENT,
                      task="cooking")  # fmt: skip
    blob = q.snapshot("t")
    r = WritePipeline(Settings(), HashingEncoder(dim=64))
    r.restore("t", blob)
    res = r.rescore("t", "dead2", 0.0, now_ms=70, event_ts=20_002, agent_id=AGENT, task="cooking")
    assert set(lessons(res)) == ids


def test_no_lesson_from_a_cut_off_or_a_visible_failure_or_with_the_setting_off() -> None:
    _, got = play(script(100.0, 0.0)[:3], done=False)
    assert lessons(got["dead2"]) == {}
    _, got = play(script(100.0, 0.0)[:3], death_reward=-1.0)  # the gate judged that one
    assert lessons(got["dead2"]) == {}
    off = Settings()
    off.write.failure_terminal_steps = 0
    _, got = play(script(100.0, 0.0)[:3], off)
    assert lessons(got["dead2"]) == {}
    three = Settings()
    three.write.failure_terminal_steps = 3
    _, got = play(script(100.0, 0.0)[:3], three)
    assert {0, 1, 2} <= kept(got)["dead2"] and set(lessons(got["dead2"]).values()) <= {0, 1, 2}
