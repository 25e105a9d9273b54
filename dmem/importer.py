"""`dmem import FILE.jsonl`: publish a logged run (historical transitions and outcomes).

One JSON object per line: a `Transition`, an `EpisodeOutcome`, a `Feedback` or a
`MemoryUsage`. A line may say what it is with ``"type": "transition" | "outcome" |
"feedback" | "usage"`` (removed before validation); otherwise it is a transition when
it has an ``action``, an ``observation`` or a ``state``, usage when it has
``memory_ids``, feedback when it has ``kind``, ``memory_id`` or ``value``, else an
outcome. ``--tenant T`` puts every record into tenant T.

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
- Order: the file's order (acks=all), as the live stream had it: transitions to
  ``transitions``, usage to ``usage``, outcomes and feedback to ``feedback``. The
  hindsight agent holds an outcome until the write path has processed its tenant's
  transitions up to the outcome's event time, so an outcome never races ahead of its
  episode, and the import re-scores each episode where the live run did. At the end
  the import waits (up to ``wait_s``) until the write path has committed every
  imported transition (``write_committed``): processed, which is written, dropped by
  the gate or dead-lettered with its reason, not necessarily stored.
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
from aiokafka.errors import KafkaError
from pydantic import BaseModel, ValidationError

from dmem.progress import Progress
from schemas import EpisodeOutcome, Feedback, MemoryUsage, Transition, encode
from schemas.errors import BrokerUnavailable
from streams.admin import check_broker, kafka_client_kwargs
from streams.auth import KafkaGuard
from streams.settings import Settings
from streams.write.pipeline import validation_reason

__all__ = ["ImportReport", "parse_line", "run_import", "wait_committed"]

KINDS: dict[str, type[BaseModel]] = {
    "transition": Transition, "outcome": EpisodeOutcome, "feedback": Feedback,
    "usage": MemoryUsage}  # fmt: skip
CHUNK = 1000


@dataclass
class ImportReport:
    lines: int = 0
    published: int = 0
    counts: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    invalid: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)  # the first 100
    write_committed: bool = True
    elapsed_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"lines": self.lines, "published": self.published, **self.counts,
                "invalid": self.invalid, "errors": self.errors,
                "write_committed": self.write_committed,
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
        elif "memory_ids" in data:
            kind = "usage"
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
                         wait_s: float, label: str | None = None,
                         starts: dict[TopicPartition, int] | None = None) -> bool:  # fmt: skip
    """Until consumer group `group` has committed `ends` (``{tp: next offset}``; True),
    or `wait_s` passed (False). Reads the group's commits without joining it. The
    progress (``label``) counts the records from ``starts`` (where this run's began; none:
    the topic's start) to ``ends``."""
    base = starts or {}
    c = AIOKafkaConsumer(group_id=group, enable_auto_commit=False,
                         **kafka_client_kwargs(settings.kafka))  # fmt: skip
    await c.start()
    try:
        deadline = time.monotonic() + wait_s
        progress: Progress | None = None
        while True:
            done = 0
            for tp, end in ends.items():
                done += max(0, min(end, await c.committed(tp) or 0) - base.get(tp, 0))
            total = sum(end - base.get(tp, 0) for tp, end in ends.items())
            if label is not None:  # progress on stderr
                progress = progress or Progress(label, total)
                progress.update(done)
            if done >= total:  # every record of ours (and before it) is committed
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.5)
    finally:
        await c.stop()


def _span(acks: list[tuple[Any, bool]], starts: dict[TopicPartition, int],
          ends: dict[TopicPartition, int]) -> None:  # fmt: skip
    """Widen ``starts``/``ends`` (per partition: the first offset and the next after the
    last) by the broker's acknowledgements of transitions sent (`RecordMetadata`
    futures, None for another topic's record). A failed delivery raises its error here:
    ``flush`` waits for every delivery but raises none."""
    failed = [f.exception() for f, _ in acks if f.exception() is not None]
    if failed:
        acks.clear()
        raise failed[0]
    for fut, spans in acks:
        if not spans:
            continue
        md = fut.result()
        tp = TopicPartition(md.topic, md.partition)
        starts[tp] = min(starts.get(tp, md.offset), md.offset)
        ends[tp] = max(ends.get(tp, 0), md.offset + 1)
    acks.clear()


async def _publish(settings: Settings, path: Path, tenant: str | None,
                   wait_s: float) -> ImportReport:  # fmt: skip
    rep = ImportReport()
    t0 = time.monotonic()
    producer = AIOKafkaProducer(acks="all", linger_ms=5, **kafka_client_kwargs(settings.kafka))
    guard = KafkaGuard.from_settings(settings)  # an operator's import speaks for the service
    await producer.start()
    progress = Progress("dmem import: lines read", sum(1 for _ in _lines(path)))
    try:
        await _send_all(settings, path, tenant, wait_s, producer, guard, progress, rep)
    except (KafkaError, OSError) as exc:
        raise BrokerUnavailable(
            f"the broker failed at line {rep.lines} of {path} ({type(exc).__name__}: "
            f"{exc}); {rep.published} records were acknowledged before it. Import the "
            "file again once the broker is back: records are idempotent by id, so none "
            "is stored or credited twice"
        ) from exc
    finally:
        await producer.stop()
    rep.elapsed_s = time.monotonic() - t0
    return rep


async def _send_all(settings: Settings, path: Path, tenant: str | None, wait_s: float,
                    producer: AIOKafkaProducer, guard: KafkaGuard, progress: Progress,
                    rep: ImportReport) -> None:  # fmt: skip
    """Publish every valid line of ``path`` (the module doc), then wait for the write
    path; ``rep`` counts as it goes (what was acknowledged when a send fails)."""
    topic = settings.topic("transitions")
    # where this import's transitions lie, from the broker's acknowledgements: the
    # offsets of exactly these records (a topic's end offset can run behind a
    # batch's last record on some brokers, and counts other producers' records)
    starts: dict[TopicPartition, int] = {}
    ends: dict[TopicPartition, int] = {}
    acks: list[tuple[Any, bool]] = []
    pending = 0
    for n, raw in _lines(path):
        rep.lines += 1
        progress.update(rep.lines, f"sent={rep.published + pending}")
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
            where, key = topic, rec.agent_id
        else:
            where = settings.topic("usage" if isinstance(rec, MemoryUsage) else "feedback")
            key = str(getattr(rec, "episode_id", None) or getattr(rec, "memory_id", ""))
        kb, value = key.encode(), encode(rec)
        ack = await producer.send(where, value, key=kb, headers=guard.sign(kb, value))
        acks.append((ack, where == topic))  # every delivery is checked, not only spanned
        pending += 1
        if pending >= CHUNK:
            await producer.flush()
            _span(acks, starts, ends)
            rep.published += pending
            pending = 0
    await producer.flush()
    _span(acks, starts, ends)
    rep.published += pending
    if rep.counts["transition"]:
        rep.write_committed = await wait_committed(
            settings, settings.group("write"), ends, wait_s,
            "write path processed (this import's records)", starts,
        )  # fmt: skip
        if not rep.write_committed:
            sys.stderr.write(
                "\ndmem import: warning: the write path has not processed every "
                "transition yet (it goes on in the background)\n"
            )


def run_import(settings: Settings, path: Path, tenant: str | None = None,
               wait_s: float = 120.0) -> ImportReport:  # fmt: skip
    async def go() -> ImportReport:
        await check_broker(settings.kafka)
        return await _publish(settings, path, tenant, wait_s)

    return asyncio.run(go())
