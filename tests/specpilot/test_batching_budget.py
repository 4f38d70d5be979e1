"""The batching agent's token budgets: the ridge where the target turns compute-bound on the
Program's GPU (checked against a hand computation from the datasheet figures), and the budget
that turns speculation off; every proposed budget is legal."""
import pytest

from specpilot.agents import BatchingAgent, Budget
from specpilot.agents.batching import ridge_budget
from specpilot.cost import gpu_spec
from specpilot.deploy import build_deployment
from specpilot.ir import (SetDraftLengthPolicy, SetMaxBatchSize, apply, check, stock_program,
                          verify)
from hf_factory import make_pair


@pytest.fixture(scope="module")
def gpu_program(tmp_path_factory):
    target, drafter = make_pair(tmp_path_factory.mktemp("pair"), "llama3")
    return stock_program(build_deployment(target, drafter, gpu="NVIDIA H200", dtype="bfloat16"))


def test_ridge_budget_is_the_roofline_ridge_of_the_target(gpu_program):
    program = apply(gpu_program, SetMaxBatchSize(16))
    t = program.models.target
    params = sum(o * i for o, i in (t.linear_shape(n) for n in t.linears))
    weights = 2 * params                                    # bf16
    kv = t.num_layers * 16 * 512 * 2 * t.num_kv_heads * t.head_dim * 2
    h200 = gpu_spec("h200")
    want = h200.matmul_flops * (weights + kv) / (h200.memory_bandwidth * 2 * params)
    assert ridge_budget(program) == max(16, int(want))
    assert ridge_budget(apply(program, SetMaxBatchSize(1))) is not None
    # A CPU Program has no GPU ridge.
    cpu = stock_program(build_deployment(program.models.target.checkpoint,
                                         program.models.drafter.checkpoint, gpu="cpu",
                                         dtype="float32"))
    assert ridge_budget(cpu) is None


def test_budgets_include_speculation_off_and_the_ridge_and_are_legal(gpu_program):
    program = apply(gpu_program, SetMaxBatchSize(16))
    proposals = BatchingAgent().propose(program, None, None, Budget(max_proposals=50))
    budgets = {t.token_budget for t in proposals if isinstance(t, SetDraftLengthPolicy)
               and t.policy == "per_request_adaptive"}
    full = 16 * (program.draft.topology.k + 1)
    assert {full, full // 2, 16, min(full, max(16, ridge_budget(program)))} <= budgets
    for t in proposals:
        check(program, t)


def test_the_bench_sets_the_adaptive_budget_per_batch_size_at_the_ridge(gpu_program):
    from types import SimpleNamespace

    from specpilot.bench.mechanism_programs import BudgetedProgramSystem, mechanism_programs

    program = mechanism_programs(gpu_program)["graphed_adaptive"]
    pair = SimpleNamespace(drafter=object(), target=SimpleNamespace(device="cpu"))
    system = BudgetedProgramSystem("mech:graphed_adaptive", program, pair, graphs_only=True)
    k = program.draft.topology.k
    for batch in (1, 16, 64):
        sized = system.at_batch(batch)
        want = min(batch * (k + 1), max(batch, ridge_budget(sized)))
        assert sized.batch.max_batch_size == batch and sized.batch.token_budget == want
    assert "CUDA graphs need a CUDA GPU" in system.unavailable(1)


def test_the_per_depth_systems_differ_from_their_twins_by_the_estimator_alone(gpu_program):
    from dataclasses import replace

    from specpilot.bench.mechanism_programs import mechanism_programs

    programs = mechanism_programs(gpu_program)
    for name in ("graphed_adaptive_refill_fused", "graphed_adaptive_refill_fused_attention",
                 "graphed_adaptive_refill_fused_chain8",
                 "graphed_adaptive_refill_fused_attention_chain8"):
        depth, twin = programs[name + "_depth"], programs[name]
        assert depth.batch.length_estimator == "per_depth"
        assert twin.batch.length_estimator == "geometric"
        assert replace(depth, history=()) == replace(
            twin, batch=replace(twin.batch, length_estimator="per_depth"), history=())
        verify(depth)
