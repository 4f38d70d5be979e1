"""Where a decode step's time goes, on random-weight models of a shape preset pair.

For the torch backend in each fast-path mode (`--fast-ops`, default on a GPU: off, ops and
layers; runtime/fast_ops.py), at each batch size:
  fast_ops_mode         off (reference ops), ops (compiled op by op) or layers (compiled blocks)
  first_forward_s       wall time of the first eager AR forward (compilation included)
  kernels_per_forward   CUDA kernels one eager AR forward launches (torch.profiler)
  ar_step_gpu_s         one CUDA-graphed AR step, device time (CUDA events)
  ar_token_wall_s_*     wall time per decode token of graphed greedy decoding (host loop included):
                        the graphed runtime with chains of 0 at 1 and 4 rounds per replay
  prefill_wall_s        one eager prefill of the prompt
  round_gpu_s           one graphed chain(k) round, device time (and one of a static tree
                        (3, 2, 1) and of a dynamic tree of 8 nodes)
  round_wall_s          wall time per decode round of GraphedChainDecoder.generate
  compiled_graphs       (layers) graphs each compiled block holds after the row: more than
                        one per shape class would mean recompiles
so that "bound by kernel count", "bound by the host loop" and "bound by bytes" can be told apart.

  python3 bench/profile_decode.py --shapes zoo-gpu-small:zoo-gpu-small-drafter --out FILE.json
  python3 bench/profile_decode.py --fast-ops ops,layers --out FILE.json   # the two fast paths

Off a GPU it runs the same loops uncaptured, in float32 (useful only to check the script).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from specpilot.bench.environment import environment
from specpilot.bench.kernel_profile import kernel_profile
from specpilot.bench.shapes import parse_shapes, random_tensors
from specpilot.bench.step_costs import measure_round, time_median
from specpilot.cli_common import positive_counts
from specpilot.ir.topology import Chain, DynamicTree, Tree
from specpilot.runtime.cuda_graphs import GraphedStep
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.model import Transformer
from specpilot.runtime.steps import append_step
from specpilot.runtime.torch_backend import TorchBackend


MODES = ("off", "ops", "layers")


def build(preset, fast, seed: int, device: str, scale: float) -> Transformer:
    """A random-weight model of `preset`; `fast` is a TorchBackend fast_ops value (a mode of
    MODES, or a bool)."""
    config = preset.config(scale)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tensors = random_tensors(config, device, dtype, seed)
    return Transformer(config, tensors, dtype, device, backend=TorchBackend(fast_ops=fast),
                       fuse_projections=True, consume_tensors=True)


def ar_step_inputs(model, batch: int, context: int):
    """(cache, slots, mask) of one eager AR forward of `batch` tokens after `context` positions
    (the slots double as positions)."""
    cache = model.new_cache(batch, context + 2)
    slots = torch.full((batch, 1), context, device=model.device)
    mask = torch.arange(context + 2, device=model.device)[None, None, :] <= slots[:, :, None]
    return cache, slots, mask


def first_forward_s(model, batch: int, context: int) -> float:
    """Wall time of the model's first AR forward at this batch size (its compile, if any)."""
    cache, slots, mask = ar_step_inputs(model, batch, context)
    tokens = torch.zeros((batch, 1), dtype=torch.int64, device=model.device)
    return wall(lambda: model.forward(tokens, slots, slots, mask, cache))


def kernels_per_forward(model, batch: int, context: int):
    """CUDA kernels of one eager forward (None off a GPU)."""
    if model.device.type != "cuda":
        return None
    cache, slots, mask = ar_step_inputs(model, batch, context)
    tokens = torch.randint(0, model.config.vocab_size, (batch, 1), device=model.device)
    for _ in range(3):  # compile and warm up outside the profile
        model.forward(tokens, slots, slots, mask, cache)
    return kernel_profile(lambda: model.forward(tokens, slots, slots, mask, cache),
                          model.device)["kernels"]


def wall(fn) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def profile_one(target, drafter, batch: int, context: int, new: int, k: int) -> dict:
    dev = target.device
    graphs = dev.type == "cuda"
    out = {"batch": batch, "first_forward_s": first_forward_s(target, batch, context),
           "kernels_per_forward": kernels_per_forward(target, batch, context), "graphed": graphs}
    cache = target.new_cache(batch, context + 2)
    step = GraphedStep(target, cache, width=1, capture=graphs)
    step.positions.fill_(context)
    step.slots.fill_(context)
    step.mask.copy_(torch.arange(context + 2, device=dev)[None, None, :] <= context)
    out["ar_step_gpu_s"] = time_median(step.replay, target.device, 5, 20)
    del step, cache
    gen = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, target.config.vocab_size, (context,), generator=gen).tolist()
               for _ in range(batch)]
    zeros = torch.zeros(batch, dtype=torch.int64, device=dev)
    pre_cache = target.new_cache(batch, context + 1)
    append_step(target, pre_cache, zeros, prompts)
    out["prefill_wall_s"] = wall(lambda: append_step(target, pre_cache, zeros, prompts))
    del pre_cache
    # The graphed runtime with chains of 0 (what strong_ar runs), one and four rounds a replay.
    # Per token and per round: the difference of a long and a short run, so the prefill (a
    # graph there, eager above) cancels out.
    short = max(1, new // 2)
    for per in (1, 4):
        plain = GraphedChainDecoder(target, None, batch, context + new + 1, 0, capture=graphs,
                                    rounds_per_replay=per)
        plain.generate(prompts, short)              # captures its graphs, untimed
        seconds = (wall(lambda: plain.generate(prompts, new))
                   - wall(lambda: plain.generate(prompts, short)))
        out[f"ar_token_wall_s_{per}_per_replay"] = seconds / (new - short)
        del plain
    out["round_gpu_s"] = measure_round(target, drafter, batch, Chain(k), context, graphs, 5, 20)
    for topology in (Tree((3, 2, 1)), DynamicTree(budget=8, depth=4, width=2)):
        out[f"round_gpu_s {topology}"] = measure_round(target, drafter, batch, topology, context,
                                                       graphs, 5, 20)
    decoder = GraphedChainDecoder(target, drafter, batch, context + new + 2 * k + 2, k,
                                  capture=graphs)
    decoder.generate(prompts, short)                # captures its graphs, untimed
    runs = {}
    seconds = {n: wall(lambda n=n: runs.__setitem__(n, decoder.generate(prompts, n)))
               for n in (short, new)}
    rounds = runs[new].target_forwards - runs[short].target_forwards
    out["round_wall_s"] = (seconds[new] - seconds[short]) / max(rounds, 1)
    out["rounds"] = runs[new].target_forwards - 1
    for role, model in (("target", target), ("drafter", drafter)):
        if model._blocks is not None:
            out.setdefault("compiled_graphs", {})[role] = model._blocks.graphs()
    return out


def modes(arg, device: str):
    """The fast-path modes to profile: `arg` (comma-separated), by default all three on a GPU
    and "off" elsewhere (there the compiled paths would time CPU code)."""
    if arg is None:
        return list(MODES) if device == "cuda" else ["off"]
    chosen = [m.strip() for m in arg.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODES]
    if unknown or not chosen:
        raise SystemExit(f"--fast-ops: choose from {', '.join(MODES)} (got {arg!r})")
    return chosen


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="zoo-gpu-small:zoo-gpu-small-drafter")
    p.add_argument("--batch-sizes", type=positive_counts, default=[1, 16])
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--scale", type=float, default=1.0, help="shrink every width (quick runs)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--fast-ops", default=None,
                   help=f"comma-separated modes of {', '.join(MODES)} (default: all three on a "
                        "GPU, off elsewhere)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    target_preset, drafter_preset = parse_shapes(args.shapes)
    doc = {"environment": environment(args.device, None), "settings": vars(args), "rows": []}
    for mode in modes(args.fast_ops, args.device):
        target = build(target_preset, mode, 1, args.device, args.scale)
        drafter = build(drafter_preset, mode, 2, args.device, args.scale)
        for b in args.batch_sizes:
            # fast_ops stays a bool (any fast path) for readers of earlier files.
            row = dict(fast_ops=mode != "off", fast_ops_mode=target.backend.fast_ops_mode,
                       **profile_one(target, drafter, b, args.context, args.new_tokens, args.k))
            print(json.dumps(row), flush=True)
            doc["rows"].append(row)
            with open(args.out, "w") as f:
                json.dump(doc, f, indent=1)
        del target, drafter
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
