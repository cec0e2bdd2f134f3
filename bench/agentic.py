"""Why the actor pool matters, measured: GRPO on a text environment whose every step waits (``step_latency``, a
remote tool's round trip), synchronous episodes against actor processes playing them (``async_actors``).

A synchronous learner plays each step's episodes itself, so it waits out every env step before it updates; IMPALA's
split (``zoo.gpt.tune.async_episodes`` on ``zoo.train.actor_pool``) has actors wait instead while the learner
updates on the episodes they played a step or two ago. Each arm is one ``Trainer.fit`` of ``GRPOModule`` on
``zoo/GuessNumber-v0`` (``EpisodeDataModule``), from the same random-weight net, seed and settings:

  - ``sync``: ``async_actors=0``, the learner plays its episodes;
  - ``async-N``: N actor processes play them (one thread each), the learner corrects their staleness.

A random net never guesses in the game's format, so every episode runs ``--turns`` turns of about ``--new-tokens``
sampled tokens: the same work in every arm (the table's tokens per episode say so). Per arm, over the steps after the
first (which holds the actors' start):

  - episodes/s: episodes the learner trained on per wall second (and per CPU second of the learner and the actors);
  - learner busy: the share of the wall time the learner spent in its update, from the first forward with gradients
    of each optimizer step to the end of that step (forward, backward, clipping, optimizer: a torch global forward
    pre-hook and the optimizer's step post-hook, set from a Lightning callback; rescoring a stale episode without
    gradients and sampling do not count); "busy CPU" is the learner's CPU seconds in those intervals over the wall
    seconds: where it is below "busy", the update was waiting for a core (actors or other jobs had it);
  - CPU s: user + system seconds of the learner and of the actor processes (Linux /proc; slots sampled ahead and
    never used count too).

Arms alternate (ABBA over the repeats) at each latency, so load drift on a shared machine hits every arm alike:

    python bench/agentic.py                                   # ~2 CPU minutes on 2 cores
    python bench/agentic.py --latencies 0 0.02 0.05 --actors 2 4 --repeats 3 --steps 10
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from lightning.pytorch import Callback, Trainer, seed_everything  # noqa: E402

from bench._common import cpu_model, table  # noqa: E402

ENV_ID = "zoo/GuessNumber-v0"


@dataclass(frozen=True)
class Setup:
    """What every arm shares: the net, the episodes and the update."""

    n_layer: int = 4
    n_embd: int = 128
    block_size: int = 384
    seeds_per_step: int = 2  # B
    group_size: int = 4  # G: B * G episodes a step
    turns: int = 4  # replies per episode (the env's max_turns and episodes.max_turns)
    new_tokens: int = 8  # a turn's token budget
    lr: float = 1e-4

    @property
    def episodes_per_step(self) -> int:
        return self.seeds_per_step * self.group_size


def make_net(setup: Setup):
    from zoo.gpt import GPT, GeluMLP

    return GPT(
        vocab_size=257,
        block_size=setup.block_size,
        n_layer=setup.n_layer,
        n_embd=setup.n_embd,
        n_head=4,
        dropout=0.0,
        mlp=partial(GeluMLP, approximate="exact"),
    )


def make_module(setup: Setup, weights: dict, actors: int):
    from zoo.gpt import GRPOModule
    from zoo.gpt.generate import Generation
    from zoo.io.tokenizers import ByteTokenizer
    from zoo.train.optim import AdamWCosine

    net = make_net(setup)
    net.load_state_dict(weights)
    module = GRPOModule(
        net,
        rewards=[],  # an episode's reward is the env's
        group_size=setup.group_size,
        episodes={"max_turns": setup.turns},
        async_actors=actors,
        generation=Generation(max_new_tokens=setup.new_tokens),
        optimizer=AdamWCosine(lr=setup.lr, weight_decay=0.0, warmup_steps=0, min_lr_ratio=1.0),
    )
    module.tokenizer = ByteTokenizer()
    return module


def make_data(setup: Setup, latency: float):
    from datamodules import EpisodeDataModule

    env_kwargs = {"max_turns": setup.turns, "step_latency": latency}
    return EpisodeDataModule(
        ENV_ID, env_kwargs, "bytes", train_seeds=10_000, val_seeds=1, test_seeds=1, batch_size=setup.seeds_per_step
    )


def process_cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of live processes ``pids`` (Linux /proc; 0 for one that is gone)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime: fields 14 and 15 of proc_pid_stat(5)
    return total


class LearnerClock(Callback):
    """Wall (and CPU) seconds the learner spends updating: each interval opens at the net's first forward with
    gradients and closes when the optimizer's step returns. Also the wall, learner CPU and actors' CPU seconds at each
    step's end, to count from the end of step 1 (``window``)."""

    def __init__(self) -> None:
        self.busy = self.busy_cpu = 0.0
        self.opened: tuple[float, float] | None = None
        self.handles, self.marks = [], []
        self.staleness: list[float] = []

    def on_train_start(self, trainer, pl_module) -> None:
        net = pl_module.net

        def opened(module, args) -> None:
            if module is net and self.opened is None and torch.is_grad_enabled():
                self.opened = time.perf_counter(), time.process_time()

        def closed(optimizer, args, kwargs) -> None:
            if self.opened is not None:
                self.busy += time.perf_counter() - self.opened[0]
                self.busy_cpu += time.process_time() - self.opened[1]
                self.opened = None

        # global, not the net's own hook: the actors get a pickled copy of the net, which a closure cannot be part of
        self.handles = [torch.nn.modules.module.register_module_forward_pre_hook(opened)]
        self.handles += [opt.register_step_post_hook(closed) for opt in trainer.optimizers]

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        actors = pl_module.actors
        actor_cpu = process_cpu_seconds([p.pid for p in actors.processes]) if actors is not None else 0.0
        self.marks.append((time.perf_counter(), time.process_time(), actor_cpu, self.busy, self.busy_cpu))
        if actors is not None:
            self.staleness.append(float(trainer.callback_metrics["train/staleness"]))

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def window(self) -> dict[str, float]:
        """Wall s, learner CPU s, actors' CPU s, busy wall and CPU s from the end of step 1 to the end of the last
        step."""
        first, last = self.marks[0], self.marks[-1]
        names = ("wall_s", "learner_cpu_s", "actor_cpu_s", "busy_s", "busy_cpu_s")
        return {name: b - a for name, a, b in zip(names, first, last)}


def run_arm(setup: Setup, weights: dict, actors: int, latency: float, steps: int, seed: int = 0) -> dict:
    """One fit of ``steps`` learner steps; the figures over steps 2..``steps``."""
    if steps < 2:
        raise SystemExit("--steps is 2 or more: the figures count from the end of step 1")
    seed_everything(seed, verbose=False)
    module, data, clock = make_module(setup, weights, actors), make_data(setup, latency), LearnerClock()
    policy_tokens: list[float] = []
    tokens = Tokens(policy_tokens)
    trainer = Trainer(
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        log_every_n_steps=1,
        callbacks=[clock, tokens],
        accelerator="cpu",
    )
    try:
        trainer.fit(module, data)
    finally:
        clock.close()
        module.stop_actors()
    out = clock.window()
    episodes = (steps - 1) * setup.episodes_per_step
    cpu = out["learner_cpu_s"] + out["actor_cpu_s"]
    return {
        **out,
        "episodes": episodes,
        "cpu_s": cpu,
        "episodes_per_s": episodes / out["wall_s"],
        "episodes_per_cpu_s": episodes / cpu,
        "busy": out["busy_s"] / out["wall_s"],
        "busy_cpu": out["busy_cpu_s"] / out["wall_s"],
        "tokens_per_episode": statistics.mean(policy_tokens[1:]),
        "staleness": statistics.mean(clock.staleness[1:]) if clock.staleness[1:] else 0.0,
    }


class Tokens(Callback):
    """The policy's sampled tokens per episode of each step (``train/policy_tokens``)."""

    def __init__(self, out: list[float]) -> None:
        self.out = out

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.out.append(float(trainer.callback_metrics["train/policy_tokens"]))


def arm_name(actors: int) -> str:
    return "sync" if actors == 0 else f"async-{actors}"


def run_row(out: dict) -> list:
    """One run's row of the table."""
    return [
        f"{out['latency'] * 1e3:.0f} ms",
        arm_name(out["actors"]),
        out["repeat"],
        out["episodes"],
        f"{out['tokens_per_episode']:.1f}",
        *(f"{out[k]:.2f}" for k in ("wall_s", "cpu_s", "learner_cpu_s", "episodes_per_s", "episodes_per_cpu_s")),
        f"{out['busy']:.1%}",
        f"{out['busy_cpu']:.1%}",
        f"{out['staleness']:.2f}",
    ]


def summary(rows: list[dict], latencies: list[float], arms: list[int], clock: str) -> str:
    """Per latency and arm: the median episodes/s and learner-busy share over the repeats, and each against sync's."""
    key = "episodes_per_s" if clock == "wall" else "episodes_per_cpu_s"
    out = []
    for latency in latencies:
        med = {}
        for actors in arms:
            runs = [r for r in rows if r["latency"] == latency and r["actors"] == actors]
            med[actors] = {
                k: statistics.median(r[k] for r in runs) for k in (key, "busy", "busy_cpu", "wall_s", "cpu_s")
            }
            spread = f"{min(r[key] for r in runs):.2f}..{max(r[key] for r in runs):.2f}"
            out.append(
                [
                    f"{latency * 1e3:.0f} ms",
                    arm_name(actors),
                    len(runs),
                    f"{med[actors][key]:.2f}",
                    spread,
                    f"{med[actors][key] / med[0][key]:.2f}x",
                    f"{med[actors]['busy']:.1%}",
                    f"{med[actors]['busy_cpu']:.1%}",
                    f"{med[actors]['wall_s']:.1f}",
                    f"{med[actors]['cpu_s']:.1f}",
                ]
            )
    unit = "episodes/s" if clock == "wall" else "episodes/CPU s"
    headers = ["latency", "arm", "runs", f"{unit} med", "min..max", "vs sync", "busy med", "busy CPU med"]
    headers += ["wall s", "CPU s"]
    return table(headers, out)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latencies", type=float, nargs="+", default=[0.0, 0.05], help="the env's step_latency, s")
    ap.add_argument("--actors", type=int, nargs="+", default=[2], help="async arms: actor processes each")
    ap.add_argument("--steps", type=int, default=6, help="learner steps per arm (figures from the end of step 1)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of every arm, alternating (ABBA)")
    ap.add_argument("--threads", type=int, default=1, help="the learner's torch threads (an actor uses 1)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="the rate the summary compares")
    ap.add_argument("--seed", type=int, default=0)
    for name, default in vars(Setup()).items():
        ap.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = ap.parse_args(argv)
    from zoo.errors import InputError
    from zoo.gpt.tune.envs.base import check_latency

    try:
        [check_latency(latency) for latency in args.latencies]
    except InputError as err:
        raise SystemExit(f"error: --latencies: {err}") from None
    setup = Setup(**{k: getattr(args, k) for k in vars(Setup())})
    torch.set_num_threads(args.threads)
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    arms = [0, *args.actors]
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"== GRPO on {ENV_ID} with step_latency: synchronous episodes against the actor pool")
    print(
        f"torch {torch.__version__}; CPU: {cpu_model()}; {os.cpu_count()} CPUs; learner threads "
        f"{torch.get_num_threads()}, 1 per actor; load average (1/5/15 min) at start: {load}"
    )
    print(f"{setup}; {args.steps} learner steps per arm, {setup.episodes_per_step} episodes a step; arms alternate")
    seed_everything(args.seed, verbose=False)
    weights = make_net(setup).state_dict()
    rows, runs = [], []
    for r in range(args.repeats):
        for latency in args.latencies:
            for actors in arms if r % 2 == 0 else arms[::-1]:
                out = run_arm(setup, weights, actors, latency, args.steps, args.seed)
                out |= {"latency": latency, "actors": actors, "repeat": r}
                rows.append(out)
                runs.append(run_row(out))
                print(f"  done: {runs[-1][0]} {runs[-1][1]} repeat {r}", flush=True)
    headers = ["latency", "arm", "repeat", "episodes", "tok/episode", "wall s", "CPU s", "learner CPU s"]
    headers += ["episodes/s", "episodes/CPU s", "learner busy", "busy CPU", "staleness"]
    print(table(headers, runs))
    print(
        "from the end of step 1 to the end; CPU s: the learner's and the actors' user + system seconds; busy CPU: "
        "the learner's CPU seconds in its updates over the wall's (below learner busy: the update waited for a core)\n"
    )
    print(summary(rows, args.latencies, arms, args.clock))
    print(f"load average at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return rows


if __name__ == "__main__":
    main()
