"""Per-tenant state-value model V(s), trained online by semi-gradient TD(0).

Design decisions:

- Model: a 2-hidden-layer ReLU MLP in float32. The output layer starts at zero,
  so a fresh tenant predicts V = 0 everywhere and its first RPEs are exactly the
  (scaled) rewards instead of random-init noise.
- Targets: ``r / std_r + gamma * (1 - done) * V_target(s')``. Rewards are
  divided (not centred: centring would change the fixed point) by a running std
  so one learning rate works for tenants whose rewards are +-1 or +-100. V is
  therefore in units of "reward stds"; ``reward_scale`` converts back.
- Stability: Huber loss, gradient-norm clipping, a Polyak-averaged target net
  (updated after every gradient step) and a small reservoir replay (uniform
  over everything seen, seeded numpy RNG) so a burst from one agent does not
  wipe out what was learned from others.
- Update cadence (``update_every``, ``observe``): the write path trains once per
  ``update_every`` transitions of a tenant (state per tenant and partition), on
  exactly those transitions (plus replay), and computes every TD error with the
  model as of the last update; it splits a micro-batch at update boundaries. So
  the model and every TD error are the same however the stream was cut into
  micro-batches (what still depends on the cut is read once per micro-batch
  downstream: the RPE normaliser's sigma and the gate's thresholds). Why:
  training once per micro-batch makes the memory depend on the client's
  publishing pattern, and on a sparse-reward stream a value model fitted step
  by step turns its own changing predictions into TD noise that the gate
  stores as surprise. 256 transitions per update is the cadence the gate's
  defaults were tuned at (docs/design/2026-12-02-value-model-cadence.md).
  ``update`` (one TD step on what it is given) remains for direct use. Until a
  tenant's first update its TD errors use reward std 1 (nothing folded yet), so
  their unit changes at that update: the write path multiplies them by
  ``reward_scale`` (reward units throughout) before its running sigma scales them.
- ``update`` folds the batch's rewards into the std *before* the gradient step,
  so a tenant's very first update is already trained at the right scale.
  ``td_errors`` never mutates anything: call it before ``update``.
- Checkpoints (``state_bytes``) hold config, both nets, the optimiser, the
  reward std, the numpy RNG and at most ``CHECKPOINT_REPLAY_ROWS`` replay rows
  in float16, so a checkpoint stays well under Kafka's default 1 MB message
  size for 384-d states. The transitions waiting for the next update are kept
  too (float16, taking the place of as many replay rows, so the size bound
  holds while ``update_every`` <= ``CHECKPOINT_REPLAY_ROWS``, which the settings
  enforce). Predictions after ``from_bytes`` are bit-identical; later training
  differs only through the truncated/float16 replay and pending rows.
- Threads: ``torch.set_num_threads`` is the worker's business, never set here.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["CHECKPOINT_REPLAY_ROWS", "RunningStd", "TDValueLearner"]

#: replay rows kept in a checkpoint (a uniform subsample of the reservoir).
CHECKPOINT_REPLAY_ROWS = 256
_FORMAT_VERSION = 2
_READABLE_FORMATS = (1, 2)  # 1: no update cadence, no pending rows


class RunningStd:
    """Running mean/std: exact (Welford/Chan) until ``max_count``, then EWMA.

    Capping the effective count at ``max_count`` turns the exact estimator into
    an exponential moving one with horizon ~max_count samples, so a tenant
    whose reward scale drifts is followed instead of averaged forever.
    """

    def __init__(self, floor: float = 1e-6, max_count: float | None = 10_000.0) -> None:
        if floor <= 0:
            raise ValueError(f"floor must be positive, got {floor}")
        if max_count is not None and max_count < 2:
            raise ValueError(f"max_count must be >= 2 or None, got {max_count}")
        self.floor = float(floor)
        self.max_count = None if max_count is None else float(max_count)
        self.count = 0.0  # effective (possibly capped) sample count
        self.mean = 0.0
        self.m2 = 0.0
        self.seen = 0  # raw number of samples ever folded in

    def update(self, x: np.ndarray | float) -> None:
        """Fold a batch in with Chan's parallel formula (order-independent)."""
        arr = np.asarray(x, dtype=np.float64).reshape(-1)
        arr = arr[np.isfinite(arr)]
        nb = float(arr.shape[0])
        if nb == 0:
            return
        mb = float(arr.mean())
        m2b = float(((arr - mb) ** 2).sum())
        na = self.count
        n = na + nb
        d = mb - self.mean
        self.mean += d * nb / n
        self.m2 += m2b + d * d * na * nb / n
        self.count = n
        self.seen += int(nb)
        if self.max_count is not None and self.count > self.max_count:
            self.m2 *= self.max_count / self.count
            self.count = self.max_count

    @property
    def var(self) -> float:
        if self.count < 2:
            return 1.0
        return max(self.m2 / (self.count - 1.0), 0.0)

    @property
    def std(self) -> float:
        """Sample std, floored; 1.0 until two samples (nothing to scale by yet)."""
        if self.count < 2:
            return 1.0
        return max(math.sqrt(self.var), self.floor)

    def to_dict(self) -> dict[str, Any]:
        return {
            "floor": self.floor,
            "max_count": self.max_count,
            "count": self.count,
            "mean": self.mean,
            "m2": self.m2,
            "seen": self.seen,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunningStd:
        rs = cls(floor=float(d["floor"]), max_count=d.get("max_count"))
        rs.count = float(d["count"])
        rs.mean = float(d["mean"])
        rs.m2 = float(d["m2"])
        rs.seen = int(d.get("seen", 0))
        return rs


class _MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.l1 = nn.Linear(dim, hidden)
        self.l2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.l1(x))
        h = F.relu(self.l2(h))
        return self.out(h).squeeze(-1)

    def reset(self, seed: int) -> None:
        """Seeded init without touching torch's global RNG."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for layer in (self.l1, self.l2):
                bound = 1.0 / math.sqrt(layer.in_features)
                layer.weight.uniform_(-bound, bound, generator=g)
                layer.bias.uniform_(-bound, bound, generator=g)
            self.out.weight.zero_()
            self.out.bias.zero_()


class TDValueLearner:
    """Online TD(0) value learner for one tenant (see module docstring)."""

    def __init__(
        self,
        dim: int,
        hidden: int = 64,
        gamma: float = 0.95,
        lr: float = 3e-3,
        polyak: float = 0.05,
        huber_delta: float = 1.0,
        replay_size: int = 4096,
        replay_batch: int = 64,
        replay_steps: int = 1,
        seed: int = 0,
        update_every: int = 1,
    ) -> None:
        if dim <= 0 or hidden <= 0:
            raise ValueError("dim and hidden must be positive")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        if not 0.0 < polyak <= 1.0:
            raise ValueError(f"polyak must be in (0, 1], got {polyak}")
        if lr <= 0 or huber_delta <= 0:
            raise ValueError("lr and huber_delta must be positive")
        if replay_size < 0 or replay_batch < 0 or replay_steps < 0:
            raise ValueError("replay_size, replay_batch, replay_steps must be >= 0")
        if update_every < 1:
            raise ValueError(f"update_every must be >= 1, got {update_every}")
        self.dim = int(dim)
        self.hidden = int(hidden)
        self.gamma = float(gamma)
        self.lr = float(lr)
        self.polyak = float(polyak)
        self.huber_delta = float(huber_delta)
        self.replay_size = int(replay_size)
        self.replay_batch = int(replay_batch)
        self.replay_steps = int(replay_steps)
        self.seed = int(seed)
        self.update_every = int(update_every)
        self.max_grad_norm = 10.0
        #: transitions observed since the last update (trained on at the next boundary)
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

        self.net = _MLP(self.dim, self.hidden)
        self.net.reset(self.seed)
        self.target = _MLP(self.dim, self.hidden)
        self.target.load_state_dict(self.net.state_dict())
        self.target.requires_grad_(False)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=self.lr, foreach=True)
        self.reward_std = RunningStd()
        self.rng = np.random.default_rng(self.seed)
        self.updates = 0

        cap = self.replay_size
        self._rs = np.zeros((cap, self.dim), dtype=np.float32)
        self._rs_next = np.zeros((cap, self.dim), dtype=np.float32)
        self._rr = np.zeros(cap, dtype=np.float32)
        self._rdone = np.zeros(cap, dtype=bool)
        self._seen = 0  # items ever offered to the reservoir

    # ------------------------------------------------------------------ helpers

    @property
    def config(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "hidden": self.hidden,
            "gamma": self.gamma,
            "lr": self.lr,
            "polyak": self.polyak,
            "huber_delta": self.huber_delta,
            "replay_size": self.replay_size,
            "replay_batch": self.replay_batch,
            "replay_steps": self.replay_steps,
            "seed": self.seed,
            "update_every": self.update_every,
        }

    @property
    def reward_scale(self) -> float:
        """Multiply V or delta by this to get back to raw reward units."""
        return self.reward_std.std

    @property
    def pending(self) -> int:
        """Transitions observed since the last update."""
        return sum(int(p[1].shape[0]) for p in self._pending)

    def drop_pending(self) -> None:
        """Forget the queued transitions (a state copied to another partition must
        not train on its source's transitions a second time)."""
        self._pending = []

    @property
    def until_update(self) -> int:
        """How many more transitions `observe` takes before it trains (>= 1)."""
        return max(1, self.update_every - self.pending)

    @property
    def replay_len(self) -> int:
        return min(self._seen, self.replay_size)

    def _check(
        self, s: np.ndarray, r: np.ndarray, s_next: np.ndarray, done: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        s_a = np.asarray(s, dtype=np.float32)
        sn_a = np.asarray(s_next, dtype=np.float32)
        r_a = np.asarray(r, dtype=np.float32).reshape(-1)
        d_a = np.asarray(done, dtype=bool).reshape(-1)
        n = r_a.shape[0]
        if s_a.shape != (n, self.dim) or sn_a.shape != (n, self.dim) or d_a.shape != (n,):
            raise ValueError(
                f"shape mismatch: s {s_a.shape}, s_next {sn_a.shape}, r {r_a.shape}, "
                f"done {d_a.shape}; expected (n, {self.dim}) states"
            )
        if not (np.isfinite(s_a).all() and np.isfinite(sn_a).all() and np.isfinite(r_a).all()):
            raise ValueError("non-finite values in s, s_next or r")
        return s_a, r_a, sn_a, d_a

    def _targets(
        self, r: torch.Tensor, s_next: torch.Tensor, done: torch.Tensor, std: float
    ) -> torch.Tensor:
        with torch.no_grad():
            v_next = self.target(s_next)
            return r / std + self.gamma * (1.0 - done) * v_next

    def _step(self, s: np.ndarray, r: np.ndarray, s_next: np.ndarray, done: np.ndarray) -> float:
        st = torch.from_numpy(s)
        tgt = self._targets(
            torch.from_numpy(r),
            torch.from_numpy(s_next),
            torch.from_numpy(done.astype(np.float32)),
            self.reward_std.std,
        )
        v = self.net(st)
        loss = F.huber_loss(v, tgt, delta=self.huber_delta)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.net.parameters(), self.max_grad_norm, foreach=True)
        self.opt.step()
        with torch.no_grad():
            for p_t, p in zip(self.target.parameters(), self.net.parameters(), strict=True):
                p_t.mul_(1.0 - self.polyak).add_(p, alpha=self.polyak)
        return float(loss.detach())

    def _add_replay(
        self, s: np.ndarray, r: np.ndarray, s_next: np.ndarray, done: np.ndarray
    ) -> None:
        cap = self.replay_size
        n = r.shape[0]
        if cap == 0 or n == 0:
            return
        t = self._seen + np.arange(n, dtype=np.int64)
        j = self.rng.integers(0, t + 1)
        slots = np.where(t < cap, t, j)
        keep = slots < cap
        # Later items win on slot collisions: apply in order, last write wins.
        idx = np.flatnonzero(keep)
        sl = slots[idx]
        _, last = np.unique(sl[::-1], return_index=True)
        pick = idx[::-1][last]
        sl = slots[pick]
        self._rs[sl] = s[pick]
        self._rs_next[sl] = s_next[pick]
        self._rr[sl] = r[pick]
        self._rdone[sl] = done[pick]
        self._seen += n

    # --------------------------------------------------------------------- API

    def values(self, s: np.ndarray, target: bool = False) -> np.ndarray:
        """V(s) (or V_target(s)) in reward-std units, float64 (n,)."""
        arr = np.asarray(s, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise ValueError(f"expected states of shape (n, {self.dim}), got {arr.shape}")
        net = self.target if target else self.net
        with torch.no_grad():
            return net(torch.from_numpy(arr)).numpy().astype(np.float64)

    def td_errors(
        self, s: np.ndarray, r: np.ndarray, s_next: np.ndarray, done: np.ndarray
    ) -> np.ndarray:
        """delta = r/std_r + gamma (1-done) V_target(s') - V(s); mutates nothing."""
        s_a, r_a, sn_a, d_a = self._check(s, r, s_next, done)
        if r_a.shape[0] == 0:
            return np.zeros(0, dtype=np.float64)
        with torch.no_grad():
            tgt = self._targets(
                torch.from_numpy(r_a),
                torch.from_numpy(sn_a),
                torch.from_numpy(d_a.astype(np.float32)),
                self.reward_std.std,
            )
            v = self.net(torch.from_numpy(s_a))
            return (tgt - v).numpy().astype(np.float64)

    def loss_of(self, deltas: np.ndarray) -> float:
        """The training loss (mean Huber) of these TD errors, without training: what
        `update` would report before its step (a per-batch metric between updates)."""
        d = np.abs(np.asarray(deltas, dtype=np.float64).reshape(-1))
        if d.shape[0] == 0:
            return 0.0
        h = self.huber_delta
        return float(np.where(d <= h, 0.5 * d * d, h * (d - 0.5 * h)).mean())

    def observe(
        self, s: np.ndarray, r: np.ndarray, s_next: np.ndarray, done: np.ndarray
    ) -> float | None:
        """Queue transitions; at the ``update_every`` boundary, `update` on the queued
        ones and return its loss (else None). Takes at most `until_update` rows, so a
        caller splits its batch at the boundary (call `td_errors` on it first)."""
        s_a, r_a, sn_a, d_a = self._check(s, r, s_next, done)
        n = r_a.shape[0]
        if n > self.until_update:
            raise ValueError(f"{n} transitions past the update boundary ({self.until_update})")
        if n:
            self._pending.append((s_a, r_a, sn_a, d_a))
        if self.pending < self.update_every:
            return None
        parts, self._pending = self._pending, []
        return self.update(*(np.concatenate([p[i] for p in parts]) for i in range(4)))

    def update(self, s: np.ndarray, r: np.ndarray, s_next: np.ndarray, done: np.ndarray) -> float:
        """One TD step on the batch plus ``replay_steps`` replay steps; returns batch loss."""
        s_a, r_a, sn_a, d_a = self._check(s, r, s_next, done)
        if r_a.shape[0] == 0:
            return 0.0
        self.reward_std.update(r_a)
        loss = self._step(s_a, r_a, sn_a, d_a)
        self._add_replay(s_a, r_a, sn_a, d_a)
        n_rep = self.replay_len
        if n_rep > 0 and self.replay_batch > 0:
            k = min(self.replay_batch, n_rep)
            for _ in range(self.replay_steps):
                idx = self.rng.integers(0, n_rep, size=k)
                self._step(self._rs[idx], self._rr[idx], self._rs_next[idx], self._rdone[idx])
        self.updates += 1
        return loss

    # ------------------------------------------------------------ checkpoints

    def state_bytes(self, max_replay: int | None = CHECKPOINT_REPLAY_ROWS) -> bytes:
        """Serialise everything needed to resume (see module docstring for sizes)."""
        n_rep = self.replay_len
        pend = (
            [np.concatenate([p[i] for p in self._pending]) for i in range(4)]
            if self._pending
            else None
        )
        n_pend = 0 if pend is None else int(pend[1].shape[0])
        budget = None if max_replay is None else max(int(max_replay) - n_pend, 0)
        keep = n_rep if budget is None else min(n_rep, budget)
        # Reservoir slots are already a uniform sample; any prefix of them is too.
        state = {
            "format": _FORMAT_VERSION,
            "config": self.config,
            "net": self.net.state_dict(),
            "target": self.target.state_dict(),
            "opt": self.opt.state_dict(),
            "reward_std": self.reward_std.to_dict(),
            "rng": self.rng.bit_generator.state,
            "updates": self.updates,
            "replay": {
                "s": torch.from_numpy(self._rs[:keep].astype(np.float16)),
                "s_next": torch.from_numpy(self._rs_next[:keep].astype(np.float16)),
                "r": torch.from_numpy(self._rr[:keep].copy()),
                "done": torch.from_numpy(self._rdone[:keep].copy()),
                "seen": keep if keep < n_rep else self._seen,
            },
        }
        if pend is not None:
            state["pending"] = {
                "s": torch.from_numpy(pend[0].astype(np.float16)),
                "s_next": torch.from_numpy(pend[2].astype(np.float16)),
                "r": torch.from_numpy(pend[1].copy()),
                "done": torch.from_numpy(pend[3].copy()),
            }
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    @classmethod
    def from_bytes(
        cls, data: bytes, check: Callable[[dict[str, Any]], None] | None = None
    ) -> TDValueLearner:
        """Restore a learner; safe loader (``weights_only``), data may come from Kafka.
        ``check`` sees the checkpoint's config before the model is built (and raises to
        refuse sizes other than the configured ones)."""
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        if state.get("format") not in _READABLE_FORMATS:
            raise ValueError(f"unsupported value-model checkpoint format {state.get('format')}")
        if check is not None:
            check(dict(state["config"]))
        learner = cls(**state["config"])
        learner.net.load_state_dict(state["net"])
        learner.target.load_state_dict(state["target"])
        learner.opt.load_state_dict(state["opt"])
        learner.reward_std = RunningStd.from_dict(state["reward_std"])
        learner.rng.bit_generator.state = state["rng"]
        learner.updates = int(state["updates"])
        rep = state["replay"]
        k = int(rep["r"].shape[0])
        learner._rs[:k] = rep["s"].numpy().astype(np.float32)
        learner._rs_next[:k] = rep["s_next"].numpy().astype(np.float32)
        learner._rr[:k] = rep["r"].numpy()
        learner._rdone[:k] = rep["done"].numpy()
        learner._seen = int(rep["seen"])
        pend = state.get("pending")
        if pend is not None:
            learner._pending = [
                (
                    pend["s"].numpy().astype(np.float32),
                    pend["r"].numpy(),
                    pend["s_next"].numpy().astype(np.float32),
                    pend["done"].numpy(),
                )
            ]
        return learner
