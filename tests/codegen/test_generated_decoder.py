"""The generated backend: a Program's own kernels run the whole decoder.

References: HF transformers logits for single forwards, and the torch backend's greedy output
(itself checked against HF in tests/runtime) for AR, chain speculation and token forcing. On the
CPU the kernels run in Triton's interpreter, so the models are tiny and the runs short.
"""
import os
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from specpilot.codegen.cache import triton_interpreting
from specpilot.codegen.formats.lossless12 import pack_lossless12
from specpilot.codegen.lower import lower_program
from specpilot.deploy import build_deployment
from specpilot.ir import (SetBackend, SetDraftLength, SetMaxBatchSize, SetWeightFormat, Tree,
                          apply, record_escape_rates, stock_program)
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.checkpoint import load_checkpoint
from specpilot.runtime.acceptance import greedy_accept
from specpilot.runtime.decoder import (UnsupportedProgram, acceptance_rule, check_runnable,
                                       force_program, load_pair, run_reference, timed_program)
from specpilot.runtime.forcing import default_tolerance
from specpilot.runtime.generated_backend import GeneratedBackend, GeneratedBackendError
from specpilot.runtime.model import Transformer
from specpilot.runtime.steps import append_step
from specpilot.runtime.tree_plan import TreePlan

from hf_factory import hf_logits, load_hf, make_checkpoint, random_prompts

MAX_NEW = 6
# head_dim 16, the smallest the attention kernel family takes.
TARGET = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)


def noisy_copy(folder, name, noise, seed):
    """A copy of checkpoint `folder` with Gaussian noise (`noise` x each matrix's std) on every
    matrix: a drafter that agrees with the target often, but not always."""
    out = os.path.join(os.path.dirname(folder), name)
    shutil.copytree(folder, out)
    path = os.path.join(out, "model.safetensors")
    gen = torch.Generator().manual_seed(seed)
    tensors = {k: (t.float() + noise * t.float().std() * torch.randn(t.shape, generator=gen)).to(t.dtype)
               if t.dim() == 2 else t for k, t in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})
    return out


def measured(program, role, folder):
    """`program` with the lossless12 escape rate of every linear of `role` measured on `folder`."""
    tensors = load_checkpoint(folder).tensors
    rates = {}
    for linear in getattr(program.models, role).linears:
        w = tensors["lm_head.weight" if linear == "lm_head" else f"model.{linear}.weight"].bfloat16()
        rates[linear] = pack_lossless12(w).num_escapes * 1_000_000 // w.numel()
    return record_escape_rates(program, role, rates)


def generated_program(target_dir, drafter_dir, dtype, lossless12=False):
    """Stock Program on the generated backend with chain(2), both prompts in one batch."""
    program = stock_program(build_deployment(target_dir, drafter_dir, "cpu", dtype))
    if lossless12:
        program = measured(measured(program, "target", target_dir), "drafter", drafter_dir)
        program = apply(program, SetWeightFormat("target.*", "lossless12"))
        program = apply(program, SetWeightFormat("drafter.lm_head", "lossless12"))
    for t in (SetBackend("generated"), SetDraftLength(2), SetMaxBatchSize(2)):
        program = apply(program, t)
    return program


def assert_same_tokens(got, reference, dtype):
    """Equal tokens, except that after a reference position whose top-1/top-2 margin is a
    near-tie (below the forcing tolerance) the two runs may part ways; most positions must be
    compared exactly."""
    tol, compared, total = default_tolerance(dtype), 0, 0
    for tokens, ref, margins in zip(got, reference.tokens, reference.margins):
        total += len(ref)
        for tok, want, margin in zip(tokens, ref, margins):
            if tok != want:
                assert margin < tol, f"token {tok} where the reference has {want} (margin {margin})"
                break
            compared += 1
        else:
            assert len(tokens) == len(ref)
    assert compared * 2 >= total, f"only {compared} of {total} positions agreed"


@pytest.fixture(scope="module", params=["float32", "bfloat16-lossless12"])
def decoders(request, tmp_path_factory):
    dtype = request.param.split("-")[0]
    save = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    folder = tmp_path_factory.mktemp("generated")
    target_dir = make_checkpoint(folder, "llama3", name="target", seed=4, save_dtype=save,
                                 num_hidden_layers=1, **TARGET)
    drafter_dir = noisy_copy(target_dir, "drafter", noise=0.1, seed=5)
    program = generated_program(target_dir, drafter_dir, dtype, lossless12=dtype == "bfloat16")
    device = "cpu" if triton_interpreting() else "cuda"
    generated = load_pair(target_dir, drafter_dir, dtype, device, program=program)
    stock = load_pair(target_dir, drafter_dir, dtype, device)
    prompts = random_prompts((3, 5), seed=8)
    return dict(program=program, generated=generated, stock=stock, prompts=prompts, dtype=dtype,
                reference=run_reference(stock, prompts, MAX_NEW, batch_size=2))


def test_the_models_run_the_programs_kernels(decoders):
    program, pair = decoders["program"], decoders["generated"]
    assert pair.target.backend.name == pair.drafter.backend.name == "generated"
    assert acceptance_rule(program, pair) == pair.target.backend.accept_greedy
    layer = pair.target.layers[0].linears
    if "lossless12" in dict(program.models.target.weight_formats).values():
        assert type(layer["mlp.down_proj"].weight).__name__ == "Lossless12Tensor"
        assert layer["mlp.gate_proj"].launch is not None  # unfused: two lossless12 linears
    else:
        assert layer["mlp.gate_proj"].node == "target.layers.0.mlp.gate_up"
        assert layer["mlp.gate_proj"].launch is None and layer["mlp.gate_proj"].fused is not None


def test_greedy_ar_matches_the_torch_backend(decoders):
    d = decoders
    got = generate_ar(d["generated"].target, d["prompts"], MAX_NEW)
    assert_same_tokens(got.tokens, d["reference"], d["generated"].target.dtype)


def test_chain_speculation_matches_the_torch_backend(decoders):
    d = decoders
    run = timed_program(d["program"], d["generated"], d["prompts"], MAX_NEW)
    assert_same_tokens(run.tokens, d["reference"], d["generated"].target.dtype)
    # The drafter is right often enough that some steps commit drafted tokens, not only the bonus.
    assert run.mean_accepted > 1.0 and run.target_forwards >= 2


def test_token_forcing_against_the_stock_reference_passes(decoders):
    d = decoders
    report = force_program(d["program"], d["generated"], d["prompts"], d["reference"])
    assert report.passed, report.format()
    assert report.positions_compared == sum(len(t) for t in d["reference"].tokens)


@pytest.mark.parametrize("family,overrides", [
    ("llama3", dict(num_attention_heads=2, num_key_value_heads=1)),
    ("qwen2", dict(num_attention_heads=2, num_key_value_heads=1)),            # q/k/v bias
    ("qwen3", dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16)),
    ("mistral", dict(num_attention_heads=2, num_key_value_heads=2)),           # sliding window 5
])
def test_one_forward_matches_hf(tmp_path, family, overrides, device):
    folder = make_checkpoint(tmp_path, family, seed=3, **overrides)
    program = apply(stock_program(build_deployment(folder, folder, "cpu", "float32")),
                    SetBackend("generated"))
    backend = GeneratedBackend(lower_program(program), role="target")
    model = Transformer.from_checkpoint(folder, "float32", device, backend=backend,
                                        weight_formats=program.models.target.formats())
    prompt = random_prompts((9,), seed=2)[0]
    cache = model.new_cache(1, 16)
    logits = append_step(model, cache, torch.zeros(1, dtype=torch.int64, device=device), [prompt],
                         logits_last_only=False)[0]
    torch.testing.assert_close(logits.cpu(), hf_logits(load_hf(folder), prompt), rtol=1e-4, atol=1e-4)




def test_generated_greedy_acceptance_matches_the_torch_rule(kernel_cache, device):
    from test_lower import tiny_program

    backend = GeneratedBackend(lower_program(tiny_program()), kernel_cache, role="target")
    plan = TreePlan.build(Tree((2, 2)))
    gen = torch.Generator().manual_seed(6)
    paths = []
    for trial in range(4):
        logits = torch.randn(plan.num_nodes + 1, 97, generator=gen)
        best = logits.argmax(-1).tolist()
        # The target's own choice up to depth `trial`; in trial 2 the root's first child misses,
        # so the accepted path runs through its second child.
        right = [d <= trial and not (i == 0 and trial == 2) for i, d in enumerate(plan.shape.depths)]
        tokens = [best[p + 1] if ok else (best[p + 1] + 1) % 97
                  for ok, p in zip(right, plan.shape.parents)]
        expected = greedy_accept(plan, tokens, logits)
        assert backend.accept_greedy(plan, tokens, logits.to(device)) == expected
        paths.append(expected.nodes)
    assert paths == [(), (0,), (1, 4), (0, 2)]


def test_a_pair_loaded_for_another_backend_is_refused(decoders):
    d = decoders
    with pytest.raises(UnsupportedProgram, match="loaded with the torch backend.*load_pair"):
        timed_program(d["program"], d["stock"], d["prompts"], MAX_NEW)


def test_check_runnable_takes_lossless12_on_the_generated_backend_only():
    from test_lower import tiny_program, with_measured_escapes

    packed = apply(with_measured_escapes(tiny_program()), SetWeightFormat("target.mlp.*", "lossless12"))
    with pytest.raises(UnsupportedProgram, match=r"models.target.weight_formats\[layers.0.mlp."
                                                 r"down_proj\] = 'lossless12'.*'generated'"):
        check_runnable(packed)
    check_runnable(apply(packed, SetBackend("generated")))  # accepted: nothing raised
    check_runnable(apply(tiny_program(), SetBackend("generated")))


def test_per_layer_attention_kernels_are_refused_with_the_reason(kernel_cache):
    from test_lower import tiny_program

    program = tiny_program()
    program = replace(program, kernels=replace(program.kernels, overrides={
        "target.layers.1.self_attn.attention": {"BLOCK_S": 32}}))
    with pytest.raises(GeneratedBackendError, match=r"target.layers.0.self_attn.attention and "
                                                    r"target.layers.1.self_attn.attention run "
                                                    r"different attention kernels"):
        GeneratedBackend(lower_program(program), kernel_cache, role="target")
    # The drafter's kernels are uniform: its backend builds.
    assert GeneratedBackend(lower_program(program), kernel_cache, role="drafter").role == "drafter"


def test_a_linear_that_disagrees_with_its_plan_node_is_refused(kernel_cache, device):
    from test_lower import tiny_program

    backend = GeneratedBackend(lower_program(tiny_program()), kernel_cache, role="target")
    w = torch.randn(64, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(GeneratedBackendError, match="lowered without a bias"):
        backend.prepare_linear("layers.0.self_attn.q_proj", w, torch.randn(64, device=device), "bf16")
    with pytest.raises(GeneratedBackendError, match="lowered for bf16 weights, but the model stores "
                                                    "layers.0.self_attn.q_proj as lossless12"):
        backend.prepare_linear("layers.0.self_attn.q_proj", w, None, "lossless12")
    with pytest.raises(GeneratedBackendError, match="no node for the target's linear layers.5"):
        backend.prepare_linear("layers.5.self_attn.q_proj", w, None, "bf16")
    # The fused half only runs through mlp_gate_up.
    gate = backend.prepare_linear("layers.0.mlp.gate_proj", torch.randn(128, 64, dtype=torch.bfloat16,
                                                                        device=device), None, "bf16")
    with pytest.raises(GeneratedBackendError, match="mlp_gate_up"):
        backend.linear(torch.randn(1, 64, dtype=torch.bfloat16, device=device), gate)
