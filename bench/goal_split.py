"""Split each pair's batch-16 goal ratio (a mechanism row's tokens/s over the stock Program's)
into what the pair decides and what the decoder decides.

For two rows of one `specpilot bench` file at one batch size, over the same requests:

  row ÷ stock = (stock's target forwards ÷ row's) × (stock's seconds a forward ÷ row's)

The first factor is mostly the pair's: how many rounds the padded batches run past their
requests' own (they wait for the slowest request) against the refilled row's, whose own drain
(the batch emptying once the queue is) is in it too. The second is the
decoder's: the price of one of the row's forwards (a round, or a prefill, with admissions
spread over them) against one of the stock Program's. Tokens/s are compared as the bench gives
them (each row's own new tokens), so the product is the bench's ratio where both rows made as
many tokens (up to how the medians of its timed runs round), and times the token counts' ratio,
reported, where they did not (a padded batch can run a request past the reference's end at a
near-tie on its first token).

  python3 bench/goal_split.py bench/results/mechanisms-run54-b16.json [more files]
      [--batch 16] [--system mech:graphed_refill_fused] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specpilot.bench.measure import measured_row
from specpilot.cli_common import positive_int
from specpilot.search.run_folder import write_json_atomic

STOCK = "stock_graphed"
ROW = "mech:graphed_refill_fused"


def split(bench: dict, system: str, batch: int) -> dict:
    """The factors of `system`'s tokens/s over the stock Program's at `batch` (module doc)."""
    rows = bench["rows"]
    stock, row = measured_row(rows, STOCK, batch), measured_row(rows, system, batch)
    for r in (stock, row):
        if not r.get("target_forwards"):
            raise ValueError(f"{r['system']} at batch {batch} counts no target forwards")
    forwards = stock["target_forwards"] / row["target_forwards"]
    stock_ms = stock["seconds"]["median"] / stock["target_forwards"] * 1000
    row_ms = row["seconds"]["median"] / row["target_forwards"] * 1000
    tokens = row["new_tokens"] / stock["new_tokens"]
    return {"system": system, "batch": batch,
            "stock_forwards": stock["target_forwards"], "row_forwards": row["target_forwards"],
            "forwards_ratio": forwards, "stock_ms_per_forward": stock_ms,
            "row_ms_per_forward": row_ms, "price_ratio": stock_ms / row_ms,
            "tokens_ratio": tokens,
            "row_x_stock": row["tokens_per_s"]["median"] / stock["tokens_per_s"]["median"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench", nargs="+", help="`specpilot bench` results (JSON)")
    ap.add_argument("--system", default=ROW, help=f"the row against the stock Program ({ROW})")
    ap.add_argument("--batch", type=positive_int, default=16)
    ap.add_argument("--out", help="write the figures here as JSON too")
    args = ap.parse_args(argv)
    results = []
    for path in args.bench:
        try:
            r = split(json.loads(Path(path).read_text()), args.system, args.batch)
        except (OSError, ValueError, KeyError) as exc:
            ap.error(f"{path}: {exc}")
        results.append({"file": path, **r})
        print(f"{Path(path).name}: forwards {r['stock_forwards']} / {r['row_forwards']} = "
              f"{r['forwards_ratio']:.3f}; ms a forward {r['stock_ms_per_forward']:.3f} / "
              f"{r['row_ms_per_forward']:.3f} = {r['price_ratio']:.3f}; tokens "
              f"{r['tokens_ratio']:.3f}; {args.system} = {r['row_x_stock']:.3f}x stock")
    if args.out:
        write_json_atomic(Path(args.out), {"settings": vars(args), "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
