"""Reward-prediction-error normalisation (per tenant) and smoothing (per agent).

The smoothing choice, and why:

1. Tenant scale. ``RpeNormalizer`` keeps an EWMA of delta^2 (alpha 0.01, i.e.
   a horizon of ~100 transitions) and returns z = delta / sigma, with sigma
   taken *before* the delta is folded in, so a sudden huge delta is measured
   against the past and is not diluted by itself. RMS rather than std: TD errors
   should be zero-mean when the value model is right, and a persistent bias is
   itself a surprise worth keeping visible. During warm-up (fewer than
   ``warmup`` samples) sigma is the RMS of everything seen *including* the
   current delta, so a tenant whose rewards are +-100 is not divided by an
   arbitrary 1.0 on its first steps (which would route everything to core).
   Past warm-up, while every delta so far was exactly 0 (a reward-free stream
   until its first reward: the value model predicts exactly 0), no scale is
   known either, and sigma is the EWMA with the current delta folded in: the
   first non-zero delta after k zeros scores sqrt(k + 1), at most 1 / sqrt(alpha)
   (10), whatever the reward's size. Against the absolute ``floor`` it would
   score delta / 1e-6 (10^12 for a reward of 10^6), stored as the memory's rpe
   and inflating its agent's smoother for hundreds of steps.
   The first ``warmup`` samples initialise the EWMA with their plain mean, so
   it starts unbiased instead of decaying up from zero. Each delta is scaled
   and folded in turn, in stream order: a batch gives exactly what its deltas
   give one at a time, so the scale does not depend on the micro-batching.

2. Agent context. ``AgentSmoother`` keeps an EMA of |z| per agent (alpha 0.05,
   ~20 transitions) and scores s = |z| / (1 + kappa * ema_prev). An agent living
   in constant turbulence (every step a large |z|) is judged relative to its own
   recent level, while a calm agent's first big surprise keeps almost its full
   size. kappa (default 0.25) bounds the discount: with ema ~ 4 a |z| is only
   halved, so genuinely large errors still reach the gate; kappa = 0 disables
   agent context (s = |z|). The EMA is updated after scoring, again so an
   observation is not judged against itself. The ratio form is O(1) state per
   agent and monotone in |z| for a given history, which keeps the gate's
   ordering intuitive.

3. Reward surprise. ``RewardSurprise`` scores how far a reward is from the
   tenant's *usual* reward, in units of the mean absolute deviation from it:
   s_r = |r - usual| / E|r - usual|. The TD error alone cannot carry sparse,
   heavy-tailed rewards: an online value model over text embeddings errs on
   mundane steps by about as much as a small reward, and the RMS scale is set
   by the rare large penalties, so a rewarded step's |z| sits inside the
   mundane bulk. Against the usual reward a mundane step scores exactly 0 and
   any reward stands out; the mean absolute deviation, unlike an RMS, grows
   only linearly with a tail (one -100 among +5s does not blind the +5s). The
   usual reward is the value holding at least half of the decayed weight of
   recent rewards (0 in sparse tasks, -1 per step in Taxi or CliffWalking).
   When no value does (dense, continuous rewards) the score is 0 and the gate
   runs on the TD error alone.
   ``extrinsic_score`` = max(smoothed |z|, s_r) is the write path's one
   extrinsic gate score (a reward-free intrinsic surprise combines with it).

Valence keeps the sign of delta: +1 a pleasant surprise, -1 a painful lesson.

Measurements and rejected alternatives: docs/design/2026-12-01-reward-surprise-scale.md.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

__all__ = [
    "AgentSmoother",
    "OutcomeBaseline",
    "OutcomeHistory",
    "RewardSurprise",
    "RpeNormalizer",
    "extrinsic_score",
    "valence",
]


def valence(delta: float, eps: float = 1e-9) -> int:
    """Sign of the RPE with a dead zone of ``eps`` (0 = as expected)."""
    if delta > eps:
        return 1
    if delta < -eps:
        return -1
    return 0


class RpeNormalizer:
    """Per-tenant scale of TD errors: z = delta / sigma (see module docstring)."""

    def __init__(self, alpha: float = 0.01, warmup: int = 32, floor: float = 1e-6) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        if floor <= 0:
            raise ValueError(f"floor must be positive, got {floor}")
        self.alpha = float(alpha)
        self.warmup = int(warmup)
        self.floor = float(floor)
        self.count = 0
        self.mean_sq = 0.0

    @property
    def sigma(self) -> float:
        """Current scale (1.0 before any sample: nothing is known yet)."""
        if self.count == 0:
            return 1.0
        return max(math.sqrt(self.mean_sq), self.floor)

    def normalize(self, deltas: np.ndarray) -> np.ndarray:
        """z_i = delta_i / sigma before delta_i (during warm-up: including it), each delta
        folded in after it is scaled, in order; the same for any cut of the stream."""
        return self.normalize_with_scale(deltas)[0]

    def normalize_with_scale(self, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(z, the sigma each delta was divided by): `normalize`, and the scale as of
        each delta (what a later re-scoring of that point of the stream uses)."""
        d = np.asarray(deltas, dtype=np.float64).reshape(-1)
        if d.shape[0] == 0:
            return d.copy(), d.copy()
        if not np.isfinite(d).all():
            raise ValueError("non-finite TD errors")
        out = np.empty_like(d)
        sigmas = np.empty_like(d)
        m, k, a = self.mean_sq, self.count, self.alpha
        for i, x in enumerate(d.tolist()):
            sq = x * x
            if k < self.warmup:  # plain mean of everything seen, this delta included
                sigma = max(math.sqrt((m * k + sq) / (k + 1)), self.floor)
            elif m <= 0.0:  # only exact zeros so far: the scale with this delta folded in
                sigma = max(math.sqrt(max(1.0 / (k + 1), a) * sq), self.floor)
            else:
                sigma = max(math.sqrt(m), self.floor)
            out[i], sigmas[i] = x / sigma, sigma
            # weight max(1/k, alpha): exact mean while 1/k > alpha, then a plain EWMA
            k += 1
            m += max(1.0 / k, a) * (sq - m)
        self.mean_sq, self.count = m, k
        return out, sigmas

    def to_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "warmup": self.warmup,
            "floor": self.floor,
            "count": self.count,
            "mean_sq": self.mean_sq,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RpeNormalizer:
        n = cls(alpha=float(d["alpha"]), warmup=int(d["warmup"]), floor=float(d["floor"]))
        n.count = int(d["count"])
        n.mean_sq = float(d["mean_sq"])
        return n


class AgentSmoother:
    """Per-agent surprise relative to the agent's own recent |z| level."""

    def __init__(self, alpha: float = 0.05, kappa: float = 0.25) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if not 0.0 <= kappa <= 1.0:
            raise ValueError(f"kappa must be in [0, 1], got {kappa}")
        self.alpha = float(alpha)
        self.kappa = float(kappa)
        self.ema = 0.0
        self.count = 0

    def smooth(self, z: float) -> float:
        """s = |z| / (1 + kappa * ema_prev); then fold |z| into the EMA."""
        az = abs(float(z))
        if not math.isfinite(az):
            raise ValueError(f"non-finite z: {z}")
        s = az / (1.0 + self.kappa * self.ema)
        # Exact mean for the first 1/alpha samples, then EMA (no zero bias).
        self.count += 1
        w = max(1.0 / self.count, self.alpha)
        self.ema += w * (az - self.ema)
        return s

    def smooth_many(self, zs: np.ndarray) -> np.ndarray:
        """Sequential ``smooth`` over a batch of one agent's z values."""
        return np.array([self.smooth(z) for z in np.asarray(zs, dtype=np.float64).reshape(-1)])

    def to_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "kappa": self.kappa, "ema": self.ema, "count": self.count}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AgentSmoother:
        s = cls(alpha=float(d["alpha"]), kappa=float(d["kappa"]))
        s.ema = float(d["ema"])
        s.count = int(d["count"])
        return s


def extrinsic_score(td_score: float, reward_score: float) -> float:
    """The write path's extrinsic gate score: the larger of the two surprises."""
    return max(float(td_score), float(reward_score))


class RewardSurprise:
    """Per-tenant surprise of a reward against the usual reward (module docstring, 3)."""

    def __init__(self, alpha: float = 0.01, majority: float = 0.5, max_values: int = 32) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if not 0.0 < majority <= 1.0:
            raise ValueError(f"majority must be in (0, 1], got {majority}")
        if max_values < 1:
            raise ValueError(f"max_values must be >= 1, got {max_values}")
        self.alpha = float(alpha)
        self.majority = float(majority)
        self.max_values = int(max_values)
        self.weights: dict[float, float] = {}  # reward value -> decayed share
        self.dev = 0.0  # EWMA of |r - usual|
        self.count = 0

    def usual(self) -> float | None:
        """The reward value holding >= ``majority`` of the decayed weight, if any."""
        if not self.weights:
            return None
        value, w = max(self.weights.items(), key=lambda kv: kv[1])
        return value if w >= self.majority else None

    def score(self, reward: float) -> float:
        """s_r with the state as it is (0 while no usual reward is known).

        The first reward unlike the usual one (no deviation seen yet) is measured
        against the deviation it would itself create: |r - u| / (|r - u| / n) = n,
        the number of rewards seen: one different reward in n is that rare.
        """
        u = self.usual()
        if u is None:
            return 0.0
        diff = abs(float(reward) - u)
        if self.dev <= 0.0:
            return float(self.count + 1) if diff > 0 else 0.0
        return diff / self.dev

    def observe(self, reward: float) -> None:
        r = round(float(reward), 6)
        if not math.isfinite(r):
            raise ValueError(f"non-finite reward: {reward}")
        self.count += 1
        w = max(1.0 / self.count, self.alpha)  # exact mean first, then EWMA
        for k in list(self.weights):
            self.weights[k] *= 1.0 - w
        self.weights[r] = self.weights.get(r, 0.0) + w
        if len(self.weights) > self.max_values:
            del self.weights[min(self.weights, key=self.weights.__getitem__)]
        u = self.usual()
        if u is not None:
            self.dev += w * (abs(r - u) - self.dev)

    def score_many(self, rewards: np.ndarray) -> np.ndarray:
        """Score each reward against the rewards before it, then fold it in.

        Sequential, so the scores do not depend on how a stream was cut into
        micro-batches (a first batch of 512 would otherwise be scored against
        nothing and keep none of its rewards).
        """
        r = np.asarray(rewards, dtype=np.float64).reshape(-1)
        out = np.empty(r.shape[0])
        for i, x in enumerate(r.tolist()):
            out[i] = self.score(x)
            self.observe(x)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "majority": self.majority,
            "max_values": self.max_values,
            "weights": [[k, v] for k, v in self.weights.items()],
            "dev": self.dev,
            "count": self.count,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RewardSurprise:
        s = cls(
            alpha=float(d["alpha"]), majority=float(d["majority"]), max_values=int(d["max_values"])
        )
        s.weights = {float(k): float(v) for k, v in d["weights"]}
        s.dev = float(d["dev"])
        s.count = int(d["count"])
        return s


class OutcomeBaseline:
    """Per-tenant expectation of episode outcomes: what a late outcome reveals.

    ``surprise(x)`` = (x - mean) / mean absolute deviation, both EWMAs (alpha
    0.05: outcomes are rarer than steps; exact means first). An outcome that is
    what this tenant usually gets reveals nothing in hindsight, however large
    it is: ScienceWorld reports a final score of 100 after the steps already
    paid +1..+50 for it. ``None`` while fewer than two outcomes are known (no
    baseline yet: the caller judges the outcome against its own scale).
    """

    def __init__(self, alpha: float = 0.05) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = float(alpha)
        self.mean = 0.0
        self.dev = 0.0
        self.count = 0

    def surprise(self, x: float) -> float | None:
        if self.count < 2:
            return None
        diff = float(x) - self.mean
        if self.dev <= 0.0:
            return 0.0 if abs(diff) <= 1e-12 else None
        return diff / self.dev

    def observe(self, x: float) -> None:
        x = float(x)
        if not math.isfinite(x):
            raise ValueError(f"non-finite outcome: {x}")
        self.count += 1
        w = max(1.0 / self.count, self.alpha)
        if self.count > 1:
            self.dev += max(1.0 / (self.count - 1), self.alpha) * (abs(x - self.mean) - self.dev)
        self.mean += w * (x - self.mean)

    def to_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "mean": self.mean, "dev": self.dev, "count": self.count}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OutcomeBaseline:
        b = cls(alpha=float(d["alpha"]))
        b.mean, b.dev, b.count = float(d["mean"]), float(d["dev"]), int(d["count"])
        return b


class OutcomeHistory:
    """A tenant's outcome baseline as of each outcome's event time.

    `OutcomeBaseline` folds outcomes in the order it is given them, and outcomes reach
    the write path in the order the feedback topic's partitions are fetched. Here the
    last ``keep`` outcomes are held sorted by (event time, outcome id) and the surprise
    of an outcome is taken against ``base`` (every older outcome, folded) plus the held
    ones before it: the same whatever order they arrived in, as long as an outcome is
    not later than ``keep`` outcomes. An outcome id seen before is not counted again (an
    at-least-once replay). An outcome without an event time is placed after every held
    one, in arrival order.
    """

    def __init__(self, alpha: float = 0.05, keep: int = 64) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.base = OutcomeBaseline(alpha)
        self.keep = int(keep)
        self.held: list[tuple[int, int, str, float]] = []  # (ts, untimed, id, x), sorted
        self.untimed = 0

    def _key(self, ts: int | None, outcome_id: str) -> tuple[int, int, str]:
        if ts is not None:
            return (int(ts), 0, outcome_id)
        last = self.held[-1][0] if self.held else 0
        return (last, 1, f"{self.untimed:012d}")

    def seen(self, outcome_id: str) -> bool:
        return any(h[2] == outcome_id for h in self.held)

    def surprise(self, x: float, ts: int | None = None, outcome_id: str = "") -> float | None:
        """`OutcomeBaseline.surprise` of `x` against the outcomes before it in event time."""
        key = self._key(ts, outcome_id)
        b = OutcomeBaseline.from_dict(self.base.to_dict())
        for h in self.held:
            if h[:3] >= key:
                break
            b.observe(h[3])
        return b.surprise(x)

    def observe(self, x: float, ts: int | None = None, outcome_id: str = "") -> bool:
        """Hold an outcome (False: that id was held already); the oldest beyond ``keep``
        are folded into ``base``."""
        if ts is not None and self.seen(outcome_id):
            return False
        if not math.isfinite(float(x)):
            raise ValueError(f"non-finite outcome: {x}")
        key = self._key(ts, outcome_id)
        if ts is None:
            self.untimed += 1
        bisect.insort(self.held, (*key, float(x)))
        while len(self.held) > self.keep:
            self.base.observe(self.held.pop(0)[3])
        return True

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base.to_dict(), "keep": self.keep, "untimed": self.untimed,
                "held": [list(h) for h in self.held]}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OutcomeHistory:
        """Also reads a bare `OutcomeBaseline` dict (checkpoints that kept only that)."""
        if "base" not in d:
            h = cls(alpha=float(d["alpha"]))
            h.base = OutcomeBaseline.from_dict(d)
            return h
        h = cls(keep=int(d["keep"]))
        h.base = OutcomeBaseline.from_dict(d["base"])
        h.untimed = int(d["untimed"])
        h.held = [(int(a), int(b), str(c), float(x)) for a, b, c, x in d["held"]]
        return h
