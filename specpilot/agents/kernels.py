"""Kernel agent: the Program's own generated kernels, CUDA-graph capture, and tile/warp/stage
tuning of the kernels the cost report puts furthest from their bandwidth limit.

On a CPU it proposes nothing: generated kernels run there in Triton's interpreter, a
correctness tool whose timings say nothing about a GPU. Per-node tuning needs a Transformation
that writes `kernels.overrides`; when the IR registers one named `TuneKernel` with `node`,
`param` and `value` fields, tile candidates are proposed through it.
"""
from __future__ import annotations

from typing import List

from specpilot.ir import TRANSFORMATIONS, CaptureGraphs, Program, SetBackend, Transformation

from .base import Agent, Budget

# Tile sizes to try for a linear node far from its bandwidth limit (the lowering's defaults sit
# in the middle of these ranges).
TILE_CHOICES = (("BLOCK_N", (32, 64, 128)), ("BLOCK_K", (32, 64, 128)))


def _tune_record():
    cls = TRANSFORMATIONS.get("TuneKernel")
    if cls is None or set(cls.PARAMS) != {"node", "param", "value"}:
        return None
    return cls


class KernelAgent(Agent):
    direction = "kernels"
    categories = ("launch_sync", "attention_kv")

    def propose(self, program: Program, cost_report, memory,
                budget: Budget) -> List[Transformation]:
        self._reset()
        if program.gpu == "cpu":
            self.notes.append("kernel tuning is measured on a GPU only (on a CPU the generated "
                              "kernels run in Triton's interpreter)")
            return []
        proposals: List[Transformation] = []
        if program.kernels.backend != "generated":
            proposals.append(SetBackend("generated"))
        if not program.kernels.capture_graphs:
            proposals.append(CaptureGraphs(True))
        tune = _tune_record()
        if tune is None:
            self.notes.append("per-node tile tuning needs a TuneKernel(node, param, value) "
                              "transformation, which the IR does not define")
        elif program.kernels.backend == "generated" and cost_report is not None:
            for node in cost_report.nodes:
                if node.kind not in ("attention", "mlp", "lm_head"):
                    continue
                for param, values in TILE_CHOICES:
                    proposals += [tune(node=node.name, param=param, value=v) for v in values]
        return self._legal(program, proposals, memory)[:budget.max_proposals]
