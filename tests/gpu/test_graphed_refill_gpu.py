"""Continuous refill on the graphed runtime with its rounds captured as CUDA graphs: the same
output and acceptance as the rounds run eagerly (float32), and forcing clean, for plain steps,
a chain and static and dynamic trees with more requests than slots; and a call with no queue
started off by the workload memory as the eager rounds start it. Skipped without CUDA."""
import pytest
import torch

from hf_factory import make_checkpoint, random_prompts
from mechanism_setup import ContraryDrafter
from refill_setup import ReplayLog
from specpilot.ir.topology import DynamicTree, Tree
from specpilot.runtime.ar import generate_ar
from specpilot.runtime.forcing import compare_to_reference, default_tolerance
from specpilot.runtime.graphed_refill import GraphedRefillDecoder
from specpilot.runtime.model import Transformer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("mode", ["ops", "layers"])
def test_captured_refill_equals_eager_refill_and_passes_forcing(tmp_path, k, mode, monkeypatch):
    monkeypatch.setenv("SPECPILOT_FAST_OPS", mode)
    folder = make_checkpoint(tmp_path, "llama3", seed=91)
    target = Transformer.from_checkpoint(folder, "float32", "cuda")
    drafter = Transformer.from_checkpoint(folder, "float32", "cuda") if k else None
    prompts = random_prompts((4, 11, 1, 7, 9, 2, 5), seed=92)
    limits_cut = generate_ar(target, prompts, 20)
    eos = (limits_cut.tokens[1][6],)          # a token some requests stop at, others not
    reference = generate_ar(target, prompts, 20, eos_ids=eos)
    eager = GraphedRefillDecoder(target, drafter, 3, 64, k, eos, capture=False)
    want = eager.generate(prompts, 20)
    graphed = GraphedRefillDecoder(target, drafter, 3, 64, k, eos, capture=True)
    for _ in range(2):                        # a decoder serves many calls
        got = graphed.generate(prompts, 20)
        assert got.tokens == want.tokens
        assert got.accepted_lengths == want.accepted_lengths
        assert got.stats["refills"] == len(prompts) - 3
    report = compare_to_reference(graphed.force(prompts, reference.tokens), reference,
                                  default_tolerance(torch.float32))
    assert report.passed, report.format()


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("lag,topup", [(2, "admitted"), (1, "queued")])
def test_captured_refill_read_back_lag_and_top_up_equal_eager(tmp_path, adaptive, lag, topup):
    """On the GPU, readback_lag=2: the host waits on the ring's events two replays back while
    two are queued; and topup="queued": the newcomers held ahead are topped up once the next
    replay is queued (their prefill on its stream beside that replay). The output and
    acceptance are the eager loop's with the same settings, and forcing is clean."""
    folder = make_checkpoint(tmp_path, "llama3", seed=93)
    target = Transformer.from_checkpoint(folder, "float32", "cuda")
    drafter = Transformer.from_checkpoint(folder, "float32", "cuda")
    prompts = random_prompts((4, 11, 1, 7, 9, 2, 5), seed=94)
    eos = (generate_ar(target, prompts, 20).tokens[1][6],)
    reference = generate_ar(target, prompts, 20, eos_ids=eos)

    def build(capture):
        return GraphedRefillDecoder(target, drafter, 3, 64, 3, eos, capture=capture,
                                    adaptive=adaptive, readback_lag=lag, topup=topup)

    want = build(False).generate(prompts, 20)
    graphed = build(True)
    for _ in range(2):
        got = graphed.generate(prompts, 20)
        assert got.tokens == want.tokens
        assert got.accepted_lengths == want.accepted_lengths
    report = compare_to_reference(graphed.force(prompts, reference.tokens), reference,
                                  default_tolerance(torch.float32))
    assert report.passed, report.format()


def _limited_requests(tmp_path, seed, drafter_seed):
    """(target, drafter (the target itself where the seeds agree), seven prompts, per-request
    limits that end them apart, greedy AR of 20 tokens) on the GPU in float32."""
    folder = make_checkpoint(tmp_path, "llama3", seed=seed)
    target = Transformer.from_checkpoint(folder, "float32", "cuda")
    other = make_checkpoint(tmp_path / "drafter", "llama3", seed=drafter_seed)
    drafter = Transformer.from_checkpoint(other, "float32", "cuda")
    prompts = random_prompts((4, 11, 1, 7, 9, 2, 5), seed=seed + 1)
    limits = [3 + (5 * i) % 18 for i in range(len(prompts))]
    return target, drafter, prompts, limits, generate_ar(target, prompts, 20)


def _captured_equals_eager(build, prompts, limits, reference):
    """`build(capture)` run eagerly gives greedy AR cut at each limit; captured, over two calls,
    the same tokens, acceptance and rounds. Returns the captured decoder."""
    want = build(False).generate(prompts, limits)
    assert want.tokens == [t[:m] for t, m in zip(reference.tokens, limits)]
    graphed = build(True)
    for _ in range(2):                        # a decoder serves many calls
        got = graphed.generate(prompts, limits)
        assert got.tokens == want.tokens
        assert got.accepted_lengths == want.accepted_lengths
        assert got.stats == want.stats
    return graphed


@pytest.mark.parametrize("per", [1, 4])                 # the default; several rounds a replay
@pytest.mark.parametrize("mode", ["ops", "layers"])
@pytest.mark.parametrize("drafter_seed", [93, 95])      # the target itself; a useless drafter
@pytest.mark.parametrize("estimator", ["geometric", "per_depth"])
def test_captured_adaptive_refill_equals_eager_adaptive_refill(tmp_path, mode, drafter_seed, per,
                                                               estimator, monkeypatch):
    # Captured, the length rule's round is compiled (Triton on the GPU); eager, it runs as
    # tensor operations: the per-depth state's update must choose as the eager one does.
    monkeypatch.setenv("SPECPILOT_FAST_OPS", mode)
    target, drafter, prompts, limits, reference = _limited_requests(tmp_path, 93, drafter_seed)
    # One set of round costs and one replay size for both, so that both choose the same
    # lengths at the same rounds.
    options = dict(adaptive=True, round_costs=[1.0, 1.3, 1.6, 1.9], rounds_per_replay=per,
                   length_estimator=estimator)
    _captured_equals_eager(
        lambda capture: GraphedRefillDecoder(target, drafter, 3, 64, 3, capture=capture,
                                             **options), prompts, limits, reference)


def test_captured_refill_with_no_queue_starts_off_as_the_eager_rounds_do(tmp_path, monkeypatch):
    # A call with no more prompts than slots is one padded batch: after two calls the workload
    # memory starts the third off (the target-only prefill graph, plain steps, no drafter run),
    # and finished rows are read in place; the captured rounds must match the eager ones.
    monkeypatch.setenv("SPECPILOT_FAST_OPS", "ops")
    folder = make_checkpoint(tmp_path, "llama3", seed=96)
    target = Transformer.from_checkpoint(folder, "float32", "cuda")
    drafter = ContraryDrafter(target)                 # never drafts the target's next token
    prompts = random_prompts((4, 11, 1, 7), seed=97)
    reference = generate_ar(target, prompts, 24)
    options = dict(adaptive=True, round_costs=[1.0, 1.3, 1.6, 1.9, 2.2], rounds_per_replay=4)
    eager = GraphedRefillDecoder(target, drafter, 4, 64, 4, capture=False, **options)
    graphed = GraphedRefillDecoder(target, drafter, 4, 64, 4, capture=True, **options)
    drafter_forwards = []
    for _ in range(3):
        want, got = eager.generate(prompts, 24), graphed.generate(prompts, 24)
        assert got.tokens == want.tokens == reference.tokens
        assert got.accepted_lengths == want.accepted_lengths
        assert got.stats == want.stats and got.drafter_forwards == want.drafter_forwards
        drafter_forwards.append(got.drafter_forwards)
    assert drafter_forwards[0] > 0 and drafter_forwards[1] > 0     # learned from, not off
    assert got.stats == {"rounds_chain_0": got.target_forwards - 1, "refills": 0}
    assert got.drafter_forwards == 0


@pytest.mark.parametrize("per", [1, 4])                 # the default; several rounds a replay
@pytest.mark.parametrize("tree", [Tree((2, 2)), DynamicTree(budget=6, depth=3, width=2)], ids=str)
@pytest.mark.parametrize("drafter_seed", [98, 99])      # the target itself; another model
def test_captured_tree_refill_equals_eager_tree_refill_and_passes_forcing(tmp_path, tree,
                                                                          drafter_seed, per):
    from specpilot.runtime.graphed_program import graphed_decoder

    target, drafter, prompts, limits, reference = _limited_requests(tmp_path, 98, drafter_seed)
    # One replay size for both: the rounds counted per length are whole replays.
    graphed = _captured_equals_eager(
        lambda capture: graphed_decoder(target, drafter, 3, 64, tree, capture=capture,
                                        refill=True, rounds_per_replay=per),
        prompts, limits, reference)
    report = compare_to_reference(graphed.force(prompts, reference.tokens), reference,
                                  default_tolerance(torch.float32))
    assert report.passed, report.format()


def test_captured_drain_runs_plain_blocks_and_the_rounds_single_rounds_run(tmp_path):
    # Plain AR with refill and no queue, no EOS: the captured decoder replays blocks of four
    # rounds while the longest request needs them, and runs exactly max(limit) rounds (the
    # limit - 1 the longest needs after its prefill, and the one queued while the host sees it
    # finish), as one round a replay would.
    from specpilot.runtime.graphed_refill import DRAIN_PLAIN_ROUNDS

    folder = make_checkpoint(tmp_path, "llama3", seed=95)
    target = Transformer.from_checkpoint(folder, "float32", "cuda")
    prompts = random_prompts((6, 3, 9), seed=96)
    limits = [20, 9, 14]
    reference = generate_ar(target, prompts, 20)
    decoder = ReplayLog(target, None, 3, 64, 0, capture=True)
    for _ in range(2):                        # a decoder serves many calls
        decoder.log = []
        r = decoder.generate(prompts, limits)
        assert r.tokens == [t[:n] for t, n in zip(reference.tokens, limits)]
        assert r.stats["rounds_chain_0"] == max(limits) == sum(decoder.log)
        assert DRAIN_PLAIN_ROUNDS in decoder.log and decoder.log[-1] == 1


@pytest.mark.parametrize("adaptive", [False, True])
def test_an_admission_does_not_wait_for_the_work_queued_before_it(tmp_path, adaptive):
    """The refill admits a newcomer while the replays queued before it still run: with a long
    kernel queued ahead, the admission returns before it ends (an event recorded after that
    kernel is still pending), and the row is then what an admission on an idle GPU leaves."""
    folder = make_checkpoint(tmp_path, "llama3", seed=95)
    target = Transformer.from_checkpoint(folder, "float32", "cuda")
    drafter = Transformer.from_checkpoint(folder, "float32", "cuda")
    prompts = random_prompts((6, 9, 4), seed=96)
    costs = [1.0, 1.2, 1.4, 1.6] if adaptive else None

    def admitted(busy: bool):
        dec = GraphedRefillDecoder(target, drafter, 2, 64, 3, capture=True, adaptive=adaptive,
                                   round_costs=costs)
        dec.generate(prompts[:2], 8)               # the graphs captured, both rows used
        dec.prepare_prefill(prompts)
        dec._admit(0, prompts[1], 8)               # the row prefill's graphs captured
        torch.cuda.synchronize()
        pending = False
        if busy:
            torch.cuda._sleep(2_000_000_000)       # about a second of one busy kernel
            ahead = torch.cuda.Event()
            ahead.record()
        dec._admit(1, prompts[2], 8)
        if busy:
            pending = not ahead.query()
        torch.cuda.synchronize()
        state = {name: getattr(dec, name)[1].clone() for name in
                 ("out", "count", "limit", "length", "prev", "last", "active", "row_round")}
        return pending, state, dec.accepted[:, 1].clone()

    pending, state, log = admitted(busy=True)
    assert pending, "the admission waited for the kernel queued before it"
    _, want, want_log = admitted(busy=False)
    for name, value in want.items():
        assert torch.equal(state[name], value), name
    assert torch.equal(log, want_log) and (log == -1).all()
    assert state["length"].item() == len(prompts[2]) and state["count"].item() == 1
