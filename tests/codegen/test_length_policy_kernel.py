"""The length_policy kernel (the adaptive length's update in one launch) against policy_round,
its torch reference, over whole sequences of rounds on random batches: both estimates, both
objectives, with and without the turn-off, rows that did not run or draft, rows finished,
the refill queue draining midway, drafters good enough to keep speculating and poor enough to
turn it off."""
import pytest
import torch

from specpilot.codegen.cache import build_triton_module
from specpilot.codegen.kernel_spec import kernel_spec
from specpilot.runtime.adaptive_draft import OFF_CONFIDENCE
from specpilot.runtime.batch_length import policy_round
from specpilot.runtime.depth_acceptance import DEPTH_SMOOTHING

FLOAT_STATE = ("accepted_avg", "rejected_avg", "accepted_total", "rejected_total",
               "first_judged", "workload")
DEPTH_STATE = ("depth_rates", "depth_tried", "depth_took", "depth_workload")


def fresh_state(B: int, cap: int, costs, g: torch.Generator, per_depth: bool) -> dict:
    """A batch's state some rounds in: moving averages and counts that are not the prior."""
    f32 = dict(dtype=torch.float32)
    state = {
        "accepted_avg": torch.rand(B, generator=g) * cap + 0.05,
        "rejected_avg": torch.rand(B, generator=g),
        "accepted_total": torch.randint(0, 30, (B,), generator=g).to(torch.float32),
        "rejected_total": torch.randint(0, 10, (B,), generator=g).to(torch.float32),
        "first_judged": torch.full((B,), -1.0, **f32),
        "rounds": torch.zeros((), dtype=torch.int64),
        "off": torch.zeros((), dtype=torch.bool),
        "chosen": torch.full((), cap, dtype=torch.int64),
        "workload": torch.rand(3, generator=g) * 40,
        "round_cost": torch.tensor(costs, **f32),
    }
    if per_depth:
        tried = torch.randint(0, 20, (B, cap), generator=g).to(torch.float32)
        state.update(depth_rates=torch.rand(B, cap, generator=g),
                     depth_tried=tried,
                     depth_took=torch.floor(tried * torch.rand(B, cap, generator=g)),
                     depth_workload=torch.rand(2, cap, generator=g) * 50)
    return state


def reference_round(state, n, drafted, ran, limit, count, active, draining, objective,
                    turn_off, off_after, smoothing):
    depth = tuple(state[k] for k in DEPTH_STATE) if "depth_rates" in state else ()
    remaining = (limit - count).clamp(min=0)
    return policy_round(state["accepted_avg"], state["rejected_avg"], state["accepted_total"],
                        state["rejected_total"], state["first_judged"], state["rounds"],
                        state["off"], state["chosen"], state["workload"], draining,
                        state["round_cost"], n, drafted, ran, remaining, active, objective,
                        turn_off, off_after, smoothing, *depth)


@pytest.mark.parametrize("estimator", ["geometric", "per_depth"])
@pytest.mark.parametrize("objective", ["makespan", "throughput"])
@pytest.mark.parametrize("turn_off", [True, False])
@pytest.mark.parametrize("B,cap,seed,poor", [(1, 4, 0, False), (5, 3, 1, True), (16, 4, 2, False),
                                             (16, 4, 3, True), (7, 1, 4, True), (33, 6, 5, False)])
def test_length_policy_kernel_follows_policy_round(estimator, objective, turn_off, B, cap, seed,
                                                   poor, kernel_cache, device):
    g = torch.Generator().manual_seed(1000 * seed + 7 * cap + B)
    # Measured-like prices; a poor drafter's rounds dearer, so plain steps come to win.
    per_draft = 0.6 if poor else 0.12 + 0.1 * torch.rand(1, generator=g).item()
    costs = [1.0] + [1.15 + per_draft * L + 0.01 * torch.rand(1, generator=g).item()
                     for L in range(1, cap + 1)]
    per_depth = estimator == "per_depth"
    ref = fresh_state(B, cap, costs, g, per_depth)
    got = {k: v.clone().to(device) for k, v in ref.items()}
    module = build_triton_module(kernel_spec("length_policy", ESTIMATOR=estimator,
                                             OBJECTIVE=objective, TURN_OFF=turn_off),
                                 kernel_cache)
    W, off_after, smoothing = 40, 4, 0.5
    status = torch.full((W, 2), -5, dtype=torch.int64, device=device)
    count = torch.randint(0, 30, (B,), generator=g)
    limit = count + torch.randint(0, 120, (B,), generator=g)
    active = torch.rand(B, generator=g) < 0.8
    lengths = []
    for rnd in range(14):
        k = int(torch.randint(1, cap + 1, (1,), generator=g))
        drafted = torch.full((B,), k, dtype=torch.int64)
        drafted[torch.rand(B, generator=g) < 0.1] = 0        # a row that drafted nothing
        accept_p = 0.15 if poor else 0.8
        n = (torch.rand(B, k, generator=g) < accept_p).to(torch.int64).cumprod(1).sum(1)
        n = torch.minimum(n, drafted)
        ran = active.clone()
        if rnd == 5:
            ran[:] = False                                   # refilled slots waiting
        draining = torch.tensor(rnd >= 9)                    # the queue empties midway
        count_after = count + torch.where(ran, n + 1, 0)
        active_after = ran & (count_after < limit)
        if rnd % 4 == 3:
            active_after |= torch.rand(B, generator=g) < 0.3  # newcomers admitted
        expected = reference_round(ref, n, drafted, ran, limit, count_after, active_after,
                                   draining, objective, turn_off, off_after, smoothing)
        r = torch.tensor([rnd % W])
        inputs = [t.to(device) for t in (draining, n, drafted, ran, limit, count_after,
                                         active_after, r)]
        module.launch(got["accepted_avg"], got["rejected_avg"], got["accepted_total"],
                      got["rejected_total"], got["first_judged"], got["rounds"], got["off"],
                      got["chosen"], got["workload"], inputs[0], got["round_cost"], *inputs[1:7],
                      status, inputs[7], smoothing, DEPTH_SMOOTHING, OFF_CONFIDENCE, off_after,
                      **{k: got[k] for k in DEPTH_STATE if k in got})
        assert int(status[rnd % W, 1]) == int(expected), f"round {rnd}"
        lengths.append(int(expected))
        for key in FLOAT_STATE + (DEPTH_STATE if per_depth else ()):
            torch.testing.assert_close(got[key].cpu(), ref[key], rtol=2e-6, atol=2e-6,
                                       msg=lambda m: f"{key} after round {rnd}: {m}")
        for key in ("rounds", "off", "chosen"):
            assert torch.equal(got[key].cpu(), ref[key]), f"{key} after round {rnd}"
        count, active = count_after, active_after
    # The sequence is not trivial: both the lengths and (poor drafters, with the turn-off)
    # speculation going off are exercised.
    if turn_off and poor and B > 1:
        assert lengths[-1] == 0 and 0 not in lengths[:off_after - 1]
    if not poor:
        assert 0 not in lengths
    assert status[:, 0].eq(-5).all(), "only the length column of the status is written"


def test_the_launcher_refuses_state_of_the_wrong_kind(kernel_cache):
    # Refused on the host before any launch: CPU tensors serve on every machine.
    module = build_triton_module(kernel_spec("length_policy"), kernel_cache)
    g = torch.Generator().manual_seed(3)
    state = fresh_state(4, 3, [1.0, 1.3, 1.5, 1.7], g, per_depth=False)
    args = dict(n=torch.ones(4, dtype=torch.int64), drafted=torch.full((4,), 3),
                ran=torch.ones(4, dtype=torch.bool), limit=torch.full((4,), 9),
                count=torch.ones(4, dtype=torch.int64), active=torch.ones(4, dtype=torch.bool),
                status=torch.zeros((8, 2), dtype=torch.int64), r=torch.zeros(1, dtype=torch.int64),
                smoothing=0.5, depth_smoothing=DEPTH_SMOOTHING, z=OFF_CONFIDENCE, off_after=8)
    base = {k: state[k] for k in ("accepted_avg", "rejected_avg", "accepted_total",
                                  "rejected_total", "first_judged", "rounds", "off", "chosen",
                                  "workload", "round_cost")}
    base["draining"] = torch.tensor(False)
    with pytest.raises(ValueError, match="accepted_avg"):
        module.launch(**{**base, "accepted_avg": state["accepted_avg"].double()}, **args)
    with pytest.raises(ValueError, match="per-depth"):
        module.launch(**base, **args, depth_rates=torch.ones(4, 3))
    with pytest.raises(ValueError, match="smoothing"):
        module.launch(**base, **{**args, "smoothing": 0.0})
    with pytest.raises(ValueError, match="off"):
        module.launch(**{**base, "off": torch.zeros(2, dtype=torch.bool)}, **args)
