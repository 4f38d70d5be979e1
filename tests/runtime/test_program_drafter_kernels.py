"""A Program's kernels.drafter_kernels = "fused" makes load_pair run the drafter in the fused layer
kernels (runtime/fused_forward.py; Triton's interpreter without a GPU): the decoder's output is the
unfused pair's, a pair built the other way is refused rather than timed as the wrong decoder, a
drafter the kernels cannot run is refused with the reason, and the search, the cost report and
`ir show` know the choice."""
import pytest
import torch

from specpilot.deploy import build_deployment
from specpilot.ir import (SetBatchLayout, SetDrafterKernels, SetMaxBatchSize,
                          apply, replay, stock_program)
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.decoder import (UnsupportedProgram, check_pair_runs, load_pair,
                                       needs_own_pair, run_reference, timed_program)
from specpilot.runtime.fused_forward import FusedForward

from hf_factory import (FUSABLE, kernel_device, make_checkpoint, make_pair, noisy_checkpoint,
                        random_prompts)

MAX_NEW = 6
DEVICE = kernel_device()
SHAPE = dict(FUSABLE, num_hidden_layers=1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused-drafter")
    target = make_checkpoint(root, "llama3", name="target", seed=41, **SHAPE)
    # A noisy copy of the target (same shape and vocabulary): it drafts the target's tokens
    # often, not always, so rounds accept some drafts and reject others.
    drafter = noisy_checkpoint(target, "drafter", 0.1, seed=42)
    stock = stock_program(build_deployment(target, drafter, dtype="float32"))
    base = apply(stock, SetMaxBatchSize(2))
    return dict(target=target, drafter=drafter, base=base,
                fused=apply(base, SetDrafterKernels("fused")))


def test_load_pair_runs_the_drafter_fused_and_the_output_is_the_unfused_pairs(setup):
    fused_pair = load_pair(setup["target"], setup["drafter"], "float32", DEVICE,
                           program=setup["fused"])
    plain = load_pair(setup["target"], setup["drafter"], "float32", DEVICE)
    assert isinstance(fused_pair.drafter, FusedForward)
    assert not isinstance(fused_pair.target, FusedForward)
    assert not isinstance(plain.drafter, FusedForward)
    # the wrapped model is the drafter checkpoint's, not the target's
    assert torch.equal(fused_pair.drafter.lm_head_weight, plain.drafter.lm_head[0])
    assert not torch.equal(fused_pair.drafter.lm_head_weight, plain.target.lm_head[0])
    prompts = random_prompts((5, 3), seed=43)
    reference = run_reference(plain, prompts, MAX_NEW, batch_size=2)
    unfused = timed_program(setup["base"], plain, prompts, MAX_NEW)
    fused = timed_program(setup["fused"], fused_pair, prompts, MAX_NEW)
    assert fused.tokens == unfused.tokens == reference.tokens
    # in float32 the fused drafter proposes the per-op drafter's tokens: the same rounds, some
    # drafts accepted and some not (chain(4): 1 to 5 tokens a round)
    assert fused.target_forwards == unfused.target_forwards
    assert fused.mean_accepted == unfused.mean_accepted and 1 < fused.mean_accepted < 5


def test_the_ragged_layout_runs_a_fused_drafters_own_model_for_its_packed_steps(setup):
    """The packed (varlen) attention is the model's: a ragged Program with fused drafter
    kernels drafts through the drafter's per-op forward, and its output is the unfused one's."""
    ragged, ragged_fused = (replay(p, [SetBatchLayout("ragged")])
                            for p in (setup["base"], setup["fused"]))
    fused_pair = load_pair(setup["target"], setup["drafter"], "float32", DEVICE,
                           program=ragged_fused)
    plain = load_pair(setup["target"], setup["drafter"], "float32", DEVICE)
    prompts = random_prompts((5, 3), seed=44)
    unfused = timed_program(ragged, plain, prompts, MAX_NEW)
    fused = timed_program(ragged_fused, fused_pair, prompts, MAX_NEW)
    assert fused.tokens == unfused.tokens == run_reference(plain, prompts, MAX_NEW,
                                                          batch_size=2).tokens
    assert fused.target_forwards == unfused.target_forwards


def test_a_pair_built_for_the_other_drafter_kernels_is_refused(setup):
    plain = load_pair(setup["target"], setup["drafter"], "float32", DEVICE)
    with pytest.raises(UnsupportedProgram, match="the drafter was loaded with 'model' drafter "
                                                 "kernels but the Program runs "
                                                 "kernels.drafter_kernels 'fused'"):
        check_pair_runs(setup["fused"], plain)
    with pytest.raises(UnsupportedProgram, match="loaded with 'model' drafter kernels"):
        timed_program(setup["fused"], plain, random_prompts((3,), seed=44), MAX_NEW)
    fused_pair = load_pair(setup["target"], setup["drafter"], "float32", DEVICE,
                           program=setup["fused"])
    with pytest.raises(UnsupportedProgram, match="loaded with 'fused' drafter kernels but the "
                                                 "Program runs kernels.drafter_kernels 'model'"):
        check_pair_runs(setup["base"], fused_pair)
    check_pair_runs(setup["fused"], fused_pair)
    check_pair_runs(setup["base"], plain)


def test_a_drafter_the_fused_kernels_cannot_run_is_refused_with_the_reason(tmp_path):
    target, drafter = make_pair(tmp_path, "llama3", seed=5)     # the drafter's head_dim is 8
    program = apply(stock_program(build_deployment(target, drafter, dtype="float32")),
                    SetDrafterKernels("fused"))
    with pytest.raises(SpecPilotError) as info:
        load_pair(target, drafter, "float32", DEVICE, program=program)
    assert str(info.value) == ("the fused forward cannot run this model: head_dim 8 is odd or "
                               "outside 16..256 (RoPE pairs its halves; the attention kernel "
                               "takes 16 to 256)")


def test_the_search_builds_a_fused_drafter_program_its_own_pair(setup):
    from specpilot.search.evaluate import _build_key

    assert not needs_own_pair(setup["base"]) and needs_own_pair(setup["fused"])
    assert _build_key(setup["base"]) != _build_key(setup["fused"])


def test_the_cost_model_prices_the_fused_drafter_and_ir_show_names_it(setup):
    from specpilot.cli_ir import summarize
    from specpilot.cost import CostModel, gpu_spec
    from specpilot.cost.roofline import step_nodes

    gpu = gpu_spec("h200")

    def drafter_launches(program, batch=2):
        return [n.launches for n in step_nodes(program, gpu, batch, 40, 2.0)
                if n.kind == "drafter_forward"]
    # one layer: five fused launches and the LM head's (the first layer's attention finds its
    # bound, the head the argmax), against the per-op count (q/k/v, RoPE, attention, o_proj and
    # the norms and adds: 8 + 6 a layer, the head's 2, the embedding)
    assert drafter_launches(setup["fused"]) == [1 * 5 + 1] * 4
    assert drafter_launches(setup["base"]) == [1 * (8 + 6) + 2 + 1] * 4
    # past 256 new tokens a call the fused forward hands over to the model's: at batch 100 the
    # catch-up (3 tokens a request: 2 accepted and the bonus) is priced per op, the steps fused
    assert drafter_launches(setup["fused"], batch=100) == [1 * (8 + 6) + 2 + 1] + [1 * 5 + 1] * 3
    model = CostModel(gpu)
    assert (model.step_seconds(setup["fused"], 2, 40, 2.0)
            < model.step_seconds(setup["base"], 2, 40, 2.0))
    assert ("backend torch (fast path ops), fused drafter kernels, graph capture off"
            in summarize(setup["fused"]))
    assert "drafter kernels" not in summarize(setup["base"])
