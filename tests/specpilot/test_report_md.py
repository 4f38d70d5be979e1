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
    assert "| 2.32 | 500 | 2.00 |" in row
    assert "near-tie and go on with its own text" in text


def test_a_row_without_forcing_gives_the_own_text_count_alone():
    text = pair_markdown(_doc({"exact_match": EXACT}))
    assert "| own text = reference in 54/64 requests |" in text
    rejected = pair_markdown(_doc({"forcing": dict(FORCING, passed=False, violation_count=3)}))
    assert "forcing REJECTED: 13311/13328 exact, 17 near-tie, 3 violations |" in rejected
