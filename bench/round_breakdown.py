"""Where a speculative round's time goes, piece by piece, and what a refill's admission costs.

Per batch size, for chain(k) with the drafter in fused kernels (runtime/fused_forward.py):

- device time of each piece captured alone as a CUDA graph (median of CUDA-event times):
  the drafter's k steps (`draft`), those and the target's verification (`draft_verify`), the
  whole round (`round`), so verify = draft_verify - draft and the acceptance and commit =
  round - draft_verify; beside them a plain step (`plain_round`), the round with the drafter as
  its model runs it, with adaptive lengths (the length policy's update included) and with
  refill's per-row log, and a plain step and the round with the target in fused kernels too;
  and the target's forward of 1 and k + 1 tokens alone, as its model
  runs it and in the fused kernels (runtime/fused_forward.py);
- the kernels each piece launches, run eagerly under torch.profiler (count, summed device time
  and the costliest names): what a piece's graph time is made of, kernels or the gaps between
  them;
- a refill's admission of a newcomer into one row (its results taken, both caches prefilled
  in the bucket's graph and copied into the row, the row's state set): host clock alone, and
  device time added to the round it is queued after (`added_ms`): what each of a refill
  decoder's newcomers costs besides its rounds, the newcomer prefilled beside the round at its
  admission (the default placement, runtime/row_prefill.py); and the same with the newcomer
  prefilled ahead, its prefill queued before the round and the admission only copying it
  (`added_ahead_ms`).

  python3 bench/round_breakdown.py --out bench/results/round-breakdown.json
  python3 bench/round_breakdown.py --pair /tmp/specpilot-pair --batch-sizes 16,64 --out FILE
  python3 bench/round_breakdown.py --target-kernels layers-attention --out FILE

Each decoder's round is timed once, after the others: differences of a few percent between
them are the order of the timings as much as the rounds (on an H200 the adaptive and refill
rounds came out 6-7 % dearer here, and within 1 % of the fixed chain's when raced side by side
by bench/round_variants.py; BENCHMARKS.md, twenty-fifth set). Compare decoders there.

Random weights by default (a round's cost does not depend on what it accepts: every piece
runs its fixed shapes). Off a GPU it runs uncaptured in float32 with Triton's interpreter,
without kernel lists (to check the script).
"""
from __future__ import annotations

import argparse
import os
from typing import Callable, Dict, List

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from specpilot.bench.decode_models import (add_model_arguments, decode_models,  # noqa: E402
                                           mid_run_context)
from specpilot.bench.decoder_race import add_race_arguments  # noqa: E402
from specpilot.bench.kernel_profile import kernel_profile  # noqa: E402
from specpilot.bench.script_rows import measure_rows  # noqa: E402
from specpilot.bench.step_costs import measure_forwards, time_median, timed_runs  # noqa: E402
from specpilot.ir.errors import SpecPilotError  # noqa: E402
from specpilot.runtime.cuda_graphs import capture_graph  # noqa: E402
from specpilot.runtime.fused_forward import FusedForward  # noqa: E402
from specpilot.runtime.graphed_chain import GraphedChainDecoder  # noqa: E402
from specpilot.runtime.graphed_refill import GraphedRefillDecoder  # noqa: E402
from specpilot.runtime.torch_backend import TorchBackend  # noqa: E402

WARMUP, REPEATS = 5, 40
TARGET_KERNELS = ("as-loaded", "layers-attention")
ADMIT_WARMUP, ADMIT_REPEATS = 3, 20    # fewer: each admission has host work to wait for
ADMIT_LIMIT = 64       # new tokens of an admitted newcomer (its state only; nothing decodes)


def round_pieces(dec: GraphedChainDecoder, k: int) -> Dict[str, Callable[..., object]]:
    """One round of `dec` (chain(k), every row active) cut into the pieces it runs, in order:
    `draft()` returns the drafts, `verify(drafts)` the target's argmaxes, `commit(drafts, g)`
    accepts and moves the state on: `dec._round(k)`'s three calls."""
    return {"draft": lambda: dec._draft(k), "verify": dec._verify,
            "commit": lambda drafts, g: dec._accept_and_commit(drafts, g, k)}


def graph_ms(fn: Callable[[], object], dec: GraphedChainDecoder, context: int,
             graphs: bool) -> float:
    """Median device ms of `fn` captured alone (eager off a GPU) from every row active after
    `context` positions."""
    dec.reset_all_active(context)
    run = capture_graph(fn, dec.device)[0].replay if graphs else fn
    return time_median(run, dec.device, *timed_runs(graphs, WARMUP, REPEATS)) * 1e3


def round_ms(dec: GraphedChainDecoder, context: int, graphs: bool) -> float:
    """Median device ms of one captured round of `dec` (its own `timing_round`)."""
    return time_median(dec.timing_round(context), dec.device,
                       *timed_runs(graphs, WARMUP, REPEATS)) * 1e3


def piece_kernels(dec: GraphedChainDecoder, k: int, context: int,
                  names=("draft", "verify", "commit")) -> dict:
    """The kernels (`kernel_profile`) of the pieces `names`, run eagerly once warm."""
    pieces = round_pieces(dec, k)
    dec.reset_all_active(context)
    drafts = pieces["draft"]()
    g = pieces["verify"](drafts)
    pieces["commit"](drafts, g)                 # warm: compiled ops, allocator
    dec.reset_all_active(context)
    runs = {"draft": pieces["draft"], "verify": lambda: pieces["verify"](drafts),
            "commit": lambda: pieces["commit"](drafts, g)}
    return {name: kernel_profile(runs[name], dec.device) for name in names}


def admission(dec: GraphedRefillDecoder, prompt: List[int], context: int, graphs: bool) -> dict:
    """One newcomer taking row 0 (its predecessor's results cloned out, the prompt prefilled
    into the row of both caches, the row's state set): host ms and kernels of the admission
    alone, and device ms of a round alone and of a round with an admission queued after it, as
    the refill's loop queues them (on a GPU the prefill runs beside the round:
    runtime/row_prefill.py). Their difference is what a newcomer adds to the batch's time; it
    includes the admission's host work where that outlasts the round, as in the refill's loop."""
    dec.prepare_prefill([prompt])

    def admit():
        dec._take_row(0, refilled=True)
        dec._admit(0, prompt, ADMIT_LIMIT)

    admit()                                     # captures the row's bucket, untimed
    runs = timed_runs(graphs, ADMIT_WARMUP, ADMIT_REPEATS)
    ms = time_median(admit, dec.device, *runs, host_bound=True) * 1e3
    kernels = kernel_profile(admit, dec.device)
    alone = time_median(dec.timing_round(context), dec.device, *runs) * 1e3
    round_ = dec.timing_round(context)

    def round_then_admit():
        round_()
        admit()

    beside = time_median(round_then_admit, dec.device, *runs) * 1e3
    out = {"prompt_tokens": len(prompt), "host_ms": ms, "kernels": kernels,
           "round_ms": alone, "round_and_admission_ms": beside, "added_ms": beside - alone}
    if dec._row_prefill.ahead:
        # As the refill's loop does with the placement `ahead`: the newcomer prefilled ahead,
        # beside the round before its admission, which then only copies it into the row.
        def ahead_round_then_admit():
            dec._row_prefill.prefetch([prompt])
            round_()
            admit()

        ahead = time_median(ahead_round_then_admit, dec.device, *runs) * 1e3
        out.update(round_and_admission_ahead_ms=ahead, added_ahead_ms=ahead - alone)
    return out


def one_batch(args, target, drafter, fused, fused_target, prompts, graphs) -> dict:
    b, k = len(prompts), args.k
    context = mid_run_context(prompts, args.new_tokens)
    # Room for every timed round to stay inside the cache (a row past it would clamp).
    capacity = context + (WARMUP + REPEATS + 8) * (k + 1)
    runs = timed_runs(graphs, WARMUP, REPEATS)
    steps = {name: measure_forwards(model, b, (1, k + 1), context, graphs, *runs)
             for name, model in (("target", target), ("target_fused", fused_target))}
    for name, model in (("drafter_model", drafter), ("drafter_fused", fused)):
        steps[name] = measure_forwards(model, b, (1, 2), context, graphs, *runs)
    out = {"batch": b, "k": k, "context": context,
           "forward_ms": {name: {str(w): s * 1e3 for w, s in widths.items()}
                          for name, widths in steps.items()}}
    plain = GraphedChainDecoder(target, None, b, capacity, 0, capture=graphs)
    ms = {"plain_round": round_ms(plain, context, graphs)}
    del plain
    # Both models in fused kernels: a plain step and the chain's round.
    for name, drafting in (("plain_round_fused_target", None), ("round_fused_target", fused)):
        dec = GraphedChainDecoder(fused_target, drafting, b, capacity, k if drafting else 0,
                                  capture=graphs)
        ms[name] = round_ms(dec, context, graphs)
        del dec
    model_chain = GraphedChainDecoder(target, drafter, b, capacity, k, capture=graphs)
    ms["round_model_drafter"] = round_ms(model_chain, context, graphs)
    del model_chain
    dec = GraphedChainDecoder(target, fused, b, capacity, k, capture=graphs)
    pieces = round_pieces(dec, k)
    ms["round"] = round_ms(dec, context, graphs)
    ms["draft"] = graph_ms(pieces["draft"], dec, context, graphs)
    ms["draft_verify"] = graph_ms(lambda: pieces["verify"](pieces["draft"]()), dec, context,
                                  graphs)
    ms["verify"] = ms["draft_verify"] - ms["draft"]
    ms["commit"] = ms["round"] - ms["draft_verify"]
    out["kernels"] = piece_kernels(dec, k, context)
    del dec
    # Fixed costs of the lengths 0..k in plain steps: the adaptive decoder measures nothing.
    costs = [1.0 + 0.3 * n for n in range(k + 1)]
    adaptive = GraphedChainDecoder(target, fused, b, capacity, k, capture=graphs, adaptive=True,
                                   round_costs=costs)
    ms["round_adaptive"] = round_ms(adaptive, context, graphs)
    out["kernels"]["commit_adaptive"] = piece_kernels(adaptive, k, context, ["commit"])["commit"]
    del adaptive
    # Placed ahead, the decoder can prefill a newcomer either way: at its admission (as the
    # default `beside` does) and ahead of it (prefetch), so both admissions are timed.
    refill = GraphedRefillDecoder(target, fused, b, capacity, k, capture=graphs,
                                  prefill_placement="ahead")
    ms["round_refill"] = round_ms(refill, context, graphs)
    out["kernels"]["commit_refill"] = piece_kernels(refill, k, context, ["commit"])["commit"]
    out["admission"] = admission(refill, prompts[0], context, graphs)
    del refill
    out["graph_ms"] = ms
    return out


def with_target_kernels(target, kernels: str):
    """`target` as loaded, or (`layers-attention`) a copy sharing its weights on compiled
    whole layers with the generated attention called from them (runtime/compiled_attention.py):
    where the fastest decoders of BENCHMARKS.md's twenty-second set run their target."""
    if kernels == "as-loaded":
        return target
    return target.with_backend(TorchBackend(fast_ops="layers", attention_kernels="generated"))


def report(row: dict) -> str:
    ms, kern = row["graph_ms"], row["kernels"]
    lines = [f"batch {row['batch']}: plain {ms['plain_round']:.3f} ms, chain({row['k']}) round "
             f"{ms['round']:.3f} (model drafter {ms['round_model_drafter']:.3f}, adaptive "
             f"{ms['round_adaptive']:.3f}, refill {ms['round_refill']:.3f}); draft "
             f"{ms['draft']:.3f}, verify {ms['verify']:.3f}, commit {ms['commit']:.3f}; "
             f"fused target: plain {ms['plain_round_fused_target']:.3f}, round "
             f"{ms['round_fused_target']:.3f}"]
    for piece, prof in kern.items():
        if prof:
            lines.append(f"  {piece}: {prof['kernels']} kernels, {prof['kernel_us']:.1f} us")
    adm = row["admission"]
    lines.append(f"  admission of {adm['prompt_tokens']} tokens: {adm['host_ms']:.3f} ms host; "
                 f"a round {adm['round_ms']:.3f} ms, with an admission after it "
                 f"{adm['round_and_admission_ms']:.3f} (+{adm['added_ms']:.3f})"
                 + (f", prefilled ahead {adm['round_and_admission_ahead_ms']:.3f} "
                    f"(+{adm['added_ahead_ms']:.3f})" if "added_ahead_ms" in adm else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arguments(ap)
    add_race_arguments(ap, calls=None)      # rounds are timed after prompt + new tokens / 2
    ap.add_argument("--target-kernels", choices=TARGET_KERNELS, default="as-loaded",
                    help="the target as loaded (per op on a GPU), or on compiled whole layers "
                         "with the generated attention inside them")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        target, drafter, prompts, _, graphs = decode_models(args, max(args.batch_sizes))
        target = with_target_kernels(target, args.target_kernels)
        fused = FusedForward(drafter)
        fused_target = FusedForward(target)
    except SpecPilotError as exc:
        ap.error(str(exc))
    measure_rows(args.batch_sizes,
                 lambda b: one_batch(args, target, drafter, fused, fused_target, prompts[:b],
                                     graphs),
                 report, args.out, target.device.type, vars(args), "batches")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
