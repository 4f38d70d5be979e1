"""What the adaptive length rule with continuous refill should optimise once the queue is empty:
its makespan (the batch drains like a padded one) or its time per token (as while refilling),
with each length estimate, replayed on measured calls' chain(4) profiles against the fixed
chain(4) with refill and AR with refill (specpilot/bench/adaptive_refill_replay.py; a
Program's batch.length_drain, SetLengthDrain). Runs on the CPU: nothing is measured here but
what the files hold.

For each `specpilot bench --mechanisms` file: the fixed refill row's acceptance profile at the
row's batch size (the one the bench wrote beside the file under its name, the batch's own where
it wrote several), priced by the adaptive row's recorded round prices (its `length_rule`) where
the file has them, else by the model base + per_draft L plain steps (`--round-model`, as
bench/turn_off_sweep.py takes it).

  python3 bench/drain_rule_replay.py bench/results/mechanisms-run63-b16.json [more files]
      [--out FILE.json]

Every figure is a replay: x AR with refill, and each rule over the fixed chain (> 1: the rule is
faster). A rule that drafts fewer than the profile's chain starts its rounds where the profile
never drafted from; the replay counts a draft there as rejected (pessimistic) and, as
`optimistic`, as accepted (`unknown_agrees`). The two bracket what the rule can expect. On runs 65
and 69 at batch 64 the H200 measured the default rule at 0.960 and 1.003 of the fixed chain,
where the pessimistic replay said 0.844 and 0.754 and the optimistic one 0.971 and 0.964
(thirty-second set).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specpilot.bench.adaptive_refill_replay import replay_adaptive_refill
from specpilot.bench.adaptive_replay import round_costs_for
from specpilot.bench.environment import environment
from specpilot.bench.refill_replay import replay_refill
from specpilot.bench.replay import AcceptanceProfile, ProfileError, acceptance_suffix
from specpilot.bench.step_costs import StepCosts
from specpilot.ir.program import LENGTH_DRAINS, LENGTH_ESTIMATORS
from specpilot.search.run_folder import write_json_atomic

FIXED = "mech:graphed_refill_fused_accept"
ADAPTIVE = "mech:graphed_adaptive_refill_fused_accept"
# A chain(L) round in plain steps, 1.211 + 0.137 L: the recorded prices of runs 60-63 at
# batch 16 (1.346-1.349 at L = 1, 1.754-1.771 at L = 4).
ROUND_MODEL = (1.211, 0.137)


def cell(bench_path: Path, fixed: str, adaptive: str, model) -> dict:
    """The replays of one bench file's fixed refill row (module docstring)."""
    bench = json.loads(bench_path.read_text())
    rows = [r for r in bench["rows"] if r["system"] == fixed and r.get("status") == "measured"]
    if len(rows) != 1:
        raise ValueError(f"{bench_path}: expected one measured {fixed} row, found {len(rows)}")
    batch = rows[0]["batch_size"]
    own = str(batch) in bench.get("acceptance_profiles_by_batch", {}).get(fixed, {})
    profile_path = bench_path.with_name(
        bench["name"] + acceptance_suffix(fixed, batch if own else None))
    profile = AcceptanceProfile.load(str(profile_path))
    k = getattr(profile.topology, "k", 0)
    if k < 1:
        raise ValueError(f"{profile_path}: not a chain profile")
    rule = [r.get("length_rule") for r in bench["rows"]
            if r["system"] == adaptive and r.get("batch_size") == batch and r.get("length_rule")]
    if rule:
        if len(rule[0]["prices"]) != k + 1:
            raise ValueError(f"{bench_path}: {len(rule[0]['prices'])} prices for chains of "
                             f"up to {k}")
        costs = StepCosts.of_chain_rounds({batch: rule[0]["prices"]})
    else:
        costs = StepCosts.of_round_model(*model, [batch], k)
    prices = round_costs_for(costs, batch, k)
    plain = replay_refill(profile, costs, batch)
    out = {"bench": bench_path.name, "batch": batch, "requests": len(profile.accepted_lengths),
           "prices": prices, "prices_recorded": bool(rule),
           "fixed_x_ar": plain.speedup, "rules": {}}
    for estimator in LENGTH_ESTIMATORS:
        for drain in LENGTH_DRAINS:
            got, hope = (replay_adaptive_refill(profile, costs, batch, estimator=estimator,
                                                drain=drain, unknown_agrees=agrees)
                         for agrees in (False, True))
            out["rules"][f"{estimator}/{drain}"] = {
                "x_ar": got.speedup, "over_fixed": plain.spec_seconds / got.spec_seconds,
                "mean_accepted": got.mean_accepted,
                "optimistic": {"x_ar": hope.speedup,
                               "over_fixed": plain.spec_seconds / hope.spec_seconds,
                               "mean_accepted": hope.mean_accepted}}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench", nargs="+", help="`specpilot bench --mechanisms` results (JSON)")
    ap.add_argument("--fixed", default=FIXED, help=f"the fixed refill row ({FIXED})")
    ap.add_argument("--adaptive", default=ADAPTIVE,
                    help=f"the adaptive row whose recorded prices are used ({ADAPTIVE})")
    ap.add_argument("--round-model", metavar="BASE,PER_DRAFT",
                    default=",".join(map(str, ROUND_MODEL)),
                    help="a round of L drafts costs BASE + PER_DRAFT * L plain steps where a "
                         "file records no prices")
    ap.add_argument("--out", help="write the cells as JSON too")
    args = ap.parse_args(argv)
    try:
        model = tuple(float(x) for x in args.round_model.split(","))
        if len(model) != 2 or min(model) < 0:
            raise ValueError
    except ValueError:
        ap.error(f"--round-model takes base,per_draft (two numbers >= 0), got "
                 f"{args.round_model!r}")
    cells = []
    for path in args.bench:
        try:
            c = cell(Path(path), args.fixed, args.adaptive, model)
        except (OSError, ValueError, KeyError, ProfileError) as exc:
            print(f"{path}: {exc}", file=sys.stderr)
            return 2
        cells.append(c)
        rules = ", ".join(f"{name} {r['over_fixed']:.3f} (optimistic "
                          f"{r['optimistic']['over_fixed']:.3f})" for name, r in c["rules"].items())
        print(f"{c['bench']} batch {c['batch']}: fixed {c['fixed_x_ar']:.3f}x AR with refill; "
              f"over fixed: {rules}" + ("" if c["prices_recorded"] else " (modelled prices)"))
    if args.out:
        write_json_atomic(Path(args.out), {"environment": environment("cpu"),
                                            "settings": vars(args), "cells": cells})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
