"""How many batched steps continuous refill needs: each request holds a slot for as many steps
as it runs, and takes the first slot that frees, in queue order. Shared by the cost model's
workload prediction and the bench's refill replays."""
from __future__ import annotations

import heapq
from typing import Sequence


def refill_steps(lengths: Sequence[int], slots: int) -> int:
    """Steps until `lengths` (steps each request needs, in queue order) are all done on `slots`
    slots, each request starting at the first step a slot is free."""
    free = [0] * slots                  # the step each slot frees at (which slot does not count)
    end = 0
    for steps in lengths:
        start = free[0]
        heapq.heapreplace(free, start + steps)
        end = max(end, start + steps)
    return end
