"""What the refill tests share (tests/runtime/test_graphed_refill.py, test_graphed_tree_refill.py,
tests/gpu/test_graphed_refill_gpu.py): requests of mixed lengths, more than the slots, two
refills that leave a stale row behind, and a decoder that logs its replays."""
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.graphed_refill import GraphedRefillDecoder

from hf_factory import random_prompts
from mechanism_setup import MAX_NEW, pair_setup


def mixed_requests(seed):
    """(pair_setup(seed), nine prompts of mixed lengths, their greedy AR) for 2-3 slots: most
    slots are refilled more than once."""
    s = pair_setup(seed)
    prompts = random_prompts((5, 11, 2, 8, 3, 9, 1, 6, 4), seed=seed + 300)
    reference = generate_ar(s["target"], prompts, MAX_NEW, eos_ids=s["eos"])
    return s, prompts, reference


class StaleLength(GraphedRefillDecoder):
    """A refill that keeps the previous request's position: the newcomer's first round reads
    and writes the cache past its prompt, where the old request's K/V still is."""

    def _admit(self, row, prompt, limit, reference=None, alone=False):
        kept = self.length[row].clone()
        super()._admit(row, prompt, limit, reference, alone)
        self.length[row] = kept


class NoTargetPrefill(GraphedRefillDecoder):
    """A refill whose target K/V never reaches the row (the row prefill copies it elsewhere):
    the target attends to the old request's K/V where the newcomer's prompt should be."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        batch_cache = self._row_prefill.batch_caches[0]
        self._row_prefill.batch_caches[0] = self.target.new_cache(self.batch, batch_cache.capacity)


class ReplayLog(GraphedRefillDecoder):
    """A refill decoder that logs, in order, each replay's rounds and each admission ("admit")
    in `log` (reset it before a call)."""

    log: list

    def _runner(self, forced, k=None, rounds=None):
        run = super()._runner(forced, k, rounds)
        n = self.rounds_per_replay if rounds is None else rounds

        def logged():
            self.log.append(n)
            run()
        return logged

    def _admit(self, row, prompt, limit, reference=None, alone=False):
        self.log.append("admit")
        super()._admit(row, prompt, limit, reference, alone)


class TopUpLog(ReplayLog):
    """A ReplayLog that also logs each top-up of the newcomers held prefilled ahead ("top-up",
    or "nothing to hold" where the queue is empty)."""

    def _prefetch(self, prompts, queue):
        self.log.append("top-up" if queue else "nothing to hold")
        super()._prefetch(prompts, queue)


def count_prefills(prefill):
    """Log on a decoder's RowPrefill each prompt it prefills and, at each admission, whether
    the newcomer was waiting in staging (prefilled ahead): returns (prefilled, staged), filled
    as the decoder runs."""
    prefilled, staged = [], []
    plain_prefill, plain_run = prefill._prefill, prefill.run

    def counted_prefill(slot, prompt):
        prefilled.append(tuple(prompt))
        return plain_prefill(slot, prompt)

    def counted_run(row, prompt):
        staged.append(bool(prefill._held) and prefill._held[0].prompt == tuple(prompt))
        return plain_run(row, prompt)

    prefill._prefill, prefill.run = counted_prefill, counted_run
    return prefilled, staged
