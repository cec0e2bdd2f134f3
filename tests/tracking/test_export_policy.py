"""``python -m zoo.tracking export-policy``: an agent's policy exported from a model in MLflow, as from a checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from conftest import CONFIGS, ROOT, cli


def _run(*args: str, store: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": store}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=300)


def test_a_registered_agent_exports_by_name_and_acts_as_trained(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "rl" / "ppo_tiny.yaml"),
        "--model.init_args.total_env_steps=256",
        "--trainer.logger.init_args.registered_model_name=tiny-ppo",
    )
    agent = c.model.cpu().eval()
    proc = _run("-m", "zoo.tracking", "export-policy", "models:/tiny-ppo/1", str(tmp_path / "policy.pt2"), store=store)
    assert proc.returncode == 0, proc.stderr[-2000:]
    policy = torch.export.load(str(tmp_path / "policy.pt2")).module()
    obs = torch.randn(32, 4) * torch.tensor([1.0, 0.5, 0.1, 0.5])
    # The best checkpoint's agent is the registered one; the last may differ: compare with the registered weights.
    from zoo.tracking import load_model

    registered = load_model("models:/tiny-ppo/1", store)
    torch.testing.assert_close(policy(obs), registered.act(obs), rtol=0, atol=0)
    assert float(registered.obs_rms.count) > 0 and type(registered) is type(agent)

    # The family's own entry point reads files only, and says which command reads MLflow.
    proc = _run("-m", "zoo.rl.export", "models:/tiny-ppo/1", "p.pt2", store=store)
    assert proc.returncode == 2 and "python -m zoo.tracking export-policy models:/tiny-ppo/1" in proc.stderr
    # A name the registry does not have: one error line naming it.
    proc = _run("-m", "zoo.tracking", "export-policy", "models:/no-such/1", "p.pt2", store=store)
    assert proc.returncode == 1 and proc.stderr.startswith("error:") and "no-such" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
