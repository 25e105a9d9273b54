"""The `Hit` an in-memory fake client answers for a transition it was sent."""

from __future__ import annotations

from typing import Any

from schemas import Hit, ScoreBreakdown, Transition


def hit_for(t: Transition, **fields: Any) -> Hit:
    """``t`` as a search hit (score 0.9); ``fields`` override the hit's fields."""
    neg = t.reward < 0
    return Hit(
        **{
            "memory_id": t.memory_id,
            "text": t.text(),
            "action": t.action,
            "reward": t.reward,
            "rpe": -2.0,
            "valence": -1 if neg else 1,
            "utility": 0.0,
            "partition": "core",
            "episode_id": t.episode_id,
            "agent_id": t.agent_id,
            "step": t.step,
            "created_ts": t.ts or 0,
            "score": 0.9,
            "breakdown": ScoreBreakdown.model_validate(
                {"semantic": 1.0, "salience": 0.5, "recency": 1.0, "lambda": 0.8, "score": 0.9}
            ),
            **fields,
        }
    )
