"""The graphed adaptive draft length at its two extremes: a drafter that is never right and one
that is always right, against plain graphed AR and the fixed chain, at several batch sizes.

The batch-length rule (runtime/batch_length.py) promises that speculation never loses much to
plain decoding: a batch that plain steps would finish sooner turns speculation off. The two
drafters bracket every real pair:
  useless  random weights of the drafter's shape: next to nothing is accepted, so the rule must
           turn speculation off and land near plain AR (never far below it);
  perfect  the target itself as its own drafter: every draft is accepted, so the rule must keep
           the longest chain and land near the fixed chain.
Models are random-weight shape presets (no trained pair needed); prompts are random token ids;
no request stops early. Rows: tokens/s (median of --repeats after one warm-up), x plain AR,
the rounds run at each chain length (0: plain steps, after the batch turned speculation off).
"adaptive+refill" is the continuous-refill decoder given one batch of prompts (no queue): it
must run as the padded adaptive decoder does, started off by its workload memory alike.

  python3 bench/adaptive_extremes.py --out bench/results/adaptive-extremes.json
Off a GPU it runs the same loops uncaptured in float32 (to check the script, with --scale).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from specpilot.bench.decode_models import decoder_capacity
from specpilot.bench.environment import environment
from specpilot.bench.shapes import random_pair
from specpilot.cli_common import positive_counts
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from specpilot.search.run_folder import write_json_atomic

SYSTEMS = ("plain AR", "chain", "adaptive", "adaptive+refill")
DRAFTERS = ("useless", "perfect")


def decoder(system: str, target, drafter, batch: int, capacity: int, k: int, graphs: bool):
    if system == "plain AR":
        return GraphedChainDecoder(target, None, batch, capacity, 0, capture=graphs)
    if system == "adaptive+refill":
        return GraphedRefillDecoder(target, drafter, batch, capacity, k, capture=graphs,
                                    adaptive=True)
    return GraphedChainDecoder(target, drafter, batch, capacity, k, capture=graphs,
                               adaptive=system == "adaptive")


def timed(dec, prompts, new: int, repeats: int):
    """(median tokens/s, the last run's result) after one untimed run."""
    dec.generate(prompts, new)
    rates, result = [], None
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = dec.generate(prompts, new)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        rates.append(sum(len(t) for t in result.tokens) / (time.perf_counter() - start))
    return statistics.median(rates), result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="zoo-gpu-small:zoo-gpu-small-drafter")
    ap.add_argument("--batch-sizes", type=positive_counts, default=[1, 16, 64])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--systems", default=",".join(SYSTEMS[1:]),
                    help="speculative systems, comma-separated (plain AR always runs): "
                         + ", ".join(SYSTEMS[1:]))
    ap.add_argument("--drafters", default=",".join(DRAFTERS), help=", ".join(DRAFTERS))
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    systems, names = args.systems.split(","), args.drafters.split(",")
    for given, known, what in ((systems, SYSTEMS[1:], "system"), (names, DRAFTERS, "drafter")):
        unknown = [x for x in given if x not in known]
        if unknown:
            ap.error(f"unknown {what} {', '.join(unknown)}: choose from {', '.join(known)}")

    target, useless, graphs = random_pair(args.shapes, args.scale)
    drafters = {name: {"useless": useless, "perfect": target}[name] for name in names}
    gen = torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    rows = []
    for batch in args.batch_sizes:
        prompts = torch.randint(0, vocab, (batch, args.prompt_len), generator=gen).tolist()
        capacity = decoder_capacity(prompts, args.new_tokens, args.k)    # as every decoder's
        # One plain AR row per batch size, then each speculative system with each drafter.
        runs = [("plain AR", "-", None)] + [(system, name, drafter) for name, drafter in
                                            drafters.items() for system in systems]
        plain = None
        for system, name, drafter in runs:
            dec = decoder(system, target, drafter, batch, capacity, args.k, graphs)
            rate, result = timed(dec, prompts, args.new_tokens, args.repeats)
            plain = plain or rate
            row = {"batch": batch, "drafter": name, "system": system, "tokens_per_s": rate,
                   "x_plain_ar": rate / plain, "rounds": dict(result.stats),
                   "target_forwards": result.target_forwards}
            rows.append(row)
            print(f"batch {batch:3d} {name:8s} {system:15s} {rate:10.1f} tok/s "
                  f"{rate / plain:5.2f}x plain AR  rounds {row['rounds']}", flush=True)
            del dec
    doc = {"environment": environment(target.device.type), "settings": vars(args), "rows": rows}
    write_json_atomic(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
