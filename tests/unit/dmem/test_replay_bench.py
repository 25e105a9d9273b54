"""`dmem bench replay`: the streams are fixed (event times included) and the pairwise
comparison measures what it says."""

from __future__ import annotations

from dmem_bench.replay import BASE_TS, make_chat, pairwise
from schemas import Transition


def test_the_chat_stream_is_a_function_of_its_seed() -> None:
    a, b, c = make_chat(30, 1), make_chat(30, 1), make_chat(30, 2)
    assert [r.model_dump() for r in a] == [r.model_dump() for r in b]
    assert [r.model_dump() for r in a] != [r.model_dump() for r in c]
    trs = [r for r in a if isinstance(r, Transition)]
    assert len(trs) == 30 and trs[0].ts == BASE_TS
    assert [t.ts for t in trs] == sorted(t.ts or 0 for t in trs)  # event times move forward
    texts = [t.observation for t in trs]
    assert len(set(texts)) < len(texts)  # people repeat themselves: dedup has work


def test_pairwise_jaccard_of_ids_partitions_and_utility() -> None:
    def row(part: str, u: float) -> dict[str, object]:
        return {"partition": part, "utility": u}

    rows = {
        "x": {"a": row("core", 0.5), "b": row("buffer", 0.0)},
        "y": {"a": row("core", 0.25), "b": row("core", 0.0), "c": row("core", 0.0)},
        "z": {"a": row("core", 0.5), "b": row("buffer", 0.0)},
    }
    got = {(p["a"], p["b"]): p for p in pairwise(rows)}
    assert set(got) == {("x", "y"), ("x", "z"), ("y", "z")}
    assert got[("x", "y")]["same_ids"] == round(2 / 3, 4)
    assert got[("x", "y")]["same_partitions"] == round(1 / 4, 4)
    assert got[("x", "y")]["utility_diff"] == 0.25
    assert got[("x", "z")] == {"a": "x", "b": "z", "same_ids": 1.0, "same_partitions": 1.0,
                               "utility_diff": 0.0}  # fmt: skip
