"""Per-episode eligibility window: the last H transitions of each open episode.

Design decisions:

- Purpose: a late outcome (``EpisodeOutcome`` minutes later) can re-score
  transitions the gate dropped and write or promote them; so the window keeps
  just what that needs (ids, step, a compact embedding, the value estimate,
  reward, delta, the route taken and whether the step ended the episode), not
  the raw transition.
- Embeddings are stored as float16 bytes (half the size of float32, and the
  precision is ample for cosine search); JSON form uses base64.
- Entries are unique by transition_id (at-least-once delivery replays the
  same transition: the newer copy replaces the old), kept sorted by step, and
  capped at ``horizon`` most recent steps.
- Bounded memory: episodes idle longer than ``ttl_ms`` are dropped by
  ``expire(now_ms)`` (time injected, never read), and at most
  ``max_episodes`` are kept, evicting the least recently written one.
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

__all__ = ["EligibilityEntry", "EligibilityWindow"]


@dataclass(frozen=True)
class EligibilityEntry:
    transition_id: str
    step: int
    embedding: bytes  # float16 little-endian
    value: float
    reward: float
    delta: float
    route: str
    #: the transition ended its episode (``done``): what a failure's terminal steps are
    done: bool = False

    @classmethod
    def make(
        cls,
        transition_id: str,
        step: int,
        embedding: np.ndarray | list[float],
        value: float,
        reward: float,
        delta: float,
        route: str,
        done: bool = False,
    ) -> EligibilityEntry:
        """Build an entry, packing the embedding to float16 bytes."""
        emb = np.asarray(embedding, dtype="<f2").reshape(-1).tobytes()
        return cls(
            transition_id=str(transition_id),
            step=int(step),
            embedding=emb,
            value=float(value),
            reward=float(reward),
            delta=float(delta),
            route=str(route),
            done=bool(done),
        )

    def vector(self) -> np.ndarray:
        """The embedding as float32 (n,)."""
        return np.frombuffer(self.embedding, dtype="<f2").astype(np.float32)

    def to_dict(self) -> dict[str, Any]:
        return {
            "transition_id": self.transition_id,
            "step": self.step,
            "embedding": base64.b64encode(self.embedding).decode("ascii"),
            "value": self.value,
            "reward": self.reward,
            "delta": self.delta,
            "route": self.route,
            "done": self.done,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EligibilityEntry:
        return cls(
            transition_id=str(d["transition_id"]),
            step=int(d["step"]),
            embedding=base64.b64decode(d["embedding"]),
            value=float(d["value"]),
            reward=float(d["reward"]),
            delta=float(d["delta"]),
            route=str(d["route"]),
            done=bool(d.get("done", False)),  # absent in older checkpoints
        )


@dataclass
class _Episode:
    last_ms: int
    entries: list[EligibilityEntry] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)  # transition ids in `entries`

    def set_entries(self, entries: list[EligibilityEntry]) -> None:
        self.entries = entries
        self.ids = {e.transition_id for e in entries}


class EligibilityWindow:
    """Bounded, TTL'd map episode_key -> last ``horizon`` entries."""

    def __init__(
        self, horizon: int = 64, ttl_ms: int = 3_600_000, max_episodes: int = 10_000
    ) -> None:
        if horizon <= 0 or ttl_ms <= 0 or max_episodes <= 0:
            raise ValueError("horizon, ttl_ms and max_episodes must be positive")
        self.horizon = int(horizon)
        self.ttl_ms = int(ttl_ms)
        self.max_episodes = int(max_episodes)
        self._episodes: OrderedDict[str, _Episode] = OrderedDict()
        self.evicted = 0  # episodes dropped by the size bound (not TTL)

    def __len__(self) -> int:
        return len(self._episodes)

    def __contains__(self, episode_key: object) -> bool:
        return episode_key in self._episodes

    def episodes(self) -> list[str]:
        """Open episode keys, least recently written first."""
        return list(self._episodes)

    def add(self, episode_key: str, entry: EligibilityEntry, now_ms: int) -> None:
        """Record a transition; refreshes the episode's idle clock and LRU position."""
        ep = self._episodes.get(episode_key)
        if ep is None:
            ep = _Episode(last_ms=int(now_ms))
            self._episodes[episode_key] = ep
        else:
            self._episodes.move_to_end(episode_key)
            ep.last_ms = max(ep.last_ms, int(now_ms))
        entries = ep.entries
        if entry.transition_id in ep.ids or (entries and entries[-1].step > entry.step):
            # replay or out of order (rare): rebuild unique and sorted
            rebuilt = [e for e in entries if e.transition_id != entry.transition_id]
            rebuilt.append(entry)
            rebuilt.sort(key=lambda e: e.step)
            ep.set_entries(rebuilt[-self.horizon :])
        else:  # the usual case, O(1): the next step of the episode
            entries.append(entry)
            ep.ids.add(entry.transition_id)
            if len(entries) > self.horizon:
                ep.ids.discard(entries.pop(0).transition_id)
        while len(self._episodes) > self.max_episodes:
            self._episodes.popitem(last=False)
            self.evicted += 1

    def get(self, episode_key: str) -> list[EligibilityEntry]:
        """Entries sorted by step (a copy; empty if unknown or expired)."""
        ep = self._episodes.get(episode_key)
        return list(ep.entries) if ep is not None else []

    def mark(self, episode_key: str, transition_ids: set[str], route: str) -> int:
        """Record that entries now stand in ``route`` (an outcome wrote or promoted
        them), so a copy of that outcome finds them there and does not act again;
        the episode's idle clock and LRU position are left as they are."""
        ep = self._episodes.get(episode_key)
        if ep is None:
            return 0
        hit = [i for i, e in enumerate(ep.entries) if e.transition_id in transition_ids]
        for i in hit:
            ep.entries[i] = replace(ep.entries[i], route=str(route))
        return len(hit)

    def discard(self, episode_key: str, transition_ids: set[str]) -> int:
        """Remove entries by transition id (a user asked to be forgotten)."""
        ep = self._episodes.get(episode_key)
        if ep is None:
            return 0
        before = len(ep.entries)
        ep.set_entries([e for e in ep.entries if e.transition_id not in transition_ids])
        return before - len(ep.entries)

    def close(self, episode_key: str) -> list[EligibilityEntry]:
        """Forget an episode (its outcome has been processed); returns its entries."""
        ep = self._episodes.pop(episode_key, None)
        return ep.entries if ep is not None else []

    def expire(self, now_ms: int) -> int:
        """Drop episodes idle for more than ``ttl_ms``; returns how many.

        Scans all episodes because injected (event) time need not be monotonic.
        """
        cutoff = int(now_ms) - self.ttl_ms
        stale = [k for k, ep in self._episodes.items() if ep.last_ms < cutoff]
        for k in stale:
            del self._episodes[k]
        return len(stale)

    def to_dict(self, last: int | None = None) -> dict[str, Any]:
        """JSON form; with `last`, only the `last` most recently written episodes."""
        items = list(self._episodes.items())
        if last is not None:
            items = items[-last:] if last > 0 else []
        return {
            "horizon": self.horizon,
            "ttl_ms": self.ttl_ms,
            "max_episodes": self.max_episodes,
            "episodes": [
                {"key": k, "last_ms": ep.last_ms, "entries": [e.to_dict() for e in ep.entries]}
                for k, ep in items
            ],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EligibilityWindow:
        w = cls(
            horizon=int(d["horizon"]),
            ttl_ms=int(d["ttl_ms"]),
            max_episodes=int(d["max_episodes"]),
        )
        for item in d["episodes"]:
            ep = _Episode(last_ms=int(item["last_ms"]))
            ep.set_entries([EligibilityEntry.from_dict(e) for e in item["entries"]])
            w._episodes[str(item["key"])] = ep
        return w
