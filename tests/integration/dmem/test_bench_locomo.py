"""`dmem bench locomo --json` at a tiny scale: the JSON contract of issue 20.

Runs the real thing (embedded broker, one worker with every role, Milvus Lite) as
a subprocess with the hash encoder, on two small conversations written here in
LoCoMo's format (the real data set is for evaluation only and stays outside the
repository). Checks keys and sane values; the quality targets are the full
benchmark's (BENCHMARKS.md "LoCoMo").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
KEYS = (
    "conversations", "turns", "questions", "storage_ratio", "evidence_recall_at_5",
    "evidence_recall_at_10", "store_all_recall_at_5", "store_all_recall_at_10", "noise_ratio",
    "noise_storage_ratio", "noise_evidence_recall_at_10", "elapsed_s",
)  # fmt: skip
PEOPLE = {"1": ("Ann", "Bob"), "2": ("Cleo", "Dan")}
TOPICS = [
    "adopted a beagle named Rex from the shelter", "moved to Lisbon to study architecture",
    "started a pottery class on Thursday evenings", "ran the city marathon in four hours",
    "planted tomatoes and basil in the backyard", "bought a red kayak for the lake",
    "visited grandma in Porto for her birthday", "learned to bake sourdough bread",
]  # fmt: skip


def conversation(cid: str) -> dict:
    a, b = PEOPLE[cid]
    d: dict = {"speaker_a": a, "speaker_b": b, "qa": []}
    for n in (1, 2, 3):
        d[f"session_{n}_date_time"] = f"1:5{n} pm on {n + 7} May, 2023"
        turns = []
        for j in range(12):
            spk = a if j % 2 == 0 else b
            dia = f"D{n}:{j + 1}"
            if j % 4 == 0:
                topic = TOPICS[(int(cid) * 3 + n * 2 + j // 4) % len(TOPICS)]
                turns.append({"speaker": spk, "dia_id": dia, "text": f"Guess what, I {topic}!"})
                d["qa"].append(
                    {"question": f"Who {topic}?", "answer": spk, "evidence": [dia], "category": 4}
                )
            else:
                turns.append({"speaker": spk, "dia_id": dia, "text": "Wow, that's great!"})
        d[f"session_{n}"] = turns
    d["session_4_date_time"] = "2:00 pm on 20 May, 2023"  # a date without turns, as in LoCoMo
    d["qa"].append(
        {
            "question": "What did nobody say?",
            "evidence": ["D1:2"],
            "category": 5,
            "adversarial_answer": "x",
        }
    )
    return d


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    data = tmp_path_factory.mktemp("locomo")
    for cid in PEOPLE:
        (data / f"{cid}.json").write_text(json.dumps(conversation(cid)))
    plot = data / "plot.png"
    cmd = [
        sys.executable,
        "-m",
        "dmem.cli",
        "bench",
        "locomo",
        "--json",
        "--encoder",
        "hash",
        "--data",
        str(data),
        "--noise",
        "0.5",
        "--plot",
        str(plot),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LoCoMo evidence recall" in proc.stderr  # the human table goes to stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), plot


def test_contract_keys_and_counts(bench: tuple[dict, Path]) -> None:
    r, plot = bench
    missing = [k for k in KEYS if k not in r]
    assert not missing, missing
    assert r["conversations"] == 2
    assert r["turns"] == 72
    assert r["questions"] == 18  # category 5 excluded
    assert r["noise_ratio"] == 0.5
    assert 0 < r["noise_turns"] < r["turns"]
    assert r["published"] == r["turns"] + r["noise_turns"]
    assert plot.is_file() and plot.stat().st_size > 1000


def test_values_sane(bench: tuple[dict, Path]) -> None:
    r, _ = bench
    for k in (
        "storage_ratio",
        "evidence_recall_at_5",
        "evidence_recall_at_10",
        "store_all_recall_at_5",
        "store_all_recall_at_10",
        "noise_storage_ratio",
    ):
        assert 0.0 <= r[k] <= 1.0, (k, r[k])
    assert r["evidence_recall_at_5"] <= r["evidence_recall_at_10"]
    assert r["store_all_recall_at_10"] > 0.5  # the questions name their turn's words
    assert r["noise_evidence_recall_at_10"] == r["evidence_recall_at_10"]
    assert 0.0 < r["storage_ratio"] < 1.0  # a reward-free stream stores something, not all
    assert sum(r["routes"].values()) == r["published"]
    assert set(r["per_category"]) == {"single-hop"}
