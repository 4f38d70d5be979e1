"""The measuring loop the bench scripts share: one row per case, each printed as it finishes
and the whole file rewritten after each, so that a run cut short (a device call's time limit)
keeps every row it finished."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable, List

from specpilot.bench.environment import environment
from specpilot.search.run_folder import write_json_atomic


def measure_rows(cases: Iterable, measure: Callable[..., dict], report: Callable[[dict], str],
                 out: str, device_type: str, settings: dict, key: str) -> List[dict]:
    """`measure(case)` for each case in turn; after each, its `report` line with the seconds
    since the first began, and `out` written atomically as {"environment" (as the run began),
    "settings", key: the rows so far}. Returns the rows."""
    rows: List[dict] = []
    env, started = environment(device_type), time.perf_counter()
    for case in cases:
        rows.append(measure(case))
        print(report(rows[-1]), f"({time.perf_counter() - started:.0f} s)", flush=True)
        write_json_atomic(Path(out), {"environment": env, "settings": settings, key: rows})
    return rows
