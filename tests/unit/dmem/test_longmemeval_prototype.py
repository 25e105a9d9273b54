"""The prototype conversation scores measured with the LongMemEval bench
(`operators.conversation_score`)."""

from __future__ import annotations

import numpy as np

from operators.conversation_score import (
    SpeakerSurprisal,
    TopSurprisal,
    install,
    shadow_clusters,
    shadow_groups,
)
from operators.decay import DAY_MS, MaintenancePolicy, horizons
from operators.surprise import AgentRewardMix, IntrinsicState, TokenSurprisal

FILLER = "here is a long and helpful answer with many of the usual words " * 8


def score(model: TokenSurprisal, text: str) -> float:
    ids = model.ids(text)
    s = model.surprisal(ids)
    model.learn(ids)
    return s


def warm(model: TokenSurprisal) -> None:
    for _ in range(50):
        score(model, "assistant: " + FILLER)
        score(model, "user: can you help me with my plan for the week")


def test_sum_ranks_by_length_mean_by_content() -> None:
    fact = "user: The play I attended was The Glass Menagerie"
    long = "assistant: " + FILLER
    plain, mean = TokenSurprisal(), TokenSurprisal(n0=4.0)
    warm(plain)
    warm(mean)
    assert score(plain, long) > score(plain, fact)
    assert score(mean, fact) > score(mean, long)


def test_top_m_caps_what_length_adds() -> None:
    top = TopSurprisal(m=4)
    warm(top)
    short = score(top, "user: my sister Maya moved to Lisbon")
    longer = score(top, "user: my sister Maya moved to Lisbon " + FILLER)
    assert longer <= short * 1.5


def test_speaker_surprisal_judges_each_speaker_by_its_own_mean() -> None:
    sp = SpeakerSurprisal()
    warm(sp)
    assert set(sp.means) == {"assistant", "user"}
    a = score(sp, "assistant: " + FILLER)
    u = score(sp, "user: can you help me with my plan for the week")
    assert 0.5 < a < 2.0 and 0.5 < u < 2.0


def test_install_swaps_the_information_term() -> None:
    st = IntrinsicState(8)
    assert st.tokens.n0 == 4.0  # the write path's term: per token
    install(st, "sum")
    assert st.tokens.n0 is None
    install(st, "topm", m=4)
    assert isinstance(st.tokens, TopSurprisal) and st.tokens.m == 4


def test_reward_mix_per_agent() -> None:
    mix = AgentRewardMix()
    rewards = np.zeros(42)
    rewards[[13, 27]] = 1.0
    w = mix.observe(["grid"] * 42, rewards)
    assert w[-1] == 0.0
    w = mix.observe(["chat", "grid"], np.zeros(2))
    assert w[0] == 1.0 and w[1] == 0.0


def test_shadow_groups_by_session_and_size() -> None:
    sess = [0, 0, 0, 0, 0, 1, 1, 1]
    assert shadow_groups([0, 1, 3, 4, 5, 6, 7], sess, 2) == [[0, 1], [3, 4], [5, 6], [7]]
    assert shadow_groups([0, 1, 3, 4], sess, 8) == [[0, 1], [3, 4]]
    assert shadow_groups([0, 1, 3, 4], sess, 8, consecutive=False) == [[0, 1, 3, 4]]


def test_shadow_clusters_fold_by_topic() -> None:
    a, b = np.eye(4)[0], np.eye(4)[1]
    vecs = np.stack([a, b, a, b, a])
    assert shadow_clusters(range(5), vecs, 8, 0.5) == [[0, 2, 4], [1, 3]]
    assert shadow_clusters(range(5), vecs, 2, 0.5) == [[0, 2], [1, 3], [4]]


def test_span_horizons_never_shorter_than_the_defaults() -> None:
    p = MaintenancePolicy()
    h, ttl = horizons(np.array([DAY_MS, 90 * DAY_MS]), p)
    assert h.tolist() == [p.half_life_ms, 90 * DAY_MS]
    assert ttl.tolist() == [p.buffer_ttl_ms, 90 * DAY_MS]
    h0, _ = horizons(90 * DAY_MS, MaintenancePolicy(span_factor=0.0))
    assert float(h0) == p.half_life_ms
