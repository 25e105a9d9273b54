"""The SDK takes a Kafka search answer only when it is for its own tenant.

Without a token every tenant's answers come on the shared responses topic, keyed by
request_id alone. Two tenants' clients searching under the same request_id (ids such as
``<episode>-<step>`` for credit) each took whichever answer came first: on a local
stack tenant A's client was served tenant B's memories.
"""

from __future__ import annotations

import asyncio
from typing import Any

from dmem.client import Client
from schemas import RetrievalResponse, encode


class Msg:
    def __init__(self, key: str, value: bytes) -> None:
        self.key, self.value = key.encode(), value


class FakeConsumer:
    def __init__(self, batches: list[list[Msg]]) -> None:
        self.batches = batches

    async def getmany(self, timeout_ms: int = 0) -> dict[Any, list[Msg]]:
        if self.batches:
            return {"tp": self.batches.pop(0)}
        await asyncio.sleep(timeout_ms / 1000)
        return {}


def test_an_answer_for_another_tenant_under_the_same_request_id_is_ignored() -> None:
    def answer(tenant: str) -> Msg:
        return Msg("ep1-0", encode(RetrievalResponse(request_id="ep1-0", tenant=tenant,
                                                     error=f"from {tenant}")))  # fmt: skip

    async def go() -> RetrievalResponse:
        client = Client("127.0.0.1:9092", "acme")
        client._consumer = FakeConsumer([[answer("other")], [answer("acme")]])  # type: ignore[assignment]
        fut = asyncio.get_running_loop().create_future()
        client._waiting["ep1-0"] = fut  # noqa: SLF001
        reader = asyncio.create_task(client._read())  # noqa: SLF001
        try:
            return await asyncio.wait_for(fut, 5)
        finally:
            reader.cancel()

    got = asyncio.run(go())
    assert got.tenant == "acme" and got.error == "from acme"
