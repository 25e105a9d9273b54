"""Chats written by the real write path into a real Milvus (Lite and server), then
served: a later statement of the same thing above the older memory it updates, and
the recency of a months-long chat measured on the chat's own span."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import pytest

from dmem.client import ChatTurn, chat_transitions
from milvus import MemoryStore
from operators import HashingEncoder
from schemas import RetrievalRequest, Transition, encode
from streams.respond.http import policy_from
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


def write(store: MemoryStore, enc: HashingEncoder, ts: Sequence[Transition]) -> None:
    """``ts`` through the real write pipeline (product settings) into ``store``."""
    pipe = WritePipeline(Settings(), enc)
    for i in range(0, len(ts), 16):
        raws = [
            RawRecord(encode(t), b"c1", "dmem.transitions", 0, i + j)
            for j, t in enumerate(ts[i : i + 16])
        ]
        res = pipe.process(raws, now_ms=1_000 + i)
        for part, rows in res.upserts.items():
            if rows:
                store.upsert(rows, part)


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
    store = store_factory(dim=256)
    write(store, enc, ts)
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


DAY_MS = 24 * 3600 * 1000


def test_a_chats_past_keeps_half_its_recency_over_the_chats_own_span(
    store_factory: Callable[..., MemoryStore],
) -> None:
    """Two sessions 180 days apart: with the product's ranking policy (span factor 1) the
    first session's memories keep half the recency of the last one's; with a fixed
    30-day half-life (span factor 0) they would keep 2^-6 of it. The span is what the
    responder read of the agent's rows in Milvus; a question's ``as_of`` ends it."""
    enc = HashingEncoder(dim=256)
    ts: list[Transition] = []
    for session, day in ((1, 0), (2, 180)):
        turns = [ChatTurn("Ann" if j % 2 else "Bob", f) for j, f in enumerate(FILLER)]
        turns += [ChatTurn("Ann", f"{n} (session {session})") for n in NEWS]
        for i, t in enumerate(
            chat_transitions(turns, tenant="acme", conversation="c1", session=session)
        ):
            ts.append(t.model_copy(update={"ts": 1_700_000_000_000 + day * DAY_MS + 60_000 * i}))
    store = store_factory(dim=256)
    write(store, enc, ts)
    first = {t.memory_id for t in ts if t.episode_id == "c1:1"}
    policy = policy_from(Settings())
    assert policy.span_factor == 1.0

    def recency(responder: Responder) -> tuple[float, float]:
        req = RetrievalRequest(
            request_id="q", tenant="acme", query="Ann's beagle Rex and her sister Anna", k=10
        )
        hits = responder.answer(req, 0)[0].hits
        old = [h.breakdown.recency for h in hits if h.memory_id in first]
        new = [h.breakdown.recency for h in hits if h.memory_id not in first]
        assert old and new, [h.memory_id for h in hits]
        return min(old), max(new)

    seen = Responder(store, enc, policy, consistency_level="Strong")
    old, new = recency(seen)
    assert new == pytest.approx(1.0, abs=0.02)
    assert old == pytest.approx(0.5, abs=0.03)
    fixed = dataclasses.replace(policy, span_factor=0.0)
    fixed_old, _ = recency(Responder(store, enc, fixed, consistency_level="Strong"))
    assert fixed_old == pytest.approx(2.0**-6, abs=0.005)
    # asked on day 90 of a responder whose clock has read both sessions: the second
    # session is left out, and the span and the ages end on day 90. The first
    # session's memories are 90 days old on a 90-day span: half the recency (0.71 if
    # the span ran on to day 180). A responder that has read nothing else knows a span
    # of minutes then: 2^-3 on the fixed half-life (the span is what it has read).
    day90 = 1_700_000_000_000 + 90 * DAY_MS
    req = RetrievalRequest(
        request_id="q", tenant="acme", query="Ann's beagle Rex", k=10, as_of=day90
    )
    for responder, want in (
        (seen, 0.5),
        (Responder(store, enc, policy, consistency_level="Strong"), 2.0**-3),
    ):
        hits = responder.answer(req, 0)[0].hits
        assert hits and {h.memory_id for h in hits} <= first
        assert [h.breakdown.recency for h in hits] == pytest.approx([want] * len(hits), abs=0.03)
