"""The chain_commit kernel (a graphed round's end in one launch) against chain_commit_ref, a
row-by-row reference, on random batch states: rows inactive, rows at their limit, EOS among the
committed tokens (kept and not), drafts that all match, counts near the row's end."""
import pytest
import torch

from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.reference_ops import CHAIN_COMMIT_STATE, chain_commit_ref


def random_round(B: int, C: int, W: int, vocab: int, log: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    committed = torch.randint(0, vocab, (B, C), generator=g)
    # Drafts agree with the target's argmax for a random number of leading positions.
    drafts = torch.randint(0, vocab, (B, C - 1), generator=g)
    agree = torch.randint(0, C, (B,), generator=g)
    for b in range(B):
        drafts[b, :agree[b]] = committed[b, :agree[b]]
    count = torch.randint(1, W - C, (B,), generator=g)
    count[0] = W - C - 1                       # near the row's end: the clamp is exercised
    state = {
        "out": torch.randint(0, vocab, (B, W), generator=g),
        "count": count,
        "length": count + torch.randint(3, 40, (B,), generator=g),
        "last": torch.randint(0, vocab, (B,), generator=g),
        "prev": torch.randint(0, vocab, (B,), generator=g),
        "limit": count + torch.randint(1, 2 * C, (B,), generator=g),   # some reach it now
        "active": torch.rand(B, generator=g) < 0.75,
        "log": torch.full((W, B), -1, dtype=torch.int64),
        "row_round": (torch.randint(0, W // 2, (B,), generator=g) if log != "round" else None),
        "status": torch.randint(0, 3, (W, 2), generator=g),
        "round_index": torch.tensor([int(torch.randint(0, W + 3, (1,), generator=g))]),
    }
    state["active"][0] = True                  # one row ran and stops at its limit now
    state["limit"][0] = count[0] + 1
    return committed, drafts, state


def run_kernel(module, committed, drafts, state, device, eos=None, outs=False):
    s = {k: (v.clone().to(device) if v is not None else None) for k, v in state.items()}
    B = committed.shape[0]
    extra = {}
    if outs:
        extra = dict(n_out=torch.full((B,), -7, dtype=torch.int64, device=device),
                     before_out=torch.zeros(B, dtype=torch.bool, device=device),
                     r_out=torch.full((1,), -7, dtype=torch.int64, device=device))
    module.launch(committed.to(device), drafts.to(device), s["out"], s["count"], s["length"],
                  s["last"], s["prev"], s["limit"], s["active"], s["log"], s["status"],
                  s["round_index"], eos=None if eos is None else eos.to(device),
                  row_round=s["row_round"], **extra)
    s.update(extra)
    return {k: v.cpu() for k, v in s.items() if v is not None}


def assert_state_equal(got, expected, outs=False):
    for key in CHAIN_COMMIT_STATE + (("n_out", "before_out", "r_out") if outs else ()):
        if key not in got:
            continue
        ref_key = {"n_out": "n", "before_out": "before", "r_out": "r"}.get(key, key)
        e = expected[ref_key]
        assert torch.equal(got[key].reshape(e.shape), e), key


@pytest.mark.parametrize("log", ["round", "row", "row_plain"])
@pytest.mark.parametrize("B,C", [(5, 5), (16, 3), (3, 9)])
def test_accepting_from_drafts_matches_the_reference(kernel_cache, device, log, B, C):
    module = build_triton_module(kernel_spec("chain_commit", LOG=log), kernel_cache)
    for seed in range(3):
        committed, drafts, state = random_round(B, C, 40, 50, log, seed * 7 + B + C)
        eos = torch.tensor([int(committed[1, 0]), int(committed[2 % B, C - 1]), 49])
        got = run_kernel(module, committed, drafts, state, device, eos=eos, outs=True)
        expected = chain_commit_ref(state, committed, drafts, eos=eos, log=log)
        assert_state_equal(got, expected, outs=True)
        # The case is not trivial: some rows ran, some accepted drafts, some stopped.
        assert expected["before"].any() and (expected["n"][expected["before"]] > 0).any()
        assert (expected["before"] & ~expected["active"]).any()


def test_counts_set_by_hand_and_no_eos(kernel_cache, device):
    """Drafts that agree with the target's argmax for 0, 3, 1, 2, 3, 0 and 2 leading positions
    (3: every draft of the chain): those counts accepted, their tokens written, no EOS."""
    module = build_triton_module(kernel_spec("chain_commit", LOG="round"), kernel_cache)
    committed, drafts, state = random_round(7, 4, 30, 1000, "round", 11)
    n = torch.tensor([0, 3, 1, 2, 3, 0, 2])
    for b, agree in enumerate(n.tolist()):
        drafts[b] = committed[b, :3] + 1               # no draft right...
        drafts[b, :agree] = committed[b, :agree]       # ...but the first `agree`
    state["active"][:] = True
    got = run_kernel(module, committed, drafts, state, device, outs=True)
    expected = chain_commit_ref(state, committed, drafts)
    assert_state_equal(got, expected, outs=True)
    assert got["n_out"].tolist() == n.tolist()
    row = int(torch.nonzero(n == 3)[0])
    start = int(state["count"][row])
    assert got["out"][row, start:start + 4].tolist() == committed[row].tolist()


def test_a_plain_step_and_every_row_finishing(kernel_cache, device):
    """k = 0 (one committed token, no drafts): every row reaches its limit, so the status row
    says the batch has finished."""
    module = build_triton_module(kernel_spec("chain_commit", LOG="row"), kernel_cache)
    committed, drafts, state = random_round(6, 1, 20, 100, "row", 3)
    state["active"][:] = True
    state["limit"] = state["count"] + 1
    got = run_kernel(module, committed, drafts, state, device)
    expected = chain_commit_ref(state, committed, drafts, log="row")
    assert_state_equal(got, expected)
    assert not got["active"].any()
    r = min(int(state["round_index"]), 19)
    assert int(got["status"][r, 0]) == 1


def test_bad_arguments_are_refused(kernel_cache, device):
    module = build_triton_module(kernel_spec("chain_commit", LOG="round"), kernel_cache)
    committed, drafts, state = random_round(4, 3, 20, 100, "round", 5)
    with pytest.raises(ValueError, match="drafts must be"):
        run_kernel(module, committed, drafts[:, :1], state, device)
    with pytest.raises(ValueError, match="no row_round"):
        state["row_round"] = torch.zeros(4, dtype=torch.int64)
        run_kernel(module, committed, drafts, state, device)
