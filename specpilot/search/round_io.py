"""Round 0 (the stock decoder measured) and what every round leaves behind: its files in the
run folder and its record in the memory."""
from __future__ import annotations

import json
from typing import Dict, List, Optional

from specpilot.ir import PROGRAM_FILE, Program, diff, format_diff, program_id, save_program
from specpilot.ir.errors import SpecPilotError
from specpilot.runtime.fast_ops import fast_ops_mode

from .candidates import Outcome
from .evaluations import EVALUATED_STAGES
from .output_check import check_output
from .run_folder import RunFolder, write_json_atomic, write_text_atomic


class StockForcingFailed(SpecPilotError):
    """The stock Program does not reproduce plain greedy decoding: nothing can be compared."""


def round_zero(stock: Program, evaluator, settings, device: str, progress) -> dict:
    """Measure the stock decoder: forcing, AR and stock timings, the device, the drafter's rank
    profile, and the first calibration of the cost model."""
    from specpilot.cost import CostModel, gpu_spec, measure_device, measure_rank_profile
    from specpilot.cost.gpu_specs import UnknownGpu

    progress("[round 0] token forcing of the stock Program")
    forcing = evaluator.force(stock)
    if not forcing.passed:
        raise StockForcingFailed(f"the stock Program fails token forcing against greedy AR: "
                                 f"{forcing.format()}")
    progress(f"[round 0] timing {evaluator.ar_label} and the stock Program "
             f"({settings.baseline_repeats} runs each)")
    ar = evaluator.time_ar(settings.baseline_repeats)
    timing = evaluator.time(stock, settings.baseline_repeats)
    output = check_output(timing.divergences, len(evaluator.prompts), forcing.tolerance)
    if not output.passed:
        raise StockForcingFailed(f"the stock Program's output differs from greedy AR: "
                                 f"{output.reason()}")
    progress("[round 0] measuring the device and the drafter's acceptance")
    measured = measure_device(device)
    try:
        spec = gpu_spec(stock.gpu).overridden_by(measured) if device != "cpu" else measured
    except UnknownGpu:
        spec = measured
    acceptance = measure_rank_profile(evaluator.stock_pair.drafter, evaluator.prompts,
                                      evaluator.reference.tokens,
                                      {"workload": settings.workload, "prompts": settings.prompts})
    model = CostModel(spec)
    lengths = [len(p) for p in evaluator.prompts]
    errors = {}
    for label, prediction, measured_run in (
            ("ar", model.predict_ar_run(stock, lengths, evaluator.new_tokens, settings.batch_size,
                                        graphed=evaluator.graphed_ar), ar),
            ("stock", model.predict_speculative_run(stock, acceptance, lengths,
                                                    evaluator.new_tokens), timing)):
        errors[label] = prediction.seconds / measured_run.median_seconds - 1.0
        model = model.calibrated(label, measured_run.median_seconds, prediction)
    context = max(lengths) + settings.max_new_tokens // 2
    predicted = model.predict_speculative_run(stock, acceptance, lengths, evaluator.new_tokens)
    report = model.report(stock, acceptance, settings.batch_size, context)
    report.measured_tokens_per_s = timing.median_tokens_per_s
    report.prediction_error = errors["stock"]
    progress(f"[round 0] {evaluator.ar_label} {ar.median_tokens_per_s:,.1f} tok/s, stock "
             f"{timing.median_tokens_per_s:,.1f} tok/s ({timing.mean_accepted or 0:.2f} tokens "
             f"per target forward); forcing {forcing.positions_compared} positions, "
             f"{len(forcing.violations)} violations")
    return {"round": 0, "kind": "stock", "chosen": "stock Program",
            "program_id": program_id(stock), "base_program_id": program_id(stock),
            "timing": dict(timing.to_json(), predicted_tokens_per_s=predicted.tokens_per_s),
            "base_timing": timing.to_json(),
            "ar_timing": ar.to_json(), "ar_label": evaluator.ar_label,
            "ar_fast_path": fast_ops_mode(stock.kernels.fast_path),
            "forcing": forcing.to_json(), "output": output.to_json(),
            "cost_report": report.to_json(),
            "chosen_cost_report": report.to_json(),
            "calibration": model.calibration.to_json(), "gpu_spec": spec.to_json(),
            "prediction_errors": errors, "device": device, "acceptance": acceptance,
            "acceptance_summary": {"label": acceptance.label,
                                   "rank_rates": acceptance.rank_rates(4),
                                   "per_depth_chain8": acceptance.per_depth_acceptance(8)},
            "outcomes": [], "evaluations": 0, "proposals": [], "ranking": [],
            "threshold": timing.spread}


def result_record(result, zero: dict) -> dict:
    """The JSON record of a search round (report.json)."""
    return {
        "round": result.index, "kind": "search", "chosen": result.chosen,
        "program_id": program_id(result.program), "base_program_id": program_id(result.base),
        "timing": result.timing, "base_timing": result.base_timing, "forcing": result.forcing,
        "output": result.output, "threshold": result.threshold, "gain": result.gain,
        "ranking": [{"direction": a.direction, "gap_s_per_token": s} for s, a in result.ranking],
        "proposals": [{"direction": p.direction, "proposals": [str(t) for t in p.proposals],
                       "notes": p.notes, "error": p.error,
                       "refusals": [r.__dict__ for r in p.refusals]} for p in result.proposals],
        "outcomes": [o.to_json() for o in result.outcomes],
        "evaluations": sum(1 for o in result.outcomes if o.stage in EVALUATED_STAGES),
        "cost_report": result.cost_report.to_json(),
        "chosen_cost_report": (result.chosen_report.to_json()
                               if result.chosen_report is not None else None),
        "calibration": result.cost_model.calibration.to_json(),
        "gpu_spec": zero["gpu_spec"], "ar_timing": zero["ar_timing"],
        "ar_label": zero["ar_label"], "stock_timing": zero["timing"],
        "prediction_errors": {"base": result.cost_report.prediction_error},
    }


def write_round(partial, k: int, result, stock: Program, base: Program,
                zero: Optional[dict], notes: List[str] = ()) -> dict:
    """Write program.json, diff.txt, report.json, report.md, candidates.json into `partial`;
    `result` is round 0's record or a RoundResult. Returns the record (report.json)."""
    from specpilot.report.markdown import round_markdown

    if isinstance(result, dict):
        record, program, own_notes = dict(result), stock, []
    else:
        record, program, own_notes = result_record(result, zero), result.program, result.notes
    record["notes"] = list(notes) + list(own_notes)
    save_program(program, str(partial / PROGRAM_FILE))
    text = (f"round {k} against round {k - 1}:\n{format_diff(diff(base, program))}\n\n"
            f"round {k} against the stock Program:\n{format_diff(diff(stock, program))}\n"
            if k > 0 else "round 0 is the stock Program\n")
    write_text_atomic(partial / "diff.txt", text)
    write_json_atomic(partial / "report.json", record)
    write_json_atomic(partial / "candidates.json", record.get("outcomes", []))
    write_text_atomic(partial / "report.md", round_markdown(record, text))
    return record


def record_round(memory, folder: RunFolder, partial, run_id: str, k: int, program: Program,
                 record: dict, signature: dict, hooks, result=None) -> None:
    """Seal the round's folder, record it in the memory (one transaction), put it in place and
    publish it as the best so far."""
    from specpilot.memory import Failure, Mechanism

    folder.seal(partial, k, program)
    mechanisms, failures = [], []
    for o in (result.outcomes if result is not None else []):
        if not o.admitted:
            failures.append(Failure(o.label, o.stage, o.reason or ""))
        if o.stage in EVALUATED_STAGES and len(o.transformations) == 1:
            forcing = o.forcing or {}
            summary = {k2: forcing.get(k2) for k2 in ("passed", "positions_compared", "exact")}
            summary["violations"] = len(forcing.get("violations", []))
            mechanisms.append(Mechanism(o.transformations[0], signature, o.gain,
                                        bool(forcing.get("passed")), summary, o.admitted,
                                        program_id(result.base), run_id, k))
    before = (lambda: hooks.before_commit(k)) if hooks.before_commit else None
    memory.complete_round(run_id, k, program_id(program),
                          (record.get("timing") or {}).get("median_tokens_per_s"),
                          mechanisms, failures, before_commit=before,
                          history=_path_from_stock(folder, k, program))
    if hooks.after_commit is not None:
        hooks.after_commit(k)
    folder.finish_round(k)
    folder.publish_best(k)


def _path_from_stock(folder: RunFolder, k: int, program: Program) -> tuple:
    """The transformations that made `program` from this run's stock Program (which already
    holds the run's own settings, such as its batch size: those are not worth remembering)."""
    if k == 0:
        return ()
    stock = folder.load_round_program(0).history
    return tuple(program.history[len(stock):])


def tried_outcomes(folder: RunFolder, k: int) -> Dict[str, List[Outcome]]:
    """{program id: [outcomes]} of every candidate evaluated in rounds before `k`."""
    out: Dict[str, List[Outcome]] = {}
    for j in range(1, k):
        path = folder.round_dir(j) / "candidates.json"
        if not path.exists():
            continue
        with open(path, encoding="utf-8") as f:
            for o in json.load(f):
                if o.get("program_id"):
                    out.setdefault(o["program_id"], []).append(
                        Outcome(o["label"], o["direction"], o["stage"], o.get("reason"),
                                o["program_id"], gain=o.get("gain")))
    return out
