"""The unforced-output check: a timed (unforced) run of a candidate against the reference text.

Token forcing compares every position of every prompt; the unforced run then shows whether the
decoder, left to itself, writes the reference text. Where it does not, only the *first*
divergence of a prompt says anything: after it the candidate continues its own text, and every
later difference follows from the first. That first divergence is judged the way token forcing
judges a flipped token: it is tolerated only where the reference's top-1 minus top-2 logit margin
at that position is a near-tie (below the forcing report's tolerance, strictly), because up to
there the candidate saw exactly the reference's context. A near-tie divergence is reported, never
hidden; a divergence at a clear margin (or where one output simply stops) rejects the candidate.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional, Sequence


class OutputDivergence(NamedTuple):
    prompt: int                  # index of the request
    position: int                # index among its generated tokens of the first difference
    ref_token: Optional[int]     # None: the reference ended before `position`
    got_token: Optional[int]     # None: the candidate's output ended before `position`
    margin: Optional[float]      # the reference's top-1 minus top-2 logit there (None: no token)


def first_divergences(outputs: Sequence[Sequence[int]], reference) -> List[OutputDivergence]:
    """The first divergence of every request whose output differs from `reference` (an ARResult:
    tokens and margins per request), in request order."""
    out = []
    for r, (got, want) in enumerate(zip(outputs, reference.tokens)):
        got, want = list(got), list(want)
        if got == want:
            continue
        p = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w),
                 min(len(got), len(want)))
        margins = reference.margins[r] if r < len(reference.margins) else []
        both = p < len(got) and p < len(want)
        out.append(OutputDivergence(
            r, p, int(want[p]) if p < len(want) else None, int(got[p]) if p < len(got) else None,
            float(margins[p]) if both and p < len(margins) else None))
    return out


def _describe(d: OutputDivergence) -> str:
    if d.got_token is None:
        return f"prompt {d.prompt} stops at position {d.position}, the reference goes on"
    if d.ref_token is None:
        return f"prompt {d.prompt} goes on past the reference's end at position {d.position}"
    return (f"prompt {d.prompt} position {d.position}: reference token {d.ref_token}, got "
            f"{d.got_token} (margin {_margin(d.margin)})")


def _margin(margin) -> str:
    # A reference decoded without margins (a plain ARResult) leaves them unknown.
    return "unknown" if margin is None else f"{margin:.3g}"


@dataclass
class OutputCheck:
    """The unforced output of one decoder judged against the reference."""
    prompts: int                                   # requests compared
    tolerance: float                               # the forcing report's near-tie tolerance
    near_ties: List[OutputDivergence] = field(default_factory=list)
    divergences: List[OutputDivergence] = field(default_factory=list)   # at a clear margin

    @property
    def passed(self) -> bool:
        return not self.divergences

    @property
    def exact_prompts(self) -> int:
        return self.prompts - len(self.near_ties) - len(self.divergences)

    def reason(self) -> str:
        """Why the check failed, naming each rejected prompt, position and margin."""
        shown = "; ".join(_describe(d) for d in self.divergences[:4])
        more = (f"; and {len(self.divergences) - 4} more prompts"
                if len(self.divergences) > 4 else "")
        return (f"unforced output differs from the reference at a clear margin (near-tie "
                f"tolerance {self.tolerance:.3g}): {shown}{more}")

    def summary(self) -> str:
        """One line: exact prompts, near-tie divergences with their positions, rejections."""
        text = f"{self.exact_prompts}/{self.prompts} prompts exact"
        if self.near_ties:
            text += (f", {len(self.near_ties)} near-tie divergences ("
                     + ", ".join(f"prompt {d.prompt} position {d.position} margin {d.margin:.3g}"
                                 for d in self.near_ties) + ")")
        if self.divergences:
            text += f", {len(self.divergences)} divergences at a clear margin"
        return text

    def to_json(self) -> dict:
        return {"passed": self.passed, "prompts": self.prompts,
                "exact_prompts": self.exact_prompts, "tolerance": self.tolerance,
                "near_tie_count": len(self.near_ties),
                "near_ties": [d._asdict() for d in self.near_ties],
                "divergences": [d._asdict() for d in self.divergences]}


def check_output(divergences: Sequence[OutputDivergence], prompts: int,
                 tolerance: float) -> OutputCheck:
    """Split first divergences into near-ties (margin < `tolerance`, strictly: the same rule as
    token forcing) and divergences at a clear margin."""
    check = OutputCheck(prompts, float(tolerance))
    for d in divergences:
        near = d.margin is not None and d.margin < tolerance
        (check.near_ties if near else check.divergences).append(d)
    return check


def output_summary(output: Optional[dict]) -> str:
    """`OutputCheck.summary` from its JSON (as round records keep it); '—' for none."""
    if not output:
        return "—"
    check = OutputCheck(output["prompts"], output["tolerance"],
                        [OutputDivergence(**d) for d in output.get("near_ties", [])],
                        [OutputDivergence(**d) for d in output.get("divergences", [])])
    return check.summary()
