"""Weight-format agent: store linears in a smaller lossless format where weight movement is the
gap. Scopes go from coarse to fine (a whole model, its MLPs, its attention, its head), so one
round can test the broad change and the next the parts that paid."""
from __future__ import annotations

from typing import List

from specpilot.ir import WEIGHT_FORMATS, Program, SetWeightFormat, Transformation

from .base import Agent, Budget, rank_by_prediction

SCOPES = ("*", "mlp.*", "self_attn.*", "lm_head")


class WeightFormatAgent(Agent):
    direction = "weight_format"
    categories = ("weight_movement", "drafting")

    def __init__(self, cost_model, acceptance):
        super().__init__()
        self.cost_model, self.acceptance = cost_model, acceptance

    def propose(self, program: Program, cost_report, memory,
                budget: Budget) -> List[Transformation]:
        self._reset()
        proposals = []
        for role in ("target", "drafter"):
            model = getattr(program.models, role)
            current_bits = max(WEIGHT_FORMATS[fmt].bits for _, fmt in model.weight_formats)
            smaller = [name for name, f in WEIGHT_FORMATS.items()
                       if f.lossless and f.dtype == model.dtype and f.bits < current_bits]
            if not smaller:
                self.notes.append(f"{role}: no lossless format smaller than its "
                                  f"{current_bits}-bit weights exists for {model.dtype}")
            proposals += [SetWeightFormat(f"{role}.{scope}", fmt)
                          for fmt in smaller for scope in SCOPES]
        legal = self._legal(program, proposals, memory)
        if not legal:
            return []
        ranked = rank_by_prediction(program, legal, self.cost_model, self.acceptance,
                                    program.batch.max_batch_size)
        if len(ranked) < len(legal):
            self.notes.append(f"{len(legal) - len(ranked)} legal format changes are predicted "
                              "to gain nothing")
        return [t for _, t in ranked[:budget.max_proposals]]
