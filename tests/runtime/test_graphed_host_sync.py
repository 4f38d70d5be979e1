"""What a graphed decoder records into a CUDA graph must not read tensors on the host (a capture
fails on it). Checked on CPU: every round the decoders hand out runs under no_host_sync, for each
kind of graphed round, generating and forcing, and the output is still greedy AR's."""
import pytest
import torch

from specpilot.ir.topology import DynamicTree, Tree
from specpilot.runtime.adaptive_draft import expected_tokens
from specpilot.runtime.batch_length import next_length
from specpilot.runtime.graphed_chain import GraphedChainDecoder
from specpilot.runtime.graphed_dynamic import GraphedDynamicTreeDecoder
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from specpilot.runtime.graphed_tree import GraphedTreeDecoder

from mechanism_setup import MAX_NEW, ContraryDrafter, pair_setup
from no_host_sync import HostSync, guard_rounds, no_host_sync

DECODERS = {
    "chain": lambda s: GraphedChainDecoder(s["target"], s["drafter"], 4, 48, 3, s["eos"],
                                           capture=False),
    "adaptive": lambda s: GraphedChainDecoder(s["target"], s["drafter"], 4, 48, 4, s["eos"],
                                              capture=False, adaptive=True),
    # A drafter that is always wrong makes the batch turn speculation off mid-run.
    "adaptive-off": lambda s: GraphedChainDecoder(s["target"], ContraryDrafter(s["target"]), 4,
                                                  48, 4, s["eos"], capture=False, adaptive=True),
    # Two slots for four requests: the refills run between replays, the rounds under the guard.
    "refill": lambda s: GraphedRefillDecoder(s["target"], s["drafter"], 2, 48, 3, s["eos"],
                                             capture=False),
    "tree": lambda s: GraphedTreeDecoder(s["target"], s["drafter"], 4, 64,
                                         Tree((2, 1)).shape(), s["eos"], capture=False),
    "dynamic": lambda s: GraphedDynamicTreeDecoder(s["target"], s["drafter"], 4, 64,
                                                   DynamicTree(budget=4, depth=3, width=2),
                                                   s["eos"], capture=False),
}


@pytest.mark.parametrize("kind", sorted(DECODERS))
def test_graphed_rounds_never_read_the_device_on_the_host(kind):
    s = pair_setup(4)
    decoder = DECODERS[kind](s)
    guard_rounds(decoder)
    r = decoder.generate(s["prompts"], MAX_NEW)
    assert r.tokens == s["reference"].tokens
    forced = decoder.force(s["prompts"], s["reference"].tokens)
    assert [row[:len(ref)] for row, ref in zip(forced, s["reference"].tokens)] == \
        s["reference"].tokens
    if kind == "adaptive-off":
        assert "rounds_chain_0" in r.stats      # the turn-off path ran under the guard too


def test_the_guard_catches_a_host_read():
    spans = torch.rand(5) + 0.5
    best = torch.argmin(spans[1:]) + 1
    with no_host_sync(), pytest.raises(HostSync):
        spans[best]                              # indexing with a 0-dim tensor reads it
    with no_host_sync(), pytest.raises(HostSync):
        bool(spans[0] < spans[1])
    alpha, remaining = torch.rand(3) * 0.9, torch.tensor([9, 30, 4])
    with no_host_sync():
        cost = torch.tensor([1.0, 1.3, 1.6, 1.9])
        best, plain = next_length(expected_tokens(alpha, 3), remaining,
                                  torch.tensor([True, True, False]), cost)
    assert 1 <= int(best) <= 3 and plain.dtype == torch.bool
