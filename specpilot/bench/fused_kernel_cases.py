"""A shape preset's fused drafter kernels, their operands at its decode shapes, and a launch's
time in a CUDA graph: what bench/fused_tile_sweep.py and bench/stage_ablation.py time their
variants with."""
from __future__ import annotations

from typing import Callable, Dict, Tuple

import torch

from specpilot.bench.shapes import build_preset
from specpilot.bench.step_costs import time_median
from specpilot.codegen.fused_layer import fused_layer_specs
from specpilot.runtime.cuda_graphs import capture_graph

LAUNCHES_PER_GRAPH, REPLAYS = 20, 30


def preset_with_specs(preset: str, device) -> tuple:
    """(the shape preset's model, random bf16 weights of seed 2, on `device`; the default specs
    of its fused layer kernels by name, codegen/fused_layer.py's)."""
    model = build_preset(preset, device, torch.bfloat16, 1.0, seed=2)
    cfg = model.config
    return model, fused_layer_specs("bf16", cfg.hidden_size, cfg.num_heads, cfg.head_dim,
                                    cfg.intermediate_size, cfg.vocab_size)


def kernel_cases(cfg, rows: int, device) -> Dict[str, Tuple[tuple, dict, torch.Tensor]]:
    """Per kernel name: (launch args, launch kwargs, the output tensor), random bf16 operands at
    `cfg`'s shapes for `rows` tokens (one a request, so rows requests)."""
    bf = dict(dtype=torch.bfloat16, device=device)
    h, i, v, d = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.head_dim
    hq, hkv, capacity = cfg.num_heads, cfg.num_kv_heads, 256
    rand = lambda *shape: torch.randn(*shape, **bf) / 4                       # noqa: E731
    positions = torch.randint(0, capacity, (rows, 1), device=device)
    qkv_out = torch.empty((rows, 1, hq, d), **bf)
    cases = {
        "qkv": ((rand(rows, h), rand(h) + 1, rand((hq + 2 * hkv) * d, h), positions, positions,
                 torch.rand(d // 2, device=device), qkv_out, rand(rows, capacity, hkv, d),
                 rand(rows, capacity, hkv, d), 1e-5), {}, qkv_out),
    }
    o_out, down_out, mlp_out = (torch.empty((rows, h), **bf), torch.empty((rows, h), **bf),
                                torch.empty((rows, i), **bf))
    head_out = torch.empty((rows, v), dtype=torch.float32, device=device)
    cases["o_proj"] = ((rand(rows, hq * d), rand(h, hq * d), o_out), dict(residual=rand(rows, h)),
                       o_out)
    cases["mlp"] = ((rand(rows, h), rand(h) + 1, rand(i, h), rand(i, h), mlp_out, 1e-5), {},
                    mlp_out)
    cases["down"] = ((rand(rows, i), rand(h, i), down_out), dict(residual=rand(rows, h)),
                     down_out)
    cases["head"] = ((rand(rows, h), rand(v, h), head_out),
                     dict(norm_weight=rand(h) + 1, eps=1e-5), head_out)
    return cases


def time_launches(launch: Callable[[], None], device) -> float:
    """Median microseconds of one launch: LAUNCHES_PER_GRAPH launches in one graph, replayed."""
    def body():
        for _ in range(LAUNCHES_PER_GRAPH):
            launch()
    graph, _ = capture_graph(body, device)
    return time_median(graph.replay, device, 3, REPLAYS) * 1e6 / LAUNCHES_PER_GRAPH
