"""Reward-prediction-error normalisation (per tenant) and smoothing (per agent).

The smoothing choice, and why:

1. Tenant scale. ``RpeNormalizer`` keeps an EWMA of delta^2 (alpha 0.01, i.e.
   a horizon of ~100 transitions) and returns z = delta / sigma, with sigma
   taken *before* the batch is folded in, so a sudden huge delta is measured
   against the past and is not diluted by itself. RMS rather than std: TD errors
   should be zero-mean when the value model is right, and a persistent bias is
   itself a surprise worth keeping visible. During warm-up (fewer than
   ``warmup`` samples) sigma is the RMS of everything seen *including* the
   current batch, so a tenant whose rewards are +-100 is not divided by an
   arbitrary 1.0 on its first batch (which would route everything to core).
   The first ``warmup`` samples initialise the EWMA with their plain mean, so
   it starts unbiased instead of decaying up from zero.

2. Agent context. ``AgentSmoother`` keeps an EMA of |z| per agent (alpha 0.05,
   ~20 transitions) and scores s = |z| / (1 + kappa * ema_prev). An agent living
   in constant turbulence (every step a large |z|) is judged relative to its own
   recent level, while a calm agent's first big surprise keeps almost its full
   size. kappa (default 0.25) bounds the discount: with ema ~ 4 a |z| is only
   halved, so genuinely large errors still reach the gate; kappa = 0 disables
   agent context (s = |z|). The EMA is updated after scoring, again so an
   observation is not judged against itself.

   Alternatives considered: a per-agent percentile rank of |z| (loses the
   magnitude the gate's strength g needs, costs a sketch per agent, and is
   meaningless for an agent's first transitions); a per-agent z-score of |z|
   (goes negative and explodes when an agent's errors are nearly constant).
   The ratio form is O(1) state per agent and monotone in |z| for a given
   history, which keeps the gate's ordering intuitive.

Valence keeps the sign of delta: +1 a pleasant surprise, -1 a painful lesson.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["AgentSmoother", "RpeNormalizer", "valence"]


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

    def _fold(self, sq: np.ndarray) -> None:
        # Weight max(1/k, alpha) per sample: exact mean while 1/k > alpha,
        # then a plain EWMA; sequential because batches are small.
        m = self.mean_sq
        k = self.count
        a = self.alpha
        for x in sq.tolist():
            k += 1
            w = max(1.0 / k, a)
            m += w * (x - m)
        self.mean_sq = m
        self.count = k

    def normalize(self, deltas: np.ndarray) -> np.ndarray:
        """Return z = delta / sigma_before, then fold the batch into sigma."""
        d = np.asarray(deltas, dtype=np.float64).reshape(-1)
        if d.shape[0] == 0:
            return d.copy()
        if not np.isfinite(d).all():
            raise ValueError("non-finite TD errors")
        sq = d * d
        if self.count < self.warmup:
            total = self.mean_sq * self.count + float(sq.sum())
            sigma = max(math.sqrt(total / (self.count + sq.shape[0])), self.floor)
        else:
            sigma = self.sigma
        self._fold(sq)
        return d / sigma

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
