"""The kernels that end a graphed chain round (kernels.accept_kernels "fused") are nodes of the
Program's kernel plan, the same specs the graphed decoders build (codegen/round_end.py), so an
export ships them and its loader runs them; Programs whose rounds do not end so (or are not
captured) have none."""
import json

from specpilot.codegen.export import export_program
from specpilot.codegen.lower import lower_program
from specpilot.codegen.round_end import round_end_specs
from specpilot.ir import (CaptureGraphs, SetAcceptKernels, SetDraftLengthPolicy,
                          SetLengthEstimator, SetMaxBatchSize, SetRefill, replay)

from test_export import run_isolated
from test_lower import tiny_program

GRAPHED = [CaptureGraphs(on=True), SetMaxBatchSize(4)]


def step_nodes(program) -> dict:
    plan = lower_program(program)
    return {n.name: (plan.spec_of(n.name), dict(n.attrs)) for n in plan.nodes
            if n.name.startswith("step.") and n.name != "step.greedy_accept"}


def test_a_drained_chain_with_the_fused_end_has_its_commit_node():
    nodes = step_nodes(replay(tiny_program(), GRAPHED + [SetAcceptKernels("fused")]))
    assert list(nodes) == ["step.chain_commit"]
    spec, attrs = nodes["step.chain_commit"]
    assert (spec.family, spec.get("LOG"), attrs) == ("chain_commit", "round", {"log": "round"})


def test_refill_with_adaptive_lengths_has_all_four_and_the_decoders_specs():
    program = replay(tiny_program(), GRAPHED + [
        SetDraftLengthPolicy("per_request_adaptive", 20), SetRefill("continuous"),
        SetAcceptKernels("fused"), SetLengthEstimator("per_depth")])
    nodes = step_nodes(program)
    assert {name: spec for name, (spec, _) in nodes.items()} == round_end_specs(
        refill=True, adaptive=True, estimator="per_depth")
    # Checked by hand against the decoders: a refilled round logs by row, its plain steps
    # count only, a newcomer's row is started in one launch, the length serves the time per
    # token, newcomers are admitted.
    assert [(s.family, dict(s.params)) for s, _ in nodes.values()] == [
        ("chain_commit", {"LOG": "row", "num_warps": 1}),
        ("chain_commit", {"LOG": "row_plain", "num_warps": 1}),
        ("row_start", {"BLOCK_V": 1024, "num_warps": 4}),
        ("length_policy", {"ESTIMATOR": "per_depth", "OBJECTIVE": "throughput",
                           "TURN_OFF": True, "num_warps": 1}),
        ("length_admit", {"ESTIMATOR": "per_depth", "num_warps": 1})]


def test_no_round_end_nodes_where_the_rounds_do_not_end_in_kernels_or_are_not_captured():
    assert step_nodes(replay(tiny_program(), GRAPHED)) == {}
    # Not captured, the Program runs eagerly: no graphed round, no fused end.
    assert step_nodes(replay(tiny_program(), [SetAcceptKernels("fused")])) == {}
    # An adaptive budget that leaves no room for drafts runs plain steps: commit only.
    plain = replay(tiny_program(), GRAPHED + [SetDraftLengthPolicy("per_request_adaptive", 4),
                                              SetAcceptKernels("fused")])
    assert list(step_nodes(plain)) == ["step.chain_commit"]


def test_an_export_ships_and_runs_the_round_end_kernels(tmp_path):
    program = replay(tiny_program(dtype="float32"), GRAPHED + [
        SetDraftLengthPolicy("per_request_adaptive", 20), SetRefill("continuous"),
        SetAcceptKernels("fused")])
    result = export_program(program, tmp_path / "exported_kernels")
    readme = (result.path / "README.md").read_text()
    assert "- `step.length_admit`: a refilled newcomer's adaptive-length estimates" in readme
    out = run_isolated(tmp_path, """
import torch
import exported_kernels as kernels
f32 = dict(dtype=torch.float32)
state = [torch.full((4,), 9.0, **f32) for _ in range(4)]
workload = torch.tensor([30.0, 6.0, 12.0])      # 30 accepted, 6 rejections in 12 rounds
kernels.load("step.length_admit").launch(*state, workload, 2, 4, 8)
print(json.dumps([s.tolist() for s in state]))
""".replace("print(json", "import json; print(json"))
    accepted_avg, rejected_avg, accepted_total, rejected_total = json.loads(
        out.strip().splitlines()[-1])
    # Row 2 starts at the workload's averages per round, its history as 8 such rounds.
    assert accepted_avg == [9.0, 9.0, 2.5, 9.0] and rejected_avg == [9.0, 9.0, 0.5, 9.0]
    assert abs(accepted_total[2] - 20.0) < 1e-5 and abs(rejected_total[2] - 4.0) < 1e-5
    assert accepted_total[0] == 9.0
