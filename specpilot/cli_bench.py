"""`specpilot bench`: measure SpecPilot's decoders against HF transformers on a model pair
(--pair), or replay a measured acceptance profile over step costs of shape presets (--shapes).

Writes <out-dir>/<name>.json, .md and .png (and, with --pair, one acceptance profile per
speculative system: <name>.acceptance.<system>.json, the input of --shapes mode, from the batch
size with the most distinct requests; with several batch sizes, each one's as well:
<name>.acceptance.<system>.b<B>.json).
Also runnable as `python -m specpilot.cli_bench ...`.
"""
from __future__ import annotations

import argparse
import sys

from specpilot.cli_common import positive_counts, positive_int


def _batch_sizes(text: str):
    """Distinct batch sizes, ascending (`positive_counts` checks them)."""
    return sorted(set(positive_counts(text)))


def _names(text: str):
    return [x.strip() for x in text.split(",") if x.strip()]


def _tree(text: str):
    from specpilot.ir.errors import IRError
    from specpilot.ir.topology import Tree
    try:
        return Tree(tuple(int(x) for x in text.split(",")))
    except (ValueError, IRError) as exc:
        raise argparse.ArgumentTypeError(f"expected branching factors like 4,2,2,1: {exc}")


def _scale(text: str) -> float:
    from fractions import Fraction
    try:
        return float(Fraction(text))
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"expected a number like 1 or 1/32, got {text!r}")


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmark decoders (HF baselines, AR, Programs)",
                       description="With --pair: HF greedy, HF assisted generation, our AR, our "
                                   "CUDA-graphed AR and our Programs side by side on HumanEval "
                                   "prompts (greedy), each token-checked against the stock "
                                   "decoder. With --shapes: step costs of shape presets with "
                                   "acceptance replayed from a profile the --pair mode wrote.")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--pair", metavar="DIR", help="folder holding target/ and drafter/ HF "
                                                    "checkpoints (`specpilot zoo train --out`)")
    mode.add_argument("--shapes", metavar="TARGET:DRAFTER",
                      help="shape presets, e.g. llama-3.1-8b:llama-3.2-1b (random weights)")
    p.add_argument("--batch-sizes", type=_batch_sizes, default=[1, 4, 16, 64], metavar="1,4,16,64")
    p.add_argument("--name", help="result file name (default: from the pair or the shapes)")
    p.add_argument("--out-dir", default="bench/results", metavar="DIR")
    p.add_argument("--repeats", type=positive_int, metavar="R",
                   help="timed runs, median reported (default 3; 10 per step with --shapes)")
    p.add_argument("--eager-repeats", type=positive_int, metavar="R",
                   help="--pair mode: timed runs of the HF and eager systems (default: --repeats); "
                        "the graphed systems take --repeats")
    p.add_argument("--warmup", type=int, metavar="W",
                   help="untimed runs first (default 1; 3 per step with --shapes)")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available")
    p.add_argument("--dtype", choices=("bfloat16", "float32"),
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--benchmarks-md", metavar="FILE",
                   help="also write the table into a named section of FILE (e.g. BENCHMARKS.md)")
    g = p.add_argument_group("--pair mode")
    g.add_argument("--max-new-tokens", type=positive_int, default=256, metavar="N")
    g.add_argument("--prompts", type=positive_int, metavar="N", help="first N prompts (default all)")
    g.add_argument("--workload", default="humaneval", metavar="FILE",
                   help="'humaneval' (default) or a prompts file (JSONL 'prompt' field or lines)")
    g.add_argument("--program", action="extend", nargs="+", default=[], metavar="P.json",
                   help="Program(s) to measure besides the stock one")
    g.add_argument("--mechanisms", action="store_true",
                   help="also measure the verification and batching mechanisms (mech:* systems: "
                        "graphed adaptive lengths, graphed static and dynamic trees, eager "
                        "dynamic tree, two-level, ragged, refill, combined)")
    g.add_argument("--interleave", action="store_true",
                   help="time our systems side by side: each set up and warmed, then --repeats "
                        "passes over all of them, the order rotated every pass (so drift over "
                        "the bench falls on every system alike); HF baselines, and eager systems "
                        "with another --eager-repeats, are measured after, one by one")
    g.add_argument("--time-budget", type=float, metavar="S",
                   help="stop starting new measurements after S seconds; the rest are recorded "
                        "as skipped (results so far are kept in <name>.partial.json as it runs)")
    g.add_argument("--systems", type=_names, metavar="A,B,...",
                   help="subset of hf_ar,hf_assisted,ar_torch,strong_ar,stock,program:<stem> "
                        "(default all)")
    g = p.add_argument_group("--shapes mode")
    g.add_argument("--acceptance", metavar="FILE", help="acceptance profile JSON (required)")
    g.add_argument("--scale", type=_scale, default=1.0, metavar="S",
                   help="shrink every width by S (e.g. 1/32) for a quick run; default 1")
    g.add_argument("--context", type=positive_int, default=512, metavar="N",
                   help="committed tokens before each measured step (default 512)")
    g.add_argument("--max-width", type=positive_int, default=16, metavar="T",
                   help="measure target verification of 1..T tokens (default 16)")
    g.add_argument("--tree", type=_tree, action="append", default=[], metavar="4,2,2,1",
                   help="also measure verification and accept/commit of this tree (repeatable)")
    g.add_argument("--adaptive", action="store_true",
                   help="also replay the graphed batch-length rule (adaptive chain lengths, "
                        "speculation off where plain steps win) on the chain profile, with "
                        "graphed rounds of every length measured (GPU)")
    g.add_argument("--refill", action="store_true",
                   help="also replay AR and speculation with continuous refill (a finished "
                        "request's slot takes the next request at the next step); with "
                        "--adaptive, adaptive lengths with refill too")
    g.add_argument("--step-costs", metavar="RESULT.json",
                   help="replay on the step costs of an earlier --shapes result (same shapes) "
                        "instead of measuring them: another profile or rule, on any machine")
    p.set_defaults(handler=run)


def run(args) -> int:
    from specpilot.bench.environment import environment
    from specpilot.bench.results import check_name
    from specpilot.cli_common import resolve_device
    from specpilot.ir.errors import SpecPilotError

    device = resolve_device(args)
    if args.name:
        check_name(args.name)
    if args.warmup is not None and args.warmup < 0:
        raise SpecPilotError(f"--warmup must be >= 0, got {args.warmup}")
    if args.interleave and not args.pair:
        raise SpecPilotError("--interleave times the systems of --pair mode; --shapes replays "
                             "measured step costs and has none to interleave")
    env = environment(device, getattr(args, "argv", None))
    if args.pair:
        return _run_pair(args, device, env)
    if not args.acceptance:
        raise SpecPilotError("--shapes needs --acceptance FILE (an acceptance profile written by "
                             "`specpilot bench --pair DIR`)")
    return _run_shapes(args, device, env)


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _run_pair(args, device, env) -> int:
    from specpilot.bench.pair_bench import (PairBenchSettings, default_name, run_pair_bench,
                                            widest_profile)
    from specpilot.bench.replay import acceptance_suffix
    from specpilot.bench.report_md import pair_markdown
    from specpilot.bench.results import PartialResults, write_results

    settings = PairBenchSettings(
        pair=args.pair, batch_sizes=args.batch_sizes, max_new_tokens=args.max_new_tokens,
        prompts=args.prompts, workload=args.workload,
        repeats=args.repeats or 3, eager_repeats=args.eager_repeats,
        warmup=1 if args.warmup is None else args.warmup,
        programs=args.program, systems=args.systems, device=device, dtype=args.dtype,
        name=args.name, time_budget_s=args.time_budget, mechanisms=args.mechanisms,
        interleave=args.interleave)
    partial = PartialResults(args.out_dir, args.name or default_name(args.pair))
    doc, profiles = run_pair_bench(settings, _progress, env, on_row=partial.write)
    extra = {}
    doc["acceptance_profiles"] = {}
    doc["acceptance_profiles_by_batch"] = {}
    for system, by_batch in profiles.items():
        suffix = acceptance_suffix(system)
        extra[suffix] = widest_profile(by_batch).to_json()
        doc["acceptance_profiles"][system] = doc["name"] + suffix
        # Each batch's own as well (a drain or refill replay at batch 16 wants batch 16's
        # requests, not batch 64's), where the run measured more than one.
        if len(by_batch) > 1:
            files = doc["acceptance_profiles_by_batch"][system] = {}
            for b, profile in sorted(by_batch.items()):
                suffix = acceptance_suffix(system, b)
                extra[suffix] = profile.to_json()
                files[str(b)] = doc["name"] + suffix
    title = f"{doc['name']}: {doc['environment']['gpu']}, {doc['settings']['dtype']}"
    paths = write_results(doc, args.out_dir, pair_markdown(doc), title, extra_json=extra,
                          benchmarks_md=args.benchmarks_md)
    partial.remove()
    for path in paths.values():
        print(path)
    return 0


def _run_shapes(args, device, env) -> int:
    from specpilot.bench.report_md import replay_markdown
    from specpilot.bench.results import write_results
    from specpilot.bench.shapes_bench import ShapesBenchSettings, run_shapes_bench

    settings = ShapesBenchSettings(
        shapes=args.shapes, acceptance=args.acceptance, batch_sizes=args.batch_sizes,
        scale=args.scale, context=args.context, max_width=args.max_width, trees=args.tree,
        warmup=3 if args.warmup is None else args.warmup, repeats=args.repeats or 10,
        device=device, dtype=args.dtype, name=args.name, adaptive=args.adaptive,
        step_costs=args.step_costs, refill=args.refill)
    doc = run_shapes_bench(settings, _progress, env)
    title = (f"{doc['name']}: {doc['environment']['gpu']} — replayed acceptance "
             f"({doc['settings']['topology']})")
    paths = write_results(doc, args.out_dir, replay_markdown(doc), title,
                          ylabel="tokens/s (replayed acceptance)",
                          benchmarks_md=args.benchmarks_md)
    for path in paths.values():
        print(path)
    return 0


def main(argv=None) -> int:
    """`specpilot bench` on its own, with the same error handling as the `specpilot` command."""
    from specpilot.ir.errors import SpecPilotError

    parser = argparse.ArgumentParser(prog="specpilot")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_parser(sub)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(["bench", *argv])
    args.argv = ["specpilot", "bench", *argv]  # recorded as the command line of the results
    try:
        return int(args.handler(args) or 0)
    except SpecPilotError as exc:
        print(f"specpilot bench: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
