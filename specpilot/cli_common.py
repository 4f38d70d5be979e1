"""Argument helpers shared by the subcommands that load a model pair and a Program, and by the
bench scripts (counts)."""
from __future__ import annotations

import argparse
import os
from typing import List, Optional, Sequence

from specpilot.ir import load_program, stock_program
from specpilot.ir.errors import SpecPilotError


def add_model_args(parser, drafter_required: bool) -> None:
    parser.add_argument("--target", required=True, metavar="DIR", help="target HF checkpoint folder")
    parser.add_argument("--drafter", required=drafter_required, metavar="DIR",
                        help="drafter HF checkpoint folder (shares the target's tokenizer)")
    parser.add_argument("--program", metavar="P.json",
                        help="Program to run (default: the stock Program of the pair)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"),
                        help="compute dtype (default: the Program's; float32 on CPU and "
                             "bfloat16 on GPU for the stock Program)")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError
    return value


positive_int.__name__ = "positive integer"


def positive_counts(text: str) -> List[int]:
    """A comma-separated list of counts >= 1 (batch sizes, node budgets), for argparse; kept in
    the order given."""
    try:
        counts = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 1,4,16, got {text!r}") from None
    if not counts or any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"counts must be >= 1, got {text!r}")
    return counts


def comma_choices(choices: Sequence[str]):
    """An argparse type: a comma-separated list of some of `choices`, kept in the order
    given."""
    def parse(text: str) -> List[str]:
        names = [s.strip() for s in text.split(",") if s.strip()]
        if not names or any(n not in choices for n in names):
            raise argparse.ArgumentTypeError(f"takes {', '.join(choices)}, got {text!r}")
        return names
    parse.__name__ = "list"
    return parse


def resolve_program(args, device: str):
    """The Program to run: --program if given (its dtype must agree with --dtype), else the
    stock Program of --target/--drafter."""
    from specpilot.deploy import build_deployment

    if args.program:
        program = load_program(args.program)
        if args.dtype and args.dtype != program.models.target.dtype:
            raise SpecPilotError(f"--dtype {args.dtype} disagrees with the Program's dtype "
                                 f"{program.models.target.dtype}: drop --dtype or edit the Program")
        return program
    dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    drafter = args.drafter or args.target
    return stock_program(build_deployment(args.target, drafter, gpu=_gpu_name(device), dtype=dtype))


def _gpu_name(device: str) -> str:
    if device == "cuda":
        from specpilot.deploy import detect_gpu
        return detect_gpu()
    return "cpu"


def resolve_device(args) -> str:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SpecPilotError("--device cuda was asked for but no CUDA GPU is available")
    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def drafter_dir(args, program) -> Optional[str]:
    """--drafter, or the drafter checkpoint the Program names when --program is given alone."""
    if args.drafter:
        return args.drafter
    if args.program and os.path.isdir(program.models.drafter.checkpoint):
        return program.models.drafter.checkpoint
    return None
