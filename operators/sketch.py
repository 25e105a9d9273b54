"""Exponentially decayed quantile sketch over non-negative values (|RPE| scores).

Design decisions:

- A fixed histogram, not a t-digest/KLL: fixed size (``bins`` floats), trivially
  mergeable, JSON-serialisable as a list of floats, and O(1) per insert, which
  suits a changelogged per-tenant table that is written on every batch.
- Bins: the first bin is [lo, a) and the remaining ``bins - 1`` are log-spaced
  between a = ``min_positive`` (default hi * 1e-4) and ``hi``, i.e. ~1.8 %
  relative width with the defaults (512 bins, hi 64). Relative precision is
  what matters for thresholds on |RPE|, from 0.01 to tens of sigmas. Values
  above ``hi`` land in the last bin; exact min and max are tracked and bound
  the interpolation inside the first and last occupied bins.
- The CDF is treated as piecewise linear (uniform within a bin). quantile(),
  rank() and median_mad() are all evaluated on that same CDF, so they agree.
- Decay is counted in observations, not time: each new observation weighs
  2^(1/half_life) times the previous one, i.e. an observation ``half_life``
  inserts old weighs half. No clock is needed and replays are deterministic.
  Weights are kept in a growing scale and renormalised before they could
  overflow; ``total_weight`` reports decayed units (a fresh observation
  weighs 1). half_life = inf means no decay.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["DecayedQuantileSketch"]

_RENORM_AT = 1e100
_MAX_LOG2_CHUNK = 200.0  # max growth exponent inside one vectorised chunk


class DecayedQuantileSketch:
    """Decayed histogram sketch; see the module docstring for the rationale."""

    def __init__(
        self,
        bins: int = 512,
        lo: float = 0.0,
        hi: float = 64.0,
        half_life: float = 5000.0,
        min_positive: float | None = None,
    ) -> None:
        if bins < 2:
            raise ValueError(f"bins must be >= 2, got {bins}")
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo < 0 or hi <= lo:
            raise ValueError(f"need finite 0 <= lo < hi, got lo={lo}, hi={hi}")
        if not half_life > 0:  # also rejects NaN
            raise ValueError(f"half_life must be > 0 (or inf), got {half_life}")
        self.bins = int(bins)
        self.lo = float(lo)
        self.hi = float(hi)
        self.half_life = float(half_life)
        if lo > 0:
            edges = np.geomspace(lo, hi, self.bins + 1)
            self.min_positive = float(lo)
        else:
            a = hi * 1e-4 if min_positive is None else float(min_positive)
            if not 0 < a < hi:
                raise ValueError(f"min_positive must be in (0, hi), got {a}")
            edges = np.concatenate([[0.0], np.geomspace(a, hi, self.bins)])
            self.min_positive = a
        self.edges = edges
        self._edge_list: list[float] = edges.tolist()
        self._growth_log2 = 0.0 if math.isinf(self.half_life) else 1.0 / self.half_life
        self._growth = 2.0**self._growth_log2
        self.weights = np.zeros(self.bins, dtype=np.float64)
        self._scale = 1.0  # weight the next observation gets
        self.count = 0
        self.min = math.inf
        self.max = -math.inf
        self._cdf: tuple[np.ndarray, np.ndarray] | None = None
        self._has_weight = False  # any positive weight (set with the curve)

    # ---------------------------------------------------------------- inserts

    def _renormalise(self) -> None:
        if self._scale != 1.0:
            self.weights /= self._scale
            self._scale = 1.0

    def _index(self, xs: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.edges, xs, side="right") - 1
        return np.minimum(np.maximum(idx, 0), self.bins - 1)

    def _index1(self, x: float) -> int:
        i = bisect.bisect_right(self._edge_list, x) - 1
        return 0 if i < 0 else min(i, self.bins - 1)

    def add(self, x: float) -> None:
        """Insert one observation (negative values are clamped into the first bin)."""
        xf = float(x)
        if not math.isfinite(xf):
            raise ValueError(f"sketch values must be finite, got {x}")
        self.weights[self._index1(xf)] += self._scale
        self._scale *= self._growth
        if self._scale > _RENORM_AT:
            self._renormalise()
        self.count += 1
        if xf < self.min:
            self.min = xf
        if xf > self.max:
            self.max = xf
        self._cdf = None

    def add_many(self, xs: Iterable[float] | np.ndarray) -> None:
        """Insert in order; equivalent to repeated ``add`` but vectorised."""
        arr = np.asarray(list(xs) if not isinstance(xs, np.ndarray) else xs, dtype=np.float64)
        arr = arr.reshape(-1)
        n = arr.shape[0]
        if n == 0:
            return
        if not np.isfinite(arr).all():
            raise ValueError("sketch values must be finite")
        idx = self._index(arr)
        if self._growth_log2 == 0.0:
            self.weights += np.bincount(idx, minlength=self.bins) * self._scale
        else:
            chunk = max(1, int(_MAX_LOG2_CHUNK / self._growth_log2))
            for start in range(0, n, chunk):
                self._renormalise()
                part = idx[start : start + chunk]
                w = np.exp2(np.arange(part.shape[0], dtype=np.float64) * self._growth_log2)
                self.weights += np.bincount(part, weights=w, minlength=self.bins)
                self._scale = float(np.exp2(part.shape[0] * self._growth_log2))
            if self._scale > _RENORM_AT:
                self._renormalise()
        self.count += n
        self.min = min(self.min, float(arr.min()))
        self.max = max(self.max, float(arr.max()))
        self._cdf = None

    def merge(self, other: DecayedQuantileSketch) -> DecayedQuantileSketch:
        """Add another sketch's (decayed) weights into this one; returns self.

        Both sketches' newest observations count as equally fresh.
        """
        if (other.bins, other.lo, other.hi, other.min_positive) != (
            self.bins,
            self.lo,
            self.hi,
            self.min_positive,
        ):
            raise ValueError("cannot merge sketches with different bin layouts")
        self.weights += (other.weights / other._scale) * self._scale
        self.count += other.count
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        self._cdf = None
        return self

    # ---------------------------------------------------------------- queries

    @property
    def total_weight(self) -> float:
        """Sum of decayed weights; the newest observation weighs exactly 1."""
        return float(self.weights.sum() * self._growth / self._scale)

    def _curve(self) -> tuple[np.ndarray, np.ndarray]:
        """Piecewise-linear CDF knots (xs, ys) with ys in [0, 1]."""
        if self._cdf is None:
            xs = self.edges.copy()
            lo_v = max(self.min, self.lo)
            i_min = self._index1(lo_v)
            i_max = self._index1(self.max)
            xs[i_min] = lo_v
            xs[i_max + 1] = max(self.max, xs[i_max])
            if i_max == self.bins - 1:
                xs[self.bins] = max(self.max, xs[i_max])
            cum = np.concatenate([[0.0], np.cumsum(self.weights)])
            total = cum[-1]
            ys = cum / total if total > 0 else cum
            self._cdf = (xs, ys)
            self._has_weight = bool(total > 0)
        return self._cdf

    def _empty(self) -> bool:
        if self.count == 0:
            return True
        self._curve()
        return not self._has_weight

    def quantiles(self, qs: Iterable[float] | np.ndarray) -> np.ndarray:
        """Vectorised ``quantile``."""
        q = np.asarray(qs, dtype=np.float64).reshape(-1)
        q = np.minimum(np.maximum(q, 0.0), 1.0)
        if self._empty():
            return np.full(q.shape, math.nan)
        xs, ys = self._curve()
        i = np.searchsorted(ys, q, side="left")
        i = np.minimum(np.maximum(i, 1), self.bins)
        y0, y1 = ys[i - 1], ys[i]
        span = y1 - y0
        safe = np.where(span > 0, span, 1.0)
        frac = np.minimum(np.maximum((q - y0) / safe, 0.0), 1.0)
        out = xs[i - 1] + frac * (xs[i] - xs[i - 1])
        out = np.where(q <= 0.0, self.min, np.where(q >= 1.0, self.max, out))
        return np.minimum(np.maximum(out, self.min), self.max)

    def quantile(self, q: float) -> float:
        """Value below which a fraction q of the (decayed) weight lies; nan if empty."""
        qf = min(max(float(q), 0.0), 1.0)
        if self._empty():
            return math.nan
        if qf <= 0.0:
            return self.min
        if qf >= 1.0:
            return self.max
        xs, ys = self._curve()
        i = min(max(int(np.searchsorted(ys, qf, side="left")), 1), self.bins)
        y0, y1 = float(ys[i - 1]), float(ys[i])
        x0, x1 = float(xs[i - 1]), float(xs[i])
        frac = min(max((qf - y0) / (y1 - y0), 0.0), 1.0) if y1 > y0 else 0.0
        return min(max(x0 + frac * (x1 - x0), self.min), self.max)

    def ranks(self, xs: Iterable[float] | np.ndarray) -> np.ndarray:
        """Vectorised ``rank``."""
        x = np.asarray(xs, dtype=np.float64).reshape(-1)
        if self._empty():
            return np.full(x.shape, math.nan)
        kx, ky = self._curve()
        i = np.searchsorted(kx, x, side="right") - 1
        i = np.minimum(np.maximum(i, 0), self.bins - 1)
        x0, x1 = kx[i], kx[i + 1]
        width = x1 - x0
        safe = np.where(width > 0, width, 1.0)
        frac = np.where(width > 0, np.minimum(np.maximum((x - x0) / safe, 0.0), 1.0), 1.0)
        r = ky[i] + frac * (ky[i + 1] - ky[i])
        r = np.where(x <= self.min, 0.0, np.where(x > self.max, 1.0, r))
        return np.asarray(r, dtype=np.float64)

    def rank(self, x: float) -> float:
        """Fraction of (decayed) weight below x, in [0, 1]; nan if empty."""
        return float(self.ranks([x])[0])

    def median_mad(self) -> tuple[float, float]:
        """(median, median absolute deviation) of the sketched distribution.

        MAD is the d with F(m + d) - F(m - d) = 1/2. On a piecewise-linear CDF
        that function is piecewise linear in d with knots at |edge - m|, so it
        is solved exactly by evaluating it at the knots and interpolating. F is
        evaluated with ``np.interp`` on the CDF's knots (the same curve as
        `ranks`: 0 up to the minimum, 1 from the maximum on), in two C calls:
        the gate asks for this on every decision.
        """
        if self._empty():
            return (math.nan, math.nan)
        m = self.quantile(0.5)
        kx, ky = self._curve()
        reach = max(self.max - m, m - self.min, 0.0)
        d = np.abs(kx - m)
        d = np.sort(np.concatenate([[0.0, reach], d[d < reach]]))
        g = np.interp(m + d, kx, ky) - np.interp(m - d, kx, ky)
        k = int(np.searchsorted(g, 0.5, side="left"))
        if k == 0:
            return (m, 0.0)
        if k >= d.shape[0]:
            return (m, float(d[-1]))
        g0, g1 = g[k - 1], g[k]
        frac = (0.5 - g0) / (g1 - g0) if g1 > g0 else 1.0
        return (m, float(d[k - 1] + frac * (d[k] - d[k - 1])))

    # ---------------------------------------------------------- serialisation

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (inf/empty encoded as None), weights in decayed units."""
        return {
            "bins": self.bins,
            "lo": self.lo,
            "hi": self.hi,
            "half_life": None if math.isinf(self.half_life) else self.half_life,
            "min_positive": self.min_positive,
            "weights": (self.weights / self._scale).tolist(),
            "count": self.count,
            "min": None if self.count == 0 else self.min,
            "max": None if self.count == 0 else self.max,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecayedQuantileSketch:
        hl = d.get("half_life")
        sk = cls(
            bins=int(d["bins"]),
            lo=float(d["lo"]),
            hi=float(d["hi"]),
            half_life=math.inf if hl is None else float(hl),
            min_positive=float(d["min_positive"]),
        )
        w = np.asarray(d["weights"], dtype=np.float64)
        if w.shape != (sk.bins,):
            raise ValueError(f"expected {sk.bins} weights, got {w.shape}")
        sk.weights = w.copy()
        sk.count = int(d["count"])
        sk.min = math.inf if d.get("min") is None else float(d["min"])
        sk.max = -math.inf if d.get("max") is None else float(d["max"])
        return sk
