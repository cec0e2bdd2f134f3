"""``python -m zoo.tracking export-policy``: an agent's policy exported from a model in MLflow, as from a checkpoint."""

from __future__ import annotations

import pytest
import torch
from conftest import CONFIGS, cli


def test_a_registered_agent_exports_by_name_and_acts_as_trained(tmp_path, monkeypatch, capsys):
    """The entry points run in this process (their ``main``), as ``python -m`` runs them after its imports."""
    from zoo.rl.export import main as export_from_a_file
    from zoo.tracking.__main__ import main as tracking

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
    tracking(["export-policy", "models:/tiny-ppo/1", str(tmp_path / "policy.pt2")])
    policy = torch.export.load(str(tmp_path / "policy.pt2")).module()
    obs = torch.randn(32, 4) * torch.tensor([1.0, 0.5, 0.1, 0.5])
    # The best checkpoint's agent is the registered one; the last may differ: compare with the registered weights.
    from zoo.tracking import load_model

    registered = load_model("models:/tiny-ppo/1", store)
    torch.testing.assert_close(policy(obs), registered.act(obs), rtol=0, atol=0)
    assert float(registered.obs_rms.count) > 0 and type(registered) is type(agent)

    # The family's own entry point reads files only, and says which command reads MLflow.
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        export_from_a_file(["models:/tiny-ppo/1", "p.pt2"])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "python -m zoo.tracking export-policy models:/tiny-ppo/1" in err, err
    # A name the registry does not have: one error line naming it (what sys.exit prints), no traceback.
    with pytest.raises(SystemExit) as missing:
        tracking(["export-policy", "models:/no-such/1", "p.pt2"])
    said = str(missing.value.code)
    assert said.startswith("error:") and "no-such" in said and "Traceback" not in said, said
