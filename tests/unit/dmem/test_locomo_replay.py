"""`dmem bench locomo --replay`: the offline loop is reproducible and counts what it kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dmem_bench.locomo import LocomoConfig
from dmem_bench.locomo_replay import replay

TOPICS = [
    "adopted a beagle named Rex",
    "moved to Lisbon to study architecture",
    "started a pottery class on Thursdays",
    "ran the city marathon in four hours",
    "planted tomatoes and basil",
    "bought a red kayak for the lake",
]


def write_conversation(d: Path, cid: str, a: str, b: str) -> None:
    conv: dict = {"speaker_a": a, "speaker_b": b, "qa": []}
    for n in (1, 2):
        conv[f"session_{n}_date_time"] = f"1:5{n} pm on {n + 7} May, 2023"
        turns = []
        for j in range(30):
            dia = f"D{n}:{j + 1}"
            if j % 3 == 0:
                topic = TOPICS[(int(cid) + n + j) % len(TOPICS)]
                turns.append({"speaker": a, "dia_id": dia, "text": f"Guess what, I {topic}!"})
                conv["qa"].append({"question": f"Who {topic}?", "evidence": [dia], "category": 4})
            else:
                turns.append({"speaker": b, "dia_id": dia, "text": f"Wow, that's great {j}!"})
        conv[f"session_{n}"] = turns
    (d / f"{cid}.json").write_text(json.dumps(conv))


def test_replay_is_reproducible_and_counts_noise(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    write_conversation(data, "1", "Ann", "Bob")
    write_conversation(data, "2", "Cleo", "Dan")
    cfg = LocomoConfig(data=data, noise=0.5, encoder="hash")
    a = replay(cfg, cache=tmp_path / "cache", batch=16)
    assert (tmp_path / "cache" / "locomo-embed-hash.npz").exists()
    npz = tmp_path / "cache" / "locomo-embed-hash.npz"
    before = npz.stat().st_mtime_ns
    b = replay(cfg, cache=tmp_path / "cache", batch=16)  # from the cache, same decisions
    assert npz.stat().st_mtime_ns == before  # every text was in it: nothing new was saved
    for key in ("storage_ratio", "noise_storage_ratio", "evidence_recall_at_10", "routes"):
        assert a[key] == b[key]
    assert a["turns"] == 120 and a["published"] == 120 + a["noise_turns"] > 120
    assert 0.0 < a["storage_ratio"] < 1.0
    assert 0.0 <= a["noise_storage_ratio"] <= 1.0
    assert sum(a["routes"].values()) == a["published"]
    assert a["store_all_recall_at_10"] > 0.5
    clean = replay(LocomoConfig(data=data, encoder="hash"), cache=tmp_path / "cache", batch=16)
    assert clean["noise_storage_ratio"] is None and clean["published"] == 120


def test_forget_leaves_out_what_the_write_path_evicted() -> None:
    """An ``evicted`` event after a ``written`` one (the context guard's second look)
    removes the memory, as the maintenance job's index does."""
    from dmem_bench.locomo_replay import forget
    from schemas import MemoryEvent
    from streams.settings import Settings

    def ev(kind: Any, mid: str, ts: int) -> MemoryEvent:
        part = "core" if kind == "written" else None
        return MemoryEvent(
            kind=kind, memory_id=mid, tenant="t", agent_id="a", partition=part,
            rpe=1.0, rpe_smoothed=1.0, event_ts=ts, ts=ts,
        )  # fmt: skip

    events = [ev("written", "m1", 1), ev("written", "m2", 2), ev("evicted", "m1", 3)]
    assert forget(events, Settings()) == {"m2"}
    assert forget(events[:2], Settings()) == {"m1", "m2"}


def test_the_releases_single_file_loads_as_the_unpacked_folder(tmp_path: Path) -> None:
    from dmem_bench.encoders import load_locomo
    from dmem_bench.locomo import load

    folder = tmp_path / "unpacked"
    folder.mkdir()
    for cid in ("1", "2"):
        write_conversation(folder, cid, "Ann", "Bo")
    release = []
    for cid in ("1", "2"):
        conv = json.loads((folder / f"{cid}.json").read_text())
        release.append({"sample_id": cid, "qa": conv.pop("qa"), "conversation": conv})
    single = tmp_path / "release" / "locomo10.json"
    single.parent.mkdir()
    single.write_text(json.dumps(release))
    want = load(folder)
    for data in (single, single.parent):
        got = load(data)
        assert [(c.cid, c.speakers, c.sessions, c.qa) for c in got] == [
            (c.cid, c.speakers, c.sessions, c.qa) for c in want
        ]
        assert load_locomo(data, 1) == load_locomo(folder, 1)
    assert [c.cid for c in load(single, 1)] == ["1"]
    single.write_text(json.dumps([{"conversation": {"speaker_a": "Ann"}}]))
    with pytest.raises(ValueError, match="has no speaker_b, qa"):
        load(single)
