"""A Program that does not speculate, with CaptureGraphs, on a CUDA GPU: the routing the bench
and `specpilot compile` use (runtime/graphed_program.py) captures the strong AR decoder (chains
of 0, no drafter), whose output is greedy AR's in float32 and whose forcing is clean. Skipped
without CUDA."""
from dataclasses import replace

import pytest
import torch

from hf_factory import make_checkpoint, noisy_checkpoint, random_prompts
from mechanism_setup import pick_eos
from specpilot.deploy import build_deployment, detect_gpu
from specpilot.ir import CaptureGraphs, SetDrafter, apply, stock_program
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.decoder import load_pair
from specpilot.runtime.graphed_program import (decoder_for, force_graphed, graph_refusal,
                                               release_decoders, run_graphed)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("batch", [1, 3])
def test_a_graphed_program_without_drafter_is_captured_greedy_ar(tmp_path, batch):
    target_dir = make_checkpoint(tmp_path, "llama3", name="target", seed=91)
    drafter_dir = noisy_checkpoint(target_dir, "drafter", noise=0.1, seed=92)
    stock = stock_program(build_deployment(target_dir, drafter_dir, detect_gpu(), "float32"))
    program = apply(apply(stock, CaptureGraphs(True)), SetDrafter("none"))
    program = replace(program, batch=replace(program.batch, max_batch_size=batch))
    pair = load_pair(target_dir, drafter_dir, "float32", "cuda", program=program)
    assert graph_refusal(program, pair.target.device) is None
    prompts = random_prompts((6, 13, 2, 9, 4), seed=93)
    plain = generate_ar(pair.target, prompts, 20)
    pair = replace(pair, eos_ids=(pick_eos(plain.tokens),))
    reference = generate_ar(pair.target, prompts, 20, eos_ids=pair.eos_ids)
    release_decoders()
    decoder = decoder_for(program, pair, prompts, 20)
    assert decoder.k == 0 and decoder.drafter is None and decoder.capture
    for _ in range(2):                                   # replayed graphs serve every call
        r = run_graphed(program, pair, prompts, 20)
        assert r.tokens == reference.tokens
        assert r.drafter_forwards == 0 and r.mean_accepted == 1.0
    report = force_graphed(program, pair, prompts, reference)
    assert report.passed and not report.violations, report.format()
    assert report.positions_compared == sum(len(t) for t in reference.tokens)
    release_decoders()
