import gzip
import json

import pytest

from specpilot.prompts import PromptsError, humaneval_prompts, load_prompts


def test_jsonl_prompts_in_order(tmp_path):
    rows = [{"task_id": f"t{i}", "prompt": f"def f{i}(x):\n    return x + {i}\n"} for i in range(5)]
    p = tmp_path / "p.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert load_prompts(str(p)) == [r["prompt"] for r in rows]
    assert load_prompts(str(p), limit=2) == [rows[0]["prompt"], rows[1]["prompt"]]


def test_gzipped_jsonl(tmp_path):
    p = tmp_path / "p.jsonl.gz"
    with gzip.open(p, "wt") as f:
        f.write(json.dumps({"prompt": "import os"}) + "\n")
    assert load_prompts(str(p)) == ["import os"]


def test_plain_text_one_prompt_per_line_skips_blank(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("first prompt\n\nsecond prompt\n")
    assert load_prompts(str(p)) == ["first prompt", "second prompt"]


@pytest.mark.parametrize("content, needle", [
    ("", "no prompts"),
    ('{"prompt": "a"}\n{"prompt": \n', "line 2 is not valid JSON"),
    ('{"prompt": "a"}\n{"text": "b"}\n', "line 2 has no string field 'prompt'"),
])
def test_bad_prompt_files_name_the_problem(tmp_path, content, needle):
    p = tmp_path / "p.jsonl"
    p.write_text(content)
    with pytest.raises(PromptsError, match=needle):
        load_prompts(str(p))


def test_missing_file(tmp_path):
    with pytest.raises(PromptsError, match="does not exist"):
        load_prompts(str(tmp_path / "nope.jsonl"))


def test_humaneval_ships_164_python_prompts():
    prompts = humaneval_prompts()
    assert len(prompts) == 164
    assert all("def " in p for p in prompts)
    assert humaneval_prompts(limit=3) == prompts[:3]
