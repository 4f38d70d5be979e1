"""`specpilot demo`: the main job on the built-in default pair.

Trains (once, cached) the zoo's tiny target/drafter pair, builds the stock Program, runs the stock
decoder (greedy AR) and the speculative stock Program on HumanEval prompts, token-forces the
Program against AR, checks that its unforced output equals AR's, and writes the Program and a
JSON report under --out.
"""
from __future__ import annotations

import json
import os
import sys

from specpilot.cli_common import positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="run the stock speculative decoder on the built-in tiny pair",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--preset", default="tiny", help="zoo preset of the pair (default: tiny)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", default="humaneval", metavar="humaneval|FILE")
    p.add_argument("--limit", type=positive_int, default=8, metavar="N", help="prompts to use")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, metavar="N")
    p.add_argument("--dtype", choices=("bfloat16", "float32"),
                   help="default: float32 on CPU, bfloat16 on GPU")
    p.add_argument("--out", default=os.path.join("runs", "demo"), metavar="DIR")
    p.set_defaults(handler=run)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args) -> int:
    from specpilot.deploy import build_deployment, detect_gpu
    from specpilot.ir import program_id, save_program, stock_program
    from specpilot.prompts import workload_prompts
    from specpilot.runtime.decoder import (default_device, force_program, load_pair, timed_ar,
                                           timed_program)
    from specpilot.zoo import ensure_pair

    device = default_device()
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    _say(f"[1/5] model pair: zoo preset {args.preset!r} (trained once, then cached)")
    target_dir, drafter_dir = ensure_pair(args.preset, seed=args.seed, progress=_say)
    deployment = build_deployment(str(target_dir), str(drafter_dir),
                                  gpu=detect_gpu() if device == "cuda" else "cpu", dtype=dtype)
    program = stock_program(deployment)
    _say(f"[2/5] stock Program {program_id(program)[:12]}: {program.draft.topology}, {dtype}, {device}")
    pair = load_pair(str(target_dir), str(drafter_dir), dtype, device)
    prompts = [pair.encode(t) for t in workload_prompts(args.workload, args.limit)]

    _say(f"[3/5] stock decoder (greedy AR) on {len(prompts)} prompts, {args.max_new_tokens} new tokens each")
    from specpilot.runtime.decoder import run_reference
    reference = run_reference(pair, prompts, args.max_new_tokens)
    ar = timed_ar(pair, prompts, args.max_new_tokens)
    _say(f"[4/5] speculative stock Program")
    spec = timed_program(program, pair, prompts, args.max_new_tokens)
    mismatches = [i for i, (a, b) in enumerate(zip(spec.tokens, reference.tokens)) if a != b]
    _say("[5/5] token forcing against the stock decoder")
    report = force_program(program, pair, prompts, reference)

    os.makedirs(args.out, exist_ok=True)
    save_program(program, os.path.join(args.out, "program.json"))
    summary = {
        "pair": {"target": str(target_dir), "drafter": str(drafter_dir), "preset": args.preset},
        "program_id": program_id(program), "topology": str(program.draft.topology),
        "device": device, "dtype": dtype, "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "ar": {"tokens_per_s": ar.tokens_per_s, "seconds": ar.seconds, "tokens": ar.new_tokens,
               "target_forwards": ar.target_forwards},
        "speculative": {"tokens_per_s": spec.tokens_per_s, "seconds": spec.seconds,
                        "tokens": spec.new_tokens, "target_forwards": spec.target_forwards,
                        "mean_accepted": spec.mean_accepted},
        "speedup_over_ar": spec.tokens_per_s / ar.tokens_per_s,
        "unforced_output_equals_ar": not mismatches, "mismatched_prompts": mismatches,
        "forcing": report.to_json(),
    }
    tmp = os.path.join(args.out, "report.json.tmp")
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(tmp, os.path.join(args.out, "report.json"))

    print(f"stock Program {program.draft.topology} on {len(prompts)} HumanEval prompts "
          f"({device}, {dtype})")
    print(f"  greedy AR:          {ar.tokens_per_s:8.1f} tokens/s  ({ar.target_forwards} target forwards)")
    print(f"  speculative (stock): {spec.tokens_per_s:7.1f} tokens/s  ({spec.target_forwards} target "
          f"forwards, mean accepted {spec.mean_accepted:.2f})  ×{summary['speedup_over_ar']:.2f}")
    print(f"  unforced output equals AR: {'yes' if not mismatches else f'NO (prompts {mismatches})'}")
    print("  " + report.format().replace("\n", "\n  "))
    print(f"  wrote {os.path.join(args.out, 'program.json')} and report.json")
    return 0 if report.passed and not mismatches else 1
