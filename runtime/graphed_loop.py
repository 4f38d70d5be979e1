"""The host side of the graphed runtime: replay a decoder's round graphs until every request
is done, reading back one status row per replay, one replay behind the GPU; then read the
results back once."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Union

import torch

from specpilot.ir.errors import SpecPilotError

from .speculative import SpecResult

# A graphed run's stats count its rounds of each chain length k as ROUNDS_OF + str(k).
ROUNDS_OF = "rounds_chain_"


def request_limits(max_new_tokens: Union[int, Sequence[int]], n: int) -> List[int]:
    """New tokens allowed per request: one count for all `n`, or one per request (a server's
    requests each bring their own); a SpecPilotError unless there are n counts, each >= 1."""
    limits = [max_new_tokens] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(limits) != n or any(not isinstance(m, int) or m < 1 for m in limits):
        raise SpecPilotError(f"max_new_tokens must be one count >= 1 or one per prompt ({n}), "
                             f"got {max_new_tokens!r}")
    return limits


def replay_length(chosen, lengths: List[int]) -> int:
    """The chain length to replay for a status row's chosen length (read back from the GPU),
    held to the lengths the decoder has graphs for (sorted)."""
    return min(max(int(chosen), lengths[0]), lengths[-1])


def replay_until_done(decoder, replays: Dict[int, object], forced: bool = False) -> Dict[int, int]:
    """Replay until every request of `decoder` (a GraphedChainDecoder) is done; returns the
    rounds run per chain length (their sum is the number of rounds).

    After queueing replay j the host reads the status of the last round of replay j - 1 (all
    finished? which length next?), so the GPU always has work queued. An adaptive decoder
    replays the length wanted two replays back, until it replays 0: speculation is then off
    for good, and its plain steps write no length. Forced runs cycle through every length,
    so that every verification width is checked."""
    cuda = decoder.device.type == "cuda"
    per = decoder.rounds_per_replay
    host, events = decoder.host_status, decoder.events
    replays_max = host.shape[0]
    lengths = sorted(replays)
    # The longest length, or the one the decoder's policy started the batch with.
    k = decoder.first_length        # forced runs choose theirs per replay below
    rounds: Dict[int, int] = {}
    for j in range(replays_max):
        if forced:
            k = lengths[j % len(lengths)]
        elif decoder.adaptive and j >= 2 and k != 0:
            k = replay_length(host[j - 2, 1], lengths)
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


def cut_tokens(decoder, rows: List[List[int]], counts: List[int], limits: List[int],
               trim_eos: bool) -> List[List[int]]:
    """Output rows of `decoder`'s requests with their token counts, each cut at its limit and,
    with `trim_eos`, after its first EOS (rounds may overshoot both)."""
    eos = sorted(set(decoder.eos.tolist())) if (trim_eos and decoder.eos is not None) else []
    tokens = []
    for row, c, limit in zip(rows, counts, limits):
        toks = row[:min(c, limit)]
        cut = first_of(toks, eos)
        tokens.append(toks if cut is None else toks[:cut + 1])
    return tokens


def first_of(tokens: List[int], wanted: Sequence[int]) -> Optional[int]:
    """The first position in `tokens` of any of `wanted`, or None. One list.index per wanted
    token: a call's 45k tokens scanned one by one in Python took 16 ms of host time after the
    last replay (this machine's CPU, 176 requests x 256), and it looks for one or two ids."""
    first = None
    for token in wanted:
        try:
            at = tokens.index(token, 0, len(tokens) if first is None else first)
        except ValueError:
            continue
        first = at
    return first


def kept_rows(out: torch.Tensor, counts: List[int], limits: List[int]) -> List[List[int]]:
    """The rows of `out` as lists, each only as far as the longest row keeps (its count, at
    most its limit): an output row is a cache's width (some 1300 slots for 256 new tokens), and
    converting every slot of 164 of them to Python ints took 13 ms of host time against 2 ms for
    the kept part (this machine's CPU), time a call spends after its last replay."""
    keep = max((min(c, limit) for c, limit in zip(counts, limits)), default=0)
    return out[:, :keep].tolist()


def read_tokens(decoder, n: int, limits: List[int], trim_eos: bool) -> List[List[int]]:
    """The output rows of the first `n` requests of `decoder`, cut as `cut_tokens` says."""
    counts = decoder.count[:n].tolist()
    return cut_tokens(decoder, kept_rows(decoder.out[:n], counts, limits), counts, limits,
                      trim_eos)


def mean_committed(accepted: List[List[int]]) -> float:
    """Tokens committed per (round, request that ran it): accepted drafts + 1, averaged over
    the rounds in `accepted` (per request, drafts accepted per round); 0.0 if none ran."""
    steps = sum(map(len, accepted))
    return (sum(map(sum, accepted)) + steps) / steps if steps else 0.0


def ar_stats(stats: dict) -> dict:
    """The stats of one call of plain greedy steps, eager or graphed: `speculation_off`, and
    the refills made where slots were refilled."""
    return {"speculation_off": 1, **({"refills": stats["refills"]} if "refills" in stats else {})}


def logged_result(decoder, tokens: List[List[int]], logged: List[List[int]],
                  by_length: Dict[int, int], prefills: int = 1,
                  stats: Optional[Dict[str, int]] = None) -> SpecResult:
    """A SpecResult of `decoder`'s run from the round log: `logged` holds, per request, the
    drafts accepted in each round of the log (-1 where the request did not run that round).
    The run made `prefills` prefills (a batch's, then one per refilled row) and the rounds of
    `by_length` (per chain length): the target ran once per prefill and per round, the drafter
    (where there is one) in each row prefill, in the batch's where that batch runs it
    (`drafter_prefilled`), and k times per round of k. The stats count the rounds of each
    length, then hold `stats`."""
    accepted = [list(filter((0).__le__, row)) for row in logged]      # a >= 0, at C speed
    drafter_prefills = (int(decoder.drafter_prefilled) + prefills - 1
                        if decoder.drafter is not None else 0)
    drafter_forwards = drafter_prefills + sum(k * c for k, c in by_length.items())
    counts = {f"{ROUNDS_OF}{k}": c for k, c in sorted(by_length.items())}
    return SpecResult(tokens, prefills + sum(by_length.values()), drafter_forwards, accepted,
                      mean_committed(accepted), stats={**counts, **(stats or {})})


def rounds_run(stats: dict) -> int:
    """The rounds a graphed run's stats count, of every chain length."""
    return sum(c for name, c in stats.items() if name.startswith(ROUNDS_OF))


def read_result(decoder, limits: List[int], by_length: Dict[int, int]) -> SpecResult:
    """What `generate` returns for its requests (each cut at its limit), given the rounds run
    per chain length (`replay_until_done`) after one prefill: tokens, forward counts, drafts
    accepted per round and the rounds of each length (stats)."""
    rounds, n = sum(by_length.values()), len(limits)
    tokens = read_tokens(decoder, n, limits, trim_eos=True)
    return logged_result(decoder, tokens, decoder.accepted[:rounds, :n].T.tolist(), by_length)
