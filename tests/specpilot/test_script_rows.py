"""specpilot/bench/script_rows.measure_rows: every finished row is on disk before the next case
runs, so a run cut short by an error (or a time limit) keeps what it finished; each row is
reported as it finishes."""
import json

import pytest

from specpilot.bench.script_rows import measure_rows


def test_a_run_cut_short_keeps_every_row_it_finished(tmp_path, capsys):
    out = tmp_path / "rows.json"
    seen_on_disk = []

    def measure(case):
        if out.exists():
            seen_on_disk.append(len(json.loads(out.read_text())["cells"]))
        if case == 3:
            raise RuntimeError("cut short")
        return {"case": case, "square": case * case}

    with pytest.raises(RuntimeError):
        measure_rows([1, 2, 3, 4], measure, lambda row: f"case {row['case']}", str(out), "cpu",
                     {"given": 7}, "cells")
    doc = json.loads(out.read_text())
    assert doc["cells"] == [{"case": 1, "square": 1}, {"case": 2, "square": 4}]
    assert doc["settings"] == {"given": 7} and doc["environment"]["device"] == "cpu"
    assert seen_on_disk == [1, 2]           # written after each row, before the next began
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in printed] == ["case 1", "case 2"]
    assert list(tmp_path.iterdir()) == [out]            # no temporary file left behind
