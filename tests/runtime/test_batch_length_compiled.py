"""The length policy's round compiled by Inductor (runtime/batch_length.py,
`compiled_policy_round`, what a captured GPU decoder runs) against the eager tensor operations it
compiles: the same length every round and the same state after it, on random rounds (rows that
ran or not, finished rows, a refill's newcomer and its queue running dry). Inductor compiles for
the CPU here (C++), as it compiles Triton kernels for a GPU from the same graph."""
import pytest
import torch

from specpilot.runtime.batch_length import BatchLengthPolicy, compiled_policy_round, policy_round

STATE = ("accepted_avg", "rejected_avg", "accepted_total", "rejected_total", "first_judged",
         "rounds", "off", "chosen", "workload")
DEPTH_STATE = ("rates", "tried", "took", "workload")


@pytest.mark.parametrize("batch,objective,turn_off,smoothing,estimator", [
    (1, "makespan", True, 0.5, "geometric"), (6, "makespan", True, 0.2, "geometric"),
    (6, "throughput", True, 0.5, "geometric"), (5, "makespan", False, 0.5, "geometric"),
    (6, "throughput", True, 0.5, "per_depth"), (5, "makespan", True, 0.5, "per_depth")])
def test_the_compiled_round_chooses_and_keeps_what_the_eager_round_does(batch, objective,
                                                                        turn_off, smoothing,
                                                                        estimator):
    gen = torch.Generator().manual_seed(batch * 7 + len(objective))
    cap = 4
    # Rounds dear enough that plain steps win once every draft is rejected: the second half of
    # the rounds below turns the batch off.
    costs = [1.0] + (1.0 + (0.5 + 0.5 * torch.rand(cap, generator=gen)).cumsum(0)).tolist()
    eager, compiled = (BatchLengthPolicy(batch, cap, "cpu", 0.0, round_costs=costs,
                                         objective=objective, turn_off=turn_off,
                                         smoothing=smoothing, compile_rounds=flag,
                                         estimator=estimator)
                       for flag in (False, True))
    assert compiled._round is compiled_policy_round() and eager._round is policy_round
    remaining = torch.randint(40, 120, (batch,), generator=gen)
    chosen, offs = set(), set()
    for r in range(48):
        # A mix of good and poor rows, so lengths change and a batch may turn off.
        length = int(torch.randint(1, cap + 1, (), generator=gen))
        good = (torch.rand(batch, generator=gen) < 0.5) & (r < 12)
        n = torch.where(good, torch.full((batch,), length),
                        torch.randint(0, length + 1, (batch,), generator=gen) * (r < 12))
        drafted = torch.full((batch,), length)
        ran = torch.rand(batch, generator=gen) < 0.9
        active = ran & (remaining > 0)
        if objective == "throughput" and r == 10:
            for policy in (eager, compiled):
                policy.admit(0, alone=batch == 1)
        if objective == "throughput" and r == 30:
            for policy in (eager, compiled):
                policy.draining.fill_(True)
        want = eager.next(n, drafted, ran, remaining, active)
        got = compiled.next(n, drafted, ran, remaining, active)
        assert int(got) == int(want), f"round {r}"
        for name in STATE:
            torch.testing.assert_close(getattr(compiled, name), getattr(eager, name),
                                       msg=f"{name} after round {r}")
        if estimator == "per_depth":
            for name in DEPTH_STATE:
                torch.testing.assert_close(getattr(compiled.depth, name),
                                           getattr(eager.depth, name),
                                           msg=f"depth {name} after round {r}")
        chosen.add(int(want))
        offs.add(bool(eager.off))
        remaining = torch.where(active, (remaining - n - 1).clamp(min=0), remaining)
    # Both choices were compared: lengths that changed, and the turn-off (where it may).
    assert len(chosen - {0}) > 1
    assert (0 in chosen and offs == {False, True}) if turn_off else chosen.isdisjoint({0})


def test_an_uncaptured_decoder_runs_the_update_eagerly_unless_asked(monkeypatch):
    """Uncaptured (off a GPU) the update is eager; asked for, compiled; SPECPILOT_FAST_OPS=0
    turns the captured default off (`compiles_policy`); the smoothing reaches the policy and
    is checked there. That a captured decoder compiles it by default is checked on the GPU
    (tests/gpu/test_graphed_chain_gpu.py)."""
    from specpilot.bench.shapes import random_pair
    from specpilot.ir.errors import SpecPilotError
    from specpilot.runtime.fast_ops import compiles_policy
    from specpilot.runtime.graphed_chain import GraphedChainDecoder

    target, drafter, _ = random_pair("zoo-gpu-small:zoo-gpu-small-drafter", 0.0625)
    eager = GraphedChainDecoder(target, drafter, 2, 48, 2, capture=False, adaptive=True)
    assert eager.policy._round is policy_round and not eager.policy.compiled
    asked = GraphedChainDecoder(target, drafter, 2, 48, 2, capture=False, adaptive=True,
                                compile_policy=True, smoothing=0.2)
    assert asked.policy._round is compiled_policy_round() and asked.policy.compiled
    assert asked.policy.smoothing == 0.2
    monkeypatch.delenv("SPECPILOT_FAST_OPS", raising=False)
    assert compiles_policy()
    monkeypatch.setenv("SPECPILOT_FAST_OPS", "0")
    assert not compiles_policy()
    with pytest.raises(SpecPilotError, match="smoothing"):
        GraphedChainDecoder(target, drafter, 2, 48, 2, capture=False, adaptive=True,
                            smoothing=1.5)
