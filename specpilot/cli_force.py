"""`specpilot force`: token-force a Program against the stock decoder on a prompts file."""
from __future__ import annotations

import json
import sys

from specpilot.cli_common import (add_model_args, drafter_dir, positive_int, resolve_device,
                                  resolve_program)


def add_parser(sub) -> None:
    p = sub.add_parser("force", help="token-force a Program against plain greedy decoding",
                       description="Run the Program forced on the stock decoder's output for every "
                                   "prompt and report exact matches, tolerated near-tie flips and "
                                   "violations. Exits 1 on any violation.")
    add_model_args(p, drafter_required=True)
    p.add_argument("--prompts", required=True, metavar="FILE",
                   help="JSONL with a 'prompt' field per line (HumanEval's format) or plain text, "
                        "one prompt per line; 'humaneval' for the built-in set")
    p.add_argument("--limit", type=positive_int, metavar="N", help="use the first N prompts")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, metavar="N")
    p.add_argument("--tolerance", type=float, metavar="X",
                   help="near-tie margin (default: 4 ulps of a typical top-1 logit in the dtype)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=run)


def run(args) -> int:
    from specpilot.prompts import workload_prompts
    from specpilot.runtime.decoder import force_program, load_pair, run_reference

    device = resolve_device(args)
    program = resolve_program(args, device)
    texts = workload_prompts(args.prompts, args.limit)
    drafter = drafter_dir(args, program)
    dtype = program.models.target.dtype
    # The reference is the stock decoder: torch backend, dense weights. The candidate is built
    # the way the Program says (its backend, its weight formats).
    stock = load_pair(args.target, drafter, dtype, device)
    pair = load_pair(args.target, drafter, dtype, device, program=program)
    prompts = [stock.encode(t) for t in texts]
    print(f"forcing {program.draft.describe()} on {len(prompts)} prompts "
          f"({args.max_new_tokens} new tokens each)...", file=sys.stderr)
    reference = run_reference(stock, prompts, args.max_new_tokens, program.batch.max_batch_size)
    report = force_program(program, pair, prompts, reference, args.tolerance)
    print(json.dumps(report.to_json()) if args.json else report.format())
    return 0 if report.passed else 1
