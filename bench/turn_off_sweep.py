"""How many rounds the batch-length rule should see before it may turn speculation off
(runtime/batch_length.OFF_AFTER_ROUNDS): the adaptive replays (padded cold, padded warm, with
refill) of stored chain(k) profiles for each candidate, on stored step costs or on a two-number
model of a speculative round. Runs on the CPU (a replay: nothing is measured here but the
profiles and costs it reads).

  python3 bench/turn_off_sweep.py --off-after 4,8,12 \\
      --step-costs bench/results/llama8b-1b-replayed-run6-adaptive.json \\
      --round-model 1.8,0.135 \\
      --profiles bench/results/mechanisms-run9-refill.acceptance.stock_graphed.json \\
      --out bench/results/turn-off-sweep.json

Every figure is x padded AR of the same replay (pessimistic), as `specpilot bench --shapes
--adaptive --refill` reports it. `--estimator geometric,per_depth` replays each candidate under
both of the rule's estimates of what a chain commits (ir.program.LENGTH_ESTIMATORS).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Tuple

from specpilot.bench.adaptive_refill_replay import replay_adaptive_refill
from specpilot.bench.adaptive_replay import replay_adaptive
from specpilot.bench.environment import environment
from specpilot.bench.replay import AcceptanceProfile
from specpilot.bench.step_costs import StepCosts, read_step_costs
from specpilot.cli_common import positive_counts
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.program import LENGTH_ESTIMATORS
from specpilot.runtime.batch_length import OFF_AFTER_ROUNDS
from specpilot.search.run_folder import write_json_atomic


def sweep_rows(profile: AcceptanceProfile, costs, batch: int, off_after,
               host_lag: Tuple[int, int] = (1, 1), estimator: str = "geometric") -> list:
    """x padded AR of the rule (cold, warm, with refill) at `batch`, for each rounds-before-a-
    turn-off in `off_after` (runtime/batch_length.OFF_AFTER_ROUNDS is the rule's). `host_lag`
    (adaptive_replay.replay_adaptive): when the padded replays apply a chosen length, (1, 1)
    from the next round, (4, 2) as the graphed host loop does (replays of 4 rounds, the length
    chosen two replays back); refill's replay applies it at the next round. `estimator`: the
    rule's estimate of what a chain commits (ir.program.LENGTH_ESTIMATORS)."""
    return [{"off_after": n, "estimator": estimator,
             "cold": replay_adaptive(profile, costs, batch, host_lag=host_lag,
                                     off_after=n, estimator=estimator).speedup,
             "warm": replay_adaptive(profile, costs, batch, warm=True, host_lag=host_lag,
                                     off_after=n, estimator=estimator).speedup,
             "refill": replay_adaptive_refill(profile, costs, batch, off_after=n,
                                              estimator=estimator).speedup}
            for n in off_after]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--off-after", type=positive_counts, default="4,8,12",
                   help="candidate rounds, comma-separated")
    p.add_argument("--step-costs", help="a `specpilot bench --shapes` result with step costs")
    p.add_argument("--round-model", metavar="BASE,PER_DRAFT",
                   help="also a modelled round of BASE + PER_DRAFT * L plain steps")
    p.add_argument("--profiles", nargs="+", required=True, help="chain(k) acceptance profiles")
    p.add_argument("--batch-sizes", type=positive_counts, default="1,4,16,64")
    p.add_argument("--host-lag", metavar="ROUNDS,REPLAYS",
                   help="padded replays apply a length as the graphed loop does (4,2 there)")
    p.add_argument("--estimator", default="geometric",
                   help="the rule's estimates, comma-separated: any of "
                        f"{','.join(LENGTH_ESTIMATORS)}")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    estimators = args.estimator.split(",")
    unknown = [e for e in estimators if e not in LENGTH_ESTIMATORS]
    if unknown:
        p.error(f"--estimator {','.join(unknown)}: not one of {','.join(LENGTH_ESTIMATORS)}")
    off_after, batches = args.off_after, args.batch_sizes
    try:
        lag = tuple(positive_counts(args.host_lag)) if args.host_lag else (1, 1)
        if len(lag) != 2:
            raise argparse.ArgumentTypeError(f"two counts, got {args.host_lag!r}")
    except argparse.ArgumentTypeError as exc:
        p.error(f"--host-lag takes ROUNDS,REPLAYS: {exc}")
    if not args.step_costs and not args.round_model:
        p.error("give --step-costs, --round-model or both")
    try:
        profiles = {path: AcceptanceProfile.load(path) for path in args.profiles}
        cost_sets = {}
        if args.step_costs:
            cost_sets[args.step_costs] = read_step_costs(args.step_costs)[0]
        if args.round_model:
            base, per_draft = (float(x) for x in args.round_model.split(","))
            k = max(getattr(pr.topology, "k", 1) for pr in profiles.values())
            cost_sets[f"model {base} + {per_draft} L"] = StepCosts.of_round_model(
                base, per_draft, batches, k)
    except (OSError, KeyError, ValueError, SpecPilotError) as exc:
        print(f"error: cannot read the profiles or costs: {exc}", file=sys.stderr)
        return 2
    rows = []
    for cost_name, costs in cost_sets.items():
        for path, profile in profiles.items():
            for b in batches:
                try:
                    found = [row for estimator in estimators
                             for row in sweep_rows(profile, costs, b, off_after, lag, estimator)]
                except SpecPilotError as exc:
                    print(f"error: {path} at batch {b}: {exc}", file=sys.stderr)
                    return 2
                for row in found:
                    rows.append({"costs": cost_name, "profile": path, "batch": b, **row})
                print(f"{os.path.basename(path)} batch {b} ({cost_name}): " + ", ".join(
                    f"{r['estimator']} {r['off_after']}: {r['cold']:.3f} / {r['warm']:.3f} / "
                    f"{r['refill']:.3f}" for r in found), flush=True)
    doc = {"environment": environment("cpu"), "settings": vars(args),
           "current_off_after": OFF_AFTER_ROUNDS, "rows": rows}
    write_json_atomic(Path(args.out), doc)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
