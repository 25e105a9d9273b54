"""Decayed quantile sketch: accuracy vs numpy, decay tracking, merge, serialisation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from operators.sketch import DecayedQuantileSketch

QS = [0.1, 0.5, 0.9, 0.99]


def _samples(name: str, n: int = 20_000) -> np.ndarray:
    rng = np.random.default_rng(42)
    if name == "exponential":
        return rng.exponential(1.0, n)
    if name == "lognormal":
        return rng.lognormal(0.0, 1.0, n)
    if name == "uniform":
        return rng.uniform(0.0, 10.0, n)
    if name == "bimodal":
        return np.abs(
            np.concatenate([rng.normal(1.0, 0.2, 14 * n // 20), rng.normal(8.0, 1.0, 6 * n // 20)])
        )
    raise AssertionError(name)


def _bin_width_at(sk: DecayedQuantileSketch, x: float) -> float:
    i = min(int(np.searchsorted(sk.edges, x, side="right")) - 1, sk.bins - 1)
    return float(sk.edges[i + 1] - sk.edges[i])


@pytest.mark.parametrize("dist", ["exponential", "lognormal", "uniform", "bimodal"])
def test_quantiles_match_numpy(dist: str) -> None:
    x = _samples(dist)
    sk = DecayedQuantileSketch(half_life=math.inf)
    sk.add_many(x)
    assert sk.count == x.size
    assert sk.total_weight == pytest.approx(x.size)
    for q in QS:
        est, true = sk.quantile(q), float(np.quantile(x, q))
        assert abs(est - true) <= max(0.02 * true, _bin_width_at(sk, true)), (q, est, true)
    # rank is the inverse of quantile
    for q in QS:
        assert sk.rank(float(np.quantile(x, q))) == pytest.approx(q, abs=0.01)
    med, mad = sk.median_mad()
    true_med = float(np.median(x))
    assert med == pytest.approx(true_med, rel=0.02)
    assert mad == pytest.approx(float(np.median(np.abs(x - true_med))), rel=0.03)


def test_add_equals_add_many_with_decay() -> None:
    x = _samples("lognormal", 3000)
    a, b = DecayedQuantileSketch(half_life=100.0), DecayedQuantileSketch(half_life=100.0)
    for v in x:
        a.add(float(v))
    b.add_many(x)
    np.testing.assert_allclose(a.to_dict()["weights"], b.to_dict()["weights"], rtol=1e-9)
    assert a.quantile(0.9) == pytest.approx(b.quantile(0.9), rel=1e-9)


def test_decay_tracks_shifted_distribution() -> None:
    rng = np.random.default_rng(1)
    old, new = rng.exponential(1.0, 10_000), rng.exponential(1.0, 10_000) + 10.0
    decayed = DecayedQuantileSketch(half_life=500.0)
    frozen = DecayedQuantileSketch(half_life=math.inf)
    for sk in (decayed, frozen):
        sk.add_many(old)
        sk.add_many(new)
    assert decayed.quantile(0.1) == pytest.approx(np.quantile(new, 0.1), rel=0.05)
    assert decayed.quantile(0.5) == pytest.approx(np.quantile(new, 0.5), rel=0.03)
    assert frozen.quantile(0.1) < 1.0  # without decay the old mass still dominates q0.1
    # effective weight ~ half_life / ln 2 after many observations
    assert decayed.total_weight == pytest.approx(500.0 / math.log(2), rel=0.02)
    assert decayed.count == 20_000


def test_half_life_semantics() -> None:
    sk = DecayedQuantileSketch(half_life=10.0)
    sk.add(1.0)
    sk.add_many([5.0] * 10)
    # the first observation now weighs half of a fresh one
    assert sk.total_weight == pytest.approx(0.5 + sum(2 ** (-k / 10) for k in range(10)))


def test_long_stream_does_not_overflow() -> None:
    sk = DecayedQuantileSketch(half_life=5.0)
    sk.add_many(np.full(50_000, 2.0))
    for _ in range(2000):
        sk.add(3.0)
    assert math.isfinite(sk.total_weight)
    assert sk.quantile(0.5) == pytest.approx(3.0, rel=0.02)


def test_out_of_range_and_extremes() -> None:
    sk = DecayedQuantileSketch(half_life=math.inf, hi=10.0)
    sk.add_many([0.0, 1.0, 2.0, 100.0, 500.0])
    assert sk.quantile(0.0) == 0.0
    assert sk.quantile(1.0) == 500.0
    assert 10.0 <= sk.quantile(0.9) <= 500.0
    assert sk.rank(1000.0) == 1.0 and sk.rank(0.0) == 0.0
    with pytest.raises(ValueError):
        sk.add(float("nan"))
    empty = DecayedQuantileSketch()
    assert math.isnan(empty.quantile(0.5)) and math.isnan(empty.rank(1.0))


def test_roundtrip_json_preserves_queries_and_continues_identically() -> None:
    x = _samples("bimodal", 5000)
    for hl in (math.inf, 300.0):
        sk = DecayedQuantileSketch(half_life=hl)
        sk.add_many(x)
        d = json.loads(json.dumps(sk.to_dict(), allow_nan=False))
        back = DecayedQuantileSketch.from_dict(d)
        assert back.count == sk.count and back.half_life == sk.half_life
        np.testing.assert_allclose(back.quantiles(QS), sk.quantiles(QS), rtol=1e-12)
        assert back.median_mad() == pytest.approx(sk.median_mad(), rel=1e-12)
        back.add_many(x[:100])
        sk.add_many(x[:100])
        np.testing.assert_allclose(back.quantiles(QS), sk.quantiles(QS), rtol=1e-9)


def test_merge_equals_single_sketch() -> None:
    x = _samples("exponential", 8000)
    whole, a, b = (DecayedQuantileSketch(half_life=math.inf) for _ in range(3))
    whole.add_many(x)
    a.add_many(x[:3000])
    b.add_many(x[3000:])
    a.merge(b)
    assert a.count == whole.count
    np.testing.assert_allclose(a.quantiles(QS), whole.quantiles(QS), rtol=1e-9)
    with pytest.raises(ValueError):
        a.merge(DecayedQuantileSketch(bins=64))


def test_constructor_validation() -> None:
    for kwargs in ({"bins": 1}, {"lo": 5.0, "hi": 1.0}, {"half_life": 0.0}, {"lo": -1.0}):
        with pytest.raises(ValueError):
            DecayedQuantileSketch(**kwargs)  # type: ignore[arg-type]


def _sketches() -> list[DecayedQuantileSketch]:
    """Sketches of several shapes: spread, atoms, one value, tiny values, outliers."""
    rng = np.random.default_rng(7)
    shapes = [
        np.abs(rng.standard_normal(300)),
        rng.choice([0.0, 1.0, 2.5], 200),
        np.full(50, 1.7),
        rng.exponential(0.01, 200),
        np.concatenate([np.zeros(100), [40.0, 70.0, 90.0]]),
        rng.uniform(0.0, 70.0, 200),
    ]
    out = []
    for xs, hl in zip(shapes, [50.0, 5000.0, math.inf, 50.0, 5000.0, math.inf], strict=True):
        sk = DecayedQuantileSketch(half_life=hl)
        for x in xs:
            sk.add(float(x))
        out.append(sk)
    return out


@pytest.mark.parametrize("i", range(6))
def test_mad_solves_its_equation_on_the_sketch_cdf(i: int) -> None:
    """MAD is the d with rank(m + d) - rank(m - d) = 1/2 on the sketch's own CDF
    (`rank` evaluates it independently of median_mad), or 0 / the full reach where
    the CDF's atoms make 1/2 unreachable."""
    sk = _sketches()[i]
    med, mad = sk.median_mad()
    assert med == sk.quantile(0.5)
    reach = max(sk.max - med, med - sk.min, 0.0)
    assert 0.0 <= mad <= reach

    def g(d: float) -> float:
        return sk.rank(med + d) - sk.rank(med - d)

    if 0.0 < mad < reach:
        assert g(mad) == pytest.approx(0.5, abs=1e-9)
    elif mad == 0.0:
        assert g(0.0) >= 0.5 - 1e-9 or g(1e-12) >= 0.5 - 1e-9
    else:
        assert g(reach * (1 - 1e-9)) <= 0.5 + 1e-9
