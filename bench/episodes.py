"""A GRPO step's multi-turn episodes played together (``zoo.gpt.tune.episodes.play_groups``) against the same
episodes played one at a time (``play``, each with its own cache: what a step did before), same net, same seeds,
the same draws (each episode its own generator, checked: both arms play the same episodes).

The workload is ``configs/gpt/grpo_guess_number.yaml``'s: R = 4 seeds x 8 episodes of zoo/GuessNumber-v0, at most 10
turns of 16 tokens, temperature 1, each episode within the net's block_size; the net a small byte-level GPT (4 layers,
width 128, 4 heads, block_size 512, random weights: its replies are babble, so every turn runs to its budget and the
env answers each with its reminder, until max_turns or block_size ends the episode). Reported: episodes per CPU
second of this process (user + system), best of ``--repeats``, and the sampled tokens per CPU second.

    OMP_NUM_THREADS=1 nice -n 10 python bench/episodes.py                 # about a minute of CPU
    python bench/episodes.py --seeds 1 --group 2 --max-turns 2 --repeats 1   # a smoke run of seconds
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from zoo.gpt import GPT
from zoo.gpt.tune import episodes as E
from zoo.io.tokenizers import ByteTokenizer


def cpu_seconds() -> float:
    return time.process_time()  # this process's user + system time: wall time lies on a shared machine


def main(argv: list[str] | None = None) -> dict[str, float | bool]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=4, help="env seeds per step (B)")
    p.add_argument("--group", type=int, default=8, help="episodes per seed (G)")
    p.add_argument("--max-turns", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--block-size", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--arms", nargs="+", default=["alone", "together"], choices=["alone", "together"])
    args = p.parse_args(argv)
    torch.manual_seed(0)
    net = GPT(vocab_size=257, block_size=args.block_size, n_layer=4, n_embd=128, n_head=4).eval()
    source, tok = E.EnvSource("zoo/GuessNumber-v0"), ByteTokenizer()
    envs = E.EnvRows(source.make)
    scaffold, settings = E.scaffold_for(tok, envs.first), E.Episodes(max_turns=args.max_turns)
    seeds = list(range(args.seeds))
    rows = [s for s in seeds for _ in range(args.group)]
    settings_args = (scaffold, settings, args.max_new_tokens, 1.0)

    def alone(generators) -> list[E.Episode]:
        env = envs.first
        return [E.play(net, env, seed, *settings_args, generator=g) for seed, g in zip(rows, generators)]

    def together(generators) -> list[E.Episode]:
        return E.play_all(net, envs.rows(len(rows)), rows, *settings_args, generators=generators)

    out, played = {}, {}
    for arm in args.arms:
        best = float("inf")
        for _ in range(args.repeats):
            torch.manual_seed(1)
            generators = E.sampling_generators(len(rows), torch.device("cpu"))  # the same draws in either arm
            start = cpu_seconds()
            played[arm] = (alone if arm == "alone" else together)(generators)
            best = min(best, cpu_seconds() - start)
        tokens = sum(sum(e.policy) for e in played[arm])
        out[arm] = len(rows) / best
        print(
            f"{arm:>8}: {len(rows)} episodes ({tokens} sampled tokens, {tokens / len(rows):.0f} an episode) in "
            f"{best:.2f} CPU s: {len(rows) / best:.2f} episodes per CPU second, {tokens / best:.0f} tokens per CPU s"
        )
    if len(out) == 2:
        same = [e.ids for e in played["alone"]] == [e.ids for e in played["together"]]
        print(f"together / alone: {out['together'] / out['alone']:.2f}x; the same episodes: {same}")
        out["same"] = same
    return out


if __name__ == "__main__":
    main()
