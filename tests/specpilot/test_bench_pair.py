"""`specpilot bench --pair` end to end on CPU on a tiny pair whose drafter is a copy of the target
(so every draft is accepted and the acceptance numbers can be worked out by hand), and the
profile it writes driving `specpilot bench --shapes`."""
import json
import shutil
import statistics

import pytest
import torch

from hf_factory import hf_greedy, load_hf, make_checkpoint
from specpilot.bench import pair_bench
from specpilot.bench.replay import REPLAYED, AcceptanceProfile, replay
from specpilot.bench.report_md import update_section
from specpilot.bench.step_costs import StepCosts
from specpilot.cli_bench import main
from specpilot.deploy import build_deployment
from specpilot.ir import Chain, SetTopology, Tree, apply, save_program, stock_program

PROMPTS = ([3, 14, 15, 92, 65], [35, 89, 79])
NEW = 8
OURS = ("ar_torch", "stock", "program:tree")


def _words(ids):
    return " ".join(f"w{i}" for i in ids)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target = make_checkpoint(root / "pair", "llama3", name="target", seed=51, hidden_size=64,
                             intermediate_size=128)
    shutil.copytree(target, root / "pair" / "drafter")
    (root / "prompts.txt").write_text("\n".join(_words(p) for p in PROMPTS) + "\n")
    tree = apply(stock_program(build_deployment(target, str(root / "pair" / "drafter"),
                                                dtype="float32")), SetTopology(Tree((2, 2))))
    save_program(tree, str(root / "tree.json"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes: extra threads only contend
    try:
        code = main(["--pair", str(root / "pair"), "--workload", str(root / "prompts.txt"),
                     "--prompts", "2", "--max-new-tokens", str(NEW), "--batch-sizes", "2,1",
                     "--repeats", "2", "--warmup", "0", "--program", str(root / "tree.json"),
                     "--out-dir", str(root / "out"), "--name", "tiny", "--device", "cpu"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    doc = json.loads((root / "out" / "tiny.json").read_text())
    return root, doc


def _rows(doc, status="measured"):
    return {(r["system"], r["batch_size"]): r for r in doc["rows"] if r["status"] == status}


def test_every_system_and_batch_size_has_a_row(bench):
    _, doc = bench
    assert doc["settings"]["batch_sizes"] == [1, 2]
    assert set(_rows(doc)) == {(s, b) for s in ("hf_ar", *OURS) for b in (1, 2)} | {("hf_assisted", 1)}
    skipped = _rows(doc, "skipped")
    assert "batch size 1 only" in skipped[("hf_assisted", 2)]["reason"]
    for b in (1, 2):
        assert "CUDA graphs need a CUDA GPU" in skipped[("strong_ar", b)]["reason"]
    env = doc["environment"]
    assert env["gpu"] == "cpu" and env["torch"] == torch.__version__ and "--pair" in env["command"]
    assert env["transformers"] and env["date"]


def test_rates_and_speedups_are_ratios_of_the_measured_medians(bench):
    _, doc = bench
    rows = _rows(doc)
    for (system, b), r in rows.items():
        rates = [r["new_tokens"] / s for s in r["seconds"]["runs"]]
        assert r["tokens_per_s"]["runs"] == pytest.approx(rates)
        assert r["tokens_per_s"]["median"] == pytest.approx(statistics.median(rates))
        assert r["tokens_per_s"]["min"] <= r["tokens_per_s"]["median"] <= r["tokens_per_s"]["max"]
        hf = rows[("hf_ar", b)]["tokens_per_s"]["median"]
        assert r["speedup_vs_hf_ar"] == pytest.approx(r["tokens_per_s"]["median"] / hf)
        assert r["speedup_vs_strong_ar"] is None and r["peak_memory_bytes"] is None
        assert r["requests"] == 2 and r["new_tokens"] == 2 * NEW


def test_our_systems_pass_forcing_and_hf_matches_the_reference(bench):
    root, doc = bench
    assert doc["reference"]["tokens"] == 2 * NEW
    for (system, _), r in _rows(doc).items():
        if system in OURS:
            f = r["forcing"]
            assert f["passed"] and f["violation_count"] == 0
            assert f["positions_compared"] == f["positions_expected"] == 2 * NEW
            assert r["exact_match"]["all_exact"]  # float32 on CPU: the unforced output too
        else:  # float32 on CPU: HF's greedy output is the reference, token for token
            assert r["exact_match"]["all_exact"] and r["exact_match"]["exact_requests"] == 2
    # ...and the reference is HF's own greedy decode (checked independently here).
    hf = load_hf(str(root / "pair" / "target"))
    profile = AcceptanceProfile.load(str(root / "out" / "tiny.acceptance.stock.json"))
    assert profile.new_tokens == [len(hf_greedy(hf, p, NEW)) for p in PROMPTS] == [NEW, NEW]


def test_a_perfect_drafter_gives_the_hand_counted_acceptance(bench):
    root, doc = bench
    rows = _rows(doc)
    # chain(4): the prefill gives token 1, each step 4 drafts + 1 bonus (the second is cut at 8).
    stock = rows[("stock", 1)]
    assert stock["mean_accepted"] == 5.0 and stock["target_forwards"] == 2 * 3
    assert stock["tokens_per_target_forward"] == pytest.approx(16 / 6)
    # tree([2, 2]): depth 2, so 3 tokens per step: 1 + 3 + 3 + (1 of 3).
    tree = rows[("program:tree", 1)]
    assert tree["mean_accepted"] == 3.0 and tree["target_forwards"] == 2 * 4
    assert rows[("program:tree", 2)]["target_forwards"] == 4  # both requests in one batch
    assert rows[("ar_torch", 1)]["target_forwards"] == 2 * NEW
    profile = AcceptanceProfile.load(str(root / "out" / "tiny.acceptance.stock.json"))
    assert str(profile.topology) == "chain(4)" and profile.accepted_lengths == [[4, 4], [4, 4]]
    assert profile.source["batch_size"] == 1 and profile.source["system"] == "stock"
    tree_profile = AcceptanceProfile.load(str(root / "out" / "tiny.acceptance.program-tree.json"))
    assert tree_profile.accepted_lengths == [[2, 2, 2], [2, 2, 2]]
    assert doc["acceptance_profiles"] == {"stock": "tiny.acceptance.stock.json",
                                          "program:tree": "tiny.acceptance.program-tree.json"}


def test_each_batch_size_keeps_its_own_acceptance_profile(bench):
    root, doc = bench
    rows = _rows(doc)
    assert doc["acceptance_profiles_by_batch"] == {
        s: {str(b): f"tiny.acceptance.{s.replace(':', '-')}.b{b}.json" for b in (1, 2)}
        for s in ("stock", "program:tree")}
    for system, files in doc["acceptance_profiles_by_batch"].items():
        for b, name in files.items():
            profile = AcceptanceProfile.load(str(root / "out" / name))
            assert profile.source["batch_size"] == int(b) and profile.source["system"] == system
            # The rounds it lists are the row's own: a padded batch runs a prefill and then
            # as many rounds as its longest request (two batches at batch 1, one at batch 2).
            lengths = [len(a) for a in profile.accepted_lengths]
            forwards = sum(1 + max(lengths[i:i + int(b)]) for i in range(0, len(lengths), int(b)))
            assert forwards == rows[(system, int(b))]["target_forwards"]
            assert sum(profile.new_tokens) == rows[(system, int(b))]["new_tokens"]


def test_the_replayed_profile_is_the_one_with_the_most_requests():
    from specpilot.bench.pair_bench import widest_profile

    def prof(requests):
        return AcceptanceProfile(topology=Chain(4), accepted_lengths=[[1]] * requests,
                                 new_tokens=[2] * requests, source={"n": requests})

    assert widest_profile({1: prof(4), 16: prof(16), 64: prof(64)}).source["n"] == 64
    # Where they tie (every prompt already at the smaller batch), the smaller batch's.
    tie = {4: prof(8), 2: prof(8)}
    assert widest_profile(tie) is tie[2]


def test_markdown_table_and_plot_are_written(bench):
    root, doc = bench
    md = (root / "out" / "tiny.md").read_text()
    lines = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert lines[0].startswith("| system | batch | tokens/s")
    assert len(lines) == 1 + len(doc["rows"])
    for r in doc["rows"]:
        match = [ln for ln in lines if ln.startswith(f"| {r['system']} | {r['batch_size']} |")]
        assert len(match) == 1
        if r["status"] == "measured":
            assert f"{r['tokens_per_s']['median']:.1f}" in match[0]
        else:
            assert r["reason"][:40] in match[0]
    png = (root / "out" / "tiny.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    assert matplotlib.image.imread(str(root / "out" / "tiny.png")).shape[2] in (3, 4)


def test_the_written_profile_drives_the_shapes_bench(bench, capsys):
    root, _ = bench
    profile_path = str(root / "out" / "tiny.acceptance.stock.json")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = main(["--shapes", "llama-3.1-8b:llama-3.2-1b", "--scale", "1/32", "--acceptance",
                     profile_path, "--batch-sizes", "1,2", "--repeats", "1", "--warmup", "0",
                     "--context", "8", "--max-width", "3", "--tree", "2,2",
                     "--out-dir", str(root / "out"),
                     "--name", "replayed", "--device", "cpu"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    doc = json.loads((root / "out" / "replayed.json").read_text())
    assert doc["label"] == REPLAYED and all(r["label"] == REPLAYED for r in doc["rows"])
    assert "replayed acceptance" in (root / "out" / "replayed.md").read_text()
    costs = StepCosts.from_json(doc["step_costs"])
    assert sorted(costs.target_costs[1]) == [1, 2, 3, 5]  # 1..max width, and chain(4) + root
    assert sorted(costs.drafter_costs[2]) == [1, 2, 3, 4, 5]  # catch-up widths up to depth + 1
    assert set(costs.tree_costs) == {"tree([2, 2])"} and set(costs.tree_costs["tree([2, 2])"]) == {1, 2}
    assert set(costs.accept_costs) == {"chain(4)", "tree([2, 2])"}
    profile = AcceptanceProfile.load(profile_path)
    for r in doc["rows"]:
        fig = replay(profile, costs, r["batch_size"])
        want = fig.tokens_per_s if r["system"].startswith("spec") else fig.ar_tokens_per_s
        assert r["tokens_per_s"]["median"] == pytest.approx(want)
    assert (root / "out" / "replayed.png").read_bytes()[:4] == b"\x89PNG"


def test_benchmarks_md_section_is_replaced_not_duplicated(tmp_path):
    path = str(tmp_path / "BENCHMARKS.md")
    update_section(path, "tiny", "## tiny\nfirst\n")
    update_section(path, "other", "## other\nkept\n")
    update_section(path, "tiny", "## tiny\nsecond\n")
    text = open(path).read()
    assert text.count("<!-- bench:tiny -->") == 1 and "second" in text and "first" not in text
    assert "kept" in text and text.startswith("# Benchmarks")


@pytest.mark.parametrize("case", ["no_drafter", "unknown_system", "shapes_without_profile",
                                  "program_dtype", "bad_name", "shapes_interleaved"])
def test_bad_input_is_one_clear_line_and_exit_2(bench, tmp_path, capsys, case):
    root, _ = bench
    pair = str(root / "pair")
    base = ["--pair", pair, "--workload", str(root / "prompts.txt"), "--max-new-tokens", "2",
            "--batch-sizes", "1", "--repeats", "1", "--out-dir", str(tmp_path), "--device", "cpu"]
    if case == "no_drafter":
        shutil.copytree(root / "pair" / "target", tmp_path / "lonely" / "target")
        argv, message = base[:0] + ["--pair", str(tmp_path / "lonely")] + base[2:], "drafter"
    elif case == "unknown_system":
        argv, message = base + ["--systems", "ar_torch,vllm"], "unknown system(s) vllm"
    elif case == "shapes_without_profile":
        argv, message = ["--shapes", "llama-3.1-8b:llama-3.2-1b"], "--acceptance"
    elif case == "shapes_interleaved":
        argv, message = (["--shapes", "llama-3.1-8b:llama-3.2-1b", "--interleave"],
                         "--interleave times the systems of --pair mode")
    elif case == "program_dtype":
        prog = stock_program(build_deployment(pair + "/target", pair + "/drafter", dtype="bfloat16"))
        save_program(prog, str(tmp_path / "bf16.json"))
        argv, message = base + ["--program", str(tmp_path / "bf16.json")], "--dtype bfloat16"
    else:
        argv, message = base + ["--name", "../escape"], "--name"
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("specpilot bench: error:") and message in err[-1]
    assert not list(tmp_path.glob("*.json.tmp"))


def test_a_spent_time_budget_skips_the_rest_and_partial_results_are_kept(bench, monkeypatch):
    """With a budget of zero seconds nothing is measured; every cell is recorded as skipped,
    and a bench that stops part-way leaves the rows it measured in <name>.partial.json."""
    from specpilot.bench.results import PartialResults

    root, _ = bench
    code = main(["--pair", str(root / "pair"), "--workload", str(root / "prompts.txt"),
                 "--prompts", "1", "--max-new-tokens", "4", "--batch-sizes", "1",
                 "--systems", "ar_torch,hf_ar", "--time-budget", "0", "--repeats", "1",
                 "--out-dir", str(root / "budget"), "--name", "budget", "--device", "cpu"])
    assert code == 0
    doc = json.loads((root / "budget" / "budget.json").read_text())
    assert [r["status"] for r in doc["rows"]] == ["skipped", "skipped"]
    assert all("time budget of 0 s spent" in r["reason"] for r in doc["rows"])
    assert not (root / "budget" / "budget.partial.json").exists()

    # Killed after the first measured cell: the partial file holds exactly that row.
    written = []

    def stop_after_first(doc):
        PartialResults(str(root / "killed"), "killed").write(doc)
        written.append(doc)
        raise KeyboardInterrupt

    settings = pair_bench.PairBenchSettings(
        pair=str(root / "pair"), batch_sizes=(1,), max_new_tokens=4, prompts=1,
        workload=str(root / "prompts.txt"), repeats=1, warmup=0, systems=("ar_torch", "hf_ar"),
        device="cpu", name="killed")
    with pytest.raises(KeyboardInterrupt):
        pair_bench.run_pair_bench(settings, lambda m: None, {"gpu": "cpu"}, on_row=stop_after_first)
    partial = json.loads((root / "killed" / "killed.partial.json").read_text())
    assert partial["complete"] is False
    # (On a CPU nothing is graphed: the HF baseline comes before our eager decoder.)
    assert [(r["system"], r["status"]) for r in partial["rows"]] == [("hf_ar", "measured")]


def test_mechanism_systems_are_measured_and_forced_clean(bench):
    root, _ = bench
    code = main(["--pair", str(root / "pair"), "--workload", str(root / "prompts.txt"),
                 "--prompts", "2", "--max-new-tokens", "6", "--batch-sizes", "2",
                 "--systems", "mech:graphed_adaptive,mech:graphed_tree,mech:graphed_dynamic,"
                              "mech:graphed_tree_refill,mech:graphed_two_level,mech:dynamic_tree,"
                              "mech:two_level,mech:ragged,mech:refill,mech:ragged_adaptive_refill,"
                              "mech:graphed_sequoia",
                 "--mechanisms",
                 "--repeats", "1", "--warmup", "0", "--out-dir", str(root / "mech"),
                 "--name", "mech", "--device", "cpu"])
    assert code == 0
    doc = json.loads((root / "mech" / "mech.json").read_text())
    rows = _rows(doc)
    # Off a GPU the graphed mechanisms are skipped with the reason; the eager ones run.
    graphed = {"mech:graphed_adaptive", "mech:graphed_tree", "mech:graphed_dynamic",
               "mech:graphed_tree_refill", "mech:graphed_two_level", "mech:graphed_sequoia"}
    assert {name for name, _ in rows} == {"mech:dynamic_tree", "mech:two_level", "mech:ragged",
                                          "mech:refill", "mech:ragged_adaptive_refill"}
    for (system, _), r in rows.items():
        assert r["forcing"]["passed"] and r["forcing"]["violation_count"] == 0, system
        # The drafter is a copy of the target: every mechanism commits more than a token a step.
        assert r["tokens_per_target_forward"] > 1.0, system
    skipped = _rows(doc, "skipped")
    assert {name for name, _ in skipped} == graphed
    assert all("CUDA graphs need a CUDA GPU" in r["reason"] for r in skipped.values())
    described = {s["name"]: s["description"] for s in doc["systems"]}
    assert "SetBatchLayout" in described["mech:ragged_adaptive_refill"]
    # The workload holds only the benched prompts: the shaped tree says it profiles on them.
    notes = {s["name"]: s["notes"] for s in doc["systems"]}
    assert any("shaped on the prompts it is timed on" in n for n in notes["mech:graphed_sequoia"])


def test_forward_cost_says_what_a_round_costs_in_strong_ar_steps():
    from specpilot.bench.measure import add_speedups

    def row(system, seconds, forwards, tokens):
        return {"system": system, "batch_size": 1, "status": "measured",
                "seconds": {"median": seconds}, "target_forwards": forwards,
                "tokens_per_s": {"median": tokens / seconds}}

    # Strong AR: 100 forwards in 1 s. A Program: 40 rounds of 2.5 tokens in 0.8 s.
    rows = [row("strong_ar", 1.0, 100, 100), row("stock_graphed", 0.8, 40, 100),
            {"system": "hf_assisted", "batch_size": 1, "status": "skipped", "reason": "x"}]
    add_speedups(rows)
    assert rows[1]["forward_cost_vs_strong_ar"] == pytest.approx((0.8 / 40) / (1.0 / 100))
    assert rows[1]["speedup_vs_strong_ar"] == pytest.approx(1.25)
    # speedup = tokens per forward / forward cost: 2.5 / 2.0
    assert rows[1]["speedup_vs_strong_ar"] == pytest.approx(2.5 / rows[1]["forward_cost_vs_strong_ar"])
    assert rows[0]["forward_cost_vs_strong_ar"] == pytest.approx(1.0)
    assert "forward_cost_vs_strong_ar" not in rows[2]


def test_eager_repeats_apply_to_hf_and_eager_systems_only():
    from types import SimpleNamespace
    settings = pair_bench.PairBenchSettings(pair="unused", repeats=3, eager_repeats=1)
    graphed, eager = SimpleNamespace(graphed=True), SimpleNamespace(graphed=False)
    assert pair_bench.repeats_of(settings, graphed) == 3
    assert pair_bench.repeats_of(settings, eager) == 1
    assert pair_bench.repeats_of(settings, None) == 1
    same = pair_bench.PairBenchSettings(pair="unused", repeats=2)
    assert pair_bench.repeats_of(same, eager) == pair_bench.repeats_of(same, graphed) == 2


def test_the_profile_comes_from_the_run_with_the_most_requests(bench, tmp_path):
    """Batch 1 decodes one prompt here, batch 2 two: the profile (what a replay cycles to fill
    its batches) keeps the two distinct requests of batch 2."""
    root, _ = bench
    code = main(["--pair", str(root / "pair"), "--workload", str(root / "prompts.txt"),
                 "--prompts", "1", "--max-new-tokens", str(NEW), "--batch-sizes", "1,2",
                 "--repeats", "1", "--warmup", "0", "--systems", "stock",
                 "--out-dir", str(tmp_path), "--name", "more", "--device", "cpu"])
    assert code == 0
    profile = AcceptanceProfile.load(str(tmp_path / "more.acceptance.stock.json"))
    assert profile.source["batch_size"] == 2 and len(profile.accepted_lengths) == 2
    assert profile.accepted_lengths == [[4, 4], [4, 4]]          # the perfect drafter


def test_strong_ar_refill_decodes_and_forces_every_prompt_as_eager_ar(bench, monkeypatch):
    """The strong_ar_refill system's glue (setup, one call for all prompts, forcing) on the
    uncaptured refill decoder: greedy AR's tokens, and no forcing violation."""
    import functools

    from specpilot.bench.systems import StrongARRefill
    from specpilot.runtime.ar import generate_ar
    from specpilot.runtime.decoder import load_pair
    from specpilot.runtime.graphed_refill import GraphedRefillDecoder

    root, _ = bench
    pair = load_pair(str(root / "pair" / "target"), None, "float32", "cpu")
    monkeypatch.setattr(StrongARRefill, "decoder_class",
                        functools.partial(GraphedRefillDecoder, capture=False))
    prompts = [list(p) for p in PROMPTS] + [[7, 1, 8]]
    system = StrongARRefill(pair)
    system.setup(2, prompts, NEW)                 # 3 prompts on 2 slots: one refill
    out = system.run(prompts, 2, NEW)
    reference = generate_ar(pair.target, prompts, NEW, pair.eos_ids)
    assert out.tokens == reference.tokens
    forcing = system.check(prompts, 2, reference, out)["forcing"]
    assert forcing["passed"] and forcing["violation_count"] == 0
    assert forcing["positions_compared"] == sum(len(t) for t in reference.tokens)


def test_strong_ar_caches_are_rounded_as_the_speculative_decoders_are(bench, monkeypatch):
    """strong_ar's cache: the longest prompt, the new tokens and one slot, rounded up to the
    graphed decoders' step (as `decoder_for` rounds every speculative decoder's), so that the
    baseline never reads a cache of an odd slot count that no system reads."""
    import functools

    from specpilot.bench.systems import StrongAR
    from specpilot.runtime.ar import generate_ar
    from specpilot.runtime.decoder import load_pair
    from specpilot.runtime.graphed_chain import GraphedChainDecoder
    from specpilot.runtime.graphed_program import CAPACITY_STEP

    root, _ = bench
    pair = load_pair(str(root / "pair" / "target"), None, "float32", "cpu")
    monkeypatch.setattr(StrongAR, "decoder_class",
                        functools.partial(GraphedChainDecoder, capture=False))
    system = StrongAR(pair)
    for longest in (3, 4, 11):
        prompts = [[5] * longest, [2, 9]]
        system.setup(2, prompts, NEW)
        exact = longest + NEW + 1
        assert system.decoder.capacity == -(-exact // CAPACITY_STEP) * CAPACITY_STEP
        assert system.run(prompts, 2, NEW).tokens == generate_ar(
            pair.target, prompts, NEW, pair.eos_ids).tokens


def test_interleave_times_our_systems_side_by_side_with_the_same_results(bench):
    """`--interleave`: our systems in rotated passes (each row says its place in every pass),
    the HF baseline alone after them, and the same tokens, forcing and acceptance as when each
    is measured alone (the fixture's run)."""
    root, alone = bench
    code = main(["--pair", str(root / "pair"), "--workload", str(root / "prompts.txt"),
                 "--prompts", "2", "--max-new-tokens", str(NEW), "--batch-sizes", "2",
                 "--repeats", "3", "--warmup", "0", "--program", str(root / "tree.json"),
                 "--systems", "ar_torch,stock,program:tree,hf_ar", "--interleave",
                 "--out-dir", str(root / "side"), "--name", "side", "--device", "cpu"])
    assert code == 0
    doc = json.loads((root / "side" / "side.json").read_text())
    assert doc["settings"]["interleave"] is True
    rows, before = _rows(doc), _rows(alone)
    group = ["ar_torch", "stock", "program:tree"]
    for place, system in enumerate(group):
        r = rows[(system, 2)]
        assert {k: v for k, v in r["timing"].items() if k != "started"} == {
            "mode": "interleaved", "systems": group,
            "places": [(place - turn) % 3 for turn in range(3)]}
        assert len(r["timing"]["started"]) == 3
        assert len(r["seconds"]["runs"]) == 3
        f = r["forcing"]
        assert f["passed"] and f["violation_count"] == 0
        assert r["exact_match"]["all_exact"]
        for key in ("new_tokens", "target_forwards", "mean_accepted"):
            assert r[key] == before[(system, 2)][key]
    assert "timing" not in rows[("hf_ar", 2)]
    assert rows[("hf_ar", 2)]["exact_match"]["all_exact"]
    md = (root / "side" / "side.md").read_text()
    assert "our systems timed side by side" in md
    assert "timed side by side" not in (root / "out" / "tiny.md").read_text()


def test_interleave_with_a_spent_budget_skips_the_whole_group(bench):
    root, _ = bench
    code = main(["--pair", str(root / "pair"), "--workload", str(root / "prompts.txt"),
                 "--prompts", "1", "--max-new-tokens", "4", "--batch-sizes", "1,2",
                 "--systems", "ar_torch,stock", "--interleave", "--time-budget", "0",
                 "--repeats", "1", "--out-dir", str(root / "side0"), "--name", "side0",
                 "--device", "cpu"])
    assert code == 0
    doc = json.loads((root / "side0" / "side0.json").read_text())
    assert sorted((r["system"], r["batch_size"], r["status"]) for r in doc["rows"]) == [
        ("ar_torch", 1, "skipped"), ("ar_torch", 2, "skipped"),
        ("stock", 1, "skipped"), ("stock", 2, "skipped")]
    assert all("time budget of 0 s spent" in r["reason"] for r in doc["rows"])
