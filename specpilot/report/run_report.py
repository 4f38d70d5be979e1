"""`build_run_report(run_dir)`: runs/NAME/report.md and its PNG plots from the round folders."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List

from specpilot.ir import diff, format_diff, load_program
from specpilot.ir.errors import SpecPilotError

from .markdown import _pct, _tps, forcing_line
from .plots import plot_cost_breakdown, plot_tokens_per_round

TOKENS_PLOT = "tokens_per_round.png"
COST_PLOT = "cost_breakdown.png"
REPORT_FILE = "report.md"


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


def build_run_report(run_dir) -> Path:
    """Write report.md, tokens_per_round.png and cost_breakdown.png into `run_dir`; returns the
    report's path."""
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
    lines = [f"# Compile report: {run_dir.name}", "",
             f"Target `{s.get('target_dir')}`, drafter `{s.get('drafter_dir')}`, on "
             f"{resolved.get('gpu')} ({resolved.get('device')}, {resolved.get('dtype')}), "
             f"workload {s.get('workload')} ({s.get('prompts')} prompts x "
             f"{s.get('max_new_tokens')} new tokens), batch {s.get('batch_size')}.", "",
             f"Best: round {best['round']}, {_tps(best['timing']['median_tokens_per_s'])} "
             f"tokens/s = {best['timing']['median_tokens_per_s'] / stock_tps:.2f}x the stock "
             f"Program" + (f", {best['timing']['median_tokens_per_s'] / ar_tps:.2f}x "
                           f"{records[0].get('ar_label')}" if ar_tps else "") + ".", "",
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
        evaluated = sum(1 for o in outcomes if o["stage"] in ("admitted", "not_admitted",
                                                                "forcing", "output"))
        lines.append(f"| {r['round']} | {r.get('chosen')} | {_tps(tps)} | "
                     f"{tps / stock_tps:.2f}x | "
                     f"{(f'{tps / ar_tps:.2f}x' if ar_tps else '—')} | "
                     f"{_pct(r.get('gain'))} | {compounded:.2f}x | "
                     f"{_tps(r['timing'].get('predicted_tokens_per_s'))} | {_pct(error)} | "
                     f"{admitted}/{evaluated} | {forcing_line(r.get('forcing'))} |")
    counts = _stage_counts(records)
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
    stock = load_program(str(run_dir / "round-0"))
    best_program = load_program(str(run_dir / f"round-{best['round']}"))
    lines += ["", "## The best Program against the stock Program", "", "```",
              format_diff(diff(stock, best_program)), "```", ""]
    path = run_dir / REPORT_FILE
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
