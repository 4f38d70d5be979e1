"""What the shaped-tree bench system (specpilot/bench/shaped_tree_system.py) must do on a tiny
pair, on the CPU (eager) and on a GPU (graphed): choose its tree from the held-out prompts' ranks,
decode exactly like greedy AR, run that very tree (each round accepts what the tree's replay over
the reference's ranks says, exact in float32) and pass forcing."""
from hf_factory import random_prompts
from specpilot.bench.measure import measure
from specpilot.bench.shaped_tree_system import HeldOutProfile, ShapedTreeSystem
from specpilot.bench.timed_tree_pricing import (PROBES, best_timed_topology, fit_chain_cost,
                                                fit_tree_cost)
from specpilot.bench.tree_pricing import best_shaped_topology
from specpilot.bench.workload import stock_reference
from specpilot.cost import CostModel
from specpilot.cost.acceptance import measure_rank_profile
from specpilot.cost.gpu_specs import gpu_spec
from specpilot.deploy import build_deployment
from specpilot.ir import CaptureGraphs, SetMaxBatchSize, replay, stock_program
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.decoder import load_pair

NEW = 12
BATCH = 2


def assert_runs_its_tree(target_dir: str, drafter_dir: str, device: str, graphed: bool,
                         pricing: str = "datasheet") -> None:
    """`pricing` "datasheet": the system is given the H200's datasheet model; "calibrated": it
    calibrates its own (timing runs on `device`); "timed": it times probe chains' and trees'
    rounds, each kind fitted on its own."""
    pair = load_pair(target_dir, drafter_dir, "float32", device)
    stock = stock_program(build_deployment(target_dir, drafter_dir, dtype="float32"))
    base = replay(stock, [SetMaxBatchSize(BATCH)] + ([CaptureGraphs(True)] if graphed else []))
    prompts = random_prompts((5, 9, 3, 7), seed=73)
    held_out = random_prompts((6, 4, 8, 5, 7, 3), seed=74)
    system = ShapedTreeSystem("sequoia", base, pair, HeldOutProfile(pair, held_out, NEW),
                              cost_model=(CostModel(gpu_spec("h200")) if pricing == "datasheet"
                                          else None),
                              graphs_only=graphed,
                              pricing="timed" if pricing == "timed" else "calibrated")
    assert system.refusal is None and system.graphed == graphed
    reference = stock_reference(pair, prompts, NEW)
    row, output = measure(system, prompts, reference, BATCH, NEW, 0, 1, device)
    assert row["status"] == "measured", row
    assert row["forcing"]["passed"] and row["forcing"]["violation_count"] == 0, row["forcing"]
    assert output.tokens == [list(t) for t in reference.tokens]

    # Chosen from the held-out prompts' ranks (greedy AR of the target on them).
    held_ref = generate_ar(pair.target, held_out, NEW, pair.eos_ids)
    acceptance = measure_rank_profile(pair.drafter, held_out, held_ref.tokens)
    shaped = row["shaped_tree"]
    if pricing == "timed":
        assert len(shaped["probes"]) == len(PROBES) and all(
            seconds > 0 for seconds in shaped["probes"].values())
        # Each kind's fit of the probes recorded, a chain's by the chains, a tree's by the trees.
        probes = [(t, shaped["probes"][str(t)]) for t in PROBES]
        chain_fit = (shaped["fit_seconds"]["chain"]["base"],
                     shaped["fit_seconds"]["chain"]["per_depth"])
        tree_fit = tuple(shaped["fit_seconds"]["tree"][term]
                         for term in ("base", "per_token", "per_depth"))
        assert chain_fit == fit_chain_cost(probes) and tree_fit == fit_tree_cost(probes)
        topology, _ = best_timed_topology(base, acceptance, BATCH, chain_fit, tree_fit)
    else:
        model = system.models[BATCH]
        if pricing == "calibrated":
            assert [p.label for p in model.calibration.points] == ["ar", "stock"]
        topology, _ = best_shaped_topology(base, acceptance, BATCH, model)
    assert row["shaped_tree"]["topology"] == str(topology)
    assert row["shaped_tree"]["profiled_prompts"] == len(held_out)
    assert system.at_batch(BATCH).draft.topology == topology
    if pricing == "datasheet":
        assert topology.num_nodes > 1, "the noisy drafter should be worth a tree of some size"

    # The decoder ran that tree: each round accepted what the tree accepts of the reference.
    benched = measure_rank_profile(pair.drafter, prompts, reference.tokens)
    assert output.accepted_lengths == benched.simulate(topology)
