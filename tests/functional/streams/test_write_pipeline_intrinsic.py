"""The gate score with reward-free surprise: rewarded streams route as before, chats keep news."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from dmem.client import ChatTurn, chat_transitions
from dmem_bench.demo import q_learning_transitions
from operators import HashingEncoder
from schemas import Transition, encode
from streams.settings import IntrinsicSettings, Settings
from streams.write.pipeline import RawRecord, WritePipeline, content_key


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


class TableEncoder:
    """A text -> vector table (the functional tier's stand-in for a real encoder), so
    a test controls exactly which turns are related."""

    name = "table"

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table
        self.dim = len(next(iter(table.values())))

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts]).astype(np.float32)


def contaminated_chat(n_topics: int = 30) -> tuple[list[Transition], TableEncoder, set[str]]:
    """Loosely coherent talk (a topic per 12 turns) with unrelated turns injected at a
    rate of one per two real turns from the first turn on: (transitions, the encoder
    of their texts, ids of the injected turns)."""
    rng, g = np.random.default_rng(11), np.random.default_rng(2)
    topics = rng.normal(size=(n_topics, 64))
    vecs, injected = [], []
    for t in range(n_topics):
        for _ in range(12):
            vecs.append(topics[t] + 1.6 * g.normal(size=64))
            injected.append(False)
            if g.random() < 0.5:
                vecs.append(g.normal(size=64) * 1.2)
                injected.append(True)
    words = np.random.default_rng(3)
    turns = [
        ChatTurn(
            "Ann" if i % 2 else "Bob", f"word{words.integers(500)} x{words.integers(500)} n{i}"
        )
        for i in range(len(vecs))
    ]
    ts = chat_transitions(turns, tenant="t", conversation="c1", session=1)
    table = {}
    for tr, v in zip(ts, vecs, strict=True):
        table[tr.text()] = v / np.linalg.norm(v)
    for tr in ts:  # the last turn's next observation is absent; others are turns above
        if tr.next_observation is not None and tr.next_text() not in table:
            table[tr.next_text()] = table[tr.text()]
    return ts, TableEncoder(table), {t.memory_id for t, i in zip(ts, injected, strict=True) if i}


def run_events(p: WritePipeline, ts: list[Transition], restart_at: int | None = None,
               batch: int = 16) -> tuple[list[Any], WritePipeline, set[str]]:  # fmt: skip
    """Every MemoryEvent of ``ts`` through ``p`` in batches; with ``restart_at``, the
    state is checkpointed and read back into a new pipeline there (the ids on
    probation at that moment are returned)."""
    raws, events, held = raws_of(ts), [], set()
    for i in range(0, len(raws), batch):
        if restart_at is not None and i == restart_at:
            held = set(p.tenants["t"].intrinsic.probation_ids())
            fresh = WritePipeline(p.settings, p.encoder)
            fresh.restore("t", p.snapshot("t"))
            p = fresh
        events += p.process(raws[i : i + batch], now_ms=1_000 + i).events
    return events, p, held


def test_the_warm_guard_takes_back_injected_turns_the_cold_guard_let_through() -> None:
    """Contaminated from the first turn: with the second look on, the write path evicts
    turns it wrote while the guard was cold, most of them injected; the live decisions
    are the same as without it until the first eviction; a restart in between (state
    checkpointed and read back) still evicts what was on probation."""
    ts, enc, injected = contaminated_chat()
    on = Settings(intrinsic=IntrinsicSettings(recheck_cold=True))
    events, _, _ = run_events(WritePipeline(on, enc), ts)
    no = Settings(intrinsic=IntrinsicSettings(recheck_cold=False))
    off, _, _ = run_events(WritePipeline(no, enc), ts)
    evicted = [e for e in events if e.kind == "evicted"]
    assert evicted and all(e.reason == "off_context" for e in evicted)
    written = {e.memory_id for e in events if e.kind == "written"}
    gone = {e.memory_id for e in evicted}
    assert gone <= written  # only what was written is taken back
    assert len(gone & injected) >= 2 * len(gone - injected), (gone, injected)
    assert not [e for e in off if e.kind == "evicted"]  # none without the second look
    first = next(i for i, e in enumerate(events) if e.kind == "evicted")
    decided = [(e.memory_id, e.kind, e.route, e.reason) for e in events[:first]]
    assert decided == [(e.memory_id, e.kind, e.route, e.reason) for e in off[:first]]
    # a restart between the first evicted turn's write and its eviction: it waits on
    # probation in the checkpoint and is still taken back afterwards
    mid = events[first].memory_id
    pos = next(i for i, t in enumerate(ts) if t.memory_id == mid)
    again, after, held = run_events(WritePipeline(on, enc), ts, restart_at=16 * (pos // 16 + 1))
    assert mid in held
    assert mid in {e.memory_id for e in again if e.kind == "evicted"}
    # its repeat key left with it, across the restart: sent again, it is judged afresh
    # rather than dropped as a repeat of a memory that is gone
    assert content_key(ts[pos]) not in after.tenants["t"].repeats


def test_a_new_partition_state_starts_with_nothing_on_probation() -> None:
    """A state created for another partition of the tenant is copied from a sibling;
    the sibling's turns on probation stay with it (partitions hold whole agents)."""
    ts, enc, _ = contaminated_chat(4)
    p = WritePipeline(Settings(intrinsic=IntrinsicSettings(recheck_cold=True)), enc)
    p.process(raws_of(ts[:40]), now_ms=1_000)
    source = p.state("t", 0).intrinsic
    held = source.probation_size
    assert held > 0
    copy = p.state("t", 1).intrinsic
    assert copy.probation_size == 0 and not copy.probation
    assert source.probation_size == held


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_updates_link_the_same_thing_and_nothing_unrelated(warm: bool) -> None:
    """With the default encoder (static MiniLM, whose cosine between any two turns of a
    chat runs high): a changed statement links the one it changes, in a chat's first
    turns (before the unrelated level is warm) as after them, and small talk, a turn in
    another language or about another thing links nothing."""
    from operators.encoders import build_encoder
    from operators.surprise import IntrinsicConfig

    T = ChatTurn
    turns = [
        T("user", "hey there 👋"),
        T("assistant", "Hi! How can I help you today?"),
        T("user", "I'm allergic to nuts."),
        T("user", "I keep my sneakers under the bed."),
        T("user", "lol ok thx 😂"),
        T("user", "My sister Clara is visiting from Lisbon on November 3rd."),
        T("assistant", "Lovely! Would you like ideas for things to do with Clara in town?"),
        T("user", "Ich habe einen Hund namens Bello, er ist drei Jahre alt."),
        T("user", "I keep my sneakers in the hall closet now."),
        T("user", "I started learning the cello last week, practising every evening."),
        T("user", "I work as a nurse at St. Mary's hospital on night shifts."),
        T("assistant", "That sounds demanding. Do you want tips on sleeping during the day?"),
        T("user", "nah im good. my fav color is teal btw"),
        T("user", "Je vais à Paris en décembre pour voir ma grand-mère."),
        T("assistant", "Paris in December is beautiful. Say hi to your grandmother!"),
        T("user", "I moved my sneakers to the car trunk, the closet got too full."),
    ]
    earlier = [T("Ann" if j % 2 else "Bob", f) for j, f in enumerate(FILLER + FACTS + FILLER)]
    ts = chat_transitions(turns, tenant="t", conversation="c1", session=2)
    if warm:
        ts = chat_transitions(earlier, tenant="t", conversation="c1", session=1) + ts
    p = WritePipeline(Settings(), build_encoder("minilm-static"))
    rows: dict[str, dict[str, Any]] = {}
    for i, raw in enumerate(raws_of(ts)):
        res = p.process([raw], now_ms=1_000 + i)
        rows |= {r["id"]: r for part in res.upserts.values() for r in part}
    # the chat alone is shorter than the level's warm-up; the earlier turns are not
    n0 = IntrinsicConfig().warmup
    assert len(turns) < n0 and (len(ts) - len(turns) >= n0) == warm
    text = {t.memory_id: t.observation.split(": ", 1)[1] for t in ts}
    links = {
        text[i]: text[r["metadata"]["updates"]]
        for i, r in rows.items()
        if r["metadata"].get("updates")
    }
    bed, closet, trunk = (t for t in text.values() if "sneakers" in t)
    assert links.get(closet) == bed and links.get(trunk) == closet, links
    assert set(links) == {closet, trunk}, links


def test_a_chat_beside_a_rewarded_agent_routes_as_it_would_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One tenant, a CliffWalking agent (rewards -1 and -100) and a chat interleaved:
    the chat's turns route (nearly) as in a tenant of their own, by the reward-free
    agents' own thresholds, and the rewarded agent's exactly as with one set of
    thresholds for the tenant (the tenant's sketch still learns every score). With one
    set for both, the chat's turns landed above the grid's bulk and few routes agreed."""
    import streams.write.pipeline as wp

    grid = [t.model_copy(update={"tenant": "t"})
            for t, _, _ in q_learning_transitions("cliffwalking", 400, seed=5)]  # fmt: skip
    turns: list[ChatTurn] = []
    for r in range(8):
        turns += [ChatTurn("Ann" if j % 2 else "Bob", f) for j, f in enumerate(FILLER)]
        turns.append(ChatTurn("Ann", FACTS[r % len(FACTS)] + f" (week {r})"))
    chat = chat_transitions(turns, tenant="t", conversation="c1", session=1)
    mixed: list[Transition] = []
    for i, c in enumerate(chat):
        mixed += [*grid[4 * i : 4 * i + 4], c]

    def run() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        got = routes(WritePipeline(Settings(), HashingEncoder(dim=256)), mixed)
        pairs = list(zip(mixed, got, strict=True))
        return [g for t, g in pairs if t.agent_id == "c1"], [
            g for t, g in pairs if t.agent_id != "c1"
        ]

    alone = routes(WritePipeline(Settings(), HashingEncoder(dim=256)), chat)
    chat_routes, grid_routes = run()
    # decided per record in stream order: one record at a time routes the same
    one_by_one = routes(WritePipeline(Settings(), HashingEncoder(dim=256)), mixed, batch=1)
    assert one_by_one == [*routes(WritePipeline(Settings(), HashingEncoder(dim=256)), mixed)]
    assert sum(a == b for a, b in zip(chat_routes, alone, strict=True)) >= 0.9 * len(chat)

    def one_sketch(ts: list[Transition], *_: Any) -> tuple[list[bool], list[bool]]:
        return [False] * len(ts), [False] * len(ts)

    monkeypatch.setattr(wp, "reward_free_gate", one_sketch)
    one_chat, one_grid = run()
    assert grid_routes == one_grid
    assert sum(a == b for a, b in zip(one_chat, alone, strict=True)) < 0.5 * len(chat)


def test_reward_free_routing_is_decided_in_stream_order() -> None:
    """An agent is reward-free until its own first reward; the tenant is mixed from the
    first reward of any agent on (and stays so when that agent is forgotten); nothing
    splits without the intrinsic term."""
    from streams.write.pipeline import reward_free_gate

    def tr(agent: str, step: int, reward: float) -> Transition:
        return Transition(tenant="t", agent_id=agent, episode_id=agent, step=step,
                          observation=f"{agent} {step}", action="x", reward=reward)  # fmt: skip

    ts = [tr("chat", 0, 0.0), tr("grid", 0, -1.0), tr("chat", 1, 0.0), tr("lake", 0, 0.0)]
    r = np.array([t.reward for t in ts])
    assert reward_free_gate(ts, r, set(), True) == (
        [True, False, True, True], [False, False, True, True])  # fmt: skip
    assert reward_free_gate(ts[:1], r[:1], set(), True, mixed=True) == ([True], [True])
    assert reward_free_gate(ts[:1], r[:1], {"grid"}, True) == ([True], [True])
    assert reward_free_gate(ts, r, set(), False) == ([False] * 4, [False] * 4)
