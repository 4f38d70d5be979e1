"""What the CPU estimate scripts share besides pricing (specpilot/bench/stored_forwards.py): the
label of their rows and the script's end (the document written, its rows printed) for
bench/sequoia_replay.py, ragged_replay.py and two_level_replay.py; the check that the step
costs cover the batch sizes asked for, and where they were measured, for the first two."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Iterable, List, Sequence

from specpilot.ir.errors import SpecPilotError
from specpilot.search.run_folder import write_json_atomic

from .replay import REPLAYED

ESTIMATE_LABEL = (f"{REPLAYED}; estimated from stored per-width step costs, not a measured "
                  f"captured round")


def check_batches(costs, batches: Iterable[int], stored: List[int], path: str) -> None:
    """A SpecPilotError naming `path` unless `costs` hold target and drafter forwards at every
    batch size of `batches` (`stored`: the batch sizes offered instead)."""
    missing = [b for b in batches if b not in costs.target_costs or b not in costs.drafter_costs]
    if missing:
        raise SpecPilotError(f"{path} has no target/drafter costs at batch {missing} (stored: "
                             f"{stored})")


def measured_on(doc: dict) -> dict:
    """Where a step-cost document's costs were measured: its shapes, device, dtype, scale and
    context, and the GPU."""
    settings = doc.get("settings")
    settings = settings if isinstance(settings, dict) else {}
    return {"step_costs_measured_on": {key: settings.get(key) for key in
                                       ("shapes", "device", "dtype", "scale", "context")},
            "step_costs_gpu": (doc.get("environment") or {}).get("gpu")}


def write_estimate(run: Callable[[argparse.Namespace], dict], args: argparse.Namespace,
                   table: Callable[[Sequence[dict]], str]) -> int:
    """An estimate script's end: `run(args)` written to `args.out` (atomically) and its rows
    printed with `table`; 2 with the error where the inputs are refused."""
    try:
        doc = run(args)
    except SpecPilotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_json_atomic(Path(args.out), doc)
    print(table(doc["rows"]))
    print(args.out)
    return 0
