"""How each benchmarked system's output is checked against the stock decoder's reference.

Our systems are token-forced (every reference position compared, near-ties tolerated, see
runtime/forcing.py); plain AR decoders are forced by feeding them the reference token at every
step and recording their own argmax. HF systems use other kernels whose bf16 rounding may
legitimately flip near-ties, so they only get an exact-match count, reported, never failed.
"""
from __future__ import annotations

from typing import Sequence

import torch

from specpilot.runtime.ar import ARResult
from specpilot.runtime.forcing import ForcingReport, compare_to_reference, default_tolerance

MAX_LISTED_DIVERGENCES = 10


def exact_match(tokens: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> dict:
    """Requests whose output equals the reference exactly, and where the others first differ."""
    exact, matching, divergences = 0, 0, []
    for r, (got, want) in enumerate(zip(tokens, reference)):
        got, want = list(got), list(want)
        if got == want:
            exact += 1
            matching += len(want)
            continue
        prefix = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w),
                      min(len(got), len(want)))
        matching += prefix
        if len(divergences) < MAX_LISTED_DIVERGENCES:
            divergences.append({"request": r, "position": prefix})
    return {"requests": len(reference), "exact_requests": exact,
            "all_exact": exact == len(reference), "matching_prefix_tokens": matching,
            "reference_tokens": sum(len(t) for t in reference), "first_divergences": divergences}


def forcing_report(proposals: Sequence[Sequence[int]], reference: ARResult,
                   dtype: torch.dtype) -> ForcingReport:
    """Classify proposals at every reference position with the default near-tie tolerance."""
    return compare_to_reference(proposals, reference, default_tolerance(dtype))


def forcing_json(report: ForcingReport) -> dict:
    """The report's JSON with the counts a results table needs up front."""
    out = report.to_json()
    out["violation_count"] = len(report.violations)
    out["near_tie_flip_count"] = len(report.near_tie_flips)
    return out
