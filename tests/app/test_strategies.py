"""DDP and FSDP2 on 2 CPU processes (gloo), in subprocesses: DDP relaunches its own script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, ROOT, terminal
from mlflow.tracking import MlflowClient

from zoo.cnn import ClassifierModule
from zoo.diffusion import DiffusionModule
from zoo.gpt import CausalLMModule
from zoo.train.parallel import consolidate

TINY = str(CONFIGS / "cnn" / "convnet_digits.yaml")
SCRIPT = str(ROOT / "tests" / "scripts" / "fit_and_dump.py")


DEADLINE_S = 240  # per fit; then every rank prints its stack and exits (fit_and_dump.py), a deadlock fails


def _run(*args: str, config: str = TINY, command: str = "fit") -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FIT_DEADLINE_S": str(DEADLINE_S)}
    # The trainer pieces use every device (auto); a CPU counts as one, so the tests ask for 2 processes.
    proc = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            command,
            "--config",
            config,
            *args,
            "--trainer.accelerator=cpu",
            "--trainer.devices=2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=DEADLINE_S + 60,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]


def _the_run():
    """The client of the working directory's MLflow store and its one run."""
    client = MlflowClient(f"sqlite:///{Path('mlflow.db').resolve()}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return client, run


def _equal_ranks() -> tuple[dict, dict]:
    """What the two ranks dumped (fit_and_dump.py), after checking they hold the same weights exactly."""
    r0, r1 = torch.load("rank0.pt"), torch.load("rank1.pt")
    for k, v in r0["state"].items():
        torch.testing.assert_close(v, r1["state"][k], rtol=0, atol=0, msg=k)
    return r0, r1


def _artifacts(folder: str) -> list[str]:
    """The files under ``folder`` of the one run in the working directory's MLflow store."""
    client, run = _the_run()
    return sorted(Path(a.path).name for a in client.list_artifacts(run.info.run_id, folder))


@pytest.mark.slow  # the default suite's 10 minutes; CI's slow suite runs it
def test_ddp_two_processes_identical_weights_one_run(embedded_store):
    _run("--config", str(CONFIGS / "trainer" / "ddp.yaml"), "--trainer.max_epochs=1")
    r0, r1 = torch.load("rank0.pt"), torch.load("rank1.pt")
    assert r0["state"].keys() == r1["state"].keys()
    for k in r0["state"]:
        torch.testing.assert_close(r0["state"][k], r1["state"][k], rtol=0, atol=0, msg=k)
    client = MlflowClient(f"sqlite:///{Path('mlflow.db').resolve()}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1 and runs[0].data.tags["zoo.family"] == "cnn"


@pytest.mark.slow  # two launches of two ranks, ~40 s: CI's slow suite runs it
def test_fsdp2_two_processes_train_checkpoint_consolidate_reload(tmp_path, embedded_store):
    _run("--config", str(CONFIGS / "trainer" / "fsdp.yaml"), "--trainer.max_epochs=1")
    r0, r1 = torch.load("rank0.pt"), torch.load("rank1.pt")
    # Parameters are one sharded copy; BatchNorm running statistics are per-rank buffers (no
    # SyncBatchNorm on CPU), and the checkpoint holds rank 0's.
    for k, v in r0["state"].items():
        if "running_" not in k and "num_batches" not in k:
            torch.testing.assert_close(v, r1["state"][k], rtol=0, atol=0, msg=k)
    assert r0["mesh"] == r1["mesh"] == (2, 1), "data parallel over every process, no tensor parallel"
    last = Path(r0["last"])
    assert last.is_dir(), "FSDP2 checkpoints are sharded directories"
    single = consolidate(last, tmp_path / "consolidated.ckpt")
    # The run logged its sharded best and last checkpoints consolidated, where Lightning logs checkpoint files.
    best = Path(r0["best"])
    assert _artifacts(best.stem) == [best.name] and _artifacts(last.stem) == [last.name]
    client, run = _the_run()
    logged = torch.load(client.download_artifacts(run.info.run_id, f"{last.stem}/{last.name}"), weights_only=True)
    torch.testing.assert_close(
        logged["state_dict"], torch.load(single, weights_only=True)["state_dict"], rtol=0, atol=0
    )
    module = ClassifierModule.load_from_checkpoint(single).eval()
    assert module.state_dict().keys() == r0["state"].keys()
    # The checkpoint's replicated BatchNorm buffers are one rank's copy: it must reproduce that rank.
    holder = next(
        r
        for r in (r0, r1)
        if torch.equal(
            module.state_dict()["net.features.0.1.running_mean"], r["state"]["net.features.0.1.running_mean"]
        )
    )
    for k, v in holder["state"].items():
        torch.testing.assert_close(module.state_dict()[k], v, rtol=0, atol=0, msg=k)
    with torch.no_grad():
        torch.testing.assert_close(module(holder["x"]), holder["out"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # two launches of two ranks, ~75 s: CI's slow suite runs it
def test_fsdp2_gpt_shards_per_block_and_reloads_with_its_tokenizer(tmp_path, embedded_store):
    # Through two validations with the default LogTextSamples: generating on rank 0 alone deadlocked in the
    # first one (rank 0 in the sharded forward's all-gather, rank 1 in the next collective).
    _run(
        "--config",
        str(CONFIGS / "trainer" / "fsdp.yaml"),
        "--trainer.max_steps=6",
        "--trainer.val_check_interval=3",
        "--trainer.limit_val_batches=2",
        config=str(CONFIGS / "gpt" / "gpt_tiny.yaml"),
    )
    assert _artifacts("samples") == ["step_0000003.txt", "step_0000006.txt"]
    r0, r1 = torch.load("rank0.pt"), torch.load("rank1.pt")
    assert r0["mesh"] == (2, 1)
    for k, v in r0["state"].items():  # no per-rank buffers in a GPT: every tensor agrees
        torch.testing.assert_close(v, r1["state"][k], rtol=0, atol=0, msg=k)
    single = consolidate(Path(r0["last"]), tmp_path / "consolidated.ckpt")
    module = CausalLMModule.load_from_checkpoint(single).eval()
    assert module.net.lm_head.weight is module.net.tok_emb.weight  # still tied after sharding
    with torch.no_grad():
        torch.testing.assert_close(module(r0["x"]), r0["out"], rtol=1e-5, atol=1e-5)
    assert isinstance(module.generate(["To be"], max_new_tokens=5, temperature=0)[0], str)
    # The run's MLflow model was logged from the sharded best checkpoint, consolidated on the way.
    client, run = _the_run()  # the trained model: a logged model of the run (MLflow 3)
    (model,) = client.search_logged_models([run.info.experiment_id], f"source_run_id = '{run.info.run_id}'")
    assert "MLmodel" in [a.path for a in client.list_logged_model_artifacts(model.model_id)]
    # Resuming from the sharded folder reads its metadata through the zoo's allowlist first: Lightning's
    # real checkpoint (weights, optimizer state) passes it.
    _run(
        "--config",
        str(CONFIGS / "trainer" / "fsdp.yaml"),
        "--trainer.max_steps=9",
        "--trainer.val_check_interval=3",
        "--trainer.limit_val_batches=2",
        "--ckpt_path",
        r0["last"],
        config=str(CONFIGS / "gpt" / "gpt_tiny.yaml"),
    )
    assert Path(torch.load("rank0.pt")["last"]).is_dir()


DIFFUSION_TINY = str(CONFIGS / "diffusion" / "tiny.yaml")


@pytest.mark.slow
def test_fsdp2_diffusion_shards_consolidates_and_reloads(tmp_path, embedded_store):
    # Two validations, each sampling a grid (LogImageSamples) and the Frechet distance's images on every rank of
    # the sharded net (rank 0 alone would wait in the first all-gather for ever); EMA off (the DiT test has it).
    from conftest import cli

    clf = cli(
        "fit",
        "--config",
        str(CONFIGS / "cnn" / "convnet_shapes.yaml"),
        "--data.init_args.image_size=8",
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=1",
        "--test_after_fit=false",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
    )
    fd = [
        "--trainer.callbacks+=callbacks.FrechetDistance",
        "--trainer.callbacks.num_samples=8",
        f"--trainer.callbacks.classifier={clf.trainer.checkpoint_callback.last_model_path}",
        "--trainer.callbacks.batch_size=4",
        "--trainer.callbacks.sampler=zoo.diffusion.DDIMSampler",
        "--trainer.callbacks.sampler.init_args.steps=2",
    ]
    _run(
        "--config",
        str(CONFIGS / "trainer" / "fsdp.yaml"),
        "--trainer.max_steps=4",
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1",
        "--model.init_args.ema_decay=null",
        *fd,
        config=DIFFUSION_TINY,
    )
    assert _artifacts("samples") == ["step_0000000.png", "step_0000002.png", "step_0000004.png"]
    client, run = _the_run()
    assert len(client.get_metric_history(run.info.run_id, "val/fd_classifier")) == 2
    r0, r1 = _equal_ranks()
    module = DiffusionModule.load_from_checkpoint(consolidate(Path(r0["last"]), tmp_path / "one.ckpt")).eval()
    with torch.no_grad():
        y = torch.zeros(len(r0["x"]), dtype=torch.long)
        torch.testing.assert_close(
            module.denoise(r0["x"], torch.full((len(y),), 10), y), r0["out"], rtol=1e-5, atol=1e-5
        )


def test_num_nodes_comes_from_torchrun_or_srun_and_a_flag_wins(monkeypatch, capsys):
    from zoo.train.parallel import num_nodes_from_env

    assert num_nodes_from_env({}) is None
    assert num_nodes_from_env({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "RANK": "9"}) == 2  # torchrun
    assert num_nodes_from_env({"SLURM_NNODES": "4", "SLURM_NTASKS": "32", "SLURM_JOB_NAME": "train"}) == 4  # srun
    assert num_nodes_from_env({"SLURM_NNODES": "4", "SLURM_NTASKS": "32", "SLURM_JOB_NAME": "bash"}) is None
    monkeypatch.setenv("WORLD_SIZE", "4")  # as torchrun sets them for cli.py (terminal: in this process)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    for extra, want in (([], 2), (["--trainer.num_nodes=3"], 3)):  # the parsed config, as cli.py would run it
        status, out, err = terminal(monkeypatch, capsys, "fit", "--config", TINY, *extra, "--print_config")
        assert status == 0, err[-3000:]
        assert f"num_nodes: {want}" in out
