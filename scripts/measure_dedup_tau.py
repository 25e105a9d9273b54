"""False merges of a dedup tau on real text (BENCHMARKS.md "Dedup tau").

Encodes every distinct dialogue turn of LoCoMo (the folder of its ``*.json`` files)
with each encoder and reports, per tau, how many distinct texts have another
distinct text at cosine >= tau: each such text would be folded into a memory that
says something else. Usage: ``.venv/bin/python scripts/measure_dedup_tau.py DIR``
(prints one JSON object; MiniLM on CPU takes minutes).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from operators import build_encoder

TAUS = (0.90, 0.95, 0.97, 0.98, 0.99)


def turns(data: Path) -> list[str]:
    out = []
    for f in sorted(data.glob("*.json")):
        conv = json.loads(f.read_text())
        for key, value in conv.items():
            if key.startswith("session_") and isinstance(value, list):
                out += [str(t["text"]) for t in value if t.get("text")]
    return out


def main(data: Path) -> dict[str, object]:
    texts = sorted(set(turns(data)))
    result: dict[str, object] = {"texts": len(texts)}
    for name in ("minilm", "minilm-static", "hash"):
        vecs = build_encoder(name, dim=256, cache_size=0).encode(texts)
        sims = vecs @ vecs.T
        np.fill_diagonal(sims, -1.0)
        nearest = sims.max(axis=1)
        result[name] = {str(t): {"texts_with_a_false_merge": int((nearest >= t - 1e-6).sum()),
                                 "rate": round(float((nearest >= t - 1e-6).mean()), 5)}
                        for t in TAUS}  # fmt: skip
    return result


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/measure_dedup_tau.py LOCOMO_DIR (the folder of its *.json)")
    print(json.dumps(main(Path(sys.argv[1]))))
