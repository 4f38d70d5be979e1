"""Properties over random transformation sequences: whatever agents propose, every accepted
result verifies, round-trips byte for byte, replays from its history, and its id and diff agree."""
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specpilot.ir import (CaptureGraphs, Chain, SetAttentionKernels, SetBackend, SetBatchLayout,
                          SetDrafterKernels, SetDraftLength, SetMaxBatchSize, SetTopology,
                          SetWeightFormat, TransformRefused, Tree, apply, check, diff,
                          program_from_json, program_id, program_to_json, record_escape_rates,
                          replay, stock_program, verify)
from specpilot.ir.program import Deployment

SCOPES = ["target.*", "target.mlp.*", "target.self_attn.*", "target.lm_head", "drafter.*",
          "drafter.layers.0.mlp.*", "target.layers.1.*", "target.nothing"]

records = st.one_of(
    st.builds(SetTopology, st.one_of(
        st.builds(Chain, st.integers(1, 8)),
        st.builds(Tree, st.lists(st.integers(1, 3), min_size=1, max_size=4).map(tuple)))),
    st.builds(SetDraftLength, st.integers(0, 70)),
    st.builds(SetWeightFormat, st.sampled_from(SCOPES),
              st.sampled_from(["bf16", "fp32", "lossless12", "int4"])),
    st.builds(SetBatchLayout, st.sampled_from(["padded", "ragged", "packed"])),
    st.builds(SetMaxBatchSize, st.integers(0, 300)),
    st.builds(SetBackend, st.sampled_from(["torch", "generated", "cuda"])),
    st.builds(CaptureGraphs, st.booleans()),
    st.builds(SetDrafterKernels, st.sampled_from(["model", "fused", "triton"])),
    st.builds(SetAttentionKernels, st.sampled_from(["model", "generated", "flash"])),
)


def _start(make_model, ppm):
    d = Deployment(make_model("target"), make_model("drafter", num_layers=1), "cpu", "humaneval")
    p = stock_program(d)
    for role in ("target", "drafter"):
        p = record_escape_rates(p, role, {n: ppm for n in getattr(p.models, role).linears})
    return p


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(records, max_size=8), ppm=st.integers(0, 30_000))
def test_random_sequences(make_model, steps, ppm):
    start = _start(make_model, ppm)
    p = start
    for t in steps:
        reason = check(p, t)
        try:
            new = apply(p, t)
        except TransformRefused as refusal:
            assert refusal.reason == reason
            continue
        assert reason is None
        assert new.history[-1] == t and verify(new) is new
        p = new
    text = program_to_json(p)
    assert program_to_json(program_from_json(text)) == text
    assert replay(start, p.history) == p
    without_history = replace(p, history=start.history)
    assert (program_id(p) == program_id(start)) == (diff(start, without_history) == [])
