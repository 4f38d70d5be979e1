"""A Program with the whole-layer fast path (SetFastPath("layers")) and CaptureGraphs on a CUDA
GPU: load_pair builds compiled-layer models for it, its graphed rounds give the greedy AR output
of that same target, and it passes token forcing against the reference-ops decoder (near-ties
tolerated: fused kernels round differently). Skipped without CUDA."""
from dataclasses import replace

import pytest
import torch

from hf_factory import make_checkpoint, noisy_checkpoint, random_prompts
from specpilot.deploy import build_deployment, detect_gpu
from specpilot.ir import CaptureGraphs, SetFastPath, apply, stock_program
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.decoder import load_pair
from specpilot.runtime.fast_ops import LAYERS
from specpilot.runtime.graphed_program import force_graphed, release_decoders, run_graphed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_a_whole_layer_program_decodes_and_forces_clean(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECPILOT_FAST_OPS", raising=False)
    target_dir = make_checkpoint(tmp_path, "llama3", name="target", seed=95)
    drafter_dir = noisy_checkpoint(target_dir, "drafter", noise=0.1, seed=96)
    stock = stock_program(build_deployment(target_dir, drafter_dir, detect_gpu(), "float32"))
    program = apply(apply(stock, CaptureGraphs(True)), SetFastPath("layers"))
    program = replace(program, batch=replace(program.batch, max_batch_size=3))
    pair = load_pair(target_dir, drafter_dir, "float32", "cuda", program=program)
    assert pair.target.backend.fast_ops_mode == LAYERS
    prompts = random_prompts((7, 12, 3, 9), seed=97)
    release_decoders()
    r = run_graphed(program, pair, prompts, 20)
    assert r.tokens == generate_ar(pair.target, prompts, 20).tokens
    assert r.mean_accepted > 1.0
    reference_ops = load_pair(target_dir, None, "float32", "cuda", fast_path=False)
    reference = generate_ar(reference_ops.target, prompts, 20)
    report = force_graphed(program, pair, prompts, reference)
    assert report.passed and not report.violations, report.format()
    release_decoders()
