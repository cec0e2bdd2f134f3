"""Policies that leave Lightning: a torch.export program of the deterministic policy and its normaliser, which
a fresh interpreter importing only torch loads and runs to the module's own actions."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import CONFIGS, cli

from zoo.rl import A2CModule, ActorCritic, DeterministicActorCritic, PPOModule, SACModule, SoftActorCritic, TD3Module
from zoo.rl.export import METADATA, agent_class, agents, export_policy, main

# What a user of the artifact runs: torch alone. It fails if anything else (zoo, Lightning) was imported.
LOAD_AND_ACT = """
import sys, torch
policy = torch.export.load(sys.argv[1]).module()
obs = torch.load(sys.argv[2])
torch.save(policy(obs), sys.argv[3])
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("zoo", "lightning", "gymnasium", "datamodules"))
assert not leaked, leaked
"""


def _with_statistics(module, obs_dim: int):
    """``module`` with running observation statistics far from the identity, so that forgetting them shows."""
    torch.manual_seed(0)
    module.obs_rms.update(torch.randn(500, obs_dim) * torch.linspace(0.1, 3.0, obs_dim) + 2.0)
    return module.eval()


AGENTS = {
    "ppo_discrete": lambda: _with_statistics(PPOModule(ActorCritic(4, 3, hidden_sizes=(16,)), norm_obs=True), 4),
    "ppo_gaussian": lambda: _with_statistics(
        PPOModule(ActorCritic(3, 2, hidden_sizes=(16,), continuous=True), norm_obs=True), 3
    ),
    "a2c_raw_obs": lambda: A2CModule(ActorCritic(5, 2, hidden_sizes=(8, 8))).eval(),
    "sac": lambda: _with_statistics(
        SACModule(SoftActorCritic(3, 2, action_low=-2.0, action_high=[1.0, 3.0], hidden_sizes=(16,)), norm_obs=True), 3
    ),
    "td3": lambda: _with_statistics(
        TD3Module(
            DeterministicActorCritic(3, 2, action_low=-2.0, action_high=[1.0, 3.0], hidden_sizes=(16,)), norm_obs=True
        ),
        3,
    ),
}


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_exported_policy_acts_as_the_module_for_any_batch(name, tmp_path):
    agent = AGENTS[name]()
    path = export_policy(agent, tmp_path / "policy.pt2")
    policy = torch.export.load(str(path)).module()
    for batch in (1, 2, 13):
        obs = torch.randn(batch, agent.net.obs_dim) * 3 + 1
        torch.testing.assert_close(policy(obs), agent.act(obs), rtol=0, atol=0)
    extra = {METADATA: ""}
    torch.export.load(str(path), extra_files=extra)
    meta = json.loads(extra[METADATA])
    assert meta["obs_shape"] == [agent.net.obs_dim] and meta["normalized_obs"] == (name != "a2c_raw_obs")


def test_every_agent_is_found_by_its_class_path_or_its_hyperparameters_and_nothing_else():
    # No list of agents to keep up to date: a LightningModule of zoo.rl that declares policy() is one.
    assert {cls.__name__ for cls in agents()} == {"PPOModule", "A2CModule", "IMPALAModule", "SACModule", "TD3Module"}
    assert agent_class({"_class_path": "zoo.rl.TD3Module"}) is TD3Module
    assert agent_class({"_class_path": "zoo.rl.sac.SACModule"}) is SACModule
    assert agent_class({"policy_delay": 2, "target_noise_clip": 0.5}) is TD3Module
    with pytest.raises(ValueError, match="not one of the agents"):
        agent_class({"_class_path": "zoo.rl.common.Policy"})


def test_checkpoint_exports_through_the_entry_point_and_plays_with_torch_alone(tmp_path):
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "rl" / "ppo_tiny.yaml"),
        "--model.init_args.total_env_steps=256",
        "--trainer.logger=false",
    )
    agent = c.model.cpu().eval()
    ckpt = c.trainer.checkpoint_callback.last_model_path
    # The entry point's main in this process: its process (python -m zoo.rl.export) is started by
    # test_file_attacks.py's hostile-program case, and a second process start here cost ~10 s of the suite.
    main([ckpt, str(tmp_path / "policy.pt2")])
    obs = torch.randn(64, 4) * torch.tensor([1.0, 0.5, 0.1, 0.5])
    torch.save(obs, tmp_path / "obs.pt")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            LOAD_AND_ACT,
            str(tmp_path / "policy.pt2"),
            str(tmp_path / "obs.pt"),
            str(tmp_path / "actions.pt"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    actions = torch.load(tmp_path / "actions.pt")
    assert float(agent.obs_rms.count) > 200  # trained statistics, which the program must carry
    torch.testing.assert_close(actions, agent.act(obs), rtol=0, atol=0)
