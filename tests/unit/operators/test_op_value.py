"""TD value learner on a 5-state chain, checkpoints, and the running reward std."""

from __future__ import annotations

import json

import numpy as np
import pytest

from operators.value import RunningStd, TDValueLearner

GAMMA = 0.9
EYE = np.eye(5, dtype=np.float32)
# chain 0 -> 1 -> 2 -> 3 -> 4 -> terminal; reward 1 only on leaving state 4
S = EYE
S_NEXT = np.vstack([EYE[1:], np.zeros((1, 5), dtype=np.float32)])
R = np.array([0.0, 0.0, 0.0, 0.0, 1.0], dtype=np.float32)
DONE = np.array([False, False, False, False, True])
V_TRUE = GAMMA ** np.arange(4, -1, -1, dtype=np.float64)  # raw reward units


def _train(learner: TDValueLearner, n_updates: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(n_updates):
        idx = rng.integers(0, 5, 16)
        learner.update(S[idx], R[idx], S_NEXT[idx], DONE[idx])


def _value_error(learner: TDValueLearner) -> float:
    return float(np.abs(learner.values(S) * learner.reward_scale - V_TRUE).max())


def test_td_learns_chain_values() -> None:
    learner = TDValueLearner(5, gamma=GAMMA, lr=1e-2, replay_batch=32, seed=1)
    before = _value_error(learner)
    assert before == pytest.approx(1.0)  # zero-initialised output: V = 0
    _train(learner, 250)
    after = _value_error(learner)
    assert after < 0.05
    assert after < before / 10
    assert learner.updates == 250
    # the Polyak target follows the online net
    np.testing.assert_allclose(learner.values(S, target=True), learner.values(S), atol=0.05)


def test_td_errors_formula_and_no_mutation() -> None:
    learner = TDValueLearner(5, gamma=GAMMA, lr=1e-2, seed=2)
    _train(learner, 30)
    v_before = learner.values(S)
    delta = learner.td_errors(S, R, S_NEXT, DONE)
    assert delta.dtype == np.float64 and delta.shape == (5,)
    expected = (
        R / learner.reward_scale
        + GAMMA * (1 - DONE) * learner.values(S_NEXT, target=True)
        - learner.values(S)
    )
    np.testing.assert_allclose(delta, expected, atol=1e-5)
    np.testing.assert_array_equal(learner.values(S), v_before)
    assert learner.updates == 30
    loss = learner.update(S, R, S_NEXT, DONE)
    assert loss > 0.0 and not np.array_equal(learner.values(S), v_before)


def test_reward_scale_normalisation() -> None:
    learner = TDValueLearner(5, seed=3)
    rng = np.random.default_rng(0)
    r = rng.choice([-100.0, 100.0], 64).astype(np.float32)
    idx = rng.integers(0, 5, 64)
    learner.update(S[idx], r, S_NEXT[idx], DONE[idx])
    assert learner.reward_scale == pytest.approx(float(np.std(r, ddof=1)), rel=1e-5)
    # TD errors are in reward-std units, not raw +-100
    assert np.abs(learner.td_errors(S[idx], r, S_NEXT[idx], DONE[idx])).max() < 5.0


def test_checkpoint_restores_identical_predictions_and_training() -> None:
    learner = TDValueLearner(5, gamma=GAMMA, lr=1e-2, replay_size=64, replay_batch=16, seed=4)
    _train(learner, 50)
    clone = TDValueLearner.from_bytes(learner.state_bytes(max_replay=None))
    np.testing.assert_array_equal(clone.values(S), learner.values(S))
    np.testing.assert_array_equal(clone.values(S, target=True), learner.values(S, target=True))
    np.testing.assert_array_equal(
        clone.td_errors(S, R, S_NEXT, DONE), learner.td_errors(S, R, S_NEXT, DONE)
    )
    assert clone.updates == 50 and clone.reward_scale == learner.reward_scale
    # one-hot states are exact in float16, so the full state (optimiser, replay,
    # rng, reward std) must make further training bit-identical too
    _train(learner, 10, seed=9)
    _train(clone, 10, seed=9)
    np.testing.assert_array_equal(clone.values(S), learner.values(S))


def test_checkpoint_default_is_compact_for_384_dims() -> None:
    learner = TDValueLearner(384, seed=5)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 384)).astype(np.float32)
    learner.update(x, rng.normal(size=4096), x, np.zeros(4096, dtype=bool))
    assert learner.replay_len == 4096
    data = learner.state_bytes()
    assert len(data) < 1_000_000
    clone = TDValueLearner.from_bytes(data)
    np.testing.assert_array_equal(clone.values(x[:10]), learner.values(x[:10]))
    assert clone.replay_len == 256
    full = learner.state_bytes(max_replay=None)
    assert len(full) > len(data)


def test_input_validation() -> None:
    learner = TDValueLearner(5)
    with pytest.raises(ValueError):
        learner.update(S[:, :4], R, S_NEXT, DONE)
    with pytest.raises(ValueError):
        learner.td_errors(S, R[:3], S_NEXT, DONE)
    with pytest.raises(ValueError):
        learner.update(S, np.full(5, np.nan), S_NEXT, DONE)
    with pytest.raises(ValueError):
        TDValueLearner(5, gamma=1.5)
    assert learner.update(S[:0], R[:0], S_NEXT[:0], DONE[:0]) == 0.0
    assert learner.updates == 0


def test_running_std_matches_numpy_and_roundtrips() -> None:
    rng = np.random.default_rng(6)
    rs = RunningStd(max_count=None)
    assert rs.std == 1.0
    rs.update(np.array([5.0]))
    assert rs.std == 1.0  # one sample: nothing to scale by yet
    chunks = [rng.normal(3.0, 2.0, n) for n in (7, 100, 1, 250)]
    for c in chunks:
        rs.update(c)
    allx = np.concatenate([[5.0], *chunks])
    assert rs.mean == pytest.approx(float(allx.mean()))
    assert rs.std == pytest.approx(float(allx.std(ddof=1)))
    back = RunningStd.from_dict(json.loads(json.dumps(rs.to_dict())))
    assert back.std == rs.std and back.mean == rs.mean
    flat = RunningStd(floor=1e-3)
    flat.update(np.full(10, 2.0))
    assert flat.std == 1e-3


def test_running_std_capped_count_follows_drift() -> None:
    rng = np.random.default_rng(7)
    rs = RunningStd(max_count=500)
    rs.update(rng.normal(0.0, 1.0, 10_000))
    for _ in range(20):
        rs.update(rng.normal(0.0, 10.0, 250))
    assert rs.std == pytest.approx(10.0, rel=0.15)
    exact = RunningStd(max_count=None)
    exact.update(rng.normal(0.0, 1.0, 10_000))
    exact.update(rng.normal(0.0, 10.0, 5000))
    assert exact.std < 7.0


def test_observe_trains_once_per_update_every_whatever_the_cut() -> None:
    """The same 40 transitions observed in pieces of 1, 3 or 40 (cut at the boundary)
    give the same updates and a bit-identical model; nothing trains before a boundary."""
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 5, 40)

    def run(piece: int) -> TDValueLearner:
        learner = TDValueLearner(
            5, gamma=GAMMA, replay_size=64, replay_batch=8, seed=2, update_every=16
        )
        i = 0
        while i < len(idx):
            n = min(piece, learner.until_update, len(idx) - i)
            j = idx[i : i + n]
            loss = learner.observe(S[j], R[j], S_NEXT[j], DONE[j])
            assert (loss is not None) == ((i + n) % 16 == 0)
            i += n
        return learner

    a, b, c = run(1), run(3), run(40)
    assert a.updates == b.updates == c.updates == 2 and a.pending == 8
    np.testing.assert_array_equal(a.values(S), b.values(S))
    np.testing.assert_array_equal(a.values(S), c.values(S))
    fresh = TDValueLearner(5, gamma=GAMMA, update_every=16, seed=2)
    assert fresh.observe(S, R, S_NEXT, DONE) is None and fresh.updates == 0
    np.testing.assert_array_equal(fresh.values(S), np.zeros(5))  # untrained: V = 0
    with pytest.raises(ValueError, match="past the update boundary"):
        fresh.observe(np.tile(S, (3, 1)), np.tile(R, 3), np.tile(S_NEXT, (3, 1)), np.tile(DONE, 3))
    with pytest.raises(ValueError, match="update_every"):
        TDValueLearner(5, update_every=0)


def test_checkpoint_keeps_pending_transitions_within_the_size_bound() -> None:
    learner = TDValueLearner(
        5, gamma=GAMMA, replay_size=64, replay_batch=8, seed=2, update_every=16
    )
    learner.observe(S, R, S_NEXT, DONE)  # 5 pending, nothing trained yet
    clone = TDValueLearner.from_bytes(learner.state_bytes())
    assert clone.pending == 5 and clone.update_every == 16 and clone.until_update == 11
    for m in (learner, clone):  # the boundary trains on the restored pending rows too
        for _ in range(2):
            m.observe(S, R, S_NEXT, DONE)
        m.observe(S[:1], R[:1], S_NEXT[:1], DONE[:1])
    assert learner.updates == clone.updates == 1
    np.testing.assert_array_equal(clone.values(S), learner.values(S))
    big = TDValueLearner(384, seed=5, update_every=256)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 384)).astype(np.float32)
    big.update(x, rng.normal(size=4096), x, np.zeros(4096, dtype=bool))
    big.observe(x[:255], np.zeros(255), x[:255], np.zeros(255, dtype=bool))
    data = big.state_bytes()  # 255 pending rows take the place of replay rows
    assert len(data) < 1_000_000
    restored = TDValueLearner.from_bytes(data)
    assert restored.pending == 255 and restored.replay_len == 1


def test_a_format_1_checkpoint_still_loads_and_trains_per_call() -> None:
    """Checkpoints from before the cadence (no pending rows, no update_every) restore
    with identical predictions; the write path then sets the cadence from settings."""
    import io

    import torch

    learner = TDValueLearner(5, gamma=GAMMA, lr=1e-2, replay_size=64, replay_batch=16, seed=4)
    _train(learner, 20)
    state = torch.load(io.BytesIO(learner.state_bytes()), weights_only=True)
    state["format"] = 1
    del state["config"]["update_every"]
    buf = io.BytesIO()
    torch.save(state, buf)
    old = TDValueLearner.from_bytes(buf.getvalue())
    np.testing.assert_array_equal(old.values(S), learner.values(S))
    assert old.update_every == 1 and old.pending == 0
    assert old.observe(S[:1], R[:1], S_NEXT[:1], DONE[:1]) is not None  # one update a row
    state["format"] = 7
    buf = io.BytesIO()
    torch.save(state, buf)
    with pytest.raises(ValueError, match="format"):
        TDValueLearner.from_bytes(buf.getvalue())


def test_loss_of_matches_the_training_loss_before_a_step() -> None:
    """With zero rewards the reward std plays no part, so the loss `update` reports
    (before its step) is exactly `loss_of` the TD errors computed just before."""
    learner = TDValueLearner(5, gamma=GAMMA, lr=1e-2, replay_size=0, seed=4, huber_delta=0.05)
    _train(learner, 20)  # V > 0 now: zero-reward TD errors are not all 0
    zero = np.zeros(5, dtype=np.float32)
    d = learner.td_errors(S, zero, S_NEXT, DONE)
    assert np.abs(d).max() > 0.05 > np.abs(d).min()  # errors on each side of the knee
    assert learner.loss_of(d) == pytest.approx(learner.update(S, zero, S_NEXT, DONE), rel=1e-5)
    assert learner.loss_of(np.zeros(0)) == 0.0
