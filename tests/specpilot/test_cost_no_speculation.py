"""The cost model of a Program that does not speculate: one greedy AR step of the target per
token, by hand on the 8B/1B-shaped pair of test_cost_model.py (H200 datasheet, no launch
overhead), its workload prediction, its report, and the ceiling that now weighs greedy AR."""
import pytest

from specpilot.cost import AssumedAcceptance, CostModel, RankProfile
from specpilot.cost.acceptance import program_accepted_lengths, program_mean_accepted
from specpilot.cost.roofline import ACCEPT_OPS, HEAD_OPS, step_nodes
from specpilot.ir import SetDrafter, SetMaxBatchSize, SetRefill, SetTopology, Tree, apply

from test_cost_model import H, L, V, no_launch, program, target_params  # noqa: F401 (fixture)

KV_TOKEN = L * 2 * 8 * 128 * 2          # K and V of one token over every target layer, bf16


def ar_step_bytes(batch, context):
    """Every byte one greedy AR step of `batch` requests moves, by hand: the target's weights
    once, one embedding row, the KV cache up to and including the new token per request, and
    the float32 logits the argmax reads."""
    return 2 * target_params() + H * 2 + batch * (context + 1) * KV_TOKEN + batch * V * 4


@pytest.mark.parametrize("batch", [1, 8])
def test_step_is_one_ar_forward_of_the_target(program, batch):
    off = apply(program, SetDrafter("none"))
    gpu = no_launch()
    model = CostModel(gpu)
    nodes = step_nodes(off, gpu, batch, 1000, 0.0)
    assert {n.role for n in nodes} == {"target", "step"}              # no drafter node
    assert sum(n.bytes for n in nodes) == ar_step_bytes(batch, 1000)
    assert model.step_seconds(off, batch, 1000, 0.0) == pytest.approx(
        ar_step_bytes(batch, 1000) / gpu.memory_bandwidth, rel=1e-12)  # memory bound
    # launches: embed, every layer's ops, the head, the argmax (an AR step as predict_ar_run)
    launches = sum(n.launches for n in step_nodes(off, gpu, 1, 10, 0.0))
    assert launches == 1 + L * (8 + 6) + HEAD_OPS + ACCEPT_OPS
    # one token per request per step, whatever the acceptance model says of the kept topology
    acceptance = AssumedAcceptance(0.9)
    assert program_mean_accepted(off, acceptance) == 0.0 < program_mean_accepted(program,
                                                                               acceptance)
    assert model.predicted_tokens_per_s(off, acceptance, batch, 1000) == pytest.approx(
        batch * gpu.memory_bandwidth / ar_step_bytes(batch, 1000), rel=1e-12)


def test_workload_prediction_is_ar_steps_without_the_drafter(program):
    gpu = no_launch()
    model = CostModel(gpu)
    ranks = [[0, 2, 0], [1] * 6]                       # 4 and 7 new tokens
    acceptance = RankProfile(ranks, [len(r) + 1 for r in ranks])
    off = apply(apply(program, SetMaxBatchSize(2)), SetDrafter("none"))
    assert program_accepted_lengths(off, acceptance) == [[0] * 3, [0] * 6]
    got = model.predict_speculative_run(off, acceptance, [20, 30], [4, 7])
    # the target's prefill of the padded batch (2 rows of 30 tokens) plus 6 AR steps at the
    # mean context 30 + 7 // 2 = 33, by hand
    prefill = (2 * target_params() + 2 * 30 * H * 2 + 2 * 30 * KV_TOKEN) / gpu.memory_bandwidth
    prefill = max(prefill, (2.0 * 60 * target_params() + L * 4.0 * 60 * 30 * 32 * 128)
                  / gpu.matmul_flops)
    steps = 6 * ar_step_bytes(2, 33) / gpu.memory_bandwidth
    assert got.overhead_s == 0.0 and got.tokens == 11
    assert got.roofline_s == pytest.approx(prefill + steps, rel=1e-9)
    # neither the drafter nor the kept topology costs anything
    tree = apply(apply(apply(program, SetMaxBatchSize(2)), SetTopology(Tree((2, 2)))),
                 SetDrafter("none"))
    assert model.predict_speculative_run(tree, acceptance, [20, 30], [4, 7]) == got


def test_report_and_ceiling_weigh_greedy_ar(program):
    model = CostModel(no_launch())
    never = AssumedAcceptance(0.0)                     # a drafter that is never right
    report = model.report(program, never, batch=1)
    # speculation can only lose here: the best decoder of the pair is greedy AR
    assert report.ceiling_topology == "no speculation (greedy AR)"
    off = apply(program, SetDrafter("none"))
    off_report = model.report(off, never, batch=1)
    assert off_report.topology == "no speculation (greedy AR)"
    assert off_report.mean_accepted == 0.0 and off_report.breakdown_per_token_s["drafting"] == 0
    assert off_report.tokens_per_s > report.tokens_per_s
    assert off_report.gap_per_token_s["topology"] == 0.0
    # with a drafter that is always right a long chain is the ceiling, for either Program
    always = AssumedAcceptance(1.0)
    assert model.report(off, always, batch=1).ceiling_topology != "no speculation (greedy AR)"
    assert model.report(off, always, batch=1).gap_per_token_s["topology"] > 0


def _refill_case(program):
    """Three requests of 4, 7 and 2 new tokens on two slots, the target alone: (the model, the
    acceptance, the Program drained, refilled, and its prefill seconds by hand)."""
    gpu = no_launch()
    ranks = [[0, 2, 0], [1] * 6, [0]]                  # 4, 7 and 2 new tokens
    acceptance = RankProfile(ranks, [len(r) + 1 for r in ranks])
    off = apply(apply(program, SetMaxBatchSize(2)), SetDrafter("none"))

    def prefill(rows, tokens):                        # by hand, as in the drained case above
        n = rows * tokens
        memory = (2 * target_params() + n * H * 2 + n * KV_TOKEN) / gpu.memory_bandwidth
        compute = (2.0 * n * target_params() + L * 4.0 * n * tokens * 32 * 128) / gpu.matmul_flops
        return max(memory, compute)

    return CostModel(gpu), acceptance, off, apply(off, SetRefill("continuous")), prefill


def test_workload_prediction_with_refill_follows_the_slot_schedule(program):
    model, acceptance, off, refilled, prefill = _refill_case(program)
    gpu = model.gpu
    got = model.predict_speculative_run(refilled, acceptance, [20, 30, 10], [4, 7, 2])
    # request 0 holds slot 0 for 3 steps, request 1 slot 1 for 6; request 2 takes slot 0 at
    # step 3 for 1 step: 6 steps of both slots, at the mean context 20 + 13 / 3 / 2 = 22.17
    want = prefill(2, 30) + prefill(1, 10) + 6 * ar_step_bytes(2, 22) / gpu.memory_bandwidth
    assert got.overhead_s == 0.0 and got.tokens == 13
    assert got.roofline_s == pytest.approx(want, rel=1e-9)
    # the drained batches: (0, 1) for 6 steps, then (2) alone for 1, each prefilled as a batch
    drained = model.predict_speculative_run(off, acceptance, [20, 30, 10], [4, 7, 2])
    assert drained.roofline_s > got.roofline_s


@pytest.mark.parametrize("per, steps", [
    # one round a replay (the default): slot 0 frees at 3, is refilled a replay late (4),
    # request 2 ends at 5, request 1 at 6, and the loop runs one replay more: 7
    (None, 7),
    # two a replay: requests hold 2, 3 and 1 replays; request 2 starts at replay 3 and ends at
    # 4, one replay more is 5 replays, 10 steps
    ("2", 10),
])
def test_a_captured_refill_program_is_costed_in_the_replays_its_decoder_runs(
        program, monkeypatch, per, steps):
    from specpilot.ir import CaptureGraphs

    if per is None:
        monkeypatch.delenv("SPECPILOT_REFILL_ROUNDS", raising=False)
    else:
        monkeypatch.setenv("SPECPILOT_REFILL_ROUNDS", per)
    model, acceptance, _, refilled, prefill = _refill_case(program)
    graphed = apply(refilled, CaptureGraphs(True))
    got = model.predict_speculative_run(graphed, acceptance, [20, 30, 10], [4, 7, 2])
    want = prefill(2, 30) + prefill(1, 10) + steps * ar_step_bytes(2, 22) \
        / model.gpu.memory_bandwidth
    assert got.roofline_s == pytest.approx(want, rel=1e-9)


def test_a_program_the_graphed_runtime_refuses_is_costed_as_it_runs_eagerly(program):
    """With its drafter, the refilled chain Program is costed in replays and with graphed
    launches when captured; in the ragged layout the graphed runtime has no rounds for it, so it
    runs eagerly (refilled at once, every launch paid), captured or not. With launch overhead."""
    from specpilot.cost.gpu_specs import gpu_spec
    from specpilot.ir import CaptureGraphs, SetBatchLayout
    from specpilot.runtime.graphed_program import captures_rounds

    model = CostModel(gpu_spec("h200"))
    assert model.gpu.launch_overhead_s > 0
    _, acceptance, _, _, _ = _refill_case(program)

    def run(p):
        return model.predict_speculative_run(p, acceptance, [20, 30, 10], [4, 7, 2])

    chain = apply(apply(program, SetMaxBatchSize(2)), SetRefill("continuous"))
    captured = run(apply(chain, CaptureGraphs(True)))
    assert captured.roofline_s > run(chain).roofline_s          # more steps: replays
    assert captured.overhead_s < run(chain).overhead_s          # fewer paid launches a step
    ragged = apply(chain, SetBatchLayout("ragged"))
    assert captures_rounds(apply(chain, CaptureGraphs(True)))
    assert not captures_rounds(apply(ragged, CaptureGraphs(True)))
    assert run(apply(ragged, CaptureGraphs(True))) == run(ragged)
