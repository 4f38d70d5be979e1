"""How the adaptive length rule's prices of its rounds compare with what the rounds really cost
in its decoder, and what the rule does with each price.

The rule (runtime/batch_length.py) picks each round's length, and turns speculation off for good,
from the cost of a round of every length L = 0..k in plain steps. A decoder times those rounds
once, at its first call (`measure_round_costs`: best of a few replays with every row inactive).
Per batch size this script measures:

- true costs: fixed-length decoders (plain AR, and chain(L) for L = 1..k) decode the workload,
  interleaved, each call split into phases (specpilot/bench/phase_clock.py); a length's cost is
  its rounds phase per round over plain AR's per step;
- captured costs: what an adaptive decoder measured at its first call;
- inactive / active costs: the same replays timed again by the decoder's own timing, every row
  inactive (as the decoder does) or active at `--context` positions;

and saves the fixed chain(k)'s acceptance profile (`<out>.b<batch>.chain<k>.acceptance.json`, for
replaying the rule on this workload: specpilot/bench/adaptive_replay.py; written as each batch
size is done, so a run cut short keeps the profiles of the batch sizes it finished). It then runs adaptive
decoders priced each way interleaved with plain AR, and two more whose workload
memory judges remembered requests at their mean acceptance rather than at an upper bound: ×
plain AR (median and mean of the calls), which calls the memory started off, and the rounds of
each length.

  python3 bench/round_cost_truth.py --pair /tmp/specpilot-pair --out bench/results/round-cost-truth.json
Off a GPU it runs uncaptured in float32 (to check the script, with --scale).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List

from specpilot.bench.decode_models import add_model_arguments, decode_models
from specpilot.bench.environment import environment
from specpilot.bench.phase_clock import PhaseClock, one_call, sync
from specpilot.bench.replay import AcceptanceProfile
from specpilot.cli_common import positive_counts
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.topology import Chain
from specpilot.runtime.batch_length import measure_round_costs
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.workload_memory import WorkloadMemory
from specpilot.search.run_folder import write_json_atomic

WARM_CALLS = 3      # before timing: capture, and (adaptive) the workload memory learns


def rounds_run(result) -> int:
    return sum(v for name, v in result.stats.items() if name.startswith("rounds_chain_"))


def timed_costs(replays: Dict[int, Callable[[], None]], reset: Callable[[], None],
                repeats: int = 5) -> List[float]:
    """cost(L) over cost(0) for each length in `replays`: best of `repeats` wall-clock timed
    replays after `reset` and one untimed replay (works captured or eager)."""
    best = {}
    for n, replay in sorted(replays.items()):
        reset()
        replay()
        times = []
        for _ in range(repeats):
            sync()
            t0 = time.perf_counter()
            replay()
            sync()
            times.append(time.perf_counter() - t0)
        best[n] = min(times)
    reset()
    return [best[n] / best[0] for n in sorted(best)]


def true_costs(target, drafter, prompts, eos, capacity, k, new, calls, graphs):
    """(cost per length over plain AR's step, ms per round per length, rounds per length, the
    chain(k) decoder's acceptance profile) from fixed-length decoders' rounds phases,
    interleaved."""
    batch = len(prompts)
    fixed = {n: GraphedChainDecoder(target, drafter if n else None, batch, capacity, n, eos,
                                    capture=graphs) for n in range(k + 1)}
    rounds, last = {}, None
    for n, dec in fixed.items():
        for _ in range(WARM_CALLS - 1):
            last = dec.generate(prompts, new)
            rounds[n] = rounds_run(last)
    ms = {n: [] for n in fixed}
    clock = PhaseClock()
    for _ in range(calls):
        for n, dec in fixed.items():
            ms[n].append(one_call(dec, prompts, new, clock)[1]["rounds"] * 1e3 / rounds[n])
    per_round = {n: statistics.median(v) for n, v in ms.items()}
    chain = AcceptanceProfile(Chain(k), last.accepted_lengths, [len(t) for t in last.tokens],
                              {"system": f"fixed chain({k}), round_cost_truth", "batch_size": batch})
    return [per_round[n] / per_round[0] for n in fixed], per_round, rounds, chain


def interleaved(decoders: Dict[str, GraphedChainDecoder], prompts, new, calls) -> List[dict]:
    """Whole calls of every decoder in turn; rows × the first decoder (plain AR). Each row also
    keeps its warm-up calls' rounds per length and, for an adaptive decoder, what its workload
    memory holds at the end (each remembered request's accepted drafts and rejections, the
    acceptance its batch's first turn-off decision judged it by): whether, and where, its
    speculating batches turned off."""
    warm_ups, seconds = {name: [] for name in decoders}, {name: [] for name in decoders}
    started_off = {name: [] for name, d in decoders.items() if d.policy is not None}
    for name, dec in decoders.items():
        for _ in range(WARM_CALLS):
            warm_ups[name].append(dict(dec.generate(prompts, new).stats))
    for _ in range(calls):
        for name, dec in decoders.items():
            seconds[name].append(one_call(dec, prompts, new)[0])
            if name in started_off:
                started_off[name].append(dec.first_length == 0)
    rows = []
    for name in decoders:
        rows.append({"system": name, "call_ms": [s * 1e3 for s in seconds[name]],
                     "call_ms_median": statistics.median(seconds[name]) * 1e3,
                     "call_ms_mean": statistics.fmean(seconds[name]) * 1e3,
                     "warm_up_stats": warm_ups[name],
                     **({"calls_started_off": started_off[name],
                         "memory": _memory(decoders[name].policy.memory)}
                        if name in started_off else {})})
    # tokens/s ratios where every decoder makes the same tokens: always with random weights;
    # on a trained pair in bf16 a near-tie may flip a token between decoders
    for row in rows:
        row["x_plain_ar"] = rows[0]["call_ms_median"] / row["call_ms_median"]
        row["x_plain_ar_mean"] = rows[0]["call_ms_mean"] / row["call_ms_mean"]
    return rows


def _memory(memory) -> dict:
    return {"counts": [list(c) for c in memory.counts], "first_judged": memory.first_judged,
            "explore_after": memory.explore_after}


def capacity_for(longest: int, args) -> int:
    """Cache slots of every decoder here: the longest prompt, the new tokens and two rounds."""
    return longest + args.new_tokens + 2 * args.k + 2


def one_batch(args, target, drafter, prompts, eos, graphs) -> dict:
    batch, k, new = len(prompts), args.k, args.new_tokens
    longest = max(len(p) for p in prompts)
    capacity = capacity_for(longest, args)
    context = args.context or longest + new // 2
    truth, per_round, rounds, chain = true_costs(target, drafter, prompts, eos, capacity, k,
                                                 new, args.calls, graphs)
    # The fixed chain's acceptance, for replaying the length rule on this very workload.
    profile = Path(args.out).with_suffix(f".b{batch}.chain{k}.acceptance.json")
    write_json_atomic(profile, chain.to_json())
    captured = GraphedChainDecoder(target, drafter, batch, capacity, k, eos, capture=graphs,
                                   adaptive=True)
    captured.generate(prompts, new)             # times its rounds at the first call
    replays = {n: captured._runner(False, n) for n in sorted({0, *captured._lengths()})}
    # On a GPU the decoder's own timing (CUDA events), so that "active" is what the decoder
    # would price with an active reset; off a GPU, wall-clock timing.
    timer = ((lambda reset: measure_round_costs(replays, reset, captured.device)) if graphs
             else (lambda reset: timed_costs(replays, reset)))
    costs = {"true": truth, "captured": captured.policy.round_cost_host.tolist(),
             "inactive": timer(captured._reset),
             "active": timer(lambda: captured.reset_all_active(context))}
    for name, values in costs.items():
        print(f"batch {batch:3d} {name:9s} costs " + " ".join(f"{c:.3f}" for c in values),
              flush=True)
    decoders = {"plain AR": GraphedChainDecoder(target, None, batch, capacity, 0, eos,
                                                capture=graphs),
                "adaptive, captured costs": captured}
    for name in ("true", "active"):
        decoders[f"adaptive, {name} costs"] = GraphedChainDecoder(
            target, drafter, batch, capacity, k, eos, capture=graphs, adaptive=True,
            round_costs=costs[name])
    # The workload memory judging each remembered request at its mean acceptance, not at the
    # upper bound the batch rule turns off by (runtime/workload_memory.py).
    for name in ("captured", "true"):
        dec = GraphedChainDecoder(target, drafter, batch, capacity, k, eos, capture=graphs,
                                  adaptive=True, round_costs=costs[name])
        dec.policy.memory = WorkloadMemory(confidence=0.0)
        decoders[f"adaptive, {name} costs, memory at the mean"] = dec
    rows = interleaved(decoders, prompts, new, args.calls)
    for r in rows:
        off = r.get("calls_started_off")
        print(f"batch {batch:3d} {r['system']:44s} {r['x_plain_ar']:.4f}x "
              f"(mean {r['x_plain_ar_mean']:.4f}x)"
              + (f"  started off {sum(off)} of {len(off)}" if off is not None else "")
              + f"  warm-ups {r['warm_up_stats']}", flush=True)
    return {"batch": batch, "context": context, "capacity": capacity,
            "chain_profile": profile.name,
            "ms_per_round": {str(n): v for n, v in per_round.items()},
            "rounds": {str(n): v for n, v in rounds.items()}, "costs": costs, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    ap.add_argument("--batch-sizes", type=positive_counts, default=[4, 16, 64])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--calls", type=int, default=8, help="timed calls of each decoder")
    ap.add_argument("--context", type=int, default=0,
                    help="positions before the active timing (default: the longest prompt + "
                         "half the new tokens)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    batches = args.batch_sizes
    if min(args.k, args.new_tokens, args.calls) < 1 or args.context < 0:
        ap.error("--k, --new-tokens and --calls must be at least 1, --context at least 0")
    try:
        target, drafter, prompts, eos, graphs = decode_models(args, max(batches))
    except SpecPilotError as exc:
        ap.error(str(exc))
    for b in batches:       # before any GPU work: the active timing's context must fit
        longest = max(len(p) for p in prompts[:b])
        if args.context and args.context + 2 * (args.k + 1) > capacity_for(longest, args):
            ap.error(f"--context {args.context} does not fit batch {b}'s cache of "
                     f"{capacity_for(longest, args)} slots with rounds of {args.k} drafts")
    results = [one_batch(args, target, drafter, prompts[:b], eos, graphs) for b in batches]
    doc = {"environment": environment(target.device.type), "settings": vars(args),
           "batches": results}
    write_json_atomic(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
