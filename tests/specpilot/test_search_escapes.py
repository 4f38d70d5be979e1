"""Escape rates measured from a checkpoint agree with the numpy reference of lossless12, and
make SetWeightFormat(lossless12) decidable."""
import json
import math

import numpy as np
import torch

from specpilot.codegen.formats.lossless12_numpy import pack_numpy
from specpilot.deploy import build_deployment
from specpilot.ir import SetWeightFormat, check, stock_program
from specpilot.ir.formats import PPM
from specpilot.runtime.checkpoint import load_state_dict
from specpilot.search.escapes import checkpoint_key, measure_escape_rates, with_measured_escapes
from hf_factory import make_checkpoint


def test_escape_rates_match_the_numpy_reference(tmp_path):
    folder = make_checkpoint(tmp_path, "llama3", tie_word_embeddings=True, seed=3)
    program = stock_program(build_deployment(folder, folder, gpu="h200", dtype="bfloat16"))
    spec = program.models.target
    rates = measure_escape_rates(spec, folder)
    tensors = load_state_dict(folder)
    assert set(rates) == set(spec.linears)
    for linear, ppm in rates.items():
        w = tensors[checkpoint_key(linear, tied=True)].to(torch.bfloat16)
        bits = w.contiguous().view(torch.int16).numpy().view(np.uint16)
        escapes = pack_numpy(bits, group_size=bits.shape[1]).col.size   # one base per row
        assert ppm == math.floor(escapes / bits.size * PPM), linear


def test_measured_rates_are_cached_and_unlock_lossless12(tmp_path):
    folder = make_checkpoint(tmp_path, "llama3", seed=4)
    stock = stock_program(build_deployment(folder, folder, gpu="h200", dtype="bfloat16"))
    assert "not measured" in check(stock, SetWeightFormat("target.mlp.*", "lossless12"))
    cache = tmp_path / "escapes.json"
    measured = with_measured_escapes(stock, folder, folder, str(cache))
    reason = check(measured, SetWeightFormat("target.mlp.*", "lossless12"))
    assert reason is None or "ppm" in reason          # decidable now: applies, or too many
    saved = json.loads(cache.read_text())
    assert saved["target"] == dict(measured.models.target.lossless12_escape_ppm)
    saved["target"] = {name: 7 for name in saved["target"]}   # the cache is what is read back
    cache.write_text(json.dumps(saved))
    again = with_measured_escapes(stock, folder, folder, str(cache))
    assert set(dict(again.models.target.lossless12_escape_ppm).values()) == {7}
