"""Continuous refill in the graphed runtime: a finished request's slot takes the next request
from the queue between two replays, without draining the batch.

The padded graphed loop (runtime/graphed_chain.py) runs a batch until its longest request is
done, so the slots of requests that finished early, or accepted more, idle until then. Replayed
at Llama-3.1-8B / 3.2-1B shape on H200 step costs, refill made plain AR 1.25-1.33x and chain(4)
1.7-1.9x faster than their padded loops at batch 4 and 16, on a HumanEval profile whose requests
end at different lengths (BENCHMARKS.md). Here the round graphs stay as they are (a finished row
already runs along inactive); only the host loop and the state of one row change:

  - after each replay the host copies the rows' active flags back and reads them one replay
    behind, as the status row (SPECPILOT_REFILL_LAG or `readback_lag` reads further behind, so
    that more replays are queued while the host admits newcomers); a row that turned inactive
    is done;
  - its results (output row, count, per-round acceptance) are cloned on the device, in stream
    order, before a newcomer reuses the row (a row no newcomer takes is read in place at the end);
  - the newcomer's prompt is prefilled into that row of both caches (runtime/row_prefill.py:
    a graph per bucket width on scratch caches, on a GPU beside the rounds and by default
    ahead of the admission, the queue's next few held in staging caches; then copied into the
    row), and the row's state is set as a batch prefill would set it. A snapshot taken before
    the refill is not trusted for that row.

Once the queue is empty nobody waits for a slot, so plain steps (speculation off, or a plain
AR decoder) then replay DRAIN_PLAIN_ROUNDS rounds at a time while the batch's longest request
still needs that many, and single rounds after. What a request needs is read from its token
count, copied back with the active flags on these replays only: a plain round commits exactly
one token, so counted from a replay that ran plain after every row's admission, the bound is
exact. Where no request ends early by EOS the rounds are those of one round a replay, in fewer
replays; a request that ends by EOS at most 2 x DRAIN_PLAIN_ROUNDS - 1 rounds before the others
(one a replay: 1) leaves that many rounds run past it, as strong AR's four-round graphs do.

Acceptance is logged per row, by the row's own round counter (the run's rounds are unbounded
with refill; one request's are not), so the per-request acceptance is read back per request.
An unforced plain step only counts the round (every row that ran it accepted 0), so a plain
step runs fewer kernels than a padded decoder's: those of a refill decoder with k = 0 (plain AR
with refill), and of an adaptive one once speculation is off.

Chains of a fixed length (k = 0 is plain greedy AR with refill) or of adaptive lengths up to k;
draft trees with refill are runtime/graphed_tree_refill.py's. With adaptive lengths the
batch's length serves its tokens per unit of time, not the makespan of its current requests
(a refilled batch has no tail), a newcomer's estimates start from the averages of the requests
before it, and speculation turns off for the rest of the call once plain steps would serve the
batch faster by every estimate (runtime/batch_length.py): the drafter's cache is not kept up
after that. Once the queue is empty the batch drains like a padded one (by its makespan
again), and a newcomer alone in the batch starts it anew (speculating again, the host back at
the longest chain). A call with no queue (no more requests than slots) is one padded batch
from its start, so it remembers the workload and may start with speculation off as a padded
decoder's batch does (runtime/workload_memory.py); calls with a queue neither read nor teach
that memory.
"""
from __future__ import annotations

import itertools
from collections import deque
from typing import Dict, List, NamedTuple, Optional, Sequence, Union

import torch

from specpilot.ir.errors import SpecPilotError

from .cuda_graphs import to_device
from .env_counts import env_choice, env_count, given_count
from .graphed_chain import GraphedChainDecoder, begin_rows
from .graphed_loop import (cut_tokens, kept_rows, logged_result, replay_length,
                           request_limits)
from .row_prefill import RowPrefill
from .speculative import SpecResult


class _LoopResult(NamedTuple):
    """What the host loop (`GraphedRefillDecoder._run`) leaves of a call."""
    results: Dict[int, dict]     # per request: its row's results (`_take_row`)
    by_length: Dict[int, int]    # rounds run per chain length
    refills: int
    off_from: List[int]          # rounds queued each time the batch went plain
    restarts: int                # newcomers alone that started the batch anew


ROUNDS_ENV = "SPECPILOT_REFILL_ROUNDS"
# A slot whose request finishes waits for its replay's end and one replay more before its
# newcomer runs, so fewer rounds a replay refill sooner, at more host work a round. On an H200
# (run 28's pair, 64 HumanEval prompts, batch 16, bench/refill_timeline.py) a call took 707 /
# 658 / 650 ms at 4 / 2 / 1 rounds a replay with chain(4) (348 / 330 / 322 rounds), 713 / 677 /
# 665 with adaptive lengths; the gaps between replays and admissions stayed at 2.5-4.5 ms. Not
# raced against four at other batch sizes, nor for plain or tree refill (the bench has run with
# one at batch 4, 16 and 64: BENCHMARKS.md, fifteenth set).
REFILL_ROUNDS_PER_REPLAY = 1

LAG_ENV = "SPECPILOT_REFILL_LAG"
# Replays the host's read-back runs behind the replay it has just queued. The host admits
# newcomers after that read-back, while the replays queued since run. On an H200 (batch 16, run
# 50's pair, 164 HumanEval prompts) a lag of 2 was no faster than 1: chain(4) 1907 against 1883
# ms a call, adaptive 1820 against 1813; in the bench, adaptive + refill 21273 against 21973
# tokens/s, refill 21786 against 21799. An admission's host time grew with the replays queued
# (2.28 ms at lag 1, 3.98 at lag 2), because it set the row's state by element assignment, a
# copy that waited for them (`_admit` no longer does; BENCHMARKS.md, twenty-fifth set). Raced
# again after that change on two more pairs (runs 52 and 53), admissions at 0.6-1.2 ms of host
# time: lag 2 was still no faster (chain(4) 1406 against 1397 ms and 1705 against 1706,
# adaptive 1372 against 1362 and 1735 against 1723; twenty-sixth set). 1 stays the default.
REFILL_READBACK_LAG = 1
MAX_READBACK_LAG = 4


TOPUP_ENV = "SPECPILOT_REFILL_TOPUP"
# When the host tops up the newcomers held prefilled ahead (placement `ahead`) after a read-back
# that admitted some: "admitted", right after the admissions, before it queues the next replay;
# or "queued", once that replay is queued, while the GPU runs it. The admissions must come
# before the next replay (its rounds run the newcomers); the top-up is for later admissions, but
# done first it delays the next replay's queueing by its host time (about 0.6 ms a newcomer on
# an H200 beside 0.55 ms an admission), and where two or three rows finish in one read-back that
# outlasts the replay running meanwhile (1.5 ms at batch 16), so the GPU waits. Raced on an H200
# (run 70's pair, batch 16, 164 HumanEval prompts, three whole calls each): "queued" cut the
# GPU's idle time a call from 44.2 to 7.5 ms (chain(4)) and from 30.1 to 9.9 ms (adaptive), the
# call from 1271.4 to 1237.7 ms and from 1258.4 to 1246.8 (medians), every call of it faster
# than every call of "admitted"; its replays took 1 % longer, prefills now running beside them.
TOPUPS = ("admitted", "queued")
REFILL_TOPUP = "queued"


# Plain steps with nobody left to refill (the queue empty, speculation off or never on) replay
# this many rounds at a time while the batch's longest request still needs that many: a refill
# needs no finer grain then, and one round a replay pays a launch, a copy-back and an event per
# step. On an H200 (run 32's pair, 64 HumanEval prompts at batch 64, started off: 256 plain
# replays of one round) a step cost 1.019 of strong AR's, which replays four.
DRAIN_PLAIN_ROUNDS = 4


def refill_rounds_per_replay() -> int:
    """Rounds a captured refill decoder's replay runs when not told (`rounds_per_replay`):
    REFILL_ROUNDS_PER_REPLAY, or SPECPILOT_REFILL_ROUNDS (to measure others)."""
    return env_count(ROUNDS_ENV, REFILL_ROUNDS_PER_REPLAY, "rounds")


def refill_readback_lag(lag: Optional[int] = None) -> int:
    """Replays the refill loop's read-back runs behind (1..MAX_READBACK_LAG): `lag` as given,
    else SPECPILOT_REFILL_LAG's, else REFILL_READBACK_LAG."""
    if lag is None:
        return env_count(LAG_ENV, REFILL_READBACK_LAG, "replays", MAX_READBACK_LAG)
    return given_count(lag, "readback lag", "replays", MAX_READBACK_LAG)


def refill_topup(topup: Optional[str] = None) -> str:
    """When the refill loop tops up the newcomers held ahead (TOPUPS): `topup` as given, else
    SPECPILOT_REFILL_TOPUP's, else REFILL_TOPUP."""
    return env_choice(TOPUP_ENV, REFILL_TOPUP, TOPUPS, topup, "top-up")


def start_row_ops(logits, out, accepted, row_round, length, prev, limit_t, count, last, active,
                  eos, row: int, prompt_len: int, prompt_last: int, limit: int,
                  forced_first: Optional[torch.Tensor] = None) -> None:
    """A refilled newcomer's row started once its prefill is in the caches, as torch
    operations (unforced, the row_start kernel's reference, codegen/families.py): its first
    token g0 (the argmax of the prefill's last logits [1, V]) leads its cleared output row, its
    log's column is cleared (-1), its position, previous token, limit and count are set, and
    `begin_rows` gives its `last` and whether it runs (forced: from `forced_first`)."""
    g0 = torch.argmax(logits, dim=-1)
    out[row].zero_()
    out[row, :1] = g0
    # Host values go in by fill_ on a view of the row. An assignment to one element
    # (`length[row] = n`) copies a host scalar with a blocking copy, and in torch 2.11 that
    # waits for every replay queued: the GPU then idles while the host admits and queues the
    # next replay, and a longer read-back lag only makes the wait longer.
    accepted[:, row].fill_(-1)
    row_round[row].fill_(0)
    length[row].fill_(prompt_len)
    prev[row].fill_(prompt_last)
    limit_t[row].fill_(limit)
    count[row].fill_(1)
    begin_rows(last, active, count, limit_t, eos, slice(row, row + 1), g0, forced_first)


def _block_fits(held: List[Optional[int]], trusted_from: List[int], limits: List[int],
                counts: List[int], seen: int, since: int, block: int) -> bool:
    """Whether the longest held request still needs `block` plain rounds: by `counts`, the rows'
    token counts read back from drain replay `seen`, less the `since` rounds queued after it
    (all plain: one token a round). Only where every held row's request was in its row at `seen`
    (a newcomer's count there is its predecessor's); the rows that read-back showed finished
    are emptied already."""
    if any(i is not None and trusted_from[row] > seen for row, i in enumerate(held)):
        return False
    need = max((limits[i] - counts[row] for row, i in enumerate(held) if i is not None),
               default=0)
    return need - since >= block


class GraphedRefillDecoder(GraphedChainDecoder):
    """`GraphedChainDecoder` (chains of fixed length k or adaptive lengths up to k, or k = 0
    for plain steps) whose `generate` and `force` take any number of prompts and keep the
    batch's `batch` slots busy: a slot whose request is done takes the next one. Its host loop
    and per-row log also serve the tree decoders' rounds (runtime/graphed_tree_refill.py).
    Captured, a replay runs one round unless `rounds_per_replay` says otherwise
    (`refill_rounds_per_replay`). `prefill_placement`: when and where a newcomer's prefill
    runs (runtime/row_prefill.py; None: SPECPILOT_REFILL_PREFILL's, by default ahead of its
    admission, beside the rounds before it). `ahead_depth`: with the placement `ahead`, how
    many of the queue's next newcomers are held prefilled (None: SPECPILOT_REFILL_AHEAD's).
    `readback_lag`: replays the host's read-back of finished rows runs behind
    (`refill_readback_lag`; None: SPECPILOT_REFILL_LAG's, by default 1). `topup`: when the
    newcomers held ahead are topped up after admissions (`refill_topup`; None:
    SPECPILOT_REFILL_TOPUP's, by default once the next replay is queued)."""

    # Refilled slots leave no tail to wait for: an adaptive length serves the batch's
    # tokens per unit of time (runtime/batch_length.py).
    length_objective = "throughput"
    commit_log = "row"

    def __init__(self, target, drafter, batch: int, capacity: int, k: int,
                 eos_ids: Sequence[int] = (), capture: bool = True,
                 prefill_placement: Optional[str] = None,
                 readback_lag: Optional[int] = None, ahead_depth: Optional[int] = None,
                 topup: Optional[str] = None, **options):
        if options.get("record_margins"):
            raise SpecPilotError("continuous refill does not record margins: build the "
                                 "reference with the padded decoder")
        if capture and options.get("rounds_per_replay") is None:
            options["rounds_per_replay"] = refill_rounds_per_replay()
        super().__init__(target, drafter, batch, capacity, k, eos_ids, capture=capture,
                         **options)
        dev = self.device
        self.row_round = torch.zeros(batch, dtype=torch.int64, device=dev)
        cuda = dev.type == "cuda"
        self.lag = refill_readback_lag(readback_lag)
        self.topup = refill_topup(topup)
        # A ring of host copies and events: the replays from the one read back to the one just
        # queued are lag + 1, and the next one's copy must not land where the host is reading.
        self.ring = ring = self.lag + 2
        self.host_active = torch.zeros((ring, batch), dtype=torch.bool, pin_memory=cuda)
        self.host_next = torch.zeros((ring, 2), dtype=torch.int64, pin_memory=cuda)
        self.host_count = torch.zeros((ring, batch), dtype=torch.int64, pin_memory=cuda)
        self.ring_events = [torch.cuda.Event() for _ in range(ring)] if cuda else []
        self._row_prefill = RowPrefill(self._prefill_models(), capacity, capture,
                                       prefill_placement, ahead_depth)

    # ---- the round's log: per row, by the row's own round counter ---------------------------

    def _log_round(self, accepted: torch.Tensor, plain: bool = False) -> None:
        if plain:
            # An unforced plain step accepts no draft: every row that ran would log 0. Only the
            # row's round counter moves; its entry stays -1, read as 0 (`_accepted_rows`). Nor is
            # the status row written: the refill's host reads no "all finished", and holds a
            # plain length for good. The step then runs fewer kernels than a padded plain step.
            self.row_round.add_(accepted >= 0)
            self.round_index.add_(1)
            return
        # A row's log entry at its own round counter is still -1 (set by `_reset` or `_admit`;
        # a request runs fewer rounds than it has tokens, so the clamp never reaches a kept
        # entry): a row that did not run (-1) may write there unchanged. Three kernels fewer in
        # every round than keeping the old entry (a gather, a select, a cast).
        at = self.row_round.clamp(max=self.width - 1)[None, :]
        self.accepted.scatter_(0, at, accepted[None, :])
        self.row_round.add_(accepted >= 0)
        self._log_status(self.round_index.clamp(max=self.width - 1))

    def _reset(self) -> None:
        super()._reset()
        self.row_round.zero_()

    # ---- one row: results out, a newcomer in -----------------------------------------------

    def _drains_from_start(self, requests: int) -> bool:
        """A call with no more requests than slots has no queue: one padded batch."""
        return requests <= self.batch

    def _take_row(self, row: int, refilled: bool) -> dict:
        """What the request in `row` produced: device clones (stream-ordered, no sync) where a
        newcomer takes the row now, else views. Later rounds of this call leave a row no
        newcomer takes as it is (inactive rows write back what they hold; `_log_round`), so
        with no queue (or once it is empty) finishing costs no kernel at all."""
        taken = {"out": self.out[row], "count": self.count[row],
                 "accepted": self.accepted[:, row], "rounds": self.row_round[row]}
        return {key: t.clone() for key, t in taken.items()} if refilled else taken

    def _admit(self, row: int, prompt: Sequence[int], limit: int,
               reference: Optional[Sequence[int]] = None, alone: bool = False) -> None:
        """Prefill `prompt` into `row` of both caches and set the row's state as a batch
        prefill sets it: the first token its own argmax, or the reference's when forced."""
        logits = self._row_prefill.run(row, prompt)
        if self.policy is not None:
            self.policy.admit(row, alone)
        state = (self.out, self.accepted, self.row_round, self.length, self.prev, self.limit,
                 self.count, self.last, self.active, self.eos)
        if reference is None and self._row_start is not None:
            # The round end's generated kernel: start_row_ops's ~15 operations in one launch.
            self._row_start.launch(logits, *state, row, len(prompt), prompt[-1], limit)
            return
        forced_first = None
        if reference is not None:       # forced: the reference's first token, and no EOS stop
            self.ref[row].zero_()
            self.ref[row, :len(reference)] = to_device(
                torch.tensor(list(reference), dtype=torch.int64), self.device)
            forced_first = self.ref[row, :1]
        start_row_ops(logits, *state, row, len(prompt), prompt[-1], limit, forced_first)

    def _prefetch(self, prompts, queue: deque) -> None:
        """The queue's next newcomers prefilled ahead, as many as the placement holds."""
        depth = self._row_prefill.depth
        if depth and queue:
            self._row_prefill.prefetch([prompts[i] for i in itertools.islice(queue, depth)])

    def prepare_prefill(self, prompts: Sequence[Sequence[int]]) -> None:
        """Capture the prefill graphs these prompts will need now, as a first-wave batch and
        as newcomers."""
        super().prepare_prefill(prompts)
        self._row_prefill.prepare([len(p) for p in prompts])

    # ---- the host loop --------------------------------------------------------------------------

    def _run(self, prompts, limits: List[int], references=None):
        """Decode every prompt (each up to its limit; forced when `references` are given),
        refilling slots as requests finish (a `_LoopResult`). The host reads a replay back `lag`
        replays after it (one by default) and admits newcomers then. An adaptive decoder replays the
        length its policy chose lag + 1 replays back: its first lag + 1 replays run the length
        the call started with (the longest, or 0 where the workload memory started a call with
        no queue off), and the lag + 1 after a newcomer alone starts the batch anew the
        longest. Once it replays 0 it holds 0 (off is for good, and plain steps write no next
        length) until such a newcomer. Forced runs cycle through every length."""
        n, b, per, lag, ring = len(prompts), self.batch, self.rounds_per_replay, self.lag, self.ring
        forced = references is not None
        lengths = self._lengths()
        replays = {k: self._runner(forced, k) for k in lengths}   # captured before the set-up
        # Plain steps in blocks once nobody is left to refill (DRAIN_PLAIN_ROUNDS).
        block = DRAIN_PLAIN_ROUNDS
        plain_block = (self._runner(False, 0, rounds=block)
                       if not forced and 0 in lengths and per < block else None)
        # The newcomers' prefill graphs too: captured lazily, a bucket would sync the device
        # mid-call (a capture does) and its first prefill could not run beside a round.
        self._row_prefill.prepare([len(p) for p in prompts[self.batch:]])
        self._ensure_round_costs(prompts, limits)
        first = list(range(min(n, b)))
        self._start([prompts[i] for i in first], [limits[i] for i in first],
                    None if references is None else [references[i] for i in first], requests=n)
        queue = deque(range(len(first), n))
        # Where the placement is `ahead`, the queue's next newcomers are prefilled ahead of
        # their admission, beside the rounds (runtime/row_prefill.py), and topped up after each
        # read-back's admissions, or once the replay after them is queued (`topup`: then the
        # first ones too are prefilled once the first replay is queued, as no admission comes
        # before its read-back); otherwise prefetch does nothing.
        self._row_prefill.forget()
        top_up_queued = self.topup == "queued"
        if not top_up_queued:
            self._prefetch(prompts, queue)
        top_up = top_up_queued          # the held newcomers are to be topped up after a replay
        held: List[Optional[int]] = list(first) + [None] * (b - len(first))
        trusted_from = [0] * b          # snapshots of replays before this one are stale
        # Rounds queued so far; per drain replay (its counts copied back), the rounds queued
        # through it; the counts of the last read-back, where it was of a drain replay.
        rounds_run = 0
        counted: Dict[int, int] = {}
        counts: List[int] = []
        results: Dict[int, dict] = {}
        cuda = self.device.type == "cuda"
        by_length: Dict[int, int] = {}
        k = self.first_length           # forced runs choose theirs per replay below
        replayed, refills = 0, 0
        restarted = 0                   # lengths read back from before this replay are stale
        # For the result's `length_rule`: the rounds queued when the batch went plain (each
        # time: a restart may turn it on again) and how often a newcomer alone restarted it.
        off_from: List[int] = []
        restarts = 0
        draining = self.policy is None  # the policy is told once, when the queue is empty
        while True:
            if not draining and not queue:
                self.policy.queue_empty()
                draining = True
            j = replayed
            if forced:
                k = lengths[j % len(lengths)]
            rounds = per
            drain = k == 0 and not queue and plain_block is not None
            seen = j - 1 - lag          # the replay the last read-back (`counts`) was of
            if drain and seen in counted and _block_fits(held, trusted_from, limits, counts,
                                                         seen, rounds_run - counted[seen], block):
                plain_block()
                rounds = block
            else:
                replays[k]()
            replayed += 1
            rounds_run += rounds
            by_length[k] = by_length.get(k, 0) + rounds
            self.host_active[j % ring].copy_(self.active, non_blocking=cuda)
            if drain:
                self.host_count[j % ring].copy_(self.count, non_blocking=cuda)
                counted[j] = rounds_run
            # The next length (rounds past the log's end all write its last row); not after a
            # plain replay, whose read-back is never used (off is read no more, and a restart
            # distrusts what came before it).
            if self.adaptive and k != 0:
                self.host_next[j % ring].copy_(self.status[min(rounds_run, self.width) - 1],
                                               non_blocking=cuda)
            if cuda:
                self.ring_events[j % ring].record()
            if top_up:                  # the replay after the admissions is queued now
                self._prefetch(prompts, queue)
                top_up = False
            read = j - lag              # the replay read back now, `lag` behind this one
            if read < 0:
                continue
            if cuda:
                self.ring_events[read % ring].synchronize()
            if self.adaptive and not forced and read >= restarted and k != 0:
                # Off is for good (until a newcomer alone restarts the batch, below): plain
                # steps write no length.
                k = replay_length(self.host_next[read % ring, 1], lengths)
                if k == 0:
                    off_from.append(rounds_run)
            active = self.host_active[read % ring].tolist()
            if read in counted:
                counts = self.host_count[read % ring].tolist()
            done = [row for row in range(b) if held[row] is not None and not active[row]
                    and read >= trusted_from[row]]
            for at, row in enumerate(done):     # the first len(queue) rows are refilled below
                results[held[row]] = self._take_row(row, refilled=at < len(queue))
                held[row] = None
            # Every finished row is emptied before any is refilled: a newcomer is alone when no
            # row holds a request still running (as of this read-back), whatever its row.
            for row in done:
                if queue:
                    i = queue.popleft()
                    alone = all(h is None for h in held)
                    self._admit(row, prompts[i], limits[i],
                                None if references is None else references[i], alone)
                    held[row], trusted_from[row] = i, j + 1
                    refills += 1
                    if alone and self.adaptive and not forced:
                        k, restarted = lengths[-1], j + 1     # the batch starts anew
                        restarts += 1
            if done:            # those held ahead change only with admissions
                if top_up_queued:
                    top_up = True
                else:
                    self._prefetch(prompts, queue)
            if all(h is None for h in held):
                break
            # Each request holds its slot for at most its rounds' replays and lag + 1 more (the
            # replay it is seen in, and those queued meanwhile): counted in replays, so that
            # many rounds a replay cannot trip it.
            if replayed > (n + b) * (-(-(self.width + 1) // per) + 1 + lag):
                raise SpecPilotError("the refill loop ran past every request's limit: a "
                                     "request never finished")
        return _LoopResult(results, by_length, refills, off_from, restarts)

    def _tokens(self, results: Dict[int, dict], limits: List[int], trim_eos: bool):
        """Every request's tokens from its row's results (`_take_row`), read back at once."""
        n = len(limits)
        counts = torch.stack([results[i]["count"] for i in range(n)]).tolist()
        rows = kept_rows(torch.stack([results[i]["out"] for i in range(n)]), counts, limits)
        return cut_tokens(self, rows, counts, limits, trim_eos)

    @staticmethod
    def _accepted_rows(results: Dict[int, dict], n: int) -> List[List[int]]:
        """Per request, the drafts accepted in each round it ran. Its plain steps logged
        nothing (`_log_round`), and come after its last speculative round: speculation, once
        off, stays off for every request running then, and a request that restarts the batch
        is admitted before the restart's first round."""
        rounds = torch.stack([results[i]["rounds"] for i in range(n)]).tolist()
        # Entries past a request's rounds are -1 (rounds past the log's end all write its last
        # entry): the log is read only as far as the longest request's rounds reach.
        logged = torch.stack([results[i]["accepted"] for i in range(n)])
        logged = logged[:, :max(rounds, default=0)]
        # The entries >= 0, row by row, as one masked read (row-major, so each row's in order)
        # rather than a Python filter over every entry.
        kept = logged >= 0
        flat = logged[kept].tolist()
        ends = list(itertools.accumulate(kept.sum(dim=1).tolist()))
        rows = [flat[start:end] for start, end in zip([0] + ends, ends)]
        return [row + [0] * (r - len(row)) for row, r in zip(rows, rounds)]

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]],
                 max_new_tokens: Union[int, Sequence[int]]) -> SpecResult:
        """Greedy speculation (chains, or plain steps for k = 0; trees in the tree refill
        decoders) of any number of prompts, `max_new_tokens` each (one count for all, or one per
        prompt), `batch` at a time with continuous refill."""
        if not prompts:
            raise SpecPilotError("no prompts to decode")
        n = len(prompts)
        limits = request_limits(max_new_tokens, n)
        for start in range(0, n, self.batch):
            self._check(prompts[start:start + self.batch], max(limits[start:start + self.batch]))
        call = self._run(prompts, limits)
        results, by_length, refills = call.results, call.by_length, call.refills
        if self.policy is not None and self._drains_from_start(n):
            # A call with no queue ran as one padded batch (one request per row): the workload
            # memory learns from it as from a padded decoder's batch. A refilled row's counts
            # mix requests, so calls with a queue teach it nothing.
            self.policy.remember_batch()
        tokens = self._tokens(results, limits, trim_eos=True)
        logged = self._accepted_rows(results, n)
        # The first wave's batched prefill (the drafter's unless that batch started off), then
        # one per refill.
        result = logged_result(self, tokens, logged, by_length, prefills=1 + refills,
                               stats={"refills": refills})
        if self.adaptive:
            result.length_rule = self._length_rule(call)
        return result

    def _length_rule(self, call: _LoopResult) -> dict:
        """What the length rule decided a call by, for replaying it on the CPU: the prices of a
        round of each length in plain steps (measured on the GPU, `_ensure_round_costs`), the
        rounds queued before each turn-off, and the restarts by a newcomer alone."""
        return {"prices": [round(float(c), 4) for c in self.policy.round_cost_host],
                "off_from_round": call.off_from, "restarts": call.restarts}

    @torch.no_grad()
    def force(self, prompts: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]
              ) -> List[List[int]]:
        """What the decoder proposes at each reference position, committing the reference,
        for any number of prompts with continuous refill."""
        if not reference or len(reference) != len(prompts) or any(not r for r in reference):
            raise SpecPilotError("force needs one non-empty reference token list per prompt")
        longest = max(len(r) for r in reference)
        for start in range(0, len(prompts), self.batch):
            self._check(prompts[start:start + self.batch], longest)
        limits = [len(r) for r in reference]
        return self._tokens(self._run(prompts, limits, references=reference).results, limits,
                            trim_eos=False)
