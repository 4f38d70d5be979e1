"""The length_admit kernel (a refilled row's adaptive-length estimates in one launch) against
BatchLengthPolicy.admit's torch operations, its reference: a workload seen and not yet seen,
depths nobody has tried, rows at the batch's edges, both estimates; and a policy built with its
kernels admits as one without them."""
import pytest
import torch

from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.codegen.round_end import ADMIT_NODE, POLICY_NODE, round_end_kernels
from specpilot.runtime.batch_length import BatchLengthPolicy

STATE = ("accepted_avg", "rejected_avg", "accepted_total", "rejected_total")
DEPTH = ("rates", "tried", "took", "workload")


def random_policy(B: int, cap: int, estimator: str, seen: bool, seed: int, device="cpu",
                  kernel=False) -> BatchLengthPolicy:
    """A refilled batch's policy some rounds in, its state random (not the prior); with
    `kernel`, given the round end's generated kernels as a refill decoder gives them."""
    g = torch.Generator().manual_seed(seed)
    built = (round_end_kernels(torch.device(device), refill=True, adaptive=True,
                               estimator=estimator) if kernel else {})
    p = BatchLengthPolicy(B, cap, device, 0.137, None, True, "throughput", estimator=estimator,
                          update_kernel=built.get(POLICY_NODE),
                          admit_kernel=built.get(ADMIT_NODE))
    for name in STATE:
        getattr(p, name).copy_(torch.rand(B, generator=g) * 5)
    p.workload.copy_(torch.tensor([float(torch.randint(5, 90, (1,), generator=g)),
                                   float(torch.randint(1, 30, (1,), generator=g)),
                                   float(torch.randint(1, 40, (1,), generator=g))])
                     if seen else torch.zeros(3))
    if p.depth is not None:
        tried = torch.randint(0, 50, (cap,), generator=g).to(torch.float32)
        tried[-1] = 0.0                           # a depth nobody has tried
        took = torch.floor(tried * torch.rand(cap, generator=g))
        p.depth.workload.copy_(torch.stack([tried, took]) if seen else torch.zeros(2, cap))
        for name in DEPTH[:3]:
            getattr(p.depth, name).copy_(torch.rand(B, cap, generator=g) * 9)
    return p


def snapshot(p: BatchLengthPolicy) -> dict:
    got = {name: getattr(p, name).cpu().clone() for name in STATE + ("workload",)}
    if p.depth is not None:
        got.update({"depth_" + name: getattr(p.depth, name).cpu().clone() for name in DEPTH})
    return got


@pytest.mark.parametrize("estimator", ["geometric", "per_depth"])
@pytest.mark.parametrize("B,cap,row,seen", [(16, 4, 0, True), (16, 4, 15, True), (17, 3, 16, True),
                                            (5, 1, 1, True), (6, 5, 2, False), (64, 8, 37, True)])
def test_length_admit_kernel_follows_the_torch_admission(estimator, B, cap, row, seen,
                                                         kernel_cache, device):
    ref = random_policy(B, cap, estimator, seen, seed=B + 10 * row)
    got = snapshot(ref)
    moved = {k: v.to(device) for k, v in got.items()}
    module = build_triton_module(kernel_spec("length_admit", ESTIMATOR=estimator), kernel_cache)
    depth = ({"depth_" + name: moved["depth_" + name] for name in DEPTH}
             if estimator == "per_depth" else {})
    module.launch(moved["accepted_avg"], moved["rejected_avg"], moved["accepted_total"],
                  moved["rejected_total"], moved["workload"], row, cap, ref.off_after, **depth)
    before = snapshot(ref)
    ref.admit(row)
    want = snapshot(ref)
    for key, value in want.items():
        torch.testing.assert_close(moved[key].cpu(), value, rtol=1e-6, atol=1e-6,
                                   msg=lambda m: f"{key}: {m}")
        # Only the newcomer's row changed (the workload is read, not written).
        others = [i for i in range(B) if i != row] if value.dim() and value.shape[0] == B else []
        assert torch.equal(moved[key].cpu()[others], before[key][others]), key
    assert not torch.equal(want["accepted_avg"][row], before["accepted_avg"][row])


@pytest.mark.parametrize("estimator", ["geometric", "per_depth"])
def test_a_policy_with_kernels_admits_as_one_without(estimator, device):
    plain = random_policy(8, 4, estimator, True, seed=3)
    fused = random_policy(8, 4, estimator, True, seed=3, device=device, kernel=True)
    assert fused._admit_kernel is not None
    for row in (5, 0, 7):
        plain.admit(row)
        fused.admit(row)
    plain.admit(2, alone=True)      # alone: the batch starts anew, as torch operations either way
    fused.admit(2, alone=True)
    for key, value in snapshot(plain).items():
        torch.testing.assert_close(snapshot(fused)[key], value, rtol=1e-6, atol=1e-6)


def test_the_launcher_refuses_a_row_outside_the_batch_and_state_of_the_wrong_kind(kernel_cache):
    # Refused on the host before any launch: CPU tensors serve on every machine.
    p = random_policy(4, 3, "geometric", True, seed=1)
    module = build_triton_module(kernel_spec("length_admit"), kernel_cache)
    args = (p.accepted_avg, p.rejected_avg, p.accepted_total, p.rejected_total, p.workload)
    with pytest.raises(ValueError, match="row 4"):
        module.launch(*args, 4, 3, 8)
    with pytest.raises(ValueError, match="workload"):
        module.launch(*args[:4], p.workload[:2], 0, 3, 8)
    with pytest.raises(ValueError, match="per-depth"):
        module.launch(*args, 0, 3, 8, depth_rates=torch.ones(4, 3))
    with pytest.raises(ValueError, match="off_after"):
        module.launch(*args, 0, 3, 0)
