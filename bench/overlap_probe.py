"""Whether a round's drafting and verification could overlap on the GPU: the target's forward
of k + 1 tokens a request and the drafter's k steps (fused kernels, as the speculative systems
run it), each captured alone as a CUDA graph, timed alone, one after the other on one stream,
and side by side on two streams.

At the zoo pair's shapes a step is bound by its kernels' latency, not by the GPU's bandwidth
or compute (BENCHMARKS.md, twelfth set), so two independent graphs on two streams may take
little more than the longer one. If they do, a decoder that drafts the next round while the
target verifies this one would hide the drafter's steps where the round is fully accepted;
if they do not, that design gains nothing here. The two graphs work on separate caches and
inputs (no data passes between them): this times the overlap, not a decoder.

  python3 bench/overlap_probe.py --out bench/results/overlap-probe.json
  python3 bench/overlap_probe.py --batch-sizes 16 --k 4 --out FILE

Random weights (a piece's cost does not depend on its values). Off a GPU it runs eagerly in
float32 with Triton's interpreter at --scale, one repeat (a check of the script); the figures
mean nothing there.
"""
from __future__ import annotations

import argparse
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from specpilot.bench.decode_models import add_model_arguments, decode_models  # noqa: E402
from specpilot.bench.script_rows import measure_rows  # noqa: E402
from specpilot.bench.step_costs import forward_step, time_median  # noqa: E402
from specpilot.cli_common import positive_counts, positive_int  # noqa: E402
from specpilot.ir.errors import SpecPilotError  # noqa: E402
from specpilot.runtime.fused_forward import FusedForward  # noqa: E402
from specpilot.runtime.graphed_program import rounded_capacity  # noqa: E402


def probe(target, drafter, batch: int, k: int, context: int, graphs: bool, warmup: int,
          repeats: int) -> dict:
    """Median ms of: the verification alone, the k drafter steps alone, both on one stream,
    both on two streams; and what the two streams save against one."""
    verify = forward_step(target, target.new_cache(batch, rounded_capacity(context + k + 1)),
                          context, k + 1, None, graphs)
    draft_step = forward_step(drafter, drafter.new_cache(batch, rounded_capacity(context + 1)),
                              context, 1, None, graphs)
    cuda = target.device.type == "cuda"

    def draft():
        for _ in range(k):
            draft_step.replay()

    def one_stream():
        verify.replay()
        draft()

    if cuda:
        side = [torch.cuda.Stream(device=target.device) for _ in range(2)]

        def two_streams():
            here = torch.cuda.current_stream(target.device)
            for stream, piece in zip(side, (verify.replay, draft)):
                stream.wait_stream(here)
                with torch.cuda.stream(stream):
                    piece()
            for stream in side:
                here.wait_stream(stream)
    else:
        two_streams = one_stream                   # no streams off a GPU: the script's check

    dev = target.device
    ms = {name: time_median(fn, dev, warmup, repeats) * 1e3 for name, fn in (
        ("verify", verify.replay), ("draft", draft), ("one_stream", one_stream),
        ("two_streams", two_streams))}
    longer = max(ms["verify"], ms["draft"])
    return {"batch": batch, "k": k, "context": context, "ms": ms,
            "saved_ms": ms["one_stream"] - ms["two_streams"],
            "two_streams_over_longer": ms["two_streams"] / longer,
            "draft_hidden": (ms["one_stream"] - ms["two_streams"]) / ms["draft"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    ap.add_argument("--batch-sizes", type=positive_counts, default=[4, 16, 64])
    ap.add_argument("--k", type=positive_int, default=4, help="drafts a round")
    ap.add_argument("--context", type=positive_int, default=192,
                    help="positions already in the caches")
    ap.add_argument("--repeats", type=positive_int, default=40)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        target, drafter, _, _, graphs = decode_models(args, 1)
        fused = FusedForward(drafter)
    except SpecPilotError as exc:
        ap.error(str(exc))
    warmup, repeats = (5, args.repeats) if graphs else (0, 1)

    def report(row: dict) -> str:
        ms = row["ms"]
        return (f"batch {row['batch']}: verify {ms['verify']:.3f} ms, draft ({args.k} steps) "
                f"{ms['draft']:.3f}, one stream {ms['one_stream']:.3f}, two streams "
                f"{ms['two_streams']:.3f} ({row['draft_hidden']:.0%} of the draft hidden)")

    measure_rows(args.batch_sizes,
                 lambda b: probe(target, fused, b, args.k, args.context, graphs, warmup, repeats),
                 report, args.out, target.device.type, vars(args), "batches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
