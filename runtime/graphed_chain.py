"""Greedy chain speculation with every round on the device, captured as one CUDA graph.

A round of chain(k) speculation has fixed shapes for a fixed batch: the drafter's catch-up step
(2 tokens), k - 1 more drafter steps (1 token), the target's verification of k + 1 tokens, the
greedy acceptance and the commit. `GraphedChainDecoder` keeps the decode state on the device
(position, last and previous committed token, tokens generated, active flag, per request) and
writes the round as pure tensor operations on it, so the whole round is captured once as a CUDA
graph and replayed with one launch. Acceptance needs no host round trip: with greedy
verification the committed tokens are exactly the target's argmaxes g_0..g_n, where n is the
number of leading drafts that equal the target's argmax before them. The host only learns,
one replay behind, whether every request has finished (runtime/graphed_loop.py).

Why the drafter's first step takes 2 tokens: after a round that accepted n drafts, the drafter
has K/V for the drafts it ran, but not for the last accepted draft when all k were accepted,
nor for the bonus token. Feeding (previous token, last token) every round fills both cases with
one fixed shape; rewriting the previous token's K/V is harmless (same token, same position).

Forced mode (token forcing): drafts are the reference tokens, everything is committed, and the
target's argmax at every verified position is recorded as the decoder's proposal there. The
verification forward is the same (k + 1 tokens, same kernels), so what is checked is what
decides the output. `capture=False` runs the same round eagerly on any device (CPU tests).

With k = 0 and no drafter a round is one plain greedy step: the same device-resident loop
serves as the graphed AR baseline, so AR and speculation are timed with the same host loop.

Adaptive draft lengths (`adaptive=True`), on the device: per request, moving averages of
accepted drafts and of rejections give the per-draft acceptance probability alpha (the estimate
of runtime/adaptive_draft.py). A padded batch verifies one length for all its rows, so the
length is chosen for the batch: the one that would finish its slowest request soonest, from the
round costs measured on its own graphs; and where plain steps would finish it sooner, the batch
stops speculating until it is done (runtime/batch_length.py says why).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Union

import torch

from specpilot.codegen.round_end import (ADMIT_NODE, COMMIT_NODE, PLAIN_COMMIT_NODE, POLICY_NODE,
                                         ROW_START_NODE, round_end_kernels)
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.program import ACCEPT_KERNELS

from .adaptive_draft import DRAFT_STEP_COST, SMOOTHING
from .batch_length import BatchLengthPolicy, measure_round_costs
from .cuda_graphs import capture_graph, require_cuda
from .errors import CapacityError
from .fast_ops import compiles_policy
from .graphed_loop import read_result, read_tokens, replay_until_done, request_limits
from .graphed_prefill import StaticPrefill
from .speculative import SpecResult
from .ar import ARResult
from .steps import append_step, check_capacity, greedy_tokens, top2_margin


def timing_room(span: int) -> int:
    """The slots past its context that timing rounds of `span` draft slots needs at least: two
    rounds' worth."""
    return 2 * (span + 1)


def last_timing_context(span: int, capacity: int) -> int:
    """The last context from which two rounds of `span` draft slots fit in `capacity` slots."""
    return capacity - timing_room(span)


def check_timing_context(context: int, span: int, capacity: int) -> None:
    """A CapacityError unless rounds of `span` draft slots can be timed from `context`
    positions: two rounds must fit in the `capacity` slots after it."""
    if context < 1 or context > last_timing_context(span, capacity):
        raise CapacityError(f"a timing context of {context} does not fit a cache of "
                            f"{capacity} slots with rounds of {span} draft slots")


def begin_rows(last, active, count, limit, eos, rows, g0: torch.Tensor,
               forced_first: Optional[torch.Tensor] = None) -> None:
    """After the prefill of `rows` (an index of the batch): `last` is each row's first token
    (its target argmax `g0`, or `forced_first`, the reference's, when forced), and a row runs
    unless it has reached its limit or, unforced, `g0` is an EOS."""
    runs = count[rows] < limit[rows]
    if forced_first is not None:
        last[rows] = forced_first
    else:
        last[rows] = g0
        if eos is not None:
            runs &= ~(g0[:, None] == eos[None, :]).any(-1)
    active[rows] = runs


class GraphedChainDecoder:
    """Chain(k) greedy speculation for up to `batch` requests in caches of `capacity` slots.

    Build it once (graphs are captured on first use of each mode) and call `generate` or
    `force` for any prompts that fit. Outputs equal greedy AR of the target token for token,
    up to near-ties that the wider verification forward may round differently in low precision.
    """

    # What an adaptive length optimises (runtime/batch_length.py): a padded batch is done when
    # its slowest request is, so the batch's makespan.
    length_objective = "makespan"

    def __init__(self, target, drafter, batch: int, capacity: int, k: int,
                 eos_ids: Sequence[int] = (), capture: bool = True,
                 adaptive: bool = False, length_cap: Optional[int] = None,
                 rounds_per_replay: Optional[int] = None, record_margins: bool = False,
                 draft_cost: float = DRAFT_STEP_COST,
                 round_costs: Optional[Sequence[float]] = None, turn_off: bool = True,
                 compile_policy: Optional[bool] = None, smoothing: float = SMOOTHING,
                 length_estimator: str = "geometric", accept_kernels: str = "ops",
                 length_drain: str = "makespan", length_kernel: bool = True):
        """`adaptive`: the batch's chain length follows its requests' estimated acceptance
        (runtime/adaptive_draft.py): each round picks the length in 1..`length_cap` (default k)
        that would finish the batch soonest (or, by the class's `length_objective`, serve it
        fastest; runtime/batch_length.py), from `round_costs` (cost of a round of L = 0..cap
        drafts in plain steps; default: measured from the graphs at the first call with
        capture, else 1 + `draft_cost` L). With `turn_off`, a batch for which plain steps would
        finish sooner stops speculating until it is done. The host replays the length chosen
        two replays back.

        `rounds_per_replay` rounds are captured back to back in one graph (default 4 with
        capture, 1 without): the host's work per replay (launch, one status copy, one event)
        is then shared by that many rounds, at the cost of at most that many minus one rounds
        run after the last request finished.

        `record_margins` keeps the target's top-1 minus top-2 logit at every committed token
        (what token forcing needs of a reference), read with `generate_reference`.

        `compile_policy`: whether the adaptive length's update runs compiled in the captured
        rounds (default: with capture, unless SPECPILOT_FAST_OPS is "0";
        `fast_ops.compiles_policy`). `smoothing`: its moving averages' weight on the newest
        round (runtime/adaptive_draft.py). `length_estimator`: what the rule expects a chain
        of L to commit (a Program's batch.length_estimator, runtime/batch_length.py).

        `accept_kernels` (a Program's kernels.accept_kernels): "ops" ends each round with torch
        ops, "fused" with one generated kernel (the chain_commit family) that accepts, commits,
        stops rows and logs the round, and with adaptive lengths one more for the length's
        update (the length_policy family; `compile_policy` then has no use); the same integers
        either way, and the same lengths up to float32 rounding. `length_kernel` False keeps
        the torch update with the fused end (a bench's comparison)."""
        if capture:
            require_cuda(target.device)
        if k < 0 or (k == 0) != (drafter is None):
            raise SpecPilotError(f"chain length must be at least 1 with a drafter, or 0 without "
                                 f"one (plain greedy decoding), got {k}")
        if rounds_per_replay is None:
            rounds_per_replay = 4 if capture else 1
        if rounds_per_replay < 1:
            raise SpecPilotError(f"rounds per replay must be at least 1, got {rounds_per_replay}")
        self.rounds_per_replay = rounds_per_replay
        if adaptive and k == 0:
            raise SpecPilotError("adaptive draft lengths need a chain of at least 1")
        cap = k if length_cap is None else length_cap
        if not min(k, 1) <= cap <= k:
            raise SpecPilotError(f"length cap {cap} must be within 1..{k}")
        if drafter is not None and target.device != drafter.device:
            raise SpecPilotError(f"target on {target.device} but drafter on {drafter.device}: "
                                 "load both on one device")
        self.target, self.drafter, self.k, self.batch = target, drafter, k, batch
        # Cache slots a round writes past `length` (the chain's k; a tree's node count).
        self.span = self._span()
        self.capture = capture
        dev = self.device = target.device
        self.tcache = target.new_cache(batch, capacity)
        self.dcache = drafter.new_cache(batch, capacity) if drafter is not None else None
        # On a GPU the prefill is a graph too (prompts padded to buckets); on the CPU it is the
        # eager padded prefill of the other decoders, so results compare bit for bit there.
        self._prefiller = None
        if target.device.type == "cuda":
            self._prefiller = StaticPrefill(self._prefill_models(), batch, capacity, capture)
        # Output/reference rows: a request may overshoot its limit by k within its last round.
        self.width = capacity + k + 1
        i64 = dict(dtype=torch.int64, device=dev)
        self.length = torch.ones(batch, **i64)      # position of `last` (not yet in the target cache)
        self.last = torch.zeros(batch, **i64)
        self.prev = torch.zeros(batch, **i64)       # token at position length - 1
        self.count = torch.zeros(batch, **i64)      # tokens generated so far
        self.limit = torch.zeros(batch, **i64)      # tokens wanted per request
        self.active = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.out = torch.zeros((batch, self.width), **i64)   # tokens (or forced proposals)
        self.record_margins = record_margins
        self.margins = (torch.zeros((batch, self.width), dtype=torch.float32, device=dev)
                        if record_margins else None)
        self.ref = torch.zeros((batch, self.width), **i64)   # forced mode: the reference tokens
        self.accepted = torch.full((self.width, batch), -1, **i64)  # per round: drafts accepted
        self.round_index = torch.zeros((), **i64)
        # Per round: [all requests finished (0/1), the batch's next chain length]; one row is
        # the only thing the host reads back per replay.
        self.status = torch.zeros((self.width, 2), **i64)
        # The host's copy of one status row per replay, and events to wait on them: allocated
        # once (page-locked memory is slow to allocate), reused by every call.
        cuda = dev.type == "cuda"
        self.host_status = torch.zeros((-(-self.width // rounds_per_replay), 2),
                                       dtype=torch.int64, pin_memory=cuda)
        self.events = [torch.cuda.Event() for _ in range(3)] if cuda else []
        self.eos = torch.tensor(sorted(set(eos_ids)), **i64) if eos_ids else None
        self.slot_ids = torch.arange(capacity, device=dev)[None, None, :]
        self.chain = torch.arange(k + 1, device=dev)
        self.catch_up_offsets = torch.tensor([-1, 0], **i64)
        self.catch_up_logit = torch.ones((batch, 1), **i64)
        # Adaptive draft length: the batch's next length from its requests' acceptance and
        # the measured round costs (runtime/batch_length.py); the host picks graphs by it.
        self.adaptive, self.length_cap = adaptive, cap
        # The round's end in generated kernels ("fused"): {plan node: module}, None for "ops".
        round_end = self._build_round_end(accept_kernels,
                                          adaptive and length_kernel,
                                          length_estimator, turn_off)
        self._commit_kernels = None if round_end is None else {
            False: round_end[COMMIT_NODE],
            True: round_end.get(PLAIN_COMMIT_NODE, round_end[COMMIT_NODE])}
        # A refilled newcomer's row started in one launch (runtime/graphed_refill.py, `_admit`).
        self._row_start = (round_end or {}).get(ROW_START_NODE)
        # Captured, its update runs compiled (runtime/batch_length.py says what that saves),
        # unless it is a generated kernel of the round's end.
        if compile_policy is None:
            compile_policy = adaptive and capture and compiles_policy()
        kernels = round_end or {}
        self.policy = (BatchLengthPolicy(batch, cap, dev, draft_cost, round_costs, turn_off,
                                         self.length_objective, compile_rounds=compile_policy,
                                         smoothing=smoothing, estimator=length_estimator,
                                         drain=length_drain,
                                         update_kernel=kernels.get(POLICY_NODE),
                                         admit_kernel=kernels.get(ADMIT_NODE))
                       if adaptive else None)
        self.first_length = cap                          # a batch's first rounds (set by _start)
        self._measure_costs = adaptive and capture and round_costs is None
        self._graphs: Dict[tuple, Optional[torch.cuda.CUDAGraph]] = {}
        if self._commit_kernels is not None and adaptive:
            # What the length policy reads after the kernel, and each length's drafts per row
            # (made once per length: a captured round then launches no fill).
            self._n_out = torch.zeros(batch, dtype=torch.int64, device=dev)
            self._before_out = torch.zeros(batch, dtype=torch.bool, device=dev)
            self._r_out = torch.zeros(1, dtype=torch.int64, device=dev)
            self._drafted_by_k: Dict[int, torch.Tensor] = {}

    def _prefill_models(self):
        """The (model, cache) pairs a prefill fills, the target first (then the drafter)."""
        return [(self.target, self.tcache)] + (
            [(self.drafter, self.dcache)] if self.drafter is not None else [])

    @property
    def capacity(self) -> int:
        return self.tcache.capacity

    def _span(self) -> int:
        return self.k

    # ---- the round, as device tensor operations on the state --------------------------------

    def _mask(self, positions: torch.Tensor) -> torch.Tensor:
        return self.slot_ids <= positions[:, :, None]

    def _base(self) -> torch.Tensor:
        """Each row's position of `last`. A finished row keeps running with the batch; its
        positions are clamped so its (discarded) writes stay inside the cache."""
        return self.length.clamp(max=self.capacity - self.span - 1)

    def _draft(self, k: int) -> torch.Tensor:
        """k drafter argmaxes after (prev, last): [B, k]."""
        if k == 0:
            return self.last[:, None][:, :0]
        base = self._base()
        pos = base[:, None] + self.catch_up_offsets
        tokens = torch.stack([self.prev, self.last], dim=1)
        # A drafter that sees slots 0..p at position p by itself (the fused kernels) takes no
        # mask: two launches a round fewer, and its attention reads none.
        by_position = getattr(self.drafter, "sees_by_position", False)
        drafts = [greedy_tokens(self.drafter, tokens, pos, pos,
                                None if by_position else self._mask(pos), self.dcache,
                                self.catch_up_logit)[:, 0]]
        # The later steps' positions and masks at once, [k - 1, B] and [k - 1, B, S]: each
        # step's is then a contiguous view, not two launches of its own.
        ahead = base[None, :] + self.chain[1:k, None]
        masks = None if by_position else self._mask(ahead)
        for i in range(1, k):
            pos = ahead[i - 1][:, None]
            drafts.append(greedy_tokens(self.drafter, drafts[-1][:, None], pos, pos,
                                        None if by_position else masks[i - 1][:, None],
                                        self.dcache)[:, 0])
        return torch.stack(drafts, dim=1)

    def _verify(self, drafts: torch.Tensor) -> torch.Tensor:
        """The target's argmax after each of (last, d_1..d_k): [B, k + 1]. With
        record_margins, their top-1 minus top-2 margins are kept for `_write`."""
        pos = self._base()[:, None] + self.chain[:drafts.shape[1] + 1]
        tokens = torch.cat([self.last[:, None], drafts], dim=1)
        logits = self.target.forward(tokens, pos, pos, self._mask(pos), self.tcache)
        if self.record_margins:
            self._round_margins = top2_margin(logits)
        return torch.argmax(logits, dim=-1)

    def _write(self, values: torch.Tensor, upto: torch.Tensor) -> None:
        """out[count + j] = values[j] for j <= upto, on active rows. Indices past the row end
        are clamped to its last column, which no kept entry reaches (width = capacity + k + 1)."""
        chain = self.chain[:values.shape[1]]
        idx = (self.count[:, None] + chain).clamp(max=self.width - 1)
        keep = self.active[:, None] & (chain[None, :] <= upto[:, None])
        self.out.scatter_(1, idx, torch.where(keep, values, self.out.gather(1, idx)))
        if self.record_margins:
            self.margins.scatter_(1, idx, torch.where(keep, self._round_margins,
                                                      self.margins.gather(1, idx)))

    @staticmethod
    def _accepted(drafts: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """n per row: the leading drafts equal to the target's argmax before them. The round
        commits g_0..g_n (g_j = d_{j+1} for j < n, and g_n is the target's own next token)."""
        return torch.cumprod((drafts == g[:, :-1]).to(torch.int64), dim=1).sum(dim=1)

    def _round(self, k: int) -> None:
        drafts = self._draft(k)
        g = self._verify(drafts)
        self._accept_and_commit(drafts, g, k)

    def _accept_and_commit(self, drafts: torch.Tensor, g: torch.Tensor, k: int) -> None:
        """A round's end after its verification: accept the leading drafts that match, commit."""
        if self._commit_kernels is not None:
            self._commit_in_kernel(g, drafts=drafts,
                                   drafted=self._drafted(k) if self.adaptive and k else None)
            return
        n = self._accepted(drafts, g)
        # Padded rows all verify k drafts: each accepts what it can (capping a row below k
        # would only throw verified tokens away). A plain step of an adaptive decoder runs
        # only once the batch has turned speculation off for good, so it skips the length
        # policy and writes no next length (the host holds 0 for good): the step then runs
        # the kernels of a plain decoder's step, no more.
        self._commit(g, n, drafted=torch.full_like(n, k) if self.adaptive and k else None)

    def _commit(self, committed: torch.Tensor, n: torch.Tensor,
                drafted: Optional[torch.Tensor] = None) -> None:
        """Commit committed[:, 0..n] per active row (the last of them becomes `last`, not yet
        in the cache), move the state on, and decide who stops. `drafted` (speculative rounds
        of adaptive lengths only): each row's drafts this round, against which `n` tells a
        rejection."""
        self._write(committed, n)
        before = self.active.clone()
        step = torch.where(before, n + 1, torch.zeros_like(n))
        last = committed.gather(1, n[:, None])[:, 0]
        prev = torch.where(n > 0, committed.gather(1, (n - 1).clamp(min=0)[:, None])[:, 0],
                           self.last)
        self.last.copy_(torch.where(before, last, self.last))
        self.prev.copy_(torch.where(before, prev, self.prev))
        self.length.add_(step)
        self.count.add_(step)
        still = before & (self.count < self.limit)
        if self.eos is not None:
            kept = self.chain[None, :committed.shape[1]] <= n[:, None]
            hit = ((committed[:, :, None] == self.eos[None, None, :]).any(-1) & kept).any(-1)
            still = still & ~hit
        self.active.copy_(still)
        if drafted is not None:
            self._adapt(n, drafted, before)
        self._log_round(torch.where(before, n, torch.full_like(n, -1)),
                        plain=committed.shape[1] == 1)

    def _adapt(self, n: torch.Tensor, drafted: torch.Tensor, before: torch.Tensor,
               r: Optional[torch.Tensor] = None) -> None:
        """Record the batch's next length (runtime/batch_length.py) in the status row (row `r`,
        [1]; by default this round's, the round index not yet moved on)."""
        if r is None:
            r = self.round_index.clamp(max=self.width - 1)[None]
        self.policy.next_into(n, drafted, before, self.limit, self.count, self.active,
                              self.status, r)

    # ---- the round's end in one generated kernel (accept_kernels "fused") --------------------

    # How the fused commit logs a round: by the batch's round index; a refilled batch logs by
    # each row's own round counter (runtime/graphed_refill.py, `_log_round`).
    commit_log = "round"

    def _build_round_end(self, accept_kernels: str, length_kernels: bool, estimator: str,
                         turn_off: bool):
        """The round end's generated kernels {plan node: module} for "fused" (with the length's
        where `length_kernels`: codegen/round_end.py), None for "ops"."""
        if accept_kernels not in ACCEPT_KERNELS:
            raise SpecPilotError(f"unknown accept kernels {accept_kernels!r} (known: "
                                 f"{', '.join(ACCEPT_KERNELS)})")
        if accept_kernels == "ops":
            return None
        if self.record_margins:
            raise SpecPilotError("the fused commit does not record margins: build references "
                                 "with accept kernels 'ops'")
        return round_end_kernels(self.device, refill=self.commit_log == "row",
                                 adaptive=length_kernels, estimator=estimator, turn_off=turn_off)

    def _drafted(self, k: int) -> torch.Tensor:
        """[B] filled with k, made once per k."""
        if k not in self._drafted_by_k:
            self._drafted_by_k[k] = torch.full((self.batch,), k, dtype=torch.int64,
                                               device=self.device)
        return self._drafted_by_k[k]

    def _commit_in_kernel(self, committed: torch.Tensor, drafts: torch.Tensor,
                          drafted: Optional[torch.Tensor] = None) -> None:
        """`_accepted`, `_commit` and the class's `_log_round` in one chain_commit launch; the
        adaptive length's update after it."""
        outs = (dict(n_out=self._n_out, before_out=self._before_out, r_out=self._r_out)
                if drafted is not None else {})
        self._commit_kernels[committed.shape[1] == 1].launch(
            committed, drafts, self.out, self.count, self.length, self.last, self.prev,
            self.limit, self.active, self.accepted, self.status, self.round_index, eos=self.eos, row_round=None if self.commit_log == "round" else self.row_round,
            **outs)
        if drafted is not None:
            self._adapt(self._n_out, drafted, self._before_out, r=self._r_out)

    def _reference_ahead(self, k: int) -> torch.Tensor:
        """Forced mode: each row's next k reference tokens [B, k] (clamped at the row's end)."""
        idx = (self.count[:, None] + self.chain[:k]).clamp(max=self.width - 1)
        return self.ref.gather(1, idx)

    def _forced_round(self, k: int) -> None:
        g = self._verify(self._reference_ahead(k))
        self._write(g, torch.full_like(self.count, k))
        self._commit_forced(k)

    def _commit_forced(self, k: Union[int, torch.Tensor]) -> None:
        """Forced mode: every active row commits the next k + 1 reference tokens (`k` one count,
        or one per row: a dynamic tree's depth differs by row)."""
        before = self.active.clone()
        k = k if torch.is_tensor(k) else torch.full_like(self.count, k)
        step = torch.where(before, k + 1, torch.zeros_like(self.count))
        self.length.add_(step)
        self.count.add_(step)
        # Clamped: capture warms up on a reset state (count 0), where nothing is active.
        self.last.copy_(self.ref.gather(1, (self.count - 1).clamp(min=0)[:, None])[:, 0])
        self.prev.copy_(self.ref.gather(1, (self.count - 2).clamp(min=0)[:, None])[:, 0])
        self.active.copy_(before & (self.count < self.limit))
        self._log_round(torch.where(before, k, torch.full_like(step, -1)))

    def _log_round(self, accepted: torch.Tensor, plain: bool = False) -> None:
        """Log the drafts each row accepted this round (-1: the row did not run), and the
        round's status. `plain` (an unforced plain step) matters only to the refill's log."""
        r = self.round_index.clamp(max=self.width - 1)
        self.accepted.index_copy_(0, r[None], accepted[None])
        self._log_status(r)

    def _log_status(self, r: torch.Tensor) -> None:
        """Round `r`'s status row (all finished?) and the next round's index."""
        self.status[:, 0].index_copy_(0, r[None], (~self.active.any()).to(torch.int64)[None])
        self.round_index.add_(1)

    # ---- capture and the host loop ------------------------------------------------------------

    def _runner(self, forced: bool, k: Optional[int] = None, rounds: Optional[int] = None):
        k = self.k if k is None else k
        rounds = self.rounds_per_replay if rounds is None else rounds
        one = (lambda: self._forced_round(k)) if forced else (lambda: self._round(k))

        def body():
            for _ in range(rounds):
                one()

        if not self.capture:
            return body
        key = (forced, k, rounds)
        if key not in self._graphs:
            # Capture runs the round a few times on whatever the state holds: every request is
            # inactive here (set by _reset), so only cache slots that prefill overwrites change.
            self._reset()
            self._graphs[key] = capture_graph(body, self.device)[0]
        return self._graphs[key].replay

    def round_replays(self) -> Dict[int, Callable[[], None]]:
        """The unforced replay of each length this decoder runs, and of plain steps (0): what
        its round costs are timed on."""
        return {k: self._runner(False, k) for k in sorted({0, *self._lengths()})}

    def _ensure_round_costs(self, prompts: Sequence[Sequence[int]], limits: Sequence[int]) -> None:
        """With capture and no given costs: time the round costs (`time_round_costs`) once,
        the first time the decoder runs (runtime/batch_length.py): a compile's first call is
        its forced run, whose reference lengths then set the context."""
        if not self._measure_costs:
            return
        self.policy.set_round_costs(self.time_round_costs(prompts, limits))
        self._measure_costs = False

    def time_round_costs(self, prompts: Sequence[Sequence[int]],
                         limits: Sequence[int]) -> List[float]:
        """Each length's unforced graph timed against the plain step's (`measure_round_costs`),
        every row inactive at the typical context of a call of `prompts` and `limits`."""
        context = self.timing_context(prompts, limits)
        return measure_round_costs(self.round_replays(), lambda: self._inactive_at(context),
                                   self.device)

    def timing_context(self, prompts: Sequence[Sequence[int]], limits: Sequence[int]) -> int:
        """Where a call's rounds are on average: the mean prompt length plus half the longest
        limit, held to where two rounds still fit in the cache. A round's
        kernels that walk only the visible cache slots (the fused drafter's attention) cost by
        it: timed at context 1, a fused drafter's rounds were priced 2-4 % of a plain step a draft
        below what a whole call's rounds cost (H200, batch 16 and 64), where the model
        drafter's, whose kernels walk every slot, agreed within 1 %."""
        typical = sum(len(p) for p in prompts) // len(prompts) + max(limits) // 2
        return max(1, min(typical, last_timing_context(self.span, self.capacity)))

    def _inactive_at(self, context: int) -> None:
        """`_reset`, with every (inactive) row's position at `context`: replays then attend
        over that many slots and write from context - 1 on (the drafter's catch-up rewrites
        the slot before), slots a later call's prefill or rounds rewrite before they are ever
        visible."""
        self._reset()
        self.length.fill_(context)

    def _lengths(self) -> List[int]:
        """The chain lengths whose rounds this decoder replays."""
        return self.policy.lengths() if self.adaptive else [self.k]

    def timing_round(self, context: int):
        """A callable running one unforced round with every row active after `context`
        positions of (stale) cache, for measuring a round's cost; each call moves every row on
        by the tokens it commits, at most the round's depth and one. A cache of
        `graphed_program.timing_capacity(context, topology, n)` slots holds n calls."""
        # Checked here too, before `_runner` captures a graph that a bad context would waste.
        check_timing_context(context, self.span, self.capacity)
        replay = self._runner(False, rounds=1)
        self.reset_all_active(context)
        return replay

    def reset_all_active(self, context: int) -> None:
        """`_reset`, then every row active after `context` positions of (stale) cache with
        room for its whole output: a state to time unforced rounds in. A CapacityError unless
        two rounds fit after `context` (rows past the cache clamp their positions, so later
        rounds stay inside it, but no longer time what a decode there would)."""
        check_timing_context(context, self.span, self.capacity)
        self._inactive_at(context)
        self.count.fill_(1)
        self.limit.fill_(self.width)
        self.active.fill_(True)

    def _reset(self) -> None:
        """Every request inactive and the round log, status and length policy as before a
        batch (the caches are left as they are: a prefill overwrites what a batch reads)."""
        self.active.zero_()
        self.count.zero_()
        self.limit.zero_()
        self.length.fill_(1)
        self.accepted.fill_(-1)
        self.status[:, 0].zero_()
        self.status[:, 1].fill_(self.length_cap)
        self.round_index.zero_()
        if self.policy is not None:
            self.policy.reset()

    def _prefill(self, prompts, limits: List[int]) -> torch.Tensor:
        """Prefill the target, and the other `_prefill_models` (the drafter, a two-level
        decoder's cheap verifier) where this batch runs them (`drafter_prefilled`), with every
        prompt (rows past the prompts repeat the first one and stay inactive);
        returns the target's first argmax per row."""
        n, dev = len(prompts), self.device
        rows = [list(p) for p in prompts] + [list(prompts[0])] * (self.batch - n)
        if self._prefiller is not None:
            logits = self._prefiller.run(rows, first_only=not self.drafter_prefilled)
        else:
            zeros = torch.zeros(self.batch, dtype=torch.int64, device=dev)
            (target, tcache), *others = self._prefill_models()
            logits = append_step(target, tcache, zeros, rows)
            if self.drafter_prefilled:
                for model, cache in others:
                    append_step(model, cache, zeros, rows)
        g0 = torch.argmax(logits, dim=-1)
        if self.record_margins:
            self.margins[:, 0] = top2_margin(logits)
        self.length.copy_(torch.tensor([len(p) for p in rows], dtype=torch.int64).to(dev))
        self.prev.copy_(torch.tensor([p[-1] for p in rows], dtype=torch.int64).to(dev))
        self.limit.copy_(torch.tensor(limits + [0] * (self.batch - n), dtype=torch.int64).to(dev))
        self.out[:, 0] = g0
        self.count.fill_(1)
        return g0

    def _drains_from_start(self, requests: int) -> bool:
        """Whether a call of `requests` requests is one batch that drains from its start (its
        slowest request decides when it is done): always, for the padded decoder."""
        return True

    def _may_start_off(self, requests: int) -> bool:
        """Whether an unforced call of `requests` may start off: a workload memory decides,
        and the call is one batch that drains from its start."""
        return (self.policy is not None and self.policy.memory is not None
                and self._drains_from_start(requests))

    @property
    def drafter_prefilled(self) -> bool:
        """Whether this batch runs its drafter (a batch started off never does, so only the
        target is prefilled; nor, in a two-level decoder, its cheap verifier)."""
        return self.drafter is not None and self.first_length != 0

    def _start(self, prompts, limits: List[int],
               reference: Optional[Sequence[Sequence[int]]] = None,
               requests: Optional[int] = None) -> None:
        """A new batch: the state reset, the reference rows set (forced mode: `reference` given),
        the models prefilled with `prompts` and each row's first round set up (`_begin`).
        `first_length` is the longest length, but where an adaptive decoder's call of
        `requests` (default: these prompts) drains from its start, the policy may start it with
        speculation off for good, by what the batches before it told of the workload
        (runtime/workload_memory.py)."""
        self._reset()
        requests = len(prompts) if requests is None else requests
        self.first_length = (self.policy.start(len(prompts))
                             if reference is None and self._may_start_off(requests)
                             else self._lengths()[-1])
        if reference is not None:
            table = torch.zeros((self.batch, self.width), dtype=torch.int64)
            for row, ref in enumerate(reference):
                table[row, :len(ref)] = torch.tensor(list(ref), dtype=torch.int64)
            self.ref.copy_(table.to(self.device))
        g0 = self._prefill(prompts, limits)
        self._begin(slice(None), g0, forced=reference is not None)

    def _begin(self, rows, g0: torch.Tensor, forced: bool) -> None:
        """After the prefill of `rows` (an index of the batch): `begin_rows`, forced rows from
        the reference's first token."""
        begin_rows(self.last, self.active, self.count, self.limit, self.eos, rows, g0,
                   self.ref[rows, 0] if forced else None)

    def prepare_prefill(self, prompts: Sequence[Sequence[int]]) -> None:
        """Capture the prefill graphs these prompts will need now (e.g. before timing): with
        the drafter, and where a call of them may start off (a workload memory, a batch that
        drains from its start), also without it."""
        if self._prefiller is not None:
            lengths = [len(p) for p in prompts]
            self._prefiller.prepare(lengths)
            if self._may_start_off(len(prompts)):
                self._prefiller.prepare(lengths, first_only=True)

    def _check(self, prompts, max_new_tokens: int) -> None:
        if not prompts or len(prompts) > self.batch:
            raise SpecPilotError(f"{len(prompts)} prompts for a decoder built for batch "
                                 f"{self.batch}: give 1..{self.batch} prompts per call")
        needed = check_capacity(self.target, prompts, max_new_tokens + self.span + 1, slack=0)
        if needed > self.capacity:
            raise CapacityError(f"prompts of up to {needed - max_new_tokens - self.span - 1} tokens "
                                f"plus {max_new_tokens} new tokens and a round's {self.span} draft "
                                f"slots need {needed} cache slots; this decoder has "
                                f"{self.capacity}")

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]],
                 max_new_tokens: Union[int, Sequence[int]]) -> SpecResult:
        """Greedy chain speculation of `prompts` (at most `batch`), `max_new_tokens` each (one
        count for all, or one per prompt)."""
        limits = request_limits(max_new_tokens, len(prompts))
        self._check(prompts, max(limits, default=1))     # no prompts: _check says so
        replays = {k: self._runner(False, k) for k in self._lengths()}
        self._ensure_round_costs(prompts, limits)
        self._start(prompts, limits)
        by_length = replay_until_done(self, replays)
        if self.policy is not None:     # now: a capture or a forced run would reset its counts
            self.policy.remember_batch()
        return read_result(self, limits, by_length)

    @torch.no_grad()
    def force(self, prompts: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]) -> List[List[int]]:
        """What the decoder proposes at each reference position, committing the reference."""
        if not reference or len(reference) != len(prompts) or any(not r for r in reference):
            raise SpecPilotError("force needs one non-empty reference token list per prompt")
        longest = max(len(r) for r in reference)
        self._check(prompts, longest)
        limits = [len(r) for r in reference]
        # before any timed run: forcing comes first in a compile
        self._ensure_round_costs(prompts, limits)
        replays = {k: self._runner(True, k) for k in self._lengths()}
        self._start(prompts, limits, reference)
        replay_until_done(self, replays, forced=True)
        return read_tokens(self, len(prompts), limits, trim_eos=False)

    @torch.no_grad()
    def generate_reference(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> ARResult:
        """`generate` as an ARResult with the margin at every token (record_margins needed)."""
        if not self.record_margins:
            raise SpecPilotError("build the decoder with record_margins=True to get margins")
        r = self.generate(prompts, max_new_tokens)
        table = self.margins[:len(prompts)].tolist()
        return ARResult(r.tokens, [row[:len(t)] for row, t in zip(table, r.tokens)],
                        r.target_forwards)
