"""Counting candidate evaluations from round records: in all, and until the best Program (the
last round's) was first chosen."""
import random

from specpilot.search.evaluations import count_evaluations


def record(k, program, stages):
    return {"round": k, "program_id": program,
            "outcomes": [{"stage": s, "label": f"c{i}"} for i, s in enumerate(stages)]}


def test_counts_up_to_the_round_that_first_chose_the_best():
    rng = random.Random()
    n1, n3 = rng.randint(1, 6), rng.randint(1, 6)
    stages1 = ["proposal", "build"] + ["not_admitted"] * n1 + ["admitted", "output", "forcing"]
    records = [record(0, "stock", []), record(1, "A", stages1),
               record(2, "B", ["lowering", "admitted"]), record(3, "B", ["forcing"] * n3)]
    count = count_evaluations(records)
    # refused proposals and lowering/build failures are not evaluations
    assert (count.to_best, count.total, count.best_round) == (n1 + 3 + 1, n1 + 3 + 1 + n3, 2)
    assert count.summary() == (f"best reached after {n1 + 4} candidate evaluations, "
                               f"of {n1 + 4 + n3}")


def test_a_compile_that_never_left_the_stock_program_reached_it_with_none():
    records = [record(0, "stock", []), record(1, "stock", ["not_admitted", "forcing"])]
    count = count_evaluations(records)
    assert (count.to_best, count.total, count.best_round) == (0, 2, 0)
