"""A trained policy outside Lightning: one ``torch.export`` program, loadable with torch alone.

``export_policy`` traces what ``AgentModule.act`` computes for the most likely action, the observation normaliser
(running statistics, clip) folded in, into an ``ExportedProgram`` saved with ``torch.export.save``: a graph of
ATen ops and its weights, no pickled Python, so it needs neither this package nor Lightning to run::

    policy = torch.export.load("policy.pt2").module()
    actions = policy(torch.as_tensor(obs, dtype=torch.float32))  # (B, *obs_shape) raw observations -> (B,) | (B, A)

The batch dimension is dynamic. Discrete policies return int64 action indices; continuous ones the action (SAC's
squashed mean inside the bounds; PPO's and A2C's Gaussian mean, which the env clips to its Box as the collector
does). What the policy expects is written next to the program (``policy.json`` in the file's extra files).
From a checkpoint: ``python -m zoo.rl.export runs/<run>/checkpoints/last.ckpt policy.pt2``.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
from pathlib import Path

import torch
from torch import Tensor, nn

from zoo.layers.weights import load_file
from zoo.rl.agent import AgentModule

METADATA = "policy.json"


class DeterministicPolicy(nn.Module):
    """Raw observations (B, *obs_shape) -> the most likely actions, as ``AgentModule.act`` computes them."""

    def __init__(self, agent: AgentModule) -> None:
        super().__init__()
        self.net = copy.deepcopy(agent.net).cpu().eval()
        norm = agent.hparams.get("norm_obs") and hasattr(agent, "obs_rms")
        self.obs_rms = copy.deepcopy(agent.obs_rms).cpu() if norm else None

    def forward(self, obs: Tensor) -> Tensor:
        x = obs.to(torch.float32)
        if self.obs_rms is not None:
            x = self.obs_rms.normalize(x)
        return self.net.act(x, deterministic=True)


def observation_shape(net: nn.Module) -> tuple[int, ...]:
    """One observation's shape, as the net takes it (an image net names ``obs_shape``; an MLP ``obs_dim``)."""
    return tuple(getattr(net, "obs_shape", None) or (net.obs_dim,))


def policy_program(agent: AgentModule) -> torch.export.ExportedProgram:
    """``DeterministicPolicy(agent)`` traced by ``torch.export`` on CPU, with a dynamic batch dimension."""
    policy = DeterministicPolicy(agent)
    example = torch.zeros((2, *observation_shape(policy.net)))  # two rows: a batch of one would specialise
    # Traced without autograd: the nets' act() run under no_grad, whose mode switches export cannot serialise.
    with torch.no_grad():
        return torch.export.export(policy, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))


def export_policy(agent: AgentModule, path: str | Path) -> Path:
    """Writes ``agent``'s deterministic policy to ``path`` (a ``.pt2`` file) with what it expects; returns it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    net = agent.net
    meta = {
        "agent": type(agent).__name__, "net": type(net).__name__, "obs_shape": list(observation_shape(net)),
        "obs_dtype": "float32", "continuous": bool(net.continuous), "action_dim": int(net.action_dim),
        "normalized_obs": bool(DeterministicPolicy(agent).obs_rms is not None), "env_steps": int(agent.env_steps),
    }
    torch.export.save(policy_program(agent), str(path), extra_files={METADATA: json.dumps(meta)})
    return path


def agent_class(hparams: dict) -> type[AgentModule]:
    """The agent class a checkpoint was saved from: the ``_class_path`` LightningCLI records, else the agent whose
    ``__init__`` takes all its hyperparameters."""
    from zoo.rl import A2CModule, IMPALAModule, PPOModule, SACModule

    agents = (PPOModule, A2CModule, SACModule, IMPALAModule)
    by_path = {p: cls for cls in agents for p in (f"{cls.__module__}.{cls.__name__}", f"zoo.rl.{cls.__name__}")}
    if "_class_path" in hparams:
        if hparams["_class_path"] not in by_path:
            raise ValueError(f"{hparams['_class_path']} is not one of the agents {sorted(by_path)}")
        return by_path[hparams["_class_path"]]
    keys = {k for k in hparams if not k.startswith("_")}
    for cls in agents:
        if keys <= set(inspect.signature(cls.__init__).parameters):
            return cls
    raise ValueError(f"no agent takes the hyperparameters {sorted(keys)}")


def load_agent(checkpoint: str | Path) -> AgentModule:
    """The agent of a checkpoint written by ``cli.py fit`` (its net rebuilt from the saved config), on CPU."""
    hparams = load_file(checkpoint, mmap=True)["hyper_parameters"]
    return agent_class(hparams).load_from_checkpoint(checkpoint, map_location="cpu").eval()


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description="Export an agent's deterministic policy to a torch.export program.")
    p.add_argument("checkpoint", help="a checkpoint of PPOModule, A2CModule, SACModule or IMPALAModule")
    p.add_argument("out", help="the .pt2 file to write")
    args = p.parse_args(argv)
    path = export_policy(load_agent(args.checkpoint), args.out)
    print(f"Exported the policy of {args.checkpoint} to {path.resolve()}")
    return path


if __name__ == "__main__":
    main()
