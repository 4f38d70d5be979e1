"""Every built-in agent's proposals are legal (ir.check) and runnable (check_runnable) on several
Programs, and each agent chooses what its direction promises."""
import pytest

from specpilot.agents import (BatchingAgent, Budget, KernelAgent, TopologyAgent,
                              WeightFormatAgent, default_agents, rank_by_prediction)
from specpilot.cost import AssumedAcceptance, CostModel, RankProfile, gpu_spec
from specpilot.cost.model import batch_idle
from specpilot.deploy import build_deployment
from specpilot.ir import (Chain, CaptureGraphs, SetBackend, SetBatchLayout,
                          SetDraftLengthPolicy, SetMaxBatchSize, SetRefill, SetTopology, Tree,
                          apply, check, record_escape_rates, stock_program)
from specpilot.runtime.decoder import check_runnable
from hf_factory import make_pair
from test_search_support import one_thread  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return make_pair(tmp_path_factory.mktemp("pair"), "llama3")


def programs(pair):
    """A spread of Programs: CPU fp32, GPU bf16 (torch and generated backends, escape rates
    measured), a tree, a batch of 4."""
    target, drafter = pair
    cpu = stock_program(build_deployment(target, drafter, gpu="cpu", dtype="float32"))
    gpu = stock_program(build_deployment(target, drafter, gpu="NVIDIA H200", dtype="bfloat16"))
    for role in ("target", "drafter"):
        gpu = record_escape_rates(gpu, role, {n: 10 for n in getattr(gpu.models, role).linears})
    generated = apply(gpu, SetBackend("generated"))
    tree = apply(cpu, SetTopology(Tree((2, 2))))
    big_tree = apply(cpu, SetTopology(Tree((2, 2, 2))))
    batched = apply(gpu, SetMaxBatchSize(4))
    return {"cpu": cpu, "gpu": gpu, "generated": generated, "tree": tree, "big_tree": big_tree,
            "batched": batched}


def ranks_with_branching():
    """A rank profile where the drafter's second choice is often right: trees should win."""
    pattern = [0, 1, 0, 0, 1, 2, 0, 1, 0, 5]
    ranks = [pattern * 4, pattern[3:] * 5]
    return RankProfile(ranks, [len(r) + 1 for r in ranks])


def cost_model(program):
    return CostModel(gpu_spec("h200") if program.gpu != "cpu" else gpu_spec("cpu"))


def assert_runnable(program, proposals):
    for t in proposals:
        assert check(program, t) is None, t
        check_runnable(apply(program, t))


@pytest.mark.parametrize("name", ["cpu", "gpu", "generated", "tree", "big_tree", "batched"])
def test_every_agents_proposals_are_legal_and_runnable(pair, name):
    program = programs(pair)[name]
    acceptance = ranks_with_branching()
    model = cost_model(program)
    report = model.report(program, acceptance)
    made = 0
    for agent in default_agents(model, acceptance):
        proposals = agent.propose(program, report, None, Budget(8))
        assert len(proposals) <= 8
        assert_runnable(program, proposals)
        made += len(proposals)
        for refusal in agent.refusals:          # everything left out says why
            assert refusal.reason
    assert made > 0


def test_topology_agent_ranks_by_the_cost_model(pair):
    program = programs(pair)["gpu"]
    acceptance = ranks_with_branching()
    model = CostModel(gpu_spec("h200"))
    proposals = TopologyAgent(model, acceptance).propose(program, None, None, Budget(5))
    assert proposals
    predicted = [model.predicted_tokens_per_s(apply(program, t), acceptance) for t in proposals]
    assert predicted == sorted(predicted, reverse=True)
    base = model.predicted_tokens_per_s(program, acceptance)
    assert predicted[0] > base
    # with second choices often right, a branching tree beats every chain
    best = proposals[0].topology
    assert best.num_nodes > len(best.level_widths())
    # and it is the best of every shape the agent knows, by the same cost model
    everything = [apply(program, SetTopology(t)) for t in TopologyAgent(
        model, acceptance).topologies if t != program.draft.topology]
    assert predicted[0] == pytest.approx(max(model.predicted_tokens_per_s(p, acceptance)
                                             for p in everything))


def test_a_large_tree_is_offered_two_level_verification(pair):
    from specpilot.ir import SetVerifyPrune
    program = programs(pair)["big_tree"]
    # no other shape to propose: the free slot goes to pruning
    agent = TopologyAgent(CostModel(gpu_spec("cpu")), AssumedAcceptance(0.5), topologies=())
    proposals = agent.propose(program, None, None, Budget(3))
    prunes = [t for t in proposals if isinstance(t, SetVerifyPrune)]
    assert len(prunes) == 1 and prunes[0].prune.keep_layers == (0,)     # half of 2 layers
    assert_runnable(program, prunes)


def test_topology_agent_knows_sequoia_shapes_and_dynamic_trees(pair):
    acceptance = ranks_with_branching()
    agent = TopologyAgent(CostModel(gpu_spec("h200")), acceptance)
    kinds = {type(t).__name__ for t in agent.topologies}
    assert {"Chain", "Tree", "SparseTree", "DynamicTree"} <= kinds
    dynamic = next(t for t in agent.topologies if type(t).__name__ == "DynamicTree")
    # a dynamic tree is estimated by the best static tree of its budget, depth and width
    static = acceptance.static_equivalent(dynamic)
    assert static.num_nodes <= dynamic.num_nodes
    assert acceptance.mean_accepted(dynamic) >= acceptance.mean_accepted(Chain(1))


def test_topology_agent_without_rank_data_prefers_chains(pair):
    program = programs(pair)["gpu"]
    acceptance = AssumedAcceptance(0.9)
    agent = TopologyAgent(CostModel(gpu_spec("h200")), acceptance)
    for t in agent.propose(program, None, None, Budget(4)):
        target = getattr(t, "topology", None)
        assert target is None or isinstance(target, Chain)


def test_weight_format_agent_needs_generated_kernels_and_bfloat16(pair):
    p = programs(pair)
    acceptance = AssumedAcceptance(0.7)
    on_generated = WeightFormatAgent(CostModel(gpu_spec("h200")), acceptance)
    proposals = on_generated.propose(p["generated"], None, None, Budget(8))
    assert proposals and all(t.fmt == "lossless12" for t in proposals)
    assert_runnable(p["generated"], proposals)
    on_torch = WeightFormatAgent(CostModel(gpu_spec("h200")), acceptance)
    assert on_torch.propose(p["gpu"], None, None, Budget(8)) == []
    assert any("packed formats need kernels.backend 'generated'" in r.reason
               for r in on_torch.refusals)
    on_cpu = WeightFormatAgent(CostModel(gpu_spec("cpu")), acceptance)
    assert on_cpu.propose(p["cpu"], None, None, Budget(8)) == []
    assert any("float32" in note for note in on_cpu.notes)


def test_kernel_agent_proposes_on_a_gpu_only(pair):
    p = programs(pair)
    agent = KernelAgent()
    assert agent.propose(p["cpu"], None, None, Budget(4)) == []
    assert agent.notes
    proposals = agent.propose(p["gpu"], None, None, Budget(4))
    assert SetBackend("generated") in proposals and CaptureGraphs(True) in proposals


def test_batching_agent_offers_what_the_runtime_runs_refill_first(pair):
    p = programs(pair)
    # a request the drafter predicts well takes few steps, one it misses takes many: while
    # the second drains its batch, the first one's slot idles
    ranks = [[0, 0, 0, 1] * 10, [3] * 12]
    acceptance = RankProfile(ranks, [len(r) + 1 for r in ranks])
    agent = BatchingAgent(CostModel(gpu_spec("h200")), acceptance)
    assert agent.propose(p["gpu"], None, None, Budget(8)) == []      # batch 1
    proposals = agent.propose(p["batched"], None, None, Budget(8))
    assert_runnable(p["batched"], proposals)
    refused = {r.proposal: r.reason for r in agent.refusals}
    for t in (SetBatchLayout("ragged"), SetRefill("continuous"),
              SetDraftLengthPolicy("per_request_adaptive", 4 * 5)):
        # each is either offered (the runtime runs it) or refused with the reason
        assert (t in proposals) != (str(t) in refused), t
    if SetRefill("continuous") in proposals:
        # continuous refill removes the idle slots the cost model sees: it ranks first
        assert batch_idle(p["batched"], acceptance, 4) > 0.05
        assert proposals[0] == SetRefill("continuous")


def test_rank_by_prediction_drops_predicted_losses(pair):
    program = programs(pair)["gpu"]
    acceptance = AssumedAcceptance(0.2)          # a poor drafter: long chains cost more
    model = CostModel(gpu_spec("h200"))
    from specpilot.ir import SetDraftLength
    ranked = rank_by_prediction(program, [SetDraftLength(k) for k in (1, 2, 8)], model,
                                acceptance, 1)
    assert [t.k for _, t in ranked][0] == 1
    assert all(g > 0 for g, _ in ranked)
    assert 8 not in [t.k for _, t in ranked]
