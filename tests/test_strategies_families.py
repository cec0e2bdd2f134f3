"""More families on 2 CPU processes, and two torchrun "nodes": split from test_strategies.py so that
pytest-xdist's file-level scheduling runs the two files' long subprocess fits on different workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from conftest import CONFIGS, ROOT
from mlflow.tracking import MlflowClient
from test_strategies import DEADLINE_S, DIFFUSION_TINY, SCRIPT, TINY, _artifacts, _run

from zoo.clip import ContrastiveModule
from zoo.layers.parallel import consolidate


def test_ddp_diffusion_with_ema_samples_at_two_validations(embedded_store):
    _run("--config", str(CONFIGS / "trainer" / "ddp.yaml"), "--trainer.max_steps=4", "--trainer.val_check_interval=2",
         "--trainer.limit_val_batches=1", config=DIFFUSION_TINY)
    assert _artifacts("samples") == ["step_0000002.png", "step_0000004.png"]
    r0, r1 = torch.load("rank0.pt"), torch.load("rank1.pt")
    for k, v in r0["state"].items():  # the EMA weights too: every rank averages the same synchronised weights
        torch.testing.assert_close(v, r1["state"][k], rtol=0, atol=0, msg=k)


def test_fsdp2_clip_evaluates_retrieval_and_zero_shot_at_two_validations(tmp_path, embedded_store):
    _run("--config", str(CONFIGS / "trainer" / "fsdp.yaml"), "--trainer.max_steps=4", "--trainer.val_check_interval=2",
         "--trainer.limit_val_batches=2", config=str(CONFIGS / "clip" / "tiny.yaml"))
    client = MlflowClient(f"sqlite:///{Path('mlflow.db').resolve()}")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
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
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FIT_DEADLINE_S": str(DEADLINE_S), "OMP_NUM_THREADS": "1",
           "MLFLOW_TRACKING_URI": mlflow_server}
    port = free_port()
    nodes = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                          "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
                          SCRIPT, "fit", "--config", TINY, "--config", str(CONFIGS / "trainer" / "ddp.yaml"),
                          "--trainer.num_nodes=2", "--trainer.accelerator=cpu", "--trainer.devices=1",
                          "--trainer.max_steps=4", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
                          f"--trainer.logger.init_args.experiment_name={experiment}"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=DEADLINE_S + 60)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs[0][-4000:] + outs[1][-4000:]
    r0, r1 = torch.load("rank0.pt"), torch.load("rank1.pt")
    for k, v in r0["state"].items():
        if "running_" not in k and "num_batches" not in k:  # BatchNorm statistics are per rank
            torch.testing.assert_close(v, r1["state"][k], rtol=0, atol=0, msg=k)
    client = MlflowClient(mlflow_server)
    assert len(client.search_runs([client.get_experiment_by_name(experiment).experiment_id])) == 1
