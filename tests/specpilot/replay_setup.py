"""Replay fixtures for the tests of the replays (specpilot/bench/*replay*.py) and the scripts
built on them: a chain profile from per-position agreement, and step costs with graphed chain
rounds."""
from specpilot.bench.replay import AcceptanceProfile
from specpilot.bench.step_costs import StepCosts
from specpilot.ir.topology import Chain


def profile_from_agreement(k, maps):
    """The chain(k) profile a greedy decoder with this per-position agreement would record."""
    lengths, tokens = [], []
    for agree in maps:
        row, position = [], 0
        while position < len(agree):
            a = 0
            while a < k and position + a < len(agree) and agree[position + a]:
                a += 1
            row.append(a)
            position += a + 1
        lengths.append(row)
        tokens.append(position + 1)
    return AcceptanceProfile(Chain(k), lengths, tokens)


def chain_round_costs(batch_sizes, ar, rounds):
    """StepCosts with a plain step of `ar` seconds and a graphed chain(L) round of rounds[L-1]."""
    c = StepCosts(context=64, graphed=True)
    for b in batch_sizes:
        c.target_costs[b] = {1: ar * (1 + 0.01 * b)}
        for n, seconds in enumerate(rounds, start=1):
            c.round_costs.setdefault(str(Chain(n)), {})[b] = seconds * (1 + 0.01 * b)
    return c
