"""How many batched steps continuous refill needs: each request holds a slot for as many steps
as it runs, and takes the first slot that frees, in queue order. Shared by the cost model's
workload prediction and the bench's refill replays."""
from __future__ import annotations

import heapq
from typing import Optional, Sequence


def refill_steps(lengths: Sequence[int], slots: int,
                 rounds_per_replay: Optional[int] = None) -> int:
    """Steps until `lengths` (steps each request needs, in queue order) are all done on `slots`
    slots, each request starting at the first step a slot is free.

    With `rounds_per_replay` the steps run as the refill decoder's host loop runs them
    (runtime/graphed_refill.py): in replays of that many, a request holding its slot for whole
    replays (at least one: a request done at its prefill is seen only after a replay), and its
    slot taken by the next request only the replay after the next, since the host reads a
    replay's finished rows while the next replay already runs. For the same reason the loop
    runs one replay past the last request's. The count is then whole replays of steps."""
    if rounds_per_replay is None:
        free = [0] * slots              # the step each slot frees at (which slot does not count)
        end = 0
        for steps in lengths:
            start = free[0]
            heapq.heapreplace(free, start + steps)
            end = max(end, start + steps)
        return end
    if rounds_per_replay < 1:
        raise ValueError(f"rounds_per_replay must be at least 1, got {rounds_per_replay}")
    free = [0] * slots                  # the replay each slot's next request starts at
    end = 0                             # replays run until the last request is done
    for steps in lengths:
        start = free[0]
        held = max(1, -(-steps // rounds_per_replay))
        heapq.heapreplace(free, start + held + 1)
        end = max(end, start + held)
    return (end + 1) * rounds_per_replay
