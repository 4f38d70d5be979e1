"""What an adaptive decoder remembers of its workload from one padded batch to the next (a
padded decoder's batches, and a refill decoder's calls with no queue, which are padded batches).

Within a batch the length rule (runtime/batch_length.py) learns each request's acceptance from
its own rounds, and turns speculation off once plain steps would finish the batch sooner. That
learning costs rounds: on an H200, a 161M pair at batch 64 ran 0.93-0.96x strong AR with the
rule, nearly all of the loss being the speculative rounds before the turn-off took effect (the
host reads the length two replays of four rounds behind). A decoder that serves many batches of
one workload need not pay them every time: the requests it has finished tell it how acceptance
spreads over the workload, and a padded batch lasts as long as its slowest request. So a batch of
B requests starts with speculation off when, at an upper bound of its acceptance, the least
agreeing of B requests drawn from the workload would make plain steps beat every length, in at
least half of such batches: the workload's q-quantile request with (1 - q)^B = 1/2. At batch 1
that is the median request, at batch 64 about the least agreeing of 92. The quantile is a
remembered request's, not interpolated between two: on that pair one request in 64 barely agreed
and turned every batch of 64 off after seven rounds, and an interpolated 1/65-quantile (the
rule's first form) sat next to the second-worst request and kept starting batches on.

The batch's own rule can also turn it off at its first chance, on some request's unlucky start
that its whole history no longer shows: on the H200 a newly trained pair's batches of 64 each
turned off after four rounds (and the host ran four more before it read the choice), while the
whole histories said speculation would pay, so every batch paid those eight speculative rounds
again (0.96x strong AR). So the memory also keeps, per request, the acceptance that first
decision judged it by, and a batch starts off where the same quantile of those would have turned
it off there: it would only have paid the rounds before.

A batch that starts off learns nothing new, so after `EXPLORE_AFTER` such batches in a row one
batch speculates again, which refreshes what is remembered if the workload has changed. That
exploring batch pays the rounds before its turn-off (on an H200, at the pair's shapes with
random weights and batch 64, the exploring call ran 5-6 % slower: about 0.5 % over ten calls).
Each exploring batch that turns itself off (it only confirms that speculation loses) doubles
the wait before the next, up to `EXPLORE_AFTER_MAX`; one that speculates to its end, or a batch
the remembered workload starts on, sets it back to `EXPLORE_AFTER`. One that ends before it
could turn off (fewer rounds than the rule waits for) leaves the wait as it is. The
exploration is judged by what its own batch did, not by the next start decision: one batch
adds few requests to the 256 remembered, so the decision may stay off for several
explorations after the workload has changed, and those must not lengthen the wait.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from specpilot.ir.errors import SpecPilotError

from .adaptive_draft import OFF_CONFIDENCE, upper_acceptance

# The most recent requests remembered (their whole-history counts, and separately their first
# turn-off judgements: a request too short to be judged has counts but no judgement, so the two
# lists need not hold the same requests), and how many are needed before a batch may start
# with speculation off.
REMEMBERED_REQUESTS = 256
START_OFF_AFTER = 8
# Batches started off in a row before one speculates again, at first and at most.
EXPLORE_AFTER = 8
EXPLORE_AFTER_MAX = 128


class WorkloadMemory:
    """Accepted drafts and rejections of the most recent finished requests, and the acceptance
    their batch's first turn-off decision judged them by (host floats)."""

    def __init__(self, confidence: float = OFF_CONFIDENCE):
        """`confidence`: standard deviations above each remembered request's mean acceptance
        at which its whole history is judged (as the batch rule judges a turn-off; 0: at the
        mean)."""
        if not 0.0 <= confidence < float("inf"):
            raise SpecPilotError(f"confidence must be finite and >= 0, got {confidence}")
        self.confidence = float(confidence)
        self.counts: List[Tuple[float, float]] = []
        self.first_judged: List[float] = []
        self.started_off_in_a_row = 0
        self.explore_after = EXPLORE_AFTER
        self._explored = False      # the batch last started was one, not yet added
        # slowest_acceptance per batch size, until the memory changes: a started-off batch
        # adds nothing, and its start should cost what a plain batch's costs
        self._slowest: Dict[int, Optional[float]] = {}

    def add(self, accepted: Sequence[float], rejected: Sequence[float],
            first_judged: Sequence[float] = (), turned_off: Optional[bool] = None) -> None:
        """The counts of a finished batch's requests, and the acceptance its first turn-off
        decision judged each by; rows with none (no request, no speculative round, no such
        decision: a value below 0) are skipped. `turned_off`: whether the batch turned
        speculation off (what an exploring batch found; None: not told, or it ended before it
        could have)."""
        if self._explored and turned_off is not None:
            self.explore_after = (min(2 * self.explore_after, EXPLORE_AFTER_MAX) if turned_off
                                  else EXPLORE_AFTER)
        self._explored = False
        counts = [(a, r) for a, r in zip(accepted, rejected) if a + r > 0]
        judged = [a for a in first_judged if a >= 0.0]
        if counts or judged:        # a batch started off ran no speculative round: no news
            self._slowest.clear()
        self.counts += counts
        self.first_judged += judged
        del self.counts[:-REMEMBERED_REQUESTS], self.first_judged[:-REMEMBERED_REQUESTS]

    def slowest_acceptance(self, requests: int) -> Optional[float]:
        """For the least agreeing of `requests` requests drawn from the workload, at the median
        of such batches (see the module): the lower of the upper bound on its whole-history
        acceptance and the acceptance the first turn-off decision would judge it by, each
        counted where at least `START_OFF_AFTER` requests are remembered (plain steps win for
        one request at either exactly when they win at the lower, as E(L) grows with alpha);
        None where neither is, or while a batch is due to speculate again (`_exploring`)."""
        if self._exploring():
            return None
        if requests not in self._slowest:   # kept until `add` remembers something new
            self._slowest[requests] = self._slowest_now(requests)
        return self._slowest[requests]

    def _slowest_now(self, requests: int) -> Optional[float]:
        q = 1.0 - 0.5 ** (1.0 / requests)
        found = []
        if len(self.counts) >= START_OFF_AFTER:
            counts = torch.tensor(self.counts, dtype=torch.float64)
            found.append(_quantile(upper_acceptance(counts[:, 0], counts[:, 1],
                                                    self.confidence), q))
        if len(self.first_judged) >= START_OFF_AFTER:
            found.append(_quantile(torch.tensor(self.first_judged, dtype=torch.float64), q))
        return min(found, default=None)

    def _exploring(self) -> bool:
        """Whether the batch about to start is due to speculate again, whatever is remembered."""
        return self.started_off_in_a_row >= self.explore_after

    def started(self, off: bool) -> None:
        """A batch started with speculation off (or on): counted toward the next exploration.
        A batch the workload itself started on sets the wait back to `EXPLORE_AFTER`; an
        exploring one is judged when `add` tells what it did."""
        self._explored = self._exploring() and not off
        if off:
            self.started_off_in_a_row += 1
        else:
            if not self._explored:
                self.explore_after = EXPLORE_AFTER
            self.started_off_in_a_row = 0


def _quantile(values: torch.Tensor, q: float) -> float:
    """A remembered value at quantile q (the lower one: never interpolated toward a better)."""
    return float(torch.quantile(values, q, interpolation="lower"))
