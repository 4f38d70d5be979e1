"""CompileSettings: everything a compile run is asked to do, as one value written to
runs/NAME/compile.json (a resumed run must be asked the same thing)."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from typing import Optional

from specpilot.ir.errors import SpecPilotError

COMPILE_FILE = "compile.json"

# The settings a resumed run must share with the run it resumes (the rest may change: more
# rounds, another candidate budget, an LLM endpoint).
IDENTITY_FIELDS = ("target_dir", "drafter_dir", "gpu", "dtype", "workload", "batch_size",
                   "prompts", "max_new_tokens")


class SettingsError(SpecPilotError):
    """Compile settings that are inconsistent, or that disagree with the run being resumed."""


@dataclass(frozen=True)
class CompileSettings:
    target_dir: str
    drafter_dir: str
    out_dir: str
    gpu: str = "auto"                 # a GPU name, "auto" (detect) or "cpu"
    dtype: Optional[str] = None       # default: bfloat16 on a GPU, float32 on a CPU
    workload: str = "humaneval"
    batch_size: int = 1
    rounds: int = 3
    prompts: int = 8                  # workload prompts used to force and time candidates
    max_new_tokens: int = 64
    candidates_per_round: int = 6
    timing_repeats: int = 3           # timed runs per candidate (median taken)
    baseline_repeats: int = 3         # timed runs of each round's base (their spread is noise)
    min_gain: float = 0.005           # admission floor when the measured spread is smaller
    memory_seeds: int = 3
    workers: int = 2
    # Intra-op threads while evaluating on a CPU. One: small models gain little from more, and
    # several threads spinning on a shared machine turn timings into noise.
    cpu_threads: int = 1
    memory_path: Optional[str] = None
    llm_endpoint: Optional[str] = None
    llm_model: Optional[str] = None
    llm_key_env: str = "OPENAI_API_KEY"
    llm_budget: int = 4

    def __post_init__(self):
        for name in ("batch_size", "rounds", "prompts", "max_new_tokens", "candidates_per_round",
                     "timing_repeats", "baseline_repeats", "workers", "cpu_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (0 if name == "rounds" else 1):
                raise SettingsError(f"{name} must be a positive integer, got {value!r}")
        if self.llm_endpoint and not self.llm_model:
            raise SettingsError("--llm-endpoint needs --llm-model")
        if self.dtype not in (None, "bfloat16", "float32"):
            raise SettingsError(f"dtype must be bfloat16 or float32, got {self.dtype!r}")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> "CompileSettings":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in known})

    def identity(self) -> dict:
        out = {name: getattr(self, name) for name in IDENTITY_FIELDS}
        out["target_dir"] = os.path.abspath(self.target_dir)
        out["drafter_dir"] = os.path.abspath(self.drafter_dir)
        return out
