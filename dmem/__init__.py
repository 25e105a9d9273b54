"""dmem: dopamine-gated, outcome-credited memory for agents. The one public import.

What users touch lives in this package and sits on top of the stream processor
(`streams/`), which never imports it::

    import dmem

    async with dmem.Client("127.0.0.1:9092", tenant="t") as client:
        await client.publish(dmem.Transition(tenant="t", agent_id="a", episode_id="e",
                                             step=0, observation="...", action="go"))
        hits = await client.search("...", k=5)

`Client` is the asyncio SDK (Kafka for writes and request/reply search, or HTTP),
`SyncClient` the same from synchronous code, `Memory` the framework-neutral
agent-memory adapter. Payloads (`Transition`, `EpisodeOutcome`, `Feedback`, `Hit`,
...) are the pydantic models of `schemas/`, the single source of truth; every error
is a `DmemError` with a ``retriable`` flag.
"""

from dmem._version import __version__
from dmem.adapter import Memory, MemoryClient
from dmem.client import (
    ChatTurn,
    Client,
    NotFound,
    SearchError,
    SyncClient,
    Unauthorized,
    chat_transitions,
)
from schemas import (
    BrokerUnavailable,
    ConfigError,
    DmemError,
    EpisodeOutcome,
    Feedback,
    Hit,
    InvalidRecord,
    RetrievalRequest,
    RetrievalResponse,
    ScoreBreakdown,
    SearchFilters,
    ServiceUnavailable,
    StoreError,
    StoreUnavailable,
    Transition,
)

__all__ = [
    "BrokerUnavailable",
    "ChatTurn",
    "Client",
    "ConfigError",
    "DmemError",
    "EpisodeOutcome",
    "Feedback",
    "Hit",
    "InvalidRecord",
    "Memory",
    "MemoryClient",
    "NotFound",
    "RetrievalRequest",
    "RetrievalResponse",
    "ScoreBreakdown",
    "SearchError",
    "SearchFilters",
    "ServiceUnavailable",
    "StoreError",
    "StoreUnavailable",
    "Unauthorized",
    "SyncClient",
    "Transition",
    "__version__",
    "chat_transitions",
]
