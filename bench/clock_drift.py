"""Whether an interleaved bench's runs got slower because the GPU's clocks fell or it warmed up.

`specpilot bench --interleave` records when each timed run began (`timing.started`, seconds
since the epoch) and how long it took; `bench/gpu_run.sh` with CLOCK_LOG=<ms> logs the GPU's SM
and memory clocks, temperature and power that often (`nvidia-smi --format=csv,noheader,nounits`,
stamped in UTC) to gpu-clocks.csv. Here each run gets the mean of the samples taken while it
ran, and each system the slope of its runs' log-seconds against their log SM clock, fitted by
least squares:

  log(seconds) = c[s] + e[s] * log(SM clock) + noise

e[s] = -1: the system's time follows the SM clock wholly (compute-bound work at a lower clock);
0: it does not move with it (bandwidth- or host-bound). Where one system's runs slow pass by
pass (bench/order_effect.py's drift) and its e is near 0 while the clock fell, the clock is not
why. Also the same slope against temperature, per degree, fitted alone: where the clock falls
as the GPU warms, the two slopes tell the same story and cannot be told apart. Systems whose
runs saw one clock only get no slope.

  python3 bench/clock_drift.py BENCH.json gpu-clocks.csv [--out FILE.json]

Runs on the CPU: nothing is measured here but what the two files hold.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from specpilot.bench.interleave import interleaved_rows
from specpilot.search.run_folder import write_json_atomic

FIELDS = ("sm_mhz", "mem_mhz", "temperature_c", "power_w")


def _number(text: str) -> Optional[float]:
    """A CSV cell as a number; None for nvidia-smi's "[N/A]" and the like."""
    try:
        return float(text)
    except ValueError:
        return None


def read_clocks(path: Path) -> List[Tuple[float, Dict[str, Optional[float]]]]:
    """(seconds since the epoch, {field: value}) for each line of an nvidia-smi log of
    timestamp, clocks.sm, clocks.mem, temperature.gpu, power.draw (ValueError on a line that is
    not one)."""
    samples = []
    with open(path, newline="") as f:
        for n, cells in enumerate(csv.reader(f), 1):
            if not cells:
                continue
            if len(cells) != 1 + len(FIELDS):
                raise ValueError(f"{path}:{n}: expected {1 + len(FIELDS)} fields, got "
                                 f"{len(cells)}")
            try:
                stamp = datetime.strptime(cells[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
            except ValueError:
                raise ValueError(f"{path}:{n}: not a timestamp: {cells[0]!r}") from None
            at = stamp.replace(tzinfo=timezone.utc).timestamp()
            samples.append((at, {k: _number(v.strip()) for k, v in zip(FIELDS, cells[1:])}))
    samples.sort(key=lambda s: s[0])
    return samples


def during(samples, start: float, end: float) -> Dict[str, Optional[float]]:
    """Each field's mean over the samples taken in [start, end] (None where none was), and how
    many there were."""
    inside = [values for at, values in samples if start <= at <= end]
    means: Dict[str, Optional[float]] = {}
    for key in FIELDS:
        got = [v[key] for v in inside if v[key] is not None]
        means[key] = sum(got) / len(got) if got else None
    means["samples"] = len(inside)
    return means


def slope(xs: List[float], ys: List[float]) -> Optional[float]:
    """The least-squares slope of ys on xs; None with fewer than two distinct xs."""
    if len(xs) < 2 or max(xs) - min(xs) < 1e-12:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
            / sum((x - mx) ** 2 for x in xs))


def system_runs(row: dict, samples) -> dict:
    """One system's runs with the GPU's state while each ran, and its slopes (module doc)."""
    started = row["timing"].get("started")
    if started is None:
        raise ValueError(f"{row['system']}: its runs have no start times (a bench from before "
                         "they were recorded)")
    runs = []
    for turn, (begin, seconds) in enumerate(zip(started, row["seconds"]["runs"])):
        runs.append({"pass": turn, "seconds": seconds, **during(samples, begin, begin + seconds)})
    clocked = [r for r in runs if r["sm_mhz"]]
    warmed = [r for r in runs if r["temperature_c"] is not None]
    return {
        "runs": runs,
        "sm_clock_elasticity": slope([math.log(r["sm_mhz"]) for r in clocked],
                                     [math.log(r["seconds"]) for r in clocked]),
        "per_degree": slope([r["temperature_c"] for r in warmed],
                            [math.log(r["seconds"]) for r in warmed]),
        "unsampled_runs": sum(1 for r in runs if r["samples"] == 0),
    }


def _fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench", help="a `specpilot bench --interleave` result (JSON)")
    ap.add_argument("clocks", help="the GPU's log (bench/gpu_run.sh CLOCK_LOG: gpu-clocks.csv)")
    ap.add_argument("--out", help="write the figures here as JSON too")
    args = ap.parse_args(argv)
    try:
        groups = interleaved_rows(json.loads(Path(args.bench).read_text()))
        samples = read_clocks(Path(args.clocks))
        if not samples:
            raise ValueError(f"{args.clocks}: no samples")
        results = {str(b): {r["system"]: system_runs(r, samples) for r in rows}
                   for b, rows in sorted(groups.items())}
    except (OSError, ValueError, KeyError) as exc:
        ap.error(str(exc))
    for b, systems in results.items():
        print(f"batch {b}:")
        for name, s in systems.items():
            per_run = "; ".join(
                f"{r['seconds']:.4f} s at {_fmt(r['sm_mhz'], '.0f')} MHz "
                f"{_fmt(r['temperature_c'], '.1f')} C {_fmt(r['power_w'], '.0f')} W"
                for r in s["runs"])
            unsampled = (f" ({s['unsampled_runs']} runs with no sample: log more often)"
                         if s["unsampled_runs"] else "")
            degree = None if s["per_degree"] is None else 100 * s["per_degree"]
            print(f"  {name}: elasticity to the SM clock {_fmt(s['sm_clock_elasticity'], '+.2f')}"
                  f", per degree {_fmt(degree, '+.3f')} %"
                  f"{unsampled}\n    {per_run}")
    if args.out:
        write_json_atomic(Path(args.out), {"settings": vars(args), "batches": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
