"""Pure parts of the memory browser: query parameters, cursors, history rows."""

from __future__ import annotations

import base64

import orjson
import pytest

from milvus.history import FOLD_SLOT, event_key
from schemas import MemoryEvent, MemoryListQuery, UtilityUpdate
from schemas.errors import InvalidRecord
from streams.jobs.credit import credit_event
from streams.jobs.history import history_row
from streams.respond.browse import (
    CURSOR_CHARS,
    MAX_BOUNDS,
    decode_cursor,
    encode_cursor,
    list_query,
    read_cursor,
)


def test_query_parameters_become_a_list_query() -> None:
    q = MemoryListQuery.model_validate(list_query({
        "tenant": "t", "limit": "20", "agent_id": "a", "valence": "-1", "partition": "core",
        "since_ms": "5", "until_ms": "9", "min_utility": "0.25", "meta.level": "3",
        "meta.room": "kitchen", "meta.flag": "true", "meta.code": '"3"'}))  # fmt: skip
    assert q.limit == 20 and q.agent_id == "a"
    f = q.filters
    assert (f.valence, f.partition, f.since_ms, f.until_ms, f.min_utility) == (
        -1, "core", 5, 9, 0.25)  # fmt: skip
    assert f.metadata_equals == {"level": 3, "room": "kitchen", "flag": True, "code": "3"}


def test_bad_query_parameters_are_refused_with_reasons() -> None:
    with pytest.raises(InvalidRecord, match="unknown query parameters"):
        list_query({"tenant": "t", "colour": "red"})
    with pytest.raises(ValueError, match="limit"):
        MemoryListQuery.model_validate(list_query({"tenant": "t", "limit": "0"}))
    with pytest.raises(ValueError, match="valence"):
        MemoryListQuery.model_validate(list_query({"tenant": "t", "valence": "2"}))
    # integers are ASCII digits: no sign, no digit separator, no other script's digits
    for key in ("limit", "since_ms", "until_ms"):
        for bad in ("+5", "5_0", " 5", "\u0665", "-1", "1" * 40):
            with pytest.raises(InvalidRecord, match=key):
                list_query({"tenant": "t", key: bad})


def test_cursor_round_trip_and_garbage() -> None:
    assert decode_cursor(encode_cursor(1234, "m-1|x")) == (1234, "m-1|x")
    for bad in ("", "abc", encode_cursor(1, "x")[:-3], "eyJ0IjoiYSIsImkiOiJ4In0"):
        with pytest.raises(InvalidRecord):
            decode_cursor(bad)


def _forged(d: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(d)).decode().rstrip("=")


@pytest.mark.parametrize("d", [
    {"t": True, "i": "x"},
    {"t": False, "i": "x"},
    {"t": 2**63, "i": "x"},
    {"t": -(2**63), "i": "x"},
    {"t": -1, "i": "x"},
    {"t": 5, "i": "x", "b": [[True, "y"]]},
    {"t": 5, "i": "x", "b": [[2**63, "y"]]},
    {"t": 5, "i": "x", "b": [[-1, "y"]]},
])  # fmt: skip
def test_forged_cursor_timestamps_are_refused(d: dict[str, object]) -> None:
    """Booleans and values no Milvus INT64 created_ts of a page holds: not a next_cursor
    (a 422 here, not a failed store query)."""
    with pytest.raises(InvalidRecord, match="not a next_cursor"):
        read_cursor(_forged(d))
    assert read_cursor(_forged({"t": 2**63 - 1, "i": "x", "b": [[0, "y"]]})).ts == 2**63 - 1


def test_cursor_carries_bounds_and_stays_short() -> None:
    c = read_cursor(encode_cursor(9, "m9", [(8, "m8"), (7, "m7")], floor=True))
    assert (c.ts, c.id, c.bounds, c.floor) == (9, "m9", ((8, "m8"), (7, "m7")), True)
    many = [(i, "x" * 120 + str(i)) for i in range(20)]
    long = encode_cursor(1, "m", many, floor=True)
    c = read_cursor(long)
    assert len(long) <= CURSOR_CHARS and 0 < len(c.bounds) <= MAX_BOUNDS
    assert c.bounds == tuple(many[: len(c.bounds)]) and not c.floor  # floor only with all
    bad = encode_cursor(1, "m")[:-2] + "In0"  # not base64 JSON of a cursor any more
    for garbage in (bad, "eyJ0IjoxLCJpIjoibSIsImIiOltbMSwyXV19"):  # a bound [1, 2]
        with pytest.raises(InvalidRecord):
            read_cursor(garbage)


def _event(kind: str, **kw: object) -> MemoryEvent:
    return MemoryEvent.model_validate({"kind": kind, "memory_id": "m1", "tenant": "t",
                                       "ts": 900, **kw})  # fmt: skip


def test_history_rows_use_event_time_and_name_the_survivor() -> None:
    row = history_row(_event("written", event_ts=500, route="core", gate=0.7, theta_low=0.1,
                             theta_high=0.9, reason="surprise"))  # fmt: skip
    assert row is not None
    assert (row["ts"], row["processed_ts"], row["route"], row["theta_high"]) == (500, 900, "core",
                                                                                 0.9)  # fmt: skip
    merged = history_row(_event("merged", reason="into m0 cos=0.9900"))
    assert merged is not None and merged["into"] == "m0" and merged["ts"] == 900
    assert history_row(_event("dropped")) is None


def test_event_keys_are_deterministic_and_the_fold_has_one_slot() -> None:
    body = {"a": 1, "b": [1, 2]}
    assert event_key("credited", 5, body) == event_key("credited", 5, dict(reversed(body.items())))
    assert event_key("credited", 5, body) != event_key("credited", 5, {"a": 2, "b": [1, 2]})
    assert event_key("merged", 5, body) == event_key("merged", 7, {}) == FOLD_SLOT


def test_credit_events_say_thumbs_or_outcome_and_before_after() -> None:
    u = UtilityUpdate(update_id="fb:x", memory_id="m1", tenant="t", credit=1.0, uses=0, ts=7)
    ev = credit_event(u, "m0", 0.1, {"utility": 0.28})
    assert ev["kind"] == "fed_back" and ev["memory_id"] == "m0" and ev["via"] == "m1"
    assert (ev["utility_before"], ev["utility_after"]) == (0.1, 0.28)
    u2 = UtilityUpdate(update_id="ep:1:m1", memory_id="m1", tenant="t", credit=-0.5, ts=7,
                       episode_id="ep1")  # fmt: skip
    ev2 = credit_event(u2, "m1", 0.0, {"utility": -0.1})
    assert ev2["kind"] == "credited" and ev2["episode_id"] == "ep1" and ev2["via"] is None


def test_sdk_list_parameters_round_trip_through_the_server_parser() -> None:
    from dmem.client import list_params

    q = list_params("t", 20, "c1", "a", {"valence": -1, "min_utility": 0.5,
                                        "metadata_equals": {"code": "3", "level": 3}})  # fmt: skip
    parsed = MemoryListQuery.model_validate(list_query(q))
    assert (parsed.tenant, parsed.limit, parsed.cursor, parsed.agent_id) == ("t", 20, "c1", "a")
    assert parsed.filters.valence == -1 and parsed.filters.min_utility == 0.5
    assert parsed.filters.metadata_equals == {"code": "3", "level": 3}
