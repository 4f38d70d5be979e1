"""How the adaptive length rule's prices of its rounds compare with what the rounds really cost
in its decoder, and what the rule does with each price.

The rule (runtime/batch_length.py) picks each round's length, and turns speculation off for good,
from the cost of a round of every length L = 0..k in plain steps. A decoder times those rounds
once, at its first call (`measure_round_costs`: best of a few replays with every row inactive at
the call's typical context, `GraphedChainDecoder.timing_context`).
Per batch size this script measures:

- true costs: fixed-length decoders (plain AR, and chain(L) for L = 1..k) decode the workload,
  interleaved, each call split into phases (specpilot/bench/phase_clock.py); a length's cost is
  its rounds phase per round over plain AR's per step;
- captured costs: what an adaptive decoder measured at its first call;
- inactive / active costs: the same replays timed again by the decoder's own timing, every row
  inactive at the call's typical context (as the decoder does) or active at `--context`
  positions;

and saves the fixed chain(k)'s acceptance profile (`<out>.b<batch>.chain<k>.acceptance.json`,
for replaying the rule on this workload: specpilot/bench/adaptive_replay.py; written as each
batch size is done, so a run cut short keeps the profiles of the batch sizes it finished).
It then races, interleaved in whole calls against plain AR: the adaptive decoder as it runs,
the same with its length update eager rather than compiled (what compiling it saves), the
rule at other smoothings of its acceptance averages (`--smoothings`), and the fixed chains.
Rows: × plain AR (median and mean of the calls), which calls the memory started off, every
warm-up's rounds per length, and what the memory holds at the end.

  python3 bench/round_cost_truth.py --pair /tmp/specpilot-pair \\
      --out bench/results/round-cost-truth.json
Off a GPU it runs uncaptured in float32 (to check the script, with --scale).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import List

from specpilot.bench.decode_models import (add_model_arguments, decode_models, decoder_capacity,
                                           mid_run_context)
from specpilot.bench.decoder_race import WARM_CALLS, add_race_arguments, phase_race, race
from specpilot.bench.environment import environment
from specpilot.bench.replay import AcceptanceProfile
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain
from specpilot.runtime.adaptive_draft import SMOOTHING
from specpilot.runtime.batch_length import measure_round_costs
from specpilot.runtime.errors import CapacityError
from specpilot.runtime.graphed_chain import GraphedChainDecoder, check_timing_context
from specpilot.search.run_folder import write_json_atomic


def smoothings(text: str) -> List[float]:
    """Comma-separated weights in (0, 1] (none for an empty string)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated numbers: {text!r}") from None
    if any(not 0.0 < v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"each smoothing must be in (0, 1], got {text!r}")
    if len(set(values)) < len(values) or SMOOTHING in values:
        raise argparse.ArgumentTypeError(f"{text!r}: each once, and not the rule's own "
                                         f"{SMOOTHING:g} (that is the row \"adaptive\")")
    return values


def true_costs(target, drafter, prompts, eos, capacity, k, new, calls, graphs):
    """(ms per round per length, rounds per length, the chain(k) decoder's acceptance profile,
    the fixed-length decoders {L: decoder} (plain AR's at 0), their warm-up calls {L: results})
    from fixed-length decoders' rounds phases, interleaved."""
    batch = len(prompts)
    fixed = {n: GraphedChainDecoder(target, drafter if n else None, batch, capacity, n, eos,
                                    capture=graphs) for n in range(k + 1)}
    warm, _, rounds, per_round = phase_race(fixed, prompts, new, calls)
    last = warm[k][-1]
    source = {"system": f"fixed chain({k}), round_cost_truth", "batch_size": batch}
    chain = AcceptanceProfile(Chain(k), last.accepted_lengths, [len(t) for t in last.tokens],
                              source)
    return per_round, rounds, chain, fixed, warm


def price_rounds(args, target, drafter, prompts, eos, graphs, capacity):
    """The true, captured and re-timed costs of each length at this batch, the fixed chain's
    profile saved; returns (the batch's figures, the fixed-length decoders {L: decoder},
    their warm-up calls {L: results})."""
    batch, k, new = len(prompts), args.k, args.new_tokens
    context = args.context or mid_run_context(prompts, new)
    per_round, rounds, chain, fixed, warm = true_costs(target, drafter, prompts, eos, capacity,
                                                       k, new, args.calls, graphs)
    truth = [per_round[n] / per_round[0] for n in fixed]
    # The fixed chain's acceptance, for replaying the length rule on this very workload.
    profile = Path(args.out).with_suffix(f".b{batch}.chain{k}.acceptance.json")
    write_json_atomic(profile, chain.to_json())
    captured = GraphedChainDecoder(target, drafter, batch, capacity, k, eos, capture=graphs,
                                   adaptive=True)
    captured.generate(prompts, new)             # times its rounds at the first call
    replays = captured.round_replays()
    costs = {"true": truth, "captured": captured.policy.round_cost_host.tolist(),
             "inactive": captured.time_round_costs(prompts, [new] * len(prompts)),
             "active": measure_round_costs(replays, lambda: captured.reset_all_active(context),
                                           captured.device)}
    for name, values in costs.items():
        print(f"batch {batch:3d} {name:9s} costs " + " ".join(f"{c:.3f}" for c in values),
              flush=True)
    figures = {"batch": batch, "context": context, "capacity": capacity,
               "chain_profile": profile.name,
               "ms_per_round": {str(n): v for n, v in per_round.items()},
               "rounds": {str(n): v for n, v in rounds.items()}, "costs": costs}
    return figures, fixed, warm


def race_adaptive(args, target, drafter, prompts, eos, graphs, capacity, fixed, fixed_warm,
                  captured_costs):
    """The adaptive decoder as it runs (the costs it captured, its length update compiled where
    it is captured), the same with the update eager (what compiling it saves), with the moving
    averages' smoothing at each of `--smoothings`, and the fixed chains, raced against plain
    AR in whole calls. Every adaptive decoder is new here: their workload memories start
    alike. The fixed decoders were warmed up by `true_costs` (`fixed_warm`)."""
    batch, k = len(prompts), args.k

    def adaptive(**options):
        return GraphedChainDecoder(target, drafter, batch, capacity, k, eos, capture=graphs,
                                   adaptive=True, round_costs=captured_costs, **options)
    decoders = {"plain AR": fixed[0], "adaptive": adaptive(),
                "adaptive, eager length update": adaptive(compile_policy=False)}
    decoders.update({f"adaptive, smoothing {s:g}": adaptive(smoothing=s)
                     for s in args.smoothings})
    decoders.update({f"chain({n})": fixed[n] for n in range(1, k + 1)})
    warmed = {"plain AR": fixed_warm[0], **{f"chain({n})": fixed_warm[n] for n in range(1, k + 1)}}
    rows = race(decoders, prompts, args.new_tokens, args.calls, WARM_CALLS, warmed)
    for r in rows:
        off = r.get("calls_started_off")
        print(f"batch {batch:3d} {r['system']:32s} {r['x_plain_ar']:.4f}x "
              f"(mean {r['x_plain_ar_mean']:.4f}x)"
              + (f"  started off {sum(off)} of {len(off)}" if off is not None else "")
              + f"  warm-ups {r['warm_up_stats']}", flush=True)
    return rows


def one_batch(args, target, drafter, prompts, eos, graphs) -> dict:
    capacity = decoder_capacity(prompts, args.new_tokens, args.k)
    figures, fixed, warm = price_rounds(args, target, drafter, prompts, eos, graphs, capacity)
    figures["rows"] = race_adaptive(args, target, drafter, prompts, eos, graphs, capacity, fixed,
                                    warm, figures["costs"]["captured"])
    return figures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_race_arguments(ap, calls=8)
    ap.add_argument("--context", type=int, default=0,
                    help="positions before the active timing (default: the longest prompt + "
                         "half the new tokens)")
    ap.add_argument("--smoothings", type=smoothings, default=[0.1, 0.2],
                    help="moving-average weights on the newest round to race the adaptive "
                         "rule at beside its own (runtime/adaptive_draft.py); '' for none")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    batches = args.batch_sizes
    if args.context < 0:
        ap.error("--context must be at least 0")
    try:
        target, drafter, prompts, eos, graphs = decode_models(args, max(batches))
    except SpecPilotError as exc:
        ap.error(str(exc))
    for b in batches if args.context else ():   # before any decoding: the context must fit
        try:
            check_timing_context(args.context, args.k,
                                 decoder_capacity(prompts[:b], args.new_tokens, args.k))
        except CapacityError as exc:
            ap.error(f"--context, batch {b}: {exc}")
    results = [one_batch(args, target, drafter, prompts[:b], eos, graphs) for b in batches]
    doc = {"environment": environment(target.device.type), "settings": vars(args),
           "batches": results}
    write_json_atomic(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
