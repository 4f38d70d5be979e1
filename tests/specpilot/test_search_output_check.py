"""The unforced-output check: a first divergence from the reference is accepted (and reported)
only where the reference's top-1/top-2 margin is a near-tie, by the forcing report's tolerance;
anywhere else it rejects the candidate, naming the prompt, the position and the margin."""
import os

import pytest
import torch

from specpilot.cost import CostModel, measure_device, measure_rank_profile
from specpilot.deploy import build_deployment
from specpilot.ir import SetDraftLength, program_id, stock_program
from specpilot.prompts import load_prompts
from specpilot.report import round_markdown
from specpilot.runtime.ar import ARResult
from specpilot.runtime.decoder import force_program, load_pair, timed_program
from specpilot.runtime.forcing import default_tolerance
from specpilot.search.candidates import make_candidate
from specpilot.search.evaluate import Evaluator
from specpilot.search.output_check import check_output, first_divergences
from specpilot.search.round import RoundInputs, evaluate
from test_search_support import (agreeing_pair, one_thread, perturbed_copy,  # noqa: F401
                                 small_settings)

TOL = 0.5          # bfloat16's default near-tie tolerance


def random_reference(gen, prompts=4, length=12):
    tokens = [torch.randint(1, 97, (length,), generator=gen).tolist() for _ in range(prompts)]
    margins = [(1.0 + 5.0 * torch.rand(length, generator=gen)).tolist() for _ in range(prompts)]
    return ARResult(tokens, margins)


def flipped(row, p, gen):
    """`row` up to position p, then a different token there and fresh tokens after it."""
    other = (row[p] % 96) + 1
    return row[:p] + [other] + torch.randint(1, 97, (len(row) - p - 1,), generator=gen).tolist()


def test_a_near_tie_divergence_is_accepted_and_a_clear_one_rejected():
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    ref = random_reference(gen)
    near_p, clear_p = int(torch.randint(0, 12, (1,), generator=gen)), 5
    ref.margins[1][near_p] = TOL * float(torch.rand(1, generator=gen)) * 0.99   # a genuine tie
    outputs = [list(t) for t in ref.tokens]
    outputs[1] = flipped(ref.tokens[1], near_p, gen)

    found = first_divergences(outputs, ref)
    assert [(d.prompt, d.position) for d in found] == [(1, near_p)]
    assert found[0].margin == ref.margins[1][near_p]
    accepted = check_output(found, 4, TOL)
    assert accepted.passed and accepted.exact_prompts == 3
    assert [(d.prompt, d.position) for d in accepted.near_ties] == [(1, near_p)]
    assert accepted.to_json()["near_tie_count"] == 1

    outputs[3] = flipped(ref.tokens[3], clear_p, gen)          # margin there is >= 1.0
    rejected = check_output(first_divergences(outputs, ref), 4, TOL)
    assert not rejected.passed
    assert len(rejected.near_ties) == 1                      # the tie is still reported
    reason = rejected.reason()
    assert f"prompt 3 position {clear_p}" in reason
    assert f"margin {ref.margins[3][clear_p]:.3g}" in reason
    assert "prompt 1" not in reason


def test_only_the_first_divergence_counts_and_an_early_stop_is_rejected():
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    ref = random_reference(gen, prompts=2)
    ref.margins[0][2] = TOL / 10
    outputs = [flipped(ref.tokens[0], 2, gen), ref.tokens[1][:7]]
    check = check_output(first_divergences(outputs, ref), 2, TOL)
    # prompt 0: later differences follow from the tie at 2; prompt 1 stopped without a token
    assert [(d.prompt, d.position) for d in check.near_ties] == [(0, 2)]
    assert [(d.prompt, d.position, d.got_token) for d in check.divergences] == [(1, 7, None)]
    assert "prompt 1 stops at position 7" in check.reason()
    # float32: a margin that counts as a tie in bfloat16 is a clear one
    strict = check_output(first_divergences(outputs[:1], ARResult(ref.tokens[:1],
                                                                  ref.margins[:1])),
                          1, default_tolerance(torch.float32))
    assert not strict.passed


def test_a_reference_without_margins_rejects_with_the_margin_unknown():
    # A plain ARResult keeps no margins: the divergence cannot count as a tie, and the reason
    # says the margin is unknown instead of failing to format it.
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    ref = random_reference(gen, prompts=2)
    bare = ARResult(ref.tokens, [])
    check = check_output(first_divergences([flipped(ref.tokens[0], 4, gen), ref.tokens[1]],
                                           bare), 2, TOL)
    assert not check.passed and [(d.prompt, d.position) for d in check.divergences] == [(0, 4)]
    assert "prompt 0 position 4" in check.reason() and "margin unknown" in check.reason()


class ForcedCleanTimedLossy(Evaluator):
    """Forces every Program with the stock pair (forcing passes), but runs the unforced, timed
    runs of the Programs in `lossy_ids` with a perturbed target: their unforced text diverges
    from the reference although forcing found nothing."""

    def __init__(self, *args, lossy_dir, lossy_ids, **kw):
        super().__init__(*args, **kw)
        self.lossy_pair = load_pair(lossy_dir, self.drafter_dir, self.dtype, self.device)
        self.lossy_ids = lossy_ids

    def force(self, program):
        return force_program(program, self.stock_pair, self.prompts, self.reference)

    def pair_for(self, program):
        if program_id(program) in self.lossy_ids:
            return self.lossy_pair
        return super().pair_for(program)


@pytest.fixture(scope="module")
def lossy_setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lossy")
    target, drafter = agreeing_pair(tmp)
    lossy = perturbed_copy(target, os.path.join(str(tmp), "lossy"), 0.05, seed=5)
    settings = small_settings(tmp, target, drafter, timing_repeats=1)
    stock = stock_program(build_deployment(target, drafter, gpu="cpu", dtype="float32"))
    candidate = make_candidate(stock, (SetDraftLength(2),), "topology")
    probe = load_pair(target, drafter, "float32", "cpu")
    prompts = [probe.encode(t) for t in load_prompts(settings.workload)]
    evaluator = ForcedCleanTimedLossy(target, drafter, "float32", "cpu", prompts, 16, 1,
                                      lossy_dir=lossy, lossy_ids={candidate.id})
    real = evaluator.reference
    # where the candidate's unforced text first leaves the reference, found by hand
    out = timed_program(candidate.program, evaluator.lossy_pair, prompts, 16).tokens
    firsts = {}
    for r, (got, want) in enumerate(zip(out, real.tokens)):
        p = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
        if p is not None:
            firsts[r] = p
    assert firsts, "the perturbed target writes the reference text: perturb it more"
    acceptance = measure_rank_profile(evaluator.stock_pair.drafter, prompts, real.tokens)
    inputs = RoundInputs(1, stock, CostModel(measure_device("cpu", repeats=1)), acceptance,
                         evaluator, [], None, settings, str(tmp / "kernels"), 32,
                         progress=lambda _: None)
    return inputs, candidate, real, firsts


def test_evaluate_accepts_near_tie_divergences_and_reports_them(lossy_setup):
    inputs, candidate, real, firsts = lossy_setup
    tol = default_tolerance(torch.float32)
    margins = [list(m) for m in real.margins]
    for r, p in firsts.items():
        margins[r][p] = tol / 4                     # hand-built: genuine ties there
    inputs.evaluator.reference = ARResult(real.tokens, margins, real.target_forwards)
    try:
        o = evaluate(inputs, candidate, threshold=-1.0)
    finally:
        inputs.evaluator.reference = real
    assert o.forcing["passed"] and o.stage == "admitted", o.reason
    assert o.output["passed"] and o.output["near_tie_count"] == len(firsts)
    assert {(d["prompt"], d["position"]) for d in o.output["near_ties"]} == set(firsts.items())
    assert o.output["tolerance"] == o.forcing["tolerance"]
    text = round_markdown({"round": 1, "outcomes": [o.to_json()]}, "")
    for r, p in firsts.items():
        assert f"prompt {r} position {p} margin" in text
    assert f"{len(firsts)} near-tie divergences" in text


def test_evaluate_rejects_a_divergence_at_a_clear_margin(lossy_setup):
    inputs, candidate, real, firsts = lossy_setup
    tol = default_tolerance(torch.float32)
    assert all(real.margins[r][p] >= tol for r, p in firsts.items())   # float32: no ties
    o = evaluate(inputs, candidate, threshold=-1.0)
    assert o.forcing["passed"] and o.stage == "output" and not o.admitted
    assert o.gain is None
    r, p = min(firsts.items())
    assert f"prompt {r} position {p}" in o.reason
    assert f"margin {real.margins[r][p]:.3g}" in o.reason
    assert o.output["near_tie_count"] == 0
    assert len(o.output["divergences"]) == len(firsts)
