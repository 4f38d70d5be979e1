"""Markdown of one round (round-K/report.md) and of a whole compile run (runs/NAME/report.md)."""
from __future__ import annotations

from typing import List, Optional

from specpilot.cost.report import CostReport
from specpilot.search.output_check import output_summary


def _tps(value: Optional[float]) -> str:
    return f"{value:,.1f}" if isinstance(value, (int, float)) else "—"


def _pct(value: Optional[float]) -> str:
    return f"{value:+.1%}" if isinstance(value, (int, float)) else "—"


def forcing_line(forcing: Optional[dict]) -> str:
    if not forcing:
        return "—"
    verdict = "passed" if forcing.get("passed") else "REJECTED"
    return (f"{verdict}: {forcing.get('positions_compared')}/{forcing.get('positions_expected')} "
            f"positions, {forcing.get('exact')} exact, {len(forcing.get('near_tie_flips', []))} "
            f"near-tie flips, {len(forcing.get('violations', []))} violations")


def _output_lines(what: str, record: dict) -> List[str]:
    """The unforced-output check of `what`, with every near-tie divergence it tolerated."""
    if not record.get("output"):
        return []
    return [f"Unforced output of {what}: {output_summary(record['output'])} (a first divergence "
            f"is tolerated only at a near-tie of the reference, margin below "
            f"{record['output']['tolerance']:.3g}).", ""]


def _cell(text) -> str:
    return str(text if text is not None else "—").replace("|", "\\|").replace("\n", " ")


def round_markdown(record: dict, diff_text: str) -> str:
    """The report of one round from its record (report.json) and its IR diff text."""
    k = record["round"]
    lines: List[str] = [f"# Round {k}", ""]
    timing, base = record.get("timing") or {}, record.get("base_timing") or {}
    if record.get("kind") == "stock":
        ar = record.get("ar_timing") or {}
        lines += [f"The stock Program, measured: {_tps(timing.get('median_tokens_per_s'))} "
                  f"tokens/s (spread {timing.get('spread', 0):.1%}); {record.get('ar_label')}: "
                  f"{_tps(ar.get('median_tokens_per_s'))} tokens/s.", "",
                  f"Token forcing of the stock Program: {forcing_line(record.get('forcing'))}.",
                  ""] + _output_lines("the stock Program", record)
        errors = record.get("prediction_errors") or {}
        if errors:
            lines += ["Cost-model prediction error before calibration: "
                      + ", ".join(f"{name} {_pct(e)}" for name, e in errors.items()) + ".", ""]
        summary = record.get("acceptance_summary") or {}
        if summary:
            rates = ", ".join(f"rank {r}: {x:.0%}" for r, x in enumerate(summary["rank_rates"]))
            depth = ", ".join(f"{x:.2f}" for x in summary["per_depth_chain8"])
            lines += [f"Drafter acceptance ({summary['label']}): {rates}; per-depth acceptance "
                      f"of chain(8): {depth}.", ""]
    else:
        gain = record.get("gain")
        measured = (f"chosen {_tps(timing.get('median_tokens_per_s'))} tokens/s, "
                    f"{_pct(gain)} over the base timed alternately with it"
                    if gain is not None else "nothing admitted")
        lines += [f"Chosen: **{record.get('chosen')}**.", "",
                  f"Base {_tps(base.get('median_tokens_per_s'))} tokens/s at the start of the "
                  f"round (spread {base.get('spread', 0):.1%}); {measured}. Admission needs a "
                  f"gain above {record.get('threshold', 0):.1%}.", "",
                  f"Token forcing of the chosen Program: {forcing_line(record.get('forcing'))}.",
                  ""] + _output_lines("the chosen Program", record)
        if "evaluations" in record:
            lines += [f"Candidate evaluations this round: {record['evaluations']}.", ""]
    for note in record.get("notes") or []:
        lines += [f"Note: {note}", ""]
    lines += ["## IR diff", "", "```", diff_text.rstrip(), "```", ""]
    if record.get("cost_report"):
        title = "## Cost model (the round's base)" if k else "## Cost model"
        lines += [title, "", CostReport.from_json(record["cost_report"]).format_markdown(), ""]
    if record.get("ranking"):
        lines += ["## Directions, ranked by gap", "", "| direction | gap µs/token | proposals | "
                  "notes |", "|---|---:|---:|---|"]
        props = {p["direction"]: p for p in record.get("proposals", [])}
        for r in record["ranking"]:
            p = props.get(r["direction"], {})
            notes = "; ".join(p.get("notes", []) + ([p["error"]] if p.get("error") else []))
            lines.append(f"| {r['direction']} | {r['gap_s_per_token'] * 1e6:,.2f} | "
                         f"{len(p.get('proposals', []))} | {_cell(notes or '')} |")
        lines.append("")
    outcomes = record.get("outcomes") or []
    if outcomes:
        lines += ["## Candidates", "", "| candidate | direction | stage | tokens/s | gain | "
                  "predicted error | forcing | unforced output | reason |",
                  "|---|---|---|---:|---:|---:|---|---|---|"]
        for o in outcomes:
            timing_o = o.get("timing") or {}
            forcing = o.get("forcing")
            short = ("—" if not forcing else
                     f"{'pass' if forcing['passed'] else 'FAIL'} "
                     f"({len(forcing.get('violations', []))} violations)")
            lines.append(f"| {_cell(o['label'])} | {o['direction']} | {o['stage']} | "
                         f"{_tps(timing_o.get('median_tokens_per_s'))} | {_pct(o.get('gain'))} | "
                         f"{_pct(o.get('prediction_error'))} | {short} | "
                         f"{_cell(output_summary(o.get('output')))} | {_cell(o.get('reason'))} |")
        lines.append("")
    return "\n".join(lines)
