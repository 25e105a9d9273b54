"""Topic registry: logical name -> (default topic, key field, payload model).

Names are configurable with a prefix (`DMEM_KAFKA__TOPIC_PREFIX`, default ``dmem.``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from schemas.models import (
    AccessCount,
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
    #: the topic's ``max.message.bytes`` where the broker's default (1 MB on Apache
    #: Kafka) is too small for its records
    max_message_bytes: int | None = None
    #: a topic whose partitions this one matches (same count, same keys): one consumer
    #: group member then reads a key's records of both (created with its count)
    partitions_of: str | None = None


TOPICS: dict[str, TopicSpec] = {
    "transitions": TopicSpec("transitions", "agent_id", Transition),
    "feedback": TopicSpec("feedback", "episode_id", EpisodeOutcome),
    "requests": TopicSpec("retrieval.requests", "agent_id", RetrievalRequest),
    "responses": TopicSpec("retrieval.responses", "request_id", RetrievalResponse),
    "usage": TopicSpec("usage", "episode_id", MemoryUsage),
    "memories": TopicSpec("memories", "memory_id", MemoryEvent),
    "credit": TopicSpec("credit", "memory_id", UtilityUpdate),
    # retrievals the respond role served, folded into rows by the jobs role
    "access": TopicSpec("access", "memory_id", AccessCount, partitions_of="credit"),
    # value-model checkpoints and operator state, keyed by ``tenant|partition``; compacted
    # and up to the write producer's 8 MiB request each: a chat tenant of 500 turns
    # checkpoints ~2 MB, over Apache Kafka's default 1 MB
    "models": TopicSpec(
        "models", "tenant|partition", None, compacted=True, max_message_bytes=10 * 1024 * 1024
    ),
    "deadletter": TopicSpec("deadletter", "original key", DeadLetter),
    # `forgotten` MemoryEvents again (the audit copy stays on ``memories``), keyed
    # by tenant: every write worker reads this small topic whole instead of the
    # busy ``memories`` topic to clear its operator state
    "control": TopicSpec("control", "tenant", MemoryEvent),
}


def topic_name(logical: str, prefix: str = "dmem.") -> str:
    return prefix + TOPICS[logical].suffix
