"""A Program's kernels.fast_path decides how load_pair builds torch-backend models on the fast
path (SPECPILOT_FAST_OPS, where set, overrides it), a pair built another way is refused rather
than timed as the wrong decoder, and the search loads a Program of its own fast path its own
pair. (The fast path itself is checked against the reference ops on the GPU.)"""
import pytest

from specpilot.deploy import build_deployment
from specpilot.ir import SetFastPath, apply, stock_program
from specpilot.runtime.decoder import UnsupportedProgram, check_pair_runs, load_pair
from specpilot.runtime.fast_ops import LAYERS, OPS

from hf_factory import make_checkpoint


@pytest.fixture
def programs(tmp_path):
    folder = make_checkpoint(tmp_path, "llama3", seed=29)
    stock = stock_program(build_deployment(folder, folder, gpu="NVIDIA H200", dtype="float32"))
    return folder, stock, apply(stock, SetFastPath("layers"))


@pytest.mark.parametrize("env,want_stock,want_layers", [
    (None, OPS, LAYERS),            # each Program as it says
    ("ops", OPS, OPS),              # the variable overrides Programs ...
    ("layers", LAYERS, LAYERS),     # ... either way
])
def test_load_pair_builds_the_programs_fast_path(programs, monkeypatch, env, want_stock,
                                                 want_layers):
    folder, stock, layers = programs
    if env is None:
        monkeypatch.delenv("SPECPILOT_FAST_OPS", raising=False)
    else:
        monkeypatch.setenv("SPECPILOT_FAST_OPS", env)
    for program, want in ((stock, want_stock), (layers, want_layers)):
        # fast_path=True: the CUDA fast path's models, built on the CPU
        pair = load_pair(folder, folder, "float32", "cpu", program=program, fast_path=True)
        assert {pair.target.backend.fast_ops_mode, pair.drafter.backend.fast_ops_mode} == {want}
        check_pair_runs(program, pair)


def test_a_pair_built_for_another_fast_path_is_refused(programs, monkeypatch):
    monkeypatch.delenv("SPECPILOT_FAST_OPS", raising=False)
    folder, stock, layers = programs
    per_op = load_pair(folder, folder, "float32", "cpu", program=stock, fast_path=True)
    with pytest.raises(UnsupportedProgram, match="'ops' fast path but the Program runs "
                                                 "kernels.fast_path 'layers'"):
        check_pair_runs(layers, per_op)
    # off the fast path (the CPU default) both run the reference ops: nothing to refuse
    plain = load_pair(folder, folder, "float32", "cpu")
    check_pair_runs(layers, plain)


def test_the_search_loads_a_pair_of_its_own_for_the_whole_layer_path(programs):
    from specpilot.runtime.decoder import needs_own_pair
    from specpilot.search.evaluate import _build_key

    _, stock, layers = programs
    assert not needs_own_pair(stock) and needs_own_pair(layers)
    assert _build_key(stock) != _build_key(layers)


def test_the_cost_report_says_it_does_not_model_the_whole_layer_path(programs):
    from specpilot.cost import AssumedAcceptance, CostModel, gpu_spec

    _, stock, layers = programs
    model = CostModel(gpu_spec("h200"))
    note = "the torch backend's layers fast path is not modelled"
    assert any(note in n for n in model.report(layers, AssumedAcceptance(0.6)).notes)
    assert not any(note in n for n in model.report(stock, AssumedAcceptance(0.6)).notes)


def test_the_bench_builds_a_program_its_own_models_where_it_needs_them(programs, tmp_path):
    from specpilot.bench.pair_bench import PairBenchSettings, program_systems
    from specpilot.ir import save_program

    folder, stock, layers = programs
    pair = load_pair(folder, folder, "float32", "cpu")
    paths = []
    for name, program in (("plain", stock), ("layers", layers)):
        paths.append(str(tmp_path / f"{name}.json"))
        save_program(program, paths[-1])
    settings = PairBenchSettings(pair=str(tmp_path), programs=paths)
    systems = {s.name: s for s in program_systems(settings, folder, folder, "float32",
                                                  "NVIDIA H200", pair, benched=[])}
    assert systems["program:plain"].pair is pair                   # built like the stock pair
    assert systems["program:layers"].pair is not pair              # its own models
    assert systems["program:layers"].refusal is None
