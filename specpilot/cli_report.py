"""`specpilot report`: the markdown report and PNG plots of a compile run folder."""
from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="write the report and plots of a compile run",
                       description="Write runs/NAME/report.md with tokens/s per round against "
                                   "the stock Program and AR, the cost breakdown per round and "
                                   "the forcing summary, plus tokens_per_round.png and "
                                   "cost_breakdown.png.")
    p.add_argument("run", metavar="runs/NAME", help="a folder written by specpilot compile")
    p.set_defaults(handler=run)


def run(args) -> int:
    from specpilot.report import build_run_report

    path = build_run_report(args.run)
    print(path)
    return 0
