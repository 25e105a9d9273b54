"""Validation limits shared by every model (and reported in the JSON Schemas), and
the byte budget of a memory row's ``metadata``.

Why limits at all: one agent with a runaway prompt must not be able to push a
megabyte of text into every memory row or a 100k-dim "state" into Milvus.
Records beyond these limits are dead-lettered with a reason, never truncated
silently.

The row budget: Milvus holds at most `Limits.max_json_field_bytes` (64 KiB) in
one JSON value, and a row's ``metadata`` is one. Its parts, as compact UTF-8
JSON (`json_bytes`, an upper bound of what the Milvus client sends):

- the user's part (``metadata.user`` and ``metadata.next``): at most
  `Limits.max_row_json_bytes`, refused at validation beyond that;
- dmem's parts of a fixed shape (gate, done, surprise, updates, failure, credit
  statistics, access count and its last responders' rounds, the merge scalars, the
  partition stamp, and every
  key, brace and comma of the object): at most `Limits.max_row_fixed_bytes`;
- the applied credit update ids (``metadata.credit_ids``): the newest that fit
  `Limits.max_credit_ids_bytes`, at most `Limits.max_credit_ids`;
- the folded transition ids (``metadata.merge.ids``): the newest that fit what
  is left (`merge_ids_budget`: at least `Limits.min_merge_ids_bytes`, when the
  user's part is at its limit), at most `Limits.max_merge_ids`.

Replacing a value in a JSON object changes its size by the difference of the
two values' sizes, so a row whose parts keep these bounds fits 64 KiB whatever
each part holds; every writer of the two lists keeps them within their budgets
(`bounded_lists`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Limits:
    max_text_chars: int = 8_192
    max_id_chars: int = 128
    max_vector_dim: int = 4_096
    max_metadata_keys: int = 32
    max_metadata_value_chars: int = 512
    max_k: int = 100
    #: memories in one page of a listing, events in one answer of a memory's history
    max_page: int = 500
    max_history: int = 10_000
    max_message_bytes: int = 1_048_576
    #: rewards, outcome and feedback values, usage weights: any real scale, and room for
    #: the operators' float32 arithmetic (3.4e38) and the squares credit takes (1e60)
    max_abs_value: float = 1e30
    #: event times (ms since the epoch) and steps: within Milvus' INT64 with room for the
    #: TTLs and horizons added to them (a clock in micro- or nanoseconds still fits)
    max_event_ms: int = 2**62 - 1
    max_step: int = 2**62 - 1
    #: a transition's ``metadata`` and ``next_observation`` as UTF-8 JSON
    #: (`user_part_bytes`): they travel in the memory row's JSON field; the rest of
    #: that field is dmem's own (module doc). The character limits above allow four
    #: times as many bytes in scripts of 4-byte characters (emoji).
    max_row_json_bytes: int = 40_960
    #: Milvus' limit on one JSON value: a row's whole ``metadata``
    max_json_field_bytes: int = 65_536
    #: dmem's parts of a row's metadata whose size does not grow with use (module doc)
    max_row_fixed_bytes: int = 2_048
    #: ``metadata.credit_ids`` (the applied credit updates: a replayed one is a no-op)
    max_credit_ids: int = 64
    max_credit_ids_bytes: int = 4_096
    #: ``metadata.merge.ids`` (the transition ids a dedup survivor stands for)
    max_merge_ids: int = 1_000

    @property
    def min_merge_ids_bytes(self) -> int:
        """What ``metadata.merge.ids`` may take when the user's part is at its limit."""
        return (self.max_json_field_bytes - self.max_row_json_bytes
                - self.max_row_fixed_bytes - self.max_credit_ids_bytes)  # fmt: skip


LIMITS = Limits()

#: the largest Milvus INT64 (its fields, and the integers a filter or a JSON value holds)
INT64_MAX = 2**63 - 1


def json_bytes(value: Any) -> int:
    """Size of `value` as compact UTF-8 JSON (raises ValueError for NaN or infinity).

    The Milvus client sends compact UTF-8 JSON; its float spelling is never longer
    than Python's, so this is an upper bound of what Milvus counts."""
    return len(
        json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
    )


def user_part_bytes(metadata: Any, next_observation: Any) -> int:
    """The user's part of a row (``metadata.user`` and ``metadata.next``) as UTF-8 JSON,
    what `Limits.max_row_json_bytes` bounds."""
    return json_bytes({"user": metadata, "next": next_observation})


def newest_within(items: Sequence[Any], max_count: int, max_bytes: int) -> list[Any]:
    """The longest tail of `items` (oldest first) with at most `max_count` items whose
    JSON list takes at most `max_bytes` (`json_bytes`)."""
    size = 2  # []
    n = 0
    for item in reversed(items[max(0, len(items) - max(0, max_count)) :]):
        add = json_bytes(item) + (1 if n else 0)  # a comma before every item but the first
        if size + add > max_bytes:
            break
        size += add
        n += 1
    return list(items[len(items) - n :]) if n else []


def merge_ids_budget(metadata: Mapping[str, Any]) -> int:
    """Bytes ``metadata.merge.ids`` may take in a row with this metadata: the JSON
    field's limit less its user's part and the other parts' bounds (module doc)."""
    user = user_part_bytes(metadata.get("user") or {}, metadata.get("next"))
    return (LIMITS.max_json_field_bytes - user - LIMITS.max_row_fixed_bytes
            - LIMITS.max_credit_ids_bytes)  # fmt: skip


def bounded_lists(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a row's `metadata` whose growing lists keep their budgets (module doc):
    the newest ``merge.ids`` and ``credit_ids`` that fit. A writer that changes the
    user's part (an edit) or folds lists together calls it before writing."""
    out = dict(metadata)
    merge = out.get("merge")
    if isinstance(merge, Mapping) and isinstance(merge.get("ids"), list):
        ids = newest_within(merge["ids"], LIMITS.max_merge_ids, merge_ids_budget(out))
        out["merge"] = {**merge, "ids": ids}
    credit_ids = out.get("credit_ids")
    if isinstance(credit_ids, list):
        out["credit_ids"] = newest_within(
            credit_ids, LIMITS.max_credit_ids, LIMITS.max_credit_ids_bytes
        )
    return out
