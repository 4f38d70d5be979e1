"""What drafting the next chain beside the verification would commit per unit of time, modelled
on measured chain profiles and the two-stream round prices of bench/overlap_probe.py.

A draft-ahead decoder verifies this round's chain while the drafter, on a second stream, drafts
the next one as if this one were accepted whole: it drafts its own guess of the target's bonus
token (one step) and k drafts after it (k steps). Output stays the target's: every token is
verified. Per row, the next chain is then valid only where this round accepted all k drafts and
the guess was the target's token (probability q = P(n = k) * g, g the guess rate). A row whose
chain is not valid verifies drafts made from the wrong text: it commits the target's one token
(a plain step), while the drafter drafts from its true text, guessing that token first (right
with probability a1, the first draft's acceptance). A row is one two-state Markov chain:

    valid next = q (from valid), a1 (from not valid);  P(valid) = a1 / (1 - q + a1)
    tokens a round = P(valid) * E[n + 1] + (1 - P(valid)) * 1

with n's distribution and a1 pooled from the profile's rounds (a chain(k) profile's rounds are
all "valid" ones). No batch-wide fallback: rows go their own ways in one graph. Prices (ms): a
sequential round is the probe's one-stream time plus the commit; a draft-ahead round its
two-stream time plus the commit, with k + 1 drafter steps where the probe ran k: the extra
step's share either hidden (`fast`) or not (`slow`).

  python3 bench/draft_ahead_model.py --profiles P1,P2 --probe bench/results/overlap-probe.json \\
      --batch 16 --out bench/results/draft-ahead-model.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Sequence

from specpilot.search.run_folder import write_json_atomic


def row_tokens(accepted: Sequence[int], k: int, guess_rate: float) -> Dict[str, float]:
    """Per row and round: tokens sequentially (E[n + 1]) and drafting ahead, from the pooled
    accepted counts of a chain(k) profile's rounds."""
    if not accepted:
        raise ValueError("the profile has no rounds")
    if not 0.0 <= guess_rate <= 1.0:
        raise ValueError(f"guess rate {guess_rate} is not a probability")
    rounds = len(accepted)
    sequential = sum(n + 1 for n in accepted) / rounds
    full = sum(n == k for n in accepted) / rounds
    a1 = sum(n >= 1 for n in accepted) / rounds
    q = full * guess_rate
    valid = a1 / (1.0 - q + a1) if a1 > 0 else 0.0
    return {"sequential": sequential, "draft_ahead": valid * sequential + (1.0 - valid),
            "p_full": full, "a1": a1, "p_valid": valid}


def round_prices(probe: dict, batch: int, commit_ms: float) -> Dict[str, float]:
    """ms of a sequential round and of a draft-ahead one (fast and slow) at `batch`."""
    rows = [r for r in probe["batches"] if r["batch"] == batch]
    if not rows:
        raise ValueError(f"the probe has no batch {batch}: "
                         f"{sorted(r['batch'] for r in probe['batches'])}")
    ms, k = rows[0]["ms"], rows[0]["k"]
    ahead = ms["two_streams"] + commit_ms
    return {"sequential": ms["one_stream"] + commit_ms, "draft_ahead_fast": ahead,
            "draft_ahead_slow": ahead + ms["draft"] / k, "k": k}


def model(profiles: Dict[str, dict], probe: dict, batch: int, commit_ms: float,
          guess_rates: Sequence[float]) -> List[dict]:
    prices = round_prices(probe, batch, commit_ms)
    out = []
    for name, profile in profiles.items():
        topology = profile["topology"]
        if topology.get("kind") != "chain":
            raise ValueError(f"{name}: a chain profile is needed, not {topology}")
        k = topology["k"]
        if k != prices["k"]:
            raise ValueError(f"{name}: chain({k}) against a probe of {prices['k']} drafts")
        accepted = [n for request in profile["accepted_lengths"] for n in request]
        for g in guess_rates:
            t = row_tokens(accepted, k, g)
            seq = t["sequential"] / prices["sequential"]
            fast = t["draft_ahead"] / prices["draft_ahead_fast"]
            slow = t["draft_ahead"] / prices["draft_ahead_slow"]
            out.append({"profile": name, "guess_rate": g, **t,
                        "tokens_per_ms": {"sequential": seq, "draft_ahead_fast": fast,
                                          "draft_ahead_slow": slow},
                        "draft_ahead_over_sequential": [slow / seq, fast / seq]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", required=True, help="comma-separated chain(k) profiles")
    ap.add_argument("--probe", required=True, help="bench/overlap_probe.py's JSON")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--commit-ms", type=float, default=0.07,
                    help="acceptance and commit a round (round breakdown, batch 16: 0.07)")
    ap.add_argument("--guess-rates", default="0.7,0.85,1.0")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        profiles = {p: json.loads(Path(p).read_text()) for p in args.profiles.split(",")}
        probe = json.loads(Path(args.probe).read_text())
        rates = [float(g) for g in args.guess_rates.split(",")]
        rows = model(profiles, probe, args.batch, args.commit_ms, rates)
    except (OSError, ValueError, KeyError) as exc:
        ap.error(str(exc))
    for r in rows:
        lo, hi = r["draft_ahead_over_sequential"]
        print(f"{Path(r['profile']).name} g={r['guess_rate']:g}: {r['sequential']:.2f} tokens a "
              f"round sequentially, {r['draft_ahead']:.2f} drafting ahead; per ms "
              f"{lo:.2f}-{hi:.2f}x", file=sys.stdout)
    write_json_atomic(Path(args.out), {"settings": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
