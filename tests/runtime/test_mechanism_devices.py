"""Every eager mechanism decode keeps host-built tensors out of model-device ops.

On the CPU a host tensor mixed into a device op runs fine; on a GPU it raises. The decodes run
under `DeviceProvenance` (tests/runtime/device_provenance.py), which raises where the GPU
would, while still comparing the tokens with greedy AR. tests/gpu/test_mechanisms_gpu.py runs
the same decodes on a real GPU.
"""
import pytest
import torch

from specpilot.ir.prune import LayerSkipPrune, LowPrecisionPrune
from specpilot.ir.topology import Chain, DynamicTree, Tree
from specpilot.runtime.adaptive_draft import AdaptiveChainProposer
from specpilot.runtime.dynamic_tree import DynamicProposer
from specpilot.runtime.model import Transformer
from specpilot.runtime.reference_ops import varlen_attention_ref
from specpilot.runtime.torch_backend import TorchBackend
from specpilot.runtime.tree_drafting import StaticProposer
from specpilot.runtime.two_level import TreePruner, cheap_verifier

from device_provenance import CrossDeviceError, DeviceProvenance
from mechanism_setup import one_thread  # noqa: F401  (autouse: one torch thread)
from mechanism_setup import SEEDS, decode, force, assert_clean, pair_setup


def _pruner(target, prune):
    cheap = cheap_verifier(target, prune)
    return lambda batch, capacity: TreePruner(cheap, prune.top_k, batch, capacity)


# name -> (proposer factory, decode keyword arguments given the setup)
MECHANISMS = {
    "ragged-chain-continuous": (lambda: StaticProposer(Chain(3)),
                                lambda s: dict(layout="ragged", refill="continuous")),
    "ragged-adaptive-continuous": (lambda: AdaptiveChainProposer(Chain(4), 7),
                                   lambda s: dict(layout="ragged", refill="continuous")),
    "ragged-dynamic-layer-skip": (lambda: DynamicProposer(DynamicTree(6, 3, 3)),
                                  lambda s: dict(layout="ragged", pruner_factory=_pruner(
                                      s["target"], LayerSkipPrune((1,), 2)))),
    "padded-tree-low-precision-continuous": (
        lambda: StaticProposer(Tree((2, 2))),
        lambda s: dict(layout="padded", refill="continuous", pruner_factory=_pruner(
            s["target"], LowPrecisionPrune("bfloat16", 2)))),
    "padded-dynamic": (lambda: DynamicProposer(DynamicTree(5, 3, 2)),
                       lambda s: dict(layout="padded")),
}


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_mechanism_decode_keeps_tensors_on_the_model_device(name):
    s = pair_setup(SEEDS[0])
    proposer, kwargs = MECHANISMS[name]
    with DeviceProvenance() as mode:
        result = decode(s, proposer(), 3, **kwargs(s))
    assert mode.ops > 0
    assert result.tokens == s["reference"].tokens


def test_forced_ragged_decode_keeps_tensors_on_the_model_device():
    s = pair_setup(SEEDS[1])
    with DeviceProvenance():
        report = force(s, DynamicProposer(DynamicTree(6, 3, 3)), 2, layout="ragged",
                       refill="continuous")
    assert_clean(report, s["reference"])


class _VarlenReference(TorchBackend):
    """The torch backend with a varlen attention (`varlen_attention_ref`), so the ragged
    layout takes its one-launch path and builds the kernel's offsets and visibility."""
    has_varlen_attention = True

    def varlen_attention(self, q, k_cache, v_cache, cu, rows, kv_limits, window_bits, scale,
                         max_seqlen=None):
        out = varlen_attention_ref(q, k_cache, v_cache, cu, rows, kv_limits, window_bits, scale)
        return out.reshape(q.shape[0], -1)


def test_ragged_decode_through_a_varlen_backend_keeps_tensors_on_the_model_device():
    s = pair_setup(SEEDS[0])
    target = Transformer.from_checkpoint(s["target_dir"], backend=_VarlenReference())
    drafter = Transformer.from_checkpoint(s["drafter_dir"], backend=_VarlenReference())
    with DeviceProvenance():
        result = decode(dict(s, target=target), StaticProposer(Tree((2, 1))), 3,
                        drafter=drafter, layout="ragged", refill="continuous")
    assert result.tokens == s["reference"].tokens


def test_the_guard_raises_where_a_gpu_would():
    weights = torch.randn(5)                       # made before the mode: a model tensor
    with DeviceProvenance():
        on_device = weights > 0
        fine = torch.where(on_device, weights, torch.zeros(5, device=weights.device))
        assert fine.shape == (5,)
        host_index = torch.tensor([0, 2])
        assert host_index.tolist() == [0, 2]       # host tensors among themselves are fine
        with pytest.raises(CrossDeviceError, match="where"):
            torch.where(on_device, weights, torch.zeros_like(host_index, dtype=weights.dtype))
        with pytest.raises(CrossDeviceError):
            weights + torch.arange(5)
        moved = host_index.to(weights.device)      # a copy on the device ...
        assert weights[moved].shape == (2,)
        with pytest.raises(CrossDeviceError):      # ... while the original stays on the host
            weights[host_index]
        # a device's own .device made a device tensor; a host tensor's .device a host one
        assert (weights + torch.ones(5, device=weights.device)).shape == (5,)
        with pytest.raises(CrossDeviceError):
            weights + torch.ones(5, device=host_index.device)[:5]
        assert (weights * torch.tensor(2.0)).shape == (5,)   # 0-dim host scalars are allowed
