"""What a system's place in the order of an interleaved bench costs, and each system's time with
the order taken out.

`specpilot bench --interleave` times every system once a pass, the order rotated by one system
each pass, and records each run's place (`timing.places`). Here each run's time is fitted, per
batch size, as

  log(seconds of system s at place p) = a[s] + b[p] + noise,    b averaging 0 over the places

by least squares. exp(b[p]) is the factor place p puts on a run (1.02: 2 % slower than the
average place); exp(a[s]) is the system's seconds at the average place, and its new tokens over
that its tokens/s with the order taken out. With three passes or more each system also gets a
drift over the passes, fitted with the rest:

  log(seconds) = a[s] + b[p] + d[s] * (pass - mean pass) + noise

exp(d[s]) is the factor a pass puts on the system's next one (1.005: each pass 0.5 % slower
than the one before), so a system that slows down as the process runs on is told from one that
pays for its place; exp(a[s]) is then its seconds at the middle pass. With as many passes as systems every system runs once
at every place and the fit is the plain means of the logs (a Latin square). One pass cannot tell
a system from its place (flagged: `places_told_apart` false); two already link every place to
every other through the rotation, but with few runs to spare for the noise (`residual_rms` is
the fit's remaining spread, in logs). The bench file's rows must come from one `--interleave`
group per batch size.

  python3 bench/order_effect.py bench/results/mechanisms-b16.json [--against SYSTEM]
      [--out FILE.json]

Runs on the CPU: nothing is measured here but what the file holds.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from specpilot.bench.interleave import interleaved_rows
from specpilot.search.run_folder import write_json_atomic

FIXED = "mech:graphed_refill_fused_accept"


def fit(rows: List[dict]) -> dict:
    """The least-squares split of one batch size's runs into system and place factors
    (module docstring)."""
    systems = [r["system"] for r in rows]
    places = sorted({p for r in rows for p in r["timing"]["places"]})
    # (system, place, seconds, pass): a system's k-th run is of the k-th pass
    runs = [(i, p, s, turn) for i, r in enumerate(rows)
            for turn, (p, s) in enumerate(zip(r["timing"]["places"], r["seconds"]["runs"]))]
    for r in rows:
        if len(r["timing"]["places"]) != len(r["seconds"]["runs"]):
            raise ValueError(f"{r['system']}: {len(r['seconds']['runs'])} runs but "
                             f"{len(r['timing']['places'])} places")
    # Columns: one per system, then one per place but the last (the places' factors sum to 0
    # in logs: the last is minus the others' sum), then (three passes or more) one drift per
    # system over its passes, centred so that a[s] stays the system's middle pass.
    n_sys, n_place = len(rows), len(places)
    drift = min(len(r["seconds"]["runs"]) for r in rows) >= 3
    width = n_sys + n_place - 1 + (n_sys if drift else 0)
    design = np.zeros((len(runs), width))
    target = np.zeros(len(runs))
    for k, (i, p, seconds, turn) in enumerate(runs):
        design[k, i] = 1.0
        at = places.index(p)
        if at < n_place - 1:
            design[k, n_sys + at] = 1.0
        else:
            design[k, n_sys:n_sys + n_place - 1] = -1.0
        if drift:
            turns = len(rows[i]["seconds"]["runs"])
            design[k, n_sys + n_place - 1 + i] = turn - (turns - 1) / 2
        target[k] = math.log(seconds)
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    rank = int(np.linalg.matrix_rank(design))
    place_coef = coef[n_sys:n_sys + n_place - 1]
    place_logs = list(place_coef) + [-float(np.sum(place_coef))]
    residual = target - design @ coef
    return {
        "systems": {name: {"seconds": math.exp(coef[i]),
                           "tokens_per_s": rows[i]["new_tokens"] / math.exp(coef[i]),
                           "median_tokens_per_s": rows[i]["tokens_per_s"]["median"],
                           "runs": len(rows[i]["seconds"]["runs"]),
                           "drift_per_pass": (math.exp(coef[n_sys + n_place - 1 + i])
                                              if drift else None)}
                    for i, name in enumerate(systems)},
        "places": {str(p): math.exp(b) for p, b in zip(places, place_logs)},
        # One pass leaves every place factor tied to its system's own.
        "places_told_apart": rank == design.shape[1],
        "residual_rms": float(np.sqrt(np.mean(residual ** 2))) if len(runs) else 0.0,
    }


def with_ratios(result: dict, against: Optional[str]) -> dict:
    """Each system's order-free tokens/s over `against`'s, where that system was measured."""
    base = result["systems"].get(against) if against else None
    for row in result["systems"].values():
        row["over_against"] = (row["tokens_per_s"] / base["tokens_per_s"]) if base else None
    result["against"] = against if base else None
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench", help="a `specpilot bench --interleave` result (JSON)")
    ap.add_argument("--against", default=FIXED,
                    help=f"the system the others are given over (default {FIXED})")
    ap.add_argument("--out", help="write the figures here as JSON too")
    args = ap.parse_args(argv)
    try:
        groups = interleaved_rows(json.loads(Path(args.bench).read_text()))
        results = {str(b): with_ratios(fit(rows), args.against)
                   for b, rows in sorted(groups.items())}
    except (OSError, ValueError, KeyError) as exc:
        ap.error(f"{args.bench}: {exc}")
    for b, r in results.items():
        told = ("" if r["places_told_apart"]
                else " (not told apart from the systems: run more passes)")
        print(f"batch {b}: place factors "
              + ", ".join(f"{p}: {f:.4f}" for p, f in r["places"].items()) + told)
        for name, s in r["systems"].items():
            over = "" if s["over_against"] is None else f", {s['over_against']:.4f}x {r['against']}"
            drift = ("" if s["drift_per_pass"] is None
                     else f"; each pass {100 * (s['drift_per_pass'] - 1):+.2f} % on the last")
            print(f"  {name}: {s['tokens_per_s']:.1f} tokens/s with the order out "
                  f"(median {s['median_tokens_per_s']:.1f}){over}{drift}")
    if args.out:
        write_json_atomic(Path(args.out), {"settings": vars(args), "batches": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
