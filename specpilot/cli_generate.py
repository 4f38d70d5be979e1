"""`specpilot generate`: decode one prompt, AR or speculative, and report tokens/s."""
from __future__ import annotations

import json

from specpilot.cli_common import (add_model_args, drafter_dir, positive_int, resolve_device,
                                  resolve_program)


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="decode one prompt greedily (speculative with --drafter)",
                       description="Greedy decoding of one prompt. With a drafter (or a Program) "
                                   "it runs speculative decoding and reports the mean accepted "
                                   "length; without, plain autoregressive decoding.")
    add_model_args(p, drafter_required=False)
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, metavar="N")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(handler=run)


def run(args) -> int:
    from specpilot.runtime.decoder import load_pair, timed_ar, timed_program

    device = resolve_device(args)
    program = resolve_program(args, device)
    drafter = drafter_dir(args, program)
    pair = load_pair(args.target, drafter, program.models.target.dtype, device,
                     program=program if drafter is not None else None)
    ids = pair.encode(args.prompt)
    if drafter is None:
        run_ = timed_ar(pair, [ids], args.max_new_tokens)
    else:
        run_ = timed_program(program, pair, [ids], args.max_new_tokens)
    tokens = run_.tokens[0]
    text = pair.decode(tokens)
    if args.json:
        print(json.dumps({"tokens": tokens, "text": text, "tokens_per_s": run_.tokens_per_s,
                          "mean_accepted": run_.mean_accepted}))
        return 0
    print(args.prompt + text)
    print("---")
    line = f"{len(tokens)} tokens in {run_.seconds:.2f} s: {run_.tokens_per_s:.1f} tokens/s"
    if run_.mean_accepted is not None:
        line += (f", mean accepted length {run_.mean_accepted:.2f} tokens per target forward "
                 f"({program.draft.describe()})")
    print(line)
    return 0
