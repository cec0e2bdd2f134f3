"""A trained policy outside Lightning: one ``torch.export`` program, loadable with torch alone.

``export_policy`` traces the agent's own ``policy()`` (a ``zoo.rl.common.Policy``: what its ``act`` computes for the
most likely action, the observation normaliser's running statistics and clip folded in) into an ``ExportedProgram``
saved with ``torch.export.save``: a graph of ATen ops and its weights, no pickled Python, so it needs neither this
package nor Lightning to run::

    policy = torch.export.load("policy.pt2").module()
    actions = policy(torch.as_tensor(obs, dtype=torch.float32))  # (B, *obs_shape) raw observations -> (B,) | (B, A)

Only a program you exported or trust: ``torch.export.load`` unpickles what an archive holds (falling back to
``weights_only=False``) and evaluates its graph's shape expressions (``sympy.sympify``), so a ``.pt2`` someone else
wrote runs their code. The zoo writes programs and never loads one; given one where a checkpoint belongs, it refuses.

The batch dimension is dynamic. Discrete policies return int64 action indices; continuous ones the action (SAC's
squashed mean and TD3's mu(s) inside the bounds; PPO's and A2C's Gaussian mean, which the env clips to its Box as
the collector does). What the policy expects is written next to the program (``policy.json`` in its extra files).
Any agent of ``zoo.rl`` exports this way: a LightningModule there that declares ``policy()``; no list of them.
From a checkpoint: ``python -m zoo.rl.export runs/<run>/checkpoints/last.ckpt policy.pt2``; from a checkpoint or a
model in MLflow: ``python -m zoo.tracking export-policy models:/<name>/<version> policy.pt2``.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import inspect
import json
import pkgutil
import sys
from pathlib import Path

import torch
from lightning.pytorch import LightningModule

from zoo.io.files import replacing
from zoo.io.weights import CheckpointError, load_file
from zoo.rl.common import Policy

METADATA = "policy.json"


def deterministic_policy(agent: LightningModule) -> Policy:
    """A CPU copy of ``agent.policy()``, the agent's own declaration of its most likely action on raw observations."""
    return copy.deepcopy(agent.policy()).cpu().eval()


def policy_program(agent: LightningModule) -> torch.export.ExportedProgram:
    """The agent's deterministic policy traced by ``torch.export`` on CPU, with a dynamic batch dimension."""
    policy = deterministic_policy(agent)
    example = torch.zeros((2, *policy.obs_shape))  # two rows: a batch of one would specialise
    # Traced without autograd: the nets' act() run under no_grad, whose mode switches export cannot serialise.
    with torch.no_grad():
        return torch.export.export(policy, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))


def export_policy(agent: LightningModule, path: str | Path) -> Path:
    """Writes ``agent``'s deterministic policy to ``path`` (a ``.pt2`` file) with what it expects; returns it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    policy = agent.policy()
    net = policy.net
    meta = {
        "agent": type(agent).__name__,
        "net": type(net).__name__,
        "obs_shape": list(policy.obs_shape),
        "obs_dtype": "float32",
        "continuous": bool(net.continuous),
        "action_dim": int(net.action_dim),
        "normalized_obs": policy.obs_rms is not None,
        "env_steps": int(agent.env_steps),
    }
    program = policy_program(agent)
    with replacing(path) as tmp:  # never written through a link planted at ``path``
        torch.export.save(program, str(tmp), extra_files={METADATA: json.dumps(meta)})
    return path


def agents() -> list[type[LightningModule]]:
    """Every agent: a LightningModule defined in a module of ``zoo.rl`` (imported by its fixed package path, never by
    a name a file gives) that declares ``policy()``."""
    import zoo.rl

    found = []
    for info in pkgutil.iter_modules(zoo.rl.__path__, "zoo.rl."):
        module = importlib.import_module(info.name)
        found += [
            cls
            for cls in vars(module).values()
            if inspect.isclass(cls)
            and cls.__module__ == module.__name__
            and issubclass(cls, LightningModule)
            and callable(getattr(cls, "policy", None))
        ]
    return found


def agent_class(hparams: dict) -> type[LightningModule]:
    """The agent class a checkpoint was saved from: the ``_class_path`` LightningCLI records (looked up among
    ``agents()``, never imported), else the agent whose ``__init__`` takes all its hyperparameters."""
    found = agents()
    by_path = {p: cls for cls in found for p in (f"{cls.__module__}.{cls.__name__}", f"zoo.rl.{cls.__name__}")}
    if "_class_path" in hparams:
        if hparams["_class_path"] not in by_path:
            raise ValueError(f"{hparams['_class_path']} is not one of the agents {sorted(by_path)}")
        return by_path[hparams["_class_path"]]
    keys = {k for k in hparams if not k.startswith("_")}
    for cls in found:
        if keys <= set(inspect.signature(cls.__init__).parameters):
            return cls
    raise ValueError(f"no agent takes the hyperparameters {sorted(keys)}")


def load_agent(checkpoint: str | Path) -> LightningModule:
    """The agent of a checkpoint written by ``cli.py fit`` (its net rebuilt from the saved config), on CPU."""
    hparams = load_file(checkpoint, mmap=True)["hyper_parameters"]
    return agent_class(hparams).load_from_checkpoint(checkpoint, map_location="cpu").eval()


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description="Export an agent's deterministic policy to a torch.export program.")
    p.add_argument("checkpoint", help="a checkpoint of any zoo.rl agent (PPOModule, SACModule, TD3Module, ...)")
    p.add_argument("out", help="the .pt2 file to write")
    args = p.parse_args(argv)
    if args.checkpoint.startswith(("models:/", "runs:/")):  # the registry is the application's, not a family's
        p.error(
            f"{args.checkpoint} is a model in MLflow: python -m zoo.tracking export-policy {args.checkpoint} {args.out}"
        )
    try:
        path = export_policy(load_agent(args.checkpoint), args.out)
    except (CheckpointError, FileNotFoundError, ValueError) as err:  # InputError too: one line naming the input
        sys.exit(f"error: {' '.join(str(err).split())}")
    print(f"Exported the policy of {args.checkpoint} to {path.resolve()}")
    return path


if __name__ == "__main__":
    main()
