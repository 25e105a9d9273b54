"""Single source of truth for every payload dmem moves.

Topic payloads (pydantic v2 models), the Milvus row layout (`MemoryRecord`,
from which `milvus/` derives its collection schema), the topic registry and
the JSON Schema export all live here. Nothing here imports faust, Kafka or
Milvus, so agents can validate payloads with only pydantic installed.
"""

from schemas.codec import decode, dumps, encode, loads
from schemas.errors import (
    BrokerUnavailable,
    ConfigError,
    DmemError,
    InvalidRecord,
    ServiceUnavailable,
    StoreError,
    StoreUnavailable,
)
from schemas.export import export_json_schemas, json_schemas
from schemas.limits import LIMITS, Limits
from schemas.models import (
    DECISION_KINDS,
    MACHINE_SPEAKERS,
    SCHEMA_VERSION,
    BatchGetRequest,
    DeadLetter,
    EpisodeOutcome,
    ErrorBody,
    Feedback,
    ForgetRequest,
    Hit,
    IngestAccepted,
    MemoryEvent,
    MemoryListQuery,
    MemoryRecord,
    MemoryUsage,
    Partition,
    RetrievalRequest,
    RetrievalResponse,
    Route,
    ScoreBreakdown,
    SearchFilters,
    Transition,
    UtilityUpdate,
    stable_transition_id,
    storage_key,
)
from schemas.topics import TOPICS, TopicSpec, topic_name

__all__ = [
    "DECISION_KINDS",
    "MACHINE_SPEAKERS",
    "BrokerUnavailable",
    "ConfigError",
    "DmemError",
    "InvalidRecord",
    "ServiceUnavailable",
    "StoreError",
    "StoreUnavailable",
    "LIMITS",
    "Limits",
    "SCHEMA_VERSION",
    "BatchGetRequest",
    "DeadLetter",
    "EpisodeOutcome",
    "ErrorBody",
    "Feedback",
    "ForgetRequest",
    "Hit",
    "IngestAccepted",
    "MemoryEvent",
    "MemoryListQuery",
    "MemoryRecord",
    "MemoryUsage",
    "Partition",
    "RetrievalRequest",
    "RetrievalResponse",
    "Route",
    "ScoreBreakdown",
    "SearchFilters",
    "TOPICS",
    "TopicSpec",
    "Transition",
    "UtilityUpdate",
    "decode",
    "dumps",
    "encode",
    "export_json_schemas",
    "json_schemas",
    "loads",
    "stable_transition_id",
    "storage_key",
    "topic_name",
]
