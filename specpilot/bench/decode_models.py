"""The models and prompts of a bench script that times graphed decoders: a trained pair with the
first prompts of its workload, or random-weight shape presets with random prompts (and a
useless drafter)."""
from __future__ import annotations

import argparse

import torch

from specpilot.bench.shapes import random_pair
from specpilot.runtime.graphed_program import rounded_capacity


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    """The options `decode_models` reads."""
    ap.add_argument("--shapes", default="zoo-gpu-small:zoo-gpu-small-drafter",
                    help="random-weight shape presets TARGET:DRAFTER (without --pair)")
    ap.add_argument("--pair", metavar="DIR",
                    help="a trained pair (target/ and drafter/) instead of random weights: its "
                         "own drafter and the first prompts of --workload")
    ap.add_argument("--workload", default="humaneval", help="with --pair: humaneval or a file")
    ap.add_argument("--prompt-len", type=int, default=64, help="random prompts' length")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="random-weight shapes scaled down (to check a script off a GPU)")


def decoder_capacity(prompts, new_tokens: int, k: int) -> int:
    """Cache slots for `prompts` and `new_tokens` with chains of up to `k` drafts: the longest
    prompt, the new tokens and two rounds' span, every decoder of a comparison the same;
    rounded up as a decode's cache is (`rounded_capacity`)."""
    return rounded_capacity(max(len(p) for p in prompts) + new_tokens + 2 * k + 2)


def mid_run_context(prompts, new_tokens: int) -> int:
    """The context a script times rounds or steps at: the longest prompt plus half the new
    tokens, where a call's rounds are halfway through (every row's cache holds it)."""
    return max(len(p) for p in prompts) + new_tokens // 2


def decode_models(args, count: int):
    """(target, drafter, prompts, eos ids, graphs) for `count` prompts, by the options of
    `add_model_arguments`: bf16 and captured on a CUDA GPU, else float32 and eager. A
    SpecPilotError where the workload has too few prompts or the pair folder is unusable."""
    if args.pair:
        graphs = torch.cuda.is_available()
        from specpilot.bench.pair_bench import pair_dirs
        from specpilot.bench.workload import workload_texts
        from specpilot.runtime.decoder import load_pair

        # the prompts first: a short workload is refused before the models load
        texts = workload_texts(args.workload, count, f"{count} prompts (the largest batch)")
        pair = load_pair(*pair_dirs(args.pair), "bfloat16" if graphs else "float32",
                         "cuda" if graphs else "cpu")
        return (pair.target, pair.drafter, [pair.encode(t) for t in texts],
                list(pair.eos_ids), graphs)
    target, useless, graphs = random_pair(args.shapes, args.scale)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, target.config.vocab_size, (count, args.prompt_len),
                            generator=gen).tolist()
    return target, useless, prompts, [], graphs
