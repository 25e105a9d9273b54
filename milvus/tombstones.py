"""Tombstones: a forget must win over every write that was already in flight.

Several writers rewrite rows they read a moment earlier (the credit applier, the
access flush, dedup merges, decay moves, hindsight re-scores, a redelivered write
batch). Without a guard, a forget that lands between such a read and its write is
undone: the writer upserts the row it read and the forgotten memory is back
(a thumbs-up applied right after ``forget`` would resurrect the memory).

The guard has two halves:

- In a process, `MemoryStore.forget` records the storage keys here *before* it
  deletes them, holding the exclusive side of `SharedExclusive`; every upsert
  holds the shared side while it drops tombstoned keys and writes. So a write
  either lands before the delete (and is deleted) or is refused after it.
- Across processes, a forget is broadcast as a ``forgotten`` MemoryEvent on the
  ``control`` topic (`streams.jobs.forget.emit_events`). Every process that
  writes rows reads all of ``control`` and calls `MemoryStore.forget` for the
  keys it has no tombstone for: that records them and deletes them once more,
  which removes a row a writer of *that* process upserted between the origin's
  delete and the notice's arrival.

Reads leave tombstoned keys out too (`MemoryStore.search`, `lookup`, `get`,
`query_rows`): searches and reads by id run at bounded staleness, so for up to
Milvus' graceful time after a delete a read can still find the row, and a person
who forgets a memory and reads it back at once must not get it again. Within the
TTL no write of the key is accepted, so a row with that key is such a stale read
(or a write of another process that the notice is about to delete).

Where the ``control`` topic does not outlive the process (the embedded broker of `dmem
up` is memory-only), the set can be kept in a file as well (``path``): each forget
appends its keys and their expiry, and a restarted process reads back those still
live, so a forgotten transition published again after a restart is still refused.

Decision: tombstones refuse a key for ``ttl_s`` (default one hour) after the
forget, then the key may be written again. A forget deletes what exists; a
transition published again much later is a new event, and the bound keeps the
set small (at most ``max_keys``, oldest dropped first). One hour covers a write
batch redelivered after a crash or a rebalance. Tombstones are per collection
(uri, name): two stores on different collections in one process never refuse
each other's writes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_TTL_S = 3600.0
DEFAULT_MAX_KEYS = 1_000_000


class SharedExclusive:
    """Many shared holders (upserts) at once, or one exclusive holder (a forget)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._exclusive = True  # new shared holders wait from here on
            while self._shared:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


class Tombstones:
    """Storage keys forgotten in the last ``ttl_s`` seconds (bounded, thread-safe)."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, max_keys: int = DEFAULT_MAX_KEYS,
                 clock: Callable[[], float] = time.time,
                 path: Path | None = None) -> None:  # fmt: skip
        if ttl_s <= 0 or max_keys < 1:
            raise ValueError("tombstones need ttl_s > 0 and max_keys >= 1")
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self.clock = clock
        self.lock = SharedExclusive()
        self._until: OrderedDict[str, float] = OrderedDict()
        self._mutex = threading.Lock()
        self.path = path
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        """The live tombstones of ``path`` (soonest expiry first), then the file rewritten
        with those only (it only grows between restarts)."""
        now, live = self.clock(), []
        try:
            with path.open("rb") as f:
                for line in f:
                    try:
                        d = json.loads(line)
                        key, until = str(d["k"]), float(d["u"])
                    except (ValueError, KeyError, TypeError):
                        continue  # a line cut short by a crash
                    if until > now:
                        live.append((until, key))
        except FileNotFoundError:
            pass
        for until, key in sorted(live)[-self.max_keys :]:
            self._until.pop(key, None)
            self._until[key] = until
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.writelines(json.dumps({"k": k, "u": u}) + "\n" for k, u in self._until.items())
        os.replace(tmp, path)

    def _append(self, rows: list[tuple[str, float]]) -> None:
        """Keep ``rows`` in the file before the forget deletes anything (durable)."""
        if self.path is None or not rows:
            return
        with open(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "w") as f:
            f.writelines(json.dumps({"k": k, "u": u}) + "\n" for k, u in rows)
            f.flush()
            os.fsync(f.fileno())

    def add(self, keys: Iterable[str], at: float | None = None) -> None:
        """Refuse ``keys`` until ``at + ttl_s`` (``at``: when they were forgotten).

        An ``at`` in the future is clamped to now: no tombstone outlives the TTL
        (a far-future one would also stall the expiry of every key behind it)."""
        now = self.clock()
        until = (now if at is None else min(at, now)) + self.ttl_s
        with self._mutex:
            added = []
            for k in keys:
                self._until.pop(k, None)
                self._until[k] = until
                added.append((k, until))
            while len(self._until) > self.max_keys:
                self._until.popitem(last=False)
            self._append(added)

    def dead(self, keys: Iterable[str]) -> set[str]:
        """The subset of ``keys`` that is still tombstoned now."""
        now = self.clock()
        with self._mutex:
            self._expire(now)
            return {k for k in keys if self._until.get(k, 0.0) > now}

    def _expire(self, now: float) -> None:
        while self._until:
            k, until = next(iter(self._until.items()))
            if until > now:
                break
            del self._until[k]

    def hide(self, keys: Iterable[str]) -> set[str]:
        """`dead` for the reads: no lock taken while nothing is tombstoned (the usual
        case, so a search pays nothing for the check)."""
        if not self._until:
            return set()
        return self.dead(keys)

    def clear(self) -> None:
        """Forget every tombstone (the collection was dropped or emptied)."""
        with self._mutex:
            self._until.clear()
            if self.path is not None:
                self.path.unlink(missing_ok=True)

    def __len__(self) -> int:
        with self._mutex:
            self._expire(self.clock())
            return len(self._until)


_REGISTRY: dict[tuple[str, str], Tombstones] = {}
_REGISTRY_LOCK = threading.Lock()


def tombstones_for(uri: str, collection: str, ttl_s: float = DEFAULT_TTL_S,
                   path: Path | None = None) -> Tombstones:  # fmt: skip
    """The process's one tombstone set of a collection (shared by all its stores); kept
    in ``path`` too when the first store that asks for it names one."""
    with _REGISTRY_LOCK:
        t = _REGISTRY.get((uri, collection))
        if t is None:
            t = _REGISTRY[(uri, collection)] = Tombstones(ttl_s, path=path)
        return t


__all__ = ["DEFAULT_TTL_S", "SharedExclusive", "Tombstones", "tombstones_for"]
