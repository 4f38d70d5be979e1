"""The ragged verification layout with per-request adaptive draft lengths against the padded
layouts, at a stored shape pair, replayed acceptance: for each batch size of a `specpilot bench
--shapes` result, a chain(k) acceptance profile replayed three ways in the same lock-step batches
and priced round by round from the stored per-width step costs.

  python3 bench/ragged_replay.py \\
      --acceptance bench/results/mechanisms-run14-64prompts.acceptance.stock_graphed.json \\
      --step-costs bench/results/llama8b-1b-replayed-run6-adaptive.json \\
      --out /tmp/ragged-replay.json

Every figure is an ESTIMATE from stored per-width costs, not a measured round of any system: a
measured graphed round is never used for a row, so the three systems are priced like for like.
Requests are cycled into batches of B that run in lock step until the batch's slowest request is
done (bench/replay.py `cycled_batches`; no refill, prefills excluded). Systems:

  padded chain(k)    bench/replay.py's `replay` of the profile itself: each round = drafter(B,
                     catch-up) + (k - 1) drafter(B, 1) + target(B, k + 1);
  padded adaptive    each request's draft length L_i from its own recent acceptance, the batch
                     within a token budget (runtime/adaptive_draft.py `AdaptiveChainProposer.
                     lengths`: `best_lengths` then `fit_budget`, called here as the eager runtime
                     calls it, on the requests still decoding; `observe` updates each request's
                     averages), laid out padded: every one of the B rows (finished ones too, as
                     pads) runs drafter(B, widest catch-up) + (max L_i - 1) drafter(B, 1) levels
                     + target(B, max L_i + 1);
  ragged adaptive    the same requests, lengths and accepted drafts (the rule does not depend on
                     the layout), laid out ragged: each forward packs the real tokens of the rows
                     that have any, nothing else: catch-up sum_i (a_i + 1) over the R active rows,
                     drafting level d the rows with L_i > d (1 token each, as
                     runtime/tree_drafting.py `expand_static` feeds only rows with children),
                     verification sum_i (L_i + 1).

Pricing a packed forward of T tokens over R rows (a ragged forward) from stored causal
forwards: who(R', ceil(T / R')) with R' the smallest stored batch >= R. That stored forward does
at least as much of every kind of work: it streams the weights once (as the packed forward does),
pushes R' ceil(T / R') >= T tokens through the linears, computes >= as many query-key pairs in
attention (R' ceil(T/R') queries against the stored context, the packed forward's T queries
against theirs) and reads the KV cache of R' >= R rows. So it is an upper bound ON WORK. It is
OPTIMISTIC about the implementation: it assumes a ragged forward as efficient per unit of work as
the stored CUDA-graphed padded forward (a varlen attention kernel whose uneven rows tile as well
as even ones, packed GEMMs, graphs), while the repository's ragged runtime is eager (host packing
in Python, a dense [T, B * S] mask built per forward: runtime/batch_layout.py `_run_ragged`), and
it ignores that attention per row differs (one long row next to short ones). Where noise in the
stored costs (not monotone in width or batch) would price a packed forward above the padded
forward of the same round, which does strictly more work, it is capped at that padded price; every
packing, cap and padding of a batch is logged per row under "priced_from".

Replaying another length from a chain(k) profile (specpilot/bench/adaptive_replay.py
`agreement_maps`, `streak`): a greedy drafter's draft at a position depends only on the committed
prefix, so a round of L drafts from position s accepts the agreeing positions in a row there, up
to L. A position right after a fully accepted chain was never drafted: `--bound pessimistic`
counts it wrong, `optimistic` right, `both` (default) replays both; the truth lies between as long
as more agreement never makes the per-request rule choose worse (its intent, not a theorem). The
padded chain(k) replays exactly either way.

Token budget (`--token-budget`): `ridge` (default) sets it per batch size as
`mech:ragged_adaptive_refill` does (specpilot/bench/mechanism_programs.py
`BudgetedProgramSystem.at_batch`: min(B (k + 1), max(B, the target's compute ridge on the stored
GPU, specpilot/agents/batching.py `ridge_budget`)), computed for the stored shape presets); `full`
is B (k + 1) (no cap); a number caps every batch size at it. Accept/commit is counted for no
system (on the device in a graphed round; only the eager chain's host loop is stored).

"x plain AR" divides by padded plain AR of the same batches (one target(B, 1) step per token of a
batch's longest request). In lock step a batch lasts as many rounds as its slowest request needs,
so at large B one poorly drafted request sets every system's round count; the ragged layout then
prices the tail rounds at the few rows still decoding, the padded ones at all B. The ragged rows
also give ragged AR (each AR step packed over its active rows, priced as above), so that what
ragged gains only from finished rows leaving the forward is visible on the AR side too.
"round_check" lists each stored measured graphed chain(L) round beside the padded round this
pricing gives it (widest catch-up): how far summed forwards are from a captured round.

The replay is specpilot/bench/request_adaptive_replay.py's, the packed pricing
specpilot/bench/stored_forwards.py's `PackedCosts`; this script reads, runs and writes.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from specpilot.agents.batching import ridge_capped_budget
from specpilot.bench.adaptive_replay import READINGS
from specpilot.bench.environment import environment
from specpilot.bench.estimate_io import (ESTIMATE_LABEL, check_batches, measured_on,
                                         write_estimate)
from specpilot.bench.replay import AcceptanceProfile, ProfileError, replay
from specpilot.bench.request_adaptive_replay import Round, adaptive_rows, padded_round_seconds
from specpilot.bench.step_costs import StepCosts, read_step_costs, topology_from_key
from specpilot.bench.stored_forwards import PackedCosts
from specpilot.cli_common import positive_counts
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain
from specpilot.runtime.adaptive_draft import DRAFT_STEP_COST

PRICING = ("sum of stored per-width forwards, never a measured graphed round; padded: every "
           "forward over all B rows at the widest row's width (catch-up = widest previous "
           "commit, max L - 1 drafter(B, 1) levels, target(B, max L + 1)); ragged: a packed "
           "forward of T tokens over R rows priced as the stored who(R', ceil(T / R')), R' the "
           "smallest stored batch >= R, capped at the padded forward of the same round; an "
           "unmeasured width is padded to the next measured one or split into measured ones (an "
           "upper bound); accept/commit not counted; cost per round in plain steps = seconds "
           "per round / target(B, 1); x plain AR = padded AR seconds of the same batches / "
           "speculative seconds")


def budget_for(spec, batch: int, k: int, ridge: Dict[int, Optional[int]]) -> int:
    """The token budget `spec` ("full", "ridge" or a number) at `batch`."""
    if spec == "full":
        return batch * (k + 1)
    if spec == "ridge":
        return ridge_capped_budget(batch, k, ridge.get(batch))
    return spec


def ridge_budgets(doc: dict, path: str, batches: Sequence[int], context: int) -> Dict[int, int]:
    """The target's compute ridge (specpilot/agents/batching.py `ridge_budget`) at each batch
    size, for the shape presets and GPU the step costs were measured with."""
    from specpilot.agents.batching import ridge_budget
    from specpilot.bench.shapes import preset_deployment
    from specpilot.cost.gpu_specs import UnknownGpu, gpu_key
    from specpilot.ir.stock import stock_program

    settings = doc.get("settings") or {}
    gpu_name = (doc.get("environment") or {}).get("gpu")
    try:
        gpu = gpu_key(str(gpu_name))
        scale, dtype = float(settings.get("scale", 1.0)), str(settings.get("dtype", "bfloat16"))
        program = stock_program(preset_deployment(str(settings.get("shapes")), gpu, scale,
                                                  dtype, "replay"))
    except (SpecPilotError, UnknownGpu, ValueError, TypeError) as exc:
        raise SpecPilotError(f"{path}: --token-budget ridge needs the shape presets and GPU the "
                             f"step costs were measured with ({exc}); use --token-budget full or "
                             f"a number") from None
    return {b: ridge_budget(replace(program, batch=replace(program.batch, max_batch_size=b)),
                            context) for b in batches}


def chain_row(profile: AcceptanceProfile, priced: PackedCosts, batch: int) -> dict:
    fig = replay(profile, priced, batch)
    plain = priced.target(batch, 1)
    per_round = fig.spec_seconds / fig.spec_steps
    k = profile.topology.k
    return {"system": f"padded {profile.topology}", "batch_size": batch, "bound": "exact",
            "tokens_per_round": fig.mean_accepted, "mean_draft_length": float(k),
            "verified_tokens_per_round": float(batch * (k + 1)),
            "cost_per_round_steps": per_round / plain, "cost_per_round_ms": per_round * 1e3,
            "plain_step_ms": plain * 1e3, "speedup_vs_ar": fig.speedup,
            "rounds": fig.spec_steps, "ar_steps": fig.ar_steps, "tokens": fig.tokens,
            "requests": fig.requests, "label": ESTIMATE_LABEL, "priced_from": priced.take_log()}


def round_checks(costs: StepCosts, priced: PackedCosts, batches: Sequence[int]) -> List[dict]:
    """For every chain with a measured graphed round stored: that round beside the padded round
    this script's pricing gives it with the widest catch-up (L + 1): how far summed forwards
    are from a captured round, per batch size."""
    out = []
    for name, by_batch in sorted(costs.round_costs.items()):
        topology = topology_from_key(name)
        if not isinstance(topology, Chain):
            continue
        length = topology.k
        for b in batches:
            if b not in by_batch:
                continue
            seconds = padded_round_seconds(priced, Round(b, (length,), (length + 1,)))
            priced.take_log()
            out.append({"topology": name, "batch_size": b,
                        "measured_graphed_round_ms": by_batch[b] * 1e3,
                        "priced_round_ms": seconds * 1e3,
                        "measured_over_priced": by_batch[b] / seconds})
    return out


def load_profile(path: str) -> AcceptanceProfile:
    profile = AcceptanceProfile.load(path)
    if not isinstance(profile.topology, Chain):
        raise ProfileError(f"{path}: per-request lengths are replayed from a chain profile, not "
                           f"{profile.topology}")
    return profile


def run(args) -> dict:
    profile = load_profile(args.acceptance)
    costs, doc = read_step_costs(args.step_costs)
    k = profile.topology.k
    stored = sorted(set(costs.target_costs) & set(costs.drafter_costs))
    batches = args.batch_sizes or stored
    check_batches(costs, batches, stored, args.step_costs)
    if isinstance(args.token_budget, int) and args.token_budget < max(batches):
        raise SpecPilotError(f"--token-budget {args.token_budget} is below batch size "
                             f"{max(batches)}: every request verifies at least its root")
    ridge = (ridge_budgets(doc, args.step_costs, batches, costs.context)
             if args.token_budget == "ridge" else {})
    bounds = list(READINGS) if args.bound == "both" else [args.bound]
    priced = PackedCosts(costs)
    rows, summary = [], []
    for b in batches:
        budget = budget_for(args.token_budget, b, k, ridge)
        chain = chain_row(profile, priced, b)
        rows.append(chain)
        line = {"batch_size": b, "token_budget": budget,
                "chain_speedup_vs_ar": chain["speedup_vs_ar"]}
        for bound in bounds:
            padded, ragged = adaptive_rows(profile, priced, b, budget, args.draft_cost, bound,
                                           ESTIMATE_LABEL)
            rows += [padded, ragged]
            line[bound] = {"padded_adaptive_speedup_vs_ar": padded["speedup_vs_ar"],
                           "ragged_adaptive_speedup_vs_ar": ragged["speedup_vs_ar"],
                           "ragged_over_padded_adaptive": ragged["speedup_vs_padded_adaptive"],
                           "ragged_over_chain": ragged["speedup_vs_ar"] / chain["speedup_vs_ar"]}
        summary.append(line)
    return {"label": ESTIMATE_LABEL, "kind": "ragged-replay",
            "environment": environment("cpu", [sys.argv[0], *args.argv]),
            "settings": {"acceptance": args.acceptance, "step_costs": args.step_costs,
                         "batch_sizes": list(batches), "token_budget": args.token_budget,
                         "draft_cost": args.draft_cost, "bounds": bounds,
                         "ridge_budgets": {str(b): r for b, r in ridge.items()}},
            **measured_on(doc),
            "profile": {"topology": str(profile.topology),
                        "requests": len(profile.accepted_lengths),
                        "mean_accepted": profile.mean_accepted, "source": profile.source},
            "pricing": PRICING, "rows": rows, "summary": summary,
            "round_check": round_checks(costs, priced, batches)}


def _budget(text: str):
    if text in ("ridge", "full"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--token-budget takes ridge, full or a number, "
                                         f"got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"a token budget must be >= 1, got {text!r}")
    return value


def _draft_cost(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"--draft-cost must be finite and >= 0, got {text!r}")
    return value


def _table(rows: Sequence[dict]) -> str:
    lines = [f"{'batch':>5} {'system':<16} {'bound':<11} {'L':>4} {'tok/round':>9} "
             f"{'verified':>8} {'cost/round':>10} {'x AR':>6} {'/padded':>7}"]
    for r in rows:
        vs = r.get("speedup_vs_padded_adaptive")
        lines.append(f"{r['batch_size']:>5} {r['system']:<16} {r['bound']:<11} "
                     f"{r['mean_draft_length']:>4.2f} {r['tokens_per_round']:>9.3f} "
                     f"{r['verified_tokens_per_round']:>8.1f} {r['cost_per_round_steps']:>10.3f} "
                     f"{r['speedup_vs_ar']:>6.3f} " + (f"{vs:>7.3f}" if vs else ""))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--acceptance", required=True,
                   help="chain(k) acceptance profile JSON (specpilot-acceptance-profile)")
    p.add_argument("--step-costs", required=True, help="a `specpilot bench --shapes` result JSON")
    p.add_argument("--batch-sizes", type=positive_counts, default=None,
                   help="default: every batch size the step costs hold")
    p.add_argument("--token-budget", type=_budget, default="ridge",
                   help="ridge (as mech:ragged_adaptive_refill), full, or a number of tokens")
    p.add_argument("--draft-cost", type=_draft_cost, default=DRAFT_STEP_COST,
                   help=f"the length rule's drafter step cost relative to a verification "
                        f"(default {DRAFT_STEP_COST}, the runtime's)")
    p.add_argument("--bound", choices=[*READINGS, "both"], default="both",
                   help="drafts after a fully accepted chain, never shown by the profile: "
                        "counted wrong (pessimistic), right (optimistic), or both replays")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    args.argv = argv
    return write_estimate(run, args, _table)


if __name__ == "__main__":
    sys.exit(main())
