"""Is a chain round dearer in the adaptive and refill decoders than in the plain chain decoder,
and what does the refill loop add to each replay?

`bench/round_breakdown.py` timed each decoder's round once, one decoder after another, and
found the adaptive and refill rounds some 0.1 ms dearer than the fixed chain's at batch 16
(BENCHMARKS.md, sets 23 and 24), though their eager rounds launch only 3 and 9 kernels more.
Here the same chain(k) round (random weights, drafter in fused kernels, every row active after
the same context, the same cache capacity) is captured in each decoder and timed in blocks,
the decoders' order rotated from block to block, so that drift in the machine falls on all
alike:

  chain          GraphedChainDecoder, fixed length k
  adaptive       the same with adaptive lengths (its length update in the round)
  refill         GraphedRefillDecoder, its prefill beside the round (the default)
  refill_ahead   the same, its prefill placed ahead
  refill_loop    the refill's replay as its host loop queues it: the replay, then the row
                 flags copied to pinned host memory (and, adaptive, the next length) and an
                 event recorded (runtime/graphed_refill.py)
  <name>_fused   chain, adaptive and refill with the round's end in one generated kernel
                 (accept_kernels "fused", the chain_commit family); adaptive_fused updates its
                 length in one more (the length_policy family)
  adaptive_fused_compiled  the same with the length's update compiled by Inductor (as it ran
                 before the length_policy kernel)
  adaptive_depth_fused, adaptive_depth_fused_compiled  the two with the per-depth estimate
  <name>_fused_folded  the same with the drafter's o_proj and down_proj folded into its
                 attention and MLP kernels (FusedForward(fold=True), three launches a layer);
                 the others' drafter is unfolded (fold=False) whatever the default

Per decoder: the median of the blocks' medians (device ms a replay, CUDA events) and each
block's, and the kernels of one eager round (count, device µs, the costliest names).

  python3 bench/round_variants.py --batch-sizes 16 --out bench/results/round-variants.json
  python3 bench/round_variants.py --variants refill,refill_fused --out ...

Off a GPU it runs uncaptured in float32 with Triton's interpreter, without kernel lists (to
check the script).
"""
from __future__ import annotations

import argparse
import os
import statistics
from typing import Callable, Dict, List

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from specpilot.cli_common import positive_int  # noqa: E402
from specpilot.bench.decode_models import (add_model_arguments, decode_models,  # noqa: E402
                                           mid_run_context)
from specpilot.bench.decoder_race import add_race_arguments  # noqa: E402
from specpilot.bench.kernel_profile import kernel_profile  # noqa: E402
from specpilot.bench.script_rows import measure_rows  # noqa: E402
from specpilot.bench.step_costs import time_median  # noqa: E402
from specpilot.ir.errors import SpecPilotError  # noqa: E402
from specpilot.runtime.fused_forward import FusedForward, fused_specs  # noqa: E402
from specpilot.runtime.graphed_chain import GraphedChainDecoder  # noqa: E402
from specpilot.runtime.graphed_refill import GraphedRefillDecoder  # noqa: E402

WARMUP = 5
VARIANTS = ("chain", "chain_fused", "adaptive", "adaptive_fused", "adaptive_fused_compiled",
            "adaptive_depth_fused", "adaptive_depth_fused_compiled", "refill", "refill_fused",
            "refill_ahead", "refill_loop", "chain_fused_folded", "refill_fused_folded")
FUSED = "_fused"
FOLDED = "_folded"
COMPILED = "_compiled"


def build(name: str, target, drafters, batch: int, capacity: int, k: int, graphs: bool):
    """The decoder whose round variant `name` times (refill_loop: the refill's own); drafters:
    {False: the unfolded FusedForward, True: the folded one}."""
    folded = name.endswith(FOLDED)
    fused = drafters[folded]
    name = name[:-len(FOLDED)] if folded else name
    compiled = name.endswith(COMPILED)
    name = name[:-len(COMPILED)] if compiled else name
    accept = "fused" if name.endswith(FUSED) else "ops"
    base = name[:-len(FUSED)] if name.endswith(FUSED) else name
    if base == "chain":
        return GraphedChainDecoder(target, fused, batch, capacity, k, capture=graphs,
                                   accept_kernels=accept)
    if base in ("adaptive", "adaptive_depth"):
        # Fixed costs of the lengths 0..k in plain steps: the adaptive decoder measures nothing.
        return GraphedChainDecoder(target, fused, batch, capacity, k, capture=graphs,
                                   adaptive=True, round_costs=[1.0 + 0.3 * n for n in range(k + 1)],
                                   accept_kernels=accept,
                                   length_kernel=not compiled,
                                   length_estimator=("per_depth" if base == "adaptive_depth"
                                                     else "geometric"))
    placement = "ahead" if base == "refill_ahead" else "beside"
    return GraphedRefillDecoder(target, fused, batch, capacity, k, capture=graphs,
                                prefill_placement=placement, accept_kernels=accept)


def variant_names(text: str) -> tuple:
    """--variants: a comma list of VARIANTS (refill_loop needs refill)."""
    names = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown variants {unknown} (known: "
                                         f"{', '.join(VARIANTS)})" if unknown else "no variants")
    if "refill_loop" in names and "refill" not in names:
        raise argparse.ArgumentTypeError("refill_loop times the refill's replay: add refill")
    # refill before refill_loop, whatever the order given
    return tuple(v for v in VARIANTS if v in names)


def loop_replay(dec: GraphedRefillDecoder, replay: Callable[[], None]) -> Callable[[], None]:
    """`replay` followed by what the refill's host loop queues after each replay: the row
    flags' copy to pinned memory and the event the host waits on (ring slot 0 every time)."""
    cuda = dec.device.type == "cuda"

    def run():
        replay()
        dec.host_active[0].copy_(dec.active, non_blocking=cuda)
        if cuda:
            dec.ring_events[0].record()
    return run


def one_batch(args, target, drafters, batch: int, graphs: bool) -> dict:
    k, context = args.k, mid_run_context([[0] * args.prompt_len] * batch, args.new_tokens)
    per_block = args.replays
    # Room for every replay a decoder runs from the context: the blocks', their warm-ups, the
    # capture's own runs and the eager kernel listing.
    capacity = context + (args.blocks * (per_block + WARMUP) + 16) * (k + 1)
    decoders, replays = {}, {}
    variants = args.variants
    for name in variants:
        if name == "refill_loop":
            decoders[name] = decoders["refill"]
            replays[name] = loop_replay(decoders[name], replays["refill"])
            continue
        dec = decoders[name] = build(name, target, drafters, batch, capacity, k, graphs)
        replays[name] = dec.timing_round(context)
    blocks: Dict[str, List[float]] = {name: [] for name in variants}
    warm, timed = (WARMUP, per_block) if graphs else (0, 1)
    for block in range(args.blocks):
        shift = block % len(variants)
        for name in variants[shift:] + variants[:shift]:
            decoders[name].reset_all_active(context)
            blocks[name].append(time_median(replays[name], decoders[name].device, warm,
                                            timed) * 1e3)
    kernels = {}
    for name, dec in decoders.items():
        if name == "refill_loop":           # the refill's own round; its copy is no kernel
            continue
        dec.reset_all_active(context)
        dec._round(k)                           # warm: compiled ops, allocator
        dec.reset_all_active(context)
        kernels[name] = kernel_profile(lambda: dec._round(k), dec.device)
    return {"batch": batch, "k": k, "context": context, "capacity": capacity,
            "round_ms": {name: statistics.median(ms) for name, ms in blocks.items()},
            "blocks_ms": blocks, "kernels": kernels}


def report(row: dict) -> str:
    ms = row["round_ms"]
    first = next(iter(ms))
    parts = [f"{name} {v:.3f} ({v / ms[first]:.3f}x)" for name, v in ms.items()]
    lines = [f"batch {row['batch']}, chain({row['k']}) round, ms (x {first}): " + ", ".join(parts)]
    for name, prof in row["kernels"].items():
        if prof:
            lines.append(f"  {name}: {prof['kernels']} kernels, {prof['kernel_us']:.1f} us")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_race_arguments(ap, calls=None)      # rounds are timed after prompt + new tokens / 2
    ap.add_argument("--blocks", type=positive_int, default=8,
                    help="blocks of replays per decoder, the decoders' order rotated each block")
    ap.add_argument("--replays", type=positive_int, default=20, help="timed replays a block")
    ap.add_argument("--attention-splits", type=positive_int, default=None,
                    help="the most programs that share one of the fused drafter's attention "
                         "walks; each launch takes the largest power of two up to it whose "
                         "programs fit (default: codegen/fused_layer.py's ATTENTION_SPLITS)")
    ap.add_argument("--variants", type=variant_names, default=VARIANTS,
                    help=f"comma list of the rounds to race (default all: {','.join(VARIANTS)})")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.pair:
        ap.error("--pair: a round's cost does not depend on what it accepts; random weights")
    try:
        target, drafter, _, _, graphs = decode_models(args, 1)
        drafters = {}
        for fold in (False, True):
            specs = None
            if args.attention_splits is not None:
                specs = {"attention": fused_specs(drafter, fold)["attention"].with_params(
                    SPLITS=args.attention_splits)}
            drafters[fold] = FusedForward(drafter, specs=specs, fold=fold)
    except SpecPilotError as exc:
        ap.error(str(exc))
    measure_rows(args.batch_sizes, lambda b: one_batch(args, target, drafters, b, graphs), report,
                 args.out, target.device.type, vars(args), "batches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
