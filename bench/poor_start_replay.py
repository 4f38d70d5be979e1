"""Whether the length rule's first turn-off decision, made on each request's first rounds, throws
away speculation that pays over the whole batch. The rule (runtime/batch_length.py) may turn a
batch off for good from its OFF_AFTER_ROUNDS-th round on, and the workload memory then starts
later batches off from what those truncated histories show (runtime/workload_memory.py); a
request whose first rounds are poor and its later ones good can turn a whole workload off.

Replays each stored chain(k) profile at each batch size two ways: its first B requests as the
whole workload (one batch of the first B prompts, as bench/round_cost_truth.py and a compile
time their workloads) and the whole profile in batches of B. Rows: the fixed chain(k) in padded
lock-step (`replay.replay`), and the adaptive rule (specpilot/bench/adaptive_replay.py, warm,
with the graphed loop's host lag; pessimistic / optimistic), × padded plain AR, priced with the
round costs bench/round_cost_truth.py measured ("true" costs; a batch size it did not measure
takes the nearest one's). For the first B
requests, each one's per-draft acceptance over its first OFF_AFTER_ROUNDS rounds and over all.

  python3 bench/poor_start_replay.py --truth bench/results/round-cost-truth-run18.json \\
      --profiles bench/results/mechanisms-run13-64prompts.acceptance.stock_graphed.json \\
      --out bench/results/poor-start-replay.json

A replay: nothing is measured here but the profiles and costs it reads.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Dict, List

from specpilot.bench.adaptive_replay import GRAPHED_HOST_LAG, READINGS, replay_adaptive
from specpilot.bench.environment import environment
from specpilot.bench.replay import AcceptanceProfile, replay
from specpilot.bench.step_costs import StepCosts
from specpilot.cli_common import positive_counts
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain
from specpilot.runtime.batch_length import OFF_AFTER_ROUNDS
from specpilot.search.run_folder import write_json_atomic


def costs_at(by_batch: Dict[int, List[float]], batches: List[int]) -> StepCosts:
    """Graphed step costs at each of `batches`, from the measured batch size nearest it (the
    smaller on a tie)."""
    nearest = {b: by_batch[min(by_batch, key=lambda m: (abs(m - b), m))] for b in batches}
    return StepCosts.of_chain_rounds(nearest)


def read_truth(path: str) -> Dict[int, List[float]]:
    """{batch: true round costs, L = 0..k} of a round_cost_truth result; a SpecPilotError if
    the file is missing or not such a result."""
    try:
        doc = json.loads(Path(path).read_text())
        costs = {int(b["batch"]): [float(c) for c in b["costs"]["true"]] for b in doc["batches"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecPilotError(f"--truth {path}: not a bench/round_cost_truth.py result "
                             f"({type(exc).__name__}: {exc})") from None
    if not costs:
        raise SpecPilotError(f"--truth {path} holds no batch's round costs")
    return costs


def acceptance(rows: List[int], k: int) -> float:
    """Per-draft acceptance of chain(k) rounds: accepted drafts over accepted + rejections."""
    accepted, rejected = sum(rows), sum(1 for n in rows if n < k)
    return accepted / (accepted + rejected) if accepted + rejected else float("nan")


def first(profile: AcceptanceProfile, count: int) -> AcceptanceProfile:
    return dataclasses.replace(profile, accepted_lengths=profile.accepted_lengths[:count],
                               new_tokens=profile.new_tokens[:count])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--truth", required=True, help="a bench/round_cost_truth.py result")
    ap.add_argument("--profiles", nargs="+", required=True, help="chain(k) acceptance profiles")
    ap.add_argument("--batch-sizes", type=positive_counts, default=[1, 4, 16, 64])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        by_batch = read_truth(args.truth)
        profiles = [(path, AcceptanceProfile.load(path)) for path in args.profiles]
    except SpecPilotError as exc:
        ap.error(str(exc))
    for path, profile in profiles:
        if not isinstance(profile.topology, Chain):
            ap.error(f"{path}: a chain(k) profile is needed, not {profile.topology}")
        if any(len(c) <= profile.topology.k for c in by_batch.values()):
            ap.error(f"{path}: chain({profile.topology.k}) needs round costs up to that length; "
                     f"--truth has {min(len(c) for c in by_batch.values()) - 1}")
    costs = costs_at(by_batch, args.batch_sizes)
    rows = []
    for path, profile in profiles:
        k = profile.topology.k
        for batch in args.batch_sizes:
            for workload, prof in (("first", first(profile, batch)), ("all", profile)):
                adaptive = {f"adaptive_{name}": replay_adaptive(
                    prof, costs, batch, unknown_agrees=agrees, warm=True,
                    host_lag=GRAPHED_HOST_LAG).speedup for name, agrees in READINGS.items()}
                row = {"profile": Path(path).name, "batch": batch, "workload": workload,
                       "requests": len(prof.accepted_lengths),
                       "fixed_chain": replay(prof, costs, batch).speedup, **adaptive}
                if workload == "first":
                    row["acceptance_first_rounds"] = [
                        acceptance(r[:OFF_AFTER_ROUNDS], k) for r in prof.accepted_lengths]
                    row["acceptance_whole"] = [acceptance(r, k) for r in prof.accepted_lengths]
                rows.append(row)
                print(f"{row['profile'][:44]:44s} b{batch:<3d} {workload:5s} "
                      f"chain({k}) {row['fixed_chain']:.3f}  adaptive "
                      f"{row['adaptive_pessimistic']:.3f} / {row['adaptive_optimistic']:.3f}",
                      flush=True)
    doc = {"environment": environment("cpu"), "settings": vars(args),
           "off_after_rounds": OFF_AFTER_ROUNDS,
           "costs": {str(b): c for b, c in by_batch.items()}, "rows": rows}
    write_json_atomic(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
