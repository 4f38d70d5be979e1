"""An independent float64 statement of the adaptive draft-length rule (runtime/adaptive_draft.py)
for the tests to check the eager and the device-resident versions against, and a drafter that
is wrong up to a position and right after it."""
import math

import torch

from mechanism_setup import ContraryDrafter

SMOOTHING = 0.5        # the rule's documented weight of the newest round
DRAFT_COST = 0.25      # the rule's documented default drafter step cost


def expected_tokens(alpha: float, length: int) -> float:
    """Tokens per round of a chain of `length` with per-draft acceptance alpha (closed form)."""
    if alpha == 1.0:
        return float(length + 1)
    return (1.0 - alpha ** (length + 1)) / (1.0 - alpha)


def reference_length(alpha: float, cap: int, cost: float = DRAFT_COST) -> int:
    """argmax over L in 1..cap of E(L) / (1 + cost L), the shortest on a tie."""
    return max(range(1, cap + 1),
               key=lambda n: (expected_tokens(alpha, n) / (1.0 + cost * n), -n))


def reference_lengths(cap, accepted_fraction, rounds, start=None, cost=DRAFT_COST):
    """The lengths a request drafts over `rounds` rounds when each round accepts
    `accepted_fraction(length)` drafts, from the prior (a = cap, r = 0) or `start` = (a, r)."""
    a, r = (float(cap), 0.0) if start is None else start
    out = []
    for _ in range(rounds):
        n = reference_length(a / (a + r), cap, cost)
        out.append(n)
        got = accepted_fraction(n)
        a = SMOOTHING * got + (1 - SMOOTHING) * a
        r = SMOOTHING * (1.0 if got < n else 0.0) + (1 - SMOOTHING) * r
    return out


def beta_upper(a: float, b: float, z: float = 2.0) -> float:
    """The mean of Beta(a, b) plus z standard deviations, at most 1."""
    mean = a / (a + b)
    return min(1.0, mean + z * math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1.0))))


def reference_batch_lengths(cap, accepted_fraction, rounds, cost=DRAFT_COST, turn_off=True,
                            off_after=8):
    """The batch lengths a padded batch of requests that share one acceptance estimate runs
    (runtime/batch_length.py): after each round the L in 1..cap minimising cost(L) / E(L), with
    cost(L) = 1 + cost L; 0 for good once a plain step (cost 1, one token) beats it, from round
    `off_after` on, at the larger of the moving-average alpha and an upper bound on the
    whole-history one (`beta_upper` of accepted + 1, rejections + 1 since the batch began).
    Each round accepts `accepted_fraction(length)` drafts."""
    a, r, length, off, out = float(cap), 0.0, cap, False, []
    total_a = total_r = 0.0
    for i in range(rounds):
        got = accepted_fraction(length)
        if length > 0:
            a = SMOOTHING * got + (1 - SMOOTHING) * a
            r = SMOOTHING * (1.0 if got < length else 0.0) + (1 - SMOOTHING) * r
            total_a += got
            total_r += 1.0 if got < length else 0.0
        alpha = a / (a + r)
        spans = [(1.0 + cost * n) / expected_tokens(alpha, n) for n in range(cap + 1)]
        best = min(range(1, cap + 1), key=lambda n: (spans[n], n))
        sure = max(alpha, beta_upper(total_a + 1.0, total_r + 1.0))
        sure_spans = [(1.0 + cost * n) / expected_tokens(sure, n) for n in range(cap + 1)]
        plain_wins = sure_spans[0] < min(sure_spans[1:])
        off = off or (turn_off and i >= off_after - 1 and plain_wins)
        length = 0 if off else best
        out.append(length)
    return [cap] + out


class WrongBefore(ContraryDrafter):
    """The target as a drafter, except that its top choice is forbidden wherever the logits are
    at a position before `position`: drafts are all wrong there, all right from there on."""

    def __init__(self, model, position: int):
        super().__init__(model)
        self.position = position

    def forward(self, tokens, positions, slots, mask, cache, logits_at=None):
        logits = self.model.forward(tokens, positions, slots, mask, cache, logits_at)
        at = positions if logits_at is None else positions.gather(1, logits_at)
        wrong = logits.scatter(-1, logits.argmax(-1, keepdim=True), float("-inf"))
        return torch.where((at < self.position)[..., None], wrong, logits)


def rounds_from(accepted, first_root, position):
    """Index of the first round of a request (its accepted drafts per round, its first round's
    root at `first_root`) whose root is at or past `position`: from there on all its drafts
    are right under WrongBefore(position)."""
    root = first_root
    for i, n in enumerate(accepted):
        if root >= position:
            return i
        root += n + 1
    return len(accepted)
