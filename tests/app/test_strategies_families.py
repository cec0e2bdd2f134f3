"""More families on 2 CPU processes, and two torchrun "nodes": split from test_strategies.py so that
pytest-xdist's file-level scheduling runs the two files' long subprocess fits on different workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, ROOT
from mlflow.tracking import MlflowClient
from test_strategies import DEADLINE_S, DIFFUSION_TINY, SCRIPT, TINY, _artifacts, _equal_ranks, _run, _the_run

from zoo.clip import ContrastiveModule
from zoo.cnn import ClassifierModule
from zoo.diffusion import DiffusionModule
from zoo.gpt import CausalLMModule
from zoo.train.parallel import consolidate

# Each test starts 2 processes (or two torchrun nodes) per family: out of the default suite (python -m pytest -m slow).
pytestmark = pytest.mark.slow


def test_ddp_diffusion_with_ema_samples_at_two_validations(embedded_store):
    _run(
        "--config",
        str(CONFIGS / "trainer" / "ddp.yaml"),
        "--trainer.max_steps=4",
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1",
        config=DIFFUSION_TINY,
    )
    assert _artifacts("samples") == ["step_0000000.png", "step_0000002.png", "step_0000004.png"]
    r0, r1 = torch.load("rank0.pt"), torch.load("rank1.pt")
    for k, v in r0["state"].items():  # the EMA weights too: every rank averages the same synchronised weights
        torch.testing.assert_close(v, r1["state"][k], rtol=0, atol=0, msg=k)


def test_fsdp2_clip_evaluates_retrieval_and_zero_shot_at_two_validations(tmp_path, embedded_store):
    _run(
        "--config",
        str(CONFIGS / "trainer" / "fsdp.yaml"),
        "--trainer.max_steps=4",
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=2",
        config=str(CONFIGS / "clip" / "tiny.yaml"),
    )
    client, run = _the_run()
    for key in ("val/recall_1", "val/zeroshot_acc"):  # gathered over both ranks, logged once per validation
        assert len(client.get_metric_history(run.info.run_id, key)) == 2, key
    r0 = torch.load("rank0.pt")
    module = ContrastiveModule.load_from_checkpoint(consolidate(Path(r0["last"]), tmp_path / "c.ckpt")).eval()
    assert module.tokenizer is not None
    torch.testing.assert_close(module.embed_images(r0["x"]), r0["out"], rtol=1e-5, atol=1e-5)


def test_two_nodes_under_torchrun_train_one_model_into_one_run(mlflow_server):
    # Two torchrun launches on localhost as two 1-process "nodes" (README, "Past one machine"): Lightning
    # takes ranks from torchrun's environment and launches nothing itself. Tracking goes to a server, as the
    # README says: nodes that start together would each create (migrate) an embedded sqlite store at once.
    import uuid

    from conftest import free_port

    experiment = f"torchrun-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FIT_DEADLINE_S": str(DEADLINE_S),
        "OMP_NUM_THREADS": "1",
        "MLFLOW_TRACKING_URI": mlflow_server,
    }
    port = free_port()
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(rank),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                SCRIPT,
                "fit",
                "--config",
                TINY,
                "--config",
                str(CONFIGS / "trainer" / "ddp.yaml"),
                "--trainer.accelerator=cpu",
                "--trainer.devices=1",  # num_nodes: 2, from torchrun's env
                "--trainer.max_steps=4",
                "--trainer.val_check_interval=2",
                "--trainer.limit_val_batches=1",
                f"--trainer.logger.init_args.experiment_name={experiment}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=DEADLINE_S + 60)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs[0][-4000:] + outs[1][-4000:]
    r0, r1 = torch.load("rank0.pt"), torch.load("rank1.pt")
    for k, v in r0["state"].items():
        if "running_" not in k and "num_batches" not in k:  # BatchNorm statistics are per rank
            torch.testing.assert_close(v, r1["state"][k], rtol=0, atol=0, msg=k)
    assert r0["num_nodes"] == r1["num_nodes"] == 2
    client = MlflowClient(mlflow_server)
    assert len(client.search_runs([client.get_experiment_by_name(experiment).experiment_id])) == 1


TINY_DIT = (
    '{"class_path": "zoo.diffusion.DiT", "init_args": {"image_size": 8, "in_channels": 3, "num_classes": 6, '
    '"depth": 2, "hidden_size": 32, "num_heads": 2, "patch_size": 2}}'
)


def _dit_ema_fsdp2(*args: str) -> None:
    # 4-step epochs, validations (and sample grids) at steps 2 and 4: a resume from step 4 starts a fresh epoch,
    # so it draws the same batches as an unbroken run. The EMA starts at step 1 (0-based), before the save.
    _run(
        "--config",
        str(CONFIGS / "trainer" / "fsdp.yaml"),
        f"--model.init_args.net={TINY_DIT}",
        "--model.init_args.ema_start_step=1",
        "--trainer.limit_train_batches=4",
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1",
        *args,
        config=DIFFUSION_TINY,
    )


def test_fsdp2_dit_with_ema_validates_resumes_and_consolidates_both_weights(tmp_path, monkeypatch, embedded_store):
    """The EMA stays sharded with the weights; validation samples from it on every rank; the sharded checkpoint
    holds it as state_dict and the training weights as current_model_state; a resumed run ends where an
    unbroken one does, EMA and weights alike."""
    runs = {name: tmp_path / name for name in ("first", "resumed", "unbroken")}
    for path in runs.values():
        path.mkdir()
    monkeypatch.chdir(runs["first"])
    _dit_ema_fsdp2("--trainer.max_steps=4")
    assert _artifacts("samples") == ["step_0000000.png", "step_0000002.png", "step_0000004.png"]
    r0, r1 = _equal_ranks()
    first = Path(r0["last"]).resolve()
    ckpt = torch.load(consolidate(first, tmp_path / "first.ckpt"), weights_only=True)
    assert ckpt["state_dict"].keys() == ckpt["current_model_state"].keys() == r0["state"].keys()
    for k, v in r0["state"].items():  # fit ends holding the EMA, which the checkpoint's state_dict is
        torch.testing.assert_close(ckpt["state_dict"][k], v, rtol=0, atol=0, msg=k)
    assert any(not torch.equal(ckpt["state_dict"][k], w) for k, w in ckpt["current_model_state"].items())
    module = DiffusionModule.load_from_checkpoint(tmp_path / "first.ckpt").eval()
    with torch.no_grad():
        y = torch.zeros(len(r0["x"]), dtype=torch.long)
        torch.testing.assert_close(
            module.denoise(r0["x"], torch.full((len(y),), 10), y), r0["out"], rtol=1e-5, atol=1e-5
        )

    monkeypatch.chdir(runs["resumed"])
    _dit_ema_fsdp2("--trainer.max_steps=8", "--ckpt_path", str(first), "--trainer.logger=false")
    monkeypatch.chdir(runs["unbroken"])
    _dit_ema_fsdp2("--trainer.max_steps=8", "--trainer.logger=false")
    ends = {}
    for name in ("resumed", "unbroken"):
        r = torch.load(runs[name] / "rank0.pt")
        ends[name] = (
            r["state"],
            torch.load(consolidate(runs[name] / r["last"], tmp_path / f"{name}.ckpt"), weights_only=True),
        )
    (state, ckpt), (want_state, want) = ends["resumed"], ends["unbroken"]
    assert ckpt["global_step"] == want["global_step"] == 8
    for k, v in want_state.items():
        torch.testing.assert_close(state[k], v, msg=k)
        for key in ("state_dict", "current_model_state"):
            torch.testing.assert_close(ckpt[key][k], want[key][k], msg=f"{key} {k}")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_cnn_validates_twice_resumes_and_reloads(strategy, tmp_path, monkeypatch, embedded_store):
    """The CNN (BatchNorm: per-rank buffers) through two validations, a resume from its checkpoint (a sharded
    folder under FSDP2) and a reload, under each strategy."""
    trainer = str(CONFIGS / "trainer" / f"{strategy}.yaml")
    common = (
        "--config",
        trainer,
        "--trainer.limit_train_batches=4",
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1",
    )
    _run(*common, "--trainer.max_steps=4")
    client, run = _the_run()
    assert len(client.get_metric_history(run.info.run_id, "val/loss")) == 2  # after steps 2 and 4
    first = Path(torch.load("rank0.pt")["last"]).resolve()
    assert first.is_dir() == (strategy == "fsdp")
    _run(*common, "--trainer.max_steps=8", "--ckpt_path", str(first), "--trainer.logger=false")
    r0, r1 = torch.load("rank0.pt"), torch.load("rank1.pt")
    last = Path(r0["last"])
    ckpt_file = consolidate(last, tmp_path / "one.ckpt") if strategy == "fsdp" else last
    assert torch.load(ckpt_file, weights_only=True)["global_step"] == 8
    module = ClassifierModule.load_from_checkpoint(ckpt_file).eval()
    for k, v in r0["state"].items():  # weights agree across ranks; BatchNorm statistics are each rank's own
        if "running_" not in k and "num_batches" not in k:
            torch.testing.assert_close(v, r1["state"][k], rtol=0, atol=0, msg=k)
    holder = next(r for r in (r0, r1) if all(torch.equal(module.state_dict()[k], v) for k, v in r["state"].items()))
    with torch.no_grad():
        torch.testing.assert_close(module(holder["x"]), holder["out"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", ["gpt/gpt_tiny.yaml", "clip/tiny.yaml"])
def test_ddp_gpt_and_clip_validate_twice_and_reload_with_the_ranks_outputs(config, embedded_store):
    """Through two validations with the family's default callbacks (text samples, retrieval and zero-shot), the
    ranks end with the same weights, and the checkpoint reloaded in one process gives their outputs."""
    _run(
        "--config",
        str(CONFIGS / "trainer" / "ddp.yaml"),
        "--trainer.max_steps=4",
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1",
        config=str(CONFIGS / config),
    )
    client, run = _the_run()
    assert len(client.get_metric_history(run.info.run_id, "val/loss")) == 2
    r0, r1 = _equal_ranks()
    torch.testing.assert_close(r0["out"], r1["out"], rtol=0, atol=0)
    module_class = ContrastiveModule if config.startswith("clip") else CausalLMModule
    module = module_class.load_from_checkpoint(r0["last"]).eval()
    with torch.no_grad():
        out = module.embed_images(r0["x"]) if module_class is ContrastiveModule else module(r0["x"])
    torch.testing.assert_close(out, r0["out"], rtol=1e-5, atol=1e-5)
    if module_class is CausalLMModule:  # the text samples, generated at each validation
        assert _artifacts("samples") == ["step_0000002.txt", "step_0000004.txt"]
    else:  # gathered over both ranks, logged once per validation
        for key in ("val/recall_1", "val/zeroshot_acc"):
            assert len(client.get_metric_history(run.info.run_id, key)) == 2, key
