"""What a refilled batch's rounds come to, from a measured acceptance profile: how many rounds
the queue needs at each count of rounds a replay, against refilling at once and against full
rows.

Each request of a profile (`specpilot bench --pair` writes one per system) holds its slot for
as many rounds as it ran; the queue is served in the profile's order, as the bench serves it.
Per profile and batch size:

  full_rows        request rounds / batch: every slot busy every round (no tail, no wait)
  at_once          rounds when a finished slot takes the next request at once
  rounds_per_replay[n]  rounds as the captured refill decoder runs them, n rounds a replay:
                   a finished slot waits for its replay's end and one replay more
                   (specpilot/cost/refill_schedule.py, which checks this against the loop)
  longest_first    at once, the queue served longest request first: what an order that knew
                   each request's rounds in advance could gain (no decoder knows them); a good
                   order, not always the best
  packed           at once, in the order of a packing of the known rounds into the slots
                   (refill_schedule.packed_order): another such order, better than longest
                   first on some profiles, worse on others

  python3 bench/refill_granularity.py bench/results/mechanisms-run27-64prompts.acceptance.mech-graphed_refill_fused.json --batch-sizes 16 --out FILE.json

On the H200 (run 28's pair, batch 16) the timeline's whole calls ran 348 / 330 / 322 rounds at
4 / 2 / 1 rounds a replay, as this gives (BENCHMARKS.md).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specpilot.bench.replay import AcceptanceProfile, ProfileError
from specpilot.cli_common import positive_counts
from specpilot.cost.refill_schedule import order_schedules, refill_steps
from specpilot.search.run_folder import write_json_atomic


def one_profile(path: str, batch_sizes, per_replay) -> dict:
    profile = AcceptanceProfile.load(path)
    rounds = [len(r) for r in profile.accepted_lengths]
    return {"profile": path, "requests": len(rounds), "request_rounds": sum(rounds),
            "longest_request_rounds": max(rounds),
            "batches": [{"batch": b, **order_schedules(rounds, b),
                         "rounds_per_replay": {str(n): refill_steps(rounds, b, n)
                                               for n in per_replay}}
                        for b in batch_sizes]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profiles", nargs="+", help="acceptance profile JSON files")
    ap.add_argument("--batch-sizes", type=positive_counts, default=[16])
    ap.add_argument("--rounds-per-replay", type=positive_counts, default=[1, 2, 4])
    ap.add_argument("--out", help="write the figures here as JSON too")
    args = ap.parse_args(argv)
    try:
        rows = [one_profile(p, args.batch_sizes, args.rounds_per_replay) for p in args.profiles]
    except ProfileError as exc:
        ap.error(str(exc))
    for row in rows:
        print(f"{row['profile']}: {row['requests']} requests, {row['request_rounds']} request "
              f"rounds, the longest {row['longest_request_rounds']}")
        for b in row["batches"]:
            per = ", ".join(f"{n} a replay {r}" for n, r in b["rounds_per_replay"].items())
            print(f"  batch {b['batch']}: full rows {b['full_rows']:.1f}, refilled at once "
                  f"{b['at_once']} (longest first {b['longest_first']}, packed "
                  f"{b['packed']}), {per}")
    if args.out:
        write_json_atomic(Path(args.out), {"settings": vars(args), "profiles": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
