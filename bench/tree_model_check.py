"""How well the cost model prices a tree round against a chain's: the rounds a
`bench/tree_round_cost.py` run measured ("now" rows), each priced by the roofline model
(`cost/roofline.step_nodes`: roofline and overhead seconds of the Program with that topology,
captured, at the run's batch and context), with the calibration's two factors (alpha x
roofline + beta x overhead) fitted on the chain rows alone, as a compile calibrates on chains
only. The fit is plain least squares on the rounds' milliseconds, not `cost/calibrate.fit`
(relative errors, pulled towards one factor): the question is the trees' residual against the
chains' line, not the factors themselves. Each tree row then says measured ÷ predicted:
above 1, the model prices that tree below what its round costs.

  python3 bench/tree_model_check.py --rounds bench/results/tree-round-cost.json \\
      --out bench/results/tree-model-check.json

No GPU needed: it reads measurements. The run must have been on a GPU that is one of the cost
model's specs (captured rounds, bf16), on preset shapes (`--shapes` of tree_round_cost.py,
random weights). A fit that is not positive (noisy chain rows) is refused.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import List

from specpilot.bench.shapes import preset_deployment
from specpilot.bench.step_costs import topology_from_key
from specpilot.bench.tree_pricing import with_topology
from specpilot.cost.gpu_specs import gpu_key, gpu_spec
from specpilot.cost.roofline import step_nodes, summed_seconds
from specpilot.ir import CaptureGraphs, Chain, apply
from specpilot.ir.errors import SpecPilotError
from specpilot.ir.stock import stock_program
from specpilot.search.run_folder import write_json_atomic


def priced_rows(doc: dict) -> List[dict]:
    """The run's "now" rows, each with the model's roofline and overhead seconds added."""
    settings, environment = doc["settings"], doc["environment"]
    if settings.get("pair"):
        raise SpecPilotError("the rounds were measured on a trained pair: give a run on preset "
                             "shapes (random weights), whose model specs are known")
    key = gpu_key(environment["gpu"])
    if environment.get("device") != "cuda" or key == "cpu":
        raise SpecPilotError("the rounds were not measured on a GPU: off one tree_round_cost.py "
                             "runs eagerly in float32 (a check of the script), not what the "
                             "model prices")
    gpu = gpu_spec(key)
    stock = apply(stock_program(preset_deployment(settings["shapes"], key, settings["scale"])),
                  CaptureGraphs(on=True))
    out = []
    for row in doc["rows"]:
        if row["variant"] != "now":
            continue
        topology = topology_from_key(row["topology"])
        program = with_topology(stock, topology)
        program = replace(program, batch=replace(program.batch, max_batch_size=row["batch"]))
        # The measured rounds accept nothing of random drafts: price them accepting nothing.
        roofline, overhead = summed_seconds(
            step_nodes(program, gpu, row["batch"], settings["context"], 0.0), gpu)
        out.append({**{k: row[k] for k in ("batch", "topology", "nodes", "depth", "round_ms")},
                    # the cache the round ran on (runs since the eighteenth set say it): the
                    # model prices the context alone, the masked attention walks every slot
                    "cache_slots": row.get("cache_slots"),
                    "chain": isinstance(topology, Chain),
                    "roofline_ms": 1e3 * roofline, "overhead_ms": 1e3 * overhead})
    return out


def cache_caveats(rows: List[dict]) -> List[str]:
    """What the rows' caches say about their verdicts: the masked attention walks every slot
    and looked dearer over an odd count (BENCHMARKS.md, eighteenth set), so rows of unknown
    caches (runs before the cache count was kept) or of odd ones are not clean against the
    chains' fit."""
    out = []
    unknown = sorted({r["topology"] for r in rows if r.get("cache_slots") is None})
    if unknown:
        out.append(f"no cache slot count for {len(unknown)} topologies: a run before the count "
                   "was kept (until commit 257fa8f its caches grew with the span)")
    odd = sorted({f"{r['topology']} ({r['cache_slots']})" for r in rows
                  if r.get("cache_slots") is not None and r["cache_slots"] % 2})
    if odd:
        out.append("odd slot counts: " + ", ".join(odd))
    return out


def fit_on_chains(rows: List[dict]):
    """(alpha, beta) by least squares on the chain rows: round ms = alpha x roofline ms +
    beta x overhead ms. A SpecPilotError where the chains cannot tell the two apart."""
    import numpy as np

    chains = [r for r in rows if r["chain"]]
    a = np.array([[r["roofline_ms"], r["overhead_ms"]] for r in chains]).reshape(-1, 2)
    if np.linalg.matrix_rank(a) < 2:
        raise SpecPilotError("the chain rows cannot separate the roofline from the overhead: "
                             "measure a chain at two batch sizes at least")
    alpha, beta = np.linalg.lstsq(a, np.array([r["round_ms"] for r in chains]), rcond=None)[0]
    if not (alpha > 0 and beta >= 0):
        raise SpecPilotError(f"the chain rows fit alpha {alpha:.3g}, beta {beta:.3g}: a round "
                             "cannot cost less for more work; measure the chains again")
    return float(alpha), float(beta)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", required=True, help="a bench/tree_round_cost.py result")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        doc = json.loads(Path(args.rounds).read_text())
        rows = priced_rows(doc)
        alpha, beta = fit_on_chains(rows)
    except (OSError, ValueError, KeyError, SpecPilotError) as exc:
        ap.error(f"{args.rounds}: {exc}")
    caveats = cache_caveats(rows)
    for line in caveats:
        print(f"caveat: {line}")
    for r in rows:
        r["predicted_ms"] = alpha * r["roofline_ms"] + beta * r["overhead_ms"]
        r["measured_over_predicted"] = r["round_ms"] / r["predicted_ms"]
        print(f"batch {r['batch']:3d} {r['topology']:58s} measured {r['round_ms']:.3f} ms, "
              f"predicted {r['predicted_ms']:.3f} ({r['measured_over_predicted']:.2f}x)")
    write_json_atomic(Path(args.out), {"rounds": args.rounds, "environment": doc["environment"],
                                       "alpha": alpha, "beta": beta, "caveats": caveats,
                                       "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
