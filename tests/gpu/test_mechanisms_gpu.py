"""The eager mechanism decodes on a CUDA GPU, where a tensor left on the host by the runtime
fails ("Expected all tensors to be on the same device"): every eager Program of
`specpilot bench --mechanisms` (ragged, refill, ragged + adaptive + refill, two-level, dynamic
tree) and a few combinations decode exactly like greedy AR of the same target in float32, and
pass token forcing. Skipped without CUDA.
"""
import pytest
import torch

from hf_factory import make_checkpoint, noisy_checkpoint, random_prompts
from mechanism_setup import pick_eos
from specpilot.bench.mechanism_programs import mechanism_programs
from specpilot.deploy import build_deployment, detect_gpu
from specpilot.ir import (DynamicTree, LayerSkipPrune, LowPrecisionPrune, SetBackend,
                          SetBatchLayout, SetMaxBatchSize, SetRefill, SetTopology, SetVerifyPrune,
                          Tree, replay, stock_program)
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.decoder import acceptance_rule, load_pair
from specpilot.runtime.mechanisms import (force_program_decode, run_program_decode,
                                          uses_mechanisms)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MAX_NEW = 16
BATCH = 3
# head_dim 16: the generated attention kernels' smallest, so one pair serves every backend.
TARGET = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2)

# Programs beyond the bench's: mechanisms combined, and the ragged layout's varlen kernel.
EXTRA = {
    "dynamic+layer_skip+ragged+continuous": [
        SetTopology(DynamicTree(6, 3, 3)), SetVerifyPrune(LayerSkipPrune((1,), 2)),
        SetBatchLayout("ragged"), SetRefill("continuous")],
    "tree+low_precision+ragged": [
        SetTopology(Tree((2, 2))), SetVerifyPrune(LowPrecisionPrune("bfloat16", 2)),
        SetBatchLayout("ragged")],
    "generated+ragged+continuous": [
        SetBackend("generated"), SetBatchLayout("ragged"), SetTopology(Tree((2, 1))),
        SetRefill("continuous")],
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mechanisms-gpu")
    target_dir = make_checkpoint(folder, "llama3", name="target", seed=31, **TARGET)
    drafter_dir = noisy_checkpoint(target_dir, "drafter", noise=0.1, seed=32)
    stock = replay(stock_program(build_deployment(target_dir, drafter_dir, detect_gpu(),
                                                  "float32")), [SetMaxBatchSize(BATCH)])
    programs = {name: p for name, p in mechanism_programs(stock).items()
                if not p.kernels.capture_graphs}
    programs.update({name: replay(stock, records) for name, records in EXTRA.items()})
    prompts = random_prompts((5, 11, 2, 8, 6), seed=33)
    return dict(target_dir=target_dir, drafter_dir=drafter_dir, programs=programs,
                prompts=prompts)


def test_the_bench_eager_mechanisms_are_all_covered(setup):
    assert {"ragged", "refill", "ragged_adaptive_refill", "two_level",
            "dynamic_tree"} <= set(setup["programs"])


# Programs on the generated backend: the CUDA fast path is the torch backend's, so they run
# with their own kernels only.
GENERATED = {"generated+ragged+continuous"}
CASES = [(name, fast) for name in ("ragged", "refill", "ragged_adaptive_refill", "two_level",
                                   "dynamic_tree", *EXTRA)
         for fast in (False, True) if not (fast and name in GENERATED)]


@pytest.mark.parametrize("name,fast_path", CASES,
                         ids=[f"{n}-{'fast-ops' if f else 'reference-ops'}" for n, f in CASES])
def test_mechanism_decode_on_cuda_equals_greedy_ar(setup, name, fast_path):
    program = setup["programs"][name]
    assert (program.kernels.backend != "torch") == (name in GENERATED)
    assert uses_mechanisms(program)
    pair = load_pair(setup["target_dir"], setup["drafter_dir"], "float32", "cuda",
                     program=program, fast_path=fast_path)
    assert pair.target.device.type == "cuda" and pair.drafter.device.type == "cuda"
    prompts = setup["prompts"]
    plain = generate_ar(pair.target, prompts, MAX_NEW)
    eos = (pick_eos(plain.tokens),)
    reference = generate_ar(pair.target, prompts, MAX_NEW, eos_ids=eos)
    acceptance = acceptance_rule(program, pair)

    result = run_program_decode(program, pair.target, pair.drafter, prompts, MAX_NEW, eos,
                                acceptance=acceptance)
    assert result.tokens == reference.tokens
    assert result.target_forwards > 0
    assert max(max(a) for a in result.accepted_lengths) >= 1   # drafts were accepted, not only roots

    report = force_program_decode(program, pair.target, pair.drafter, prompts, reference,
                                  acceptance=acceptance)
    assert report.passed and not report.violations, report.format()
    assert report.positions_compared == sum(len(t) for t in reference.tokens)

