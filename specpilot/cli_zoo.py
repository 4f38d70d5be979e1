"""`specpilot zoo`: train (or reuse) a real target/drafter pair from a preset; list the presets."""
from __future__ import annotations

import json


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "zoo", help="train small real target/drafter pairs on local Python source",
        description="Train a target/drafter pair (Llama architecture, shared byte-level BPE "
                    "tokenizer) on the standard library's Python source, the drafter distilled "
                    "from the target. Pairs are cached and reused.")
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
    held = report["heldout"]
    print(f"target:  {pair_dir / 'target'}  ({report['target_parameters']:,} params, "
          f"held-out loss {held['target_loss']:.3f})")
    print(f"drafter: {pair_dir / 'drafter'}  ({report['drafter_parameters']:,} params, "
          f"held-out loss {held['drafter_loss']:.3f})")
    print(f"agreement (drafter argmax == target argmax): {held['agreement']:.3f}")
    return 0


def run_list(args) -> int:
    from specpilot.zoo.presets import PRESETS

    for name, p in PRESETS.items():
        t, d = p.target, p.drafter
        print(f"{name:10s} device {p.device:4s} vocab {p.vocab_size:5d}  "
              f"target {t.layers}x{t.hidden} (kv {t.kv_heads}/{t.heads})  "
              f"drafter {d.layers}x{d.hidden} (kv {d.kv_heads}/{d.heads})  "
              f"steps {p.target_schedule.steps}+{p.drafter_schedule.steps} "
              f"x {p.batch_size}x{p.seq_len} tokens")
    return 0
