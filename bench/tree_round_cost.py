"""What a static tree's round costs against a chain's, and what its acceptance walk and cache
compaction add: each tree's graphed round as it runs now (the walk over every depth at once,
`graphed_tree.walk_tree`; compaction one gather and scatter over the stacked layers,
`KVCache.move_slots`) and as it ran before (the `before` variant, `as_before`: the
depth-by-depth walk, `graphed_dynamic.walk_per_row`, and one copy per layer's K and V), at each
batch size.

Per (batch, topology, variant): the median device time of one captured round (CUDA events)
and the kernels an eager round launches (count and summed device time). Random weights by
default: a round runs fixed shapes whatever it accepts.

  python3 bench/tree_round_cost.py --out bench/results/tree-round-cost.json

Off a GPU it runs uncaptured in float32 on scaled-down shapes, without kernel lists (to check
the script).
"""
from __future__ import annotations

import argparse

import torch

from specpilot.bench.decode_models import add_model_arguments, decode_models
from specpilot.bench.kernel_profile import kernel_profile
from specpilot.bench.script_rows import measure_rows
from specpilot.bench.step_costs import measure_round, round_timing_capacity, topology_from_key
from specpilot.cli_common import positive_counts, positive_int
from specpilot.ir import Chain
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.graphed_dynamic import walk_per_row
from specpilot.runtime.graphed_program import graphed_decoder

TOPOLOGIES = ("chain(4);sparse_tree([[0], [1], [0, 0], [0, 0, 0], [0, 0, 0, 0]]);"
              "tree([2, 2, 1]);tree([4, 4]);tree([4, 3, 2, 1])")
WARMUP, REPEATS = 5, 20


def as_before(decoder) -> None:
    """`decoder`'s round as it ran before the one-pass walk and the stacked compaction: the
    walk depth by depth, and compaction layer by layer (caches without their stacked
    buffers). Set before the round is captured."""
    parent_row = decoder.walk_tables.parent_row
    decoder._walk = lambda nodes, g, _=None: walk_per_row(
        nodes, parent_row.expand_as(nodes), g, decoder.k)
    for cache in (decoder.tcache, decoder.dcache):
        cache.stacked_k = cache.stacked_v = None


def round_cost(target, drafter, batch: int, topology, context: int, graphs: bool,
               before: bool) -> dict:
    prepare = as_before if before else None
    capacity = round_timing_capacity(context, topology, WARMUP, REPEATS)
    # Kept with the row: the masked attention walks every slot, so the slot count is part of
    # what a round costs (and an odd count looked dearer: BENCHMARKS.md, eighteenth set).
    out = {"cache_slots": capacity,
           "round_ms": 1e3 * measure_round(target, drafter, batch, topology, context, graphs,
                                           WARMUP, REPEATS, prepare)}
    if graphs:      # the same round eager: the kernels it launches
        torch.cuda.empty_cache()
        decoder = graphed_decoder(target, drafter, batch, capacity, topology, capture=False)
        if prepare is not None:
            prepare(decoder)
        replay = decoder.timing_round(context)
        replay()
        out["kernel_profile"] = kernel_profile(replay, target.device)
        del decoder, replay
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    ap.add_argument("--batch-sizes", type=positive_counts, default=[1, 4, 16, 64])
    ap.add_argument("--topologies", default=TOPOLOGIES, help="';'-separated, as keys print them")
    ap.add_argument("--context", type=positive_int, default=192,
                    help="cache positions before the timed rounds (a call's halfway point)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    topologies = [topology_from_key(t.strip()) for t in args.topologies.split(";")]
    if any(t is None for t in topologies):
        ap.error(f"--topologies: not a static chain or tree in {args.topologies!r}")
    try:
        target, drafter, _, _, graphs = decode_models(args, 1)
    except SpecPilotError as exc:
        ap.error(str(exc))
    # A chain's round has no walk or compaction: it is the reference, timed once.
    cases = [(b, topology, before) for b in args.batch_sizes for topology in topologies
             for before in ((False,) if isinstance(topology, Chain) else (False, True))]

    def row(case) -> dict:
        b, topology, before = case
        return {"batch": b, "topology": str(topology), "nodes": topology.num_nodes,
                "depth": topology.depth, "variant": "before" if before else "now",
                **round_cost(target, drafter, b, topology, args.context, graphs, before)}

    def report(row: dict) -> str:
        kernels = row.get("kernel_profile", {}).get("kernels", "-")
        return (f"batch {row['batch']:3d} {row['topology']:58s} {row['variant']:6s} "
                f"{row['round_ms']:.3f} ms, {kernels} kernels")

    measure_rows(cases, row, report, args.out, target.device.type, vars(args), "rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
