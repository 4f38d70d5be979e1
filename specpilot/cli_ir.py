"""`specpilot ir`: create the stock Program of a deployment, show a Program, diff two Programs."""
from __future__ import annotations

import os
from collections import Counter

from specpilot.ir import (DTYPES, PROGRAM_FILE, BatchSpec, KernelsSpec, ModelSpec, Program,
                          diff, format_diff, load_program, program_id, save_program,
                          stock_program)

PROGRAM_ARG_HELP = f"a Program JSON file, or a folder containing {PROGRAM_FILE}"


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "ir", help="create, show and compare IR Programs",
        description="Create the stock Program of a deployment, show a Program, diff two Programs.")
    sub = parser.add_subparsers(dest="ir_command", metavar="IR_COMMAND")
    sub.required = True

    stock = sub.add_parser(
        "stock", help="write the stock Program of a target/drafter pair",
        description="Read two HF checkpoint folders and write their stock Program: chain(4) "
                    "drafting, dense weights, torch kernels.")
    stock.add_argument("--target", required=True, metavar="DIR", help="target checkpoint folder")
    stock.add_argument("--drafter", required=True, metavar="DIR", help="drafter checkpoint folder")
    stock.add_argument("--gpu", default="cpu", metavar="NAME",
                       help="GPU the decoder is for: a name, 'cpu' (default) or 'auto' (detect)")
    stock.add_argument("--dtype", default="bfloat16", choices=DTYPES,
                       help="compute dtype of both models (default bfloat16)")
    stock.add_argument("--workload", default="humaneval", help="workload name (default humaneval)")
    stock.add_argument("--out", required=True, metavar="P.json",
                       help=f"where to write the Program (a folder gets {PROGRAM_FILE})")
    stock.set_defaults(handler=run_stock)

    show = sub.add_parser("show", help="print a readable summary of a Program and its id",
                          description="Print a readable summary of a Program and its id.")
    show.add_argument("program", metavar="FILE", help=PROGRAM_ARG_HELP)
    show.set_defaults(handler=run_show)

    compare = sub.add_parser(
        "diff", help="print the attributes that differ between two Programs",
        description="Print each attribute that differs between Programs A and B as "
                    "'path: old → new' ('no differences' when equal). Exits 0 either way.")
    compare.add_argument("a", metavar="A", help=PROGRAM_ARG_HELP)
    compare.add_argument("b", metavar="B", help=PROGRAM_ARG_HELP)
    compare.set_defaults(handler=run_diff)


def run_stock(args) -> int:
    from specpilot.deploy import build_deployment, detect_gpu

    gpu = detect_gpu() if args.gpu == "auto" else args.gpu
    deployment = build_deployment(args.target, args.drafter, gpu=gpu, dtype=args.dtype,
                                  workload=args.workload)
    program = stock_program(deployment)
    out = os.path.join(args.out, PROGRAM_FILE) if os.path.isdir(args.out) else args.out
    save_program(program, out)
    print(f"wrote {out} (program {program_id(program)})")
    return 0


def _model_summary(m: ModelSpec) -> list:
    extras = [name for name, on in (("qkv bias", m.qkv_bias), ("qk norm", m.qk_norm),
                                    ("tied embeddings", m.tie_embeddings)) if on]
    counts = Counter(fmt for _, fmt in m.weight_formats)
    layers = f"{m.num_layers} layer{'s' if m.num_layers != 1 else ''}"
    lines = [
        f"{m.family}, {m.dtype}, {layers}, hidden {m.hidden_size}, "
        f"mlp {m.intermediate_size}, heads {m.num_heads}/{m.num_kv_heads} kv x {m.head_dim}, "
        f"vocab {m.vocab_size}" + "".join(f", {e}" for e in extras),
        f"checkpoint {m.checkpoint}",
        "weights " + ", ".join(f"{n} {fmt}" for fmt, n in sorted(counts.items())),
    ]
    if m.lossless12_escape_ppm:
        lines.append(f"lossless12 escape rates measured for {len(m.lossless12_escape_ppm)} "
                     "linears")
    return lines


def summarize(program: Program) -> str:
    """A readable multi-line summary of a Program, its id on the first line."""
    k = program.kernels
    rows = [("gpu", [program.gpu]),
            ("target", _model_summary(program.models.target)),
            ("drafter", _model_summary(program.models.drafter)),
            ("draft", [f"{program.draft.drafter} drafter, {program.draft.describe()}"]),
            ("verify", [f"{program.verify.mask} mask, {program.verify.acceptance} acceptance"]),
            ("commit", [f"kv {program.commit.kv}"]),
            ("batch", [f"{program.batch.layout}, max batch size {program.batch.max_batch_size}, "
                       f"draft length {program.batch.draft_length_policy}"
                       + (f" ({program.batch.length_estimator} estimator)"
                          if program.batch.length_estimator != BatchSpec.length_estimator
                          else "")
                       + (f" ({program.batch.length_drain} drain)"
                          if program.batch.length_drain != BatchSpec.length_drain
                          else "")
                       + f", {program.batch.refill} refill"]),
            ("kernels", [f"backend {k.backend}"
                         + (f" (fast path {k.fast_path})" if k.backend == "torch" else "")
                         + (f", {k.drafter_kernels} drafter kernels"
                            if k.drafter_kernels != KernelsSpec.drafter_kernels else "")
                         + (f", {k.attention_kernels} attention kernels"
                            if k.attention_kernels != KernelsSpec.attention_kernels else "")
                         + (f", {k.accept_kernels} accept kernels"
                            if k.accept_kernels != KernelsSpec.accept_kernels else "")
                         + f", graph capture {'on' if k.capture_graphs else 'off'}, "
                         f"{len(k.overrides)} node overrides"]),
            ("history", [f"{i + 1}. {t}" for i, t in enumerate(program.history)] or ["(stock)"])]
    lines = [f"program {program_id(program)}"]
    for label, values in rows:
        lines.append(f"  {label:<8} {values[0]}")
        lines += [f"  {'':<8} {v}" for v in values[1:]]
    return "\n".join(lines)


def run_show(args) -> int:
    print(summarize(load_program(args.program)))
    return 0


def run_diff(args) -> int:
    print(format_diff(diff(load_program(args.a), load_program(args.b))))
    return 0
