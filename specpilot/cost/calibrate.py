"""Calibration of the roofline against what was measured.

A measured run time M is modelled as alpha * R + beta * O, where R is the run's roofline seconds
(memory or compute bound per node) and O its launch/sync overhead seconds. Both factors are fitted
by least squares on the relative error over every measurement so far (alpha scales the device's
attainable rates, beta the per-launch overhead of the actual decode loop); with a single
measurement, when the runs' roofline and overhead shares are (nearly) proportional so that the
data cannot tell the factors apart, or when the two-factor fit is degenerate or negative, one
common factor is fitted; otherwise both are pulled weakly towards it.
A prediction made before a run is measured is compared with the measurement, and that error is
what reports print.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class CalibrationPoint:
    label: str
    measured_s: float
    roofline_s: float
    overhead_s: float


@dataclass(frozen=True)
class Calibration:
    alpha: float = 1.0
    beta: float = 1.0
    points: Tuple[CalibrationPoint, ...] = field(default=())

    def predict(self, roofline_s: float, overhead_s: float) -> float:
        return self.alpha * roofline_s + self.beta * overhead_s

    def error(self, point: CalibrationPoint) -> float:
        """Relative error of this calibration's prediction of `point`: (pred - meas) / meas."""
        return self.predict(point.roofline_s, point.overhead_s) / point.measured_s - 1.0

    def with_point(self, point: CalibrationPoint) -> "Calibration":
        """A calibration refitted on the previous points plus `point`."""
        if point.measured_s <= 0 or point.roofline_s < 0 or point.overhead_s < 0:
            return self
        points = self.points + (point,)
        alpha, beta = fit(points)
        return replace(self, alpha=alpha, beta=beta, points=points)

    def to_json(self) -> dict:
        return {"alpha": self.alpha, "beta": self.beta,
                "points": [p.__dict__ for p in self.points]}

    @classmethod
    def from_json(cls, obj: Optional[dict]) -> "Calibration":
        if not obj:
            return cls()
        points = tuple(CalibrationPoint(**p) for p in obj.get("points", ()))
        return cls(float(obj["alpha"]), float(obj["beta"]), points)


# Pull of the prior (alpha = beta = the common factor) against the data: weak next to factors
# the measurements determine.
PRIOR_WEIGHT = 0.01
# Runs whose roofline and overhead seconds stand in (nearly) the same ratio cannot tell the two
# factors apart: above this cosine between the two columns only the common factor is fitted.
COLLINEAR_COSINE = 0.99


def _single_factor(rows: List[Tuple[float, float]]) -> Tuple[float, float]:
    sums = [r + o for r, o in rows]
    denominator = sum(s * s for s in sums)
    scale = sum(sums) / denominator if denominator > 0 else 1.0
    return scale, scale


def fit(points) -> Tuple[float, float]:
    """(alpha, beta) minimising sum(((alpha R + beta O) / M - 1)^2) plus a weak pull of both
    towards the best common factor (PRIOR_WEIGHT); both > 0. A single point fits the common
    factor exactly."""
    rows = [(p.roofline_s / p.measured_s, p.overhead_s / p.measured_s) for p in points]
    scale, _ = _single_factor(rows)
    if len(rows) < 2 or scale <= 0:
        return scale, scale
    # In units of the common factor the prior is (1, 1) and predictions are near 1, so
    # PRIOR_WEIGHT weighs the same whatever the scale of the raw roofline.
    rows = [(r * scale, o * scale) for r, o in rows]
    srr0 = sum(r * r for r, _ in rows)
    soo0 = sum(o * o for _, o in rows)
    if srr0 == 0 or soo0 == 0 or (sum(r * o for r, o in rows)
                                  / math.sqrt(srr0 * soo0)) > COLLINEAR_COSINE:
        return scale, scale
    lam = PRIOR_WEIGHT
    srr = sum(r * r for r, _ in rows) + lam
    soo = sum(o * o for _, o in rows) + lam
    sro = sum(r * o for r, o in rows)
    sr = sum(r for r, _ in rows) + lam
    so = sum(o for _, o in rows) + lam
    det = srr * soo - sro * sro
    if det <= 0:
        return scale, scale
    a = (sr * soo - so * sro) / det
    b = (so * srr - sr * sro) / det
    if a <= 0 or b <= 0:
        return scale, scale
    return a * scale, b * scale
