"""`specpilot cost`: the cost model's report of a Program on a GPU, without that GPU.

Roofline per IR node on the GPU's datasheet spec (or `--gpu measure`: the present device),
predicted step time and tokens/s from an acceptance profile (`--acceptance`: a rank profile
such as runs/NAME/acceptance.json, or a bench acceptance profile; without one an assumed
per-depth acceptance, labelled as such), the ceiling, and the gap by category.
"""
from __future__ import annotations

import json

from specpilot.cli_common import positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("cost", help="cost-model report of a Program on a GPU",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--target", metavar="DIR", help="target checkpoint (or give --program)")
    p.add_argument("--drafter", metavar="DIR", help="drafter checkpoint (or give --program)")
    p.add_argument("--program", metavar="P.json", help="Program to cost (a file or a folder "
                   "with program.json; default: the stock Program of --target/--drafter)")
    p.add_argument("--gpu", required=True,
                   help="h100, h200, a100, l40s, rtx4090, cpu, or 'measure' (this device)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                   help="compute dtype of the stock Program (default bfloat16)")
    p.add_argument("--acceptance", metavar="FILE", help="rank profile or acceptance profile")
    p.add_argument("--assumed-acceptance", type=float, default=0.7, metavar="P",
                   help="per-depth acceptance assumed without --acceptance (default 0.7)")
    p.add_argument("--batch-size", type=positive_int, metavar="B",
                   help="default: the Program's max batch size")
    p.add_argument("--context", type=positive_int, default=512, metavar="N",
                   help="committed tokens per request (default 512)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=run)


def run(args) -> int:
    from dataclasses import replace

    from specpilot.cost import (AssumedAcceptance, CostModel, gpu_spec, load_acceptance,
                                measure_device)
    from specpilot.ir import load_program, stock_program
    from specpilot.ir.errors import SpecPilotError

    if args.gpu == "measure":
        spec = measure_device()
    else:
        spec = gpu_spec(args.gpu)
    if args.program:
        program = load_program(args.program)
    else:
        if not (args.target and args.drafter):
            raise SpecPilotError("give --target and --drafter, or --program")
        from specpilot.deploy import build_deployment
        program = stock_program(build_deployment(args.target, args.drafter, gpu=spec.name,
                                                 dtype=args.dtype))
    program = replace(program, gpu=spec.name)
    acceptance = (load_acceptance(args.acceptance) if args.acceptance
                  else AssumedAcceptance(args.assumed_acceptance))
    report = CostModel(spec).report(program, acceptance, args.batch_size, args.context)
    print(json.dumps(report.to_json(), indent=1) if args.json else report.format_markdown())
    return 0
