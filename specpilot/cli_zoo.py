"""`specpilot zoo`: train (or reuse) a real target/drafter pair from a preset; list the presets."""
from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "zoo", help="train small real target/drafter pairs on local Python source",
        description="Train a target/drafter pair (Llama architecture, shared byte-level BPE "
                    "tokenizer) on local Python source (the standard library, or with the GPU "
                    "preset also site-packages), the drafter distilled from the target, and "
                    "measure its greedy chain speculation on HumanEval prompts. Pairs are cached "
                    "and reused.")
    sub = parser.add_subparsers(dest="zoo_command", metavar="ZOO_COMMAND")
    sub.required = True

    train = sub.add_parser(
        "train", help="train a pair (or reuse the cached one) and optionally copy it to --out",
        description="Train the preset's pair with the seed, or reuse the cached one, and write "
                    "it as HF checkpoint folders target/ and drafter/ with train_report.json.")
    train.add_argument("--preset", default="tiny", help="preset name (see `specpilot zoo list`)")
    train.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    train.add_argument("--out", metavar="DIR",
                       help="also place the pair in DIR (new or empty; a previous pair with --force)")
    train.add_argument("--force", action="store_true",
                       help="retrain even if cached, and replace a pair already in --out")
    train.add_argument("--cache-dir", metavar="DIR",
                       help="cache folder (default $SPECPILOT_CACHE/zoo or ~/.cache/specpilot/zoo)")
    train.set_defaults(handler=run_train)

    listing = sub.add_parser("list", help="list the presets and their model sizes",
                             description="List the zoo presets and their model sizes.")
    listing.set_defaults(handler=run_list)


def run_train(args) -> int:
    from specpilot.zoo.cache import ensure_pair, place_pair

    target_dir, drafter_dir = ensure_pair(args.preset, seed=args.seed, cache_dir=args.cache_dir,
                                          progress=lambda line: print(line, flush=True),
                                          force=args.force)
    pair_dir = target_dir.parent
    if args.out:
        pair_dir = place_pair(pair_dir, args.out, force=args.force)
    report = json.loads((pair_dir / "train_report.json").read_text())
    for line in report_lines(report, pair_dir):
        print(line)
    return 0


def report_lines(report: dict, pair_dir) -> list:
    """The summary of a train_report.json that `zoo train` prints."""
    held = report["heldout"]
    lines = [
        f"target:  {pair_dir / 'target'}  ({report['target_parameters']:,} params, "
        f"held-out loss {held['target_loss']:.3f})",
        f"drafter: {pair_dir / 'drafter'}  ({report['drafter_parameters']:,} params, "
        f"held-out loss {held['drafter_loss']:.3f})",
    ]
    if held["target_loss"] < held["drafter_loss"]:
        lines.append(f"held-out loss: target {held['target_loss']:.3f} < drafter "
                     f"{held['drafter_loss']:.3f}")
    else:
        lines.append(f"WARNING: held-out loss of the target ({held['target_loss']:.3f}) is not "
                     f"below the drafter's ({held['drafter_loss']:.3f}): the target is under-trained")
    lines.append(f"agreement (drafter argmax == target argmax): {held['agreement']:.3f}")
    for role, stage in report.get("stages", {}).items():
        if stage.get("stopped_early_at_step") is not None:
            lines.append(f"{role} stopped early at step {stage['stopped_early_at_step']} of "
                         f"{stage['planned_steps']} (stage time limit)")
        elif stage.get("rescheduled_to") is not None:
            lines.append(f"{role} schedule refitted to {stage['rescheduled_to']} of "
                         f"{stage['planned_steps']} steps (stage time limit)")
    spec = report.get("speculation") or {}
    if "chain" in spec:
        for k, r in spec["chain"].items():
            lines.append(f"greedy chain k={k}: mean accepted {r['mean_accepted']:.3f}, "
                         f"{r['tokens_per_target_forward']:.3f} tokens per target forward "
                         f"({spec['prompts']} HumanEval prompts x {spec['max_new_tokens']} "
                         f"new tokens, {spec['dtype']})")
    elif "skipped" in spec:
        lines.append(f"speculation eval skipped: {spec['skipped']}")
    secs = report.get("seconds", {})
    phases = [f"{name} {secs[name]:.1f}s" for name in
              ("corpus", "tokenizer", "encode", "target", "drafter", "evaluate", "save")
              if name in secs]
    if "total" in secs:
        line = f"time: {secs['total']:.1f}s training ({', '.join(phases)})"
        if "speculation_eval" in secs:
            line += f" + {secs['speculation_eval']:.1f}s speculation eval"
        lines.append(line)
    return lines


def run_list(args) -> int:
    from specpilot.zoo.presets import PRESETS

    for name, p in PRESETS.items():
        t, d = p.target, p.drafter
        print(f"{name:10s} device {p.device:4s} corpus {p.corpus:10s} vocab {p.vocab_size:5d}  "
              f"target {t.layers}x{t.hidden} (kv {t.kv_heads}/{t.heads}, "
              f"{_count(t.parameter_count(p.vocab_size))})  "
              f"drafter {d.layers}x{d.hidden} (kv {d.kv_heads}/{d.heads}, "
              f"{_count(d.parameter_count(p.vocab_size))})  "
              f"steps {p.target_schedule.steps}+{p.drafter_schedule.steps} "
              f"x {p.batch_size}x{p.seq_len} tokens")
    return 0


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"
