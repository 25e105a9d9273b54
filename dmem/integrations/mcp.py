"""An MCP server for dmem: ``dmem mcp [--transport stdio|http]``.

Built on the official MCP Python SDK (``mcp``, 2.x: `MCPServer`). It is a client
of a running deployment, with the same connection options as ``dmem search``:
writes (``remember``, ``report_outcome``, ``feedback``) go to Kafka (``DMEM_KAFKA__*``),
``recall`` goes over Kafka request/reply or, with ``--http URL``, over the HTTP
API, and ``forget`` and the stats resource need the HTTP API (``--http``), where
the respond role holds the store.

Tools (their input schemas are built from the `schemas` types, so the limits an
MCP client sees are the ones the stream enforces; ``remember``'s action is the
stream's `Action`: free text such as "use key on door", not an identifier):

- ``remember(observation, action, reward=0, next_observation?, done?, episode_id?,
  step?, metadata?)``: one `Transition` for this server's tenant and agent. Without
  an ``episode_id`` the server's session episode is used; without a ``step`` the
  next step of that episode (counted by this server, from 0; a call that fails, refused
  or not published, takes no step), and a memory id of this
  server's own (a restarted server, or a second one, counting the same episode from 0
  again adds memories instead of replacing the earlier ones; with a ``step`` the id is
  the stable one of (tenant, agent, episode, step)). Whether it is *stored* is
  the gate's decision, made asynchronously by the write role: ``remember`` answers
  once the broker has the transition, not once it is searchable.
- ``recall(query, k=5, filters?, lambda_?, as_of?)``: hits with their score breakdown,
  RPE, valence and utility.
- ``report_outcome(episode_id, reward)``: the late reward of an episode (credit).
- ``feedback(memory_id, thumbs)``: thumbs up / down on one memory.
- ``forget(memory_id? | agent_id?)``: delete one memory or an agent's memories.
- ``list_memories(limit=20, cursor?, agent_id?, filters?)``: a page of the tenant's
  memories, newest first, and the next page's cursor (HTTP API).
- ``memory_history(memory_id, limit=200)``: what happened to one memory (HTTP API).
- resource ``dmem://stats``: the tenant's row counts by partition.

Bad input is a tool error carrying pydantic's reasons (``is_error`` result), never a
crash of the server. Over HTTP (streamable HTTP, path ``/mcp``) every request must
carry ``Authorization: Bearer <token>`` (``--auth-token`` / ``DMEM_MCP_TOKEN``):
a missing or wrong token is 401. Without a token the HTTP transport refuses to
start (fail closed, like the HTTP API's default; ``--no-auth`` for loopback-only
experiments). stdio needs no token: the client owns the process.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

from pydantic import ValidationError

from dmem.client import Client
from schemas import SearchFilters, Transition
from schemas.errors import DmemError

# the stream's bounds (`RetrievalRequest`, `MemoryListQuery`, the history route's
# limit), so that a tool's input schema shows them
from schemas.models import (
    Action,
    Cursor,
    EventMs,
    HistoryLimit,
    Ident,
    K,
    Lambda,
    MetaValue,
    PageLimit,
    Reward,
    Step,
    Text,
)

INSTRUCTIONS = (
    "dmem is this agent's long-term memory. Call `remember` after each step with what "
    "you observed, what you did and the reward (0 when there is none); surprising steps "
    "are kept, expected ones are dropped. Call `recall` with the current situation "
    "before deciding. Report how an episode ended with `report_outcome`; rate a "
    "memory with `feedback`."
)


def _reasons(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(x) for x in e.get('loc', ())) or 'input'}: {e.get('msg')}"
        for e in exc.errors()
    )


class _Session:
    """Per-server state: the lazily started client, the default episode, step counters."""

    def __init__(self, make_client: Callable[[], Client], agent_id: str) -> None:
        self.make_client = make_client
        self.agent_id = agent_id
        self.episode_id = f"mcp-{uuid.uuid4().hex[:12]}"
        #: per episode, the step the next counted `remember` gets
        self.steps: dict[str, int] = {}
        #: (episode, step) -> publishes of it that failed: one may still have reached the
        #: broker, so the step's next memory id differs from theirs (`step_id`)
        self.failed: dict[tuple[str, int], int] = {}
        self.client: Client | None = None
        #: concurrent first calls start one client (each would start its own, and only the
        #: last would be stopped: the others' Kafka connections and reader would stay open)
        self.starting = asyncio.Lock()

    async def get(self) -> Client:
        async with self.starting:
            if self.client is None:
                client = self.make_client()
                await client.start()
                self.client = client
            return self.client

    async def close(self) -> None:
        if self.client is not None:
            await self.client.stop()
            self.client = None

    def take_step(self, episode_id: str) -> int:
        """The episode's next step, counted as taken (`give_back` if its call fails)."""
        n = self.steps.get(episode_id, 0)
        self.steps[episode_id] = n + 1
        return n

    def give_back(self, episode_id: str, step: int) -> None:
        """Uncount ``step`` after its publish failed, unless a later step was taken since
        (a concurrent call): then it stays a gap, as two calls must not share a step."""
        key = (episode_id, step)
        self.failed[key] = self.failed.get(key, 0) + 1
        if self.steps.get(episode_id) == step + 1:
            self.steps[episode_id] = step

    def step_id(self, tenant: str, episode_id: str, step: int) -> str:
        """The memory id of a step this server counted: of this server session too, and
        of the step's failed publishes before it (a failed one the broker got anyway
        keeps its memory instead of taking this one's id)."""
        raw = f"{self.episode_id}\x1f{tenant}\x1f{self.agent_id}\x1f{episode_id}\x1f{step}"
        if tries := self.failed.get((episode_id, step)):
            raw += f"\x1f{tries}"
        return hashlib.blake2b(raw.encode(), digest_size=16).hexdigest()


def build_server(make_client: Callable[[], Client], *, agent_id: str = "mcp") -> Any:
    """The MCP server; ``make_client`` builds the (unstarted) SDK client it talks through."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    session = _Session(make_client, agent_id)

    @asynccontextmanager
    async def lifespan(_server: Any) -> AsyncIterator[None]:
        try:
            yield None
        finally:
            await session.close()

    server = MCPServer(name="dmem", instructions=INSTRUCTIONS, lifespan=lifespan)

    async def call(what: str, fn: Callable[[Client], Any]) -> Any:
        """Run one SDK call; dmem's errors become tool errors with their message."""
        try:
            return await fn(await session.get())
        except ValidationError as exc:
            raise ToolError(f"invalid {what}: {_reasons(exc)}") from None
        except (DmemError, ValueError) as exc:
            raise ToolError(f"{what} failed: {exc}") from None

    @server.tool(description="Publish one step (observation, action, reward) to memory.")
    async def remember(
        observation: Text,
        action: Action,
        reward: Reward = 0.0,
        next_observation: Text | None = None,
        done: bool = False,
        episode_id: Ident | None = None,
        step: Step | None = None,
        metadata: dict[str, MetaValue] | None = None,
    ) -> dict[str, Any]:
        ep = episode_id or session.episode_id

        async def go(c: Client) -> dict[str, Any]:
            # validated before a step is counted, so that a refused call takes none
            t = Transition.model_validate(
                {
                    "tenant": c.tenant,
                    "agent_id": session.agent_id,
                    "episode_id": ep,
                    "step": 0 if step is None else step,
                    "observation": observation,
                    "action": action,
                    "reward": reward,
                    "next_observation": next_observation,
                    "done": done,
                    "metadata": metadata or {},
                }
            )
            if step is not None:
                await c.publish(t)
            else:
                n = session.take_step(ep)
                # a counted step restarts at 0 with the server: the stable id of
                # (tenant, agent, episode, step) would replace what an earlier
                # server stored at that step of the same episode
                tid = session.step_id(c.tenant, ep, n)
                t = t.model_copy(update={"step": n, "transition_id": tid})
                try:
                    await c.publish(t)
                except BaseException:
                    session.give_back(ep, n)
                    raise
            return {
                "memory_id": t.memory_id,
                "episode_id": t.episode_id,
                "step": t.step,
                "accepted": True,
            }

        result: dict[str, Any] = await call("transition", go)
        return result

    @server.tool(
        description="Search memory: hits ranked by meaning, surprise and outcome, "
        "each with its score breakdown, RPE, valence and utility. as_of (optional): "
        "when the question is asked, event time in ms; later memories are left out. "
        "episode_id (optional, with step): the episode this search serves; the hits "
        "are recorded as used in it, and report_outcome for that episode credits them."
    )
    async def recall(
        query: Text,
        k: K = 5,
        filters: SearchFilters | None = None,
        lambda_: Lambda | None = None,
        as_of: EventMs | None = None,
        episode_id: Ident | None = None,
        step: Step | None = None,
    ) -> list[dict[str, Any]]:
        f = (filters or SearchFilters()).model_dump(exclude={"schema_version"}, exclude_none=True)

        async def go(c: Client) -> list[dict[str, Any]]:
            hits = await c.search(
                query, k, lambda_=lambda_, as_of=as_of, episode_id=episode_id, step=step, **f
            )
            return [h.model_dump(mode="json", by_alias=True) for h in hits]

        result: list[dict[str, Any]] = await call("search", go)
        return result

    @server.tool(
        description="Report how an episode ended (its return): credit flows back "
        "to the memories recall served in it (recall with this episode_id)."
    )
    async def report_outcome(episode_id: Ident, reward: Reward) -> dict[str, Any]:
        async def go(c: Client) -> dict[str, Any]:
            await c.report_outcome(episode_id, reward, agent_id=session.agent_id)
            return {"episode_id": episode_id, "reward": reward, "accepted": True}

        result: dict[str, Any] = await call("outcome", go)
        return result

    @server.tool(description="Thumbs up or down on one memory (from a user or a critic).")
    async def feedback(memory_id: Ident, thumbs: Literal["up", "down"]) -> dict[str, Any]:
        async def go(c: Client) -> dict[str, Any]:
            fb = await c.feedback(
                memory_id=memory_id,
                kind=f"thumbs_{thumbs}",
                value=1.0 if thumbs == "up" else -1.0,
                agent_id=session.agent_id,
            )
            return {"memory_id": memory_id, "kind": fb.kind, "accepted": True}

        result: dict[str, Any] = await call("feedback", go)
        return result

    @server.tool(
        description="Delete one memory (memory_id) or every memory of an agent "
        "(agent_id) of this tenant."
    )
    async def forget(
        memory_id: Ident | None = None, agent_id: Ident | None = None
    ) -> dict[str, Any]:
        async def go(c: Client) -> dict[str, Any]:
            n = await c.forget(memory_id=memory_id, agent_id=agent_id)
            return {"forgotten": n}

        result: dict[str, Any] = await call("forget", go)
        return result

    @server.tool(
        description="List this tenant's memories, newest first, one page at a time "
        "(limit <= 500; pass the answer's next_cursor to get the next page). filters "
        "as for recall."
    )
    async def list_memories(
        limit: PageLimit = 20,
        cursor: Cursor | None = None,
        agent_id: Ident | None = None,
        filters: SearchFilters | None = None,
    ) -> dict[str, Any]:
        async def go(c: Client) -> dict[str, Any]:
            page, nxt = await c.list_page(limit=limit, cursor=cursor, agent_id=agent_id,
                                          filters=filters)  # fmt: skip
            return {"memories": page, "next_cursor": nxt}

        result: dict[str, Any] = await call("list", go)
        return result

    @server.tool(
        description="What happened to one memory, oldest first: written (route, reason, "
        "gate score, thresholds), merged, moved, credited, fed back, forgotten."
    )
    async def memory_history(memory_id: Ident, limit: HistoryLimit = 200) -> dict[str, Any]:
        async def go(c: Client) -> dict[str, Any]:
            return {"memory_id": memory_id, "events": await c.history(memory_id, limit)}

        result: dict[str, Any] = await call("history", go)
        return result

    @server.resource(
        "dmem://stats",
        name="stats",
        mime_type="application/json",
        description="The tenant's memory: row counts by partition.",
    )
    async def stats() -> dict[str, Any]:
        result: dict[str, Any] = await call("stats", lambda c: c.stats())
        return result

    _ = (remember, recall, report_outcome, feedback, forget, list_memories, memory_history, stats)
    return server


class BearerAuth:
    """ASGI middleware: every request needs ``Authorization: Bearer <token>`` (else 401)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            scheme, _, got = headers.get(b"authorization", b"").partition(b" ")
            # the scheme is case-insensitive (RFC 7235), as the HTTP API reads it
            ok = scheme.lower() == b"bearer" and hmac.compare_digest(got.strip(), self.token)
            if not ok:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer"),
                        ],
                    }
                )
                await send(
                    {
                        "type": "http.response.body",
                        "body": b'{"error":"missing or unknown bearer token"}',
                    }
                )
                return
        await self.app(scope, receive, send)


def run_http(server: Any, host: str, port: int, token: str | None) -> None:
    """Serve streamable HTTP at ``http://host:port/mcp``, behind `BearerAuth` when a token
    is given (the CLI refuses to start without one unless told ``--no-auth``)."""
    import uvicorn

    app: Any = server.streamable_http_app(host=host)
    if token:
        app = BearerAuth(app, token)
    uvicorn.run(app, host=host, port=port, log_level="warning")


__all__ = ["BearerAuth", "build_server", "run_http"]
