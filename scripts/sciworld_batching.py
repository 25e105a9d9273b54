"""How the gate's verdicts depend on micro-batching: the ScienceWorld play cache of
`dmem bench sciworld` replayed through the real `WritePipeline`, in process (no
broker, no Milvus, no maintenance), cut into micro-batches of a given size, with a
given value-model update cadence (what `DMEM_VALUE__UPDATE_EVERY` sets, here set on the
learner directly so that cadences above the settings' cap of 256 can be replayed).

    .venv/bin/python scripts/sciworld_batching.py [--cache .dmem-bench/play-default.json]
        [--encoder minilm] BATCH:EVERY [BATCH:EVERY ...]

``EVERY = BATCH`` is a model that takes one TD step per micro-batch (512:512 = bulk
publishing, 1:1 = a live agent sending one step at a time): the comparison behind
docs/design/2026-12-02-value-model-cadence.md. Prints one line per configuration: storage ratio at
the gate, core and buffer rows, distinct critical events covered, positive-reward
events covered and core precision (the bench's own definitions, by event).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dmem_bench.sciworld import TENANT, Step, step_id, store_stats, to_transition
from operators.encoders import build_encoder
from schemas import encode
from streams.settings import Settings
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
    by_id = {step_id(st): st for st in steps}
    enc = build_encoder(args.encoder, 256)
    for spec in args.configs:
        batch, every = (int(x) for x in spec.split(":"))
        p = WritePipeline(Settings(), enc)
        # on the learner, not the settings: the settings cap the cadence at 256 (the
        # checkpoint's row budget), and 512:512 replays bulk publishing
        p.state(TENANT).learner.update_every = every
        routes: dict[str, str] = {}
        for i in range(0, len(trs), batch):
            chunk = trs[i : i + batch]
            raws = [
                RawRecord(encode(t), t.agent_id.encode(), "dmem.transitions", 0, i + j)
                for j, t in enumerate(chunk)
            ]
            for ev in p.process(raws, t0 + i * 10 + 5).events:
                routes[ev.memory_id] = str(ev.route)
        # the bench's own metrics, on the rows the gate stored (no dedup merges here)
        stats = store_stats({k: (r, ()) for k, r in routes.items() if r != "drop"}, by_id)
        print(
            json.dumps(
                {
                    "batch": batch,
                    "update_every": every,
                    "storage_ratio_gate": round(stats["stored"] / len(trs), 4),
                    "core": stats["core"],
                    "buffer": stats["buffer"],
                    "critical_coverage_gate": round(stats["critical_coverage"], 4),
                    "reward_up_coverage_gate": round(stats["reward_up_coverage"], 4),
                    "precision_core_gate": round(stats["precision_core"], 4),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
