"""How a graphed call's results are read back on the host (runtime/graphed_loop.py,
GraphedRefillDecoder._accepted_rows), checked against the plain Python they replace, on random
rows: cut at the limit and after the first of several EOS ids, the accepted drafts with -1
entries anywhere in a row, and the mean committed per round."""
import random
from types import SimpleNamespace

import pytest
import torch

from specpilot.runtime.graphed_loop import cut_tokens, first_of, mean_committed
from specpilot.runtime.graphed_refill import GraphedRefillDecoder


def _plain_cut(rows, counts, limits, eos):
    out = []
    for row, c, limit in zip(rows, counts, limits):
        toks = row[:min(c, limit)]
        cut = next((i for i, t in enumerate(toks) if t in set(eos)), None)
        out.append(toks if cut is None else toks[:cut + 1])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("eos", [[], [7], [3, 7, 11]])
def test_tokens_are_cut_as_a_scan_one_by_one_cuts_them(seed, eos):
    rng = random.Random(seed)
    rows = [[rng.randrange(40) for _ in range(rng.randrange(1, 60))] for _ in range(50)]
    counts = [rng.randrange(0, len(r) + 3) for r in rows]
    limits = [rng.randrange(1, 70) for _ in rows]
    decoder = SimpleNamespace(eos=torch.tensor(eos, dtype=torch.long) if eos else None)
    got = cut_tokens(decoder, rows, counts, limits, trim_eos=True)
    assert got == _plain_cut(rows, counts, limits, eos)
    # the EOS ids are found in many rows here: the test cuts for real
    assert sum(len(g) < min(c, lim, len(r)) for g, c, lim, r in zip(got, counts, limits, rows)) \
        > (5 if eos else -1)
    assert cut_tokens(decoder, rows, counts, limits, trim_eos=False) == \
        _plain_cut(rows, counts, limits, [])


def test_first_of_finds_the_earliest_of_the_wanted():
    assert first_of([5, 9, 2, 9, 5], [9, 5]) == 0
    assert first_of([1, 9, 2, 5], [5, 9]) == 1
    assert first_of([1, 2, 3], [4, 5]) is None
    assert first_of([], [1]) is None
    assert first_of([1, 2], []) is None


@pytest.mark.parametrize("seed", [3, 4])
def test_mean_committed_is_drafts_plus_one_averaged_over_rounds(seed):
    rng = random.Random(seed)
    accepted = [[rng.randrange(0, 5) for _ in range(rng.randrange(0, 30))] for _ in range(40)]
    rounds = [n for row in accepted for n in row]
    assert mean_committed(accepted) == pytest.approx(sum(n + 1 for n in rounds) / len(rounds),
                                                     rel=1e-15)
    assert mean_committed([[], []]) == 0.0


@pytest.mark.parametrize("seed", [5, 6])
def test_accepted_rows_keep_each_rows_logged_drafts_in_order(seed):
    """-1 (a round the request did not log) may sit between logged entries and after them;
    a request's rounds past its logged entries count 0 drafts accepted."""
    gen = torch.Generator().manual_seed(seed)
    n, width = 23, 40
    results, want = {}, []
    for i in range(n):
        log = torch.randint(0, 5, (width,), generator=gen)
        log[torch.rand(width, generator=gen) < 0.3] = -1
        rounds = int(torch.randint(0, width + 1, (1,), generator=gen))
        log[rounds:] = -1
        results[i] = {"accepted": log, "rounds": torch.tensor(rounds)}
        kept = [a for a in log[:rounds].tolist() if a >= 0]
        want.append(kept + [0] * (rounds - len(kept)))
    assert GraphedRefillDecoder._accepted_rows(results, n) == want
    assert any(-1 in results[i]["accepted"][:int(results[i]["rounds"])].tolist()
               for i in range(n))
