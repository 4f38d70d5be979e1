"""The host side of the graphed runtime: replay a decoder's round graphs until every request
is done, reading back one status row per replay, one replay behind the GPU."""
from __future__ import annotations

from typing import Dict


def replay_until_done(decoder, replays: Dict[int, object], forced: bool = False) -> Dict[int, int]:
    """Replay until every request of `decoder` (a GraphedChainDecoder) is done; returns the
    rounds run per chain length (their sum is the number of rounds).

    After queueing replay j the host reads the status of the last round of replay j - 1 (all
    finished? which length next?), so the GPU always has work queued. An adaptive decoder
    replays the length wanted two replays back; forced runs cycle through every length, so
    that every verification width is checked."""
    cuda = decoder.device.type == "cuda"
    per = decoder.rounds_per_replay
    host, events = decoder.host_status, decoder.events
    replays_max = host.shape[0]
    lengths = sorted(replays)
    k = lengths[-1]
    rounds: Dict[int, int] = {}
    for j in range(replays_max):
        if forced:
            k = lengths[j % len(lengths)]
        elif decoder.adaptive and j >= 2:
            k = min(max(int(host[j - 2, 1]), lengths[0]), lengths[-1])
        replays[k]()
        rounds[k] = rounds.get(k, 0) + per
        last = min((j + 1) * per, decoder.width) - 1
        host[j].copy_(decoder.status[last], non_blocking=cuda)
        if cuda:
            events[j % 3].record()
        if j >= 1:
            if cuda:
                events[(j - 1) % 3].synchronize()
            if bool(host[j - 1, 0]):
                break
    return rounds
