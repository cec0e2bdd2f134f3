"""RL races: the zoo's agent against Stable-Baselines3 with rl-baselines3-zoo's tuned hyperparameters, on the same
env, seeds, budget and evaluation, reporting env steps and CPU time to a return threshold and the return at the
end of the budget, median and spread over the seeds.

Protocol, both arms alike:
- training: the zoo through ``cli.py``'s parser with the task's config (no logger, no checkpoints); SB3's PPO or
  SAC with rl-zoo's hyperparameters for the task (``hyperparams/ppo.yml``, ``sac.yml``; each listed in TASKS with
  its source), the rest SB3's defaults; one intra-op thread each, envs stepped in the training process.
- evaluations during training: every ``eval_every`` env steps, after that rollout's update, the mean return of 10
  deterministic episodes from the same start states (env i of 10 reset with seed 10_000 + i: the zoo's
  ``GymDataModule.eval_seed``); the first one at or above the threshold is "hit".
- the result at the budget: the final policy, deterministic, on 100 episodes of one env reset with seeds
  20_000 + i, played by the same function for both arms (``final_return``), so no evaluation code differs.
- time: CPU seconds of the run's process (``time.process_time``) with the evaluations' CPU time taken out, so
  a loaded machine slows neither arm's figure; wall seconds are printed beside them.
Runs go to ``--jobs`` worker processes in the order zoo seed 0, SB3 seed 0, zoo seed 1, ...: with two jobs the two
arms of a seed run side by side, so drift in the machine's load falls on both.

    python bench/race_rl.py --task lunarlander --seeds 0 1 2 3 4 --jobs 2     # ~45 min on 2 cores
    python bench/race_rl.py --task lunarlander --seeds 0 --budget 200000      # a quick look
    python bench/race_rl.py --task pendulum --seeds 0 1 2 3 4 --jobs 2        # SAC: ~35 min on 2 cores

rl-zoo's PPO weighs its value loss as ``vf_coef * mean((V - R)^2)``; the zoo's PPO, as CleanRL, as ``vf_coef * 0.5 *
mean((V - R)^2)``: the zoo's configs that take rl-zoo's hyperparameters double its ``vf_coef``.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ and the zoo's packages, run as a script or loaded by path
from bench._common import Clock, race_process, race_runs, race_spread  # noqa: E402

EVAL_SEED, FINAL_SEED, FINAL_EPISODES = 10_000, 20_000, 100


@dataclass(frozen=True)
class Task:
    env_id: str
    target: float
    budget: int
    eval_every: int  # env steps; a multiple of both arms' rollout size
    zoo_config: str
    sb3_algo: str
    sb3_kwargs: dict = field(default_factory=dict)
    n_envs: int = 1
    source: str = ""


TASKS = {
    "lunarlander": Task(
        env_id="LunarLander-v3",
        target=200.0,  # "solved" in gymnasium's docs
        budget=1_000_000,
        eval_every=65_536,  # 4 rollouts of 16 envs x 1024 steps
        zoo_config="configs/rl/ppo_lunarlander.yaml",
        sb3_algo="PPO",
        sb3_kwargs=dict(n_steps=1024, batch_size=64, gae_lambda=0.98, gamma=0.999, n_epochs=4, ent_coef=0.01),
        n_envs=16,
        source="rl-baselines3-zoo hyperparams/ppo.yml, LunarLander-v2 (n_timesteps 1e6, policy MlpPolicy)",
    ),
    "pendulum": Task(
        env_id="Pendulum-v1",
        target=-200.0,  # the zoo's SAC test threshold; rl-zoo's published SAC: about -150 at 20k
        budget=20_000,
        eval_every=1_000,  # 10 of the zoo's steps of 100 env steps; SB3 collects one env step per rollout
        zoo_config="configs/rl/sac_pendulum.yaml",
        sb3_algo="SAC",
        sb3_kwargs=dict(learning_rate=1e-3),
        source="rl-baselines3-zoo hyperparams/sac.yml, Pendulum-v1 (n_timesteps 20000, policy MlpPolicy)",
    ),
}


def final_return(act, env_id: str, episodes: int = FINAL_EPISODES) -> tuple[float, float]:
    """Mean and std of ``episodes`` deterministic episodes of ``act(obs) -> action`` on one env."""
    import gymnasium as gym
    import numpy as np

    env, returns = gym.make(env_id), []
    for i in range(episodes):
        obs, _ = env.reset(seed=FINAL_SEED + i)
        total, done = 0.0, False
        while not done:  # one env's episode: the env, not the policy, is stepped one at a time
            obs, r, term, trunc, _ = env.step(act(obs))
            total += float(r)
            done = term or trunc
        returns.append(total)
    env.close()
    return float(np.mean(returns)), float(np.std(returns))


def zoo_run(task: Task, seed: int, budget: int) -> dict:
    import torch
    from lightning.pytorch import Callback

    sys.path.insert(0, str(ROOT))
    from cli import main

    clock, evals, hit = Clock(), [], {}

    class Evaluations(Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            clock.start()

        def on_validation_start(self, trainer, pl_module) -> None:
            clock.pause()

        def on_validation_end(self, trainer, pl_module) -> None:
            ret, steps = trainer.callback_metrics["val/return"].item(), int(pl_module.env_steps)
            evals.append((steps, round(ret)))
            if ret >= task.target and not hit:
                hit.update(env_steps=steps, cpu_s=clock.now()[0], wall_s=clock.now()[1])
            clock.resume()

    args = [
        "--config",
        str(ROOT / task.zoo_config),
        f"--seed_everything={seed}",
        f"--model.init_args.total_env_steps={budget}",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.callbacks=[]",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    cli = main(args, run=False)
    cli.trainer.callbacks.append(Evaluations())
    cli.trainer.fit(cli.model, cli.datamodule)
    cpu_s, wall_s = clock.now()
    module = cli.model.eval()

    def act(obs):
        with torch.no_grad():
            return module.act(torch.as_tensor(obs, dtype=torch.float32)[None], deterministic=True)[0].numpy()

    mean, std = final_return(act, task.env_id)
    return {"hit": hit or None, "evals": evals, "cpu_s": cpu_s, "wall_s": wall_s, "final": (mean, std)}


def sb3_run(task: Task, seed: int, budget: int) -> dict:
    import stable_baselines3
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    eval_env = make_vec_env(task.env_id, n_envs=10, seed=EVAL_SEED)
    clock, evals, hit = Clock(), [], {}

    def evaluate(model) -> None:
        clock.pause()
        eval_env.seed(EVAL_SEED)  # SB3 applies a seed at the next reset only: the same start states every time
        ret = evaluate_policy(model, eval_env, n_eval_episodes=10, deterministic=True)[0]
        evals.append((model.num_timesteps, round(ret)))
        if ret >= task.target and not hit:
            hit.update(env_steps=model.num_timesteps, cpu_s=clock.now()[0], wall_s=clock.now()[1])
        clock.resume()

    class Evaluations(BaseCallback):
        """Evaluates after the update of every ``eval_every``-th env step's rollout, as the zoo's validation: SB3
        calls ``on_rollout_start`` after ``train()``."""

        def _on_training_start(self) -> None:
            clock.start()

        def _on_step(self) -> bool:
            return True

        def _on_rollout_start(self) -> None:
            if self.num_timesteps and self.num_timesteps % task.eval_every == 0:
                evaluate(self.model)

    algo = getattr(stable_baselines3, task.sb3_algo)
    env = make_vec_env(task.env_id, n_envs=task.n_envs, seed=seed)
    model = algo("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **task.sb3_kwargs)
    model.learn(budget, callback=Evaluations())
    if model.num_timesteps % task.eval_every == 0 and (not evals or evals[-1][0] < model.num_timesteps):
        evaluate(model)  # the last update has no rollout after it
    cpu_s, wall_s = clock.now()
    mean, std = final_return(lambda obs: model.predict(obs, deterministic=True)[0], task.env_id)
    return {"hit": hit or None, "evals": evals, "cpu_s": cpu_s, "wall_s": wall_s, "final": (mean, std)}


def _one(job: tuple[str, str, int, int]) -> tuple[str, int, dict]:
    arm, task_name, seed, budget = job
    race_process(1)  # a CPU race (see bench/rl.py on NVML probes), one thread
    run = zoo_run if arm == "zoo" else sb3_run
    return arm, seed, run(TASKS[task_name], seed, budget)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=sorted(TASKS), default="lunarlander")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--budget", type=int, help="env steps (default: the task's)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, each in its own process")
    p.add_argument("--arms", nargs="+", choices=["zoo", "sb3"], default=["zoo", "sb3"])
    args = p.parse_args()
    task = TASKS[args.task]
    budget = args.budget or task.budget
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    sys.path.insert(0, str(ROOT))
    import torch

    from bench._common import print_header

    torch.set_num_threads(1)
    print_header(f"RL race: {args.task}", torch.device("cpu"))
    print(f"{task.env_id}: threshold {task.target:g}, budget {budget} env steps, evaluations every {task.eval_every}")
    print(f"SB3 {task.sb3_algo} {task.sb3_kwargs} x {task.n_envs} envs ({task.source}); zoo {task.zoo_config}")
    jobs = [(arm, args.task, seed, budget) for seed in args.seeds for arm in args.arms]
    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    for arm, seed, r in race_runs(_one, jobs, args.jobs):  # each row as soon as its run ends
        results[arm].append(r)
        h = r["hit"]
        at = f"{h['env_steps']:8d} {h['cpu_s']:8.1f} {h['wall_s']:8.1f}" if h else f"{'never':>8s} {'-':>8s} {'-':>8s}"
        m, s = r["final"]
        print(
            f"  {arm:4s} seed {seed}: hit at {at} (env steps, CPU s, wall s); at the budget {m:7.1f} +- {s:5.1f}"
            f" over {FINAL_EPISODES} episodes; {r['cpu_s']:.0f} CPU s in all; evaluations {r['evals']}",
            flush=True,
        )
    t = f"{task.target:g}"
    print(f"\n| arm | seeds | env steps to {t} | CPU s to {t} | return at {budget} | CPU s in all |")
    print("| --- | --- | --- | --- | --- | --- |")
    for arm, rs in results.items():
        hits = [r["hit"] for r in rs]
        print(
            f"| {arm} | {len(rs)} | {race_spread([h and h['env_steps'] for h in hits], '.0f')} | "
            f"{race_spread([h and h['cpu_s'] for h in hits], '.0f')} | "
            f"{race_spread([r['final'][0] for r in rs], '.0f')} | "
            f"{race_spread([r['cpu_s'] for r in rs], '.0f')} |"
        )
    print("median [min, max] over the seeds; a seed that never reached the threshold counts as never")


if __name__ == "__main__":
    main()
