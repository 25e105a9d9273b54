"""A LangGraph chat agent whose long-term memory is dmem (`DmemStore`), no LLM needed.

    .venv/bin/python examples/langgraph_agent.py                       # starts its own stack
    .venv/bin/python examples/langgraph_agent.py --kafka HOST:PORT --http URL   # a `dmem up`

With auth on (the tokens you gave ``DMEM_AUTH__TOKENS``), pass ``--token`` or export
``DMEM_API_TOKEN``.

The graph has two nodes: ``remember`` writes the user's turn to the store (a turn
the user flags as important carries a strong signal), ``respond`` searches the
store and answers with a scripted chat model from langchain-core. Swap the fake
model for a real one and nothing else changes.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, TypedDict

from _stack import deployment


class State(TypedDict):
    user: str
    important: bool
    answer: str


def build(store: Any) -> Any:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langgraph.config import get_store
    from langgraph.graph import END, START, StateGraph

    ns = ("chat", "user-42")
    turns = iter(range(10_000))

    def remember(state: State) -> dict[str, Any]:
        get_store().put(
            ns,
            f"turn{next(turns)}",
            {"text": state["user"], "reward": -20.0 if state["important"] else -0.1},
        )
        return {}

    def respond(state: State) -> dict[str, Any]:
        found: list[Any] = []
        deadline = time.monotonic() + 5
        while not found and time.monotonic() < deadline:
            found = get_store().search(ns, query=state["user"], limit=3)
            if not found:
                time.sleep(0.3)
        context = "; ".join(i.value["text"] for i in found) or "nothing yet"
        model = GenericFakeChatModel(messages=iter([AIMessage(f"(I remember: {context})")]))
        return {"answer": str(model.invoke(state["user"]).content)}

    g = StateGraph(State)
    g.add_node("remember", remember)
    g.add_node("respond", respond)
    g.add_edge(START, "remember")
    g.add_edge("remember", "respond")
    g.add_edge("respond", END)
    return g.compile(store=store)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kafka")
    ap.add_argument("--http")
    ap.add_argument("--tenant", default="langgraph-example")
    ap.add_argument("--token", help="the tenant's API token [env DMEM_API_TOKEN]")
    ap.add_argument("--encoder", default="hash", choices=["hash", "minilm"])
    a = ap.parse_args()
    from dmem import SyncClient
    from dmem.integrations.langgraph import DmemStore
    from dmem.wait import wait_settled

    with deployment(a.kafka, a.http, a.encoder) as (kafka, http):
        client = SyncClient(kafka, a.tenant, http_url=http, timeout_s=10, token=a.token)
        try:
            graph = build(DmemStore(client))
            chat = [(f"just chatting about the weather, day {i}", False) for i in range(12)]
            chat.insert(6, ("please remember: I am allergic to nuts", True))
            chat.append(("can you suggest a snack, given what I am allergic to?", False))
            for n, (text, important) in enumerate(chat):
                if n == len(chat) - 1:
                    # storing is asynchronous: let the write path store the chat, then
                    # let the store's bounded-staleness reads catch up (one time tick,
                    # 0.2 s, on a Milvus server; longer under load: docs/concepts/retrieval.md)
                    wait_settled([http], components=["write"], quiet_s=0.5)
                    time.sleep(1.0)
                out = graph.invoke({"user": text, "important": important, "answer": ""})
                print(f"user: {text}\n  bot: {out['answer']}")
        finally:
            client.close()


if __name__ == "__main__":
    main()
