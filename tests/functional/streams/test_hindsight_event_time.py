"""Hindsight re-scoring is a function of the stream, not of when outcomes are processed.

The same episodes and outcomes, with the outcomes processed right after their episode,
after later traffic, in another arrival order, or across a checkpoint and restore,
write and promote the same memories with the same scores.
"""

from __future__ import annotations

import random

from operators import HashingEncoder
from schemas import Transition, encode
from streams.settings import Settings
from streams.write.pipeline import BatchResult, RawRecord, WritePipeline

TS0 = 1_764_547_200_000


def pipeline() -> WritePipeline:
    return WritePipeline(Settings(), HashingEncoder(dim=64))


def raws(ts: list[Transition], start: int) -> list[RawRecord]:
    return [RawRecord(encode(t), t.agent_id.encode(), "dmem.transitions", 0, start + i)
            for i, t in enumerate(ts)]  # fmt: skip


def episodes(n: int, steps: int = 12) -> list[list[Transition]]:
    """Episodes of one agent, a step a second; some steps painful, most quiet."""
    out, k = [], 0
    for e in range(n):
        ep = []
        for s in range(steps):
            reward = -25.0 if (e * 7 + s) % 11 == 0 else -0.1
            ep.append(Transition(tenant="t", agent_id="a", episode_id=f"e{e}", step=s,
                                 observation=f"room {e % 5} spot {s}", action="go",
                                 reward=reward, ts=TS0 + k * 1000))  # fmt: skip
            k += 1
        out.append(ep)
    return out


def outcome_of(ep: list[Transition]) -> tuple[str, float, int]:
    """(episode, outcome, event time): rare large failures, otherwise small wins."""
    e = int(ep[0].episode_id[1:])
    return ep[0].episode_id, (-400.0 if e % 4 == 3 else 5.0 + e % 3), ep[-1].ts or 0


def facts(res: BatchResult) -> list[tuple[str, str, str, float | None]]:
    return sorted((e.kind, e.memory_id, str(e.reason), e.rpe) for e in res.events)


def feed(p: WritePipeline, eps: list[list[Transition]], offset: int) -> int:
    for ep in eps:
        p.process(raws(ep, offset), now_ms=1)
        offset += len(ep)
    return offset


def test_outcome_processed_late_or_in_another_order_rescores_the_same() -> None:
    eps = episodes(16)
    outcomes = [outcome_of(ep) for ep in eps]
    # a: each outcome right after its episode
    a, got_a, off = pipeline(), {}, 0
    for ep, (eid, x, ts) in zip(eps, outcomes, strict=True):
        off = feed(a, [ep], off)
        got_a[eid] = facts(a.rescore("t", eid, x, now_ms=2, event_ts=ts))
    # b: every episode first, then the outcomes, shuffled (other feedback partitions)
    b = pipeline()
    feed(b, eps, 0)
    shuffled = outcomes[:]
    random.Random(5).shuffle(shuffled)
    got_b = {eid: facts(b.rescore("t", eid, x, now_ms=3, event_ts=ts))
             for eid, x, ts in shuffled}  # fmt: skip
    assert got_b == got_a
    assert any(any(f[0] == "written" for f in v) for v in got_a.values())  # hindsight wrote
    # a copy of an outcome (an at-least-once replay) is not counted twice
    before = b.state("t").outcomes.to_dict()
    eid, x, ts = outcomes[5]
    b.rescore("t", eid, x, now_ms=4, event_ts=ts)
    assert b.state("t").outcomes.to_dict() == before


def test_restart_keeps_open_episodes_for_hindsight() -> None:
    eps = episodes(6)
    straight = pipeline()
    feed(straight, eps, 0)
    first = pipeline()
    off = feed(first, eps[:3], 0)
    first.process(raws(eps[3][:5], off), now_ms=1)  # stopped inside episode 3
    second = pipeline()
    second.restore("t", first.snapshot("t"))
    second.process(raws(eps[3][5:], off + 5), now_ms=1)
    feed(second, eps[4:], off + len(eps[3]))
    wrote = 0
    for ep in eps[2:5]:
        eid, _, ts = outcome_of(ep)
        want = facts(straight.rescore("t", eid, -400.0, now_ms=2, event_ts=ts))
        assert facts(second.rescore("t", eid, -400.0, now_ms=2, event_ts=ts)) == want
        wrote += len(want)
    assert wrote  # the first surprising outcome (episode 2's, begun before the stop) wrote


def test_a_copy_of_an_outcome_writes_and_files_nothing_again() -> None:
    """An at-least-once copy of an outcome finds what the first one wrote or promoted
    in core: no second ``written`` or ``promoted`` event for the memories' histories,
    and no promotion asked again."""
    p = pipeline()
    rng = random.Random(3)  # varied rewards: steps in the buffer as well as dropped ones
    eps = [[Transition(tenant="t", agent_id="a", episode_id=f"e{e}", step=s,
                       observation=f"room {e % 5} spot {s}", action="go",
                       reward=round(rng.gauss(0, 1), 2) if s % 3 else -0.1,
                       ts=TS0 + (e * 12 + s) * 1000) for s in range(12)]
           for e in range(16)]  # fmt: skip
    feed(p, eps, 0)
    first, kinds = {}, set()
    for ep in eps:
        eid, x, ts = outcome_of(ep)
        first[eid] = p.rescore("t", eid, x, now_ms=2, event_ts=ts)
        kinds |= {e.kind for e in first[eid].events}
    assert {"written", "promoted"} <= kinds  # both kinds of hindsight act here
    for ep in eps:
        eid, x, ts = outcome_of(ep)
        again = p.rescore("t", eid, x, now_ms=3, event_ts=ts)
        assert again.events == [] and again.promote == [], (eid, facts(again))
