"""Forwards priced from the per-width step costs stored in a `specpilot bench --shapes` result
(specpilot/bench/step_costs.py), for estimates made off the GPU (bench/sequoia_replay.py,
bench/ragged_replay.py): a width that was not measured is padded up to the next stored width,
or, past the widest, split into stored ones (achievable, so an upper bound; nothing is
extrapolated), and every such pricing is logged. Never a measured graphed round. Also the two
scripts' shared command-line pieces."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence

from specpilot.ir.errors import SpecPilotError
from specpilot.search.run_folder import write_json_atomic

from .step_costs import StepCosts


class StoredForwards:
    """Target and drafter forwards at (batch, width) from `costs`; `log` names each width priced
    from others. Replays priced by it (bench/replay.py) never use a measured round."""

    def __init__(self, costs: StepCosts):
        self.costs = costs
        self.log: Dict[str, str] = {}

    def forward(self, who: str, batch: int, width: int) -> float:
        """Seconds of one `who` ("target" or "drafter") forward of `width` tokens per row."""
        table = self.costs.target_costs if who == "target" else self.costs.drafter_costs
        row = table.get(batch)
        if not row:
            raise SpecPilotError(f"no stored {who} costs at batch {batch}")
        if width in row:
            return row[width]
        wider = [w for w in sorted(row) if w >= width]
        if wider:
            self.log[f"{who}({batch}, {width})"] = (f"not stored: padded to {who}({batch}, "
                                                    f"{wider[0]})")
            return row[wider[0]]
        widest = max(row)
        whole, rest = divmod(width, widest)
        parts = [widest] * whole
        seconds = whole * row[widest]
        if rest:
            pad = min(w for w in row if w >= rest)
            parts.append(pad)
            seconds += row[pad]
        self.log[f"{who}({batch}, {width})"] = (
            f"not stored (widest stored {widest}): split into "
            + " + ".join(f"{who}({batch}, {w})" for w in parts))
        return seconds

    def target(self, batch: int, width: int) -> float:
        return self.forward("target", batch, width)

    def drafter(self, batch: int, width: int) -> float:
        return self.forward("drafter", batch, width)

    def has_round(self, batch: int, topology) -> bool:
        return False


def positive_counts(text: str) -> List[int]:
    """A comma-separated list of counts >= 1 (batch sizes, node budgets), for argparse."""
    try:
        counts = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 1,4,16, got {text!r}") from None
    if not counts or any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"counts must be >= 1, got {text!r}")
    return counts


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
