"""One search round: direction ranking and budget shares, and a round on a tiny pair in which a
candidate computing with perturbed target weights is rejected by token forcing while a lossless
one is forced clean and timed."""
import os
from dataclasses import replace
from types import SimpleNamespace

import pytest

from specpilot.agents import Agent
from specpilot.cost import CostModel, measure_device, measure_rank_profile
from specpilot.deploy import build_deployment
from specpilot.ir import SetDraftLength, SetTopology, Tree, program_id, stock_program
from specpilot.runtime.decoder import load_pair
from specpilot.search.candidates import Candidate
from specpilot.search.evaluate import Evaluator
from specpilot.search.round import (RoundInputs, budgets, rank_directions, run_round, select)
from test_search_support import (agreeing_pair, one_thread, perturbed_copy,  # noqa: F401
                                 small_settings)


class Scripted(Agent):
    def __init__(self, direction, categories, proposals):
        super().__init__()
        self.direction, self.categories, self._proposals = direction, categories, proposals

    def propose(self, program, cost_report, memory, budget):
        self._reset()
        return self._legal(program, self._proposals)[:budget.max_proposals]


def test_directions_are_ranked_by_their_gap_and_share_the_budget():
    report = SimpleNamespace(gap_per_token_s={"weight_movement": 3e-6, "drafting": 1e-6,
                                              "topology": 6e-6, "launch_sync": 0.0})
    agents = [Scripted("weight_format", ("weight_movement", "drafting"), []),
              Scripted("topology", ("topology",), []),
              Scripted("kernels", ("launch_sync",), []),
              Scripted("llm", (), [])]
    ranking = rank_directions(agents, report)
    assert [a.direction for _, a in ranking] == ["llm", "topology", "weight_format", "kernels"]
    assert ranking[0][0] == pytest.approx(10e-6)
    # 6 x 6/10 -> 3, 6 x 4/10 -> 2, a direction without gap still gets 1; the LLM on top
    assert budgets(ranking, total=6, llm_budget=2) == {"topology": 3, "weight_format": 2,
                                                       "kernels": 1, "llm": 2}
    # rounding leaves two: the best ranked built-in directions get one each
    even = rank_directions(agents[:3], SimpleNamespace(gap_per_token_s={
        "weight_movement": 1.0, "topology": 1.0, "launch_sync": 1.0}))
    assert budgets(even, total=5, llm_budget=0) == {"weight_format": 2, "topology": 2,
                                                    "kernels": 1}


def test_select_gives_unused_shares_to_other_directions():
    def c(name):
        candidate = Candidate((), None, name.rstrip("0123456789"))
        candidate.notes.append(name)
        return candidate

    by_direction = {"memory": [c("m1")], "kernels": [], "topology": [c("t1"), c("t2"), c("t3")],
                    "batching": [c("b1"), c("b2")]}
    picked = select(by_direction, {"kernels": 3, "topology": 1, "batching": 1}, total=4)
    # shares first (t1, b1), then kernels' unused slots to the next in order (t2, t3);
    # memory seeds on top
    assert [x.notes[0] for x in picked] == ["m1", "t1", "t2", "t3", "b1"]


class LossyEvaluator(Evaluator):
    """Runs the Programs in `lossy` (by id) with a pair whose target weights are perturbed:
    what a lossy weight format or a wrong kernel would compute."""

    def __init__(self, *args, lossy_dir, lossy_ids, **kw):
        super().__init__(*args, **kw)
        self.lossy_pair = load_pair(lossy_dir, self.drafter_dir, self.dtype, self.device)
        self.lossy_ids = lossy_ids

    def pair_for(self, program):
        if program_id(program) in self.lossy_ids:
            return self.lossy_pair
        return super().pair_for(program)


def lossy_round_setup(tmp_path, **settings_kw):
    """A round's ingredients where SetDraftLength(3) runs on a perturbed target (a lossy
    candidate forcing must reject) and a (2, 1) tree runs on the true one: (settings, stock,
    bad, good, evaluator, acceptance)."""
    from specpilot.ir import apply
    from specpilot.prompts import load_prompts

    target, drafter = agreeing_pair(tmp_path)
    lossy = perturbed_copy(target, os.path.join(str(tmp_path), "lossy"), 0.05, seed=99)
    settings = small_settings(tmp_path, target, drafter, **settings_kw)
    stock = stock_program(build_deployment(target, drafter, gpu="cpu", dtype="float32"))
    bad, good = SetDraftLength(3), SetTopology(Tree((2, 1)))
    probe = load_pair(target, drafter, "float32", "cpu")
    prompts = [probe.encode(t) for t in load_prompts(settings.workload)]
    evaluator = LossyEvaluator(target, drafter, "float32", "cpu", prompts, 16, 1,
                               lossy_dir=lossy, lossy_ids={program_id(apply(stock, bad))})
    acceptance = measure_rank_profile(evaluator.stock_pair.drafter, prompts,
                                      evaluator.reference.tokens)
    return settings, stock, bad, good, evaluator, acceptance


def test_a_round_rejects_a_lossy_candidate_by_forcing(tmp_path):
    from specpilot.ir import apply

    settings, stock, bad, good, evaluator, acceptance = lossy_round_setup(
        tmp_path, candidates_per_round=3, timing_repeats=2)
    agent = Scripted("topology", ("topology",), [bad, good])
    lines = []
    inputs = RoundInputs(1, stock, CostModel(measure_device("cpu", repeats=1)), acceptance,
                         evaluator, [agent], None, settings, str(tmp_path / "kernels"), 32,
                         progress=lines.append)
    result = run_round(inputs)
    outcomes = {o.label: o for o in result.outcomes}
    rejected = outcomes[str(bad)]
    assert rejected.stage == "forcing" and not rejected.admitted
    assert rejected.forcing["violations"] and "REJECTED" in rejected.reason
    assert rejected.timing is None                     # never timed
    clean = outcomes[str(good)]
    assert clean.forcing["passed"] and clean.stage in ("admitted", "not_admitted")
    assert len(clean.timing["tokens_per_s"]) == 2
    assert clean.prediction_error is not None
    assert result.program in (stock, apply(stock, good))
    assert result.cost_model.calibration.points     # calibrated on what was timed
    assert any("forcing" in line for line in lines)


def test_candidates_are_lowered_and_built_and_failures_recorded(tmp_path):
    from specpilot.codegen.cache import KernelCache
    from specpilot.ir import KernelsSpec, SetBackend, verify
    from specpilot.search.candidates import make_candidate, prepare
    from hf_factory import make_pair

    target, _ = make_pair(tmp_path, "llama3")      # head_dim 16: every kernel family fits
    stock = stock_program(build_deployment(target, target, gpu="cpu", dtype="float32"))
    generated = make_candidate(stock, (SetBackend("generated"),), "kernels")
    broken_program = verify(replace(generated.program, kernels=KernelsSpec(
        "generated", False, (("target.no_such_node", (("BLOCK_N", 32),)),))))
    broken = Candidate(generated.transformations, broken_program, "llm")
    torch_side = make_candidate(stock, (SetDraftLength(2),), "topology")
    cache = tmp_path / "kernels"
    ready, failures = prepare([generated, broken, torch_side], str(cache), workers=2)
    assert [c.direction for c in ready] == ["kernels", "topology"]
    assert [(f.direction, f.stage) for f in failures] == [("llm", "lowering")]
    assert "no_such_node" in failures[0].reason
    assert generated.plan is not None and torch_side.plan is not None
    # the build ran in worker processes into the run's cache: building again finds it all
    from specpilot.codegen.plan import build_plan
    again = KernelCache(cache)
    assert build_plan(generated.plan, again).ok
    assert again.stats.writes == 0 and again.stats.disk_hits > 0


def test_memory_seeds_compose_into_one_candidate(tmp_path):
    from specpilot.agents import ProposalSet
    from specpilot.ir import CaptureGraphs, apply
    from specpilot.search.seeding import seeded_candidate

    target, drafter = agreeing_pair(tmp_path)
    stock = stock_program(build_deployment(target, drafter, gpu="cpu", dtype="float32"))
    memory = ProposalSet("memory", [SetDraftLength(2), SetTopology(Tree((2, 1))),
                                    CaptureGraphs(True)])
    agents = ProposalSet("topology", [SetDraftLength(5)])
    seeded = seeded_candidate(stock, [memory, agents])
    # the tree sets the topology SetDraftLength(2) already set: the better-ranked one is kept
    assert seeded.transformations == (SetDraftLength(2), CaptureGraphs(True))
    assert seeded.program == apply(apply(stock, SetDraftLength(2)), CaptureGraphs(True))
    assert seeded.direction == "memory"
    assert seeded_candidate(stock, [agents, ProposalSet("memory")]) is None
    # An earlier compile's chosen path is applied whole and in order, a later topology
    # replacing an earlier one as it did there.
    path = ProposalSet("memory", [SetTopology(Tree((3, 1))), CaptureGraphs(True),
                                  SetTopology(Tree((2, 2)))], in_order=True)
    seeded = seeded_candidate(stock, [path, agents])
    assert seeded.transformations == tuple(path.proposals)
    want = stock
    for t in path.proposals:
        want = apply(want, t)
    assert seeded.program == want and seeded.program.draft.topology == Tree((2, 2))
    # A path that cannot run here (a chain length on a tree) is not cut short: it is refused.
    broken = ProposalSet("memory", [SetTopology(Tree((3, 1))), SetDraftLength(2)], in_order=True)
    assert seeded_candidate(stock, [broken, agents]) is None


def test_round_one_evaluates_the_memory_seeds_first_and_goes_on_when_they_fail(tmp_path):
    from specpilot.memory import Mechanism, MemoryView

    settings, stock, bad, good, evaluator, acceptance = lossy_round_setup(
        tmp_path, candidates_per_round=2)
    seed = Mechanism(bad, {}, 0.3, True, {"passed": True}, True, "b", "earlier", 1)
    inputs = RoundInputs(1, stock, CostModel(measure_device("cpu", repeats=1)), acceptance,
                         evaluator, [Scripted("topology", ("topology",), [good, bad])],
                         MemoryView({}, [(1.0, seed)]), settings, str(tmp_path / "kernels"), 32,
                         progress=lambda _: None)
    result = run_round(inputs)
    evaluated = [o for o in result.outcomes if o.forcing is not None]
    # the seed first (rejected by forcing here); then the agents' candidates, the seed's
    # Program not evaluated twice
    assert [(o.direction, o.label) for o in evaluated] == [("memory", str(bad)),
                                                           ("topology", str(good))]
    assert evaluated[0].stage == "forcing" and evaluated[1].forcing["passed"]
    assert not result.notes
