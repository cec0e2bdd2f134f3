"""A step's envs stepped at once on threads (``Episodes.env_threads``, ``zoo.gpt.tune.env_steps``) against one after
another (``env_threads=1``), when every env step waits (``step_latency``, a remote tool's round trip).

Each arm is one ``play_all`` of R = ``--seeds`` x ``--group`` zoo/GuessNumber-v0 episodes (the GRPO configs' 4 x 8
by default) of a tiny random-weight byte-level GPT, at most ``--max-turns`` turns of ``--max-new-tokens`` tokens at
temperature 1 (a random net never guesses in the game's format, so every episode runs all its turns), the same
sampling seeds in both arms (checked: both play the same episodes). Reported per latency and arm, the median over
``--repeats`` runs, the arms alternating (ABBA) so load drift on a shared machine hits both alike: wall seconds and
CPU seconds (this process's user + system, every thread) per ``play_all``, and what the envs' waits alone would
take one after another (R x turns x latency) or at once (turns x latency).

    OMP_NUM_THREADS=1 nice -n 10 python bench/env_steps.py                 # about 10 CPU seconds
    python bench/env_steps.py --latencies 0.02 --seeds 1 --group 2 --repeats 1   # a smoke run of seconds
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from zoo.gpt import GPT
from zoo.gpt.tune import episodes as E
from zoo.io.tokenizers import ByteTokenizer

ENV_ID = "zoo/GuessNumber-v0"


def play(net, latency: float, threads: int, args, rows: list[int]) -> tuple[float, float, list[E.Episode]]:
    """One ``play_all`` of the rows' episodes: wall s, CPU s, the episodes."""
    source = E.EnvSource(ENV_ID, {"step_latency": latency, "max_turns": args.max_turns})
    envs = E.EnvRows(source.make)
    scaffold = E.scaffold_for(ByteTokenizer(), envs.first)
    settings = E.Episodes(max_turns=args.max_turns, env_threads=threads)
    envs.rows(len(rows))  # made before the clock starts, as GRPO keeps them across steps
    torch.manual_seed(1)
    generators = E.sampling_generators(len(rows), torch.device("cpu"))  # the same draws in either arm
    wall, cpu = time.perf_counter(), time.process_time()
    episodes = E.play_all(
        net, envs.rows(len(rows)), rows, scaffold, settings, args.max_new_tokens, 1.0, None, generators
    )
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    envs.close()
    return wall, cpu, episodes


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--latencies", type=float, nargs="+", default=[0.0, 0.02, 0.05], help="the env's step_latency, s")
    p.add_argument("--seeds", type=int, default=4, help="env seeds per step (B)")
    p.add_argument("--group", type=int, default=8, help="episodes per seed (G)")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=32, help="the threaded arm's env_threads")
    p.add_argument("--repeats", type=int, default=4, help="runs of each arm, alternating (ABBA)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    net = GPT(vocab_size=257, block_size=512, n_layer=2, n_embd=64, n_head=4).eval()
    rows = [s for s in range(args.seeds) for _ in range(args.group)]
    arms = {"one after another": 1, f"{args.threads} threads": args.threads}
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"== {len(rows)} {ENV_ID} episodes per play_all, the envs stepped one after another or on threads")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} torch thread(s); load average at start: {load}")
    out, played, start = {}, {}, time.process_time()
    for latency in args.latencies:
        runs = {arm: [] for arm in arms}
        for r in range(args.repeats):
            for arm in list(arms) if r % 2 == 0 else list(arms)[::-1]:
                wall, cpu, episodes = play(net, latency, arms[arm], args, rows)
                runs[arm].append((wall, cpu))
                played[arm] = [(e.ids, e.logps, e.turn_rewards, e.ended) for e in episodes]
                turns = max(e.turns for e in episodes)
        same = len({repr(v) for v in played.values()}) == 1
        for arm, measured in runs.items():
            wall, cpu = (statistics.median(x) for x in zip(*measured))
            out[(latency, arm)] = {"wall_s": wall, "cpu_s": cpu, "same": same}
            waits = len(rows) * turns * latency if arms[arm] == 1 else turns * latency
            print(
                f"{latency * 1e3:4.0f} ms  {arm:>17}: {wall:6.2f} wall s ({min(m[0] for m in measured):.2f}.."
                f"{max(m[0] for m in measured):.2f}), {cpu:5.2f} CPU s per play_all; the waits alone {waits:.2f} s"
            )
        threaded, alone = out[(latency, list(arms)[1])], out[(latency, list(arms)[0])]
        print(
            f"{latency * 1e3:4.0f} ms  threads / one after another: wall {threaded['wall_s'] / alone['wall_s']:.2f}x, "
            f"CPU {threaded['cpu_s'] / alone['cpu_s']:.2f}x; {turns} turns; the same episodes: {same}"
        )
    print(f"this run: {time.process_time() - start:.1f} CPU s; load average at the end: {os.getloadavg()[0]:.2f}")
    return out


if __name__ == "__main__":
    main()
