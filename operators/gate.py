"""The dopamine gate: route a transition to core, buffer or drop by its smoothed |RPE|.

- Policy and state are separate. ``Gate`` is an immutable, validated policy
  (built by ``Gate.percentile`` or ``Gate.fixed``); ``GateState`` holds the
  per-tenant decayed quantile sketch and is what a changelogged table stores.
- Decide, then learn: a score is routed with the thresholds as they were
  before it arrived, and only then added to the sketch, so a decision never
  depends on itself and replaying the same stream gives the same routes.
  Every score is decided and added in turn (``decide_many``), never with
  thresholds fixed for a micro-batch: the routes are a function of the
  sequence of scores, not of how a consumer happened to batch them.
- Percentile thresholds: theta_low = max(Q(q_low), floor'),
  theta_high = max(Q(q_high), floor, theta_low). The absolute floor stops a
  quiet tenant (all scores tiny) from filling core with noise just because some
  score is always in its top decile.
- Bulk edge: floor' = min(floor, median + max(outlier_k * 1.4826 * MAD,
  min_separation)). In a sparse-reward stream (most steps mundane) Q(q_low) and
  Q(q_high) both sit inside the mundane bulk, so with the floor alone
  theta_low = theta_high = floor, the buffer band is empty and the three-way
  route degenerates to keep/drop. Scores past the bulk edge but below the floor
  therefore go to the buffer (reason ``above_bulk``): the middle tier, kept
  short-lived by maintenance's buffer TTL and floor. Core routing does not
  depend on the bulk edge, and in a dense stream (bulk edge above the floor) it
  changes nothing. ``min_separation`` (0.1 of the tenant's RPE scale, scale free
  like every threshold here) keeps a near-constant stream (MAD ~ 0) from calling
  tiny wiggles "separated".
- Robust outlier rule: s >= median + max(outlier_k * 1.4826 * MAD, floor) and
  s >= floor goes to core even below theta_high. Frequent real surprises (a
  cliff hit in 20-30 % of steps) pull q_high into their own mass, which would
  push half of them into the buffer just because they are frequent; relative
  to the bulk of ordinary scores they are still clear outliers. The margin is
  never below ``floor`` so a near-constant score stream (MAD ~ 0) does not turn
  tiny wiggles into core.
- Warm-up (fewer than ``warmup`` scores seen): quantiles of a handful of
  points are noise, so fixed multiples of the floor are used instead:
  core if s >= warmup_core_factor * floor (default 3x), buffer if s >= floor,
  else drop; reason "warmup" for all three. Scores are in units of the
  tenant's RPE sigma, so the defaults mean buffer above half a sigma and core
  above 1.5 sigma.
- Gate strength g = sigmoid(alpha * s - beta) is reported with every decision
  (it is stored with the memory), independent of the route.

Why the bulk edge: docs/design/2026-11-30-gate-percentiles.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from operators.sketch import DecayedQuantileSketch
from schemas.models import Route

__all__ = ["Gate", "GateDecision", "GateState", "Reason", "sigmoid"]

Reason = Literal[
    "above_high", "outlier", "between", "above_bulk", "below_low", "below_floor", "warmup"
]
MAD_TO_SIGMA = 1.4826


def sigmoid(x: float) -> float:
    """Numerically stable logistic function."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@dataclass(frozen=True)
class GateDecision:
    route: Route
    score: float
    gate: float
    theta_low: float
    theta_high: float
    reason: Reason


@dataclass
class GateState:
    """Per-tenant mutable gate state: the decayed sketch of past scores."""

    sketch: DecayedQuantileSketch = field(default_factory=DecayedQuantileSketch)

    @property
    def count(self) -> int:
        return self.sketch.count

    def to_dict(self) -> dict[str, Any]:
        return {"sketch": self.sketch.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GateState:
        return cls(sketch=DecayedQuantileSketch.from_dict(d["sketch"]))


def _check_finite(name: str, v: float) -> None:
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")


@dataclass(frozen=True)
class Gate:
    """Immutable gate policy; build with ``Gate.percentile`` or ``Gate.fixed``."""

    kind: Literal["percentile", "fixed"]
    q_low: float = 0.5
    q_high: float = 0.9
    floor: float = 0.5
    outlier_k: float = 3.0
    alpha: float = 2.0
    beta: float = 2.0
    half_life: float = 5000.0
    warmup: int = 50
    warmup_core_factor: float = 3.0
    min_separation: float = 0.1
    theta_low: float = 0.0
    theta_high: float = 0.0

    def __post_init__(self) -> None:
        _check_finite("alpha", self.alpha)
        _check_finite("beta", self.beta)
        if self.kind == "percentile":
            for name in ("q_low", "q_high"):
                q = getattr(self, name)
                if not 0.0 < q < 1.0:
                    raise ValueError(f"{name} must be in (0, 1), got {q}")
            if self.q_low >= self.q_high:
                raise ValueError(f"q_low ({self.q_low}) must be < q_high ({self.q_high})")
            _check_finite("floor", self.floor)
            if self.floor < 0:
                raise ValueError(f"floor must be >= 0, got {self.floor}")
            _check_finite("outlier_k", self.outlier_k)
            if self.outlier_k <= 0:
                raise ValueError(f"outlier_k must be > 0, got {self.outlier_k}")
            if not self.half_life > 0:
                raise ValueError(f"half_life must be > 0 (or inf), got {self.half_life}")
            if self.warmup < 0:
                raise ValueError(f"warmup must be >= 0, got {self.warmup}")
            _check_finite("warmup_core_factor", self.warmup_core_factor)
            if self.warmup_core_factor < 1.0:
                raise ValueError(f"warmup_core_factor must be >= 1, got {self.warmup_core_factor}")
            _check_finite("min_separation", self.min_separation)
            if self.min_separation < 0:
                raise ValueError(f"min_separation must be >= 0, got {self.min_separation}")
        elif self.kind == "fixed":
            _check_finite("theta_low", self.theta_low)
            _check_finite("theta_high", self.theta_high)
            if self.theta_low < 0:
                raise ValueError(f"theta_low must be >= 0, got {self.theta_low}")
            if self.theta_low > self.theta_high:
                raise ValueError(
                    f"theta_low ({self.theta_low}) must be <= theta_high ({self.theta_high})"
                )
        else:
            raise ValueError(f"unknown gate kind {self.kind!r}")

    # ----------------------------------------------------------- constructors

    @classmethod
    def percentile(
        cls,
        q_low: float = 0.5,
        q_high: float = 0.9,
        floor: float = 0.5,
        outlier_k: float = 3.0,
        alpha: float = 2.0,
        beta: float = 2.0,
        half_life: float = 5000.0,
        warmup: int = 50,
        warmup_core_factor: float = 3.0,
        min_separation: float = 0.1,
    ) -> Gate:
        """Adaptive thresholds from the tenant's decayed score distribution."""
        return cls(
            kind="percentile",
            q_low=float(q_low),
            q_high=float(q_high),
            floor=float(floor),
            outlier_k=float(outlier_k),
            alpha=float(alpha),
            beta=float(beta),
            half_life=float(half_life),
            warmup=int(warmup),
            warmup_core_factor=float(warmup_core_factor),
            min_separation=float(min_separation),
        )

    @classmethod
    def fixed(
        cls, theta_low: float, theta_high: float, alpha: float = 2.0, beta: float = 2.0
    ) -> Gate:
        """Constant thresholds (tests, baselines, tenants that want predictability)."""
        return cls(
            kind="fixed",
            theta_low=float(theta_low),
            theta_high=float(theta_high),
            floor=float(theta_low),
            alpha=float(alpha),
            beta=float(beta),
            warmup=0,
        )

    # ------------------------------------------------------------------- API

    def new_state(self) -> GateState:
        """A fresh per-tenant state whose sketch decays with this policy's half-life."""
        hl = self.half_life if self.kind == "percentile" else 5000.0
        return GateState(sketch=DecayedQuantileSketch(half_life=hl))

    def strength(self, score: float) -> float:
        """g = sigmoid(alpha * s - beta)."""
        return sigmoid(self.alpha * score - self.beta)

    def thresholds(self, state: GateState) -> tuple[float, float]:
        """(theta_low, theta_high) that the next decision would use."""
        return self.plan(state)[:2]

    def plan(self, state: GateState) -> tuple[float, float, float]:
        """(theta_low, theta_high, outlier threshold) from the current sketch.

        Every decision of a percentile gate past warm-up computes the sketch's
        median/MAD (the outlier threshold, and theta_low where Q(q_low) is below the
        floor), the costliest step of a decision, so `DecayedQuantileSketch.median_mad`
        evaluates the CDF in C (``np.interp``). The outlier threshold is +inf for
        fixed gates and during warm-up.
        """
        if self.kind == "fixed":
            return (self.theta_low, self.theta_high, math.inf)
        if state.sketch.count < self.warmup or state.sketch.count == 0:
            return (self.floor, self.warmup_core_factor * self.floor, math.inf)
        q_low = state.sketch.quantile(self.q_low)
        med, mad = state.sketch.median_mad()
        spread = self.outlier_k * MAD_TO_SIGMA * mad
        floor = self.floor
        if q_low < floor:
            floor = min(floor, med + max(spread, self.min_separation))
        t_low = max(q_low, floor)
        t_high = max(state.sketch.quantile(self.q_high), self.floor, t_low)
        return (t_low, t_high, med + max(spread, self.floor))

    def route(self, plan: tuple[float, float, float], s: float) -> tuple[Route, Reason]:
        """Route one score under a plan (``plan``); the same rule for batches and singles."""
        t_low, t_high, out_thr = plan
        if self.kind == "fixed":
            if s >= t_high:
                return ("core", "above_high")
            if s >= t_low:
                return ("buffer", "between")
            return ("drop", "below_low")
        if s >= t_high:
            return ("core", "above_high")
        if s >= self.floor and s >= out_thr:
            return ("core", "outlier")
        if s >= t_low:
            return ("buffer", "between" if s >= self.floor else "above_bulk")
        if s < self.floor:
            return ("drop", "below_floor")
        return ("drop", "below_low")

    def _route(
        self, state: GateState, plan: tuple[float, float, float], s: float
    ) -> tuple[Route, Reason]:
        if self.kind == "percentile" and (
            state.sketch.count < self.warmup or state.sketch.count == 0
        ):
            route: Route = "core" if s >= plan[1] else "buffer" if s >= plan[0] else "drop"
            return (route, "warmup")
        return self.route(plan, s)

    def decide(self, state: GateState, score: float) -> GateDecision:
        """Route with the current thresholds, then add the score to ``state``."""
        return self.decide_planned(state, score)[0]

    def decide_planned(
        self, state: GateState, score: float
    ) -> tuple[GateDecision, tuple[float, float, float]]:
        """``decide``, and the plan it routed under (what a later re-routing of the same
        score, as of this point of the stream, must use)."""
        s = float(score)
        if not math.isfinite(s) or s < 0:
            raise ValueError(f"gate score must be finite and >= 0, got {score}")
        plan = self.plan(state)
        route, reason = self._route(state, plan, s)
        state.sketch.add(s)
        decision = GateDecision(
            route=route,
            score=s,
            gate=self.strength(s),
            theta_low=plan[0],
            theta_high=plan[1],
            reason=reason,
        )
        return decision, plan

    def decide_many(self, state: GateState, scores: Iterable[float]) -> list[GateDecision]:
        """Sequential ``decide``: each score sees the ones before it."""
        return [self.decide(state, s) for s in scores]
