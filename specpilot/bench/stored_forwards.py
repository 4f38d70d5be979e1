"""Forwards priced from the per-width step costs stored in a `specpilot bench --shapes` result
(specpilot/bench/step_costs.py), for estimates made off the GPU (bench/sequoia_replay.py,
ragged_replay.py, two_level_replay.py; `PackedCosts` prices the ragged layout): a width that
was not measured is padded up to the next stored width, or, past the widest, split into stored
ones (achievable, so an upper bound; nothing is extrapolated), and every such pricing is
logged. Never a measured graphed round."""
from __future__ import annotations

import math
from typing import Dict, Sequence, Tuple

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain

from .step_costs import StepCosts


NOT_COUNTED = ("not counted (on the device in the graphed round; only the eager host loop's is "
               "stored)")


class StoredForwards:
    """Target and drafter forwards at (batch, width) from `costs`, priced as bench/replay.py
    prices a round (`verify`: the target's causal forward over a chain, or over a tree's root
    and nodes; `accept`: not counted); `log` names each piece priced from others (`take_log`).
    Never a measured round."""

    def __init__(self, costs: StepCosts):
        self.costs = costs
        self.log: Dict[str, str] = {}

    def take_log(self) -> Dict[str, str]:
        """What was priced from other pieces since the last call."""
        log, self.log = self.log, {}
        return log

    def verify(self, batch: int, topology) -> float:
        """A chain's causal target forward of k + 1 tokens; a tree's priced (and logged) as the
        causal forward of its N + 1 tokens (a stored tree-mask verification, where there is
        one, is not used: like for like)."""
        n = topology.num_nodes
        if not isinstance(topology, Chain):
            self.log[f"verify({batch}, {n}-node tree)"] = (
                f"priced as the causal target({batch}, {n + 1}), as a chain's is (a stored "
                "tree-mask verification, where there is one, is not used)")
        return self.target(batch, n + 1)

    def accept(self, batch: int, topology) -> float:
        self.log["accept/commit"] = NOT_COUNTED
        return 0.0

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


class PackedCosts(StoredForwards):
    """StoredForwards that also price a packed (ragged) forward: `tokens` tokens over `rows`
    rows as the stored forward at (the smallest stored batch >= rows, ceil(tokens / it)), which
    does at least as much of every kind of work (bench/ragged_replay.py says why and where it
    is optimistic), never above the padded forward of the same round; every packing is logged."""

    def __init__(self, costs: StepCosts):
        super().__init__(costs)
        self.packs: Dict[Tuple[str, str, int, int], dict] = {}

    def take_log(self) -> Dict[str, str]:
        log = super().take_log()
        for (what, who, batch, width), s in sorted(self.packs.items()):
            rows = _span(s["rows"])
            tokens = _span(s["tokens"])
            text = (f"{s['count']} packed forwards of {tokens} tokens over {rows} active rows "
                    f"priced as the stored {who}({batch}, {width})")
            if s["capped"]:
                text += (f"; {s['capped']} of them capped at the padded forward of their round "
                         f"(stored costs not monotone)")
            log[f"{what}: packed {who}({batch}, {width})"] = text
        self.packs = {}
        return log

    def packed(self, what: str, who: str, rows: int, tokens: int, padded_batch: int,
               padded_width: int) -> float:
        """Seconds of a packed forward of `tokens` tokens over `rows` rows, never above the
        padded forward who(padded_batch, padded_width) of the same round."""
        table = self.costs.target_costs if who == "target" else self.costs.drafter_costs
        stored = [b for b in sorted(table) if b >= rows and table[b]]
        if not stored:
            raise SpecPilotError(f"no stored {who} costs at a batch >= {rows}")
        batch = stored[0]
        width = math.ceil(tokens / batch)
        seconds = self.forward(who, batch, width)
        padded = self.forward(who, padded_batch, padded_width)
        s = self.packs.setdefault((what, who, batch, width),
                                  {"count": 0, "capped": 0, "rows": [rows, rows],
                                   "tokens": [tokens, tokens]})
        s["count"] += 1
        s["rows"] = [min(s["rows"][0], rows), max(s["rows"][1], rows)]
        s["tokens"] = [min(s["tokens"][0], tokens), max(s["tokens"][1], tokens)]
        if seconds > padded:
            s["capped"] += 1
            return padded
        return seconds


def _span(pair: Sequence[int]) -> str:
    return str(pair[0]) if pair[0] == pair[1] else f"{pair[0]}..{pair[1]}"
