"""Pure stream operators for dmem: no Kafka, no Milvus, no faust.

Everything here is deterministic given its inputs: time is injected (``now_ms``)
and randomness is seeded, so the faust agents in ``streams/`` stay thin and the
logic is unit-testable. Names are resolved lazily (PEP 562) so that e.g.
``import operators.encoders`` does not pay for importing torch;
sentence-transformers loads on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from operators.eligibility import EligibilityEntry, EligibilityWindow
    from operators.encoders import (
        CachedEncoder,
        Encoder,
        HashingEncoder,
        MiniLMEncoder,
        PassthroughEncoder,
        build_encoder,
    )
    from operators.gate import Gate, GateDecision, GateState, Reason
    from operators.rpe import (
        AgentSmoother,
        OutcomeBaseline,
        OutcomeHistory,
        RewardSurprise,
        RpeNormalizer,
        extrinsic_score,
        valence,
    )
    from operators.sketch import DecayedQuantileSketch
    from operators.value import RunningStd, TDValueLearner

__all__ = [
    "AgentSmoother",
    "CachedEncoder",
    "DecayedQuantileSketch",
    "EligibilityEntry",
    "EligibilityWindow",
    "Encoder",
    "Gate",
    "GateDecision",
    "GateState",
    "HashingEncoder",
    "MiniLMEncoder",
    "OutcomeBaseline",
    "OutcomeHistory",
    "PassthroughEncoder",
    "Reason",
    "RewardSurprise",
    "RpeNormalizer",
    "RunningStd",
    "TDValueLearner",
    "build_encoder",
    "extrinsic_score",
    "valence",
]

_MODULE_OF = {
    "EligibilityEntry": "eligibility",
    "EligibilityWindow": "eligibility",
    "CachedEncoder": "encoders",
    "Encoder": "encoders",
    "HashingEncoder": "encoders",
    "MiniLMEncoder": "encoders",
    "PassthroughEncoder": "encoders",
    "build_encoder": "encoders",
    "Gate": "gate",
    "GateDecision": "gate",
    "GateState": "gate",
    "Reason": "gate",
    "AgentSmoother": "rpe",
    "OutcomeBaseline": "rpe",
    "OutcomeHistory": "rpe",
    "RewardSurprise": "rpe",
    "RpeNormalizer": "rpe",
    "extrinsic_score": "rpe",
    "valence": "rpe",
    "DecayedQuantileSketch": "sketch",
    "RunningStd": "value",
    "TDValueLearner": "value",
}


def __getattr__(name: str) -> Any:
    mod = _MODULE_OF.get(name)
    if mod is None:
        raise AttributeError(f"module 'operators' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"operators.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
