"""The dedup job's decisions are a function of the stream: the job's loop (event-time
windows, due rows in order, candidates as of the window's event time, greedy merges)
over an in-memory store, fed the same stream in different arrival orders and cuts."""

from __future__ import annotations

import random

import numpy as np

from operators.dedup import EventTimeWindows, plan_merges, rewards_agree

TAU = 0.95
LATE = 5_000


def _stream(seed: int, n: int = 240) -> dict[str, dict]:
    """Near-duplicate chains (a ~ b ~ c, a !~ c) with rewards of both signs."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(12, 16))
    rows = {}
    for i in range(n):
        c = centres[i % 12] + rng.normal(scale=0.23, size=16)
        rows[f"m{i:04d}"] = {
            "ts": 1_000 * i + int(rng.integers(0, 3_000)),
            "vec": (c / np.linalg.norm(c)).astype(np.float32),
            "span": (float(r), float(r))
            if (r := rng.choice([-1.0, 0.0, 1.0, 1.005]))
            else (0.0, 0.0),
        }
    return rows


class Job:
    """The maintenance job's dedup loop with the store in memory."""

    def __init__(self, rows: dict[str, dict]) -> None:
        self.rows = rows
        self.windows = EventTimeWindows(LATE)
        self.stored: dict[str, dict] = {}  # survivor id -> its row
        self.into: dict[str, str] = {}

    def write(self, mid: str) -> None:
        r = self.rows[mid]
        self.stored[mid] = {"ts": r["ts"], "vec": r["vec"], "span": r["span"]}
        self.windows.add("t", mid, r["ts"])

    def visible(self, row: dict, as_of: int) -> bool:
        """A stored row is a candidate when it is of the store as of the window's time."""
        return row["ts"] <= as_of

    def close(self, flush: bool = False) -> None:
        due = self.windows.due("t", flush)
        if not due:
            return
        window = {m for _, m, _ in due}
        as_of = due[-1][2]
        vecs = np.stack([self.stored[w]["vec"] for w in window])
        near = {m for m, s in self.stored.items()
                if m not in window and self.visible(s, as_of)
                and float((vecs @ s["vec"]).max()) >= TAU - 1e-6}  # fmt: skip
        ids = sorted(window | near)
        for sign in (-1, 0, 1):  # the merge scope: the reward's sign
            part = [
                m for m in ids if m in self.stored and np.sign(self.stored[m]["span"][0]) == sign
            ]
            groups = plan_merges(part, [self.stored[m]["ts"] for m in part],
                                 np.stack([self.stored[m]["vec"] for m in part]) if part
                                 else np.zeros((0, 16)), TAU,
                                 [self.stored[m]["span"] for m in part], 0.01)  # fmt: skip
            for g in groups:
                s = self.stored[g.survivor]
                for m in g.members:
                    lo, hi = self.stored.pop(m)["span"]
                    s["span"] = (min(s["span"][0], lo), max(s["span"][1], hi))
                    self.into[m] = g.survivor
                    self.windows.remove("t", m)
                assert rewards_agree(*s["span"], 0.01)


def _run(rows: dict[str, dict], order: list[str], close_every: int | None,
         kind: type[Job] = Job) -> Job:  # fmt: skip
    job = kind(rows)
    for k, mid in enumerate(order):
        job.write(mid)
        if close_every is not None and k % close_every == 0:
            job.close()
    job.close(flush=True)
    return job


def test_merges_do_not_depend_on_arrival_order_batching_or_timer() -> None:
    rows = _stream(3)
    in_order = sorted(rows, key=lambda m: (rows[m]["ts"], m))
    reference = _run(rows, in_order, None)  # everything in one window at the end
    assert reference.into, "the stream must have merges to compare"
    rng = random.Random(5)
    for close_every in (1, 7, 64):
        # arrival late by up to the lateness: partitions interleaved, outcomes behind
        jitter = {m: rows[m]["ts"] + rng.randrange(LATE) for m in rows}
        arrived = sorted(rows, key=lambda m: (jitter[m], m))
        job = _run(rows, arrived, close_every)
        assert set(job.stored) == set(reference.stored)
        assert job.into == reference.into


def test_without_the_as_of_bound_the_cut_changes_the_merges() -> None:
    """The bound is what makes it work: comparing a window with rows of later windows
    already written (the store as it is when the timer fires) folds chains differently."""
    rows = _stream(3)
    in_order = sorted(rows, key=lambda m: (rows[m]["ts"], m))
    reference = _run(rows, in_order, None)

    class Unbounded(Job):
        def visible(self, row: dict, as_of: int) -> bool:
            return True

    differs = 0
    for close_every in (1, 3, 7):
        job = _run(rows, in_order, close_every, Unbounded)
        differs += job.into != reference.into
    assert differs > 0
