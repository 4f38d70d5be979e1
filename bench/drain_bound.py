"""What a measured refill call would take with no drain, or with its queue served longest
first: the call's own time per round, held, over the rounds of other schedules of its requests.

A refilled batch's rounds (bench/refill_granularity.py) run past full rows in the drain, the
batch waiting on its slowest requests once the queue is empty. This prices those schedules at
the call's measured rate, from a `specpilot bench` result and the refilled system's acceptance
profile of the same call:

  rounds      the schedule the captured loop runs (refill_steps, `--rounds-per-replay`); with
              one prefill for the first wave and one per newcomer it must give the row's target
              forwards, or the profile is not that row's (refused)
  admission   each newcomer's admission (prefill and row set-up), `--admission-ms` each: by
              default 0.12 ms, as the thirtieth set's timeline measured it at batch 16, one
              round a replay, prefilled ahead (an assumption for other calls; 0.30 for rows
              that prefilled beside, before commit f818ae6)
  round       (median seconds - admissions) / rounds: the call's mean round, held for every
              schedule (a drain's rounds run as many rows as any other, padded); the first
              prefill and the call's fixed time before and after its replays are priced into
              it, so they shrink with the shorter schedules

Longest first and the packed order are good orders, neither always the best; both need every
request's rounds in advance, which no decoder has.

and gives, for the loop's schedule, refilled at once, served longest first, in a packed order
of the known rounds (refill_schedule.packed_order) and full rows, the call's seconds and its
speed against strong AR and the stock Program of the same file.
Estimates from measured rates, not measurements.

  python3 bench/drain_bound.py bench/results/mechanisms-run30.json \\
      bench/results/mechanisms-run30.acceptance.mech-graphed_refill_fused.json --out FILE.json

A bench of several batch sizes keeps the widest one's profile under that name; give the batch's
own (<name>.acceptance.<system>.b<B>.json, written since the twenty-sixth set).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specpilot.bench.measure import measured_row
from specpilot.bench.replay import AcceptanceProfile, ProfileError
from specpilot.cli_common import positive_int
from specpilot.cost.refill_schedule import order_schedules, refill_steps
from specpilot.search.run_folder import write_json_atomic

# A newcomer's admission at batch 16 on the H200, one round a replay, its row's state set
# without a host wait, prefilled ahead with four held (BENCHMARKS.md, thirtieth set: 18.2 ms for
# 148 admissions, chain(4), run 63). Prefilled beside at its admission it took 0.30 ms
# (twenty-sixth set: 45.4 and 41.6 ms for 148, runs 52 and 53; 49.7 on run 63); 0.38 ms before
# the host stopped waiting (twenty-fifth set); 0.61-0.65 ms at four rounds a replay
# (fourteenth set).
ADMISSION_MS = 0.12


def drain_bound(bench: dict, profile: AcceptanceProfile, system: str, batch: int,
                per: int, admission_ms: float) -> dict:
    """The schedules' rounds and estimated seconds (module docstring)."""
    rows = bench["rows"]
    mine, strong = measured_row(rows, system, batch), measured_row(rows, "strong_ar", batch)
    stock = measured_row(rows, "stock_graphed", batch)
    rounds = [len(r) for r in profile.accepted_lengths]
    n = len(rounds)
    if n != mine["requests"]:
        raise ValueError(f"the profile has {n} requests, the row {mine['requests']}")
    newcomers = max(0, n - batch)
    loop = refill_steps(rounds, batch, per)
    if loop + 1 + newcomers != mine["target_forwards"]:
        raise ValueError(f"the profile's schedule gives {loop} rounds and {1 + newcomers} "
                         f"prefills, the row {mine['target_forwards']} target forwards: not "
                         f"this row's profile, or not {per} rounds a replay")
    seconds = mine["seconds"]["median"]
    admissions = newcomers * admission_ms / 1000.0
    round_s = (seconds - admissions) / loop
    schedules = {"loop": loop, **order_schedules(rounds, batch)}
    out = {}
    for name, count in schedules.items():
        s = admissions + count * round_s
        out[name] = {"rounds": count, "seconds": s,
                     "x_strong_ar": strong["seconds"]["median"] / s,
                     "x_stock": stock["seconds"]["median"] / s}
    return {"system": system, "batch": batch, "requests": n, "rounds_per_replay": per,
            "admission_ms": admission_ms, "round_ms": round_s * 1000.0,
            "measured_seconds": seconds,
            "measured_x_stock": stock["seconds"]["median"] / seconds,
            "stock_x_strong_ar": strong["seconds"]["median"] / stock["seconds"]["median"],
            "schedules": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench", help="a `specpilot bench` result (JSON)")
    ap.add_argument("profile", help="the refilled system's acceptance profile from that run")
    ap.add_argument("--system", default=None,
                    help="the row's system (default: the profile's own, from its source)")
    ap.add_argument("--batch", type=positive_int, default=None,
                    help="the row's batch size (default: the profile's own)")
    ap.add_argument("--rounds-per-replay", type=positive_int, default=1)
    ap.add_argument("--admission-ms", type=float, default=ADMISSION_MS)
    ap.add_argument("--out", help="write the figures here as JSON too")
    args = ap.parse_args(argv)
    if not args.admission_ms >= 0:
        ap.error(f"--admission-ms must be >= 0, got {args.admission_ms}")
    try:
        profile = AcceptanceProfile.load(args.profile)
        bench = json.loads(Path(args.bench).read_text())
        source = profile.source or {}
        system = args.system or source.get("system")
        batch = args.batch or source.get("batch_size")
        if system is None or batch is None:
            ap.error("the profile names no system or batch size: give --system and --batch")
        result = drain_bound(bench, profile, system, int(batch), args.rounds_per_replay,
                             args.admission_ms)
    except (ProfileError, OSError, ValueError, KeyError) as exc:
        ap.error(f"{args.bench}: {exc}")
    admission_source = ("the default, measured at batch 16, one round a replay"
                        if args.admission_ms == ADMISSION_MS else "--admission-ms")
    print(f"{system}, batch {result['batch']}: measured {result['measured_seconds'] * 1000:.1f} "
          f"ms ({result['measured_x_stock']:.2f}x the stock Program, which runs "
          f"{result['stock_x_strong_ar']:.2f}x strong AR); a round {result['round_ms']:.3f} ms, "
          f"admissions assumed {args.admission_ms} ms each ({admission_source})")
    for name, s in result["schedules"].items():
        print(f"  {name:>13}: {s['rounds']:7.1f} rounds, {s['seconds'] * 1000:7.1f} ms, "
              f"{s['x_strong_ar']:.2f}x strong AR, {s['x_stock']:.2f}x stock (estimate)")
    if args.out:
        write_json_atomic(Path(args.out), {"settings": vars(args), "result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
