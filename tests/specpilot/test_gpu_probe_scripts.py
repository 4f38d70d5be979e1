"""The GPU-only kernel probes (bench/stage_ablation.py, bench/fused_tile_sweep.py,
bench/grid_sync_probe.py) on the CPU: each ablation's edit still finds its text in the current
templates and the edited kernel still renders; the tile sweep's variants are legal specs that
include the default tiles; the scripts that capture graphs refuse a machine without a GPU with
why."""
import tempfile
from pathlib import Path

import pytest
import torch

from bench_script import load_bench_script
from specpilot.codegen.fused_layer import fused_layer_specs
from specpilot.codegen.render import render_kernel


def test_every_ablation_applies_to_the_templates_and_renders():
    script = load_bench_script("stage_ablation")
    specs = fused_layer_specs("bf16", 384, 6, 64, 1024, 8192)
    with tempfile.TemporaryDirectory() as tmp:
        for (kernel, ablation), edits in script.ABLATIONS.items():
            if edits is None:
                continue
            folder = script.ablated_templates(Path(tmp), f"{kernel}-{ablation}", edits)
            ablated = render_kernel(specs[kernel], folder)
            assert ablated != render_kernel(specs[kernel])
            for _, new in edits[1]:
                assert new in ablated


def test_the_tile_sweep_tries_the_default_tiles_among_legal_others():
    script = load_bench_script("fused_tile_sweep")
    specs = fused_layer_specs("bf16", 384, 6, 64, 1024, 8192)
    for name, k in (("qkv", 384), ("o_proj", 384), ("mlp", 384), ("down", 1024), ("head", 384)):
        variants = script.variants(name, specs[name], k)
        assert specs[name] in variants and len(set(variants)) == len(variants) > 10
        # reduction steps up to the first that covers k, never past it
        assert max(v.get("BLOCK_K") for v in variants) < 2 * k


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal off a GPU")
@pytest.mark.parametrize("name", ["stage_ablation", "fused_tile_sweep", "grid_sync_probe"])
def test_the_graph_capturing_probes_refuse_a_machine_without_a_gpu(name, tmp_path, capsys):
    script = load_bench_script(name)
    with pytest.raises(SystemExit):
        script.main(["--out", str(tmp_path / "out.json")])
    assert "needs a GPU" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
