"""Two-level verification at 8B shape, estimated on the CPU from stored per-width step costs
and acceptance measured on the trained pair: when does a layer-skipping cheap pass over the
drafted tree, then the full target over the one path it keeps, beat the full target over the
whole tree?

Rows per batch size, each profile replayed in padded lock-step batches
(specpilot/bench/replay.py), × plain AR of the same batches:
  chain(4)                    the stock Program's profile
  tree                        the static tree's profile; the full target verifies N + 1 tokens
  two-level, measured prune   the two-level profile: its tree, pruned as the pair's cheap path
                              (the target's kept layers) chose
  two-level, perfect prune    the tree's profile under two-level pricing: the cheap path always
                              keeps the full target's path (an upper bound on what it keeps)
Every round's drafter catch-up is priced at 2 tokens, as the graphed rounds feed it (the
previous and the last token). A two-level round is priced as the tree's drafting + a cheap
forward of N + 1 tokens + the full target's forward of D + 1 tokens (D the tree's depth). The
cheap forward is the target's stored forward of N + 1 tokens scaled by what it runs: "with
head", the LM head (the runtime never skips it) plus the kept share of the layers, the head's
share taken from the target preset's weights; "lower bound", the kept share alone, as if the
head were skipped too. Cache moves and the accept walks (two-level has two, and a cheap cache
to move) are not counted, in any row. **Estimates**: no two-level round was captured at this
shape.

  python3 bench/two_level_replay.py \\
      --step-costs bench/results/llama8b-1b-replayed-graphed_tree.json \\
      --chain bench/results/mechanisms-run15-64prompts.acceptance.stock_graphed.json \\
      --tree bench/results/mechanisms-run15-64prompts.acceptance.mech-graphed_tree.json \\
      --two-level bench/results/mechanisms-run15-64prompts.acceptance.mech-graphed_two_level.json \\
      --out bench/results/two-level-replay-8b-run15.json
"""
from __future__ import annotations

import argparse
from typing import Optional, Sequence

from specpilot.bench.estimate_io import ESTIMATE_LABEL, write_estimate
from specpilot.bench.replay import AcceptanceProfile, replay
from specpilot.bench.shapes import ShapePreset, parse_shapes
from specpilot.bench.step_costs import read_step_costs
from specpilot.bench.stored_forwards import StoredForwards
from specpilot.cli_common import positive_counts
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain

# The graphed rounds' drafter catch-up: the previous and the last token, every round.
GRAPHED_CATCH_UP = 2


def head_share(preset: ShapePreset) -> float:
    """The LM head's share of the weights one forward streams (every layer's linears + the head)."""
    h, q, kv = preset.hidden, preset.heads * preset.head_dim, preset.kv_heads * preset.head_dim
    layer = 2 * h * q + 2 * h * kv + 3 * h * preset.intermediate
    head = h * preset.vocab
    return head / (preset.layers * layer + head)


class TwoLevelForwards(StoredForwards):
    """Stored forwards that price a tree's verification as two-level's: a cheap forward of
    N + 1 tokens (`cheap` of the target's) and the full target's of D + 1."""

    def __init__(self, costs, cheap: float):
        super().__init__(costs)
        self.cheap = cheap

    def verify(self, batch: int, topology) -> float:
        if isinstance(topology, Chain):
            raise SpecPilotError("two-level verification prunes a tree, not a chain")
        return (self.cheap * self.target(batch, topology.num_nodes + 1)
                + self.target(batch, topology.depth + 1))


def _profile(path: str, want_tree: bool, two_level: Optional[bool] = None) -> AcceptanceProfile:
    """The profile at `path`, refused by name where its topology is not of the kind wanted, or
    where the system it names (if any) is, or is not, two-level against `two_level`."""
    profile = AcceptanceProfile.load(path)
    if want_tree == isinstance(profile.topology, Chain):
        raise SpecPilotError(f"{path}: a {'tree' if want_tree else 'chain'} profile is needed, "
                             f"this one is of {profile.topology}")
    system = profile.source.get("system") if isinstance(profile.source, dict) else None
    if two_level is not None and system is not None and ("two_level" in system) != two_level:
        raise SpecPilotError(f"{path}: a {'two-level' if two_level else 'static tree'} profile "
                             f"is needed, this one is of the system {system}")
    return profile


def run(args: argparse.Namespace) -> dict:
    costs, doc = read_step_costs(args.step_costs)
    settings = doc.get("settings")
    shapes = settings.get("shapes", args.shapes) if isinstance(settings, dict) else args.shapes
    target, _ = parse_shapes(shapes)
    head = head_share(target)
    chain = _profile(args.chain, False)
    tree, two_level = _profile(args.tree, True, False), _profile(args.two_level, True, True)
    cheap = {"with head": head + (1 - head) * args.kept, "lower bound": args.kept}
    systems = [(str(chain.topology), chain, {"-": StoredForwards(costs)}),
               ("tree", tree, {"-": StoredForwards(costs)}),
               ("two-level, measured prune", two_level,
                {p: TwoLevelForwards(costs, c) for p, c in cheap.items()}),
               ("two-level, perfect prune", tree,
                {p: TwoLevelForwards(costs, c) for p, c in cheap.items()})]
    rows, log = [], {}
    for batch in args.batch_sizes:
        for name, profile, pricings in systems:
            for pricing, forwards in pricings.items():
                figure = replay(profile, forwards, batch, catch_up=GRAPHED_CATCH_UP)
                rows.append({"batch": batch, "system": name, "topology": str(profile.topology),
                             "pricing": pricing, "speedup_vs_ar": figure.speedup,
                             "mean_accepted": figure.mean_accepted,
                             "round_ms": 1e3 * figure.spec_seconds / figure.spec_steps})
                log.update(forwards.take_log())
    return {"kind": "two-level-replay", "label": ESTIMATE_LABEL,
            "settings": {**vars(args), "shapes": shapes, "catch_up": GRAPHED_CATCH_UP,
                         "head_share": head, "cheap_share": cheap},
            "step_costs_environment": doc.get("environment"), "priced_from_others": log,
            "rows": rows}


def table(rows: Sequence[dict]) -> str:
    lines = ["batch  system                      topology          pricing      x AR   accepted"
             "  round ms"]
    for r in rows:
        lines.append(f"{r['batch']:5d}  {r['system']:26s}  {r['topology']:16s}  "
                     f"{r['pricing']:11s}  {r['speedup_vs_ar']:5.2f}  {r['mean_accepted']:8.2f}"
                     f"  {r['round_ms']:8.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--step-costs", required=True,
                    help="a `specpilot bench --shapes` result with per-width target and drafter "
                         "costs")
    ap.add_argument("--chain", required=True, help="the stock chain(4) acceptance profile")
    ap.add_argument("--tree", required=True, help="a static tree's acceptance profile")
    ap.add_argument("--two-level", required=True, help="a two-level acceptance profile")
    ap.add_argument("--kept", type=float, default=0.5,
                    help="the share of the target's layers the cheap path keeps (0.5: 6 of 12, "
                         "as the measured profile's Program)")
    ap.add_argument("--shapes", default="llama-3.1-8b:llama-3.2-1b",
                    help="the presets, where the step-cost file does not name them")
    ap.add_argument("--batch-sizes", type=positive_counts, default=[1, 4, 16, 64])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not 0 < args.kept < 1:
        ap.error(f"--kept must be between 0 and 1, got {args.kept}")
    return write_estimate(run, args, table)


if __name__ == "__main__":
    raise SystemExit(main())
