"""The row_start kernel (a refilled newcomer's row started in one launch) against
start_row_ops, its torch reference: random batch state and logits (float32 and bfloat16,
vocabularies over several of the kernel's blocks), equal maxima in different blocks, a first
token that is an EOS, a limit of one token, no EOS ids, rows at the batch's edges; only the
row's own entries change."""
import pytest
import torch

from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.graphed_refill import start_row_ops

NAMES = ("out", "accepted", "row_round", "length", "prev", "limit_t", "count", "last", "active")


def random_state(B: int, W: int, seed: int) -> dict:
    """A running batch's state, random everywhere (never zeros)."""
    g = torch.Generator().manual_seed(seed)
    ints = lambda *shape: torch.randint(2, 900, shape, generator=g)    # noqa: E731
    return {"out": ints(B, W), "accepted": torch.randint(-1, 5, (W, B), generator=g),
            "row_round": ints(B), "length": ints(B), "prev": ints(B), "limit_t": ints(B),
            "count": ints(B), "last": ints(B),
            "active": torch.rand(B, generator=g) < 0.5}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,W,V,row,limit,case", [
    (16, 40, 3000, 0, 64, "plain"), (16, 40, 3000, 15, 64, "eos_first"),
    (5, 1300, 257, 4, 1, "plain"), (7, 33, 2500, 3, 9, "tie"), (3, 9, 64, 1, 2, "no_eos"),
    (64, 200, 8192, 37, 256, "tie")])
def test_row_start_kernel_follows_the_torch_ops(dtype, B, W, V, row, limit, case, kernel_cache,
                                                 device):
    seed = B * 7 + row
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(1, V, generator=g) * 4).to(dtype)
    top = int(torch.argmax(logits))
    if case == "tie":            # the same maximum twice, blocks apart: the first one wins
        low, high = sorted({top, (top + 1500) % V})
        value = logits[0].float().max() + 1
        logits[0, low] = value
        logits[0, high] = value
        assert int(torch.argmax(logits)) == low
    eos = None if case == "no_eos" else torch.tensor([3, 11, 999], dtype=torch.int64)
    if case == "eos_first":
        eos = torch.tensor([3, int(torch.argmax(logits)), 999], dtype=torch.int64)
    ref = random_state(B, W, seed)
    got = {name: t.clone().to(device) for name, t in ref.items()}
    prompt_len, prompt_last = 17 + row, 401 + row
    start_row_ops(logits, *(ref[n] for n in NAMES), eos, row, prompt_len, prompt_last, limit)
    module = build_triton_module(kernel_spec("row_start"), kernel_cache)
    module.launch(logits.to(device), *(got[n] for n in NAMES),
                  None if eos is None else eos.to(device), row, prompt_len, prompt_last, limit)
    for name in NAMES:
        assert torch.equal(got[name].cpu(), ref[name]), name
    # The reference did what the contract says (so the comparison is not of two no-ops).
    before = random_state(B, W, seed)
    g0 = int(torch.argmax(logits.float()))
    assert int(ref["last"][row]) == g0
    assert ref["out"][row, 0] == g0 and not ref["out"][row, 1:].any()
    assert (ref["accepted"][:, row] == -1).all() and ref["count"][row] == 1
    runs = limit > 1 and case != "eos_first"
    assert bool(ref["active"][row]) == runs
    others = [r for r in range(B) if r != row]
    for name in NAMES:
        column = name == "accepted"
        keep = ref[name][:, others] if column else ref[name][others]
        was = before[name][:, others] if column else before[name][others]
        assert torch.equal(keep, was), name


def test_row_start_refuses_bad_arguments(kernel_cache, device):
    module = build_triton_module(kernel_spec("row_start"), kernel_cache)
    state = {n: t.to(device) for n, t in random_state(4, 10, 1).items()}
    logits = torch.randn(1, 50, device=device)
    args = [state[n] for n in NAMES]
    with pytest.raises(ValueError, match="row 4 is outside the batch of 4"):
        module.launch(logits, *args, None, 4, 3, 5, 8)
    with pytest.raises(ValueError, match="logits must be a \\[1, V\\] tensor"):
        module.launch(logits.expand(2, 50), *args, None, 1, 3, 5, 8)
    with pytest.raises(ValueError, match="active must be a contiguous torch.bool"):
        module.launch(logits, *args[:-1], args[-1].to(torch.int64), None, 1, 3, 5, 8)
