"""What a grid-wide barrier inside one persistent Triton kernel costs, against a kernel boundary.

A drafter step in fused kernels is some 25 launches, each a few microseconds of latency over
little data (BENCHMARKS.md, twelfth set). One persistent kernel that runs every phase of the
step, with the programs meeting at a barrier between phases, pays a barrier where the launches
paid a kernel boundary. This probe times both on random data:

  barrier    one launch of G programs running P phases; in each phase every program reads a
             value another program wrote in the phase before, adds one and writes it, then all
             meet at the barrier. At the end every value must equal P (a check that each
             phase saw the previous phase's writes).
  launches   the same P phases as P launches of one kernel, captured as a CUDA graph.

Median device time of 20 graph replays, divided by P. Writes JSON (--out).

    python3 bench/grid_sync_probe.py --out bench/results/grid-sync-probe.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from specpilot.bench.environment import environment
from specpilot.bench.step_costs import time_median
from specpilot.cli_common import positive_counts, positive_int
from specpilot.runtime.cuda_graphs import capture_graph
from specpilot.search.run_folder import write_json_atomic


@triton.jit
def _grid_sync(counter_ptr, target):
    # Every thread's writes are done (bar.sync) before one thread releases them at GPU scope;
    # its acquire then orders the other programs' writes before this program's later reads.
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _grid_exit(counter_ptr, exit_ptr, G):
    # The last program out resets both counters for the next launch: by then every program has
    # passed every barrier, so none still reads the barrier counter.
    done = tl.atomic_add(exit_ptr, 1, sem="acq_rel", scope="gpu")
    if done == G - 1:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(exit_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def _phases_kernel(buf_ptr, counter_ptr, exit_ptr, G, P, WIDTH: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, WIDTH)
    for p in range(P):
        src = buf_ptr + (p % 2) * G * WIDTH + ((pid + 1) % G) * WIDTH
        dst = buf_ptr + ((p + 1) % 2) * G * WIDTH + pid * WIDTH
        v = tl.load(src + offs, cache_modifier=".cg")
        tl.store(dst + offs, v + 1)
        _grid_sync(counter_ptr, (p + 1) * G)
    _grid_exit(counter_ptr, exit_ptr, G)


@triton.jit
def _one_phase_kernel(buf_ptr, G, p, WIDTH: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, WIDTH)
    src = buf_ptr + (p % 2) * G * WIDTH + ((pid + 1) % G) * WIDTH
    dst = buf_ptr + ((p + 1) % 2) * G * WIDTH + pid * WIDTH
    tl.store(dst + offs, tl.load(src + offs) + 1)


def _graph_time(fn, replays=20):
    """(a CUDA graph of `fn`, the median ms of its replays)."""
    device = torch.device("cuda")
    graph, _ = capture_graph(fn, device)
    return graph, time_median(graph.replay, device, 2, replays) * 1e3


def probe(programs: int, phases: int, width: int = 128) -> dict:
    dev = "cuda"
    buf = torch.zeros((2, programs, width), dtype=torch.int32, device=dev)
    counters = torch.zeros(2, dtype=torch.int32, device=dev)

    def persistent():
        buf.zero_()
        _phases_kernel[(programs,)](buf, counters[0:], counters[1:], programs, phases,
                                    WIDTH=width, num_warps=4)

    def launches():
        buf.zero_()
        for p in range(phases):
            _one_phase_kernel[(programs,)](buf, programs, p, WIDTH=width, num_warps=4)

    out = {"programs": programs, "phases": phases}
    for name, fn in (("barrier", persistent), ("launches", launches)):
        graph, ms = _graph_time(fn)
        graph.replay()
        torch.cuda.synchronize()
        final = buf[phases % 2]
        out[name] = {"ms": ms, "us_per_phase": 1000 * ms / phases,
                     "values_right": bool((final == phases).all().item())}
    out["counters_reset"] = bool((counters == 0).all().item())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=positive_counts, default=[16, 66, 132])
    ap.add_argument("--phases", type=positive_int, default=200)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("the probe captures CUDA graphs: it needs a GPU")
    rows = []
    for g in args.programs:
        row = probe(g, args.phases)
        print(json.dumps(row), flush=True)
        rows.append(row)
    write_json_atomic(Path(args.out), {"environment": environment("cuda"),
                                       "settings": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
