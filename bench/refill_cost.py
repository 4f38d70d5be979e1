"""What a refill costs in the graphed runtime, and what continuous refill gains over the padded
loop when requests end at different lengths.

Two measurements on random-weight shape presets (no trained pair needed; the default is the zoo
pair's shapes):
  prefill  one newcomer's prefill into one row of a running batch's caches, both models:
           eagerly into a one-row view of the caches (how refill first did it) against the
           bucketed one-row graph of runtime/row_prefill.py; median ms per refill over prompts
           of HumanEval-like lengths, with a padded plain step's time for scale;
  decode   plain greedy AR over many prompts, each with its own new-token limit (drawn
           uniformly, as requests that stop at different lengths), in padded batches against
           continuous refill (runtime/graphed_refill.py): tokens/s, x padded, target forwards.

  python3 bench/refill_cost.py --out bench/results/refill-cost.json
Off a GPU it runs the same code uncaptured in float32 (to check the script, with --scale).
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from specpilot.bench.decode_models import decoder_capacity
from specpilot.bench.environment import environment
from specpilot.bench.shapes import random_pair
from specpilot.cli_common import positive_counts
from specpilot.bench.step_costs import time_median
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from specpilot.runtime.row_prefill import RowPrefill
from specpilot.runtime.steps import append_step
from specpilot.search.run_folder import write_json_atomic


def clock(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` calls after one untimed call, by the host clock
    between synchronizes (a refill's cost is host work as well as the device's)."""
    return time_median(fn, device, 1, repeats, host_bound=True)


def eager_row_prefill(models, row: int, prompt):
    """The first refill's prefill: an eager forward of each model into a one-row view."""
    zero = torch.zeros(1, dtype=torch.int64, device=models[0][0].device)
    for model, cache in models:
        append_step(model, cache.view(rows=slice(row, row + 1)), zero, [list(prompt)])


def prefill_rows(target, drafter, prompts, batch: int, capacity: int, steps: int,
                 graphs: bool, repeats: int) -> dict:
    caches = [(model, model.new_cache(batch, capacity)) for model in (target, drafter)]
    graphed = RowPrefill(caches, capacity, graphs)
    graphed.prepare([len(p) for p in prompts])
    eager_ms, graph_ms = [], []
    for i, prompt in enumerate(prompts):
        row = i % batch
        eager_ms.append(1e3 * clock(lambda: eager_row_prefill(caches, row, prompt),
                                    target.device, repeats))
        graph_ms.append(1e3 * clock(lambda: graphed.run(row, prompt), target.device, repeats))
    plain = GraphedChainDecoder(target, None, batch, capacity, 0, capture=graphs)
    step_ms = 1e3 * clock(lambda: plain.generate(prompts[:batch], steps), target.device,
                          repeats) / steps
    return {"batch": batch, "prompts": len(prompts), "eager_ms": statistics.median(eager_ms),
            "graph_ms": statistics.median(graph_ms), "plain_step_ms": step_ms}


def decode_rows(target, prompts, limits, batch: int, capacity: int, graphs: bool,
                repeats: int) -> list:
    padded = GraphedChainDecoder(target, None, batch, capacity, 0, capture=graphs)
    refill = GraphedRefillDecoder(target, None, batch, capacity, 0, capture=graphs)
    for dec in (padded, refill):
        dec.prepare_prefill(prompts)
    out = {}

    def run_padded():
        out["padded"] = [padded.generate(prompts[i:i + batch], limits[i:i + batch])
                         for i in range(0, len(prompts), batch)]

    def run_refill():
        out["refill"] = [refill.generate(prompts, limits)]

    rows = []
    for name, fn in (("padded", run_padded), ("refill", run_refill)):
        seconds = clock(fn, target.device, repeats)
        results = out[name]
        tokens = sum(len(t) for r in results for t in r.tokens)
        rows.append({"batch": batch, "system": f"plain AR, {name}", "seconds": seconds,
                     "tokens": tokens, "tokens_per_s": tokens / seconds,
                     "target_forwards": sum(r.target_forwards for r in results),
                     "refills": sum(r.stats.get("refills", 0) for r in results)})
    # bf16 random weights have many near-ties, so prefill widths may flip a token: counted.
    same = sum(a == b for a, b in zip([t for r in out["padded"] for t in r.tokens],
                                      out["refill"][0].tokens))
    for row in rows:
        row["requests_equal_to_padded"] = same
        row["x_padded"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="zoo-gpu-small:zoo-gpu-small-drafter")
    ap.add_argument("--batch-sizes", type=positive_counts, default=[4, 16])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt-lengths", default="60,200", help="min,max prompt tokens")
    ap.add_argument("--new-tokens", default="16,256", help="min,max new-token limit")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    target, drafter, graphs = random_pair(args.shapes, args.scale)
    gen = torch.Generator().manual_seed(0)
    lo, hi = (int(x) for x in args.prompt_lengths.split(","))
    new_lo, new_hi = (int(x) for x in args.new_tokens.split(","))
    vocab = target.config.vocab_size
    prompts = [torch.randint(0, vocab, (int(n),), generator=gen).tolist()
               for n in torch.randint(lo, hi + 1, (args.requests,), generator=gen)]
    limits = [int(n) for n in torch.randint(new_lo, new_hi + 1, (args.requests,), generator=gen)]
    capacity = decoder_capacity(prompts, new_hi, 0)       # plain AR's, as a decode sizes it
    prefill, decode = [], []
    for batch in args.batch_sizes:
        prefill.append(prefill_rows(target, drafter, prompts[:16], batch, capacity, new_hi,
                                    graphs, args.repeats))
        p = prefill[-1]
        print(f"batch {batch:3d} prefill of one row: eager {p['eager_ms']:.2f} ms, graph "
              f"{p['graph_ms']:.2f} ms (a padded plain step {p['plain_step_ms']:.2f} ms)",
              flush=True)
        for row in decode_rows(target, prompts, limits, batch, capacity, graphs, args.repeats):
            decode.append(row)
            print(f"batch {batch:3d} {row['system']:18s} {row['tokens_per_s']:10.1f} tok/s "
                  f"{row['x_padded']:5.2f}x padded, {row['target_forwards']} target forwards, "
                  f"{row['refills']} refills", flush=True)
    doc = {"environment": environment(target.device.type), "settings": vars(args),
           "prefill": prefill, "decode": decode}
    write_json_atomic(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
