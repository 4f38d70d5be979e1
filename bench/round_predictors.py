"""Can a request's rounds be told before it runs? Features of each prompt, read from one
teacher-forced pass of both models over it, against the chain rounds the request then takes.

A refilled batch drains behind its slowest requests; served longest first, runs 25-28's
queues would need 9-29 % fewer rounds (bench/refill_granularity.py), but only if a request's
rounds were known before it starts. Per prompt this reads

  length         the prompt's tokens
  agree_all      the share of the prompt's positions where the drafter's argmax is the target's
  agree_last32   the same over its last 32 positions
  conf_last32    the target's mean top-1 probability over its last 32 positions

then decodes every prompt with greedy chain(k) speculation (runtime/speculative.py) and
reports each feature's Spearman rank correlation with the rounds, and the refill schedule's
rounds (specpilot/cost/refill_schedule.py, refilled at once) with the queue in the order given,
ordered by each feature (the request predicted longest first: least agreement, least
confidence, longest prompt), longest first by the true rounds, packed by them
(`order_schedules`), and full rows.

  python3 bench/round_predictors.py --pair DIR [--prompts 64] [--max-new-tokens 256] \\
      [--k 4] [--batch-sizes 4,16] [--device cpu] [--out FILE.json]

`--pair DIR` holds `target/` and `drafter/` (as `specpilot zoo train` writes them).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Sequence

import torch

from specpilot.cli_common import positive_counts, positive_int
from specpilot.cost.refill_schedule import order_schedules, refill_steps
from specpilot.ir import Chain
from specpilot.ir.errors import SpecPilotError
from specpilot.prompts import workload_prompts
from specpilot.runtime.decoder import load_pair
from specpilot.runtime.speculative import speculative_generate
from specpilot.runtime.steps import teacher_forced_logits
from specpilot.search.run_folder import write_json_atomic

# Which way each feature points: +1 where a larger value should mean more rounds.
LONGER_WHEN = {"length": +1, "agree_all": -1, "agree_last32": -1, "conf_last32": -1}


def prompt_features(target, drafter, prompt: Sequence[int]) -> Dict[str, float]:
    """The module docstring's features of one prompt, from the pair's runtime models."""
    lt, ld = teacher_forced_logits(target, prompt), teacher_forced_logits(drafter, prompt)
    agree = (lt.argmax(-1) == ld.argmax(-1)).float()
    conf = torch.softmax(lt, dim=-1).max(dim=-1).values
    return {"length": float(len(prompt)), "agree_all": agree.mean().item(),
            "agree_last32": agree[-32:].mean().item(), "conf_last32": conf[-32:].mean().item()}


def ranks(values: Sequence[float]) -> torch.Tensor:
    """Average ranks (ties share theirs), as Spearman's correlation takes them."""
    x = torch.tensor(values, dtype=torch.float64)
    order = torch.argsort(x, stable=True)
    r = torch.empty_like(x)
    r[order] = torch.arange(len(x), dtype=torch.float64)
    for v in torch.unique(x):
        tied = x == v
        r[tied] = r[tied].mean()
    return r


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of `a` and `b` (nan where either is constant)."""
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = (ra.square().sum() * rb.square().sum()).sqrt()
    return float("nan") if denom == 0 else float((ra * rb).sum() / denom)


def schedules(rounds: List[int], features: List[Dict[str, float]], batch: int) -> dict:
    """Refill rounds on `batch` slots (refilled at once) per queue order: the orders that know
    the rounds (`order_schedules`), and one by each feature."""
    n = len(rounds)
    out = dict(order_schedules(rounds, batch))
    for name, sign in LONGER_WHEN.items():
        order = sorted(range(n), key=lambda i: -sign * features[i][name])
        out[f"by_{name}"] = refill_steps([rounds[i] for i in order], batch)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pair", required=True, help="a folder with target/ and drafter/")
    ap.add_argument("--workload", default="humaneval", help="humaneval or a prompts file")
    ap.add_argument("--prompts", type=positive_int, default=64)
    ap.add_argument("--max-new-tokens", type=positive_int, default=256)
    ap.add_argument("--k", type=positive_int, default=4, help="the chain's drafts a round")
    ap.add_argument("--batch-sizes", type=positive_counts, default=[4, 16])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (float32 either way)")
    ap.add_argument("--out", help="write the figures here as JSON too")
    args = ap.parse_args(argv)
    root = Path(args.pair)
    try:
        pair = load_pair(str(root / "target"), str(root / "drafter"), "float32", args.device)
        texts = workload_prompts(args.workload, args.prompts)
    except (OSError, SpecPilotError, ValueError) as exc:
        ap.error(str(exc))
    if pair.tokenizer is None:
        ap.error(f"{root / 'target'} has no tokenizer: prompts cannot be encoded")
    prompts = [pair.tokenizer.encode(t).ids for t in texts]
    print(f"[predictors] {len(prompts)} prompts: features", flush=True)
    features = [prompt_features(pair.target, pair.drafter, p) for p in prompts]
    print(f"[predictors] chain({args.k}) decoding, {args.max_new_tokens} new tokens each",
          flush=True)
    result = speculative_generate(pair.target, pair.drafter, prompts, args.max_new_tokens,
                                  Chain(args.k), pair.eos_ids)
    rounds = [len(a) for a in result.accepted_lengths]
    correlations = {name: spearman([f[name] for f in features], rounds)
                    for name in LONGER_WHEN}
    # nan (a constant feature or constant rounds) is written as null: JSON has no nan.
    written = {name: None if rho != rho else rho for name, rho in correlations.items()}
    by_batch = {str(b): schedules(rounds, features, b) for b in args.batch_sizes}
    for name, rho in correlations.items():
        print(f"  {name:>13}: Spearman {rho:+.3f} with the rounds (more rounds expected "
              f"when {'larger' if LONGER_WHEN[name] > 0 else 'smaller'})")
    for b, s in by_batch.items():
        ordered = ", ".join(f"{k} {v}" for k, v in s.items() if k.startswith("by_"))
        print(f"  batch {b}: as given {s['at_once']}, longest first {s['longest_first']}, "
              f"packed {s['packed']}, full rows {s['full_rows']:.1f}; ordered {ordered}")
    if args.out:
        write_json_atomic(Path(args.out), {"settings": vars(args), "rounds": rounds,
                                           "features": features, "spearman": written,
                                           "schedules": by_batch})
    return 0


if __name__ == "__main__":
    sys.exit(main())
