"""How many batched steps continuous refill needs: each request holds a slot for as many steps
as it runs, and takes the first slot that frees (the lowest on a tie), in queue order. Shared by
the cost model's workload prediction and the bench's refill replays."""
from __future__ import annotations

import heapq
from typing import Sequence


def refill_steps(lengths: Sequence[int], slots: int) -> int:
    """Steps until `lengths` (steps each request needs, in queue order) are all done on `slots`
    slots, each request starting at the first step a slot is free (the lowest slot on a tie)."""
    free = [(0, slot) for slot in range(slots)]
    end = 0
    for steps in lengths:
        start, slot = heapq.heappop(free)
        end = max(end, start + steps)
        heapq.heappush(free, (start + steps, slot))
    return end
