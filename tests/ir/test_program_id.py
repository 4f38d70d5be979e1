"""program_id: sha256 of the canonical JSON without history; stable, order-independent, sensitive
to every attribute that changes what the decoder does."""
import hashlib
import json
import os
import random
import subprocess
import sys
from dataclasses import replace

from specpilot.ir import (SetTopology, SetWeightFormat, Tree, apply, program_from_json,
                          program_from_obj, program_id, program_to_json, record_escape_rates)


def _reference_id(text: str) -> str:
    """Independent of specpilot's encoder: the standard library's canonical spelling."""
    obj = json.loads(text)
    del obj["history"]
    canon = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def _tree_program(stock):
    p = record_escape_rates(stock, "target", {"layers.0.mlp.up_proj": 311})
    return apply(apply(p, SetTopology(Tree((4, 2, 2, 1)))),
                 SetWeightFormat("target.layers.0.mlp.up_proj", "lossless12"))


def test_id_matches_independent_sha256(stock):
    for p in (stock, _tree_program(stock)):
        assert program_id(p) == _reference_id(program_to_json(p))
        assert len(program_id(p)) == 64


def test_id_is_stable_across_processes(tmp_path, stock):
    p = _tree_program(stock)
    path = tmp_path / "p.json"
    path.write_text(program_to_json(p), encoding="utf-8")
    script = ("import sys; from specpilot.ir import load_program, program_id; "
              "print(program_id(load_program(sys.argv[1])))")
    ids = set()
    for seed in ("0", "1", str(random.randrange(2, 2**32))):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script, str(path)], env=env, check=True,
                             capture_output=True, text=True).stdout.strip()
        ids.add(out)
    assert ids == {program_id(p)}


def _shuffled(value, rng):
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def test_id_is_independent_of_key_order(stock):
    p = _tree_program(stock)
    obj = json.loads(program_to_json(p))
    rng = random.Random()
    for _ in range(5):
        shuffled = json.dumps(_shuffled(obj, rng))
        q = program_from_json(shuffled)
        assert q == p and program_id(q) == program_id(p)


def test_id_ignores_history(stock):
    p = _tree_program(stock)
    assert len(p.history) == 2
    assert program_id(replace(p, history=())) == program_id(p)
    assert program_id(replace(p, history=p.history[:1])) == program_id(p)


def _leaves(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, path + (i,))
    else:
        yield path, value


def _mutated(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    return value + "x"


def test_id_changes_when_any_attribute_changes(stock):
    """Every leaf of the Program (history aside) takes part in the id."""
    p = _tree_program(stock)
    obj = json.loads(program_to_json(p))
    del obj["history"]
    base = program_id(p)
    seen = {base}
    # The schema version and the topology kind cannot take an arbitrary other value and still
    # decode; a different kind is a different topology, covered by the diff and round-trip tests.
    leaves = [(path, v) for path, v in _leaves(obj)
              if path != ("schema_version",) and path[-1] != "kind"]
    assert len(leaves) > 60
    for path, value in leaves:
        changed = json.loads(json.dumps(obj))
        node = changed
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = _mutated(value)
        changed["history"] = []
        q = program_from_obj(changed, check=False)
        new = program_id(q)
        assert new not in seen, f"changing {'.'.join(map(str, path))} did not change the id"
        seen.add(new)
