"""stock_program: the documented starting point, built from the Deployment alone."""
import pytest

from specpilot.ir import (BatchSpec, Chain, CommitSpec, DraftSpec, IllFormed, KernelsSpec,
                          VerifySpec, linear_names, stock_program)


def test_stock_program_attributes(make_deployment):
    d = make_deployment(gpu="NVIDIA H200", num_layers=3)
    p = stock_program(d)
    assert p.gpu == "NVIDIA H200" and p.schema_version == 1 and p.history == ()
    assert p.draft == DraftSpec(drafter="model", topology=Chain(4))
    assert p.verify == VerifySpec(mask="causal", acceptance="greedy")
    assert p.commit == CommitSpec(kv="in_place")
    assert p.batch == BatchSpec(layout="padded", max_batch_size=1, draft_length_policy="fixed")
    assert p.kernels == KernelsSpec(backend="torch", capture_graphs=False, overrides=())
    assert p.models.target == d.target and p.models.drafter == d.drafter
    assert [n for n, _ in p.models.target.weight_formats] == sorted(linear_names(3))
    assert len(p.models.target.weight_formats) == 3 * 7 + 1


def test_stock_resets_formats_to_the_dense_dtype(make_deployment, make_model):
    target = make_model("target", dtype="float32")
    packed = target.with_formats({"lm_head": "lossless12"})
    p = stock_program(make_deployment(target=packed, drafter=make_model("drafter",
                                                                       dtype="float32")))
    assert set(p.models.target.formats().values()) == {"fp32"}
    assert set(p.models.drafter.formats().values()) == {"fp32"}


def test_stock_of_an_ill_formed_deployment_is_refused(make_deployment, make_model):
    with pytest.raises(IllFormed, match=r"models.drafter.vocab_size: drafter vocabulary \(32\)"):
        stock_program(make_deployment(drafter=make_model("drafter", vocab_size=32)))
    with pytest.raises(IllFormed, match="deployment.target.dtype"):
        stock_program(make_deployment(target=make_model("target").__class__(
            **{**make_model("target").__dict__, "dtype": "float16"})))
