"""Sequoia-shaped static trees against chain(k) at a stored shape pair, replayed acceptance: for
each batch size of a `specpilot bench --shapes` result, the tree of each node budget shaped from
a measured rank profile (runtime/sequoia.py), and chain(k), both replayed on that same profile
(RankProfile.to_profile) and priced round by round from the stored per-width step costs.

  python3 bench/sequoia_replay.py \\
      --ranks bench/results/compile-gpu-small-run8-b64/acceptance.json \\
      --step-costs bench/results/llama8b-1b-replayed-run6-adaptive.json \\
      --sizes 8,16 --out /tmp/sequoia-replay.json

Every figure is an ESTIMATE from stored per-width costs, not a measured captured round. Each
round, chain and tree alike, is priced as bench/replay.py's summed step: drafter catch-up
(width = the widest row's accepted + 1 of the previous round) + one drafter forward per tree
level but the last (at the level's width) + target verification (+ accept/commit, see
--accept). A measured graphed round is never used for a row, so tree/chain is like for like.
Components the stores lack are priced from what is stored, and each row lists them under
"priced_from":
  - a tree's verification of N nodes: the target's causal forward of N + 1 tokens (a chain
    verifies with exactly that forward); used even where a tree-mask verification is stored;
  - a forward width that was not measured: padded to the next measured width or, past the
    widest, split into forwards of the widest plus the rest (achievable, so an upper bound;
    nothing is extrapolated);
  - accept/commit: the graphed runtime does it on the device inside its round and the stores
    hold only the eager host loop's (of chain(k)), so by default no system counts it;
    `--accept chain` adds the stored chain(k) cost to every system instead.
"round_check" lists, for every static topology whose graphed round the file stores, that
measured round beside the round this pricing gives it: how far the pricing is off, per shape.
Tree choice (Sequoia, runtime/sequoia.py `best_tree`): for every depth limit and size up to the
budget, the best tree under the rank profile's per-depth, per-rank acceptance (which assumes
independent depths), scored by expected tokens per round over its priced round at this batch
size (catch-up at its full depth + 1); the figures reported are the replay's, not the model's.
The tree is shaped on the profile it is replayed on (in-sample); `--holdout` shapes on the
even-numbered requests and replays every system on the odd-numbered ones.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional, Sequence

from specpilot.bench.environment import environment
from specpilot.bench.replay import replay, spec_step_seconds
from specpilot.bench.estimate_io import (ESTIMATE_LABEL, check_batches, measured_on,
                                         write_estimate)
from specpilot.bench.step_costs import StepCosts, read_step_costs, topology_from_key
from specpilot.bench.stored_forwards import StoredForwards
from specpilot.cli_common import positive_counts
from specpilot.cost.acceptance import MAX_RANK, RankProfile
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import MAX_DRAFT_LENGTH, Chain
from specpilot.runtime.sequoia import RankTrace, best_tree, profile_from_trace
from specpilot.runtime.tree_plan import TreePlan

ACCEPT_MODES = ("none", "chain")
PRICING = ("one round = drafter(B, catch-up width) + drafter(B, width) per tree level but the last "
           "+ target verification (+ accept/commit with --accept chain); chain and trees alike, "
           "never a measured graphed round; a tree of N nodes verifies at the causal "
           "target(B, N + 1); an unmeasured width is padded to the next measured one or split "
           "into measured ones (an upper bound); cost per round in plain steps = seconds per "
           "round / target(B, 1); x plain AR = the lock-step batch replay's AR seconds / "
           "speculative seconds (bench/replay.py)")


def load_rank_profile(path: str) -> RankProfile:
    """The rank profile at `path` (RankProfile.from_json); SpecPilotError naming the file for
    anything else, a chain profile included."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecPilotError(f"cannot read rank profile {path!r}: {exc}") from None
    return RankProfile.from_json(obj, f"{path} (a compile run's acceptance.json is one)")


class PricedCosts(StoredForwards):
    """The stored step costs, with every missing piece priced from stored per-width costs and
    logged (`take_log`); never a measured graphed round (`has_round` is always False)."""

    def __init__(self, costs: StepCosts, chain: Chain, accept: str):
        super().__init__(costs)
        self.chain, self.accept_mode = chain, accept

    def accept(self, batch: int, topology) -> float:
        if self.accept_mode == "none":
            return super().accept(batch, topology)
        seconds = self.costs.accept(batch, self.chain)
        if topology != self.chain:
            self.log["accept/commit"] = (f"stored eager {self.chain} accept/commit at batch "
                                         f"{batch} (none stored for {topology})")
        return seconds


def pick_tree(profile, size: int, max_depth: int, priced: PricedCosts, batch: int):
    """(topology, model tokens/round, priced seconds/round) of the Sequoia tree of at most
    `size` nodes with the most expected tokens per priced second at `batch` (runtime/sequoia.py
    `best_tree`, each candidate priced as bench/replay.py prices a round, catch-up at its full
    depth + 1); None when the profile accepts nothing."""
    def seconds(topology):
        plan = TreePlan.build(topology)
        return spec_step_seconds(priced, batch, topology, plan, plan.shape.max_depth + 1)

    chosen = best_tree(profile, seconds, size, max_depth)
    priced.take_log()  # selection pricing is not a row's
    return chosen


def replay_row(system: str, topology, ranks: RankProfile, priced: PricedCosts,
               batch: int) -> dict:
    fig = replay(ranks.to_profile(topology), priced, batch)
    priced_from = priced.take_log()
    plain = priced.costs.target(batch, 1)
    per_round = fig.spec_seconds / fig.spec_steps
    return {"system": system, "batch_size": batch, "topology": str(topology),
            "nodes": topology.num_nodes, "depth": topology.depth,
            "level_widths": list(topology.level_widths()),
            "tokens_per_round": fig.mean_accepted,
            "cost_per_round_steps": per_round / plain, "cost_per_round_ms": per_round * 1e3,
            "plain_step_ms": plain * 1e3, "speedup_vs_ar": fig.speedup,
            "rounds": fig.spec_steps, "ar_steps": fig.ar_steps, "tokens": fig.tokens,
            "requests": fig.requests, "label": ESTIMATE_LABEL, "priced_from": priced_from}


def run(args) -> dict:
    ranks = load_rank_profile(args.ranks)
    costs, doc = read_step_costs(args.step_costs)
    chain = Chain(args.chain)
    stored_batches = sorted(costs.target_costs)
    batches = args.batch_sizes or stored_batches
    check_batches(costs, batches, stored_batches, args.step_costs)
    if args.accept == "chain" and any(b not in costs.accept_costs.get(str(chain), {})
                                      for b in batches):
        raise SpecPilotError(f"{args.step_costs} stores no {chain} accept/commit cost at every "
                             f"batch: use --accept none")
    shape_on, replay_on = ranks, ranks
    if args.holdout:
        if len(ranks.ranks) < 2:
            raise SpecPilotError(f"{args.ranks}: --holdout needs at least 2 requests")
        pick = lambda parity: RankProfile(ranks.ranks[parity::2], ranks.new_tokens[parity::2],
                                          ranks.source)
        shape_on, replay_on = pick(0), pick(1)
    max_depth = min(args.max_depth or max(args.sizes), MAX_DRAFT_LENGTH)
    profile = profile_from_trace(RankTrace(tuple(tuple(r) for r in shape_on.ranks)),
                                 max_depth, MAX_RANK)
    priced = PricedCosts(costs, chain, args.accept)
    rows = []
    for b in batches:
        chain_row = replay_row(str(chain), chain, replay_on, priced, b)
        rows.append(chain_row)
        for size in args.sizes:
            system = f"sequoia-{size}"
            chosen = pick_tree(profile, size, max_depth, priced, b)
            if chosen is None:
                rows.append({"system": system, "batch_size": b, "status": "no tree",
                             "why": "the profile accepts no draft at any depth: no tree beats "
                                    "plain decoding", "label": ESTIMATE_LABEL})
                continue
            topology, model_tokens, _ = chosen
            row = replay_row(system, topology, replay_on, priced, b)
            row["budget"] = size
            row["model_tokens_per_round"] = model_tokens
            row["tokens_per_round_vs_chain"] = row["tokens_per_round"] / chain_row[
                "tokens_per_round"]
            row["speedup_vs_chain"] = row["speedup_vs_ar"] / chain_row["speedup_vs_ar"]
            rows.append(row)
    checks = round_checks(costs, replay_on, priced, batches)
    return {"label": ESTIMATE_LABEL, "kind": "sequoia-replay",
            "environment": environment("cpu", [sys.argv[0], *args.argv]),
            "settings": {"ranks": args.ranks, "step_costs": args.step_costs,
                         "sizes": list(args.sizes), "chain": args.chain,
                         "batch_sizes": list(batches), "max_depth": max_depth,
                         "accept": args.accept, "holdout": args.holdout},
            **measured_on(doc),
            "profile": {"requests_shaped_on": len(shape_on.ranks),
                        "requests_replayed": len(replay_on.ranks),
                        "source": ranks.source,
                        "p_top1_by_depth": [row[0] for row in profile.p]},
            "pricing": PRICING, "rows": rows, "round_check": checks}


def round_checks(costs: StepCosts, ranks: RankProfile, priced: PricedCosts,
                 batches: Sequence[int]) -> List[dict]:
    """For every static topology with a measured graphed round stored: that round beside the
    round this script's pricing gives it on these ranks (how far the pricing is off, per
    topology), and for a tree its stored tree-mask verification beside the causal forward."""
    out = []
    for name, by_batch in sorted(costs.round_costs.items()):
        topology = topology_from_key(name)
        if topology is None:
            continue
        for b in batches:
            if b not in by_batch:
                continue
            fig = replay(ranks.to_profile(topology), priced, b)
            priced.take_log()
            check = {"topology": name, "batch_size": b,
                     "measured_graphed_round_ms": by_batch[b] * 1e3,
                     "priced_round_ms": fig.spec_seconds / fig.spec_steps * 1e3}
            check["measured_over_priced"] = (check["measured_graphed_round_ms"]
                                             / check["priced_round_ms"])
            if b in costs.tree_costs.get(name, {}):
                check["stored_tree_verify_ms"] = costs.tree_costs[name][b] * 1e3
                check["priced_verify_ms"] = priced.verify(b, topology) * 1e3
                priced.take_log()
            out.append(check)
    return out


def _table(rows: Sequence[dict]) -> str:
    lines = [f"{'batch':>5} {'system':<12} {'tree':<10} {'tok/round':>9} {'cost/round':>10} "
             f"{'x AR':>6}"]
    for r in rows:
        if r.get("status") == "no tree":
            lines.append(f"{r['batch_size']:>5} {r['system']:<12} no tree")
            continue
        tree = f"{r['nodes']}n/d{r['depth']}"
        lines.append(f"{r['batch_size']:>5} {r['system']:<12} {tree:<10} "
                     f"{r['tokens_per_round']:>9.3f} {r['cost_per_round_steps']:>10.3f} "
                     f"{r['speedup_vs_ar']:>6.3f}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", required=True, help="rank profile JSON (specpilot-rank-profile)")
    p.add_argument("--step-costs", required=True, help="a `specpilot bench --shapes` result JSON")
    p.add_argument("--sizes", type=positive_counts, default=[8, 16],
                   help="tree node budgets, e.g. 8,16")
    p.add_argument("--chain", type=int, default=4, help="the chain to compare with (default 4)")
    p.add_argument("--batch-sizes", type=positive_counts, default=None,
                   help="default: every batch size the step costs hold")
    p.add_argument("--max-depth", type=int, default=None,
                   help="deepest tree considered (default: the largest budget)")
    p.add_argument("--accept", choices=ACCEPT_MODES, default="none",
                   help="accept/commit: counted for no system, or the stored chain's for all")
    p.add_argument("--holdout", action="store_true",
                   help="shape on even-numbered requests, replay on odd-numbered ones")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.max_depth is not None and args.max_depth < 1:
        p.error(f"--max-depth must be at least 1, got {args.max_depth}")
    args.argv = argv
    return write_estimate(run, args, _table)


if __name__ == "__main__":
    sys.exit(main())
