"""RPE normalisation (tenant scale, warm-up, before-fold) and per-agent smoothing."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from operators.rpe import AgentSmoother, RpeNormalizer, valence


def test_valence() -> None:
    assert valence(0.3) == 1
    assert valence(-0.3) == -1
    assert valence(0.0) == 0
    assert valence(1e-12) == 0
    assert valence(1e-3, eps=1e-2) == 0


def test_warmup_uses_batch_scale_for_large_rewards() -> None:
    norm = RpeNormalizer(warmup=32)
    z = norm.normalize(np.array([100.0, -100.0, 100.0, -100.0]))
    np.testing.assert_allclose(z, [1.0, -1.0, 1.0, -1.0])
    assert norm.sigma == pytest.approx(100.0)


def test_sigma_taken_before_folding_batch() -> None:
    rng = np.random.default_rng(0)
    norm = RpeNormalizer(alpha=0.01, warmup=32)
    for _ in range(20):
        norm.normalize(rng.normal(0.0, 1.0, 64))
    sigma = norm.sigma
    assert sigma == pytest.approx(1.0, rel=0.2)
    z = norm.normalize(np.array([50.0]))
    assert z[0] == pytest.approx(50.0 / sigma)  # not diluted by itself
    assert norm.sigma > sigma  # ...but folded in afterwards


def test_tracks_scale_change() -> None:
    rng = np.random.default_rng(1)
    norm = RpeNormalizer(alpha=0.01)
    norm.normalize(rng.normal(0.0, 1.0, 2000))
    norm.normalize(rng.normal(0.0, 10.0, 2000))
    assert norm.sigma == pytest.approx(10.0, rel=0.2)
    z = norm.normalize(rng.normal(0.0, 10.0, 5000))
    assert float(np.std(z)) == pytest.approx(1.0, rel=0.2)


def test_normalizer_roundtrip_and_validation() -> None:
    rng = np.random.default_rng(2)
    a = RpeNormalizer(alpha=0.05, warmup=8)
    a.normalize(rng.normal(0.0, 3.0, 20))
    b = RpeNormalizer.from_dict(json.loads(json.dumps(a.to_dict())))
    batch = rng.normal(0.0, 3.0, 10)
    np.testing.assert_array_equal(a.normalize(batch), b.normalize(batch))
    assert a.to_dict() == b.to_dict()
    assert a.normalize(np.array([])).shape == (0,)
    with pytest.raises(ValueError):
        a.normalize(np.array([math.nan]))
    with pytest.raises(ValueError):
        RpeNormalizer(alpha=0.0)


def test_smoother_relative_to_agent_level() -> None:
    calm, turbulent = AgentSmoother(kappa=0.25), AgentSmoother(kappa=0.25)
    for _ in range(200):
        calm.smooth(0.1)
        turbulent.smooth(-4.0)
    assert turbulent.ema == pytest.approx(4.0)
    assert turbulent.smooth(4.0) == pytest.approx(4.0 / (1.0 + 0.25 * 4.0))
    assert calm.smooth(-4.0) == pytest.approx(4.0 / (1.0 + 0.25 * 0.1))
    assert calm.smooth(4.0) < 4.0 / (1.0 + 0.25 * 0.1)  # the EMA moved after scoring


def test_smoother_first_score_and_kappa_zero() -> None:
    sm = AgentSmoother()
    assert sm.smooth(-2.5) == 2.5  # no history: judged on its own
    raw = AgentSmoother(kappa=0.0)
    zs = np.random.default_rng(3).normal(0.0, 2.0, 50)
    np.testing.assert_allclose(raw.smooth_many(zs), np.abs(zs))


def test_smoother_roundtrip_and_validation() -> None:
    a = AgentSmoother(alpha=0.1, kappa=0.5)
    for z in (1.0, -3.0, 0.5):
        a.smooth(z)
    b = AgentSmoother.from_dict(json.loads(json.dumps(a.to_dict())))
    assert [a.smooth(z) for z in (2.0, -1.0)] == [b.smooth(z) for z in (2.0, -1.0)]
    with pytest.raises(ValueError):
        AgentSmoother(kappa=1.5)
    with pytest.raises(ValueError):
        a.smooth(math.inf)


def test_reward_surprise_sparse_heavy_tailed() -> None:
    """+1..+25 gains and a rare -100 among zeros: every reward stands out, zeros score 0,
    and the -100 does not push the small gains back into the bulk (issue 13)."""
    from operators.rpe import RewardSurprise

    rng = np.random.default_rng(7)
    rs = RewardSurprise()
    r = np.zeros(3000)
    gains = rng.random(3000) < 0.12
    r[gains] = rng.integers(1, 26, int(gains.sum()))
    r[rng.random(3000) < 0.005] = -100.0
    s = np.concatenate([rs.score_many(r[i : i + 64]) for i in range(0, 3000, 64)])
    late = slice(500, None)
    assert rs.usual() == 0.0
    assert float(s[late][r[late] == 0].max()) == 0.0
    small = s[late][(r[late] >= 1) & (r[late] <= 3)]
    assert small.size and float(small.min()) > 0.1  # past any mundane bulk edge
    assert float(s[late][r[late] == -100].min()) > 10 * float(small.max())


def test_reward_surprise_dense_rewards_defer_to_td() -> None:
    from operators.rpe import RewardSurprise

    rs = RewardSurprise()
    s = rs.score_many(np.random.default_rng(8).normal(0.0, 1.0, 500))
    # from the third distinct value on no value holds half the weight: TD error alone
    assert rs.usual() is None and float(np.abs(s[3:]).max()) == 0.0


def test_reward_surprise_step_costs_and_roundtrip() -> None:
    from operators.rpe import RewardSurprise, extrinsic_score

    rs = RewardSurprise()
    r = np.full(400, -1.0)
    r[::20] = -10.0
    r[7] = 20.0
    for i in range(0, 400, 50):
        rs.score_many(r[i : i + 50])
    assert rs.usual() == -1.0
    assert rs.score(-1.0) == 0.0 and rs.score(20.0) > rs.score(-10.0) > 1.0
    back = RewardSurprise.from_dict(json.loads(json.dumps(rs.to_dict())))
    assert back.to_dict() == rs.to_dict()
    assert extrinsic_score(0.2, 1.5) == 1.5 and extrinsic_score(2.0, 0.0) == 2.0
    with pytest.raises(ValueError):
        RewardSurprise(alpha=0.0)


def test_outcome_baseline_usual_outcomes_reveal_nothing() -> None:
    from operators.rpe import OutcomeBaseline

    b = OutcomeBaseline()
    assert b.surprise(100.0) is None  # no baseline yet
    for x in [100.0, 0.0, 100.0, 25.0, 100.0, 0.0] * 10:
        b.observe(x)
    usual = b.surprise(b.mean)
    assert usual is not None and abs(usual) < 1e-9
    hi, lo = b.surprise(100.0), b.surprise(0.0)
    assert hi is not None and lo is not None and hi > 0 > lo
    assert abs(hi) < 2.0 and abs(lo) < 2.0  # ordinary outcomes stay ordinary
    big = b.surprise(1000.0)
    assert big is not None and big > 10.0
    same = OutcomeBaseline()
    for _ in range(5):
        same.observe(1.0)
    assert same.surprise(1.0) == 0.0 and same.surprise(2.0) is None
    back = OutcomeBaseline.from_dict(json.loads(json.dumps(b.to_dict())))
    assert back.to_dict() == b.to_dict()


def test_reward_surprise_does_not_depend_on_batching() -> None:
    from operators.rpe import RewardSurprise

    r = np.zeros(600)
    r[::9] = 8.0
    r[100] = -100.0
    a, b = RewardSurprise(), RewardSurprise()
    one = a.score_many(r)
    many = np.concatenate([b.score_many(r[i : i + 37]) for i in range(0, 600, 37)])
    np.testing.assert_allclose(one, many)
    assert float(one[9]) > 1.0  # the first non-zero reward already stands out


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=30),
    warmup=st.sampled_from([0, 4, 32]),
)
def test_scale_is_batch_invariant(seed: int, sizes: list[int], warmup: int) -> None:
    """Normalising a stream in any cut gives what normalising its deltas one at a time
    gives, and the same state (warm-up included): no delta is scaled by later ones."""
    rng = np.random.default_rng(seed)
    deltas = np.concatenate([rng.normal(0.0, 1.0, 150), rng.normal(0.0, 30.0, 50)])
    one, cut = RpeNormalizer(warmup=warmup), RpeNormalizer(warmup=warmup)
    singles = np.concatenate([one.normalize(deltas[i : i + 1]) for i in range(len(deltas))])
    parts, i = [], 0
    for k in [*sizes, len(deltas)]:
        parts.append(cut.normalize(deltas[i : i + k]))
        i += k
    np.testing.assert_array_equal(np.concatenate(parts)[: len(deltas)], singles)
    assert cut.to_dict() == one.to_dict()
    assert np.abs(singles).max() > 5.0  # the burst is measured against the calm before it


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), zeros=st.integers(0, 300), c=st.sampled_from([1e-3, 1e3]))
@example(seed=0, zeros=100, c=1e-3)
def test_z_does_not_depend_on_the_unit_of_the_deltas(seed: int, zeros: int, c: float) -> None:
    """z is a ratio: the same deltas in another unit (rewards 1,000 times smaller or
    larger) give the same z, the first non-zero delta after a run of exact zeros (a
    tenant quiet until its first reward: no scale known yet) included."""
    rng = np.random.default_rng(seed)
    live = rng.choice([-1.0, 1.0], 60) * rng.uniform(0.1, 10.0, 60) * (rng.random(60) < 0.3)
    deltas = np.concatenate([np.zeros(zeros), live])
    z = RpeNormalizer().normalize(deltas)
    np.testing.assert_allclose(RpeNormalizer().normalize(deltas * c), z, rtol=1e-9)
    first = np.flatnonzero(deltas)[:1]  # measured against the deltas, not the floor
    assert np.abs(z[first]).max(initial=0.0) <= 10.0 + 1e-9
