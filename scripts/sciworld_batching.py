"""How the gate's verdicts depend on micro-batching: the ScienceWorld play cache of
`dmem bench sciworld` replayed through the real `WritePipeline`, in process (no
broker, no Milvus, no maintenance), cut into micro-batches of a given size, with a
given value-model update cadence (`DMEM_VALUE__UPDATE_EVERY`).

    .venv/bin/python scripts/sciworld_batching.py [--cache .dmem-bench/play-default.json]
        [--encoder minilm] BATCH:EVERY [BATCH:EVERY ...]

Before the fixed cadence the model took one TD step per micro-batch, which is
``EVERY = BATCH`` here (512:512 = how every benchmark published, 1:1 = a live agent
sending one step at a time). Prints one line per configuration: storage ratio at
the gate, core and buffer rows, distinct critical events covered, positive-reward
events covered and core precision (the bench's own definitions, by event).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dmem.bench.sciworld import Step, event_key, step_id, to_transition
from operators.encoders import build_encoder
from schemas import encode
from streams.settings import Settings, ValueSettings
from streams.write.pipeline import RawRecord, WritePipeline


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path(".dmem-bench/play-default.json"))
    ap.add_argument("--encoder", default="minilm")
    ap.add_argument("configs", nargs="+", help="BATCH:EVERY, e.g. 512:512 1:1 1:256")
    args = ap.parse_args()
    played = json.loads(args.cache.read_text())
    steps = [Step(**st) for ep in played["train"] for st in ep["steps"]]
    t0 = 1_700_000_000_000
    trs = [to_transition(st, i, t0) for i, st in enumerate(steps)]
    crit: dict[tuple[str, int, str, str], set[str]] = {}
    up: set[tuple[str, int, str, str]] = set()
    for st in steps:
        if st.reward != 0 or st.failed:
            crit.setdefault(event_key(st), set()).add(step_id(st))
        if st.reward > 0:
            up.add(event_key(st))
    crit_ids = set().union(*crit.values())
    enc = build_encoder(args.encoder, 256)
    for spec in args.configs:
        batch, every = (int(x) for x in spec.split(":"))
        p = WritePipeline(Settings(value=ValueSettings(update_every=every)), enc)
        routes: dict[str, str] = {}
        for i in range(0, len(trs), batch):
            chunk = trs[i : i + batch]
            raws = [RawRecord(encode(t), t.agent_id.encode(), "dmem.transitions", 0, i + j)
                    for j, t in enumerate(chunk)]
            for ev in p.process(raws, t0 + i * 10 + 5).events:
                routes[ev.memory_id] = ev.route
        stored = {k for k, r in routes.items() if r != "drop"}
        core = {k for k, r in routes.items() if r == "core"}
        print(json.dumps({
            "batch": batch, "update_every": every,
            "storage_ratio_gate": round(len(stored) / len(trs), 4),
            "core": len(core), "buffer": len(stored) - len(core),
            "critical_coverage_gate": round(sum(bool(ids & stored) for ids in crit.values())
                                            / max(len(crit), 1), 4),
            "reward_up_coverage_gate": round(sum(bool(crit[k] & stored) for k in up)
                                             / max(len(up), 1), 4),
            "precision_core_gate": round(len(core & crit_ids) / max(len(core), 1), 4),
        }), flush=True)


if __name__ == "__main__":
    main()
