"""The chain length of a padded batch's next round, and when to stop speculating.

In a padded batch every request verifies the same chain of L drafts, so the length is one choice
for the whole batch. With drain refill a batch is done when its slowest request is.
On an H200, chain(4) on a 161M pair committed 3.74 tokens per round at batch 64 for 2.42 plain
steps of cost, yet only tied plain decoding: the requests whose drafter agreed least ran on long
after the others had finished, and decided the batch's length.

So the length is chosen for the makespan. Request i, with `remaining_i` tokens to go and
per-draft acceptance alpha_i (runtime/adaptive_draft.py's estimate), needs about
remaining_i * cost(L) / E_i(L) plain-step times at length L, where E_i(L) = 1 + alpha_i + ... +
alpha_i^L and cost(L) is a round of L drafts in units of a plain step (cost(0) = 1: no drafter,
one token). The batch takes the longest of its active requests; the next round runs the L in
1..cap with the shortest such makespan. Where a plain step (L = 0) would finish sooner than every
L >= 1, speculation has stopped paying for this batch: the decoder turns it off and keeps it off
until the batch is done (the drafter's cache is no longer kept up, so it cannot come back; the
next batch starts speculating again). It only does so after `OFF_AFTER_ROUNDS` rounds, once the
estimates have left their optimistic prior. Eight, not four: a request's first rounds are among
its worst. On the H200 pair's HumanEval chain(4) profiles (runs 9-12) rounds 1-4 accepted
1.40-1.56 drafts and 76-83 % of them met a rejection, rounds 17-64 2.35-3.09 and 31-57 % (rounds
past 64, which only the least agreeing requests reach, are as poor as the first;
bench/results/acceptance-by-round.json). Judged at the fourth round, the rule turned off batches
of 16 that the fixed chain sped up 1.12x (run 11, four prompts). Replayed on five such profiles
(bench/results/turn-off-sweep.json), eight rounds lift batch 4 by up to 0.13x and batch 1 by up
to 0.03x; they cost a first batch of 64 up to 0.015x (a remembered workload starts later ones
off: runtime/workload_memory.py), batch 16 up to 0.02x (0.03x with refill), a useless drafter
0.01x, and one-slot refill with a useless drafter 0.04x.

Because off is for good, it needs more than the recent rounds: it is decided on the larger of
the moving-average alpha and the request's whole-history alpha (accepted drafts and rejections
counted since the batch began), so a request whose drafter agrees well overall is not cut off by
a few bad rounds. On HumanEval chain(4) profiles replayed with step costs measured at
Llama-3.1-8B / 3.2-1B shape on an H200, the moving average alone turned most batch-1 requests
off early (1.02x plain AR, against 1.20x for the fixed chain); with the whole history too the
rule gave 1.19x there, and 0.97-0.98x with a useless drafter, as before
(bench/results/llama8b-1b-replayed-*-history-rule.json, BENCHMARKS.md).

The whole-history alpha is an upper confidence bound (adaptive_draft.upper_acceptance: the mean of
Beta(accepted + 1, rejections + 1) plus `OFF_CONFIDENCE` standard deviations), not the mean.
After four rounds the mean is noise: on the H200 a 161M pair whose chain(4) gained 1.19x at batch
4 had a request or two in most batches open with three or four rejections, the batch turned off
at its fourth round and the rule gave 1.03x; with refill one such turn-off held for the whole
queue (1.17x against 1.51x for the fixed chain). The bound alone would let a drafter that truly
never agrees off after five rounds where rounds are dear, about ten where they are cheap (the
first eight are never judged now, above). Replayed on that pair's profiles (8B-shape costs, and
the pair's own), it lifted the rule at batch 1-16 (up to 1.00x -> 1.42x with refill at batch 4)
and cost at most 0.01x with a useless drafter when the turn-off was judged from the fourth round.

With continuous refill (runtime/graphed_refill.py, objective "throughput") a finished slot takes
the next request at once, so no request's tail decides anything: the length is the one with the
least time per token over the active requests, cost(L) / sum_i E_i(L), until the queue is empty
(`draining`: the batch then drains like a padded one, and its makespan counts again, unless
a Program's batch.length_drain "throughput" keeps the time per token: `queue_empty`). A
newcomer's estimates start from the averages per round of the requests before it (`admit`); one
that arrives alone in the batch (always, with one slot) starts the batch anew, as a padded batch
would, so that no request is judged on another's rounds.

cost(L) is measured: the graphed decoder times a replay of each length's graph against the plain
step's (`measure_round_costs`), which prices the drafter's kernels, the wider verification and
the batch size as they really are. Without a GPU it is the model 1 + c L (`model_round_costs`).

E_i(L) above is the one-alpha estimate (a Program's batch.length_estimator "geometric", the
default). With "per_depth" it is 1 + p_1 + p_1 p_2 + ... from each request's acceptance per draft
depth, for drafts that agree in runs (runtime/depth_acceptance.py), and the turn-off is judged by
an upper bound per depth the same way; the one-alpha state is still kept for the workload
memory, which judges a batch's start by it either way.

The update itself runs in every speculative round, so it is priced too: as eager tensor
operations it was some 75 small kernels in the captured round, 7 % of a round on the H200 (run
19: the adaptive decoder's rounds against fixed decoders' of the same lengths). A captured
decoder runs it compiled (`policy_round`, `compiled_policy_round`): a few kernels, 0.2-0.9 %
over the fixed rounds (run 20), the same lengths. A decoder whose round ends in generated
kernels (accept_kernels "fused") runs it as one more, the length_policy family
(codegen/round_end.py, `BatchLengthPolicy.next_into`): on the H200 a captured batch-16
chain(4) round with it cost 1.001x the fixed round's, against 1.009x with the compiled update
(BENCHMARKS.md, thirty-first set).
"""
from __future__ import annotations

import functools
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from specpilot.ir.errors import SpecPilotError
from specpilot.ir.program import LENGTH_DRAINS, LENGTH_ESTIMATORS

from .adaptive_draft import (OFF_CONFIDENCE, SMOOTHING, acceptance_rate, check_draft_cost,
                             expected_tokens, update_acceptance, upper_acceptance)
from .depth_acceptance import (DEPTH_SMOOTHING, depth_expected_tokens, depth_trials,
                               update_depth_rates)
from .workload_memory import WorkloadMemory

# Rounds seen before a batch may turn speculation off (its estimates start at alpha = 1).
OFF_AFTER_ROUNDS = 8
# What a refilled batch's length optimises once its queue is empty is a Program's
# batch.length_drain (ir.program.LENGTH_DRAINS): "makespan" (it drains like a padded batch, its
# slowest request deciding) or "throughput" (time per token, as while refilling). Replayed on
# the chain(4) profiles of 16 batch-16 and batch-64 calls (runs 55-63,
# bench/drain_rule_replay.py, BENCHMARKS.md thirtieth set), the makespan let one request that
# agreed poorly turn the whole drain off for good: run 63 ran 0.94x (batch 16) and 0.91x (64) of
# the fixed chain(4) with refill, as the H200 measured it (0.935x, 0.932x). With the per-depth
# estimate, the throughput drain stayed within 0.986-1.028x of the fixed chain in every call.
# Raced on the H200 (runs 64-66, BENCHMARKS.md thirty-first set) it ran 0.953-1.002x the fixed
# chain and 0.986-1.030x the default adaptive row: no better than either, so the makespan stays
# the default (the batching agent proposes the other, and the compiler measures it).


# Replays timed per length when measuring round costs (the best of them is kept).
TIMING_REPEATS = 3


def model_round_costs(cap: int, draft_cost: float) -> List[float]:
    """cost(L) = 1 + draft_cost * L for L in 0..cap: one verification plus L drafter steps, in
    units of a plain step (used where the rounds cannot be timed)."""
    return [1.0 + draft_cost * n for n in range(cap + 1)]


def makespans(expected: torch.Tensor, remaining: torch.Tensor, active: torch.Tensor,
              round_cost: torch.Tensor) -> torch.Tensor:
    """[cap + 1]: for each length L, the longest remaining_i * cost(L) / E_i(L) over the active
    requests (0 where none is active), from each request's expected tokens a round E_i(L)
    [batch, cap + 1] (adaptive_draft.expected_tokens of its alpha, or
    depth_acceptance.depth_expected_tokens). Tensor operations only (safe inside a CUDA
    graph)."""
    times = remaining.to(expected.dtype)[:, None] * round_cost[None, :] / expected
    return torch.where(active[:, None], times, torch.zeros_like(times)).max(dim=0).values


def times_per_token(expected: torch.Tensor, active: torch.Tensor,
                    round_cost: torch.Tensor) -> torch.Tensor:
    """[cap + 1]: for each length L, cost(L) over the tokens a round of it commits summed over
    the active requests, sum_i E_i(L) (inf where none is active): the batch's time per token
    when every finished slot is refilled at once, so no request's tail decides anything."""
    total = torch.where(active[:, None], expected, torch.zeros_like(expected)).sum(dim=0)
    return round_cost / total


def next_length(expected: torch.Tensor, remaining: Optional[torch.Tensor],
                active: torch.Tensor, round_cost: torch.Tensor, objective: str = "makespan",
                draining: Optional[torch.Tensor] = None):
    """(the length in 1..cap with the shortest makespan, or with `objective` "throughput" the
    least time per token, and whether a plain step would beat it), from each request's expected
    tokens a round E_i(L) [batch, cap + 1]: int64 and bool 0-dim tensors. The shortest length
    wins a tie. With "throughput", `draining` (a bool tensor: the refill queue is empty)
    switches back to the makespan, on the device; `remaining` is read only for the makespan."""
    if objective != "throughput":
        return shortest(makespans(expected, remaining, active, round_cost))
    spans = times_per_token(expected, active, round_cost)
    if draining is not None:
        spans = torch.where(draining, makespans(expected, remaining, active, round_cost), spans)
    return shortest(spans)


def shortest(spans: torch.Tensor):
    """(the length in 1..cap with the least of `spans` [cap + 1], whether length 0's is less):
    int64 and bool 0-dim tensors. The shortest length wins a tie."""
    best = torch.argmin(spans[1:]) + 1
    # min, not spans[best]: indexing with a tensor reads it on the host, which a graph forbids.
    return best, spans[0] < spans[1:].min()


def measure_round_costs(replays: Dict[int, Callable[[], None]], reset: Callable[[], None],
                        device: torch.device) -> List[float]:
    """cost(L) for every length in `replays` (which must hold 0, the plain step): the best of a
    few timed replays of each, over the plain step's. `reset` puts the decoder in a state where
    replays change nothing a later call reads (every row inactive; a decoder puts them at a
    call's typical context, `GraphedChainDecoder.timing_context`). Timed
    with CUDA events on a GPU, with the host clock elsewhere (eager replays: a script's check)."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = {}
    for n, replay in sorted(replays.items()):
        reset()
        replay()                                   # warm: the first replay uploads the graph
        best = float("inf")
        for _ in range(TIMING_REPEATS):
            if cuda:
                start.record()
                replay()
                end.record()
                end.synchronize()
                best = min(best, start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                replay()
                best = min(best, time.perf_counter() - t0)
        ms[n] = best
    reset()
    if cuda:
        torch.cuda.synchronize(device)
    return [ms[n] / ms[0] for n in sorted(ms)]


class DepthState:
    """The per-depth estimate's device state (runtime/depth_acceptance.py) for a batch of
    `batch` rows and chains of up to `cap`: rates [batch, cap] (moving averages, 1 at first),
    tried / took [batch, cap] (whole-history counts) and workload [2, cap] (tries and
    acceptances per depth over every request since the batch began)."""

    def __init__(self, batch: int, cap: int, f32: dict):
        self.rates = torch.ones(batch, cap, **f32)
        self.tried = torch.zeros(batch, cap, **f32)
        self.took = torch.zeros(batch, cap, **f32)
        self.workload = torch.zeros(2, cap, **f32)

    def restart(self) -> None:
        """Every row back to the optimistic prior, no history."""
        self.rates.fill_(1.0)
        self.tried.zero_()
        self.took.zero_()

    def admit(self, row: int, prior: torch.Tensor) -> None:
        """A newcomer at `row`: its rates are the workload's per depth (1 at a depth nobody has
        tried), its history the workload's counts times `prior` (as the one-alpha history is:
        `off_after` average rounds of the workload; 0 before any)."""
        tried, took = self.workload
        self.rates[row] = torch.where(tried > 0, took / tried.clamp(min=1.0),
                                      torch.ones_like(tried))
        self.tried[row] = tried * prior
        self.took[row] = took * prior


class BatchLengthPolicy:
    """The device-resident state of a padded batch's adaptive length: per request moving
    averages of accepted drafts and of rejections, the round cost per length 0..cap (in plain
    steps) and whether the batch has turned speculation off. Every update is tensor operations
    on the device, so it runs inside a captured round. With the objective "throughput"
    (continuous refill) it also keeps what a newcomer starts from (`admit`); with `turn_off`,
    what the finished batches that drained from their start taught of the workload
    (`remember_batch`, `start`)."""

    def __init__(self, batch: int, cap: int, device, draft_cost: float,
                 round_costs: Optional[Sequence[float]] = None, turn_off: bool = True,
                 objective: str = "makespan", off_after: int = OFF_AFTER_ROUNDS,
                 compile_rounds: bool = False, smoothing: float = SMOOTHING,
                 estimator: str = "geometric", drain: str = "makespan",
                 update_kernel=None, admit_kernel=None):
        """`off_after`: rounds seen before a batch may turn off (OFF_AFTER_ROUNDS; another
        value for replays that weigh the choice, bench/turn_off_sweep.py). `compile_rounds`:
        run each round's update compiled (`compiled_policy_round`: for captured rounds on a
        GPU) rather than as eager tensor operations. `smoothing`: the moving averages' weight on
        the newest round (runtime/adaptive_draft.py). `estimator` (a Program's
        batch.length_estimator, one of LENGTH_ESTIMATORS): what a chain of L is expected to
        commit, from one acceptance per request or one per request and depth
        (runtime/depth_acceptance.py); the lengths chosen differ, never the tokens. `drain` (a
        Program's batch.length_drain, one of LENGTH_DRAINS; objective "throughput" only): what
        the length optimises once the refill's queue is empty (`queue_empty`).
        `update_kernel`, `admit_kernel`: built modules of the length_policy and length_admit
        families for this policy's estimator, objective and turn-off (a decoder whose round
        ends in generated kernels, codegen/round_end.py): `next_into` and `admit` then launch
        them rather than run torch operations."""
        if off_after < 1:
            raise SpecPilotError(f"off_after must be at least 1 round, got {off_after}")
        if not 0.0 < smoothing <= 1.0:
            raise SpecPilotError(f"smoothing must be in (0, 1], got {smoothing}")
        if objective not in ("makespan", "throughput"):
            raise SpecPilotError(f"length objective {objective!r}: makespan or throughput")
        if estimator not in LENGTH_ESTIMATORS:
            raise SpecPilotError(f"length estimator {estimator!r}: "
                                 f"{' or '.join(LENGTH_ESTIMATORS)}")
        if drain not in LENGTH_DRAINS:
            raise SpecPilotError(f"length drain {drain!r}: {' or '.join(LENGTH_DRAINS)}")
        self.cap, self.turn_off, self.objective = cap, turn_off, objective
        # A padded batch drains from its start: its makespan is all there is.
        self.drain = drain if objective == "throughput" else "makespan"
        self.off_after, self.smoothing, self.estimator = off_after, smoothing, estimator
        self._round = (policy_round if update_kernel is not None or not compile_rounds
                       else compiled_policy_round())
        self._update_kernel, self._admit_kernel = update_kernel, admit_kernel
        f32 = dict(dtype=torch.float32, device=device)
        self.accepted_avg = torch.full((batch,), float(cap), **f32)
        self.rejected_avg = torch.zeros(batch, **f32)
        self.round_cost = torch.empty(cap + 1, **f32)
        self.set_round_costs(list(round_costs) if round_costs is not None
                             else model_round_costs(cap, check_draft_cost(draft_cost)))
        self.off = torch.zeros((), dtype=torch.bool, device=device)
        # The length last chosen: kept through rounds where no request is active (refilled
        # slots wait for the host), where every length would look alike.
        self.chosen = torch.full((), cap, dtype=torch.int64, device=device)
        # Since the batch began: drafts accepted and rounds with a rejection, per request, and
        # over every request the batch has held ([accepted, rejections, request rounds]).
        self.accepted_total = torch.zeros(batch, **f32)
        self.rejected_total = torch.zeros(batch, **f32)
        # Per request, the acceptance the batch's first turn-off decision judged it by (-1: none).
        self.first_judged = torch.full((batch,), -1.0, **f32)
        self.workload = torch.zeros(3, **f32)
        # Per depth (estimator "per_depth"): each request's moving-average acceptance, its
        # whole-history tries and acceptances, and every request's tries and acceptances since
        # the batch began (what a newcomer starts from). None with the one-alpha estimate.
        self.depth = (DepthState(batch, cap, f32) if estimator == "per_depth" else None)
        # Speculative rounds since the batch (re)started, and (refill) whether the queue is
        # empty: with no newcomer left, the batch drains and its makespan matters again.
        self.rounds = torch.zeros((), dtype=torch.int64, device=device)
        self.draining = torch.zeros((), dtype=torch.bool, device=device)
        # The workload's finished requests, from one batch to the next: read for batches that
        # drain from their start (padded ones, and refill calls with no queue), whose makespan
        # the slowest request decides.
        self.memory = WorkloadMemory() if turn_off else None
        self._started_off = False       # this batch, by `start`

    @property
    def compiled(self) -> bool:
        """Whether each round's update runs compiled (`compiled_policy_round`)."""
        return self._round is not policy_round

    def set_round_costs(self, costs: Sequence[float]) -> None:
        """The cost of a round of each length 0..cap (in plain steps, or any one unit), on the
        device for the rounds and on the host for `start`: the one place either is written."""
        if len(costs) != self.cap + 1:
            raise SpecPilotError(f"round_costs needs one cost per length 0..{self.cap}, got "
                                 f"{len(costs)}")
        self.round_cost_host = torch.tensor([float(c) for c in costs], dtype=torch.float32)
        self.round_cost.copy_(self.round_cost_host)

    def queue_empty(self) -> None:
        """The refill's queue is empty: from the next round the batch drains, its makespan
        counting again (`draining`), unless the drain objective is "throughput"."""
        if self.drain == "makespan":
            self.draining.fill_(True)

    def lengths(self) -> List[int]:
        """The lengths a batch may run: 0 (plain steps) where it may turn off, then 1..cap."""
        return ([0] if self.turn_off else []) + list(range(1, self.cap + 1))

    def reset(self) -> None:
        """A new batch: the optimistic prior (as if each request had just accepted a full
        chain), speculating."""
        self.workload.zero_()
        if self.depth is not None:
            self.depth.workload.zero_()
        self.draining.zero_()
        self._started_off = False       # until `start` says otherwise
        self._restart()

    def remember_batch(self) -> None:
        """Keep the whole-history counts of the batch that has just run, what its first turn-off
        decision judged each request by, and whether it turned off where it ran long enough to
        (runtime/workload_memory.py). Reads them on the host in one read-back: call once a
        batch is done, before anything resets the policy."""
        # A batch the memory started off ran no speculative round: nothing to read back.
        if self.memory is not None and not self._started_off:
            b = self.accepted_total.shape[0]      # one read-back: counts, judgements, flags
            read = torch.cat([self.accepted_total, self.rejected_total, self.first_judged,
                              torch.stack([self.off, self.rounds]).to(self.accepted_total.dtype)
                              ]).tolist()
            off, rounds = read[3 * b:]
            # Whether it turned off tells something only once it could have (`off_after`).
            verdict = bool(off) if rounds >= self.off_after else None
            self.memory.add(read[:b], read[b:2 * b], read[2 * b:3 * b], turned_off=verdict)

    def start(self, requests: int) -> int:
        """After `reset`, for a padded batch of `requests`: its first length, 0 (speculation off
        from the first round, for good) where plain steps would beat every length for the
        remembered workload's slowest request of such a batch, by its whole history or as the
        batch's first turn-off decision would judge it (runtime/workload_memory.py), else the
        longest. Ask once per batch: the memory counts the batches started off."""
        if self.memory is None:
            return self.cap
        alpha = self.memory.slowest_acceptance(requests)
        off = False
        if alpha is not None:             # the batch-length rule, for that one request
            # On the host: a started-off batch must cost what a plain batch costs, and device
            # operations read back here would add launches and a sync.
            cost = self.round_cost_host
            expected = expected_tokens(torch.full((1,), alpha, dtype=cost.dtype), self.cap)
            off = bool(next_length(expected, None, torch.ones(1, dtype=torch.bool), cost,
                                   "throughput")[1])
        self.memory.started(off)
        self._started_off = off
        if off:
            self.off.fill_(True)
        return 0 if off else self.cap

    def _restart(self) -> None:
        """`reset`, but for what outlives a restarted refill batch (the workload's averages,
        whether the queue is empty)."""
        self.accepted_avg.fill_(float(self.cap))
        self.rejected_avg.zero_()
        self.accepted_total.zero_()
        self.rejected_total.zero_()
        self.first_judged.fill_(-1.0)
        self.off.zero_()
        self.chosen.fill_(self.cap)
        self.rounds.zero_()
        if self.depth is not None:
            self.depth.restart()

    def admit(self, row: int, alone: bool = False) -> None:
        """Request `row` is a newcomer (continuous refill): its estimates start from the
        averages per round of every request so far (the optimistic prior before any), and its
        history as `off_after` rounds at those averages (nothing before any). `alone` (no
        other request is in the batch): the batch starts anew, as a padded batch would
        (optimistic, speculating, the turn-off unsettled); with one slot every request is
        judged on its own rounds. Stream-ordered tensor operations (or the `admit_kernel`), no
        host sync."""
        if alone:
            self._restart()
            return
        if self._admit_kernel is not None:
            self._admit_kernel.launch(self.accepted_avg, self.rejected_avg, self.accepted_total,
                                      self.rejected_total, self.workload, row, self.cap,
                                      self.off_after, **self._depth_tensors())
            return
        rounds = self.workload[2]
        seen, counted = rounds > 0, rounds.clamp(min=1.0)
        self.accepted_avg[row] = torch.where(seen, self.workload[0] / counted,
                                             torch.full_like(rounds, float(self.cap)))
        self.rejected_avg[row] = torch.where(seen, self.workload[1] / counted,
                                             torch.zeros_like(rounds))
        # Its history starts as `off_after` average rounds of the workload (the span a
        # padded batch waits before it judges): a bound from no evidence at all would hold a
        # useless drafter on for every newcomer, and its own first rounds are its poorest.
        prior = torch.where(seen, self.off_after / counted, torch.zeros_like(rounds))
        self.accepted_total[row] = self.workload[0] * prior
        self.rejected_total[row] = self.workload[1] * prior
        if self.depth is not None:
            self.depth.admit(row, prior)

    def next_into(self, n: torch.Tensor, drafted: torch.Tensor, ran: torch.Tensor,
                  limit: torch.Tensor, count: torch.Tensor, active: torch.Tensor,
                  status: torch.Tensor, r: torch.Tensor) -> None:
        """`next` for requests with `count` of `limit` tokens written, its length put in
        status[r, 1] (status int64 [W, 2], r int64 [1]): in one launch of the length_policy
        kernel where the policy was given one (`update_kernel`), else as torch operations."""
        if self._update_kernel is None:
            best = self.next(n, drafted, ran, (limit - count).clamp(min=0), active)
            status[:, 1].index_copy_(0, r, best[None])
            return
        self._update_kernel.launch(
            self.accepted_avg, self.rejected_avg, self.accepted_total, self.rejected_total,
            self.first_judged, self.rounds, self.off, self.chosen, self.workload, self.draining,
            self.round_cost, n, drafted, ran, limit, count, active, status, r, self.smoothing,
            DEPTH_SMOOTHING, OFF_CONFIDENCE, self.off_after, **self._depth_tensors())

    def _depth_tensors(self) -> dict:
        """The per-depth state as the generated kernels take it (none with one alpha)."""
        depth = self.depth
        return (dict(depth_rates=depth.rates, depth_tried=depth.tried, depth_took=depth.took,
                     depth_workload=depth.workload) if depth is not None else {})

    def next(self, n: torch.Tensor, drafted: torch.Tensor, ran: torch.Tensor,
             remaining: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """The next round's length (int64, 0-dim): the rows in `ran` that drafted take in `n`
        accepted of `drafted`; then the length that would finish the `active` requests
        (`remaining` tokens each) soonest (or serve them fastest), or 0 for good once plain
        steps would, from the `off_after`-th round of the batch on, by both the recent
        and an upper bound on the whole-history one (`policy_round`)."""
        depth = self.depth
        return self._round(self.accepted_avg, self.rejected_avg, self.accepted_total,
                           self.rejected_total, self.first_judged, self.rounds, self.off,
                           self.chosen, self.workload, self.draining, self.round_cost,
                           n, drafted, ran, remaining, active,
                           self.objective, self.turn_off, self.off_after, self.smoothing,
                           *((depth.rates, depth.tried, depth.took, depth.workload)
                             if depth is not None else ()))


def policy_round(accepted_avg, rejected_avg, accepted_total, rejected_total, first_judged,
                 rounds, off, chosen, workload, draining, round_cost,
                 n, drafted, ran, remaining, active,
                 objective: str, turn_off: bool, off_after: int,
                 smoothing: float, depth_rates=None, depth_tried=None, depth_took=None,
                 depth_workload=None) -> torch.Tensor:
    """One round of `BatchLengthPolicy.next` on its state tensors (the first nine are updated in
    place; `draining` and `round_cost` are read): a function of tensors only, so that one
    compiled copy (`compiled_policy_round`) serves every policy of the process. With the
    `depth_*` tensors (estimator "per_depth", `DepthState`, updated in place) the lengths and
    the turn-off are judged by per-depth acceptance; the one-alpha state is kept either way, for
    the workload memory."""
    ran = ran & (drafted > 0)
    accepted, rejected = update_acceptance(accepted_avg, rejected_avg, n, drafted, smoothing)
    accepted_avg.copy_(torch.where(ran, accepted, accepted_avg))
    rejected_avg.copy_(torch.where(ran, rejected, rejected_avg))
    alpha = acceptance_rate(accepted_avg, rejected_avg)
    cap = round_cost.shape[0] - 1
    if depth_rates is not None:
        tried, took, past_full = depth_trials(n, drafted, ran, cap)
        depth_rates.copy_(update_depth_rates(depth_rates, tried, took, past_full))
        expected = depth_expected_tokens(depth_rates)
    else:
        expected = expected_tokens(alpha, cap)
    best, _ = next_length(expected, remaining, active, round_cost, objective, draining)
    zero = torch.zeros_like(accepted_total)
    accepted, rejected = (torch.where(ran, n.to(zero.dtype), zero),
                          torch.where(ran, (n < drafted).to(zero.dtype), zero))
    if objective == "throughput":    # refill's state; a padded round needs none of it
        best = torch.where(active.any(), best, chosen)
        chosen.copy_(best)
        workload.add_(torch.stack([accepted.sum(), rejected.sum(), ran.to(zero.dtype).sum()]))
        if depth_workload is not None:
            depth_workload.add_(torch.stack([tried.sum(dim=0), took.sum(dim=0)]).to(zero.dtype))
    if not turn_off:
        return best
    accepted_total.add_(accepted)
    rejected_total.add_(rejected)
    overall = upper_acceptance(accepted_total, rejected_total)
    judged = torch.maximum(alpha, overall)
    if depth_rates is not None:
        depth_tried.add_(tried.to(zero.dtype))
        depth_took.add_(took.to(zero.dtype))
        bound = upper_acceptance(depth_took, depth_tried - depth_took)
        judged_expected = depth_expected_tokens(torch.maximum(depth_rates, bound))
    else:
        judged_expected = expected_tokens(judged, cap)
    _, plain_wins = next_length(judged_expected, remaining, active, round_cost, objective,
                                draining)
    settled = rounds >= off_after - 1
    # What the first turn-off decision judged each active request by (for the memory); a
    # batch already off (started off by the memory) makes no such decision.
    first = active & ~off & (rounds == off_after - 1)
    first_judged.copy_(torch.where(first, judged, first_judged))
    rounds.add_(1)
    off.logical_or_(plain_wins & settled & active.any())
    return torch.where(off, torch.zeros_like(best), best)


@functools.lru_cache(maxsize=None)
def compiled_policy_round():
    """`policy_round` compiled once per process (shapes dynamic), for captured rounds: a few
    kernels instead of its eager operations' many (the module says what that saves). The
    arithmetic is the same up to rounding order; the choice only sets the speed, never the
    tokens."""
    from .fast_ops import compiled
    return compiled(policy_round)
