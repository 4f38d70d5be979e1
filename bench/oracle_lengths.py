"""The headroom of the per-round length choice: the batch-length rule against an oracle that knows
every draft's fate (specpilot/bench/oracle_replay.py), on stored chain(k) profiles and stored
step costs; with the fixed chain for scale. Runs on the CPU (a replay: nothing is measured
here but the profiles and costs it reads).

  python3 bench/oracle_lengths.py \\
      --step-costs bench/results/llama8b-1b-replayed-run6-adaptive.json \\
      --profiles bench/results/mechanisms-run9-refill.acceptance.stock_graphed.json \\
      --out bench/results/oracle-lengths.json

Every figure is x padded AR of the same replay (the refill rows too, as in `specpilot bench
--shapes --refill`).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from specpilot.bench.adaptive_refill_replay import replay_adaptive_refill
from specpilot.bench.adaptive_replay import replay_adaptive
from specpilot.bench.environment import environment
from specpilot.bench.oracle_replay import replay_oracle
from specpilot.bench.refill_replay import replay_refill
from specpilot.bench.replay import AcceptanceProfile, replay
from specpilot.bench.step_costs import StepCosts, read_step_costs
from specpilot.cli_common import positive_counts
from specpilot.ir.errors import SpecPilotError
from specpilot.search.run_folder import write_json_atomic


def rows_for(profile: AcceptanceProfile, costs: StepCosts, batch: int) -> dict:
    """x padded AR of each system at `batch` (pessimistic where the rule or oracle needs it)."""
    padded = replay(profile, costs, batch)
    ar = padded.ar_seconds
    return {"fixed": padded.speedup,
            "rule": replay_adaptive(profile, costs, batch).speedup,
            "rule_warm": replay_adaptive(profile, costs, batch, warm=True).speedup,
            "oracle": replay_oracle(profile, costs, batch).speedup,
            "fixed_refill": ar / replay_refill(profile, costs, batch).spec_seconds,
            "rule_refill": ar / replay_adaptive_refill(profile, costs, batch).spec_seconds,
            "oracle_refill": ar / replay_oracle(profile, costs, batch, refill=True).spec_seconds}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--step-costs", required=True, metavar="RESULT.json",
                   help="a `specpilot bench --shapes` result whose step costs are replayed")
    p.add_argument("--profiles", required=True, nargs="+", metavar="PROFILE.json")
    p.add_argument("--batch-sizes", type=positive_counts, default="1,4,16,64")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        costs, source = read_step_costs(args.step_costs)
        profiles = {path: AcceptanceProfile.load(path) for path in args.profiles}
    except (OSError, KeyError, ValueError, SpecPilotError) as exc:
        print(f"oracle_lengths: {exc}", file=sys.stderr)
        return 2
    results = []
    for path, profile in profiles.items():
        for b in args.batch_sizes:
            row = dict(profile=path, batch_size=b, **rows_for(profile, costs, b))
            results.append(row)
            print(f"{os.path.basename(path)} b{b}: " + "  ".join(
                f"{k} {v:.2f}" for k, v in row.items() if isinstance(v, float)), flush=True)
    doc = {"kind": "replayed acceptance", "environment": environment("cpu"),
           "step_costs_from": args.step_costs,
           "step_costs_measured_on": source.get("environment", {}),
           "model": "x padded AR; pessimistic agreement maps", "rows": results}
    write_json_atomic(Path(args.out), doc)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
