"""Choosing a round's Program by stacking its winners greedily (search/stacking.py, `choose`).

The Programs, the transformations and their composition and legality are the real ones; only the
evaluation is replaced, by tokens/s written by hand as a function of which attributes a Program
has (the shape measured at batch 1 on an H200: CUDA graphs pay most, the layers fast path pays
on top of them, a large sparse tree pays on the eager base but hurts once rounds are graphed)."""
from itertools import combinations
from types import SimpleNamespace

import pytest

from specpilot.agents import refusal
from specpilot.deploy import build_deployment
from specpilot.ir import (CaptureGraphs, SetBackend, SetFastPath, SetTopology, SparseTree, apply,
                          program_id, stock_program)
from specpilot.search import round as search_round
from specpilot.search.candidates import Outcome, make_candidate
from specpilot.search.round import RoundInputs, choose
from specpilot.search.seeding import compose
from hf_factory import make_checkpoint

THRESHOLD = 0.03
GRAPHS = CaptureGraphs(True)
LAYERS = SetFastPath("layers")
BIG_TREE = SetTopology(SparseTree(((0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0))))
GENERATED = SetBackend("generated")


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pair")
    target = make_checkpoint(folder, "llama3", name="target", seed=0, hidden_size=64,
                             intermediate_size=128)
    return stock_program(build_deployment(target, target, gpu="cpu", dtype="float32"))


def landscape(tree_when_graphed: float, layers_when_graphed: float = 2.2):
    """tokens/s of a Program from its attributes: graphs x10 over eager; the layers fast path
    x2.7 eager, `layers_when_graphed` graphed; the big tree x1.33 eager, `tree_when_graphed`
    graphed; the generated backend x1.05 (a winner alone, refused with the layers fast path)."""
    def tokens_per_s(p):
        graphed = p.kernels.capture_graphs
        tps = 100.0 if graphed else 10.0
        if p.kernels.fast_path == "layers":
            tps *= layers_when_graphed if graphed else 2.7
        if isinstance(p.draft.topology, SparseTree):
            tps *= tree_when_graphed if graphed else 1.33
        if p.kernels.backend == "generated":
            tps *= 1.05
        return tps
    return tokens_per_s


class FakeEvaluation:
    """Stands in for round.evaluate: gain of the landscape's tokens/s over the base's, admitted
    above the threshold; remembers every candidate it was asked to evaluate."""

    def __init__(self, tokens_per_s, rejected_ids=()):
        self.tokens_per_s, self.rejected_ids, self.seen = tokens_per_s, set(rejected_ids), []

    def __call__(self, inputs, candidate, threshold):
        self.seen.append(candidate)
        if candidate.id in self.rejected_ids:
            return Outcome(candidate.label, candidate.direction, "forcing", "1 violation",
                           candidate.id, transformations=candidate.transformations)
        tps = self.tokens_per_s(candidate.program)
        gain = tps / self.tokens_per_s(inputs.base) - 1.0
        return Outcome(candidate.label, candidate.direction,
                       "admitted" if gain > threshold else "not_admitted",
                       program_id=candidate.id, timing={"median_tokens_per_s": tps}, gain=gain,
                       transformations=candidate.transformations)


def run_choose(stock, tmp_path, monkeypatch, tokens_per_s, singles, tried=None,
               extra_ready=(), rejected_ids=()):
    """Evaluate each transformation in `singles` alone (and `extra_ready` candidates), then
    `choose`; returns (choice, choose's outcomes, candidates choose evaluated, progress)."""
    fake = FakeEvaluation(tokens_per_s, rejected_ids)
    lines = []
    inputs = RoundInputs(1, stock, None, None, None, [], None, SimpleNamespace(workers=1),
                         str(tmp_path / "kernels"), 32, tried=tried or {},
                         progress=lines.append)
    ready = list(extra_ready) + [make_candidate(stock, (t,), "kernels") for t in singles]
    evaluated = [fake(inputs, c, THRESHOLD) for c in ready]
    fake.seen.clear()
    monkeypatch.setattr(search_round, "evaluate", fake)
    choice, outcomes = choose(inputs, ready, evaluated, THRESHOLD)
    return choice, outcomes, fake.seen, lines


def best_composable_subset(stock, transformations, tokens_per_s):
    """Reference: the id of the fastest Program among every subset of `transformations` that
    composes whole on `stock` (found by trying them all)."""
    best = stock
    for r in range(1, len(transformations) + 1):
        for subset in combinations(transformations, r):
            program, applied = compose(stock, [(t,) for t in subset])
            if len(applied) == r and tokens_per_s(program) > tokens_per_s(best):
                best = program
    return program_id(best)


def composed(stock, *transformations):
    program, applied = compose(stock, [(t,) for t in transformations])
    assert len(applied) == len(transformations)
    return program


def test_a_winner_that_hurts_the_stack_is_left_out(stock, tmp_path, monkeypatch):
    tps = landscape(tree_when_graphed=0.8)
    winners = [GRAPHS, LAYERS, BIG_TREE, GENERATED]
    choice, outcomes, seen, lines = run_choose(stock, tmp_path, monkeypatch, tps, winners)

    want = composed(stock, GRAPHS, LAYERS)
    assert choice.program == want and choice.program.draft.topology == stock.draft.topology
    assert program_id(choice.program) == best_composable_subset(stock, winners, tps)
    assert choice.label == f"{GRAPHS} + {LAYERS}"
    assert choice.outcome.gain == pytest.approx(tps(want) / tps(stock) - 1.0)
    assert choice.outcome.direction == "combined"
    # The all-in combination was evaluated, admitted, and is slower than the stack without
    # the tree, so it is not the choice.
    all_in = composed(stock, GRAPHS, LAYERS, BIG_TREE)
    by_id = {o.program_id: o for o in outcomes}
    assert by_id[program_id(all_in)].admitted
    assert by_id[program_id(all_in)].gain < choice.outcome.gain
    # GENERATED is refused once the layers fast path is set: three winners compose, so two
    # stacked evaluations, and both are returned for the round's records.
    assert refusal(apply(stock, LAYERS), GENERATED) is not None
    assert [c.program for c in seen] == [want, all_in]
    assert [o.program_id for o in outcomes] == [program_id(want), program_id(all_in)]
    assert [line.split(":")[0] for line in lines] == [
        f"[round 1] stacked {GRAPHS} + {LAYERS}",
        f"[round 1] stacked {GRAPHS} + {LAYERS} + {BIG_TREE}"]


def test_winners_that_help_are_kept_after_one_that_does_not(stock, tmp_path, monkeypatch):
    # Graphed, the layers fast path now costs 10% and the tree gains 20%.
    tps = landscape(tree_when_graphed=1.2, layers_when_graphed=0.9)
    winners = [GRAPHS, LAYERS, BIG_TREE]
    choice, outcomes, seen, _ = run_choose(stock, tmp_path, monkeypatch, tps, winners)

    want = composed(stock, GRAPHS, BIG_TREE)
    assert choice.program == want
    assert program_id(want) == best_composable_subset(stock, winners, tps)
    assert choice.program.kernels.fast_path == stock.kernels.fast_path
    # graphs + layers tried and dropped, then graphs + tree tried and kept
    assert [c.program for c in seen] == [composed(stock, GRAPHS, LAYERS), want]
    assert [o.admitted for o in outcomes] == [True, True]
    assert outcomes[0].gain < tps(apply(stock, GRAPHS)) / tps(stock) - 1.0


def test_every_winner_is_kept_when_each_pays_on_the_stack(stock, tmp_path, monkeypatch):
    tps = landscape(tree_when_graphed=1.2)
    winners = [BIG_TREE, GRAPHS, LAYERS]             # the ranking, not this order, decides
    choice, _, seen, _ = run_choose(stock, tmp_path, monkeypatch, tps, winners)
    want = composed(stock, GRAPHS, LAYERS, BIG_TREE)
    assert choice.program == want
    assert program_id(want) == best_composable_subset(stock, winners, tps)
    assert choice.label == f"{GRAPHS} + {LAYERS} + {BIG_TREE}"
    assert len(seen) == len(winners) - 1


def test_a_single_winner_is_chosen_without_another_evaluation(stock, tmp_path, monkeypatch):
    tps = landscape(tree_when_graphed=0.8)
    # On a graphed base GENERATED gains 5%, above the 3% threshold, and the tree loses 20%:
    # one winner
    graphed = apply(stock, GRAPHS)
    choice, outcomes, seen, lines = run_choose(graphed, tmp_path, monkeypatch, tps,
                                               [GENERATED, BIG_TREE])
    assert choice.program == apply(graphed, GENERATED)
    assert choice.label == str(GENERATED) and choice.outcome.direction == "kernels"
    assert seen == [] and outcomes == [] and lines == []


def test_a_stack_evaluated_before_is_not_evaluated_again(stock, tmp_path, monkeypatch):
    tps = landscape(tree_when_graphed=1.2)
    both = composed(stock, GRAPHS, LAYERS)
    # In an earlier round graphs + layers was evaluated and lost: not worth another try.
    tried = {program_id(both): [Outcome("earlier", "combined", "not_admitted",
                                        program_id=program_id(both), gain=-0.2)]}
    choice, outcomes, seen, lines = run_choose(stock, tmp_path, monkeypatch, tps,
                                               [GRAPHS, LAYERS, BIG_TREE], tried=tried)
    assert [c.program for c in seen] == [composed(stock, GRAPHS, BIG_TREE)]
    assert choice.program == composed(stock, GRAPHS, BIG_TREE)
    assert "earlier round" in lines[0]

    # This round, the memory's seeds made the same Program and forcing rejected it: that
    # outcome stands for the stack, which is not evaluated again.
    seed = make_candidate(stock, (GRAPHS, LAYERS), "memory")
    choice, outcomes, seen, lines = run_choose(stock, tmp_path, monkeypatch, tps,
                                               [GRAPHS, LAYERS, BIG_TREE], extra_ready=[seed],
                                               rejected_ids={seed.id})
    assert [c.program for c in seen] == [composed(stock, GRAPHS, BIG_TREE)]
    assert choice.program == composed(stock, GRAPHS, BIG_TREE)
    assert [o.program_id for o in outcomes] == [program_id(choice.program)]
    assert "evaluated before" in lines[0]
