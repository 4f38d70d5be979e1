"""Does a draft's chance of acceptance fall with its depth? A fixed chain's measured profile,
per depth d: P(accepted >= d | accepted >= d - 1) pooled over every round of every request
(specpilot/cost/acceptance.per_depth_from_lengths), against the one per-draft rate the
adaptive length rule's expected tokens assume (runtime/batch_length.py: E(L) = 1 + a + ... +
a^L). Only a fixed chain's rounds all verify the same depth; an adaptive decoder's profile is
refused (its rounds' lengths are not in it).

  python3 bench/depth_acceptance.py PROFILE.json [PROFILE.json ...] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specpilot.bench.replay import AcceptanceProfile, ProfileError
from specpilot.cost.acceptance import per_depth_from_lengths
from specpilot.ir import Chain
from specpilot.search.run_folder import write_json_atomic


def one_profile(path: str) -> dict:
    profile = AcceptanceProfile.load(path)
    topology = profile.topology
    # The profile keeps its system's name only: an adaptive system's rounds are chains too.
    system = (profile.source or {}).get("system", "")
    if not isinstance(topology, Chain) or "adaptive" in system:
        raise ProfileError(f"{path}: not a fixed chain's profile ({topology}, {system or '?'})")
    k = topology.k
    rounds = sum(len(r) for r in profile.accepted_lengths)
    accepted = sum(sum(r) for r in profile.accepted_lengths)
    return {"profile": path, "system": system, "k": k, "rounds": rounds,
            "per_depth": per_depth_from_lengths(profile.accepted_lengths, k),
            "mean_accepted": accepted / rounds if rounds else 0.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profiles", nargs="+", help="fixed-chain acceptance profile JSON files")
    ap.add_argument("--out", help="write the figures here as JSON too")
    args = ap.parse_args(argv)
    try:
        rows = [one_profile(p) for p in args.profiles]
    except (ProfileError, OSError, ValueError) as exc:
        ap.error(str(exc))
    for row in rows:
        rates = ", ".join(f"{a:.3f}" for a in row["per_depth"])
        print(f"{row['profile']}: chain({row['k']}), {row['rounds']} rounds, "
              f"{row['mean_accepted']:.2f} drafts accepted a round; per depth {rates}")
    if args.out:
        write_json_atomic(Path(args.out), {"settings": vars(args), "profiles": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
