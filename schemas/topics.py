"""Topic registry: logical name -> (default topic, key field, payload model).

Names are configurable with a prefix (`DMEM_KAFKA__TOPIC_PREFIX`, default ``dmem.``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from schemas.models import (
    DeadLetter,
    EpisodeOutcome,
    MemoryEvent,
    MemoryUsage,
    RetrievalRequest,
    RetrievalResponse,
    Transition,
    UtilityUpdate,
)


@dataclass(frozen=True)
class TopicSpec:
    suffix: str
    key: str
    payload: type[BaseModel] | None
    compacted: bool = False


TOPICS: dict[str, TopicSpec] = {
    "transitions": TopicSpec("transitions", "agent_id", Transition),
    "feedback": TopicSpec("feedback", "episode_id", EpisodeOutcome),
    "requests": TopicSpec("retrieval.requests", "agent_id", RetrievalRequest),
    "responses": TopicSpec("retrieval.responses", "request_id", RetrievalResponse),
    "usage": TopicSpec("usage", "episode_id", MemoryUsage),
    "memories": TopicSpec("memories", "memory_id", MemoryEvent),
    "credit": TopicSpec("credit", "memory_id", UtilityUpdate),
    # value-model checkpoints and operator state, keyed by ``tenant|partition``; compacted
    "models": TopicSpec("models", "tenant|partition", None, compacted=True),
    "deadletter": TopicSpec("deadletter", "original key", DeadLetter),
    # `forgotten` MemoryEvents again (the audit copy stays on ``memories``), keyed
    # by tenant: every write worker reads this small topic whole instead of the
    # busy ``memories`` topic to clear its operator state
    "control": TopicSpec("control", "tenant", MemoryEvent),
}


def topic_name(logical: str, prefix: str = "dmem.") -> str:
    return prefix + TOPICS[logical].suffix
