"""`streams.write.replays.reconcile`: a write of a stored id does not undo what the
memory earned; an exact replay is not written at all."""

from __future__ import annotations

from typing import Any

from schemas import storage_key
from streams.write.replays import reconcile


def row(mid: str, text: str = "the key is under the mat", reward: float = 1.0,
        reason: str = "above_high") -> dict[str, Any]:  # fmt: skip
    return {"id": mid, "tenant": "t", "text": text, "action": "look", "reward": reward,
            "utility": 0.0, "uses": 0, "merged_count": 1, "last_access_ts": 100,
            "metadata": {"user": {"room": "hall"}, "gate": {"reason": reason}, "next": None,
                         "done": False}}  # fmt: skip


def stored(r: dict[str, Any], partition: str, **earned: Any) -> dict[str, Any]:
    meta = {**r["metadata"], "credit": {"n": 3}, "credit_ids": ["fb-1"], "merge": {"ids": ["x"]}}
    return {**r, "partition": partition, "utility": 0.8, "uses": 5, "merged_count": 1,
            "last_access_ts": 900, "reward": 1.0000000116, "metadata": meta, **earned}  # fmt: skip


def test_a_replay_is_not_written_and_a_new_id_is() -> None:
    a, b = row("a"), row("b")
    out, skipped = reconcile(
        {"core": [a, b], "buffer": []}, {storage_key("t", "a"): stored(a, "core")}
    )
    assert skipped == {storage_key("t", "a")}  # float32 reward: still the same
    assert out == {"core": [b], "buffer": []}


def test_an_edit_keeps_what_the_memory_earned_and_its_core_place() -> None:
    old = stored(row("a"), "core", merged_count=2)
    new = row("a", text="the key is in the drawer")
    out, skipped = reconcile({"core": [], "buffer": [new]}, {storage_key("t", "a"): old})
    assert not skipped and out["buffer"] == []
    [w] = out["core"]
    assert w["text"] == "the key is in the drawer"
    assert (w["utility"], w["uses"], w["merged_count"], w["last_access_ts"]) == (0.8, 5, 2, 900)
    assert w["metadata"]["credit"] == {"n": 3} and w["metadata"]["credit_ids"] == ["fb-1"]
    assert w["metadata"]["merge"] == {"ids": ["x"]} and w["metadata"]["user"] == {"room": "hall"}


def test_other_reward_metadata_or_next_is_an_edit() -> None:
    base = row("a")
    for new in (row("a", reward=-1.0),
                {**base, "metadata": {**base["metadata"], "user": {"room": "cellar"}}},
                {**base, "metadata": {**base["metadata"], "next": "a lamp"}}):  # fmt: skip
        out, skipped = reconcile({"buffer": [new]}, {storage_key("t", "a"): stored(base, "buffer")})
        assert not skipped and len(out["buffer"]) == 1 and out["buffer"][0]["utility"] == 0.8


def test_a_new_vector_is_an_edit_and_a_merge_survivor_a_replay() -> None:
    base = {**row("a"), "vector": [1.0, 0.0]}
    old = stored(base, "buffer")
    # a state whose rendering did not change, or a new encoder: the vector differs
    out, skipped = reconcile({"buffer": [{**base, "vector": [0.0, 1.0]}]},
                             {storage_key("t", "a"): old})  # fmt: skip
    assert not skipped and out["buffer"][0]["vector"] == [0.0, 1.0]
    # float32 round trip of the same vector: a replay
    _, skipped = reconcile({"buffer": [{**base, "vector": [1.0 + 1e-8, 0.0]}]},
                           {storage_key("t", "a"): old})  # fmt: skip
    assert skipped == {storage_key("t", "a")}
    # a dedup survivor holds its members' mean reward: its own transition again is a replay
    survivor = {**stored(base, "core"), "reward": 0.55, "merged_count": 3}
    _, skipped = reconcile({"buffer": [base]}, {storage_key("t", "a"): survivor})
    assert skipped == {storage_key("t", "a")}


def test_hindsight_rewrites_a_stored_row_on_purpose() -> None:
    base = row("a", reason="retrospective")
    out, skipped = reconcile({"core": [base]}, {storage_key("t", "a"): stored(row("a"), "buffer")})
    assert not skipped and out["core"][0]["utility"] == 0.8  # promoted, credit kept
