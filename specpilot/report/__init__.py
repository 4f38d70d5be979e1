"""Reports of compile runs: per-round markdown, the run report and its PNG plots."""
from .markdown import forcing_line, round_markdown
from .run_report import RunReportError, build_run_report, load_rounds

__all__ = ["forcing_line", "round_markdown", "RunReportError", "build_run_report", "load_rounds"]
