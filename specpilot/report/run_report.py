"""`build_run_report(run_dir)`: runs/NAME/report.md, report.json and the PNG plots, from the
round folders."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List

from specpilot.ir import PROGRAM_FILE, Program, diff, format_diff, load_program
from specpilot.ir.errors import SpecPilotError
from specpilot.search.evaluations import count_evaluations, round_evaluations
from specpilot.search.output_check import output_summary

from .baseline_note import baseline_note
from .markdown import _pct, _tps, forcing_line
from .plots import plot_cost_breakdown, plot_tokens_per_round

TOKENS_PLOT = "tokens_per_round.png"
COST_PLOT = "cost_breakdown.png"
REPORT_FILE = "report.md"
REPORT_JSON = "report.json"


class RunReportError(SpecPilotError):
    """A folder that holds no completed compile round."""


def load_rounds(run_dir: Path) -> List[dict]:
    """The report.json of every completed round, in round order."""
    rounds = []
    for folder in run_dir.glob("round-*"):
        suffix = folder.name[len("round-"):]
        if folder.is_dir() and suffix.isdigit() and (folder / "report.json").exists():
            with open(folder / "report.json", encoding="utf-8") as f:
                rounds.append(json.load(f))
    rounds.sort(key=lambda r: r["round"])
    if not rounds or rounds[0]["round"] != 0:
        raise RunReportError(f"{run_dir} holds no completed compile rounds (round-0/report.json); "
                             "run `specpilot compile --out` into it first")
    return rounds


def _stage_counts(records: List[dict]) -> dict:
    counts: dict = {}
    for r in records:
        for o in r.get("outcomes", []):
            counts[o["stage"]] = counts.get(o["stage"], 0) + 1
    return counts


def _near_tie_outputs(records: List[dict]) -> List[tuple]:
    """(round, label, output check) of every evaluated candidate (and the stock Program) whose
    unforced output was accepted with near-tie divergences."""
    found = [(0, "stock Program", records[0].get("output"))]
    found += [(r["round"], o["label"], o.get("output")) for r in records
              for o in r.get("outcomes", [])]
    return [(k, label, o) for k, label, o in found if (o or {}).get("near_tie_count")]


def run_summary(run_dir: Path, records: List[dict]) -> dict:
    """report.json of a run: the best Program, the evaluations spent (in all and until the best
    was first reached), and per round its choice, speed, evaluations and near-tie divergences."""
    best = records[-1]
    count = count_evaluations(records)
    return dict(count.to_json(), run=run_dir.name, best_round=best["round"],
                best_program_id=best["program_id"],
                best_tokens_per_s=best["timing"]["median_tokens_per_s"],
                stock_tokens_per_s=records[0]["timing"]["median_tokens_per_s"],
                ar_tokens_per_s=(records[0].get("ar_timing") or {}).get("median_tokens_per_s"),
                stages=_stage_counts(records),
                near_tie_outputs=[{"round": k, "label": label, "near_ties": o["near_ties"]}
                                  for k, label, o in _near_tie_outputs(records)],
                rounds=[{"round": r["round"], "chosen": r.get("chosen"),
                         "program_id": r["program_id"],
                         "tokens_per_s": r["timing"]["median_tokens_per_s"],
                         "gain": r.get("gain"), "evaluations": round_evaluations(r),
                         "admitted": sum(1 for o in r.get("outcomes", []) if o.get("admitted")),
                         "near_tie_divergences": (r.get("output") or {}).get("near_tie_count", 0)}
                        for r in records])


def _baseline_lines(run_dir: Path, zero: dict, stock: Program) -> List[str]:
    """The note on what the best Program's ratio to AR measures, where it is not speculation
    (specpilot/report/baseline_note.py), as report lines."""
    path = run_dir / PROGRAM_FILE
    if not zero.get("ar_timing") or not path.exists():
        return []
    # Runs that did not record AR's fast path ran it on the stock Program's.
    ar_path = zero.get("ar_fast_path") or stock.kernels.fast_path
    note = baseline_note(load_program(str(path)), zero.get("ar_label", "AR"), ar_path)
    return [note, ""] if note else []


def build_run_report(run_dir) -> Path:
    """Write report.md, report.json, tokens_per_round.png and cost_breakdown.png into
    `run_dir`; returns the path of report.md."""
    run_dir = Path(run_dir)
    records = load_rounds(run_dir)
    settings = {}
    if (run_dir / "compile.json").exists():
        with open(run_dir / "compile.json", encoding="utf-8") as f:
            settings = json.load(f)
    plot_tokens_per_round(records, str(run_dir / TOKENS_PLOT))
    plot_cost_breakdown(records, str(run_dir / COST_PLOT))

    stock_tps = records[0]["timing"]["median_tokens_per_s"]
    ar_tps = (records[0].get("ar_timing") or {}).get("median_tokens_per_s")
    s, resolved = settings.get("settings", {}), settings.get("resolved", {})
    best = max(records, key=lambda r: r["round"])
    summary, count = run_summary(run_dir, records), count_evaluations(records)
    stock = load_program(str(run_dir / "round-0"))
    lines = [f"# Compile report: {run_dir.name}", "",
             f"Target `{s.get('target_dir')}`, drafter `{s.get('drafter_dir')}`, on "
             f"{resolved.get('gpu')} ({resolved.get('device')}, {resolved.get('dtype')}), "
             f"workload {s.get('workload')} ({s.get('prompts')} prompts x "
             f"{s.get('max_new_tokens')} new tokens), batch {s.get('batch_size')}.", "",
             f"Best: round {best['round']}, {_tps(best['timing']['median_tokens_per_s'])} "
             f"tokens/s = {best['timing']['median_tokens_per_s'] / stock_tps:.2f}x the stock "
             f"Program" + (f", {best['timing']['median_tokens_per_s'] / ar_tps:.2f}x "
                           f"{records[0].get('ar_label')}" if ar_tps else "") + ".", "",
             *_baseline_lines(run_dir, records[0], stock),
             f"The best Program was first chosen in round {count.best_round}: "
             f"{count.summary()} (a candidate evaluation is one candidate token-forced "
             f"and, if it passed, timed).", "",
             f"![tokens/s per round]({TOKENS_PLOT})", "", f"![cost breakdown]({COST_PLOT})", "",
             "## Rounds", "",
             "Tokens/s are measured over the whole workload (prefills included); the "
             "prediction is the calibrated cost model's for the same workload, made with what "
             "was measured up to the end of the round; the prediction error is that of the "
             "round's base, predicted before its own timing refitted the model.", "",
             "Tokens/s taken at different times share the machine with whatever else ran; "
             "each round's gain is therefore measured alternately with its base, and "
             "'compounded' multiplies those paired gains from the stock Program on.", "",
             "| round | chosen | tokens/s | vs stock | vs AR | paired gain | compounded | "
             "predicted tokens/s | prediction error | candidates admitted | "
             "forcing of the chosen Program |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    compounded = 1.0
    for r in records:
        compounded *= 1.0 + (r.get("gain") or 0.0)
        tps = r["timing"]["median_tokens_per_s"]
        error = (r.get("prediction_errors") or {})
        error = error.get("stock", error.get("base"))
        outcomes = r.get("outcomes", [])
        admitted = sum(1 for o in outcomes if o.get("admitted"))
        evaluated = round_evaluations(r)
        lines.append(f"| {r['round']} | {r.get('chosen')} | {_tps(tps)} | "
                     f"{tps / stock_tps:.2f}x | "
                     f"{(f'{tps / ar_tps:.2f}x' if ar_tps else '—')} | "
                     f"{_pct(r.get('gain'))} | {compounded:.2f}x | "
                     f"{_tps(r['timing'].get('predicted_tokens_per_s'))} | {_pct(error)} | "
                     f"{admitted}/{evaluated} | {forcing_line(r.get('forcing'))} |")
    counts = summary["stages"]
    lines += ["", "## Forcing and admission summary", "",
              "Every candidate is token-forced against the stock decoder before it is timed; "
              "one violation rejects it.", "",
              "| stage | candidates |", "|---|---:|"]
    lines += [f"| {stage} | {n} |" for stage, n in sorted(counts.items())] or ["| — | 0 |"]
    rejected = [(r["round"], o) for r in records for o in r.get("outcomes", [])
                if o["stage"] == "forcing"]
    if rejected:
        lines += ["", "Rejected by token forcing:", ""]
        lines += [f"- round {k}: {o['label']}: {o.get('reason')}" for k, o in rejected]
    near = _near_tie_outputs(records)
    lines += ["", f"Unforced outputs accepted with near-tie divergences (a first divergence "
              f"where the reference's top-1/top-2 margin is below the forcing tolerance): "
              f"{len(near)}" + ("." if not near else ":"), ""]
    lines += [f"- round {k}: {label}: {output_summary(o)}" for k, label, o in near]
    best_program = load_program(str(run_dir / f"round-{best['round']}"))
    lines += ["", "## The best Program against the stock Program", "", "```",
              format_diff(diff(stock, best_program)), "```", ""]
    (run_dir / REPORT_JSON).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n",
                                       encoding="utf-8")
    path = run_dir / REPORT_FILE
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
