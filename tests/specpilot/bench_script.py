"""Load a script of bench/ (not a package) as a module, for the tests that run it end to end;
write the step costs and acceptance profiles such scripts read; and fill a decoder as the
scripts that time rounds do."""
import importlib.util
import json
import os


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_bench_script(name: str):
    """bench/<name>.py as a fresh module."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_step_costs(path, target, drafter, accept=None, shapes="hand:made", gpu="hand",
                     context=8) -> str:
    """A `specpilot bench --shapes` result at `path` holding only step costs: target[b][w] and
    drafter[b][w] in seconds (and `accept` as stored there); returns the path as a string."""
    def keyed(table):
        return {str(b): {str(w): s for w, s in row.items()} for b, row in table.items()}
    doc = {"settings": {"shapes": shapes, "device": "cuda", "dtype": "bfloat16", "scale": 1.0,
                        "context": context},
           "environment": {"gpu": gpu},
           "step_costs": {"context": context, "graphed": True, "unit": "seconds",
                          "target": keyed(target), "drafter": keyed(drafter),
                          "verify_trees": {}, "accept": accept or {}, "graphed_rounds": {}}}
    path.write_text(json.dumps(doc))
    return str(path)


def write_profile(path, topology: dict, accepted, new_tokens, source=None) -> str:
    """An acceptance profile at `path` (`topology` as ir.topology JSON, per request the drafts
    accepted each round and the new tokens); returns the path as a string."""
    path.write_text(json.dumps({"format": "specpilot-acceptance-profile", "version": 1,
                                "topology": topology, "accepted_lengths": accepted,
                                "new_tokens": new_tokens, "source": source or {"hand": True}}))
    return str(path)


def count_fused_forwards(monkeypatch, script) -> list:
    """Make `script`'s FusedForward record (the model it runs, the token shape) of every call it
    serves; returns the record (so a test can tell the script's "fused" rows really ran the
    fused forward, and for which model)."""
    from specpilot.runtime.fused_forward import FusedForward

    calls = []

    class Counting(FusedForward):
        def forward(self, tokens, *args, **kwargs):
            calls.append((self.model, tuple(tokens.shape)))
            return super().forward(tokens, *args, **kwargs)

    monkeypatch.setattr(script, "FusedForward", Counting)
    return calls


def fill_all_active(dec, target, drafter, context: int, seed: int):
    """`dec` (a graphed decoder) with both caches holding a seeded random context of `context`
    tokens a row, its last two tokens as `prev` and `last`, and every row active after it;
    returns `dec`."""
    import torch

    from hf_factory import random_prompts
    from specpilot.runtime.steps import append_step

    prompts = random_prompts([context] * dec.batch, seed=seed)
    zeros = torch.zeros(dec.batch, dtype=torch.int64, device=dec.device)
    append_step(target, dec.tcache, zeros, prompts)
    append_step(drafter, dec.dcache, zeros, prompts)
    dec.reset_all_active(context)
    dec.last.copy_(torch.tensor([p[-1] for p in prompts], device=dec.device))
    dec.prev.copy_(torch.tensor([p[-2] for p in prompts], device=dec.device))
    return dec
