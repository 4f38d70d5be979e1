"""Once an adaptive batch has turned speculation off, its plain steps must cost what a plain
decoder's steps cost: on a GPU a step of a small model is bound by its kernel count, and the
length policy's bookkeeping, run every step, cost the off state about a tenth of its speed on
an H200. Checked here by the operators each step runs (eagerly, on CPU)."""
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specpilot.runtime.graphed_chain import GraphedChainDecoder

from adaptive_reference import reference_batch_lengths
from mechanism_setup import MAX_NEW, ContraryDrafter, one_thread, pair_setup  # noqa: F401


class _Ops(TorchDispatchMode):
    """Counts the aten operators run inside it that compute (views launch no kernel)."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _ops_of_one_step(decoder, prompts):
    decoder.generate(prompts, 4)                 # a real state: prefilled, rows active
    with _Ops() as mode:
        decoder._runner(False, 0, rounds=1)()
    return mode.ops


def test_an_off_step_runs_the_plain_step_and_the_status_write_only():
    s = pair_setup(4)
    prompts = s["prompts"]
    plain = GraphedChainDecoder(s["target"], None, 4, 48, 0, s["eos"], capture=False)
    adaptive = GraphedChainDecoder(s["target"], ContraryDrafter(s["target"]), 4, 48, 4, s["eos"],
                                   capture=False, adaptive=True)
    plain_ops = _ops_of_one_step(plain, prompts)
    off_ops = _ops_of_one_step(adaptive, prompts)
    with _Ops() as mode:
        adaptive._stay_off()
    status_write = mode.ops
    assert plain_ops["aten.mm"] > 0                          # the step really ran the model
    assert sum(status_write.values()) <= 2                   # a clamp and one fill
    assert off_ops - plain_ops == status_write
    assert plain_ops - off_ops == Counter()


def test_an_off_batch_stays_off_and_keeps_the_ar_output():
    s = pair_setup(4)
    decoder = GraphedChainDecoder(s["target"], ContraryDrafter(s["target"]), 4, 48, 4, s["eos"],
                                  capture=False, adaptive=True)
    r = decoder.generate(s["prompts"], MAX_NEW)
    assert r.tokens == s["reference"].tokens
    rounds = r.target_forwards - 1
    wanted = reference_batch_lengths(4, lambda n: 0, rounds)[1:]
    # The host replays the length read two rounds back: the full chain twice, then the rule's.
    graphs = [4, 4] + wanted[:rounds - 2]
    assert r.stats == {f"rounds_chain_{n}": graphs.count(n) for n in sorted(set(graphs))}
    # Every round after the first plain one is plain too: off is for good.
    first_off = graphs.index(0)
    assert set(graphs[first_off:]) == {0} and rounds - first_off > 2
    # The status rows the plain steps wrote say 0, so the host never replays a chain again.
    lengths = decoder.status[:rounds, 1].tolist()
    assert all(n == 0 for n in lengths[first_off:rounds])
    torch.testing.assert_close(torch.tensor(r.drafter_forwards), torch.tensor(1 + sum(graphs)))
