"""How many batched steps continuous refill needs: each request holds a slot for as many steps
as it runs, and takes the first slot that frees, in queue order. Shared by the cost model's
workload prediction and the bench's refill replays; `packed_order` is a queue order for
requests whose rounds are known (for the bench: what an order could do; no decoder knows
them)."""
from __future__ import annotations

import heapq
from typing import Dict, List, Optional, Sequence


def refill_steps(lengths: Sequence[int], slots: int,
                 rounds_per_replay: Optional[int] = None, lag: int = 1) -> int:
    """Steps until `lengths` (steps each request needs, in queue order) are all done on `slots`
    slots, each request starting at the first step a slot is free.

    With `rounds_per_replay` the steps run as the refill decoder's host loop runs them
    (runtime/graphed_refill.py): in replays of that many, a request holding its slot for whole
    replays (at least one: a request done at its prefill is seen only after a replay), and its
    slot taken by the next request only `lag` replays after its last, since the host reads a
    replay's finished rows while the `lag` replays after it are queued (the loop's read-back
    lag, 1 by default). For the same reason the loop runs `lag` replays past the last
    request's. The count is then whole replays of steps."""
    # In units of `unit` steps: each request holds its slot for its units, its slot is free
    # `gap` units later, and the run ends `gap` units after the last request's end.
    if rounds_per_replay is None:
        unit, gap, holds = 1, 0, list(lengths)
    elif rounds_per_replay < 1:
        raise ValueError(f"rounds_per_replay must be at least 1, got {rounds_per_replay}")
    elif lag < 1:
        raise ValueError(f"lag must be at least 1, got {lag}")
    else:
        unit, gap = rounds_per_replay, lag
        holds = [max(1, -(-steps // unit)) for steps in lengths]
    free = [0] * slots                  # the unit each slot frees at (which slot does not count)
    end = 0
    for held in holds:
        start = free[0]
        heapq.heapreplace(free, start + held + gap)
        end = max(end, start + held)
    return (end + gap) * unit


def _best_fit(rounds: List[int], slots: int, capacity: int) -> Optional[List[List[int]]]:
    """Best-fit decreasing: each request, longest first, into the slot it leaves least room
    in, none past `capacity` rounds; None where one does not fit."""
    bins: List[List[int]] = [[] for _ in range(slots)]
    load = [0] * slots
    for r in sorted(rounds, reverse=True):
        fits = [i for i in range(slots) if load[i] + r <= capacity]
        if not fits:
            return None
        i = min(fits, key=lambda i: (capacity - load[i] - r, i))
        bins[i].append(r)
        load[i] += r
    return bins


def packed_order(rounds: Sequence[int], slots: int) -> List[int]:
    """A queue order from packing the requests' known rounds into `slots` slots: best-fit
    decreasing at the smallest capacity (from the lower bound, the longest request or full
    rows, up) where every request fits, then each slot's requests in turn, the queue ordered by
    when each would start (longest first among those starting together)."""
    rounds = list(rounds)
    capacity = max(max(rounds), -(-sum(rounds) // slots))
    while (bins := _best_fit(rounds, slots, capacity)) is None:
        capacity += 1
    starts = []
    for b in bins:
        t = 0
        for r in b:
            starts.append((t, -r))
            t += r
    return [-r for _, r in sorted(starts)]


def order_schedules(rounds: Sequence[int], slots: int) -> Dict[str, float]:
    """Steps for requests of known `rounds` on `slots` slots, refilled at once: in the queue's
    order (`at_once`), served longest first, in `packed_order`; and `full_rows`, every slot busy
    every step (sum / slots: no schedule takes fewer)."""
    rounds = list(rounds)
    return {"at_once": refill_steps(rounds, slots),
            "longest_first": refill_steps(sorted(rounds, reverse=True), slots),
            "packed": refill_steps(packed_order(rounds, slots), slots),
            "full_rows": sum(rounds) / slots}
