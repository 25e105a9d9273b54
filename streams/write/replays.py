"""What a write of an id that is already stored may change: the store stage's last look.

The write path builds each row from its transition alone (`memory_row`: utility 0, no
uses, no credit). Its gate state knows what it stored since its state was last
restored, and drops an exact repeat of it (`content_key`); a worker that starts with
less than that (a state that was never checkpointed, a memory-only broker, an
import of an old log) judges a republished transition afresh and would write its
row again over one that has since earned credit, feedback ids, uses and merges.

`reconcile` runs on the rows of one batch against the rows stored under the same
keys (one read per batch, `StoreService.write`):

- A **replay** (same text, action, reward, next observation, `done`, the agent's
  metadata and vector as the stored row; for a dedup survivor, whose reward is its
  members' mean, the same text and action) changes nothing stored: the row is not written
  (docs/guarantees/idempotence.md: a redelivered record, a re-imported log or a
  client retry changes nothing it already did). Its events still go out: a crash
  between a batch's upserts and its events replays rows that are stored and events
  that were never sent, and the audit trail must not lose them.
  Hindsight's re-scores (`REWRITES`) are the exception: they rewrite a stored
  row on purpose, with what it earned carried over as below.
- An **edit** (the same id with other content: LangGraph's ``put`` of a key again)
  writes the new content and carries over what the memory earned (`EARNED`
  fields and metadata), and stays in ``core`` if it was there: credit follows the
  memory's identity, not its wording. The carried id lists keep their newest
  entries within what the new content leaves them (`schemas.limits.bounded_lists`),
  so an edit near the user's byte limit still fits Milvus' JSON field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from schemas import storage_key
from schemas.limits import bounded_lists

__all__ = ["EARNED", "EARNED_META", "REWRITES", "is_replay", "reconcile"]

#: row fields the jobs earn after the write (credit, access, dedup)
EARNED = ("utility", "uses", "merged_count")
#: metadata keys the jobs write (credit statistics and applied ids, access, merges)
EARNED_META = ("credit", "credit_ids", "access", "merge")
#: gate reasons of writes that rewrite a stored row on purpose (hindsight)
REWRITES = frozenset({"retrospective", "failure_terminal"})
#: the row fields (and metadata keys) that say what the memory is
_CONTENT = ("text", "action")
_CONTENT_META = ("user", "next", "done")


def _same_reward(a: Any, b: Any) -> bool:
    # stored as float32: compare at its precision
    fa, fb = float(a or 0.0), float(b or 0.0)
    return math.isclose(fa, fb, rel_tol=1e-6, abs_tol=1e-6)


def _same_vector(a: Any, b: Any) -> bool:
    if a is None or b is None:  # not read: the text stands for it
        return True
    va, vb = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return va.shape == vb.shape and bool(np.allclose(va, vb, rtol=1e-5, atol=1e-6))


def is_replay(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    """The new row says exactly what the stored one says (a state's vector, or the
    encoder's vector of the text, included: an edit of a state or a new encoder
    rewrites the row)."""
    if any(new.get(f) != old.get(f) for f in _CONTENT):
        return False
    if int(old.get("merged_count") or 1) > 1:
        # a dedup survivor: its reward, vector and metadata are its members' merge;
        # one member sent again is a replay of what the merge already holds
        return True
    if not _same_reward(new.get("reward"), old.get("reward")):
        return False
    if not _same_vector(new.get("vector"), old.get("vector")):
        return False
    nm, om = new.get("metadata") or {}, old.get("metadata") or {}
    return all((nm.get(k) or None) == (om.get(k) or None) for k in _CONTENT_META)


def _carry(new: dict[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(new)
    for f in EARNED:
        if old.get(f) is not None:
            out[f] = old[f]
    if old.get("last_access_ts") is not None:
        out["last_access_ts"] = max(int(old["last_access_ts"]), int(new["last_access_ts"]))
    meta = dict(new.get("metadata") or {})
    om = old.get("metadata") or {}
    for k in EARNED_META:
        if k in om:
            meta[k] = om[k]
    # the new user metadata may leave the carried id lists less room (`schemas.limits`)
    out["metadata"] = bounded_lists(meta)
    return out


def reconcile(
    upserts: Mapping[str, list[dict[str, Any]]], stored: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, list[dict[str, Any]]], set[str]]:
    """(the upserts to write, by partition; storage keys of the replays not written).

    ``stored``: storage key -> the stored row (with its ``partition``) of the keys
    among ``upserts`` that exist.
    """
    out: dict[str, list[dict[str, Any]]] = {p: [] for p in upserts}
    skipped: set[str] = set()
    for part, rows in upserts.items():
        for row in rows:
            key = storage_key(row["tenant"], row["id"])
            old = stored.get(key)
            if old is None:
                out[part].append(row)
                continue
            reason = ((row.get("metadata") or {}).get("gate") or {}).get("reason")
            if reason not in REWRITES and is_replay(row, old):
                skipped.add(key)
                continue
            to = "core" if old.get("partition") == "core" else part
            out.setdefault(to, []).append(_carry(row, old))
    return out, skipped
