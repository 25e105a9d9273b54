"""The chat-turn -> Transition mapping (docs/reference/sdk.md) and the LoCoMo loader."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from dmem.client import ChatTurn, chat_transitions
from dmem_bench.locomo import LocomoConfig, build_streams, evidence_ids, load, parse_date
from schemas import LIMITS


def test_session_maps_to_an_episode_with_next_turns() -> None:
    turns = [
        ChatTurn("Ann", "Hi!", "m1", 1000),
        ChatTurn("Bob", "I got a dog.", "m2", 2000),
        ChatTurn("Ann", "Wow!", "m3", 3000, {"lang": "en"}),
    ]
    ts = chat_transitions(turns, tenant="t", conversation="c-1", session=4)
    assert [t.episode_id for t in ts] == ["c-1:4"] * 3
    assert [t.agent_id for t in ts] == ["c-1"] * 3
    assert [t.step for t in ts] == [0, 1, 2]
    assert ts[0].observation == "Ann: Hi!"
    assert ts[0].next_observation == "Bob: I got a dog."
    assert ts[2].next_observation is None and ts[2].done and not ts[1].done
    assert [t.ts for t in ts] == [1000, 2000, 3000]
    assert all(t.reward == 0.0 and t.action == "say" for t in ts)
    assert ts[2].metadata == {"speaker": "Ann", "session": "4", "turn": "m3", "lang": "en"}
    again = chat_transitions(turns, tenant="t", conversation="c-1", session=4)
    assert [t.memory_id for t in again] == [t.memory_id for t in ts]  # replays upsert
    other = chat_transitions(turns, tenant="t", conversation="c-1", session=5)
    assert not {t.memory_id for t in other} & {t.memory_id for t in ts}


def test_locomo_helpers(tmp_path: Path) -> None:
    want = datetime(2023, 5, 8, 13, 56, tzinfo=UTC).timestamp() * 1000
    assert parse_date("1:56 pm on 8 May, 2023") == want
    assert evidence_ids(["D1:3", "D2:1; D2:4", "D3:5 D3:6"]) == [
        "D1:3",
        "D2:1",
        "D2:4",
        "D3:5",
        "D3:6",
    ]
    for cid, names in (("1", ("A", "B")), ("2", ("C", "D"))):
        d = {
            "speaker_a": names[0],
            "speaker_b": names[1],
            "qa": [],
            "session_1_date_time": "1:00 pm on 1 May, 2023",
            "session_1": [
                {"speaker": names[j % 2], "dia_id": f"D1:{j + 1}", "text": f"turn {j} of {cid}"}
                for j in range(40)
            ],
            "session_2_date_time": "1:00 pm on 9 May, 2023",
        }  # no turns
        (tmp_path / f"{cid}.json").write_text(json.dumps(d))
    convs = load(tmp_path)
    assert [len(c.sessions) for c in convs] == [1, 1]
    run = build_streams(convs, LocomoConfig(data=tmp_path, noise=0.5, seed=1))
    s = run.items["1"]
    noise = [it for it in s if it.noise]
    assert len(s) - len(noise) == 40
    assert 8 <= len(noise) <= 35  # Poisson(0.5) per real turn
    # noise comes from the other conversation, spoken by this one's speakers
    assert all(" of 2" in it.transition.text() for it in noise)
    assert {it.transition.metadata["speaker"] for it in noise} <= {"A", "B"}
    # nothing published tells a noise turn from a real one but its content
    assert {tuple(sorted(it.transition.metadata)) for it in s} == {("session", "speaker", "turn")}
    assert len({it.transition.metadata["turn"] for it in s}) == len(s)
    assert np.all(np.diff([it.transition.ts for it in s]) > 0)
    clean = build_streams(convs, LocomoConfig(data=tmp_path))
    assert not any(it.noise for it in clean.items["1"])


def test_a_long_conversation_id_still_gives_valid_distinct_episode_ids() -> None:
    turns = [ChatTurn("Ann", "Hi!", "m1", 1000), ChatTurn("Bob", "Hello.", "m2", 2000)]
    for conv in ("c" * 121, "c" * 128, "x" * 100):  # any valid agent id; 121+ overflowed
        sessions = [
            chat_transitions(turns, tenant="t", conversation=conv, session=s)
            for s in (1, 2, "s" * 120)
        ]
        eps = [ts[0].episode_id for ts in sessions]
        assert all(len(e) <= LIMITS.max_id_chars for e in eps)
        assert len(set(eps)) == 3  # a session is still its own episode
        assert all(t.agent_id == conv for ts in sessions for t in ts)
        again = chat_transitions(turns, tenant="t", conversation=conv, session=2)
        assert again[0].episode_id == eps[1]  # stable: a replay upserts
    # today's readable form is kept whenever it fits
    assert (
        chat_transitions(turns, tenant="t", conversation="c" * 126, session=9)[0].episode_id
        == "c" * 126 + ":9"
    )
