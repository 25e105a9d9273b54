"""`dmem import FILE.jsonl`: publish a logged run (historical transitions and outcomes).

One JSON object per line: a `Transition`, an `EpisodeOutcome` or a `Feedback`. A line
may say what it is with ``"type": "transition" | "outcome" | "feedback"`` (removed
before validation); otherwise it is a transition when it has an ``action``, an
``observation`` or a ``state``, feedback when it has ``kind``, ``memory_id`` or
``value``, else an outcome. ``--tenant T`` puts every record into tenant T.

Decisions:
- Event time is kept: a line's ``ts`` is its original event time (a year ago is fine:
  the jobs measure ages in stream time, docs/guarantees/delivery.md), so an import stores what
  the live stream stored.
- Nothing is skipped silently: every line that does not validate is reported on stderr
  with its line number and reason, counted (``invalid``), and makes the exit status 1;
  the valid lines are published.
- Idempotent by id: transitions keep their ``transition_id`` (default: the stable hash
  of tenant, agent, episode, step), outcomes their ``outcome_id`` (default
  ``<episode>:final``), so importing a file twice stores each transition once and
  credits each outcome once.
- Order: transitions go first (acks=all); outcomes and feedback only once the write
  path has committed every imported transition (its consumer group's offsets; up to
  ``wait_s``), so hindsight re-scoring finds the episodes' windows instead of racing
  ahead of them. Without a write worker the outcomes are published after the wait with
  a warning.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pydantic import BaseModel, ValidationError

from dmem.progress import Progress
from schemas import EpisodeOutcome, Feedback, Transition, encode
from streams.admin import check_broker, kafka_client_kwargs
from streams.auth import KafkaGuard
from streams.settings import Settings
from streams.write.pipeline import validation_reason

__all__ = ["ImportReport", "parse_line", "run_import", "wait_committed"]

KINDS: dict[str, type[BaseModel]] = {
    "transition": Transition, "outcome": EpisodeOutcome, "feedback": Feedback}  # fmt: skip
CHUNK = 1000


@dataclass
class ImportReport:
    lines: int = 0
    published: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    invalid: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)  # the first 100
    stored_before_outcomes: bool = True
    elapsed_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"lines": self.lines, "published": self.published, **self.counts,
                "invalid": self.invalid, "errors": self.errors,
                "stored_before_outcomes": self.stored_before_outcomes,
                "elapsed_s": round(self.elapsed_s, 3)}  # fmt: skip


def parse_line(line: bytes, tenant: str | None = None) -> tuple[str, BaseModel]:
    """One line -> (kind, validated record); raises ValueError/ValidationError."""
    data = orjson.loads(line)
    if not isinstance(data, dict):
        raise ValueError("a line must be a JSON object")
    kind = data.pop("type", None)
    if kind is None:
        if {"action", "observation", "state"} & data.keys():
            kind = "transition"
        elif {"kind", "memory_id", "value"} & data.keys():
            kind = "feedback"
        else:
            kind = "outcome"
    if kind not in KINDS:
        raise ValueError(f"unknown type {kind!r} (one of {', '.join(KINDS)})")
    if tenant is not None:
        data["tenant"] = tenant
    return kind, KINDS[kind].model_validate(data)


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if raw.strip():
                yield n, raw


async def wait_committed(settings: Settings, group: str, ends: dict[TopicPartition, int],
                         wait_s: float, label: str | None = None) -> bool:  # fmt: skip
    """Until consumer group `group` has committed `ends` (``{tp: next offset}``; True),
    or `wait_s` passed (False). Reads the group's commits without joining it."""
    c = AIOKafkaConsumer(group_id=group, enable_auto_commit=False,
                         **kafka_client_kwargs(settings.kafka))  # fmt: skip
    await c.start()
    try:
        deadline = time.monotonic() + wait_s
        progress: Progress | None = None
        while True:
            done = 0
            for tp, end in ends.items():
                done += min(end, await c.committed(tp) or 0)
            total = sum(ends.values())
            if label is not None:  # progress on stderr
                progress = progress or Progress(label, total)
                progress.update(done)
            if done >= total:
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.5)
    finally:
        await c.stop()


async def _publish(settings: Settings, path: Path, tenant: str | None,
                   wait_s: float) -> ImportReport:  # fmt: skip
    rep = ImportReport()
    t0 = time.monotonic()
    later: list[tuple[str, bytes, bytes]] = []  # outcomes and feedback: (topic, key, value)
    producer = AIOKafkaProducer(acks="all", linger_ms=5, **kafka_client_kwargs(settings.kafka))
    guard = KafkaGuard.from_settings(settings)  # an operator's import speaks for the service
    await producer.start()
    progress = Progress("dmem import: lines read", sum(1 for _ in _lines(path)))
    try:
        topic = settings.topic("transitions")
        pending = 0
        for n, raw in _lines(path):
            rep.lines += 1
            progress.update(rep.lines, f"published={rep.published}")
            try:
                kind, rec = parse_line(raw, tenant)
            except (ValidationError, ValueError) as exc:
                rep.invalid += 1
                reason = validation_reason(exc)
                if len(rep.errors) < 100:
                    rep.errors.append({"line": n, "error": reason})
                sys.stderr.write(f"{path}:{n}: {reason}\n")
                continue
            rep.counts[kind] += 1
            if isinstance(rec, Transition):
                tkey, value = rec.agent_id.encode(), encode(rec)
                await producer.send(topic, value, key=tkey, headers=guard.sign(tkey, value))
                pending += 1
                if pending >= CHUNK:
                    await producer.flush()
                    rep.published += pending
                    pending = 0
            else:
                key = getattr(rec, "episode_id", None) or getattr(rec, "memory_id", "")
                later.append((settings.topic("feedback"), str(key).encode(), encode(rec)))
        await producer.flush()
        rep.published += pending
        if later and rep.counts["transition"]:
            probe = AIOKafkaConsumer(**kafka_client_kwargs(settings.kafka))
            await probe.start()
            try:
                parts = probe.partitions_for_topic(topic) or set()
                ends = await probe.end_offsets([TopicPartition(topic, p) for p in parts])
            finally:
                await probe.stop()
            rep.stored_before_outcomes = await wait_committed(
                settings, settings.group("write"), dict(ends), wait_s, "write path stored"
            )
            if not rep.stored_before_outcomes:
                sys.stderr.write(
                    "\ndmem import: warning: the write path has not stored every "
                    "transition yet; publishing the outcomes anyway (hindsight "
                    "re-scoring may miss their episodes)\n"
                )
        for i, (t, key, value) in enumerate(later, 1):
            await producer.send(t, value, key=key, headers=guard.sign(key, value))
            if i % CHUNK == 0:
                await producer.flush()
        await producer.flush()
        rep.published += len(later)
    finally:
        await producer.stop()
    rep.elapsed_s = time.monotonic() - t0
    return rep


def run_import(settings: Settings, path: Path, tenant: str | None = None,
               wait_s: float = 120.0) -> ImportReport:  # fmt: skip
    async def go() -> ImportReport:
        await check_broker(settings.kafka)
        return await _publish(settings, path, tenant, wait_s)

    return asyncio.run(go())
