"""Markdown tables of bench results (measured pair runs and replayed-acceptance runs), and the
optional refresh of one named section of BENCHMARKS.md."""
from __future__ import annotations

import os
import re
from typing import List, Optional

GIB = 1024 ** 3


def _num(x: Optional[float], fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def _rate(r: dict) -> str:
    t = r["tokens_per_s"]
    if t["min"] == t["max"]:
        return f"{t['median']:.1f}"
    return f"{t['median']:.1f} ({t['min']:.1f}–{t['max']:.1f})"


def _correctness(r: dict) -> str:
    """Forcing's verdict, then how many requests' own (unforced) text is the reference's."""
    said = []
    if "forcing" in r:
        f = r["forcing"]
        verdict = "PASSED" if f["passed"] else "REJECTED"
        said.append(f"forcing {verdict}: {f['exact']}/{f['positions_expected']} exact, "
                    f"{f['near_tie_flip_count']} near-tie, {f['violation_count']} violations")
    if "exact_match" in r:
        e = r["exact_match"]
        said.append(f"own text = reference in {e['exact_requests']}/{e['requests']} requests")
    return "; ".join(said)


def _rounds(r: dict) -> str:
    """A graphed decoder's rounds by chain length ("L0" counts plain steps: speculation off)
    and its refills, from the row's `run_stats`: what an adaptive decoder chose. "–" for
    decoders that count neither."""
    # Here, not at the top: the runtime imports torch, and results.py (which imports this
    # module) serves the bench's argument checks before any model loads.
    from specpilot.runtime.graphed_loop import ROUNDS_OF

    stats = r.get("run_stats") or {}
    lengths = sorted((int(name[len(ROUNDS_OF):]), count) for name, count in stats.items()
                     if name.startswith(ROUNDS_OF))
    said = [" ".join(f"L{n}: {count}" for n, count in lengths)] if lengths else []
    if "refills" in stats:
        said.append(f"{stats['refills']} refills")
    return "; ".join(said) or "–"


def _table(header: List[str], lines: List[List[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cells) + " |" for cells in lines]
    return "\n".join(out)


def pair_markdown(doc: dict) -> str:
    """The measured pair bench as a heading, settings line and one table row per (system, batch)."""
    env, s = doc["environment"], doc["settings"]
    lines = []
    for r in doc["rows"]:
        if r["status"] != "measured":
            lines.append([r["system"], str(r["batch_size"])] + ["–"] * 9 +
                          [f"{r['status']}: {r['reason']}"])
            continue
        mem = r["peak_memory_bytes"]
        lines.append([r["system"], str(r["batch_size"]), _rate(r),
                      _num(r.get("speedup_vs_hf_ar")), _num(r.get("speedup_vs_strong_ar")),
                      _num(r["mean_accepted"]), _num(r["tokens_per_target_forward"]),
                      _num(r.get("forward_cost_vs_strong_ar")),
                      str(r["target_forwards"]), _rounds(r),
                      _num(None if mem is None else mem / GIB), _correctness(r)])
    header = ["system", "batch", "tokens/s median (min–max)", "× HF AR", "× strong AR",
              "mean accepted", "tokens / target fwd", "fwd cost (strong AR steps)",
              "target fwds", "rounds by draft length", "peak GiB", "correctness"]
    systems = "\n".join(f"- `{x['name']}`: {x['description']}"
                        + "".join(f" ({n})" for n in x["notes"]) for x in doc["systems"])
    return (f"## {doc['name']}\n\n"
            f"{env['gpu']}, torch {env['torch']}, transformers {env['transformers']}, "
            f"{env['date']}. Pair `{s['pair']}` ({s['dtype']}), {s['prompts']} {s['workload']} "
            f"prompts, {s['max_new_tokens']} new tokens, greedy; median of {s['repeats']} runs "
            f"{_eager_runs(s)}"
            f"after {s['warmup']} warm-up{_interleaved(s)}. Reference: the stock decoder "
            f"(greedy AR, batch 1). "
            f"Own text: a request's unforced output against the reference's; in reduced "
            f"precision a decode may leave it at a near-tie and go on with its own text, which "
            f"can take more or fewer rounds, so systems' times are of somewhat different texts. "
            f"Peak GiB: GPU memory allocated during a system's runs, resident models "
            f"included.\n\n"
            f"{systems}\n\n{_table(header, lines)}\n")


def _interleaved(settings: dict) -> str:
    """How the runs were ordered, where our systems were timed side by side."""
    if not settings.get("interleave"):
        return ""
    return ("; our systems timed side by side, each pass over all of them in an order rotated "
            "by one each pass (peak memory as if each ran alone)")


def replay_markdown(doc: dict) -> str:
    """The replayed-acceptance run: tokens/s per (system, batch) and the main step costs."""
    env, s = doc["environment"], doc["settings"]
    lines = [[r["system"], str(r["batch_size"]), _rate(r), _num(r.get("speedup_vs_ar")),
              _num(r.get("mean_accepted")), str(r["steps"])] for r in doc["rows"]]
    header = ["system", "batch", "tokens/s (replayed acceptance)", "× AR", "mean accepted",
              "steps"]
    costs = doc["step_costs"]
    k = s["verify_width"]
    cost_lines = []
    for b in s["batch_sizes"]:
        key = str(b)
        verify = (_ms(costs["verify_trees"], s["topology"], key)
                  if s["topology"] in costs["verify_trees"] else _ms(costs["target"], key, str(k)))
        cost_lines.append([key, _ms(costs["target"], key, "1"), verify,
                           _ms(costs["drafter"], key, "1"),
                           _ms(costs["accept"], s["topology"], key)])
    cost_header = ["batch", "target step ms", f"verify {s['topology']} ms", "drafter step ms",
                   "accept+commit ms"]
    trees = ""
    if costs["verify_trees"]:
        tree_lines = [[t, key, _ms(costs["verify_trees"], t, key), _ms(costs["accept"], t, key)]
                      for t in costs["verify_trees"] for key in map(str, s["batch_sizes"])]
        trees = "\n\nTree verification (median):\n\n" + _table(
            ["tree", "batch", "verify ms", "accept+commit ms"], tree_lines)
    return (f"## {doc['name']} (replayed acceptance)\n\n"
            f"{env['gpu']}, torch {env['torch']}, {env['date']}. Shapes {s['shapes']} "
            f"(scale {s['scale']}, {s['dtype']}, random weights, context {s['context']}, "
            f"{'CUDA-graphed' if costs['graphed'] else 'eager'} steps). **Replayed acceptance**: "
            f"accepted lengths measured on a real pair ({s['profile']}, {s['topology']}, mean "
            f"accepted {s['profile_mean_accepted']:.2f}) replayed with these step costs: "
            f"{doc['replay_model']}.{_adaptive_note(s)}{_refill_note(s)}\n\n"
            f"{_table(header, lines)}\n\n"
            f"Step costs (median):\n\n{_table(cost_header, cost_lines)}{trees}\n")


def _adaptive_note(settings: dict) -> str:
    if not settings.get("adaptive"):
        return ""
    return (" The adaptive-lengths rows run the graphed batch-length rule on the profile's "
            "per-position agreement, each round at the measured graphed round of the chosen "
            "length; a position the profile never drafted (after a fully accepted chain) counts "
            "as a disagreement in the pessimistic row and as an agreement in the optimistic "
            "one.")


def _refill_note(settings: dict) -> str:
    if not settings.get("refill"):
        return ""
    return (" The refill rows replay AR and speculation with continuous refill (a finished "
            "request's slot takes the next request at the next step; prefills not counted); "
            "their × AR is against the padded AR row.")


def _ms(table: dict, outer: str, inner: str) -> str:
    try:
        return f"{table[outer][inner] * 1e3:.3f}"
    except KeyError:
        return "–"


def update_section(path: str, name: str, markdown: str) -> None:
    """Write `markdown` between `<!-- bench:NAME -->` markers in `path`, replacing what was there
    or appending a new section (the file is created if missing)."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{markdown.rstrip()}\n{end}"
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = (text.rstrip() + "\n\n" if text.strip() else "# Benchmarks\n\n") + block + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _eager_runs(settings: dict) -> str:
    """How many runs the HF and eager systems took, where that differs from the graphed ones."""
    eager = settings.get("eager_repeats")
    if eager is None or eager == settings["repeats"]:
        return ""
    return f"({eager} for the HF and eager systems) "
