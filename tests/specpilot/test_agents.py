"""Every built-in agent's proposals are legal (ir.check) and runnable (check_runnable) on several
Programs, and each agent chooses what its direction promises."""
import re

import pytest

from specpilot.agents import (BatchingAgent, Budget, KernelAgent, TopologyAgent,
                              WeightFormatAgent, default_agents, rank_by_prediction)
from specpilot.cost import AssumedAcceptance, CostModel, RankProfile, gpu_spec
from specpilot.cost.model import batch_idle
from specpilot.deploy import build_deployment
from specpilot.ir import (Chain, CaptureGraphs, SetAcceptKernels, SetAttentionKernels, SetBackend,
                          SetBatchLayout, SetDrafter, SetDrafterKernels, SetDraftLength, SetDraftLengthPolicy,
                          SetFastPath, SetLengthDrain, SetLengthEstimator, SetMaxBatchSize,
                          SetRefill, SetTopology, Tree, apply, check,
                          record_escape_rates, stock_program)
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
    proposals = agent.propose(p["gpu"], None, None, Budget(6))
    # graph capture first, then the torch backend's whole-layer fast path, the drafter in fused
    # layer kernels, the generated attention, the round's end in one kernel, then own kernels
    assert proposals == [CaptureGraphs(True), SetFastPath("layers"), SetDrafterKernels("fused"),
                         SetAttentionKernels("generated"), SetAcceptKernels("fused"),
                         SetBackend("generated")]
    assert_runnable(p["gpu"], proposals)
    # neither the fast path again, nor the generated backend on top of it (it has its own)
    layers = apply(p["gpu"], SetFastPath("layers"))
    again = agent.propose(layers, None, None, Budget(4))
    assert SetFastPath("layers") not in again and SetBackend("generated") not in again
    assert any("SetFastPath('ops') first" in r.reason for r in agent.refusals)
    # the generated attention runs inside the compiled layers too: still proposed there
    assert SetAttentionKernels("generated") in again
    assert_runnable(layers, again)


def test_kernel_agent_proposes_the_fused_drafter_once_and_only_with_a_drafter(pair):
    p = programs(pair)
    agent = KernelAgent()
    fused = apply(p["gpu"], SetDrafterKernels("fused"))
    again = agent.propose(fused, None, None, Budget(8))
    assert SetDrafterKernels("fused") not in again and CaptureGraphs(True) in again
    # the generated backend runs its own kernels, not the fused drafter's: refused with the fix
    assert SetBackend("generated") not in again
    assert any("SetDrafterKernels('model') first" in r.reason for r in agent.refusals)
    assert_runnable(fused, again)
    # without a drafter there is nothing to fuse; on the generated backend the fused kernels
    # cannot read its weights
    for program in (apply(p["gpu"], SetDrafter("none")), p["generated"]):
        proposals = agent.propose(program, None, None, Budget(8))
        assert proposals and not any(isinstance(t, SetDrafterKernels) for t in proposals)


def test_batching_agent_offers_what_the_runtime_runs_refill_first(pair):
    p = programs(pair)
    # a request the drafter predicts well takes few steps, one it misses takes many: while
    # the second drains its batch, the first one's slot idles
    ranks = [[0, 0, 0, 1] * 10, [3] * 12]
    acceptance = RankProfile(ranks, [len(r) + 1 for r in ranks])
    agent = BatchingAgent(CostModel(gpu_spec("h200")), acceptance)
    # batch 1: no batching mechanism, only speculation off (one evaluation tells)
    assert agent.propose(p["gpu"], None, None, Budget(8)) == [SetDrafter("none")]
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


def _adaptive_lengths(pair):
    """(programs, the batched Program with adaptive lengths, the same graphed, a batching agent,
    a budget)."""
    p = programs(pair)
    adaptive = apply(p["batched"], SetDraftLengthPolicy("per_request_adaptive", 4 * 5))
    return p, adaptive, apply(adaptive, CaptureGraphs(True)), BatchingAgent(), Budget(32)


def test_batching_agent_offers_the_other_length_estimator_to_graphed_adaptive_lengths(pair):
    p, adaptive, graphed, agent, budget = _adaptive_lengths(pair)
    offered = agent.propose(graphed, None, None, budget)
    assert SetLengthEstimator("per_depth") in offered
    assert_runnable(graphed, offered)
    depth = apply(graphed, SetLengthEstimator("per_depth"))
    back = agent.propose(depth, None, None, budget)
    assert SetLengthEstimator("geometric") in back
    assert SetLengthEstimator("per_depth") not in back
    # Eager adaptive lengths do not read it (capture off, or a ragged layout, which the graphed
    # runtime has no rounds for), and fixed lengths estimate nothing.
    ragged = apply(graphed, SetBatchLayout("ragged"))
    for program in (adaptive, ragged, apply(p["batched"], CaptureGraphs(True))):
        assert not any(isinstance(t, SetLengthEstimator)
                       for t in agent.propose(program, None, None, budget))


def test_batching_agent_offers_the_other_drain_to_graphed_adaptive_lengths_with_refill(pair):
    _, adaptive, graphed, agent, budget = _adaptive_lengths(pair)
    # drained batches have no queue to follow: no drain offered
    assert not any(isinstance(t, SetLengthDrain) for t in agent.propose(graphed, None, None,
                                                                         budget))
    refilled = apply(graphed, SetRefill("continuous"))
    offered = agent.propose(refilled, None, None, budget)
    assert SetLengthDrain("throughput") in offered
    assert_runnable(refilled, offered)
    drain = apply(refilled, SetLengthDrain("throughput"))
    back = agent.propose(drain, None, None, budget)
    assert SetLengthDrain("makespan") in back and SetLengthDrain("throughput") not in back
    # eager adaptive lengths with refill do not read it
    assert not any(isinstance(t, SetLengthDrain)
                   for t in agent.propose(apply(adaptive, SetRefill("continuous")), None, None,
                                          budget))


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


# ------------------------------------------------------------------ kernel tuning (TuneKernel)

@pytest.fixture(scope="module")
def lowerable(tmp_path_factory):
    """A pair every kernel family can run (head_dim 16 in both models; the `pair` drafter's 8 is
    below the attention kernel's 16), as GPU Programs on the generated backend: stock chain(4),
    lossless12 MLP weights, a tree, a batch of 4."""
    from hf_factory import make_checkpoint
    folder = tmp_path_factory.mktemp("lowerable")
    target = make_checkpoint(folder, "llama3", name="target", hidden_size=64,
                             intermediate_size=128)
    drafter = make_checkpoint(folder, "llama3", name="drafter", seed=1, hidden_size=32,
                              intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              num_key_value_heads=1)
    gpu = stock_program(build_deployment(target, drafter, gpu="NVIDIA H200", dtype="bfloat16"))
    generated = apply(gpu, SetBackend("generated"))
    measured = generated
    for role in ("target", "drafter"):
        measured = record_escape_rates(
            measured, role, {n: 10 for n in getattr(measured.models, role).linears})
    from specpilot.ir import SetWeightFormat
    return {"stock": generated,
            "lossless12": apply(apply(measured, SetWeightFormat("target.mlp.*", "lossless12")),
                                SetWeightFormat("drafter.*", "lossless12")),
            "tree": apply(generated, SetTopology(Tree((2, 2)))),
            "batched": apply(generated, SetMaxBatchSize(4))}


def _report(*kinds):
    """A cost report whose nodes furthest from their bandwidth limit have these kinds."""
    from specpilot.cost.report import NodeSummary
    from types import SimpleNamespace
    names = {"attention": "target.layers.1.attention", "mlp": "target.layers.0.mlp",
             "lm_head": "target.lm_head", "drafter_forward": "draft.forward[1]",
             "embed": "target.embed", "accept": "verify.accept"}
    return SimpleNamespace(nodes=[NodeSummary(names[k], k, 1e-5, "memory", 0.1) for k in kinds])


def _tunings(proposals):
    from specpilot.ir import TuneKernel
    return [t for t in proposals if isinstance(t, TuneKernel)]


@pytest.mark.parametrize("name", ["stock", "lossless12", "tree", "batched"])
@pytest.mark.parametrize("report", [None, ("mlp",), ("attention", "drafter_forward")],
                         ids=["no-report", "mlp", "attention+drafter"])
def test_kernel_agent_tunes_nodes_lowering_produces_with_legal_values(lowerable, name, report):
    from specpilot.codegen.lower import lower_program
    program = lowerable[name]
    agent = KernelAgent()
    proposals = agent.propose(program, _report(*report) if report else None, None, Budget(10))
    tunings = _tunings(proposals)
    assert tunings and len(proposals) <= 10
    assert_runnable(program, proposals)
    plan = lower_program(program)
    for t in tunings:
        # one key for every layer: the name of a lowered node with its `layers.N.` removed
        assert ".layers." not in t.node
        nodes = [n for n in plan.nodes if re.sub(r"\.layers\.[0-9]+\.", ".", n.name) == t.node]
        assert nodes, t
        tuned = lower_program(apply(program, t))      # legal: the family schema accepts it
        for n in nodes:
            spec = tuned.spec_of(n.name)
            assert (spec.family if t.param == "family" else spec.get(t.param)) == t.value
            before = plan.spec_of(n.name)
            assert spec != before                          # and it changes the kernel


def test_kernel_agent_follows_the_cost_report_by_kind(lowerable):
    program = lowerable["stock"]
    by_kind = {
        ("mlp",): lambda node: node.startswith("target.mlp."),
        ("attention",): lambda node: node.startswith("target.self_attn."),
        ("lm_head",): lambda node: node == "target.lm_head",
        ("drafter_forward",): lambda node: node.startswith("drafter."),
    }
    for kinds, expected in by_kind.items():
        tunings = _tunings(KernelAgent().propose(program, _report(*kinds), None, Budget(12)))
        assert tunings and all(expected(t.node) for t in tunings), (kinds, tunings)
    # the attention kernel itself is tuned for the attention/KV gap, over every layer at once
    nodes = {t.node for t in _tunings(KernelAgent().propose(program, _report("attention"), None,
                                                            Budget(40)))}
    assert "target.self_attn.attention" in nodes


def test_kernel_agent_without_a_usable_report_starts_from_the_largest_linears(lowerable):
    program = lowerable["stock"]
    model = program.models.target
    # target weights per layer-less node, from the model's own shapes (gate+up fused in one)
    sizes = {"target.lm_head": model.linear_shape("lm_head")}
    size = {k: v[0] * v[1] for k, v in sizes.items()}
    for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.down_proj"):
        out, inp = model.linear_shape(f"layers.0.{part}")
        size[f"target.{part}"] = model.num_layers * out * inp
    out, inp = model.linear_shape("layers.0.mlp.gate_proj")
    size["target.mlp.gate_up"] = model.num_layers * 2 * out * inp
    largest = max(size, key=size.get)
    for report in (None, _report("embed", "accept")):
        agent = KernelAgent()
        tunings = _tunings(agent.propose(program, report, None, Budget(6)))
        assert tunings[0].node == largest == "target.mlp.gate_up"
        assert any("largest linears" in note for note in agent.notes)


def test_kernel_agent_proposes_a_cuda_gemv_only_where_it_is_measured_faster(lowerable):
    def switches(program, kind):
        return {(t.node, t.value) for t in _tunings(KernelAgent().propose(
            program, _report(kind), None, Budget(40))) if t.param == "family"}
    # the drafter drafts 1 row: the bf16 GEMV (measured faster up to 4 rows)
    assert ("drafter.mlp.down_proj", "gemv_bf16") in switches(lowerable["stock"], "drafter_forward")
    # the target verifies 5 rows: no bf16 GEMV, but the lossless12 one (faster up to 8 rows)
    assert switches(lowerable["stock"], "mlp") == set()
    assert ("target.mlp.down_proj", "gemv_lossless12") in switches(lowerable["lossless12"], "mlp")
    # a batch of 4 verifies 20 rows: none
    assert switches(lowerable["batched"], "attention") == set()


def test_kernel_agent_tunes_nothing_on_a_cpu_or_the_torch_backend(lowerable):
    from dataclasses import replace
    agent = KernelAgent()
    assert agent.propose(replace(lowerable["stock"], gpu="cpu"), _report("mlp"), None,
                         Budget(8)) == []
    torch_backend = apply(lowerable["stock"], SetBackend("torch"))
    proposals = agent.propose(torch_backend, _report("mlp"), None, Budget(8))
    assert SetBackend("generated") in proposals and not _tunings(proposals)


def test_a_tune_kernel_that_does_not_lower_is_a_recorded_candidate_failure(lowerable, tmp_path):
    from specpilot.ir import TuneKernel
    from specpilot.search.candidates import make_candidate, prepare
    bad = make_candidate(lowerable["stock"], [TuneKernel("target.layers.9.mlp.down_proj",
                                                         "BLOCK_N", 32)], "kernels")
    illegal = make_candidate(lowerable["stock"], [TuneKernel("target.lm_head", "BLOCK_N", 48)],
                             "kernels")
    ready, failures = prepare([bad, illegal], str(tmp_path / "kernels"), workers=1)
    assert ready == []
    assert [f.stage for f in failures] == ["lowering", "lowering"]
    assert "kernels.overrides[target.layers.9.mlp.down_proj]" in failures[0].reason
    assert "48 is not a power of two" in failures[1].reason
    assert failures[0].transformations == bad.transformations


def test_topology_proposals_take_the_best_of_each_shape_family_first():
    from specpilot.agents.topology import diverse_best
    chains = [SetDraftLength(k) for k in (2, 3, 5, 6)]
    trees = [SetTopology(t) for t in (Tree((2, 1)), Tree((3, 2, 1)), Tree((2, 2)))]
    # predicted gains: every tree above every chain, as a roofline that overrates trees says
    ranked = ([(0.9 - 0.1 * i, t) for i, t in enumerate(trees)]
              + [(0.3 - 0.05 * i, t) for i, t in enumerate(chains)])
    picked = diverse_best(ranked, 3)
    assert picked == [trees[0], trees[1], chains[0]]       # best chain in, still best first
    assert diverse_best(ranked, 1) == [trees[0]]
    assert diverse_best(ranked, 10) == [t for _, t in ranked]
