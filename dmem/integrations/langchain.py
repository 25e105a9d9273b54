"""LangChain retrieval on dmem: `DmemRetriever`, a ``langchain_core`` `BaseRetriever`.

``DmemRetriever(client=SyncClient(...), k=5)`` (or an async `Client` for ``ainvoke``
only) answers ``invoke(query)`` with dmem's value-aware search. Each `Document`'s
``page_content`` is the memory's text; its metadata carries the memory id, action,
reward, RPE, valence, utility, partition, episode/step, the transition's own
metadata and the score breakdown (``semantic``, ``salience``, ``recency``,
``lambda``, ``score``), so a chain can show why a memory was chosen. ``agent_id``
scopes the search to one agent; ``filters`` are dmem's structured `SearchFilters`
(never a raw expression; any other key is a validation error when the retriever is
built); ``lambda_`` overrides the ranking mix.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, field_validator

from dmem.client import Client, SyncClient
from schemas import Hit, SearchFilters


def to_document(h: Hit) -> Document:
    return Document(
        page_content=h.text,
        id=h.memory_id,
        metadata={
            "memory_id": h.memory_id,
            "action": h.action,
            "reward": h.reward,
            "rpe": h.rpe,
            "valence": h.valence,
            "utility": h.utility,
            "partition": h.partition,
            "episode_id": h.episode_id,
            "agent_id": h.agent_id,
            "step": h.step,
            "created_ts": h.created_ts,
            "score": h.score,
            "breakdown": h.breakdown.model_dump(by_alias=True),
            "metadata": dict(h.metadata),
        },
    )


class DmemRetriever(BaseRetriever):
    """Documents from dmem's search (see the module doc)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: SyncClient | Client
    k: int = 5
    agent_id: str | None = None
    lambda_: float | None = None
    filters: dict[str, Any] = Field(default_factory=dict)

    @field_validator("filters")
    @classmethod
    def _structured(cls, v: dict[str, Any]) -> dict[str, Any]:
        """Only `SearchFilters` fields: any other key would reach `Client.search` as an
        argument of its own (``k`` a TypeError at every call, ``request_id`` one id for
        every search)."""
        f = SearchFilters.model_validate(v)
        out: dict[str, Any] = f.model_dump(exclude={"schema_version"}, exclude_none=True)
        return out

    def _search_kw(self) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "lambda_": self.lambda_, **self.filters}

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        if not isinstance(self.client, SyncClient):
            raise TypeError("invoke() needs a SyncClient; use ainvoke() with an async Client")
        return [to_document(h) for h in self.client.search(query, self.k, **self._search_kw())]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        if isinstance(self.client, SyncClient):
            fut = self.client.submit(self.client.client.search(query, self.k, **self._search_kw()))
            hits = await asyncio.wrap_future(fut)
        else:
            hits = await self.client.search(query, self.k, **self._search_kw())
        return [to_document(h) for h in hits]


__all__ = ["DmemRetriever", "to_document"]
