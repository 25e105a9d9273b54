"""`dmem_bench.longmemeval`: loading, the chat mapping, forgetting and the recall keys."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dmem_bench import longmemeval as lme
from streams.settings import Settings

FACTS = [
    "The play I attended was The Glass Menagerie",
    "I keep my sneakers under the bed",
    "My sister Maya moved to Lisbon",
    "I bought a red kayak for the lake",
]


def question(qid: str, qtype: str, n_sessions: int = 6, day0: int = 1) -> dict:
    sessions, dates, ids = [], [], []
    for n in range(n_sessions):
        turns = []
        for j in range(6):
            if n == 2 and j == 0:
                turns.append(
                    {"role": "user", "content": FACTS[int(qid[1]) % len(FACTS)], "has_answer": True}
                )
            elif j % 2 == 0:
                turns.append({"role": "user", "content": f"Tell me about topic {n} {j}."})
            else:
                turns.append(
                    {
                        "role": "assistant",
                        "content": f"Here is a long answer on topic {n} {j}: " * 5,
                    }
                )
        sessions.append(turns)
        dates.append(f"2023/05/{day0 + n:02d} (Sat) 1{n}:0{j}")
        ids.append(f"answer_{qid}" if n == 2 else f"s{qid}_{n}")
    return {
        "question_id": qid,
        "question_type": qtype,
        "question": FACTS[int(qid[1]) % len(FACTS)] + "?",
        "answer": "x",
        "question_date": "2023/06/30 (Fri) 10:00",
        "haystack_sessions": sessions,
        "haystack_dates": dates,
        "haystack_session_ids": ids,
        "answer_session_ids": [f"answer_{qid}"],
    }


@pytest.fixture
def data(tmp_path: Path) -> Path:
    p = tmp_path / "lme.jsonl.gz"
    qs = [
        question("q1", "single-session-user"),
        question("q2", "multi-session"),
        question("q3_abs", "single-session-user"),
        question("q4", "multi-session"),
    ]
    with gzip.open(p, "wt") as f:
        for q in qs:
            f.write(json.dumps(q) + "\n")
    return p


def test_parse_date() -> None:
    assert lme.parse_date("2023/05/20 (Sat) 03:18") == 1684552680000


def test_load_and_stratify(data: Path) -> None:
    qs = lme.load(data)
    assert [q.qid for q in qs] == ["q1", "q2", "q3_abs", "q4"]
    assert qs[2].abstention and not qs[0].abstention
    assert [q.qid for q in lme.load(data, per_type=1)] == ["q1", "q2"]
    assert len(lme.load(data, limit=3)) == 3


def test_transitions_follow_the_chat_mapping(data: Path) -> None:
    q = lme.load(data)[0]
    turns = lme.transitions(q)
    assert len(turns) == 36
    t = turns[0].transition
    assert t.observation is not None and t.observation.startswith("user: ")
    assert t.action == "say" and t.reward == 0.0
    assert t.agent_id == "lme-q1" and t.tenant == "lme-q1"
    assert t.ts is not None and turns[1].transition.ts == t.ts + lme.TURN_GAP_MS
    assert [x.evidence for x in turns].count(True) == 1
    assert turns[12].evidence and turns[12].session == "answer_q1"


def test_forget_on_defaults_follows_the_chats_span() -> None:
    """Product defaults: the horizons follow the chat's own span, so a 30-day-old
    buffer memory of a 30-day chat stays; fixed horizons (span_factor 0) evict it
    after the 14-day TTL; without maintenance everything written stays."""
    from dmem_bench.locomo_replay import forget
    from schemas import MemoryEvent

    day = 24 * 3600 * 1000

    def ev(mid: str, ts: int) -> MemoryEvent:
        return MemoryEvent(
            kind="written",
            memory_id=mid,
            tenant="t",
            agent_id="a",
            episode_id="e",
            step=0,
            partition="buffer",
            route="buffer",
            reward=0.0,
            rpe=1.0,
            rpe_smoothed=1.0,
            gate=0.5,
            valence=0,
            theta_low=0.5,
            theta_high=1.0,
            reason="between",
            event_ts=ts,
            ts=0,
        )

    events = [ev("old", 0), ev("new", 30 * day)]
    # product defaults: the horizons follow the chat's own 30-day span
    assert forget(events, Settings()) == {"old", "new"}
    fixed = Settings()
    fixed.maintenance.span_factor = 0.0
    assert forget(events, fixed) == {"new"}
    off = Settings()
    off.maintenance.enabled = False
    assert forget(events, off) == {"old", "new"}


def test_run_reports_the_contract_keys(data: Path) -> None:
    res = lme.run(data, encoder="hash", batch=16)
    for key in (
        "questions",
        "turns",
        "storage_ratio",
        "evidence_stored_ratio",
        "turn_recall_at_10",
        "store_all_turn_recall_at_10",
        "session_recall_at_10",
        "store_all_session_recall_at_10",
    ):
        assert key in res
        for r in res["by_type"].values():
            assert key in r
    assert res["questions"] == 4 and res["turns"] == 4 * 36
    assert res["recall_questions"] == 3  # the abstention question counts for storage only
    assert 0.0 < res["storage_ratio"] <= 1.0
    assert res["store_all_turn_recall_at_10"] == 1.0
    # deterministic
    again = lme.run(data, encoder="hash", batch=16)
    assert again["storage_ratio"] == res["storage_ratio"]


def test_score_question_counts_the_turns_a_hit_stands_for(data: Path) -> None:
    q = lme.load(data)[0]
    run = lme.QuestionRun(q, lme.transitions(q))
    n = len(run.turns)
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(n, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    ev = next(i for i, t in enumerate(run.turns) if t.evidence)
    qvec = vecs[ev]
    nothing = lme.score_question(run, vecs, qvec)
    assert nothing["stored"] == 0 and nothing["turn_recall_at_10"] == 0.0
    assert nothing["store_all_turn_recall_at_10"] == 1.0
    assert nothing["store_all_session_recall_at_5"] == 1.0

    def folded(run: lme.QuestionRun, vecs: np.ndarray) -> tuple[np.ndarray, list[list[int]]]:
        # one row, near the evidence turn, standing for it and its neighbour
        return vecs[[ev]], [[ev, ev + 1]]

    m = lme.score_question(run, vecs, qvec, folded)
    assert m["stored"] == 1 and m["turn_recall_at_5"] == 1.0 and m["session_recall_at_10"] == 1.0
    assert m["turns_returned_at_10"] == 2.0
    best = lme.score_question(run, vecs, qvec, folded, fold="best")
    assert best["turns_returned_at_10"] == 1.0 and best["turn_recall_at_10"] == 1.0


def test_the_bench_command_prints_the_contract_on_its_last_line(data: Path) -> None:
    from click.testing import CliRunner

    from dmem_bench.cli import bench

    out = CliRunner().invoke(
        bench, ["longmemeval", "--data", str(data), "--encoder", "hash", "--batch", "16", "--json"]
    )
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["questions"] == 4 and set(res["by_type"]) == {"single-session-user", "multi-session"}
    assert 0.0 < res["storage_ratio"] <= 1.0
    assert res["turns"] == sum(t["turns"] for t in res["by_type"].values())


def test_the_bench_command_needs_its_data() -> None:
    from click.testing import CliRunner

    from dmem_bench.cli import bench

    out = CliRunner().invoke(bench, ["longmemeval", "--json"])
    assert out.exit_code == 2 and "Missing option '--data'" in out.output


@pytest.mark.parametrize("name", ["longmemeval_s.json", "longmemeval_s.json.gz"])
def test_the_releases_json_array_loads_as_the_lines(data: Path, tmp_path: Path, name: str) -> None:
    with gzip.open(data, "rt") as f:
        items = [json.loads(line) for line in f]
    p = tmp_path / name
    text = json.dumps(items, indent=1)
    if name.endswith(".gz"):
        with gzip.open(p, "wt") as g:
            g.write(text)
    else:
        p.write_text(text)
    assert lme.load(p) == lme.load(data)


def test_bad_files_are_refused_with_the_place(tmp_path: Path) -> None:
    p = tmp_path / "lme.jsonl"
    p.write_text(json.dumps(question("q1", "multi-session")) + "\n{not json\n")
    with pytest.raises(ValueError, match="line 2: neither one JSON object a line"):
        lme.load(p)
    q = question("q1", "multi-session")
    del q["haystack_dates"]
    p.write_text(json.dumps(q) + "\n")
    with pytest.raises(ValueError, match="question 1 has no haystack_dates"):
        lme.load(p)


class FixedEncoder:
    """The question's vector, whatever the text."""

    dim = 4

    def __init__(self, vec: list[float]) -> None:
        self.vec = np.asarray(vec, dtype=np.float32)

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.vec for _ in texts])


def _row(turn: lme.Turn, vec: list[float], ts: int, **meta: object) -> dict:
    tr = turn.transition
    v = np.asarray(vec, dtype=np.float32)
    return {
        "id": tr.memory_id, "tenant": tr.tenant, "agent_id": tr.agent_id,
        "episode_id": tr.episode_id, "step": tr.step, "text": tr.text(), "action": "say",
        "reward": 0.0, "rpe": 0.0, "rpe_smoothed": 1.0, "utility": 0.0, "uses": 0,
        "valence": 0, "created_ts": ts, "merged_count": 1, "metadata": {"user": {}, **meta},
        "partition": "buffer", "vector": (v / np.linalg.norm(v)).tolist(),
    }  # fmt: skip


def test_served_hits_are_the_respond_roles_answer(data: Path) -> None:
    """A later statement that updates an earlier one is served above it although the
    earlier is closer by cosine, and with the question's date (``as_of``) a turn written
    after it is not served: the respond role's answer, not cosine over the kept turns."""
    q = lme.load(data)[0]
    run = lme.QuestionRun(q, lme.transitions(q))
    t0, t1, t2 = run.turns[0], run.turns[2], run.turns[4]
    day = 86_400_000
    old = _row(t0, [1.0, 0.1, 0, 0], q.question_date - 20 * day)
    new = _row(t1, [1.0, 0.3, 0, 0], q.question_date - day, updates=t0.transition.memory_id)
    late = _row(t2, [1.0, 0.0, 0, 0], q.question_date + day)  # the closest of all
    run.rows = {r["id"]: r for r in (old, new, late)}
    run.kept = set(run.rows)
    enc = FixedEncoder([1.0, 0.0, 0.0, 0.0])
    assert lme.served(run, enc, Settings())(10) == [[4], [2], [0]]
    search = lme.served(run, enc, Settings(), as_of=True)
    assert search(10) == [[2], [0]]
    vecs = np.zeros((len(run.turns), 4), dtype=np.float32)
    for i, r in ((0, old), (2, new), (4, late)):
        vecs[i] = r["vector"]
    m = lme.score_question(run, vecs, np.array([1.0, 0, 0, 0], np.float32), search=search)
    assert m["turns_returned_at_10"] == 2.0  # by cosine: all three
    with pytest.raises(ValueError, match="tenant and date only"):
        lme.KeptStore(q.qid, [old]).search(old["vector"], q.qid, 5, extra_filter={"valence": 1})


def test_the_cosine_keys_are_the_kept_turns_by_cosine(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Served, dmem's hits are the responder's (asked once per question with an answer
    and k); the ``cosine_`` keys are cosine over the same kept turns either way."""
    asked: list[int] = []
    real = lme.served

    def counted(*args: Any, **kw: Any) -> Any:
        search = real(*args, **kw)

        def ask(k: int) -> list[list[int]]:
            asked.append(k)
            return search(k)

        return ask

    monkeypatch.setattr(lme, "served", counted)
    served = lme.run(data, encoder="hash", batch=16)
    assert sorted(asked) == [5, 5, 5, 10, 10, 10]  # the 3 questions with answers
    asked.clear()
    cosine = lme.run(data, encoder="hash", batch=16, ranking="cosine")
    assert asked == []
    assert served["ranking"] == "served" and cosine["ranking"] == "cosine"
    assert served["as_of"] is False
    assert cosine["turn_recall_at_10"] == cosine["cosine_turn_recall_at_10"]
    assert served["cosine_turn_recall_at_10"] == cosine["cosine_turn_recall_at_10"]
    assert served["storage_ratio"] == cosine["storage_ratio"]
    with pytest.raises(ValueError, match="ranking"):
        lme.run(data, encoder="hash", ranking="bm25")
    with pytest.raises(ValueError, match="as_of"):
        lme.run(data, encoder="hash", ranking="cosine", as_of=True)
