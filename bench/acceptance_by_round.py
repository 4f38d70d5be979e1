"""How agreement changes along a request: for stored chain(k) profiles, the mean drafts accepted
per round and the share of rounds with a rejection, by the round's index within its request
(rounds 1-4, 5-8, 9-16, 17-32, 33-64, 65 on). The batch-length rule judges its turn-off on a
request's first rounds (runtime/batch_length.OFF_AFTER_ROUNDS), so whether those are typical
matters. Runs on the CPU from the profiles alone.

  python3 bench/acceptance_by_round.py \\
      --profiles bench/results/mechanisms-run9-refill.acceptance.stock_graphed.json \\
      --out bench/results/acceptance-by-round.json
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Sequence

from specpilot.bench.environment import environment
from specpilot.bench.replay import AcceptanceProfile
from specpilot.ir.errors import SpecPilotError
from specpilot.search.run_folder import write_json_atomic

# Rounds [start, end) of a request, counted from 0.
SPANS = ((0, 4), (4, 8), (8, 16), (16, 32), (32, 64), (64, None))


def by_round(accepted_lengths: Sequence[Sequence[int]], k: int) -> List[dict]:
    """Per span of round indices: rounds seen, mean drafts accepted, share with a rejection
    (fewer than k accepted); None where no request had rounds there."""
    out = []
    for start, end in SPANS:
        seen = [a for row in accepted_lengths for a in row[start:end]]
        out.append({"rounds": f"{start + 1}-{end}" if end else f"{start + 1}-",
                    "count": len(seen),
                    "mean_accepted": sum(seen) / len(seen) if seen else None,
                    "rejected_share": sum(a < k for a in seen) / len(seen) if seen else None})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profiles", nargs="+", required=True, help="chain(k) acceptance profiles")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    rows = {}
    for path in args.profiles:
        try:
            profile = AcceptanceProfile.load(path)
        except (OSError, SpecPilotError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        k = getattr(profile.topology, "k", None)
        if k is None:
            print(f"error: {path} is not a chain profile ({profile.topology})", file=sys.stderr)
            return 2
        rows[path] = by_round(profile.accepted_lengths, k)
        print(os.path.basename(path) + ": " + ", ".join(
            f"{r['rounds']} {r['mean_accepted']:.2f} ({r['rejected_share']:.0%})"
            for r in rows[path] if r["count"]))
    doc = {"environment": environment("cpu"), "settings": vars(args), "spans": rows}
    write_json_atomic(Path(args.out), doc)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
