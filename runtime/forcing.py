"""Token forcing: the correctness gate every candidate decoder passes before it is admitted.

The stock Program's greedy AR output (`generate_ar`, which records the top-1 minus top-2 logit
margin at every generated position) is the reference. The candidate runs forced
(`speculative_generate(..., force_reference=...)`): it drafts, verifies and accepts by its own
rules, but commits the reference tokens, so each reference position of each prompt is proposed
once, after the reference prefix, even after a disagreement. A proposal that differs from the
reference is tolerated only where the reference's margin there is below the tolerance (a
near-tie that differently shaped kernels may round either way); anywhere else it is a
violation, and one violation rejects the candidate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional, Sequence

import torch

from specpilot.ir.errors import SpecPilotError

from .acceptance import greedy_accept
from .speculative import speculative_generate

# A near-tie is "a few units in the last place" of a typical top-1 logit, in the model's dtype.
TOLERANCE_ULPS = 4
TYPICAL_TOP1_LOGIT = 16.0


def default_tolerance(dtype: torch.dtype, top1_magnitude: float = TYPICAL_TOP1_LOGIT,
                      ulps: int = TOLERANCE_ULPS) -> float:
    """The margin below which a flipped argmax counts as rounding, not as a bug.

    Logits come out of the final matmul rounded to the model's dtype, so two kernels that
    accumulate in a different order (other tile shapes, split-k, a verification forward of T
    tokens instead of 1) can each land a logit on a neighbouring grid point: one rounding moves
    the top-1/top-2 margin by up to one unit in the last place (ulp) of the logits' magnitude,
    and the hidden state feeding the head carries a few more ulps of its own. We tolerate
    `ulps` (default 4) ulps at `top1_magnitude`: the grid spacing there is
    magnitude * 2**-mantissa_bits (torch.finfo(dtype).eps * 2**floor(log2(magnitude))).
    Trained models put top-1 logits around 16-32, so the default magnitude is 16, giving
    bfloat16 (8 significant bits, spacing 0.125) 0.5, float16 (11 bits) 0.0625 and float32
    (24 bits) about 7.6e-6. A real bug flips tokens whose margins are far larger.
    """
    if top1_magnitude <= 0:
        raise SpecPilotError(f"top1_magnitude must be positive, got {top1_magnitude}")
    spacing = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(top1_magnitude))
    return ulps * spacing


class Disagreement(NamedTuple):
    prompt: int        # index of the request
    position: int      # index among its generated tokens
    ref_token: int
    got_token: int
    margin: float      # the reference's top-1 minus top-2 logit at that position


@dataclass
class ForcingReport:
    positions_compared: int
    positions_expected: int                       # total reference tokens
    exact: int
    tolerance: float
    near_tie_flips: List[Disagreement] = field(default_factory=list)
    violations: List[Disagreement] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """No violation, and every reference position was compared."""
        return not self.violations and self.positions_compared == self.positions_expected

    def format(self) -> str:
        verdict = "PASSED" if self.passed else "REJECTED"
        lines = [f"token forcing {verdict}: {self.positions_compared}/{self.positions_expected} "
                 f"positions compared, {self.exact} exact, {len(self.near_tie_flips)} near-tie "
                 f"flips (margin < {self.tolerance:.3g}), {len(self.violations)} violations"]
        for title, rows in (("violation", self.violations), ("near-tie flip", self.near_tie_flips)):
            for d in rows:
                lines.append(f"  {title}: prompt {d.prompt} position {d.position}: reference "
                             f"token {d.ref_token}, got {d.got_token} (margin {d.margin:.3g})")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"passed": self.passed, "positions_compared": self.positions_compared,
                "positions_expected": self.positions_expected, "exact": self.exact,
                "tolerance": self.tolerance,
                "near_tie_flips": [d._asdict() for d in self.near_tie_flips],
                "violations": [d._asdict() for d in self.violations]}

    def __str__(self) -> str:
        return self.format()


def compare_to_reference(proposals: Sequence[Sequence[int]], reference,
                         tolerance: float) -> ForcingReport:
    """Classify the candidate's proposed token at each reference position.

    proposals[r][p] is what the candidate proposed at generated position p of request r (after
    the reference prefix); `reference` is an ARResult (tokens and margins per request).
    Missing positions count against coverage; a near-tie is margin < tolerance (strict).
    """
    if len(proposals) != len(reference.tokens):
        raise SpecPilotError(f"{len(proposals)} candidate requests for {len(reference.tokens)} "
                             f"reference requests: force with the reference's prompts")
    report = ForcingReport(0, sum(len(t) for t in reference.tokens), 0, float(tolerance))
    for r, (got, ref, margins) in enumerate(zip(proposals, reference.tokens, reference.margins)):
        for p, (g, want, margin) in enumerate(zip(got, ref, margins)):
            report.positions_compared += 1
            if g == want:
                report.exact += 1
                continue
            d = Disagreement(r, p, int(want), int(g), float(margin))
            (report.near_tie_flips if margin < tolerance else report.violations).append(d)
    return report


def resolve_tolerance(tolerance: Optional[float], dtype: torch.dtype) -> float:
    """The near-tie tolerance to use: `default_tolerance(dtype)` for None, else the value given
    (which must be >= 0; 0.0 tolerates nothing)."""
    if tolerance is None:
        return default_tolerance(dtype)
    if tolerance < 0:
        raise SpecPilotError(f"the forcing tolerance must be >= 0, got {tolerance}")
    return float(tolerance)


def force_tokens(target, drafter, prompts: Sequence[Sequence[int]], shape, reference,
                 acceptance=greedy_accept, tolerance: Optional[float] = None) -> ForcingReport:
    """Run the candidate (target, drafter, draft topology, acceptance rule) forced on the
    reference and report every disagreement. tolerance=None uses
    `default_tolerance(target.dtype)`; pass 0.0 to tolerate nothing."""
    tolerance = resolve_tolerance(tolerance, target.dtype)
    longest = max((len(t) for t in reference.tokens), default=0)
    forced = speculative_generate(target, drafter, prompts, longest, shape,
                                  acceptance=acceptance, force_reference=reference)
    return compare_to_reference(forced.proposals, reference, tolerance)

