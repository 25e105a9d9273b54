"""Reward-free surprise: token surprisal, RND, novelty vs stored, context fit, the mix."""

from __future__ import annotations

import dataclasses
import math
import unicodedata

import numpy as np
import orjson
import pytest

from operators.encoders import HashingEncoder
from operators.surprise import (
    _SENTENCE,
    _TOKEN,
    SPEAKER_PREFIX,
    Contamination,
    GuardCalibration,
    IntrinsicConfig,
    IntrinsicScore,
    IntrinsicState,
    RewardMix,
    RndSurprise,
    TokenSurprisal,
    discloses,
    gate_score,
    words,
)


def test_gate_score_is_extrinsic_when_weight_is_zero() -> None:
    assert gate_score(0.7, 5.0, 0.0) == 0.7
    assert gate_score(0.0, 2.0, 1.0) == 2.0
    assert gate_score(3.0, 2.0, 1.0) == 3.0
    assert gate_score(0.2, 2.0, 0.5) == 1.0


def test_reward_mix_switches_intrinsic_off_for_rewarded_streams() -> None:
    rl = RewardMix()
    assert rl.observe(np.full(1, -1.0)) == 0.0  # first batch of a step-cost stream
    assert rl.observe(np.full(500, -1.0)) == 0.0
    chat = RewardMix()
    assert chat.observe(np.zeros(1000)) == 1.0
    sparse = RewardMix(rate_full=0.01)
    w = sparse.observe(np.r_[np.zeros(995), np.ones(5)])  # 0.5 % rewarded
    assert 0.0 < w < 1.0
    again = RewardMix.from_dict(orjson.loads(orjson.dumps(sparse.to_dict())))
    assert again.weight == sparse.weight
    with pytest.raises(ValueError):
        RewardMix(rate_full=0.0)


def test_token_surprisal_frequent_tokens_say_little() -> None:
    tm = TokenSurprisal(buckets=1 << 12)
    for _ in range(20):
        tm.learn(tm.ids("hey how are you good to see you"))
    greeting = tm.surprisal(tm.ids("hey good to see you"))
    news = tm.surprisal(tm.ids("my sister moved to lisbon to study architecture"))
    assert news > 2 * greeting
    back = TokenSurprisal.from_dict(orjson.loads(orjson.dumps(tm.to_dict())))
    probe = tm.ids("hey lisbon")
    assert back.surprisal(probe) == pytest.approx(tm.surprisal(probe))


def test_words_of_any_script() -> None:
    assert words("Ann: I’m at the Café, it's 42°C!") == [
        "ann",
        "i'm",
        "at",
        "the",
        "café",
        "it's",
        "42",
        "c",
    ]
    assert words("Ann: Я взял бигля из приюта.") == ["ann", "я", "взял", "бигля", "из", "приюта"]
    # Han and kana: a token per character; Latin next to them is a word of its own
    assert words("我们去了Lisbon。私は猫") == ["我", "们", "去", "了", "lisbon", "私", "は", "猫"]
    assert words("snake_case x__y") == ["snake", "case", "x", "y"]
    # combining marks stay in their word: Hindi's vowel signs, a decomposed accent
    assert words("नमस्ते, मैं यहाँ हूँ") == ["नमस्ते", "मैं", "यहाँ", "हूँ"]
    assert words(unicodedata.normalize("NFD", "Nós")) == ["nós"]


def test_words_of_ascii_text_are_the_ascii_tokens() -> None:
    """ASCII text cuts exactly as ``[a-z0-9']+`` of its lower case: the token counts
    (checkpointed, hashed) of an English chat mean what they meant. The general cut
    (`_TOKEN`) agrees with the ASCII fast path of `words`."""
    import random
    import re
    import string

    rng = random.Random(3)
    alphabet = string.ascii_letters + string.digits + " '_-.,!?:;\n\t"
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60)))
        ascii_cut = re.findall(r"[a-z0-9']+", text.lower())
        assert words(text) == ascii_cut == _TOKEN.findall(text.lower()), text


@pytest.mark.parametrize("lang", ["ru", "zh"])
def test_token_surprisal_frequent_tokens_say_little_in_any_script(lang: str) -> None:
    small_talk, facts = CHATS[lang]
    tm = TokenSurprisal(buckets=1 << 12)
    for _ in range(20):
        for t in small_talk:
            tm.learn(tm.ids(t))
    greeting = tm.surprisal(tm.ids(small_talk[0]))
    news = tm.surprisal(tm.ids(facts[2]))
    assert news > 2 * greeting > 0


def test_token_counts_are_halved_before_float16_overflows() -> None:
    tm = TokenSurprisal(buckets=64)
    ids = tm.ids("the")
    for _ in range(31):
        tm.learn(np.repeat(ids, 1000))
    assert float(tm.counts.max()) <= 30_000
    p_the = tm.surprisal(ids)
    back = TokenSurprisal.from_dict(tm.to_dict())
    assert back.surprisal(ids) == pytest.approx(p_the, abs=1e-3)  # p(the) kept


def test_rnd_error_falls_where_it_has_trained() -> None:
    rng = np.random.default_rng(0)
    seen = rng.normal(size=(64, 16)).astype(np.float32)
    seen /= np.linalg.norm(seen, axis=1, keepdims=True)
    unseen = -seen  # the opposite region of the sphere
    rnd = RndSurprise(dim=16, lr=0.05, seed=1)
    before = rnd.errors(seen).mean()
    for _ in range(300):
        rnd.learn(seen)
    assert rnd.errors(seen).mean() < 0.5 * before
    assert rnd.errors(unseen).mean() > rnd.errors(seen).mean()
    back = RndSurprise.from_dict(orjson.loads(orjson.dumps(rnd.to_dict())))
    np.testing.assert_allclose(back.errors(seen), rnd.errors(seen), rtol=0.05, atol=1e-3)
    fresh = RndSurprise.from_dict(RndSurprise(dim=16, seed=1).to_dict())  # untrained: from seed
    np.testing.assert_allclose(fresh.errors(seen), RndSurprise(dim=16, seed=1).errors(seen))


ENC = HashingEncoder(dim=128)


def score_stream(
    st: IntrinsicState,
    texts: list[str],
    agent: str = "a",
    next_texts: list[str | None] | None = None,
    first_id: int = 0,
) -> list:
    vecs = ENC.encode(texts)
    nxt = next_texts or [texts[i + 1] if i + 1 < len(texts) else None for i in range(len(texts))]
    nvec = ENC.encode([n or t for n, t in zip(nxt, texts, strict=True)])
    out = []
    for i in range(len(texts)):  # batches of one (a batch gives the same scores)
        out += st.score_batch(
            [agent],
            [texts[i]],
            vecs[i : i + 1],
            nvec[i : i + 1],
            [nxt[i] is not None],
            [f"{agent}-{first_id + i}"],
        )
    return out


#: small talk and facts of one chat, in three scripts
CHATS = {
    "en": (
        ["hey how are you", "good thanks and you", "that's great", "wow that's great"],
        [
            "my dog rex is a three year old beagle who loves swimming in the lake",
            "i start a new job as a nurse at the city hospital on monday",
            "my sister anna moved to lisbon last spring to study architecture",
        ],
    ),
    "ru": (
        ["привет как дела", "хорошо спасибо а у тебя", "это здорово", "ого это здорово"],
        [
            "моему псу рексу три года это бигль который любит плавать в озере",
            "в понедельник я начинаю работать медсестрой в городской больнице",
            "моя сестра анна весной переехала в лиссабон изучать архитектуру",
        ],
    ),
    "zh": (
        ["嗨你好吗", "很好谢谢你呢", "太好了", "哇太好了"],
        [
            "我的狗雷克斯是一只三岁的小猎犬，喜欢在湖里游泳",
            "星期一我开始在市医院当护士",
            "我姐姐安娜去年春天搬到里斯本学习建筑",
        ],
    ),
}


@pytest.mark.parametrize("lang", sorted(CHATS))
def test_repeats_score_low_and_informative_turns_high(lang: str) -> None:
    """In any script: a chat whose words are not ASCII letters is scored on its words,
    not only on its punctuation and digits."""
    st = IntrinsicState(128)
    filler, facts = CHATS[lang]
    texts = (filler + facts[:1] + filler + facts[1:2] + filler + facts[2:]) * 2
    scores = score_stream(st, texts)
    first = len(texts) // 2
    fact_scores = [scores[texts.index(f)].score for f in facts]
    later_filler = [
        s.score for t, s in zip(texts[4:first], scores[4:first], strict=True) if t in filler
    ]
    assert max(later_filler) < 1.0 < min(fact_scores)
    # the second time round the facts are repeats of stored memories
    repeat_scores = [scores[first + texts[first:].index(f)] for f in facts]
    assert all(r.novelty < 0.05 for r in repeat_scores)
    assert all(r.score < 0.2 * f for r, f in zip(repeat_scores, fact_scores, strict=True))


def test_off_context_turn_is_vetoed_only_against_an_established_context() -> None:
    cfg = IntrinsicConfig(warmup=5, fit_k=1.0)
    st = IntrinsicState(128, cfg)
    rng = np.random.default_rng(5)
    words = (
        "garden tomato roses water hose soil seeds compost basil weeds shovel fence "
        "sunflowers watering can harvest mulch beds pots"
    ).split()
    talk = [" ".join(rng.choice(words, size=8)) for _ in range(60)]
    score_stream(st, talk)
    intruder = "quarterly earnings of the semiconductor company beat analyst forecasts"
    reply = " ".join(talk[-1].split()[:4]) + " basil compost"
    [x] = score_stream(st, [intruder], next_texts=[reply])
    assert x.off_context and x.score == 0.0
    [y] = score_stream(st, [" ".join(talk[-1].split()[2:]) + " fence"], next_texts=[reply])
    assert not y.off_context and y.score > 0.0
    # a fresh state has no context: nothing is vetoed
    [z] = score_stream(IntrinsicState(128, cfg), [intruder], next_texts=[reply])
    assert not z.off_context


def test_state_roundtrip_keeps_scores() -> None:
    st = IntrinsicState(128)
    texts = [f"turn number {i} about topic {i % 5} with detail {i * 7}" for i in range(40)]
    score_stream(st, texts)
    back = IntrinsicState.from_dict(orjson.loads(orjson.dumps(st.to_dict())))
    probe = ENC.encode(["a completely new sentence about lisbon"])
    a = st.score_batch(["b"], ["a completely new sentence about lisbon"], probe, probe, [False])
    b = back.score_batch(["b"], ["a completely new sentence about lisbon"], probe, probe, [False])
    assert a[0].score == pytest.approx(b[0].score, rel=1e-3)
    assert len(orjson.dumps(st.to_dict())) < 64_000


def test_vector_transitions_use_rnd() -> None:
    st = IntrinsicState(16)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8, 16)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sc = st.score_batch(["a"] * 8, [None] * 8, x, x, [False] * 8)
    assert all(s.info > 0 for s in sc)
    assert st.rnd.updates == 1


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        IntrinsicConfig(repeat_cos=1.0)
    with pytest.raises(ValueError):
        IntrinsicConfig(window=0)
    with pytest.raises(ValueError):
        IntrinsicConfig(lookahead=-1)
    with pytest.raises(ValueError):
        IntrinsicConfig(bank_per_agent=0)
    with pytest.raises(ValueError):
        GuardCalibration(off_posterior=0.0)
    with pytest.raises(ValueError):
        GuardCalibration(recheck_cold=True, off_posterior=1.5)


def garden_state() -> tuple[IntrinsicState, list[str]]:
    st = IntrinsicState(128, IntrinsicConfig(warmup=5, fit_k=1.0, lookahead=3))
    rng = np.random.default_rng(5)
    words = (
        "garden tomato roses water hose soil seeds compost basil weeds shovel fence "
        "sunflowers watering can harvest mulch beds pots"
    ).split()
    talk = [" ".join(rng.choice(words, size=8)) for _ in range(60)]
    score_stream(st, talk)
    return st, talk


def test_a_vetoed_turn_that_a_later_turn_refers_to_is_vindicated() -> None:
    st, talk = garden_state()
    opener = "we booked a ferry to the greek islands santorini and naxos in july"
    filler = " ".join(talk[-1].split()[:6])
    # the opener fits nothing before it; its reply is noise-like too (unrelated)
    [x] = score_stream(st, [opener], next_texts=["quarterly earnings beat forecasts"], first_id=100)
    assert x.off_context and x.score == 0.0 and x.raw > 0.0
    [f] = score_stream(st, [filler], first_id=101)
    assert "a-100" not in [v[0] for v in f.vindicates]
    [back] = score_stream(st, ["the ferry to santorini and naxos in july was booked"], first_id=102)
    assert [v[0] for v in back.vindicates] == ["a-100"]
    assert back.vindicates[0][1] == pytest.approx(x.raw)
    # vindicated once: a second reference finds no suspect left
    [again] = score_stream(st, ["santorini and naxos ferry in july"], first_id=103)
    assert again.vindicates == ()


def test_a_suspect_nothing_refers_to_expires_after_the_lookahead() -> None:
    st, talk = garden_state()
    intruder = "quarterly earnings of the semiconductor company beat analyst forecasts"
    [x] = score_stream(st, [intruder], next_texts=[talk[0]], first_id=100)
    assert x.off_context
    later = score_stream(st, talk[:3], first_id=101)  # lookahead 3: all unrelated
    assert all(v.vindicates == () for v in later)
    [late] = score_stream(st, ["semiconductor company quarterly earnings forecasts"], first_id=104)
    assert late.vindicates == ()  # too late: the veto is final


def test_scores_do_not_depend_on_batch_boundaries() -> None:
    rng = np.random.default_rng(2)
    words = "dog lake swim park run ball tree rain sun walk beagle shelter".split()
    texts = [" ".join(rng.choice(words, size=6)) for _ in range(80)]
    texts[40] = "quarterly earnings of the semiconductor company beat analyst forecasts"
    vecs = ENC.encode(texts)
    nxt = np.roll(vecs, -1, axis=0)

    def run(batch: int) -> list[tuple[float, bool, tuple[str, ...]]]:
        st = IntrinsicState(128, IntrinsicConfig(warmup=5))
        out = []
        for b in range(0, len(texts), batch):
            sl = slice(b, b + batch)
            ids = [f"m{i}" for i in range(b, min(b + batch, len(texts)))]
            out += st.score_batch(
                ["a"] * len(ids), texts[sl], vecs[sl], nxt[sl], [True] * len(ids), ids
            )
        return [(round(x.score, 6), x.off_context, tuple(v[0] for v in x.vindicates)) for x in out]

    one = run(1)
    assert any(off for _, off, _ in one)  # the guard is exercised
    assert run(7) == one and run(80) == one


def test_checkpoint_of_an_earlier_config_loads() -> None:
    st = IntrinsicState(128)
    d = orjson.loads(orjson.dumps(st.to_dict()))
    d["config"] |= {"ctx_alpha": 0.2, "off_streak_max": 3}  # knobs of an earlier version
    back = IntrinsicState.from_dict(d)
    assert back.config == st.config


def _fill(c: Contamination, share: float, n: int = 2000, seed: int = 0) -> None:
    """In std units of the unrelated level: real fits ~ N(2.5, 1), off-context (and
    null) fits ~ N(0, 1)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        off = rng.random() < share
        c.add(float(rng.normal(0.0 if off else 2.5, 1.0)), float(rng.normal(0.0, 1.0)))


def test_contamination_estimates_the_off_context_share() -> None:
    clean, dirty = Contamination(40, 0.005, 100), Contamination(40, 0.005, 100)
    _fill(clean, 0.0)
    _fill(dirty, 0.4)
    assert clean.pi0() < 0.1
    assert 0.3 < dirty.pi0() < 0.5
    # the cut rises with the contamination (Bayes cut of this mixture: z = 1.09); a
    # clean stream gets none, and the mean + k std rule decides alone
    assert clean.cut(0.5) == -math.inf
    assert 0.8 < dirty.cut(0.5) < 1.6
    assert dirty.cut(1.0) == -math.inf  # 1 switches it off


def test_contamination_waits_for_its_warmup_and_survives_a_checkpoint() -> None:
    c = Contamination(40, 0.005, 100)
    _fill(c, 0.4, n=99)
    assert c.cut(0.5) == -math.inf
    _fill(c, 0.4, n=400, seed=1)
    back = Contamination(40, 0.005, 100)
    back.load(orjson.loads(orjson.dumps(c.to_dict())))
    assert c.cut(0.5) > -math.inf
    assert back.cut(0.5) == pytest.approx(c.cut(0.5), abs=1e-3)  # 6-digit checkpoint


def test_contaminated_stream_gets_a_stricter_guard() -> None:
    """Loosely coherent talk (a topic per 12 turns) with unrelated turns injected: the
    cut rises above fit_k and vetoes injected turns that fit_k alone lets through."""
    rng = np.random.default_rng(11)
    dim = 64
    topics = rng.normal(size=(30, dim))

    def stream(share: float, posterior: float = 2 / 3) -> tuple[IntrinsicState, int, int]:
        cfg = IntrinsicConfig(warmup=5, hist_warmup=50, lookahead=3, off_posterior=posterior)
        st = IntrinsicState(dim, cfg)
        g = np.random.default_rng(2)
        vetoed = injected = 0
        for t in range(30):
            for _ in range(12):
                vecs = [(topics[t] + 1.6 * g.normal(size=dim), False)]
                if g.random() < share:
                    vecs.append((g.normal(size=dim) * 1.2, True))
                for v, inj in vecs:
                    v = (v / np.linalg.norm(v)).astype(np.float32)[None, :]
                    [x] = st.score_batch(
                        ["a"], [f"word{g.integers(500)} x{g.integers(500)}"], v, v, [False]
                    )
                    if inj and t >= 10:
                        injected += 1
                        vetoed += x.off_context
        return st, vetoed, injected

    (clean, _, _), (dirty, vetoed, injected) = stream(0.0), stream(0.5)
    assert clean.contamination.pi0() < dirty.contamination.pi0()
    assert clean.contamination.cut(2 / 3) < dirty.contamination.cut(2 / 3)
    assert dirty.contamination.cut(2 / 3) > dirty.config.fit_k, dirty.contamination.cut(2 / 3)
    _, vetoed_off, _ = stream(0.5, posterior=1.0)  # the cut switched off
    assert vetoed > vetoed_off, (vetoed, vetoed_off, injected)


def test_contamination_warmup_counts_null_draws_on_their_own() -> None:
    """A null draw needs a bank of older memories, so it starts later than the fits: a
    cut from a handful of draws would be noise, and the warm-up waits for the draws."""
    c = Contamination(40, 0.005, 100)
    rng = np.random.default_rng(3)
    for i in range(500):
        off = rng.random() < 0.4
        null = float(rng.normal(0.0, 1.0)) if i >= 450 else None  # 50 draws < warm-up
        c.add(float(rng.normal(0.0 if off else 2.5, 1.0)), null)
    assert c.count == 500 and c.null_count == 50
    assert c.cut(0.5) == -math.inf
    for _ in range(60):
        c.add(float(rng.normal(0.0, 1.0)), float(rng.normal(0.0, 1.0)))
    assert c.cut(0.5) > -math.inf


def test_a_bin_hit_long_ago_does_not_set_the_cut() -> None:
    """Decayed counts never reach 0: one fit far up the range, followed by a long clean
    stream, must not leave a high-posterior bin at the top that the cut stops at."""
    c = Contamination(40, 0.005, 100)
    _fill(c, 0.8, n=400)  # contaminated beyond the posterior: pi0 > 2/3
    c.add(5.9, None)  # the top bin, once
    _fill(c, 0.8, n=3000, seed=4)
    assert c.obs[-1] > 0.0  # still there, decayed
    assert c.cut(2 / 3) < 3.0  # from the mixture (2.1), not from that bin (5.9 before)


def test_settings_win_over_the_checkpointed_knobs() -> None:
    st = IntrinsicState(64, IntrinsicConfig(off_posterior=2 / 3, fit_k=1.0))
    d = orjson.loads(orjson.dumps(st.to_dict()))
    new = IntrinsicConfig(off_posterior=1.0, fit_k=1.25, reward_rate_full=0.05)
    back = IntrinsicState.from_dict(d, new)
    assert back.config == new and back.mix.rate_full == 0.05
    assert IntrinsicState.from_dict(d).config == st.config  # without one: the checkpoint's


def test_agent_reward_mix_is_per_agent_bounded_and_checkpointed() -> None:
    from operators.surprise import AgentRewardMix

    mix = AgentRewardMix(max_agents=2)
    # one batch, interleaved: the grid agent is rewarded on 2 of 4 steps, the chat never
    w = mix.observe(
        ["grid", "chat", "grid", "grid", "chat", "grid"], np.array([1, 0, 0, 0, 0, 1.0])
    )
    assert w.tolist() == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]  # read after the batch is folded in
    assert mix.mixes["grid"].count == 4 and mix.mixes["chat"].count == 2
    back = AgentRewardMix.from_dict(orjson.loads(orjson.dumps(mix.to_dict())))
    assert back.weight("grid") == 0.0 and back.weight("chat") == 1.0
    mix.observe(["new"], np.zeros(1))  # a third agent evicts the least recently seen
    assert set(mix.mixes) == {"chat", "new"} and mix.weight("grid") == 1.0
    with pytest.raises(ValueError, match="one reward"):
        mix.observe(["a", "b"], np.zeros(1))
    # a batch of more agents than the bound: every transition still gets its w
    wide = AgentRewardMix(max_agents=2).observe(["a", "b", "c", "a"], np.array([1.0, 0, 0, 1]))
    assert wide.tolist() == [0.0, 1.0, 1.0, 0.0]


def test_a_checkpoint_of_the_summed_term_restarts_the_information_mean() -> None:
    """A state saved with the summed information (n0 None) restored under the per-token
    default: counts are kept, the running mean (on the other scale) starts afresh, and
    the guard's exemption keeps the summed mean."""
    enc = HashingEncoder(dim=32)
    old = IntrinsicState(32, IntrinsicConfig(info_n0=None))
    texts = ["user: my sister moved to Lisbon last spring", "assistant: that sounds great"] * 5
    vecs = enc.encode(texts)
    old.score_batch(["a"] * len(texts), texts, vecs, vecs, [False] * len(texts))
    d = orjson.loads(orjson.dumps(old.to_dict()))
    back = IntrinsicState.from_dict(d, IntrinsicConfig())
    assert back.tokens.n0 == 4.0 and back.tokens.total == old.tokens.total
    assert back.info_mean.count == 0
    assert back.total_mean.mean == pytest.approx(old.total_mean.mean)
    same = IntrinsicState.from_dict(d, IntrinsicConfig(info_n0=None))
    assert same.info_mean.count == old.info_mean.count


def test_speaker_pooling_judges_each_speaker_partly_against_its_own_turns() -> None:
    """A verbose speaker with rare words in every turn no longer crowds out a terse one:
    with pooling each speaker's information is divided by (its own mean)^pooling."""
    enc = HashingEncoder(dim=64)
    texts: list[str] = []
    for i in range(60):
        texts.append(f"assistant: consider quinoa{i} zucchini{i} paprika{i} tahini{i} sumac{i}")
        texts.append(f"user: my cat is {i} months old")
    vecs = enc.encode(texts)

    def ratio(pooling: float) -> float:
        st = IntrinsicState(
            64, IntrinsicConfig(speaker_pooling=pooling, disclosure=0.0, lexical=0.0)
        )
        sc = st.score_batch(["a"] * len(texts), texts, vecs, vecs, [False] * len(texts))
        user = np.mean([s.score for t, s in zip(texts, sc, strict=True) if t.startswith("u")])
        bot = np.mean([s.score for t, s in zip(texts, sc, strict=True) if t.startswith("a")])
        return float(user / bot)

    r0, r5, r1 = ratio(0.0), ratio(0.5), ratio(1.0)
    assert r0 < 0.95 * r5 < 0.95 * 0.95 * r1
    assert r1 == pytest.approx(1.0, abs=0.15)  # each only against itself
    with pytest.raises(ValueError):
        IntrinsicConfig(speaker_pooling=1.5)


def test_speaker_means_survive_a_checkpoint_and_stay_bounded() -> None:
    enc = HashingEncoder(dim=32)
    st = IntrinsicState(32, IntrinsicConfig(max_agents=3))
    texts = [f"s{i % 5}: news number {i} about lisbon" for i in range(30)]
    vecs = enc.encode(texts)
    st.score_batch(["a"] * 30, texts, vecs, vecs, [False] * 30)
    assert len(st.speakers) == 3  # the three speakers heard last
    back = IntrinsicState.from_dict(orjson.loads(orjson.dumps(st.to_dict())))
    assert {k: (r.mean, r.count) for k, r in back.speakers.items()} == {
        k: (r.mean, r.count) for k, r in st.speakers.items()
    }
    # a checkpoint without speaker means (unpooled information) restarts the mean
    d = orjson.loads(orjson.dumps(st.to_dict()))
    del d["speakers"]
    assert IntrinsicState.from_dict(d).info_mean.count == 0


def test_a_restatement_in_a_later_episode_is_no_repeat_of_this_one() -> None:
    """Within an episode (a chat session) a near-repeat is discounted; a restatement in
    a later session (a change or a confirmation of state) is judged on its information,
    unless ``repeat_scope`` is "agent"."""
    enc = HashingEncoder(dim=128)
    fact = "user: my sister anna moved to lisbon last spring to study architecture"
    filler = [f"user: talking about topic {i} with detail {i * 7}" for i in range(30)]
    texts = [fact, *filler, fact + " now"]

    def last(scope: str, later_episode: bool) -> float:
        st = IntrinsicState(128, IntrinsicConfig(repeat_scope=scope))
        vecs = enc.encode(texts)
        eps = ["s1"] * (len(texts) - 1) + ["s2" if later_episode else "s1"]
        ids = [f"m{i}" for i in range(len(texts))]
        sc = st.score_batch(["a"] * len(texts), texts, vecs, vecs, [False] * len(texts), ids, eps)
        return sc[-1].novelty

    assert last("episode", later_episode=False) < 0.1
    assert last("agent", later_episode=True) < 0.1
    assert last("episode", later_episode=True) == 1.0
    with pytest.raises(ValueError):
        IntrinsicConfig(repeat_scope="tenant")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("user: I just got back from a music festival in Brooklyn.", True),
        ("user: Can you recommend a hotel? By the way, my sister moved to Chicago.", True),
        ("bob: ich habe einen neuen Hund", True),
        ("alice: Mon frère habite à Lyon.", True),
        ("ana: Nós mudámos para Lisboa.", True),
        ("ann: Я переехала в Лиссабон.", True),
        ("ann: Мы купили дом.", True),
        ("ann: 我搬到了里斯本。", True),
        ("ann: 僕は東京に住んでいます。", True),
        ("ann: 你去过里斯本吗？", False),
        ("ann: 这是一所私立学校。", False),  # 私 is "private" in Chinese
        ("ann: Ты была в Лиссабоне?", False),
        ("user: Can you recommend some good hotels in Paris?", False),
        ("user: Do you think I should go?", False),
        ("assistant: Paris has many museums. The Louvre is the largest.", False),
        ("user: ", False),
        ("I moved to Lisbon", True),  # no speaker prefix: the whole text
    ],
)
def test_discloses_finds_statements_about_the_speaker(text: str, says: bool) -> None:
    assert discloses(text) is says


@pytest.mark.parametrize(
    "text",
    [
        "assistant: I'd recommend Roscioli for a romantic dinner.",
        "Assistant: As an AI, I don't have personal preferences, but I hope this helps.",
        "model: I think the answer is 12.",
        "tool: I found 3 results.",
        "gpt: I would suggest visiting the Louvre first.",  # a ShareGPT export's model
    ],
)
def test_a_machine_speakers_first_person_is_not_a_disclosure(text: str) -> None:
    """A language model's "I" says nothing about a person: with the product's machine
    speakers (any case) it is not a disclosure; without them it is."""
    assert discloses(text) is True
    assert discloses(text, IntrinsicConfig().machine_speakers) is False
    # a person named like no role still discloses
    person = "Ann: " + text.split(": ", 1)[1]
    assert discloses(person, IntrinsicConfig().machine_speakers) is True


def test_machine_speakers_config_is_normalised_and_checkpointed() -> None:
    cfg = IntrinsicConfig(machine_speakers=["  Bot ", "ASSISTANT"])  # type: ignore[arg-type]
    assert cfg.machine_speakers == ("bot", "assistant")
    with pytest.raises(ValueError, match="machine_speakers"):
        IntrinsicConfig(machine_speakers=("assistant", " "))
    st = IntrinsicState(16, cfg)
    back = IntrinsicState.from_dict(orjson.loads(orjson.dumps(st.to_dict())))
    assert back.config.machine_speakers == ("bot", "assistant")


def test_a_restore_drops_the_disclosure_rate_of_a_machine_speaker() -> None:
    """A checkpoint written while the assistant's "I" still counted holds its rate of
    disclosures (mean factor > 1), which would push its turns down for a hundred more;
    restored under machine speakers, only the people's rates come back."""
    texts = [
        f"{who}: I think {i} plants are enough." for i in range(10) for who in ("ann", "assistant")
    ]
    vecs = ENC.encode(texts)
    old = IntrinsicState(128, IntrinsicConfig(machine_speakers=()))
    old.score_batch(["a"] * len(texts), texts, vecs, vecs, [False] * len(texts))
    assert {k.split("\x1f")[1] for k in old.disclosures} == {"ann", "assistant"}
    d = orjson.loads(orjson.dumps(old.to_dict()))
    back = IntrinsicState.from_dict(d, IntrinsicConfig())
    assert {k.split("\x1f")[1] for k in back.disclosures} == {"ann"}
    assert back.disclosures["a\x1fann"].mean == pytest.approx(old.disclosures["a\x1fann"].mean)
    kept = IntrinsicState.from_dict(d, IntrinsicConfig(machine_speakers=()))
    assert set(kept.disclosures) == set(old.disclosures)


def test_machine_speaker_turns_are_scored_without_the_disclosure_weight() -> None:
    """The same chat with the assistant's first-person answers: the weight lifts them
    over its other answers when the assistant is a person's name, not when it is a
    machine speaker; the user's disclosures are weighed either way."""
    enc = HashingEncoder(dim=64)
    texts: list[str] = []
    for i in range(30):
        texts.append(f"user: my garden has {i} tomato plants now.")
        texts.append(f"assistant: I would water {i} tomato plants daily.")
        texts.append(f"assistant: water {i} tomato plants daily.")
    vecs = enc.encode(texts)

    def scored(machines: tuple[str, ...]) -> list[IntrinsicScore]:
        st = IntrinsicState(64, IntrinsicConfig(disclosure=0.5, machine_speakers=machines))
        return st.score_batch(["a"] * len(texts), texts, vecs, vecs, [False] * len(texts))

    person, machine = scored(()), scored(("assistant",))
    assert [s.disclosure for s in person[1::3]] == [True] * 30
    assert [s.disclosure for s in machine[1::3]] == [False] * 30
    assert all(s.disclosure for s in machine[0::3])

    def said_over_plain(sc: list[IntrinsicScore]) -> float:
        return float(np.mean([s.info for s in sc[1::3]]) / np.mean([s.info for s in sc[2::3]]))

    assert said_over_plain(person) > 1.25 * said_over_plain(machine)


def test_disclosure_weighs_statements_about_the_speaker_within_each_speaker() -> None:
    """With the same words around them, turns in which the speaker tells something about
    itself score ``1 + disclosure`` times as much as its requests do; at 0 the same."""
    enc = HashingEncoder(dim=64)
    texts: list[str] = []
    for i in range(40):
        texts.append(f"user: my garden has {i} tomato plants now.")
        texts.append(f"user: what about {i} tomato plants in a garden?")
    vecs = enc.encode(texts)

    def ratio(weight: float) -> float:
        st = IntrinsicState(64, IntrinsicConfig(disclosure=weight))
        sc = st.score_batch(["a"] * len(texts), texts, vecs, vecs, [False] * len(texts))
        assert [s.disclosure for s in sc] == [weight > 0 and discloses(t) for t in texts]
        said = np.mean([s.info for s in sc[20::2]])
        asked = np.mean([s.info for s in sc[21::2]])
        return float(said / asked)

    base, weighted = ratio(0.0), ratio(0.5)
    assert weighted == pytest.approx(1.5 * base, rel=0.05)
    # the factor is relative to the speaker's own rate: one who always discloses is
    # scored as if the weight were off
    texts = [f"user: my garden has {i} tomato plants now." for i in range(40)]
    vecs = enc.encode(texts)
    on, off = (
        IntrinsicState(64, IntrinsicConfig(disclosure=w)).score_batch(
            ["a"] * 40, texts, vecs, vecs, [False] * 40
        )
        for w in (0.5, 0.0)
    )
    assert [s.info for s in on] == pytest.approx([s.info for s in off], rel=1e-9)
    st = IntrinsicState(64, IntrinsicConfig(disclosure=0.5))
    st.score_batch(["a"] * 40, texts, vecs, vecs, [False] * 40)
    back = IntrinsicState.from_dict(orjson.loads(orjson.dumps(st.to_dict())))
    assert {k: (r.mean, r.count) for k, r in back.disclosures.items()} == {
        k: (r.mean, r.count) for k, r in st.disclosures.items()
    }
    with pytest.raises(ValueError):
        IntrinsicConfig(disclosure=-0.1)


def test_the_guard_word_vector_weighs_rare_words_over_common_ones() -> None:
    """Two turns that share a rare word are closer in words than two that share only a
    word the tenant says all the time."""
    st = IntrinsicState(8, IntrinsicConfig())
    for i in range(200):
        st.tokens.learn(st.tokens.ids(f"really nice day number{i}"))
    a = st.lexical("alice: really, the Zanzibar trip was long")
    rare = st.lexical("bob: Zanzibar sounds far away")
    common = st.lexical("bob: really? sounds far away")
    assert a is not None and rare is not None and common is not None
    assert float(a @ rare) > 2.0 * float(a @ common)
    assert st.lexical(None) is None and st.lexical("bob: ...") is None
    assert IntrinsicState(8, IntrinsicConfig(lexical=0.0)).lexical("bob: Zanzibar") is None
    with pytest.raises(ValueError):
        IntrinsicConfig(lexical=1.5)


def test_a_turn_that_shares_no_words_with_its_neighbours_fits_them_less() -> None:
    """Two turns equally close in meaning to what came before: the one that repeats its
    neighbours' names and things fits better than one pasted from elsewhere once words
    count (``lexical`` > 0); on embeddings alone they fit alike."""
    rng = np.random.default_rng(3)
    dim = 16
    ctx = rng.normal(size=dim)
    ctx /= np.linalg.norm(ctx)
    history = ["alice: we drove to Porto with the kids and Rex"] * 3
    real = "bob: did Rex enjoy Porto with the kids?"
    pasted = "bob: my pottery class sold twelve vases yesterday"

    def fits(lexical: float) -> tuple[float, float]:
        out = []
        for turn in (real, pasted):
            st = IntrinsicState(dim, IntrinsicConfig(lexical=lexical, warmup=0))
            texts = [*history, turn]
            vecs = np.stack([ctx] * len(texts)).astype(np.float32)
            sc = st.score_batch(["a"] * len(texts), texts, vecs, vecs, [False] * len(texts))
            out.append(sc[-1].fit)
        return out[0], out[1]

    real0, pasted0 = fits(0.0)
    assert real0 == pytest.approx(pasted0)
    real5, pasted5 = fits(0.5)
    assert real5 > pasted5 + 0.2


def test_a_suspect_pending_at_a_checkpoint_is_vindicated_after_the_restart() -> None:
    """A turn vetoed as off-context waits for a reply that refers to it; a restart
    between the two (state saved and restored) must not lose the vindication."""
    dim = 16
    rng = np.random.default_rng(5)
    vecs = rng.normal(size=(40, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    texts = [f"alice: topic number {i} about thing{i}" for i in range(40)]
    st = IntrinsicState(dim, IntrinsicConfig(warmup=5, fit_k=5.0))
    ids = [f"m{i}" for i in range(40)]
    sc = st.score_batch(["a"] * 39, texts[:39], vecs[:39], vecs[:39], [False] * 39, ids[:39])
    vetoed = [ids[i] for i, x in enumerate(sc) if x.off_context]
    assert vetoed, "the strict margin vetoes unrelated turns"
    last = vetoed[-1]
    sus = next(x for x in st.suspects["a"] if x.memory_id == last)
    back = IntrinsicState.from_dict(orjson.loads(orjson.dumps(st.to_dict())), st.config)
    assert [x.memory_id for x in back.suspects["a"]] == [x.memory_id for x in st.suspects["a"]]
    reply = sus.vec[None, :]
    for state in (st, back):
        same = texts[ids.index(last)]  # the same words and meaning: it refers back
        out = state.score_batch(["a"], [same], reply, reply, [False], ["r"])
        assert last in [v[0] for v in out[0].vindicates]


FILLER = (
    "That is a great question. There are many things to consider here. "
    "It depends on what you like and what you need. "
)


def test_best_sentence_is_the_most_specific_sentence_per_token() -> None:
    tok = TokenSurprisal(n0=4.0)
    for _ in range(50):
        tok.learn(tok.ids("assistant: " + FILLER))
    text = "assistant: " + FILLER + "Of the 23 games, 12 were played at Arrowhead Stadium."
    ids = tok.ids(text)
    whole = tok.surprisal(ids)
    best = tok.best_sentence(text, ids)
    fact = "Of the 23 games, 12 were played at Arrowhead Stadium."
    assert best == pytest.approx(tok.surprisal(tok.ids(fact)))
    assert best > 1.15 * whole
    one = "my sister moved to Lisbon"  # no prefix, one sentence: its own best sentence
    assert tok.best_sentence(one, tok.ids(one)) == pytest.approx(tok.surprisal(tok.ids(one)))
    assert tok.best_sentence("", tok.ids("")) == 0.0


def test_sentence_weight_lifts_a_long_answer_with_one_fact() -> None:
    """Per token over the whole text, a fact inside generic sentences is diluted; with
    the sentence mix the answer's information rises, a one-sentence turn's hardly."""
    enc = HashingEncoder(dim=32)
    warm = ["assistant: " + FILLER, "user: what do you think about that"] * 30
    long = "assistant: " + FILLER + "Of the 23 games, 12 were played at Arrowhead Stadium."
    short = "user: my sister moved to Lisbon"

    def infos(w: float) -> tuple[float, float]:
        st = IntrinsicState(
            32,
            IntrinsicConfig(sentence_weight=w, speaker_pooling=0.0, disclosure=0.0, lexical=0.0),
        )
        v = enc.encode(warm)
        st.score_batch(["a"] * len(warm), warm, v, v, [False] * len(warm))
        tx = [long, short]
        v = enc.encode(tx)
        sc = st.score_batch(["a", "a"], tx, v, v, [False, False])
        return sc[0].info, sc[1].info

    (l0, s0), (l5, s5) = infos(0.0), infos(0.5)
    assert l5 > 1.05 * l0
    assert s5 == pytest.approx(s0, rel=0.25)
    with pytest.raises(ValueError, match="sentence_weight"):
        IntrinsicConfig(sentence_weight=1.5)


def test_a_checkpoint_without_the_sentence_mix_restarts_the_information_mean() -> None:
    enc = HashingEncoder(dim=32)
    texts = ["user: my sister moved to Lisbon last spring. It rained.", "assistant: nice"] * 5
    vecs = enc.encode(texts)
    old = IntrinsicState(32, IntrinsicConfig(sentence_weight=0.0))
    old.score_batch(["a"] * len(texts), texts, vecs, vecs, [False] * len(texts))
    d = orjson.loads(orjson.dumps(old.to_dict()))
    del d["config"]["sentence_weight"]  # as a checkpoint from before the knob
    assert IntrinsicState.from_dict(d, IntrinsicConfig()).info_mean.count == 0
    same = IntrinsicState.from_dict(d, IntrinsicConfig(sentence_weight=0.0))
    assert same.info_mean.count == old.info_mean.count


@pytest.mark.parametrize(
    "text",
    [
        "user: 3.5 apples! it's 12:30? yes",
        "İstanbul. Kelvin \u212a and Straße.\nΣ emoji 🙂 ok",
        "user: ",
        "assistant: line one\nline two. line three!",
        "no prefix at all",
    ],
)
def test_best_sentence_reads_every_token_once(text: str) -> None:
    """The sentences' tokens are the text's tokens after the prefix, in order: each
    sentence's slice of the per-token surprisals is its own."""
    tok = TokenSurprisal(n0=4.0)
    tok.learn(tok.ids("user: apples and pears. it's noon"))
    ids = tok.ids(text)
    m = SPEAKER_PREFIX.match(text)
    body = text[m.end() :] if m else text
    per = [tok.ids(x) for x in _SENTENCE.findall(body)]
    pre = tok.ids(text[: m.end()]) if m else np.zeros(0, dtype=np.int64)
    assert np.array_equal(np.concatenate([pre, *per]) if per else pre, ids)
    want = max((tok.surprisal(p) for p in per if p.size), default=0.0)
    assert tok.best_sentence(text, ids) == pytest.approx(want)


def _topic_stream(share: float, seed: int = 2) -> list[tuple[np.ndarray, bool]]:
    """Loosely coherent talk (a topic per 12 turns) with unrelated turns injected at
    ``share`` from the first turn on: (unit vector, injected)."""
    rng = np.random.default_rng(11)
    dim = 64
    topics = rng.normal(size=(30, dim))
    g = np.random.default_rng(seed)
    out = []
    for t in range(30):
        for _ in range(12):
            out.append((topics[t] + 1.6 * g.normal(size=dim), False))
            if g.random() < share:
                out.append((g.normal(size=dim) * 1.2, True))
    return [((v / np.linalg.norm(v)).astype(np.float32), inj) for v, inj in out]


def _recheck_run(
    share: float, recheck: bool = True, restart_at: int | None = None
) -> tuple[dict[str, bool], set[str], set[str], set[str]]:
    """One run: (id -> injected for the turns the cold guard let through, the ids
    retracted, the ids on probation at ``restart_at``, the ids retracted after it)."""
    cfg = IntrinsicConfig(
        warmup=5, hist_warmup=50, lookahead=3, off_posterior=2 / 3, recheck_cold=recheck
    )
    st = IntrinsicState(64, cfg)
    g = np.random.default_rng(3)
    cold_pass, retracted, held, after = {}, set(), set(), set()
    for i, (v, inj) in enumerate(_topic_stream(share)):
        if restart_at is not None and i == restart_at:
            held = {p.memory_id for p in st.probation.get("a", ())}
            st = IntrinsicState.from_dict(orjson.loads(orjson.dumps(st.to_dict())), cfg)
            assert {p.memory_id for p in st.probation["a"]} == held
        mid = f"m{i}"
        cold = st._unrelated() is None or not st.contamination.warm
        [x] = st.score_batch(
            ["a"], [f"word{g.integers(500)} x{g.integers(500)}"], v[None, :], v[None, :],
            [False], [mid],
        )  # fmt: skip
        if cold and not x.off_context:
            cold_pass[mid] = inj
        retracted |= {m for m, _ in x.retracts}
        if restart_at is not None and i >= restart_at:
            after |= {m for m, _ in x.retracts}
    return cold_pass, retracted, held, after


def test_turns_the_cold_guard_let_through_are_judged_again_once_it_is_warm() -> None:
    """A stream contaminated from its first turn: the guard has no yardstick for its
    first turns and lets injected ones through; once warm, it takes most of those back
    and few of the real ones, and never a turn judged warm."""
    cold_pass, retracted, _, _ = _recheck_run(0.5)
    cold_inj = {m for m, inj in cold_pass.items() if inj}
    cold_real = {m for m, inj in cold_pass.items() if not inj}
    assert len(cold_inj) >= 10, cold_pass
    assert retracted <= set(cold_pass)  # only the cold guard's calls are revisited
    assert len(retracted & cold_inj) >= 0.5 * len(cold_inj), (retracted, cold_inj)
    assert len(retracted & cold_real) <= 0.2 * len(cold_real), (retracted, cold_real)
    # off: the cold guard's call is final
    assert _recheck_run(0.5, recheck=False)[1] == set()


def test_a_clean_stream_loses_few_turns_to_the_second_look() -> None:
    cold_pass, retracted, _, _ = _recheck_run(0.0)
    assert len(cold_pass) >= 30
    assert len(retracted) <= 0.1 * len(cold_pass), retracted


def test_turns_on_probation_survive_a_checkpoint() -> None:
    """A restart while the guard is still cold keeps the turns waiting for its second
    look (the checkpoint holds them), and the restored state still takes them back."""
    cold_pass, _, _, _ = _recheck_run(0.5)
    restart = int(sorted(cold_pass, key=lambda m: int(m[1:]))[-1][1:]) - 5  # still cold
    _, _, held, after = _recheck_run(0.5, restart_at=restart)
    assert held, "turns on probation at the restart"
    assert after & held, (after, held)


def test_probation_is_bounded_released_and_checkpointed_only_when_on() -> None:
    """A tenant that never warms up holds at most `PROBATION_MAX` turns; a turn the
    write path releases (dropped, or forgotten) leaves; a state with the second look
    off writes no probation into its checkpoint and reads none back."""
    from operators.surprise import PROBATION_MAX

    cfg = IntrinsicConfig(warmup=5, hist_warmup=10**6, recheck_cold=True)  # never warm
    st = IntrinsicState(64, cfg)
    rng = np.random.default_rng(4)
    n = 2 * PROBATION_MAX
    for i in range(n):  # one agent per 8 turns: short conversations
        v = rng.normal(size=64).astype(np.float32)
        v /= np.linalg.norm(v)
        st.score_batch([f"a{i // 8}"], [f"w{i} x{i % 7}"], v[None, :], v[None, :], [False],
                       [f"m{i}"])  # fmt: skip
    held = st.probation_ids()
    assert st.probation_size == len(held) == PROBATION_MAX
    assert f"m{n - 1}" in held and "m1" not in held  # the oldest were let through
    st.release(f"m{n - 1}")
    st.release(f"m{n - 2}", f"a{(n - 2) // 8}", newest=True)
    assert st.probation_size == PROBATION_MAX - 2
    # the same id twice (a copy sent again): releasing the newest keeps the original
    last = f"a{(n - 1) // 8}"
    orig = st.probation[last][-1]
    st.probation[last].append(dataclasses.replace(orig))
    st.release(orig.memory_id, last, newest=True)
    assert st.probation[last][-1] is orig and st.probation_size == PROBATION_MAX - 2
    assert not {f"m{n - 1}", f"m{n - 2}"} & set(st.probation_ids())
    d = orjson.loads(orjson.dumps(st.to_dict()))
    assert len([x for q in d["probation"].values() for x in q]) == PROBATION_MAX - 2
    back = IntrinsicState.from_dict(d, cfg)
    assert back.probation_size == PROBATION_MAX - 2
    off = IntrinsicState.from_dict(d, IntrinsicConfig())  # the second look switched off
    assert off.probation_size == 0 and "probation" not in off.to_dict()


def test_no_update_where_every_pair_is_as_unrelated_as_the_level() -> None:
    """States as one-hot vectors (every pair at cosine 0, no shared words): the level's
    spread is 0, and no turn is the update of another (at >= it, every one was)."""
    st = IntrinsicState(16)
    texts = [f"state{i}" for i in range(12)]
    vecs = np.eye(16, dtype=np.float32)[:12]
    out = []
    for i in range(12):
        out += st.score_batch(["a"], [texts[i]], vecs[i : i + 1], vecs[i : i + 1], [False],
                              [f"a-{i}"])  # fmt: skip
    assert all(x.updates is None for x in out)
