"""One agent on 2 processes (DDP over gloo, CPU, in a subprocess: DDP relaunches its script): each rank steps
envs of its own (IMPALA: actor processes of its own), and the env-step counter, the budget, the statistics and the
evaluation are global."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import CONFIGS, ROOT

from zoo.rl.collector import Evaluator
from zoo.rl.distributed import evaluation_share

SCRIPT = str(ROOT / "tests" / "scripts" / "rl_ranks.py")
DDP = str(CONFIGS / "trainer" / "ddp.yaml")


def _fit_on_two_ranks(config: str, *args: str) -> tuple[dict, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        SCRIPT,
        "fit",
        "--config",
        str(CONFIGS / "rl" / config),
        "--config",
        DDP,
        "--trainer.devices=2",
        "--trainer.accelerator=cpu",
        "--trainer.logger=false",
        "--trainer.log_every_n_steps=1",
        *args,
    ]
    # The script dumps every thread's stack and exits after 240 s: a deadlock fails with stacks, not a hang.
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load("rank0.pt"), torch.load("rank1.pt")


def _first_observations(seeds: range) -> torch.Tensor:
    return torch.tensor(np.stack([gym.make("CartPole-v1").reset(seed=s)[0] for s in seeds]))


@pytest.mark.slow  # two ranks, ~20 s: CI's slow suite runs it
def test_ppo_on_two_ranks_collects_twice_the_data_and_counts_it():
    r0, r1 = _fit_on_two_ranks("ppo_tiny.yaml")
    # Each rank's envs start where envs 0-3 and 4-7 of one 8-env process would (seed 0 from seed_everything).
    torch.testing.assert_close(r0["first"][0], _first_observations(range(0, 4)))
    torch.testing.assert_close(r1["first"][0], _first_observations(range(4, 8)))
    assert not torch.equal(r0["first"], r1["first"])
    # The 1024-step budget counts both ranks: 4 rollouts of 4 envs x 32 steps each, 512 per rank.
    for r in (r0, r1):
        assert r["world_size"] == 2 and r["env_steps"] == 1024 and r["logged"] == 1024 and r["val_env_steps"] == 1024
    # Statistics merge every rank's observations; the evaluation's figures are gathered from both.
    torch.testing.assert_close(r0["obs_mean"], r1["obs_mean"], rtol=0, atol=0)
    assert r0["val_return"] == r1["val_return"]


@pytest.mark.slow
def test_sac_on_two_ranks_collects_twice_the_data_and_counts_it():
    r0, r1 = _fit_on_two_ranks("sac_tiny.yaml", "--trainer.strategy=ddp_find_unused_parameters_true")
    # The first training step's replay rows: 40 steps of 2 envs on each rank, from different seeds and actions.
    assert r0["first"].shape == r1["first"].shape == (80, 9)
    assert not torch.isclose(r0["first"], r1["first"]).all(-1).any()
    for r in (r0, r1):
        assert r["env_steps"] == 800 and r["logged"] == 800


@pytest.mark.slow
def test_impala_on_two_ranks_collects_twice_the_data_and_counts_it():
    # Each rank's learner runs 2 actor processes of its own (6 processes in all): their envs are seeded after the
    # other rank's (train_seed), so the first unrolls differ and no env starts where one of the other rank's does.
    r0, r1 = _fit_on_two_ranks("impala_tiny.yaml")
    assert r0["first"].shape == r1["first"].shape == (17, 8, 4)  # T + 1 observations of 2 unrolls x 4 envs
    assert not torch.isclose(r0["first"][0][:, None], r1["first"][0][None]).all(-1).any()
    # The 1024-step budget counts both ranks: 128 env steps per learner step and rank, so 4 steps, not 8.
    for r in (r0, r1):
        assert r["world_size"] == 2 and r["env_steps"] == 1024 and r["logged"] == 1024 and r["global_step"] == 4
    assert r0["val_return"] == r1["val_return"] and r0["val_env_steps"] == 1024


def _cartpoles(n: int) -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", n, vectorization_mode="sync")  # env i resets with seed + i


@pytest.mark.parametrize(("episodes", "envs", "world"), [(10, 10, 2), (10, 4, 2), (7, 3, 2), (5, 4, 3), (3, 2, 4)])
def test_evaluation_shares_play_the_episodes_of_one_process(episodes, envs, world):
    shares = evaluation_share(episodes, envs, world)
    assert sum(s.num_episodes for s in shares) == episodes
    one = Evaluator(_cartpoles(min(envs, episodes)), episodes, seed=100)
    policy = lambda x: (x[:, 2] > 0).long()  # noqa: E731  pole leaning right: push right
    returns, lengths = one.run(policy)
    parts = [
        Evaluator(_cartpoles(s.num_envs), s.num_episodes, seed=100 + s.first_env).run(policy)
        for s in shares
        if s.num_envs
    ]
    torch.testing.assert_close(torch.cat([r for r, _ in parts]), returns)
    torch.testing.assert_close(torch.cat([n for _, n in parts]), lengths)


@pytest.mark.slow  # a cli.py process for one refusal (the README test command's 10 minutes)
def test_fsdp2_is_refused_naming_ddp(tmp_path):
    """Sharding an agent is refused at setup with the strategy to use, not deep inside Lightning's FSDP2 setup."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        str(ROOT / "cli.py"),
        "fit",
        "--config",
        str(CONFIGS / "rl" / "ppo_tiny.yaml"),
        "--config",
        str(CONFIGS / "trainer" / "fsdp.yaml"),
        "--trainer.devices=1",
        "--trainer.accelerator=cpu",
        "--trainer.logger=false",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode != 0
    assert "RL agents are not sharded" in proc.stderr and "configs/trainer/ddp.yaml" in proc.stderr, proc.stderr[-3000:]
