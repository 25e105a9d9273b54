"""The gate score with reward-free surprise: rewarded streams route as before, chats keep news."""

from __future__ import annotations

from collections import Counter
from typing import Any

from dmem.client import ChatTurn, chat_transitions
from dmem_bench.demo import q_learning_transitions
from operators import HashingEncoder
from schemas import Transition, encode
from streams.settings import IntrinsicSettings, Settings
from streams.write.pipeline import RawRecord, WritePipeline


def raws_of(transitions: list[Transition]) -> list[RawRecord]:
    return [
        RawRecord(encode(t), t.agent_id.encode(), "dmem.transitions", 0, i)
        for i, t in enumerate(transitions)
    ]


def routes(p: WritePipeline, ts: list[Transition], batch: int = 64) -> list[tuple[str, str]]:
    """Each transition's final (route, reason): a later ``referred`` write supersedes a drop."""
    raws = raws_of(ts)
    last: dict[str, tuple[str, str]] = {}
    for i in range(0, len(raws), batch):
        res = p.process(raws[i : i + batch], now_ms=1_000 + i)
        last |= {e.memory_id: (e.route or "", e.reason) for e in res.events}
    return [last[t.memory_id] for t in ts]


def test_rewarded_stream_routes_exactly_as_without_intrinsic() -> None:
    for env in ("cliffwalking", "taxi"):
        ts = [t for t, _, _ in q_learning_transitions(env, 800, seed=5)]
        on = WritePipeline(Settings(), HashingEncoder(dim=64))
        off = WritePipeline(
            Settings(intrinsic=IntrinsicSettings(enabled=False)), HashingEncoder(dim=64)
        )
        assert routes(on, ts) == routes(off, ts)
        assert on.tenants[ts[0].tenant].intrinsic.mix.weight(ts[0].agent_id) == 0.0


FILLER = [
    "Hey! How are you?",
    "Good, thanks! And you?",
    "Wow, that's great!",
    "Thanks!",
    "That's awesome!",
    "Haha yes",
    "Totally agree!",
    "See you soon!",
]
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
    """News is kept and filler dropped; an exact repeat is dropped; a
    restatement with one word changed (cosine ~0.95 to the first, above
    ``repeat_cos``) is discounted by novelty to well below news: whether it is kept
    is the gate's percentile call, and the dedup job folds it into the first."""
    p = WritePipeline(Settings(), HashingEncoder(dim=256))
    ts = chat(24)
    exact = [
        t.model_copy(update={"step": 1000 + j})
        for j, t in enumerate(x for x in ts if x.text().startswith(f"Ann: {FACTS[0][:20]}"))
    ]
    raws = raws_of(ts + exact)
    last: dict[str, tuple[str, str, float]] = {}
    for i in range(0, len(raws), 64):
        res = p.process(raws[i : i + 64], now_ms=1_000 + i)
        last |= {e.memory_id: (e.route or "", e.reason, e.rpe_smoothed) for e in res.events}
    kept: Counter[tuple[str, bool]] = Counter()
    score: dict[str, list[float]] = {"news": [], "restated": []}
    seen: set[str] = set()
    for t in ts:
        route, reason, s = last[t.memory_id]
        fact = next((f for f in FACTS if t.text().startswith(f"Ann: {f[:20]}")), None)
        kind = "filler" if fact is None else ("restated" if fact in seen else "news")
        if fact is not None:
            seen.add(fact)
            if reason != "off_context":
                score[kind].append(s)
        kept[kind, route != "drop"] += 1

    def share(kind: str) -> float:
        return kept[kind, True] / (kept[kind, True] + kept[kind, False])

    assert share("news") >= 5 / 6, kept
    assert share("filler") <= 0.25, kept
    mean = {k: sum(v) / len(v) for k, v in score.items()}
    assert mean["restated"] <= 0.6 * mean["news"], mean
    # an exact repeat says nothing new (novelty 0: below the floor, or the repeat rule)
    assert [last[t.memory_id][0] for t in exact] == ["drop"] * len(exact), exact
    st = p.tenants["t"]
    assert st.intrinsic.mix.weight("c1") == 1.0
    # the state, intrinsic part included, survives a checkpoint
    p2 = WritePipeline(Settings(), HashingEncoder(dim=256))
    p2.restore("t", p.snapshot("t"))
    assert p2.tenants["t"].intrinsic.tokens.total == st.intrinsic.tokens.total


def test_an_off_context_turn_referred_to_later_is_written_and_noise_is_not() -> None:
    import numpy as np

    rng = np.random.default_rng(5)
    words = (
        "garden tomato roses water hose soil seeds compost basil weeds shovel fence "
        "sunflowers watering can harvest mulch beds pots"
    ).split()
    turns = [
        ChatTurn("Ann" if i % 2 else "Bob", " ".join(rng.choice(words, size=8))) for i in range(80)
    ]
    opener = "We booked a ferry to the Greek islands, Santorini and Naxos, for July."
    intruder = "Quarterly earnings of the semiconductor company beat analyst forecasts."
    turns += [
        ChatTurn("Ann", opener),
        ChatTurn("Bob", intruder),
        ChatTurn("Bob", "A ferry to Santorini and Naxos in July, lucky you!"),
    ]
    turns += [ChatTurn("Ann", " ".join(rng.choice(words, size=8))) for _ in range(6)]
    ts = chat_transitions(turns, tenant="t", conversation="c1", session=1)
    p = WritePipeline(Settings(), HashingEncoder(dim=256))
    raws = raws_of(ts)
    events = []
    for i in range(0, len(raws), 16):
        events += p.process(raws[i : i + 16], now_ms=1_000 + i).events
    by_id = {t.text(): t.memory_id for t in ts}
    trail = {
        k: [(e.kind, e.reason) for e in events if e.memory_id == by_id[f"{s}: {k}"]]
        for s, k in (("Ann", opener), ("Bob", intruder))
    }
    # the opener fit nothing before it (its next turn is the intruder): vetoed, then
    # the reply refers back to it and it is written
    assert trail[opener] == [("dropped", "off_context"), ("written", "referred")]
    assert trail[intruder] == [("dropped", "off_context")]


def test_a_chat_beside_a_rewarded_agent_is_scored_and_the_agent_routes_as_alone() -> None:
    """The reward mix is per agent: a tenant whose grid agent earns rewards still
    scores its chat agent's turns (the chat's w stays 1), and the grid agent's steps
    are not scored (its w is 0): before the chat arrives it routes exactly as in a
    tenant of its own."""
    grid = [
        t.model_copy(update={"tenant": "t"})
        for t, _, _ in q_learning_transitions("cliffwalking", 400, seed=5)
    ]
    fact = chat_transitions(
        [ChatTurn("user", "I'm allergic to nuts.")], tenant="t", conversation="chat", session=1
    )
    both = WritePipeline(Settings(), HashingEncoder(dim=64))
    alone = WritePipeline(Settings(), HashingEncoder(dim=64))
    got = routes(both, grid + fact)
    assert got[:-1] == routes(alone, grid)
    assert got[-1][0] != "drop", got[-1]
    mix = both.tenants["t"].intrinsic.mix
    assert mix.weight(grid[0].agent_id) == 0.0 and mix.weight("chat") == 1.0
    # the per-agent rates survive a checkpoint
    p2 = WritePipeline(Settings(), HashingEncoder(dim=64))
    p2.restore("t", both.snapshot("t"))
    mix2 = p2.tenants["t"].intrinsic.mix
    assert mix2.weight(grid[0].agent_id) == 0.0 and mix2.weight("chat") == 1.0
    assert mix2.mixes[grid[0].agent_id].count == len(grid)


def test_small_talk_in_any_register_drops_and_short_typed_facts_stay() -> None:
    """Texting register: emoji, one-word replies, typos. After the gate's warm-up
    (its first ``gate.warmup`` scores use fixed thresholds) every short disclosure is
    kept, typos and all, and the small talk around it is dropped."""
    import random

    rng = random.Random(1)
    small = ["lol", "ok", "😂😂", "👍", "haha", "k thx", "yeah", "omg 😍", "sure!", "ok ok"]
    facts = [
        "im alergic to nutz btw",
        "my bro Jake moved to Denver last wk",
        "got a new job at Pfizer as a chemist",
        "we adopted a cat named Miso 🐱",
        "my flight to Tokyo is on the 14th",
        "I sold my old Honda Civic yesterday",
        "my daughter Lia starts kindergarten in sept",
        "doc says my knee needs surgery in march",
        "we r moving to a flat in Leeds",
        "my mom turns 70 on friday, party at Rosa's",
        "i quit coffee 2 weeks ago",
        "bought a used Yamaha piano for 900 bucks",
    ]
    turns: list[ChatTurn] = []
    for fact in facts:
        turns += [ChatTurn("Ann" if j % 2 else "Bob", rng.choice(small)) for j in range(10)]
        turns.append(ChatTurn("Ann", fact))
    ts = chat_transitions(turns, tenant="t", conversation="c1", session=1)
    settings = Settings()
    got = routes(WritePipeline(settings, HashingEncoder(dim=256)), ts)
    kept: Counter[tuple[str, bool]] = Counter()
    for t, (route, _) in list(zip(ts, got, strict=True))[settings.gate.warmup :]:
        kind = "fact" if t.text().split(": ", 1)[1] in facts else "small"
        kept[kind, route != "drop"] += 1
    assert kept["fact", False] == 0 and kept["fact", True] >= 6, kept
    assert kept["small", True] <= 0.1 * (kept["small", True] + kept["small", False]), kept


def test_a_later_statement_of_the_same_thing_is_recorded_as_its_update() -> None:
    """The write path names the earlier memory a turn restates with a change
    (``metadata.updates``); the ranking then puts the later one first."""
    p = WritePipeline(Settings(), HashingEncoder(dim=256))
    turns: list[ChatTurn] = []
    for r in range(12):
        for j, f in enumerate(FILLER):
            turns.append(ChatTurn("Ann" if j % 2 else "Bob", f))
        turns.append(ChatTurn("Ann", FACTS[r % len(FACTS)] + f" (week {r})"))
        if r == 4:
            turns.append(ChatTurn("Ann", "I keep my running sneakers under the bed in my room."))
        if r == 10:
            turns.append(ChatTurn("Ann", "I keep my running sneakers in the hall closet now."))
    ts = chat_transitions(turns, tenant="t", conversation="c1", session=1)
    rows: dict[str, dict] = {}
    raws = raws_of(ts)
    for i in range(0, len(raws), 16):
        res = p.process(raws[i : i + 16], now_ms=1_000 + i)
        rows |= {r["id"]: r for part in res.upserts.values() for r in part}
    first, later = (t for t in ts if "sneakers" in t.observation)
    assert first.memory_id in rows and later.memory_id in rows
    assert rows[later.memory_id]["metadata"].get("updates") == first.memory_id
    # news about other things is no update of the sneakers
    news = [rows[t.memory_id] for t in ts if "(week" in t.observation and t.memory_id in rows]
    assert news and all(r["metadata"].get("updates") != first.memory_id for r in news)


def briefings(tenant: str, n: int, episode: str, start: int = 0) -> list[Transition]:
    """Reward-free statements of an agent that plays episodes, each new."""
    from dmem_bench.credit import BRIEFINGS, DISTRACTORS, VAULTS

    out = []
    for i in range(start, start + n):
        v = VAULTS[i % len(VAULTS)] + ("" if i < len(VAULTS) else f" {i}")
        texts = [BRIEFINGS[i % len(BRIEFINGS)].format(v=v, S="LEFT")]
        texts += [d.format(v=v) for d in DISTRACTORS[:6]]
        out += [
            Transition(
                tenant=tenant,
                agent_id="explorer",
                episode_id=f"{episode}{i}",
                step=j,
                observation=x,
                action="listen",
                reward=0.0,
                next_observation=x,
            )  # fmt: skip
            for j, x in enumerate(texts)
        ]
    return out


def test_novel_reward_free_statements_of_an_outcome_reporting_tenant_are_kept() -> None:
    """Once the tenant reports episode outcomes, a new reward-free statement the gate
    ranks on TD noise is kept in the buffer (credit may prove it decisive later); a
    tenant without outcomes (a chat), or with the setting off, routes as before."""
    from streams.settings import GateSettings

    def run(keep: bool, outcome: bool) -> list[tuple[str, str]]:
        p = WritePipeline(
            Settings(gate=GateSettings(keep_novel_statements=keep)), HashingEncoder(dim=256)
        )
        routes(p, briefings("t", 10, "warm"))  # past the gate's warm-up
        if outcome:
            p.rescore("t", "warm9", 1.0, now_ms=5_000)
        return routes(p, briefings("t", 12, "new", start=10))

    kept = run(True, True)
    assert all(r != "drop" for r, _ in kept)
    assert ("buffer", "novel_statement") in kept
    before = run(False, True)
    assert sum(r == "drop" for r, _ in before) > 0  # what the gate alone drops
    # what the gate kept on its own is routed as before
    assert [k for k, b in zip(kept, before, strict=True) if b[0] != "drop"] == [
        b for b in before if b[0] != "drop"
    ]
    assert run(True, False) == run(False, False)  # no outcomes: unchanged


def test_novel_statements_are_kept_only_for_the_agent_that_reports_outcomes() -> None:
    """An agent beside one whose episodes have outcomes (a chat in the same tenant)
    routes as if no outcome had been reported; the agent itself keeps its statements,
    also after a checkpoint."""
    from streams.settings import GateSettings

    def run(outcome: bool, agent: str, restart: bool = False) -> list[tuple[str, str]]:
        p = WritePipeline(
            Settings(gate=GateSettings(keep_novel_statements=True)), HashingEncoder(dim=256)
        )
        routes(p, briefings("t", 10, "warm"))
        if outcome:
            p.rescore("t", "warm9", 1.0, now_ms=5_000)
        if restart:
            (key,) = p.states
            blob = p.states[key].to_bytes()
            p = WritePipeline(p.settings, HashingEncoder(dim=256))
            p.restore(key[0], blob, key[1])
        later = [t.model_copy(update={"agent_id": agent}) for t in briefings("t", 12, "new", 10)]
        return routes(p, later)

    assert run(True, "chat") == run(False, "chat")
    kept = run(True, "explorer", restart=True)
    assert ("buffer", "novel_statement") in kept
    assert all(r != "drop" for r, _ in kept)


def test_a_written_turn_the_warm_guard_takes_back_is_evicted(monkeypatch: Any) -> None:
    """The guard's second look (`IntrinsicScore.retracts`, mocked here to name one
    written and one dropped turn) evicts only what was written: an ``evicted`` event
    (reason ``off_context``), a delete for the store after the batch's upserts, and the
    write path forgets its repeat key, so the same text later is judged afresh."""
    import dataclasses

    from operators.surprise import IntrinsicState

    p = WritePipeline(
        Settings(intrinsic=IntrinsicSettings(recheck_cold=True)), HashingEncoder(dim=256)
    )
    ts = chat(6)
    raws = raws_of(ts)
    first = p.process(raws[:40], now_ms=1_000)
    written = [e for e in first.events if e.kind == "written"]
    dropped = [e for e in first.events if e.kind == "dropped"]
    assert written and dropped
    target, miss = written[0], dropped[0]
    st = p.tenants["t"]
    assert st.key_of.get(target.memory_id) is not None
    real = IntrinsicState.score_batch
    calls = {"n": 0}

    def score_batch(self: IntrinsicState, *a: Any, **kw: Any) -> list[Any]:
        out = real(self, *a, **kw)
        if calls["n"] == 0 and out:
            calls["n"] += 1
            back = ((target.memory_id, target.episode_id), (miss.memory_id, miss.episode_id))
            out[0] = dataclasses.replace(out[0], retracts=back)
        return out

    monkeypatch.setattr(IntrinsicState, "score_batch", score_batch)
    second = p.process(raws[40:41], now_ms=2_000)
    monkeypatch.undo()
    evicted = [e for e in second.events if e.kind == "evicted"]
    assert [(e.memory_id, e.reason) for e in evicted] == [(target.memory_id, "off_context")]
    assert second.retract == [("t", target.memory_id)]
    assert st.key_of.get(target.memory_id) is None  # forgotten: no longer a repeat key
    # off by default: a pipeline on the default settings never takes a turn back
    q = WritePipeline(Settings(), HashingEncoder(dim=256))
    out = [q.process(raws[i : i + 16], now_ms=1_000 + i) for i in range(0, len(raws), 16)]
    assert all(not r.retract for r in out)
    assert Settings().intrinsic.recheck_cold is False
