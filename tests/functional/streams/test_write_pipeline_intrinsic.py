"""The gate score with reward-free surprise: rewarded streams route as before, chats keep news."""

from __future__ import annotations

from collections import Counter

from dmem.client import ChatTurn, chat_transitions
from dmem.demo import q_learning_transitions
from operators import HashingEncoder
from schemas import Transition, encode
from streams.settings import IntrinsicSettings, Settings
from streams.write.pipeline import RawRecord, WritePipeline


def raws_of(transitions: list[Transition]) -> list[RawRecord]:
    return [RawRecord(encode(t), t.agent_id.encode(), "dmem.transitions", 0, i)
            for i, t in enumerate(transitions)]


def routes(p: WritePipeline, ts: list[Transition], batch: int = 64) -> list[tuple[str, str]]:
    raws = raws_of(ts)
    out = []
    for i in range(0, len(raws), batch):
        res = p.process(raws[i : i + batch], now_ms=1_000 + i)
        out += [(e.route or "", e.reason) for e in res.events]
    return out


def test_rewarded_stream_routes_exactly_as_without_intrinsic() -> None:
    for env in ("cliffwalking", "taxi"):
        ts = [t for t, _, _ in q_learning_transitions(env, 800, seed=5)]
        on = WritePipeline(Settings(), HashingEncoder(dim=64))
        off = WritePipeline(Settings(intrinsic=IntrinsicSettings(enabled=False)),
                            HashingEncoder(dim=64))
        assert routes(on, ts) == routes(off, ts)
        assert on.tenants[ts[0].tenant].intrinsic.mix.weight == 0.0


FILLER = ["Hey! How are you?", "Good, thanks! And you?", "Wow, that's great!", "Thanks!",
          "That's awesome!", "Haha yes", "Totally agree!", "See you soon!"]
FACTS = [
    "I adopted a beagle named Rex from the shelter on Tuesday, he loves swimming in the lake.",
    "My sister Anna moved to Lisbon last spring to study architecture at the university.",
    "I'm allergic to nuts, so I can never eat the almond cake my grandmother bakes.",
    "I start my new job as a pediatric nurse at Mercy Hospital next Monday morning.",
    "We drove to Yosemite in June and hiked the Mist Trail up to Vernal Fall.",
    "I finally finished painting the sunrise over the harbour that I started in March.",
]


def chat(n_rounds: int) -> list[Transition]:
    turns: list[ChatTurn] = []
    for r in range(n_rounds):
        for j, f in enumerate(FILLER):
            turns.append(ChatTurn("Ann" if j % 2 else "Bob", f))
        turns.append(ChatTurn("Ann", FACTS[r % len(FACTS)] + f" (week {r})"))
    return chat_transitions(turns, tenant="t", conversation="c1", session=1)


def test_reward_free_chat_keeps_news_and_drops_filler_and_repeats() -> None:
    p = WritePipeline(Settings(), HashingEncoder(dim=256))
    ts = chat(24)
    got = routes(p, ts)
    kept: Counter[tuple[str, bool]] = Counter()
    seen: set[str] = set()
    for t, (route, _) in zip(ts, got, strict=True):
        fact = next((f for f in FACTS if t.text().startswith(f"Ann: {f[:20]}")), None)
        kind = "filler" if fact is None else ("repeat" if fact in seen else "news")
        if fact is not None:
            seen.add(fact)
        kept[kind, route != "drop"] += 1

    def share(kind: str) -> float:
        return kept[kind, True] / (kept[kind, True] + kept[kind, False])

    assert share("news") >= 5 / 6, kept
    assert share("repeat") <= 0.25, kept
    assert share("filler") <= 0.25, kept
    st = p.tenants["t"]
    assert st.intrinsic.mix.weight == 1.0
    # the state, intrinsic part included, survives a checkpoint
    p2 = WritePipeline(Settings(), HashingEncoder(dim=256))
    p2.restore("t", p.snapshot("t"))
    assert p2.tenants["t"].intrinsic.tokens.total == st.intrinsic.tokens.total
