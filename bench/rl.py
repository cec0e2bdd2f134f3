"""RL figures: collection env-steps/s (sync vs async vector envs), learner updates/s, and the wall-clock time
to PPO's CartPole-v1 result, next to Stable-Baselines3's tuned PPO when ``stable_baselines3`` is importable
(this script installs nothing).

The result: the mean return of 10 deterministic episodes on CartPole-v1 reaches 475, evaluated every 2048 env
steps (8 rollouts of 8 envs x 32 steps), within a 50k env-step budget, for seeds 0, 1, 2. Each run goes
through ``cli.py``'s parser with ``configs/rl/ppo_cartpole.yaml`` (no logger, no checkpoints: the timer is
the only callback) and stops at the first evaluation that reaches the target. "train s" is the wall clock
from the start of training to that evaluation without the time spent evaluating; "total s" includes it.
SB3 runs the same protocol: rl-baselines3-zoo's CartPole hyperparameters (n_envs 8, n_steps 32,
batch_size 256, n_epochs 20, gamma 0.98, gae_lambda 0.8, lin_0.001 learning rate, lin_0.2 clip range) with
linear schedules over the same 50k budget, evaluated by ``evaluate_policy`` on 10 envs every 2048 steps.
Both sides are evaluated at the same points, after that rollout's update (SB3's ``on_step`` fires before its
``train()``, so its evaluation runs at the next ``on_rollout_start``, or after ``learn`` for the last one), and
from the same start states (env i of 10 reset with seed 10_000 + i at every evaluation, the zoo's
``eval_seed``). Runs alternate between the two (zoo seed 0, SB3 seed 0, zoo seed 1, ...) so that drift in a
shared machine's load spreads over both. Both use one intra-op thread. The summary gives the median and
interquartile range over all seeds, a seed that never reaches the target ranking last; the race needs at
least 10 seeds to rank anything (three spread 6k-43k env steps):

    python bench/rl.py --only cartpole --seeds 0 1 2 3 4 5 6 7 8 9   # ~3 min on 2 busy cores, SB3 installed

On a CPU-only machine with a CUDA build of PyTorch, Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1, which
makes every Adam step probe NVML (~0.2-0.3 ms, as long as a PPO minibatch update); with ``--device cpu``
(default) this script hides CUDA (CUDA_VISIBLE_DEVICES="") before importing torch, as a CPU run should.

    python bench/rl.py                         # all figures, seeds 0 1 2 (~2 min on 2 busy CPU cores)
    python bench/rl.py --only cartpole --seeds 0
    python bench/rl.py --only a2c              # A2C to 475 on CartPole-v1 within 500k env steps
    python bench/rl.py --only pendulum         # PPO (Gaussian policy) to -300 on Pendulum-v1
    python bench/rl.py --only sac              # SAC to -200 on Pendulum-v1 within 20k, and env steps/s vs SB3
    python bench/rl.py --only impala           # IMPALA env steps/s vs synchronous PPO; time to 475 on CartPole-v1

SAC (``--only sac``): the same protocol on Pendulum-v1 with ``configs/rl/sac_pendulum.yaml`` (target -200,
budget 20k env steps, evaluations every 1000), next to SB3's SAC with the same hyperparameters (learning rate
1e-3 for actor, critics and temperature, buffer 100k, 1000 random warm-up steps, batch 256, tau 0.005, gamma
0.99, one update per env step, alpha learned from 1, 256 x 256 nets). "steps/s" is the env steps per second
of training once updates run (from the end of the warm-up to the result, evaluation time excluded): one
update per env step, so it is the rate of the whole update plus one env step.

IMPALA (``--only impala``): first the throughput, env steps/s, on CartPole-v1 with each agent's config through
``cli.py`` without evaluation: IMPALA's actors alone (an ``ActorPool`` emptied as fast as it fills), IMPALA
training (2 actor processes x 8 envs, the learner consuming 2 unrolls of 32 steps a step) and synchronous PPO
and A2C training (collection and updates in turn, one process). "first step s" is the wall clock from the start
of training to the end of the first step: IMPALA's includes starting the actors (the fork server's imports,
on its first run in a process only); "steps/s" counts from there to the end. Then the time to 475 as for PPO
(``configs/rl/impala_cartpole.yaml``, evaluations every 5120 env steps, budget 300k, learning rate annealed
over it); the throughput runs have started the fork server, so no seed pays its imports.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--only",
        choices=["collect", "learner", "cartpole", "a2c", "pendulum", "sac", "impala"],
        action="append",
        help="run only these parts (repeatable); default all",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--budget", type=int, default=50_000, help="env steps")
    p.add_argument("--no-sb3", action="store_true", help="skip SB3 even when it is importable")
    p.add_argument("--device", default="cpu", choices=["cpu"], help="only CPU figures are defined here")
    return p.parse_args()


# -- collection and learner throughput -------------------------------------------------------------------


def bench_collect(rollouts: int = 8) -> None:
    from datamodules import GymDataModule
    from zoo.rl import ActorCritic, RolloutCollector

    print("\ncollection, CartPole-v1, 8 envs x 128 steps, ActorCritic 64x64 (env + policy + buffer writes)")
    for mode in ("sync", "async"):
        dm = GymDataModule("CartPole-v1", num_envs=8, vectorization_mode=mode, seed=0)
        collector = RolloutCollector(dm.make_envs(), num_steps=128, seed=0)
        net = ActorCritic(4, 2)
        collector.collect(net)  # warm-up (and the async workers' start)
        t = time.perf_counter()
        steps = sum(collector.collect(net).env_steps for _ in range(rollouts))
        dt = time.perf_counter() - t
        collector.close()
        print(f"  {mode:5s}  {steps / dt:8.0f} env steps/s")


def bench_learner(updates: int = 400) -> None:
    import torch

    from zoo.rl import ActorCritic, ppo_loss
    from zoo.rl.losses import normalize
    from zoo.train.optim import AdamOrRMSprop

    torch.manual_seed(0)
    net = ActorCritic(4, 2)
    opt = AdamOrRMSprop(lr=1e-4, eps=1e-5).build(net)  # PPOModule's: AdamW on the decay groups, fused on a CPU
    obs, act = torch.randn(256, 4), torch.randint(0, 2, (256,))
    adv, ret, old_lp, old_v = torch.randn(256), torch.randn(256), torch.randn(256) - 1, torch.randn(256)

    def update() -> None:
        _, lp, ent, v = net.get_action_and_value(obs, act)
        out = ppo_loss(lp, old_lp, normalize(adv), v, old_v, ret, ent, 0.2)
        opt.zero_grad()
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        opt.step()

    for _ in range(50):
        update()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(updates):
        update()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    print(
        f"\nlearner, PPO minibatch of 256 rows, ActorCritic 64x64, fused AdamW, plain loop: "
        f"{updates / wall:.0f} updates/s ({wall / updates * 1e3:.2f} ms wall, {cpu / updates * 1e3:.2f} ms CPU)"
    )


# -- time to the CartPole result ---------------------------------------------------------------------------


EVAL_SEED, EVAL_EVERY = 10_000, 2048  # the zoo's GymDataModule.eval_seed; ppo_cartpole.yaml's 8 rollouts x 256


def zoo_run(seed: int, target: float, budget: int, config: str = "configs/rl/ppo_cartpole.yaml") -> dict:
    from lightning.pytorch import Callback

    from cli import main

    class TimeToReturn(Callback):
        def __init__(self) -> None:
            self.t0 = self.v0 = 0.0
            self.eval_s, self.hit, self.evals = 0.0, None, []

        def on_train_start(self, trainer, pl_module) -> None:
            self.t0 = time.perf_counter()

        def on_validation_start(self, trainer, pl_module) -> None:
            self.v0 = time.perf_counter()

        def on_validation_end(self, trainer, pl_module) -> None:
            now = time.perf_counter()
            self.eval_s += now - self.v0
            ret, steps = trainer.callback_metrics["val/return"].item(), int(pl_module.env_steps)
            self.evals.append((steps, round(ret)))
            if ret >= target and self.hit is None:
                self.hit = {"env_steps": steps, "train_s": now - self.t0 - self.eval_s, "total_s": now - self.t0}
                trainer.should_stop = True

    timer = TimeToReturn()
    args = [
        "--config",
        str(ROOT / config),
        f"--seed_everything={seed}",
        f"--model.init_args.total_env_steps={budget}",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.callbacks=[]",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    cli = main(args, run=False)
    cli.trainer.callbacks.append(timer)
    t = time.perf_counter()
    cli.trainer.fit(cli.model, cli.datamodule)
    return {"hit": timer.hit, "evals": timer.evals, "wall_s": time.perf_counter() - t}


def sb3_run(seed: int, target: float, budget: int) -> dict:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    eval_env = make_vec_env("CartPole-v1", n_envs=10, seed=EVAL_SEED)

    def evaluate(num_timesteps: int) -> float:
        # The zoo's Evaluator: every evaluation from the same start states (env i reset with 10_000 + i); SB3's
        # VecEnv applies a seed at its next reset only, so it is set again before each evaluation.
        eval_env.seed(EVAL_SEED)
        return evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)[0]

    class TimeToReturn(BaseCallback):
        """Evaluates every 2048 env steps *after* that rollout's update, as the zoo's validation does: SB3 calls
        ``on_step`` and ``on_rollout_end`` before ``train()``, ``on_rollout_start`` after it."""

        def __init__(self) -> None:
            super().__init__()
            self.t0, self.eval_s, self.hit, self.evals, self.last_eval = 0.0, 0.0, None, [], 0

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            return self.hit is None  # False ends learn() at the first step after the hit

        def _on_rollout_start(self) -> None:
            if self.num_timesteps == 0 or self.num_timesteps % EVAL_EVERY or self.hit is not None:
                return
            self.check()

        def check(self) -> None:
            v0 = time.perf_counter()
            ret = evaluate(self.num_timesteps)
            now = time.perf_counter()
            self.eval_s += now - v0
            self.evals.append((self.num_timesteps, round(ret)))
            self.last_eval = self.num_timesteps
            if ret >= target:
                self.hit = {
                    "env_steps": self.num_timesteps,
                    "train_s": now - self.t0 - self.eval_s,
                    "total_s": now - self.t0,
                }

    linear = lambda start: lambda remaining: remaining * start  # noqa: E731
    model = PPO(
        "MlpPolicy",
        make_vec_env("CartPole-v1", n_envs=8, seed=seed),
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    timer = TimeToReturn()
    t = time.perf_counter()
    model.learn(budget, callback=timer)
    # The last rollout's update has no rollout after it: its evaluation, when it falls on the grid, comes here.
    if timer.hit is None and model.num_timesteps % EVAL_EVERY == 0 and model.num_timesteps > timer.last_eval:
        timer.check()
    return {"hit": timer.hit, "evals": timer.evals, "wall_s": time.perf_counter() - t}


def bench_cartpole(seeds: list[int], target: float, budget: int, with_sb3: bool) -> None:
    runners = [("zoo PPO", zoo_run)] + ([("SB3 PPO", sb3_run)] if with_sb3 else [])
    time_to_return(runners, seeds, target, budget, "CartPole-v1")


def bench_a2c(seeds: list[int], target: float, budget: int = 500_000) -> None:
    """A2C with rl-zoo's CartPole hyperparameters (configs/rl/a2c_cartpole.yaml), evaluated every 10k steps."""
    run = lambda seed, target, budget: zoo_run(seed, target, budget, "configs/rl/a2c_cartpole.yaml")  # noqa: E731
    time_to_return([("zoo A2C", run)], seeds, target, budget, "CartPole-v1")


def bench_pendulum(seeds: list[int], target: float = -300.0, budget: int = 200_000) -> None:
    """PPO with a Gaussian policy (configs/rl/ppo_pendulum.yaml), evaluated every 8192 env steps."""
    run = lambda seed, target, budget: zoo_run(seed, target, budget, "configs/rl/ppo_pendulum.yaml")  # noqa: E731
    time_to_return([("zoo PPO", run)], seeds, target, budget, "Pendulum-v1")


def time_to_return(runners: list, seeds: list[int], target: float, budget: int, env_id: str) -> None:
    """Runs each (name, run(seed, target, budget)) per seed, alternating, and prints the table and means."""
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    print(f"\ntime to a mean return >= {target:g} over 10 deterministic episodes, {env_id}, budget {budget} env steps")
    print(
        f"  {'agent':8s} {'seed':>4s} {'env steps':>9s} {'train s':>8s} {'total s':>8s}  "
        "evaluations (env steps, return)"
    )
    results: dict[str, list[dict]] = {name: [] for name, _ in runners}
    for seed in seeds:
        for name, run in runners:
            r = run(seed, target, budget)
            results[name].append(r)
            hit = r["hit"]
            cols = (
                f"{hit['env_steps']:9d} {hit['train_s']:8.2f} {hit['total_s']:8.2f}"
                if hit
                else f"{'not hit':>9s} {'-':>8s} {r['wall_s']:8.2f}"
            )
            print(f"  {name:8s} {seed:4d} {cols}  {r['evals']}", flush=True)
    for name, rs in results.items():
        hits = [r["hit"] for r in rs if r["hit"]]
        print(
            f"  {name}: reached on {len(hits)}/{len(rs)} seeds; median [IQR] over all seeds, a miss counting as "
            f"never: {quartiles([h['env_steps'] if h else None for h in (r['hit'] for r in rs)], '.0f')} env "
            f"steps, {quartiles([h['train_s'] if h else None for h in (r['hit'] for r in rs)], '.1f')} s train"
        )


def quartiles(values: list[float | None], fmt: str) -> str:
    """ "median [q1, q3]" of ``values``, None (a seed that never reached the target) ranking above every number;
    nearest-rank quartiles, so no quantile is interpolated towards a miss."""
    import numpy as np

    ranked = np.array([np.inf if v is None else v for v in values], dtype=float)
    q1, med, q3 = np.quantile(ranked, [0.25, 0.5, 0.75], method="nearest")
    show = lambda v: "never" if np.isinf(v) else format(v, fmt)  # noqa: E731
    return f"{show(med)} [{show(q1)}, {show(q3)}]"


# -- SAC on Pendulum: time to the result and env steps/s, next to SB3's SAC ------------------------------------

SAC_LEARNING_STARTS, SAC_EVAL_EVERY = 1000, 1000  # as configs/rl/sac_pendulum.yaml


def _sb3_importable() -> bool:
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        print("\n(stable_baselines3 is not importable: the SB3 comparison is skipped)")
        return False
    return True


def _sac_result(t0: float, eval_s: float, learn_s: float | None, steps: int, now: float) -> dict:
    """The figures at an evaluation: env steps, train and total seconds, env steps/s since the warm-up."""
    train_s = now - t0 - eval_s
    rate = (steps - SAC_LEARNING_STARTS) / (train_s - learn_s) if learn_s is not None and train_s > learn_s else 0.0
    return {"env_steps": steps, "train_s": train_s, "total_s": now - t0, "steps_per_s": rate}


def sac_zoo_run(seed: int, target: float, budget: int) -> dict:
    from lightning.pytorch import Callback

    from cli import main

    class TimeToReturn(Callback):
        def __init__(self) -> None:
            self.t0 = self.v0 = self.eval_s = 0.0
            self.learn_s, self.hit, self.last, self.evals = None, None, None, []

        def on_train_start(self, trainer, pl_module) -> None:
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if self.learn_s is None and int(pl_module.env_steps) >= SAC_LEARNING_STARTS:
                self.learn_s = time.perf_counter() - self.t0 - self.eval_s

        def on_validation_start(self, trainer, pl_module) -> None:
            self.v0 = time.perf_counter()

        def on_validation_end(self, trainer, pl_module) -> None:
            now = time.perf_counter()
            self.eval_s += now - self.v0
            ret, steps = trainer.callback_metrics["val/return"].item(), int(pl_module.env_steps)
            self.evals.append((steps, round(ret)))
            self.last = _sac_result(self.t0, self.eval_s, self.learn_s, steps, now)
            if ret >= target and self.hit is None:
                self.hit = self.last
                trainer.should_stop = True

    timer = TimeToReturn()
    args = [
        "--config",
        str(ROOT / "configs/rl/sac_pendulum.yaml"),
        f"--seed_everything={seed}",
        f"--model.init_args.total_env_steps={budget}",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.callbacks=[]",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    cli = main(args, run=False)
    cli.trainer.callbacks.append(timer)
    t = time.perf_counter()
    cli.trainer.fit(cli.model, cli.datamodule)
    return {"hit": timer.hit, "last": timer.last, "evals": timer.evals, "wall_s": time.perf_counter() - t}


def sac_sb3_run(seed: int, target: float, budget: int) -> dict:
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    eval_env = make_vec_env("Pendulum-v1", n_envs=10, seed=10_000)

    class TimeToReturn(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.t0 = self.eval_s = 0.0
            self.learn_s, self.hit, self.last, self.evals = None, None, None, []

        def _on_training_start(self) -> None:
            self.t0 = time.perf_counter()

        def _on_step(self) -> bool:
            if self.num_timesteps == SAC_LEARNING_STARTS:
                self.learn_s = time.perf_counter() - self.t0 - self.eval_s
            if self.num_timesteps % SAC_EVAL_EVERY:
                return True
            v0 = time.perf_counter()
            eval_env.seed(EVAL_SEED)  # the zoo's start states at every evaluation (see sb3_run)
            ret, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=10, deterministic=True)
            now = time.perf_counter()
            self.eval_s += now - v0
            self.evals.append((self.num_timesteps, round(ret)))
            self.last = _sac_result(self.t0, self.eval_s, self.learn_s, self.num_timesteps, now)
            if ret >= target:
                self.hit = self.last
                return False
            return True

    model = SAC(
        "MlpPolicy",
        make_vec_env("Pendulum-v1", n_envs=1, seed=seed),
        learning_rate=1e-3,
        buffer_size=100_000,
        learning_starts=SAC_LEARNING_STARTS,
        batch_size=256,
        tau=0.005,
        gamma=0.99,
        train_freq=1,
        gradient_steps=1,
        ent_coef="auto",
        seed=seed,
        device="cpu",
        verbose=0,
    )
    timer = TimeToReturn()
    t = time.perf_counter()
    model.learn(budget, callback=timer)
    return {"hit": timer.hit, "last": timer.last, "evals": timer.evals, "wall_s": time.perf_counter() - t}


def bench_sac(seeds: list[int], target: float = -200.0, budget: int = 20_000, with_sb3: bool = True) -> None:
    """Zoo SAC and SB3 SAC alternating per seed: time and env steps to the target, env steps/s with updates."""
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    runners = [("zoo SAC", sac_zoo_run)] + ([("SB3 SAC", sac_sb3_run)] if with_sb3 else [])
    print(
        f"\ntime to a mean return >= {target:g} over 10 deterministic episodes, Pendulum-v1, budget {budget} "
        "env steps; steps/s: env steps per training second once updates run (one update per env step)"
    )
    print(
        f"  {'agent':8s} {'seed':>4s} {'env steps':>9s} {'train s':>8s} {'total s':>8s} {'steps/s':>8s}  "
        "evaluations (env steps, return)"
    )
    results: dict[str, list[dict]] = {name: [] for name, _ in runners}
    for seed in seeds:
        for name, run in runners:
            r = run(seed, target, budget)
            results[name].append(r)
            hit = r["hit"] or r["last"]
            steps = f"{hit['env_steps']:9d}" if r["hit"] else f"{'not hit':>9s}"
            print(
                f"  {name:8s} {seed:4d} {steps} {hit['train_s']:8.2f} {hit['total_s']:8.2f} "
                f"{hit['steps_per_s']:8.1f}  {r['evals']}",
                flush=True,
            )
    for name, rs in results.items():
        hits = [r["hit"] for r in rs if r["hit"]]
        rates = [(r["hit"] or r["last"])["steps_per_s"] for r in rs]
        line = f"  {name}: reached on {len(hits)}/{len(rs)} seeds"
        if hits:
            mean = {k: sum(h[k] for h in hits) / len(hits) for k in hits[0]}
            line += (
                f"; mean {mean['env_steps']:.0f} env steps, {mean['train_s']:.1f} s train, "
                f"{mean['total_s']:.1f} s total"
            )
        print(f"{line}; {sum(rates) / len(rates):.1f} env steps/s with updates")


# -- IMPALA: throughput against synchronous agents, time to the CartPole result ------------------------------


def throughput_run(config: str, budget: int, seed: int = 0) -> dict:
    """Env steps/s of a fit through cli.py without evaluation: first step's latency, then the steady rate."""
    from lightning.pytorch import Callback

    from cli import main

    class Rate(Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx == 0:
                self.t1, self.s1 = time.perf_counter(), int(pl_module.env_steps)

        def on_train_end(self, trainer, pl_module) -> None:
            self.t2, self.s2 = time.perf_counter(), int(pl_module.env_steps)

    from bench._common import QUIET_FIT

    rate = Rate()
    args = [
        "--config",
        str(ROOT / config),
        f"--seed_everything={seed}",
        f"--model.init_args.total_env_steps={budget}",
        *QUIET_FIT,
    ]
    cli = main(args, run=False)
    cli.trainer.callbacks.append(rate)
    cli.trainer.fit(cli.model, cli.datamodule)
    return {
        "first_s": rate.t1 - rate.t0,
        "steps_per_s": (rate.s2 - rate.s1) / (rate.t2 - rate.t1),
        "env_steps": rate.s2,
    }


def actors_alone(seconds: float = 5.0) -> tuple[float, float]:
    """(first batch s, env steps/s) of IMPALA's CartPole actors, the learner only taking and publishing."""
    from datamodules import GymDataModule
    from zoo.rl import ActorCritic
    from zoo.rl.actors import ActorPool, EnvSpec

    net = ActorCritic(4, 2)
    t = time.perf_counter()
    pool = ActorPool(
        EnvSpec.of(GymDataModule("CartPole-v1")),
        net,
        num_actors=2,
        envs_per_actor=8,
        unroll_length=32,
        num_slots=4,
        seed=0,
    )
    try:
        pool.take(2)
        first, t, steps = time.perf_counter() - t, time.perf_counter(), 0
        while time.perf_counter() - t < seconds:
            steps += pool.take(2).env_steps
            pool.publish(net)
        return first, steps / (time.perf_counter() - t)
    finally:
        pool.close()


def bench_impala(seeds: list[int], target: float, budget: int = 300_000) -> None:
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    print("\nthroughput, CartPole-v1, each agent's config through cli.py, no evaluation")
    print(f"  {'agent':34s} {'first step s':>12s} {'env steps/s':>11s}")
    first, rate = actors_alone()
    print(f"  {'IMPALA actors alone (2 x 8 envs)':34s} {first:12.2f} {rate:11.0f}", flush=True)
    runs = [
        ("IMPALA training (2 actors x 8 envs)", "configs/rl/impala_cartpole.yaml", 153_600),
        ("PPO training (8 envs, 20 epochs)", "configs/rl/ppo_cartpole.yaml", 51_200),
        ("A2C training (8 envs x 5 steps)", "configs/rl/a2c_cartpole.yaml", 51_200),
    ]
    for name, config, steps in runs:
        r = throughput_run(config, steps)
        print(f"  {name:34s} {r['first_s']:12.2f} {r['steps_per_s']:11.0f}", flush=True)
    run = lambda seed, target, budget: zoo_run(seed, target, budget, "configs/rl/impala_cartpole.yaml")  # noqa: E731
    time_to_return([("IMPALA", run)], seeds, target, budget, "CartPole-v1")


def main() -> None:
    args = _args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    from bench._common import print_header

    torch.set_num_threads(1)
    print_header("RL: collection, learner, time to CartPole-v1's result", torch.device(args.device))
    parts = args.only or ["collect", "learner", "cartpole", "a2c", "pendulum", "sac", "impala"]
    if "collect" in parts:
        bench_collect()
    if "learner" in parts:
        bench_learner()
    if "cartpole" in parts:
        try:
            import stable_baselines3  # noqa: F401

            with_sb3 = not args.no_sb3
        except ImportError:
            with_sb3 = False
            print("\n(stable_baselines3 is not importable: the SB3 comparison is skipped)")
        bench_cartpole(args.seeds, args.target, args.budget, with_sb3)
    if "a2c" in parts:
        bench_a2c(args.seeds, args.target)
    if "pendulum" in parts:
        bench_pendulum(args.seeds)
    if "sac" in parts:
        bench_sac(args.seeds, with_sb3=_sb3_importable() and not args.no_sb3)
    if "impala" in parts:
        bench_impala(args.seeds, args.target)


if __name__ == "__main__":
    main()
