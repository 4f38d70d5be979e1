"""`compile_deployment`: the whole compile of one deployment, resumable.

    set up          device, Deployment, stock Program (+ measured escape rates in bfloat16),
                    the run folder and the memory; reconcile both after a kill
    round 0         the stock decoder: reference tokens, AR and stock timings, token forcing of
                    the stock Program, the drafter's rank profile, the device measurement and a
                    first calibration of the cost model
    rounds 1..N     `search.round.run_round` from the previous round's Program; each round is
                    written, recorded in the memory, then published (run_folder.py)
    count           candidate evaluations in all and until the best Program was first reached,
                    from the completed rounds' records (evaluations.py)
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Callable, List, Optional

from specpilot.ir import Program, SetMaxBatchSize, apply, program_id, stock_program

from .evaluate import Evaluator
from .evaluations import EvaluationCount, count_evaluations, round_evaluations
from .run_folder import RunFolder, write_json_atomic, write_text_atomic
from .settings import COMPILE_FILE, CompileSettings, SettingsError

ACCEPTANCE_FILE = "acceptance.json"
REFERENCE_FILE = "reference.json"
ESCAPES_FILE = "escapes.json"


@dataclass
class CompileResult:
    out_dir: str
    best: Program
    best_round: int
    rounds: List[dict]          # per completed round: round, program id, evaluations
    evaluations: EvaluationCount = EvaluationCount(0, 0, 0)


@dataclass
class Hooks:
    """Test seams: called with the round index at the named moments (a hook that raises
    simulates a kill there). mid_round: round K has begun and written nothing yet;
    before_commit: its folder is written and its memory transaction open; after_commit: the
    transaction is committed, the folder not yet renamed into place."""
    before_commit: Optional[Callable[[int], None]] = None
    after_commit: Optional[Callable[[int], None]] = None
    mid_round: Optional[Callable[[int], None]] = None


def _device_and_gpu(settings: CompileSettings):
    import torch

    from specpilot.deploy import detect_gpu

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = settings.gpu
    if gpu == "auto":
        gpu = detect_gpu() if device == "cuda" else "cpu"
    dtype = settings.dtype or ("bfloat16" if device == "cuda" else "float32")
    return device, gpu, dtype


def _open_run(settings: CompileSettings, folder: RunFolder, resolved: dict) -> dict:
    """compile.json of the run: created, or read back and checked against `settings`."""
    path = folder.root / COMPILE_FILE
    if path.exists():
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
        before = CompileSettings.from_json(state["settings"]).identity()
        now = settings.identity()
        changed = [k for k in now if now[k] != before.get(k)]
        if changed:
            raise SettingsError(f"{folder.root} holds a compile with other settings "
                                f"({', '.join(changed)}): choose a new --out")
        state["settings"] = settings.to_json()
        write_json_atomic(path, state)
        return state
    if folder.root.exists() and any(folder.root.iterdir()):
        raise SettingsError(f"--out {folder.root} exists and is not a compile run folder")
    folder.root.mkdir(parents=True, exist_ok=True)
    state = {"run_id": uuid.uuid4().hex, "settings": settings.to_json(), "resolved": resolved}
    write_json_atomic(path, state)
    return state


def _prompts(evaluator_pair, settings: CompileSettings) -> List[List[int]]:
    """The workload prompts as token ids, left-truncated to fit the model's context."""
    from specpilot.prompts import workload_prompts

    limit = evaluator_pair.target.config.max_position_embeddings
    # room for the new tokens and for the largest draft tree the search considers
    keep = max(1, limit - settings.max_new_tokens - 70)
    return [evaluator_pair.encode(t)[-keep:] for t in workload_prompts(settings.workload,
                                                                        settings.prompts)]


def _reference_json(reference) -> dict:
    return {"tokens": reference.tokens, "margins": reference.margins}


def _load_reference(path):
    from specpilot.runtime.ar import ARResult
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    return ARResult(obj["tokens"], obj["margins"], 0)


def _kernels(program: Program, folder) -> Optional[str]:
    """Write the Program's kernel plan (and its rendered kernels when it runs generated ones)
    under folder/kernels; the reason when lowering fails."""
    from specpilot.codegen.lower import lower_program
    from specpilot.codegen.plan import plan_to_json
    from specpilot.ir.errors import SpecPilotError

    try:
        plan = lower_program(program)
    except SpecPilotError as exc:
        return str(exc)
    out = folder / "kernels"
    out.mkdir(exist_ok=True)
    write_text_atomic(out / "plan.json", plan_to_json(plan))
    if program.kernels.backend == "generated":
        from specpilot.codegen.render import render_kernel
        for key, spec in plan.kernels:
            suffix = ".cu" if spec.backend == "cuda" else ".py"
            write_text_atomic(out / f"{key}{suffix}", render_kernel(spec))
    return None


def compile_deployment(settings: CompileSettings, progress: Callable[[str], None] = print,
                       hooks: Hooks = Hooks()) -> CompileResult:
    """Run (or resume) the compile described by `settings`; see the module docstring. On a CPU
    torch runs with `settings.cpu_threads` intra-op threads meanwhile (restored after)."""
    import torch

    before = torch.get_num_threads()
    if not torch.cuda.is_available():
        torch.set_num_threads(settings.cpu_threads)
    try:
        return _compile(settings, progress, hooks)
    finally:
        torch.set_num_threads(before)


def _compile(settings: CompileSettings, progress, hooks: Hooks) -> CompileResult:
    from specpilot.agents import LLMAgent, default_agents
    from specpilot.codegen.cache import KernelCache
    from specpilot.cost import Calibration, CostModel, GpuSpec, RankProfile
    from specpilot.deploy import build_deployment
    from specpilot.memory import MemoryStore, deployment_signature
    from specpilot.runtime.decoder import load_pair

    from .escapes import with_measured_escapes
    from .round import RoundInputs, run_round
    from .round_io import record_round, round_zero, tried_outcomes, write_round

    device, gpu, dtype = _device_and_gpu(settings)
    folder = RunFolder(settings.out_dir)
    run_id = _open_run(settings, folder, {"device": device, "gpu": gpu, "dtype": dtype})["run_id"]
    progress(f"[setup] {settings.target_dir} + {settings.drafter_dir} on {gpu} ({device}, "
             f"{dtype}), run {run_id[:8]} in {folder.root}")

    deployment = build_deployment(settings.target_dir, settings.drafter_dir, gpu=gpu,
                                  dtype=dtype, workload=settings.workload)
    stock = stock_program(deployment)
    if settings.batch_size > 1:
        stock = apply(stock, SetMaxBatchSize(settings.batch_size))
    stock = with_measured_escapes(stock, settings.target_dir, settings.drafter_dir,
                                  str(folder.root / ESCAPES_FILE))
    signature = deployment_signature(stock, settings.workload, settings.batch_size)

    memory = MemoryStore(settings.memory_path)
    try:
        memory.start_run(run_id, str(folder.root.resolve()), signature)
        recorded = memory.completed_rounds(run_id)
        folder.reconcile(recorded)
        if recorded:
            folder.publish_best(max(recorded))    # a kill may have fallen before publishing
            progress(f"[setup] resuming after round {max(recorded)}")

        stock_pair = load_pair(settings.target_dir, settings.drafter_dir, dtype, device)
        prompts = _prompts(stock_pair, settings)
        reference = (_load_reference(folder.round_dir(0) / REFERENCE_FILE) if 0 in recorded
                     else None)
        cache_dir = str(folder.root / "kernel-cache")
        evaluator = Evaluator(settings.target_dir, settings.drafter_dir, dtype, device, prompts,
                              settings.max_new_tokens, settings.batch_size,
                              KernelCache(cache_dir), reference, stock_pair=stock_pair)

        if 0 not in recorded:
            zero = round_zero(stock, evaluator, settings, device, progress)
            partial = folder.begin_round(0)
            write_json_atomic(partial / REFERENCE_FILE, _reference_json(evaluator.reference))
            write_json_atomic(partial / ACCEPTANCE_FILE, zero.pop("acceptance").to_json())
            notes = [f"kernel plan: {e}"] if (e := _kernels(stock, partial)) else []
            record = write_round(partial, 0, zero, stock, stock, None, notes)
            record_round(memory, folder, partial, run_id, 0, stock, record, signature, hooks)
            recorded[0] = program_id(stock)
        zero = folder.load_round_report(0)
        with open(folder.round_dir(0) / ACCEPTANCE_FILE, encoding="utf-8") as f:
            acceptance = RankProfile.from_json(json.load(f))
        write_json_atomic(folder.root / ACCEPTANCE_FILE, acceptance.to_json())
        last = max(recorded)
        cost_model = CostModel(GpuSpec.from_json(zero["gpu_spec"]), Calibration.from_json(
            folder.load_round_report(last).get("calibration")))
        llm = (LLMAgent(settings.llm_endpoint, settings.llm_model, settings.llm_key_env)
               if settings.llm_endpoint else None)
        view = memory.view(signature, run_id)
        context = max(len(p) for p in prompts) + settings.max_new_tokens // 2

        for k in range(last + 1, settings.rounds + 1):
            base = folder.load_round_program(k - 1)
            inputs = RoundInputs(k, base, cost_model, acceptance, evaluator,
                                 default_agents(cost_model, acceptance, llm), view, settings,
                                 cache_dir, context, tried_outcomes(folder, k), progress)
            if hooks.mid_round is not None:
                hooks.mid_round(k)
            result = run_round(inputs)
            cost_model = result.cost_model
            partial = folder.begin_round(k)
            notes = [f"kernel plan: {e}"] if (e := _kernels(result.program, partial)) else []
            record = write_round(partial, k, result, stock, base, zero, notes)
            record_round(memory, folder, partial, run_id, k, result.program, record, signature,
                         hooks, result)
            recorded[k] = program_id(result.program)
            progress(f"[round {k}] done: {result.chosen}; "
                     f"{result.timing['median_tokens_per_s']:,.1f} tok/s")
        best_round = max(recorded)
        records = [folder.load_round_report(k) for k in sorted(recorded)]
        summary = [{"round": r["round"], "program_id": r["program_id"],
                    "evaluations": round_evaluations(r)} for r in records]
        count = count_evaluations(records)
        progress(f"[done] {count.summary()} (the best Program first chosen in round "
                 f"{count.best_round})")
        return CompileResult(str(folder.root), folder.load_round_program(best_round), best_round,
                             summary, count)
    finally:
        memory.close()
