"""specpilot/bench/report_md.py's pair table: a row says forcing's verdict and how many requests'
own text is the reference's (the two differ: forcing feeds the reference's tokens, an unforced
decode may leave them at a near-tie), and the header says what that means for the times."""
from specpilot.bench.report_md import pair_markdown


def _doc(row_checks: dict) -> dict:
    row = {"system": "stock_graphed", "batch_size": 16, "status": "measured",
           "tokens_per_s": {"median": 100.0, "min": 99.0, "max": 101.0},
           "speedup_vs_strong_ar": 0.9, "mean_accepted": 3.25,
           "tokens_per_target_forward": 26.15, "forward_cost_vs_strong_ar": 2.32,
           "target_forwards": 500, "peak_memory_bytes": 2 * 1024 ** 3, **row_checks}
    return {"name": "t", "environment": {"gpu": "G", "torch": "2", "transformers": "5",
                                         "date": "d"},
            "settings": {"pair": "p", "dtype": "bfloat16", "prompts": 64,
                         "workload": "humaneval", "max_new_tokens": 256, "repeats": 2,
                         "warmup": 1},
            "systems": [{"name": "stock_graphed", "description": "x", "notes": []}],
            "rows": [row]}


FORCING = {"passed": True, "exact": 13311, "positions_expected": 13328,
           "near_tie_flip_count": 17, "violation_count": 0}
EXACT = {"requests": 64, "exact_requests": 54}


def test_a_row_gives_forcing_and_the_own_text_count_together():
    text = pair_markdown(_doc({"forcing": FORCING, "exact_match": EXACT}))
    row = next(line for line in text.splitlines() if line.startswith("| stock_graphed"))
    assert row.endswith("| forcing PASSED: 13311/13328 exact, 17 near-tie, 0 violations; "
                        "own text = reference in 54/64 requests |")
    assert "| 2.32 | 500 | – | 2.00 |" in row
    assert "near-tie and go on with its own text" in text


def test_a_row_without_forcing_gives_the_own_text_count_alone():
    text = pair_markdown(_doc({"exact_match": EXACT}))
    assert "| own text = reference in 54/64 requests |" in text
    rejected = pair_markdown(_doc({"forcing": dict(FORCING, passed=False, violation_count=3)}))
    assert "forcing REJECTED: 13311/13328 exact, 17 near-tie, 3 violations |" in rejected


def test_a_row_gives_an_adaptive_decoders_rounds_by_length_and_refills():
    # Counts as a graphed adaptive refill decoder reports them (runtime/graphed_loop.py),
    # out of order, with a two-digit length, so that the cell must sort them by number.
    stats = {"rounds_chain_4": 116, "rounds_chain_0": 110, "rounds_chain_10": 3,
             "rounds_chain_1": 102, "refills": 128}
    text = pair_markdown(_doc({"run_stats": stats}))
    row = next(line for line in text.splitlines() if line.startswith("| stock_graphed"))
    assert "| 500 | L0: 110 L1: 102 L4: 116 L10: 3; 128 refills | 2.00 |" in row
    assert "| rounds by draft length |" in text


def test_a_row_without_round_counts_says_so():
    eager = pair_markdown(_doc({"run_stats": {"steps": 40, "verified_tokens": 200}}))
    assert "| 500 | – | 2.00 |" in eager
    plain = pair_markdown(_doc({}))
    assert "| 500 | – | 2.00 |" in plain
    skipped = pair_markdown(dict(_doc({}), rows=[{"system": "s", "batch_size": 64,
                                                   "status": "skipped", "reason": "budget"}]))
    row = next(line for line in skipped.splitlines() if line.startswith("| s |"))
    header = next(line for line in skipped.splitlines() if line.startswith("| system"))
    assert row.count("|") == header.count("|")


def test_the_tables_and_results_modules_load_without_torch():
    # results.py (and the tables it imports) serve the bench's argument checks before any
    # model loads: the runtime's torch is imported only where a table reads a decoder's rounds.
    import subprocess
    import sys

    probe = ("import sys, specpilot.bench.results, specpilot.bench.report_md; "
             "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
