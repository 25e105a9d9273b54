"""Gate routing at/around thresholds, outlier rule, warm-up, validation, state round-trip."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.gate import Gate, GateState, sigmoid


def _primed(gate: Gate, xs: np.ndarray) -> GateState:
    state = gate.new_state()
    state.sketch.add_many(xs)
    return state


def test_fixed_gate_boundaries_and_strength() -> None:
    gate = Gate.fixed(1.0, 2.0, alpha=2.0, beta=2.0)
    state = gate.new_state()
    cases = [
        (0.0, "drop", "below_low"),
        (0.999, "drop", "below_low"),
        (1.0, "buffer", "between"),
        (1.999, "buffer", "between"),
        (2.0, "core", "above_high"),
        (7.5, "core", "above_high"),
    ]
    for score, route, reason in cases:
        d = gate.decide(state, score)
        assert (d.route, d.reason) == (route, reason), score
        assert (d.theta_low, d.theta_high) == (1.0, 2.0)
        assert d.score == score
        assert d.gate == pytest.approx(1.0 / (1.0 + math.exp(-(2.0 * score - 2.0))))
    assert gate.decide(state, 1.0).gate == pytest.approx(0.5)
    assert state.count == len(cases) + 1


def test_percentile_thresholds_and_routes_around_them() -> None:
    rng = np.random.default_rng(0)
    gate = Gate.percentile(q_low=0.5, q_high=0.9, floor=0.5, half_life=math.inf)
    base = rng.uniform(0.0, 4.0, 20_000)
    t_low, t_high = gate.thresholds(_primed(gate, base))
    assert t_low == pytest.approx(2.0, rel=0.03)
    assert t_high == pytest.approx(3.6, rel=0.03)
    expect = [
        (t_high, "core", "above_high"),
        (t_high * 0.999, "buffer", "between"),
        (t_low, "buffer", "between"),
        (t_low * 0.999, "drop", "below_low"),
        (0.49, "drop", "below_floor"),
    ]
    for score, route, reason in expect:
        state = _primed(gate, base)  # fresh copy so each case sees the same thresholds
        d = gate.decide(state, score)
        assert (d.route, d.reason) == (route, reason), score
        assert (d.theta_low, d.theta_high) == (t_low, t_high)
        assert state.count == base.size + 1


def test_floor_lifts_thresholds_for_quiet_tenant() -> None:
    gate = Gate.percentile(floor=0.5, half_life=math.inf, warmup=10)
    state = _primed(gate, np.random.default_rng(1).uniform(0.0, 0.2, 1000))
    t_low, t_high = gate.thresholds(state)
    # the bulk edge (median + 3 * 1.4826 * MAD ~ 0.32) lies past every score of the
    # stream: nothing of a quiet tenant's bulk is kept, and core still needs the floor
    assert 0.2 < t_low < 0.5 and t_high == 0.5
    assert gate.decide(state, 0.19).route == "drop"
    assert gate.decide(state, 0.19).reason == "below_floor"
    assert gate.decide(state, 0.5).route == "core"


def test_decision_uses_thresholds_before_adding_score() -> None:
    gate = Gate.percentile(q_low=0.5, q_high=0.9, floor=0.0, half_life=math.inf, warmup=2)
    state = _primed(gate, np.array([1.0, 2.0, 3.0]))
    before = gate.thresholds(state)
    d = gate.decide(state, 100.0)
    assert (d.theta_low, d.theta_high) == before
    assert d.route == "core"
    assert gate.thresholds(state) != before  # ...and the score was learned afterwards


def test_warmup_rule() -> None:
    gate = Gate.percentile(floor=0.5, warmup=5, warmup_core_factor=3.0)
    state = gate.new_state()
    got = [(d.route, d.reason) for d in gate.decide_many(state, [0.49, 0.5, 1.49, 1.5, 9.0])]
    assert got == [
        ("drop", "warmup"),
        ("buffer", "warmup"),
        ("buffer", "warmup"),
        ("core", "warmup"),
        ("core", "warmup"),
    ]
    assert gate.decide(state, 9.0).reason != "warmup"


def _cliff_stream(n: int, p_cliff: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    cliff = rng.random(n) < p_cliff
    scores = np.where(cliff, rng.uniform(9.0, 11.0, n), np.abs(rng.normal(1.0, 0.1, n)))
    return scores, cliff


def test_outlier_rule_keeps_frequent_surprises_in_core() -> None:
    scores, cliff = _cliff_stream(3000, 0.3, seed=2)
    with_rule = Gate.percentile(outlier_k=3.0)
    without = Gate.percentile(outlier_k=1e9)
    routes = {}
    for name, gate in (("with", with_rule), ("without", without)):
        ds = gate.decide_many(gate.new_state(), scores)[100:]
        routes[name] = np.array([d.route for d in ds])
        if name == "with":
            reasons = {d.reason for d, c in zip(ds, cliff[100:], strict=True) if c}
            assert "outlier" in reasons
    c = cliff[100:]
    core_with = np.mean(routes["with"][c] == "core")
    core_without = np.mean(routes["without"][c] == "core")
    assert core_with > 0.99
    assert core_without < 0.8  # q0.9 sits inside the cliff mass: many cliffs buffered
    # ordinary steps are not promoted by the rule
    assert np.mean(routes["with"][~c] == "core") < 0.15


def test_outlier_margin_never_below_floor() -> None:
    gate = Gate.percentile(floor=0.5, q_high=0.99, half_life=math.inf, warmup=10)
    rng = np.random.default_rng(4)
    # 95 % of scores pinned near 1.0 (MAD ~ 0), a 5 % tail in [3, 4] keeps q0.99 high
    xs = np.concatenate([rng.uniform(0.999, 1.001, 1900), rng.uniform(3.0, 4.0, 100)])
    state = _primed(gate, xs)
    _, mad = state.sketch.median_mad()
    assert mad < 0.01
    assert gate.thresholds(state)[1] > 3.0
    d = gate.decide(state, 1.3)  # a 3-MAD outlier, but within one floor of the median
    assert (d.route, d.reason) == ("buffer", "between")
    d = gate.decide(state, 1.6)
    assert (d.route, d.reason) == ("core", "outlier")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"q_low": 0.9, "q_high": 0.9},
        {"q_low": 0.95, "q_high": 0.9},
        {"q_low": 0.0},
        {"q_high": 1.0},
        {"floor": -0.1},
        {"outlier_k": 0.0},
        {"half_life": 0.0},
        {"warmup": -1},
        {"alpha": math.nan},
    ],
)
def test_percentile_validation(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Gate.percentile(**kwargs)  # type: ignore[arg-type]


def test_fixed_validation_and_bad_scores() -> None:
    with pytest.raises(ValueError):
        Gate.fixed(2.0, 1.0)
    with pytest.raises(ValueError):
        Gate.fixed(-1.0, 1.0)
    gate = Gate.fixed(1.0, 2.0)
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(ValueError):
            gate.decide(gate.new_state(), bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        gate.floor = 3.0  # type: ignore[misc]


def test_gate_state_roundtrip_gives_same_decisions() -> None:
    gate = Gate.percentile(half_life=500.0)
    scores, _ = _cliff_stream(1500, 0.2, seed=3)
    state = gate.new_state()
    gate.decide_many(state, scores[:1000])
    restored = GateState.from_dict(json.loads(json.dumps(state.to_dict(), allow_nan=False)))
    a = gate.decide_many(state, scores[1000:])
    b = gate.decide_many(restored, scores[1000:])
    assert [(d.route, d.reason) for d in a] == [(d.route, d.reason) for d in b]
    np.testing.assert_allclose([d.theta_high for d in a], [d.theta_high for d in b], rtol=1e-9)


def test_sigmoid_stable() -> None:
    assert sigmoid(-1000.0) == pytest.approx(0.0) and sigmoid(1000.0) == pytest.approx(1.0)
    assert sigmoid(0.3) + sigmoid(-0.3) == pytest.approx(1.0)


def _sparse_stream(rng: np.random.Generator, n: int) -> np.ndarray:
    """Mundane bulk near 0.05 with a heavy tail: 10 % moderate (0.2-0.4), 1 % huge (5)."""
    s = np.abs(rng.normal(0.05, 0.01, n))
    u = rng.random(n)
    s[u < 0.10] = rng.uniform(0.2, 0.4, int((u < 0.10).sum()))
    s[u < 0.01] = 5.0
    return s


def test_floor_keeps_what_the_stream_separates_from_its_bulk() -> None:
    """Sparse rewards: scores far past the bulk but under the absolute floor are kept
    (in the buffer), the bulk is dropped, and the rare huge ones still reach core."""
    gate = Gate.percentile(floor=0.5, half_life=math.inf, warmup=10)
    rng = np.random.default_rng(5)
    state = _primed(gate, _sparse_stream(rng, 2000))
    t_low, t_high = gate.thresholds(state)
    assert t_low < 0.2 and t_high == 0.5  # a band exists between the bulk and the floor
    probe = _sparse_stream(rng, 2000)
    plan = gate.plan(state)
    routes = [gate.route(plan, float(s))[0] for s in probe]
    mid = (probe >= 0.2) & (probe <= 0.4)
    bulk = probe < 0.1
    assert all(r == "buffer" for r, m in zip(routes, mid, strict=True) if m)
    assert all(r == "drop" for r, b in zip(routes, bulk, strict=True) if b)
    assert all(r == "core" for r, p in zip(routes, probe, strict=True) if p >= 5.0)
    assert gate.decide(state, 0.3).reason == "above_bulk"


def test_near_constant_stream_needs_min_separation() -> None:
    gate = Gate.percentile(floor=0.5, half_life=math.inf, warmup=10, min_separation=0.1)
    state = _primed(gate, np.full(500, 0.05))  # MAD = 0
    assert gate.decide(state, 0.1).route == "drop"  # a wiggle, not a separation
    assert gate.decide(state, 0.2).route == "buffer"
    with pytest.raises(ValueError):
        Gate.percentile(min_separation=-1.0)


def _cuts(n: int, sizes: list[int]) -> list[tuple[int, int]]:
    out, i = [], 0
    for k in sizes:
        if i >= n:
            break
        out.append((i, min(n, i + k)))
        i += k
    if i < n:
        out.append((i, n))
    return out


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    sizes=st.lists(st.integers(1, 97), min_size=1, max_size=40),
    warmup=st.sampled_from([0, 10, 50]),
)
def test_batch_invariant_routes_thresholds_and_state(seed: int, sizes: list[int],
                                                     warmup: int) -> None:  # fmt: skip
    """Deciding a stream in any cut of micro-batches gives the decisions of deciding it
    one score at a time, and leaves the same sketch (warm-up included)."""
    gate = Gate.percentile(floor=0.5, half_life=500.0, warmup=warmup)
    scores = _sparse_stream(np.random.default_rng(seed), 400).tolist()
    scores[warmup + 200] = 5.0  # at least one huge score past the warm-up, whatever the seed
    one, cut = gate.new_state(), gate.new_state()
    singles = [gate.decide(one, s) for s in scores]
    batched = [d for a, b in _cuts(len(scores), sizes) for d in gate.decide_many(cut, scores[a:b])]
    assert batched == singles
    assert cut.to_dict() == one.to_dict()
    assert {d.route for d in singles} >= {"core", "drop"}  # the stream exercises the routes


def test_decide_planned_reports_the_plan_it_routed_under() -> None:
    gate = Gate.percentile(floor=0.5, half_life=math.inf, warmup=10)
    state = _primed(gate, _sparse_stream(np.random.default_rng(8), 500))
    before = gate.plan(state)
    d, plan = gate.decide_planned(state, 4.0)
    assert plan == before and (d.theta_low, d.theta_high) == before[:2]
    assert (d.route, d.reason) == gate.route(plan, 4.0)
    assert gate.plan(state) != before  # the score was learned after routing
