"""CostReport: what the cost model says about one Program on one GPU.

Per generated token, the predicted time splits into six categories (`CATEGORIES`); the gap to the
deployment's ceiling splits into the same six plus `topology` (how far the Program's topology is
from the best one the acceptance profile allows, both at their ideal cost). The category with
the largest gap is the dominant one.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

CATEGORIES = ("weight_movement", "verification_compute", "drafting", "attention_kv",
              "launch_sync", "batching_waste")
GAP_CATEGORIES = CATEGORIES + ("topology",)

CATEGORY_TITLES = {
    "weight_movement": "weight movement",
    "verification_compute": "verification compute",
    "drafting": "drafting",
    "attention_kv": "attention/KV",
    "launch_sync": "launch/sync overhead",
    "batching_waste": "batching waste",
    "topology": "draft topology",
}


@dataclass
class NodeSummary:
    name: str
    kind: str
    seconds: float            # calibrated, per step
    bound: str                # "memory" or "compute"
    bandwidth_efficiency: float   # bytes/bandwidth over the node's predicted time (0..1)


@dataclass
class CostReport:
    program_id: str
    topology: str
    gpu: dict
    batch_size: int
    context: int
    acceptance: str
    mean_accepted: float
    idle_fraction: float
    step_s: float
    tokens_per_s: float
    breakdown_per_token_s: Dict[str, float]
    ceiling_tokens_per_s: float
    ceiling_topology: str
    program_ceiling_tokens_per_s: float
    gap_per_token_s: Dict[str, float]
    dominant: str
    nodes: List[NodeSummary] = field(default_factory=list)
    calibration: dict = field(default_factory=dict)
    prediction_error: Optional[float] = None
    measured_tokens_per_s: Optional[float] = None
    notes: List[str] = field(default_factory=list)

    @property
    def gap_fraction(self) -> float:
        """Share of the predicted time per token that lies above the ceiling."""
        total = sum(self.breakdown_per_token_s.values())
        return sum(self.gap_per_token_s.values()) / total if total > 0 else 0.0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> "CostReport":
        data = dict(obj)
        data["nodes"] = [NodeSummary(**n) for n in data.get("nodes", [])]
        return cls(**data)

    def format_markdown(self) -> str:
        """A readable markdown section: prediction, ceiling, gap table, dominant category."""
        lines = [
            f"Predicted decode (steady state) {self.tokens_per_s:,.1f} tokens/s "
            f"({self.step_s * 1e3:.3f} ms per step, "
            f"{self.mean_accepted:.2f} drafts accepted per step, {self.topology}, batch "
            f"{self.batch_size}, context {self.context}) on {self.gpu.get('name')} "
            f"[{self.gpu.get('source')}].",
            f"Ceiling {self.ceiling_tokens_per_s:,.1f} tokens/s with {self.ceiling_topology} "
            f"(this topology at its ideal: {self.program_ceiling_tokens_per_s:,.1f}).",
            f"Acceptance: {self.acceptance}.",
        ]
        if self.measured_tokens_per_s is not None:
            lines.append(f"Measured {self.measured_tokens_per_s:,.1f} tokens/s.")
        if self.prediction_error is not None:
            lines.append(f"Prediction error (before calibrating on this run): "
                         f"{self.prediction_error:+.1%}.")
        else:
            lines.append("Prediction error: not measured yet.")
        lines += ["", "| category | predicted µs/token | gap to ceiling µs/token |",
                  "|---|---:|---:|"]
        for c in GAP_CATEGORIES:
            have = self.breakdown_per_token_s.get(c)
            shown = f"{have * 1e6:,.2f}" if have is not None else "—"
            mark = " **(dominant)**" if c == self.dominant else ""
            lines.append(f"| {CATEGORY_TITLES[c]}{mark} | {shown} | "
                         f"{self.gap_per_token_s.get(c, 0.0) * 1e6:,.2f} |")
        if self.nodes:
            lines += ["", "Nodes furthest from their bandwidth limit:", "",
                      "| node | kind | µs/step | bound | bandwidth efficiency |",
                      "|---|---|---:|---|---:|"]
            for n in self.nodes:
                lines.append(f"| {n.name} | {n.kind} | {n.seconds * 1e6:,.2f} | {n.bound} | "
                             f"{n.bandwidth_efficiency:.0%} |")
        for note in self.notes:
            lines.append(f"\nNote: {note}")
        return "\n".join(lines)
