"""Write a bench result document as <name>.json, <name>.md and <name>.png in one folder.

All three are rendered to temporary files first and renamed into place only when every one
succeeded, so a failure leaves no half-written result behind.
"""
from __future__ import annotations

import json
import os
import re
from typing import Callable, Dict, Optional

from specpilot.ir.errors import SpecPilotError

from .plot import plot_tokens_per_s
from .report_md import update_section

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise SpecPilotError(f"--name {name!r}: use letters, digits, '.', '_' and '-' "
                             f"(it becomes a file name)")
    return name


def write_results(doc: dict, out_dir: str, markdown: str, plot_title: str,
                  ylabel: str = "tokens/s", extra_json: Optional[Dict[str, dict]] = None,
                  benchmarks_md: Optional[str] = None) -> Dict[str, str]:
    """Write doc (JSON), markdown and the plot of doc["rows"]; `extra_json` maps more file
    suffixes (e.g. ".acceptance.stock.json") to objects written alongside. Returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, check_name(doc["name"]))
    writers: Dict[str, Callable[[str], None]] = {
        ".json": lambda p: _dump(doc, p),
        ".md": lambda p: _text(markdown, p),
        ".png": lambda p: plot_tokens_per_s(doc["rows"], plot_title, p, ylabel),
    }
    for suffix, obj in (extra_json or {}).items():
        writers[suffix] = lambda p, obj=obj: _dump(obj, p, indent=None)
    staged = {}
    try:
        for suffix, write in writers.items():
            tmp = f"{base}{suffix}.tmp"
            staged[suffix] = tmp
            write(tmp)
    except BaseException:
        for tmp in staged.values():
            if os.path.exists(tmp):
                os.remove(tmp)
        raise
    paths = {}
    for suffix, tmp in staged.items():
        os.replace(tmp, base + suffix)
        paths[suffix] = base + suffix
    if benchmarks_md:
        update_section(benchmarks_md, doc["name"], markdown)
        paths["benchmarks_md"] = benchmarks_md
    return paths


def _dump(obj, path: str, indent: Optional[int] = 1) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent, allow_nan=False)
        f.write("\n")


def _text(text: str, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


class PartialResults:
    """<out_dir>/<name>.partial.json, rewritten (atomically) with the document as it stands, so
    a bench that is killed or times out still leaves what it measured."""

    def __init__(self, out_dir: str, name: str):
        self.path = os.path.join(out_dir, check_name(name) + ".partial.json")
        self.out_dir = out_dir

    def write(self, doc: dict) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        tmp = self.path + ".tmp"
        _dump(dict(doc, complete=False), tmp)
        os.replace(tmp, self.path)

    def remove(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)
