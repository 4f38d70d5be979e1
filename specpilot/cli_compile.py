"""`specpilot compile`: search for the fastest lossless decoder of a target/drafter pair.

Rounds of: cost report -> agents propose -> candidates built -> token forcing, then timing ->
winners stacked one at a time, each kept only if it pays -> memory updated. Writes
runs/NAME/round-K/ per round, runs/NAME/best/ (and runs/NAME/program.json) for the best Program,
and runs/NAME/report.md and report.json with plots.
Mechanisms validated on alike deployments (the memory) are evaluated first, together. Without
--target/--drafter it compiles the built-in default: the zoo's pair (gpu-small on a CUDA GPU,
tiny elsewhere), trained once on this machine and cached. Rerunning a killed compile with the
same --out resumes it.
"""
from __future__ import annotations

import os
import sys
import time

from specpilot.cli_common import positive_int

DEFAULT_OUT = os.path.join("runs", "default")


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="compile a tuned, token-forced speculative decoder",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--target", metavar="DIR", help="target HF checkpoint folder "
                   "(default: the zoo's pair, see --preset)")
    p.add_argument("--drafter", metavar="DIR", help="drafter HF checkpoint folder")
    p.add_argument("--default", action="store_true",
                   help="compile the zoo's pair (the same as leaving out --target/--drafter)")
    p.add_argument("--preset", help="zoo preset of the default pair (default: gpu-small on a "
                   "CUDA GPU, tiny elsewhere)")
    p.add_argument("--gpu", default="auto", help="GPU name, 'cpu', or 'auto' (detect; default)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"),
                   help="compute dtype (default: bfloat16 on a GPU, float32 on a CPU)")
    p.add_argument("--workload", default="humaneval", metavar="humaneval|FILE")
    p.add_argument("--prompts", type=positive_int, default=8, metavar="N",
                   help="workload prompts used to force and time candidates (default 8)")
    p.add_argument("--max-new-tokens", type=positive_int, default=64, metavar="N")
    p.add_argument("--rounds", type=int, default=3, metavar="N", help="search rounds (default 3)")
    p.add_argument("--batch-size", type=positive_int, default=1, metavar="B")
    p.add_argument("--candidates", type=positive_int, default=6, metavar="N",
                   help="candidates evaluated per round by the built-in agents (default 6)")
    p.add_argument("--repeats", type=positive_int, default=3, metavar="N",
                   help="timed runs per candidate and per round's base (default 3)")
    p.add_argument("--workers", type=positive_int, default=2, metavar="N",
                   help="parallel workers for lowering and building candidates")
    p.add_argument("--memory", metavar="FILE", help="memory database (default: "
                   "$SPECPILOT_CACHE/memory.sqlite or ~/.cache/specpilot/memory.sqlite)")
    p.add_argument("--llm-endpoint", metavar="URL",
                   help="an OpenAI-compatible endpoint for the LLM agent (e.g. http://host/v1)")
    p.add_argument("--llm-model", metavar="NAME", help="model name sent to the endpoint")
    p.add_argument("--llm-key-env", default="OPENAI_API_KEY", metavar="VAR",
                   help="environment variable holding the endpoint's API key")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="runs/NAME",
                   help=f"run folder (default {DEFAULT_OUT})")
    p.set_defaults(handler=run)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def default_preset() -> str:
    """The zoo pair `compile` uses by default: the GPU pair where there is a CUDA GPU."""
    import torch

    return "gpu-small" if torch.cuda.is_available() else "tiny"


def _pair(args):
    from specpilot.ir.errors import SpecPilotError

    if args.target and args.drafter and not args.default:
        return args.target, args.drafter
    if args.target or args.drafter:
        raise SpecPilotError("give both --target and --drafter, or neither (and --default) "
                             "for the zoo's pair")
    try:
        from specpilot.zoo import ensure_pair
    except ImportError:
        from specpilot.zoo.cache import ensure_pair
    preset = args.preset or default_preset()
    target, drafter = ensure_pair(preset, seed=0, progress=_say)
    return str(target), str(drafter)


def run(args) -> int:
    from specpilot.report import build_run_report
    from specpilot.search.compile import compile_deployment
    from specpilot.search.settings import CompileSettings

    start = time.perf_counter()
    target, drafter = _pair(args)
    settings = CompileSettings(
        target_dir=target, drafter_dir=drafter, out_dir=args.out, gpu=args.gpu, dtype=args.dtype,
        workload=args.workload, batch_size=args.batch_size, rounds=args.rounds,
        prompts=args.prompts, max_new_tokens=args.max_new_tokens,
        candidates_per_round=args.candidates, timing_repeats=args.repeats,
        baseline_repeats=args.repeats, workers=args.workers, memory_path=args.memory,
        llm_endpoint=args.llm_endpoint, llm_model=args.llm_model, llm_key_env=args.llm_key_env)
    result = compile_deployment(settings, progress=_say)
    report = build_run_report(result.out_dir)
    best = os.path.join(result.out_dir, "best")
    print(f"best Program: round {result.best_round}, {os.path.join(best, 'program.json')}")
    print(result.evaluations.summary())
    print(f"report: {report}")
    print(f"compile took {time.perf_counter() - start:.0f} s")
    return 0
