"""The captured one-row prefill (runtime/row_prefill.py) on its own stream: while the batch's
stream is still busy writing the row (a long sleep, then a stand-in for the round's write),
the prefill's result lands in the row after that write, and its logits and K/V are the eager
prefill's; newcomers one after another alternate the scratch sets without mixing them. Also
checks its graphs are captured on its own high-priority stream. Skipped without CUDA."""
import pytest
import torch

from hf_factory import FUSABLE, make_checkpoint, random_prompts
from specpilot.runtime.model import Transformer
from specpilot.runtime.row_prefill import RowPrefill
from specpilot.runtime.steps import append_step

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CAPACITY = 160


def _eager(model, prompt):
    """(logits at the prompt's last token, its cache) of an eager prefill into a fresh cache."""
    cache = model.new_cache(1, CAPACITY)
    logits = append_step(model, cache, torch.zeros(1, dtype=torch.int64, device="cuda"),
                         [list(prompt)])
    return logits, cache


def _pair_with_running_caches(tmp_path, seeds, rows=3):
    """(target, drafter, their batch caches of `rows` rows holding random K/V, as running
    requests leave them): float32 models on the GPU from checkpoints of these two seeds."""
    target = Transformer.from_checkpoint(make_checkpoint(tmp_path / "t", "llama3", seed=seeds[0]),
                                         "float32", "cuda")
    drafter = Transformer.from_checkpoint(make_checkpoint(tmp_path / "d", "llama3", seed=seeds[1]),
                                          "float32", "cuda")
    caches = [target.new_cache(rows, CAPACITY), drafter.new_cache(rows, CAPACITY)]
    for c in caches:
        for t in c.k + c.v:
            t.normal_()
    return target, drafter, caches


def test_captured_row_prefill_waits_for_the_batch_stream_and_gives_the_eager_prefill(tmp_path):
    target, drafter, caches = _pair_with_running_caches(tmp_path, (41, 42))
    prefill = RowPrefill([(target, caches[0]), (drafter, caches[1])], CAPACITY, capture=True,
                         placement="beside")
    assert prefill.stream is not None and prefill.stream.priority < 0
    prompts = random_prompts((9, 70, 30, 5), seed=43)
    prefill.prepare([len(p) for p in prompts])
    rows = (1, 2, 1, 0)
    got = []
    for row, prompt in zip(rows, prompts):
        # The batch's stream is busy for a while, then writes the row (as a round does).
        torch.cuda._sleep(20_000_000)
        for c in caches:
            for t in c.k + c.v:
                t[row].fill_(7.0)
        got.append(prefill.run(row, prompt))
        if len(got) == 1:     # row 1 as the first newcomer left it, before the third takes it
            snapshot = [t[1].clone() for t in caches[0].k]
    torch.cuda.synchronize()
    last_newcomer = {row: i for i, row in enumerate(rows)}
    for i, (row, prompt) in enumerate(zip(rows, prompts)):
        n = len(prompt)
        torch.testing.assert_close(got[i], _eager(target, prompt)[0], rtol=1e-4, atol=1e-4)
        if last_newcomer[row] != i:
            continue
        for model, cache in ((target, caches[0]), (drafter, caches[1])):
            eager = _eager(model, prompt)[1]
            for mine, theirs in zip(cache.k + cache.v, eager.k + eager.v):
                torch.testing.assert_close(mine[row, :n], theirs[0, :n], rtol=1e-4, atol=1e-4)
            assert torch.equal(cache.positions[row, :n].cpu(), torch.arange(n))
    _, first = _eager(target, prompts[0])
    n = len(prompts[0])
    for mine, theirs in zip(snapshot, first.k):
        torch.testing.assert_close(mine[:n], theirs[0, :n], rtol=1e-4, atol=1e-4)


def test_the_copy_waits_for_a_slow_prefill_on_its_own_stream(tmp_path, monkeypatch):
    """The other way round: the prefill's stream is the slow one, so the copy into the row must
    wait for it; and its graphs are captured on that stream."""
    import specpilot.runtime.graphed_prefill as graphed_prefill
    streams = []
    real_capture = graphed_prefill.capture_graph

    def spy(body, device, pool=None, stream=None):
        streams.append(stream)
        return real_capture(body, device, pool, stream)

    monkeypatch.setattr(graphed_prefill, "capture_graph", spy)
    target = Transformer.from_checkpoint(make_checkpoint(tmp_path, "llama3", seed=44),
                                         "float32", "cuda")
    cache = target.new_cache(2, CAPACITY)
    for t in cache.k + cache.v:
        t.normal_()
    prefill = RowPrefill([(target, cache)], CAPACITY, capture=True, placement="beside")
    prompt = random_prompts((40,), seed=45)[0]
    prefill.prepare([len(prompt)])
    assert streams and all(s is prefill.stream for s in streams)
    with torch.cuda.stream(prefill.stream):
        torch.cuda._sleep(50_000_000)           # the prefill queued after this starts late
    logits = prefill.run(1, prompt)
    rows = [t[1].clone() for t in cache.k + cache.v]    # on the batch's stream, after the copy
    torch.cuda.synchronize()
    want_logits, eager = _eager(target, prompt)
    torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-4)
    n = len(prompt)
    for mine, theirs in zip(rows, eager.k + eager.v):
        torch.testing.assert_close(mine[:n], theirs[0, :n], rtol=1e-4, atol=1e-4)


def test_newcomers_staged_ahead_land_in_their_rows_after_the_batch_stream_writes_them(tmp_path):
    """Placed ahead, newcomers are prefilled into staging on the prefill's stream before their
    rows are free; each admission's copy from staging waits for the batch's stream (busy, then
    writing the row as a round does), and a slot freed by one admission takes the next newcomer
    without overwriting what its row has not yet read. Rows and logits are the eager prefill's."""
    target, drafter, caches = _pair_with_running_caches(tmp_path, (46, 47))
    prefill = RowPrefill([(target, caches[0]), (drafter, caches[1])], CAPACITY, capture=True,
                         placement="ahead", depth=2)
    prompts = random_prompts((12, 75, 33, 8), seed=48)
    prefill.prepare([len(p) for p in prompts])
    queue = list(prompts)
    assert prefill.prefetch(queue) == 2
    rows = (2, 0, 1, 2)
    got, kept = [], []
    for i, (row, prompt) in enumerate(zip(rows, prompts)):
        torch.cuda._sleep(20_000_000)
        for c in caches:
            for t in c.k + c.v:
                t[row].fill_(7.0)
        got.append(prefill.run(row, prompt))
        kept.append([t[row].clone() for c in caches for t in c.k + c.v])
        prefill.prefetch(queue[i + 1:])               # the freed slot takes the next one
    torch.cuda.synchronize()
    for prompt, logits, rows_now in zip(prompts, got, kept):
        n = len(prompt)
        torch.testing.assert_close(logits, _eager(target, prompt)[0], rtol=1e-4, atol=1e-4)
        eager = _eager(target, prompt)[1], _eager(drafter, prompt)[1]
        want = [t[0, :n] for c in eager for t in c.k + c.v]
        for mine, theirs in zip(rows_now, want):
            torch.testing.assert_close(mine[:n], theirs, rtol=1e-4, atol=1e-4)


def test_a_fused_drafter_prefills_beside_the_rounds_with_workspaces_of_its_own(tmp_path):
    """On its own stream the prefill runs while the rounds run the same drafter: a fused drafter
    (whose split attention merges through a workspace that serves one call at a time) prefills
    through a twin with workspaces of its own, its weights shared, and the row it fills holds
    what the model's own eager prefill writes."""
    from specpilot.runtime.fused_forward import FusedForward

    target = Transformer.from_checkpoint(make_checkpoint(tmp_path / "t", "llama3", seed=49),
                                         "float32", "cuda")
    model = Transformer.from_checkpoint(make_checkpoint(tmp_path / "d", "llama3", seed=50,
                                                        **FUSABLE), "float32", "cuda")
    drafter = FusedForward(model)
    caches = [target.new_cache(2, CAPACITY), drafter.new_cache(2, CAPACITY)]
    for placement in ("beside", "ahead"):
        prefill = RowPrefill([(target, caches[0]), (drafter, caches[1])], CAPACITY,
                             capture=True, placement=placement)
        twin = prefill._prefills[0].models[1][0]
        assert twin is not drafter and twin.model is model
        assert all(p.models[1][0] is twin for p in prefill._prefills)
        if drafter._attention_workspace is not None:
            assert twin._attention_workspace is not drafter._attention_workspace
        assert twin._argmax_workspace is not drafter._argmax_workspace
        prompt = random_prompts((21,), seed=51)[0]
        prefill.prepare([len(prompt)])
        prefill.prefetch([prompt])
        prefill.run(1, prompt)
        torch.cuda.synchronize()
        eager = _eager(model, prompt)[1]
        n = len(prompt)
        for mine, theirs in zip(caches[1].k + caches[1].v, eager.k + eager.v):
            torch.testing.assert_close(mine[1, :n], theirs[0, :n], rtol=1e-4, atol=1e-4)
