"""A later statement of the same thing, written by the real write path into a real
Milvus (Lite and server), is served above the older memory it updates."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dmem.client import ChatTurn, chat_transitions
from milvus import MemoryStore
from operators import HashingEncoder
from schemas import RetrievalRequest, encode
from streams.respond.responder import Responder
from streams.settings import Settings
from streams.write.pipeline import RawRecord, WritePipeline

pytestmark = pytest.mark.integration

FILLER = ["Hey! How are you?", "Good, thanks! And you?", "Wow, that's great!", "Haha yes"]
NEWS = [
    "I adopted a beagle named Rex from the shelter on Tuesday.",
    "My sister Anna moved to Lisbon last spring to study architecture.",
    "We drove to Yosemite in June and hiked the Mist Trail.",
]
OLD = "I keep my running sneakers under the bed in my room."
NEW = "I keep my running sneakers in the hall closet now."


def test_the_update_is_served_first_and_names_what_it_supersedes(
    store_factory: Callable[..., MemoryStore],
) -> None:
    enc = HashingEncoder(dim=256)
    turns: list[ChatTurn] = []
    for r in range(12):
        turns += [ChatTurn("Ann" if j % 2 else "Bob", f) for j, f in enumerate(FILLER)]
        turns.append(ChatTurn("Ann", f"{NEWS[r % len(NEWS)]} (week {r})"))
        if r in (4, 10):
            turns.append(ChatTurn("Ann", OLD if r == 4 else NEW))
    ts = chat_transitions(turns, tenant="acme", conversation="c1", session=1)
    ts = [t.model_copy(update={"ts": 1_700_000_000_000 + 60_000 * i}) for i, t in enumerate(ts)]
    pipe = WritePipeline(Settings(), enc)
    store = store_factory(dim=256)
    for i in range(0, len(ts), 16):
        raws = [
            RawRecord(encode(t), b"c1", "dmem.transitions", 0, i + j)
            for j, t in enumerate(ts[i : i + 16])
        ]
        res = pipe.process(raws, now_ms=1_000 + i)
        for part, rows in res.upserts.items():
            if rows:
                store.upsert(rows, part)
    old, new = (t.memory_id for t in ts if "sneakers" in t.observation)
    (row,) = store.get([new], tenant="acme")
    assert row["metadata"]["updates"] == old
    req = RetrievalRequest(
        request_id="q", tenant="acme", query="where do I keep my running sneakers?", k=3
    )
    hits = Responder(store, enc, consistency_level="Strong").answer(req, 2_000_000_000_000)[0].hits
    ids = [h.memory_id for h in hits]
    assert ids.index(new) == ids.index(old) - 1 == 0, ids
    assert hits[0].breakdown.supersedes == old and hits[1].breakdown.supersedes is None
    # another tenant sees neither
    other = req.model_copy(update={"tenant": "zeta"})
    assert Responder(store, enc, consistency_level="Strong").answer(other, 0)[0].hits == []
