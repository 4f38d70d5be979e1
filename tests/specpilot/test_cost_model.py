"""The cost model against hand-computed cases: bytes, step time, ceiling and gap of an
8B/1B-shaped pair on the H200 datasheet, lossless12 savings, batching waste, calibration."""
import math
from dataclasses import replace

import pytest

from specpilot.cost import (AssumedAcceptance, Calibration, CalibrationPoint, CostModel,
                            GAP_CATEGORIES, UnknownGpu, gpu_key, gpu_spec, measure_device)
from specpilot.cost.calibrate import fit
from specpilot.cost.model import idle_fraction
from specpilot.ir import (Deployment, ModelSpec, SetWeightFormat, apply, dense_weight_formats,
                          record_escape_rates, stock_program)

H, F, L, V = 4096, 14336, 32, 128256            # Llama-3.1-8B
DH, DF, DL = 2048, 8192, 16                     # Llama-3.2-1B (tied embeddings)


def spec(role, hidden, inter, layers, heads, kv, head_dim, tied):
    return ModelSpec(role=role, family="llama", checkpoint=f"/{role}", dtype="bfloat16",
                     vocab_size=V, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
                     num_heads=heads, num_kv_heads=kv, head_dim=head_dim, qkv_bias=False,
                     qk_norm=False, tie_embeddings=tied, layer_kinds=("attention",) * layers,
                     weight_formats=dense_weight_formats(layers, "bfloat16"))


@pytest.fixture(scope="module")
def program():
    dep = Deployment(spec("target", H, F, L, 32, 8, 128, False),
                     spec("drafter", DH, DF, DL, 32, 8, 64, True), "h200", "humaneval")
    return stock_program(dep)


def no_launch(name="h200"):
    return replace(gpu_spec(name), launch_overhead_s=0.0)


def target_params():
    layer = H * H + 2 * (8 * 128) * H + H * H + 3 * H * F
    return L * layer + V * H


def drafter_params():
    layer = DH * (32 * 64) + 2 * (8 * 64) * DH + (32 * 64) * DH + 3 * DH * DF
    return DL * layer + V * DH


def step_bytes(context, accepted, k=4, lossless_mlp=False):
    """Every byte one chain(k) step moves, by hand (bf16 = 2 bytes)."""
    t = k + 1
    catch_up = accepted + 1
    d_kv_token = DL * 2 * 8 * 64 * 2
    drafter = 0.0
    for tokens in [catch_up] + [1] * (k - 1):
        drafter += 2 * drafter_params() + tokens * DH * 2 + (context + tokens) * d_kv_token
    weights = 2 * target_params()
    if lossless_mlp:
        per = lambda o, i: o * i + o * ((i + 1) // 2) + o * 5 + 4       # no escapes
        weights -= L * 2 * 3 * H * F
        weights += L * (2 * per(F, H) + per(H, F))
    target = weights + t * H * 2 + L * (context + t) * 2 * 8 * 128 * 2
    logits = t * V * 4
    return drafter + target + logits


def test_gpu_names_resolve_to_their_datasheet_specs():
    assert gpu_key("NVIDIA H200") == "h200"
    assert gpu_key("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_key("NVIDIA A100-SXM4-80GB") == "a100"
    assert gpu_key("NVIDIA L40S") == "l40s"
    assert gpu_key("NVIDIA GeForce RTX 4090") == "rtx4090"
    assert gpu_key("cpu") == "cpu"
    assert gpu_spec("h200").memory_bandwidth == 4.8e12
    assert gpu_spec("a100").matmul_flops == 312e12
    with pytest.raises(UnknownGpu, match="measure"):
        gpu_key("Voodoo 2")


def test_step_time_is_every_byte_over_the_bandwidth_when_memory_bound(program):
    acceptance = AssumedAcceptance(0.8)
    accepted = 0.8 + 0.8 ** 2 + 0.8 ** 3 + 0.8 ** 4
    report = CostModel(no_launch()).report(program, acceptance, batch=1, context=512)
    expected = step_bytes(512, accepted) / 4.8e12
    assert report.mean_accepted == pytest.approx(accepted)
    assert report.step_s == pytest.approx(expected, rel=1e-9)
    assert report.tokens_per_s == pytest.approx((accepted + 1) / expected, rel=1e-9)
    assert all(n.bound == "memory" for n in report.nodes)


def test_ceiling_and_gap_split(program):
    acceptance = AssumedAcceptance(0.8)
    model = CostModel(no_launch())
    report = model.report(program, acceptance, batch=1, context=512)
    assert all(report.gap_per_token_s[c] >= 0 for c in GAP_CATEGORIES)
    assert sum(report.gap_per_token_s.values()) == pytest.approx(
        1 / report.tokens_per_s - 1 / report.ceiling_tokens_per_s, rel=1e-9)
    # dense bf16 against the ideal 12-bit weights: weight movement is the largest gap
    assert report.dominant == "weight_movement"
    assert report.ceiling_tokens_per_s > report.tokens_per_s
    with_overhead = CostModel(gpu_spec("h200")).report(program, acceptance, batch=1, context=512)
    launches = with_overhead.step_s - report.step_s
    assert launches > 0
    assert with_overhead.gap_per_token_s["launch_sync"] == pytest.approx(
        launches / (report.mean_accepted + 1), rel=1e-9)


@pytest.mark.parametrize("alpha,beta", [(3.0, 2.0), (0.5, 10.0)])
def test_gap_identity_holds_under_any_calibration(program, alpha, beta):
    model = CostModel(gpu_spec("h200"), Calibration(alpha, beta))
    report = model.report(program, AssumedAcceptance(0.6), batch=1, context=300)
    assert all(report.gap_per_token_s[c] >= 0 for c in GAP_CATEGORIES)
    assert sum(report.gap_per_token_s.values()) == pytest.approx(
        1 / report.tokens_per_s - 1 / report.ceiling_tokens_per_s, rel=1e-9)
    assert sum(report.breakdown_per_token_s.values()) == pytest.approx(
        1 / report.tokens_per_s, rel=1e-9)
    # the ceiling never credits a device below its roofline (alpha > 1), only above it
    plain = CostModel(gpu_spec("h200")).report(program, AssumedAcceptance(0.6), 1, 300)
    assert report.ceiling_tokens_per_s == pytest.approx(
        plain.ceiling_tokens_per_s / min(alpha, 1.0), rel=1e-9)


def test_lossless12_moves_fewer_bytes_by_the_format_formula(program):
    rates = {name: 0 for name in program.models.target.linears}
    packed = apply(record_escape_rates(program, "target", rates),
                   SetWeightFormat("target.mlp.*", "lossless12"))
    acceptance = AssumedAcceptance(0.8)
    accepted = acceptance.mean_accepted(packed.draft.topology)
    report = CostModel(no_launch()).report(packed, acceptance, batch=1, context=512)
    assert report.step_s == pytest.approx(
        step_bytes(512, accepted, lossless_mlp=True) / 4.8e12, rel=1e-9)


def test_batching_waste_hand_computed():
    # two requests of 3 and 1 steps in a batch of 2: 4 busy slots of 6
    assert idle_fraction([[1, 1, 1], [2]], 2) == pytest.approx(1 / 3)
    assert idle_fraction([[1, 1, 1], [2]], 1) == 0.0
    assert idle_fraction(None, 4) is None


def test_calibration_recovers_factors_from_measurements():
    alpha, beta = 1.7, 0.4
    points = [CalibrationPoint(str(i), alpha * r + beta * o, r, o)
              for i, (r, o) in enumerate([(1.0, 0.1), (0.2, 2.0), (0.5, 0.5), (3.0, 0.3),
                                          (0.1, 4.0), (2.0, 2.0), (0.7, 0.05), (0.05, 1.5)])]
    a, b = fit(points)
    assert a == pytest.approx(alpha, rel=0.05) and b == pytest.approx(beta, rel=0.05)
    one = Calibration().with_point(points[0])
    assert one.predict(1.0, 0.1) == pytest.approx(points[0].measured_s)
    assert one.error(points[0]) == pytest.approx(0.0, abs=1e-12)


def test_calibration_keeps_one_factor_when_runs_cannot_separate_two():
    # roofline and overhead in the same 1:3 ratio (+-2%), measured with 10% noise
    noise = [1.1, 0.92, 1.05, 0.97, 1.08]
    points = [CalibrationPoint(str(i), 2.5 * (r + 3 * r * w) * n, r, 3 * r * w)
              for i, (r, w, n) in enumerate(zip([0.5, 1.0, 2.0, 0.7, 1.4],
                                                [1.0, 1.02, 0.98, 1.01, 0.99], noise))]
    a, b = fit(points)
    assert a == b
    assert a == pytest.approx(2.5, rel=0.1)


def test_calibrated_prediction_of_a_workload(program):
    model = CostModel(no_launch())
    lengths, new = [100, 80], [20, 20]
    first = model.predict_ar_run(program, lengths, new, batch=1)
    calibrated = model.calibrated("ar", first.seconds * 2.0, first)
    again = calibrated.predict_ar_run(program, lengths, new, batch=1)
    assert again.seconds == pytest.approx(first.seconds * 2.0, rel=1e-9)


def test_measure_device_on_this_cpu():
    measured = measure_device("cpu", repeats=2)
    assert measured.source == "measured"
    for value in (measured.memory_bandwidth, measured.matmul_flops, measured.vector_flops,
                  measured.launch_overhead_s):
        assert math.isfinite(value) and value > 0
    assert measured.graphed_launch_s is None          # no CUDA graphs on a CPU
    overridden = gpu_spec("h200").overridden_by(measured)
    assert overridden.memory_bandwidth == measured.memory_bandwidth
    assert overridden.sm_count == 132


def test_graph_capture_cuts_the_modelled_launch_overhead_only(program):
    """A Program with CaptureGraphs keeps every node's bytes and FLOPs and pays a fixed share of
    the eager launch overhead (roofline.GRAPHED_LAUNCH_SHARE); graphed AR likewise. The round's
    end moves from the host to the device: its kernels are priced (GRAPHED_COMMIT_OPS)."""
    from specpilot.cost.roofline import GRAPHED_COMMIT_OPS, GRAPHED_LAUNCH_SHARE, step_nodes
    from specpilot.ir import CaptureGraphs, apply

    graphed = apply(program, CaptureGraphs(True))
    gpu = gpu_spec("h200")
    eager_nodes = step_nodes(program, gpu, 4, 256, 2.0)
    graph_nodes = step_nodes(graphed, gpu, 4, 256, 2.0)
    assert [n.name for n in eager_nodes] == [n.name for n in graph_nodes]
    for e, g in zip(eager_nodes, graph_nodes):
        assert (g.weight_bytes, g.flops) == (e.weight_bytes, e.flops)
        if g.kind == "commit":
            assert e.launches == 0 and g.launches == pytest.approx(
                GRAPHED_COMMIT_OPS["ops"] * GRAPHED_LAUNCH_SHARE)
            continue
        assert g.overhead_s(gpu) == pytest.approx(GRAPHED_LAUNCH_SHARE * e.overhead_s(gpu))
    model = CostModel(gpu)
    eager_ar = model.predict_ar_run(program, [10, 20], [30, 30], 2)
    graph_ar = model.predict_ar_run(program, [10, 20], [30, 30], 2, graphed=True)
    assert graph_ar.roofline_s == pytest.approx(eager_ar.roofline_s)
    assert graph_ar.overhead_s < eager_ar.overhead_s


def test_a_measured_in_graph_kernel_cost_replaces_the_assumed_share(program):
    """Where the GPU's in-graph kernel cost was measured, a graphed node pays exactly that per
    launch (hand-computed: launches x graphed_launch_s), and graphed AR likewise."""
    from specpilot.cost.roofline import step_nodes
    from specpilot.ir import CaptureGraphs, SetAcceptKernels, SetDraftLengthPolicy, apply

    eager_gpu = gpu_spec("h200")
    measured = replace(eager_gpu, launch_overhead_s=8e-6, graphed_launch_s=3e-6)
    graphed = apply(program, CaptureGraphs(True))
    eager_nodes = step_nodes(program, measured, 4, 256, 2.0)
    for e, g in zip(eager_nodes, step_nodes(graphed, measured, 4, 256, 2.0)):
        # the round's end runs on the device when graphed (GRAPHED_COMMIT_OPS), on the host
        # when eager
        launches = 39 if g.kind == "commit" else e.launches
        assert g.overhead_s(measured) == pytest.approx(launches * 3e-6)
    fused = apply(graphed, SetAcceptKernels("fused"))
    commit = [g for g in step_nodes(fused, measured, 4, 256, 2.0) if g.kind == "commit"]
    assert [g.overhead_s(measured) for g in commit] == [pytest.approx(3e-6)]
    # Adaptive lengths update the length in the round too: 7 compiled kernels with the torch
    # round end, one generated kernel with the fused one.
    for prog, launches in ((graphed, 39 + 7), (fused, 1 + 1)):
        adaptive = apply(prog, SetDraftLengthPolicy("per_request_adaptive", 40))
        commit = [g for g in step_nodes(adaptive, measured, 4, 256, 2.0) if g.kind == "commit"]
        assert [g.overhead_s(measured) for g in commit] == [pytest.approx(launches * 3e-6)]
    # graphed AR: its decode steps pay 3/8 of their eager overhead, its (eager) prefills all
    def ar_overhead(gpu, graphed):
        return CostModel(gpu).predict_ar_run(program, [10, 20], [30, 30], 2,
                                             graphed=graphed).overhead_s
    prefills = ar_overhead(replace(measured, graphed_launch_s=0.0), True)
    decode = ar_overhead(measured, False) - prefills
    assert ar_overhead(measured, True) == pytest.approx(prefills + decode * 3 / 8)


def test_gpu_specs_round_trip_and_older_specs_load_without_the_graphed_cost():
    from specpilot.cost.gpu_specs import GpuSpec

    measured = replace(gpu_spec("h200"), graphed_launch_s=2.5e-6)
    assert GpuSpec.from_json(measured.to_json()) == measured
    older = gpu_spec("h200").to_json()
    del older["graphed_launch_s"]
    assert GpuSpec.from_json(older).graphed_launch_s is None
    assert gpu_spec("h100").overridden_by(measured).graphed_launch_s == 2.5e-6
