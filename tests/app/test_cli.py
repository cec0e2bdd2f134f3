"""Every config in configs/ instantiates through cli.py, runnable ones fit end to end, bad ones fail clearly."""

from __future__ import annotations

import re
import traceback
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, cli, run_cli, terminal

FAMILY_CONFIGS = sorted(p for p in CONFIGS.glob("*/*.yaml") if p.parent.name not in ("trainer", "logger"))
STACKED = sorted(CONFIGS.glob("trainer/*.yaml"))
TINY = CONFIGS / "cnn" / "convnet_digits.yaml"
FAST = ["--trainer.fast_dev_run=2", "--trainer.enable_progress_bar=false"]


def _id(p: Path) -> str:
    return str(p.relative_to(CONFIGS))


@pytest.fixture
def image_folder(tmp_path) -> Path:
    """Two colour classes, train/ and val/, a few 40x40 PNGs each."""
    from PIL import Image

    for split in ("train", "val"):
        for k, colour in enumerate([(255, 0, 0), (0, 0, 255)]):
            folder = tmp_path / "images" / split / f"class{k}"
            folder.mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (40, 40), colour).save(folder / f"{i}.png")
    return tmp_path / "images"


# Presets whose net is the init_weights folder's (zoo.app.pretrained): a Hugging Face CLIP config.json is all it reads.
FROM_A_FOLDER = ("clip/zeroshot_folder.yaml", "clip/finetune_csv.yaml")


def hf_clip_config(folder: Path) -> Path:
    """A tiny Hugging Face CLIP folder's config.json (no weights: instantiating reads only the config)."""
    import json

    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    vision, text = tower | dict(image_size=16, patch_size=8), tower | dict(vocab_size=300, eos_token_id=299)
    folder.mkdir()
    config = dict(model_type="clip", vision_config=vision, text_config=text, projection_dim=16)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("config", FAMILY_CONFIGS, ids=_id)
def test_every_config_instantiates(config, image_folder, tmp_path):
    from cli import main

    extra = [f"--data.init_args.root={image_folder}"] if "imagefolder" in config.name else []
    if _id(config) in FROM_A_FOLDER:
        extra = [f"--model.init_args.init_weights={hf_clip_config(tmp_path / 'clip')}"]
    if _id(config) == "gpt/dpo_tiny.yaml":  # the pairs are the user's
        (tmp_path / "dpo.jsonl").write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n' * 10)
        extra = [f"--data.init_args.path={tmp_path / 'dpo.jsonl'}"]
    if _id(config) == "gpt/grpo_arithmetic_llama.yaml":  # the folder's tokenizer: the bytes' instead
        extra = ["--data.init_args.tokenizer=bytes"]
    c = main(["--config", str(config), *extra], run=False)
    assert c.model is not None and c.datamodule is not None and c.trainer is not None


@pytest.mark.parametrize("piece", STACKED, ids=_id)
def test_trainer_pieces_stack_on_a_family_config(piece):
    from cli import main

    # Every device unless told: auto (all GPUs; a CPU counts as one), and the count from the command line.
    assert (
        main(
            ["--config", str(TINY), "--config", str(piece), "--trainer.accelerator=cpu"], run=False
        ).trainer.num_devices
        == 1
    )
    c = main(["--config", str(TINY), "--config", str(piece), "--trainer.devices=2"], run=False)
    assert c.trainer.num_devices == 2


@pytest.mark.parametrize("nodes, devices", [(1, 2), (1, 4), (2, 3)])
def test_fsdp_configs_shard_over_every_process_of_every_node(nodes, devices):
    from cli import main

    piece = ["--config", str(TINY), "--config", str(CONFIGS / "trainer" / "fsdp.yaml")]
    # The GPT-2 config's trainer with a one-block net: the mesh is the trainer's (124M weights took ~3 s a case).
    small = ["--model.init_args.net.init_args.n_layer=1", "--model.init_args.net.init_args.n_embd=96"]
    for args in (piece, ["--config", str(CONFIGS / "gpt" / "gpt2_124m_fsdp.yaml"), *small]):
        c = main(
            [*args, "--trainer.accelerator=cpu", f"--trainer.devices={devices}", f"--trainer.num_nodes={nodes}"],
            run=False,
        )
        assert c.trainer.strategy.mesh_shape() == (nodes * devices, 1)


@pytest.mark.slow
def test_consolidation_command_documented_in_the_configs_runs(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    for yaml in (CONFIGS / "trainer" / "fsdp.yaml", CONFIGS / "gpt" / "gpt2_124m_fsdp.yaml"):
        assert "python -m zoo.train.parallel <" in yaml.read_text(), yaml
    proc = subprocess.run(
        [sys.executable, "-m", "zoo.train.parallel", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0 and "checkpoint_dir" in proc.stdout and "output_file" in proc.stdout, proc.stderr


def test_logger_piece_stacks(served, tmp_path):
    from cli import main

    # Only the stacking is tested: a stand-in answering the logger's health check, not an MLflow server (seconds).
    (tmp_path / "health").write_text("OK")
    mlflow_server = served
    c = main(
        [
            "--config",
            str(TINY),
            "--config",
            str(CONFIGS / "logger" / "mlflow_server.yaml"),
            f"--trainer.logger.init_args.tracking_uri={mlflow_server}",
        ],
        run=False,
    )
    assert c.trainer.logger.tracking_uri == mlflow_server


RUNNABLE = [
    "cnn/convnet_digits.yaml",
    "cnn/convnet_shapes.yaml",
    # the main job: CI's README command 1 fits it whole; slow here (the README test command's 10 minutes)
    pytest.param("cnn/convnet_mnist.yaml", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name", RUNNABLE)
def test_runnable_configs_fit_end_to_end(name):
    c = cli("fit", "--config", str(CONFIGS / name), *FAST)
    metrics = c.trainer.callback_metrics  # test/ metrics when the config tests after fit
    assert torch.isfinite(metrics["test/loss" if c.config.fit.test_after_fit else "val/loss"])


def test_imagefolder_config_fits_on_a_folder(image_folder):
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "cnn" / "torchvision_imagefolder.yaml"),
        *FAST,
        f"--data.init_args.root={image_folder}",
        "--data.init_args.image_size=32",
        "--data.init_args.batch_size=4",
        "--data.init_args.num_workers=0",
        "--model.init_args.net.init_args.name=resnet18",
        "--model.init_args.net.init_args.num_classes=2",
        "--trainer.precision=32-true",
    )
    assert torch.isfinite(c.trainer.callback_metrics["val/loss"])


def test_missing_dataset_fails_fast_with_what_to_pass():
    with pytest.raises(FileNotFoundError, match=r"CIFAR10 not found under 'nowhere'.*data\.init_args\.root"):
        cli(
            "fit",
            "--config",
            str(CONFIGS / "cnn" / "resnet18_cifar10.yaml"),
            *FAST,
            "--data.init_args.root=nowhere",
            "--data.init_args.num_workers=0",
        )


def test_missing_image_folder_fails_at_once_in_one_line(monkeypatch, capsys):
    imagefolder = str(CONFIGS / "cnn" / "torchvision_imagefolder.yaml")
    status, _, err = terminal(monkeypatch, capsys, "fit", "--config", imagefolder)
    assert status != 0 and "data.init_args.root" in err, err[-2000:]
    # One line naming the folder and the key to set, one pointing at the traceback; no traceback itself.
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "path/to/image_folder" in errors[0], err[-2000:]
    assert "Traceback" not in err and "--verbose" in err, err[-2000:]
    with pytest.raises(Exception) as verbose:  # with --verbose, the exception itself: Python prints its traceback
        terminal(monkeypatch, capsys, "fit", "--config", imagefolder, "--verbose")
    assert "FileNotFoundError" in "".join(traceback.format_exception(verbose.value))


def test_missing_environment_package_is_one_line_naming_the_install(monkeypatch, capsys):
    import importlib.util

    if importlib.util.find_spec("Box2D") is not None:
        pytest.skip("Box2D is installed here")
    status, out, err = terminal(monkeypatch, capsys, "fit", "--config", str(CONFIGS / "rl" / "ppo_lunarlander.yaml"))
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 1 and len(errors) == 1 and "box2d" in errors[0].lower(), err[-2000:]
    assert '".[rl]"' in errors[0], errors[0]  # the zoo's extra, whose wheels need no swig
    # Nor does the exception checkpoint's save announce a "weights_only" default that reads like a load.
    assert "Traceback" not in err and "weights_only" not in out + err, err[-2000:]


# What Lightning and torch print on every run that no user can act on (zoo.app.terminal.quiet_uninformative_messages).
NOISE = (
    "Tip:",
    "litlogger",
    "LeafSpec",
    "FLOPs",
    "dirpath has changed",
    "estimate number of stepping batches",
    "already configured with model summary",
)


@pytest.mark.slow
def test_plain_fit_and_evaluation_print_nothing_a_user_cannot_act_on():
    proc = run_cli("fit", "--config", str(TINY), "--trainer.max_epochs=1", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Total params" in proc.stdout + proc.stderr  # the model summary itself stays
    last = next(line for line in proc.stdout.splitlines() if line.startswith("Last checkpoint:")).split(": ", 1)[1]
    outputs = [proc]
    for sub in ("validate", "test", "predict"):
        outputs.append(run_cli(sub, "--config", str(TINY), f"--ckpt_path={last}", timeout=300))
        assert outputs[-1].returncode == 0, outputs[-1].stderr[-3000:]
    for out in outputs:
        printed = out.stdout + out.stderr
        assert not [n for n in NOISE if n in printed], printed[-3000:]
        assert "Warning" not in printed, printed[-3000:]


@pytest.mark.parametrize(
    "override, named",
    [
        ("--model.init_args.no_such_key=1", "no_such_key"),
        ("--model.init_args.optimizer.lr=fast", "lr"),
        ("--model.class_path=zoo.cnn.NoSuchModule", "NoSuchModule"),
        ("--trainer.max_epochz=3", "max_epochz"),
    ],
    ids=["unknown-key", "wrong-type", "unknown-class", "unknown-trainer-key"],
)
def test_bad_config_exits_nonzero_naming_the_key(override, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli("fit", "--config", str(TINY), override)
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert named in err.split("error:", 1)[-1], err[-2000:]


def test_main_job_prints_its_final_metrics_and_where_run_and_checkpoint_are(embedded_store, monkeypatch, capsys):
    """With the progress bar off too: a table of the final metrics (the monitored one first), the run's page."""
    status, out, err = terminal(
        monkeypatch,
        capsys,
        "fit",
        "--config",
        str(TINY),
        "--trainer.max_epochs=1",
        "--trainer.enable_progress_bar=false",
    )
    assert status == 0, err[-3000:]
    lines = out.splitlines()
    table = lines[lines.index("Final metrics:") + 1 :]
    assert table[0].split()[0] == "val/acc" and 0 <= float(table[0].split()[1]) <= 1, out
    assert {"val/loss", "train/loss"} <= {line.split()[0] for line in table[:4]}, out
    assert not any(line.split()[0].startswith(("grad", "lr")) for line in table if line.startswith("  ")), out
    assert "MLflow run:" in out
    assert f"mlflow ui --backend-store-uri sqlite:///{Path.cwd().resolve() / 'mlflow.db'}" in out
    assert re.search(r"http://127\.0\.0\.1:5000/#/experiments/\d+/runs/\w+", out), out
    best = next(line for line in lines if line.startswith("Best checkpoint:")).split(": ", 1)[1]
    assert Path(best).is_file()


def test_a_fit_without_validation_says_so_prints_its_final_metrics_and_monitors_nothing(
    embedded_store, monkeypatch, capsys
):
    """No validation loop: no warning that the family's metric (val/acc) is missing, no "best" copy of the last
    checkpoint, one line saying the last checkpoint is the model, and the training loss in the final table."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status, out, err = terminal(
            monkeypatch, capsys, "fit", "--config", str(TINY), "--trainer.limit_val_batches=0",
            "--trainer.max_steps=3", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
        )  # fmt: skip
    assert status == 0, err[-3000:]
    said = [str(w.message) for w in caught] + err.splitlines()
    assert not [m for m in said if "monitored key" in m or "val/acc" in m], said
    lines = out.splitlines()
    table = lines[lines.index("Final metrics:") + 1 :]
    assert table[0].split()[0] == "train/loss", out
    assert "No validation: the last checkpoint is the model" in lines, out
    last = next(line for line in lines if line.startswith("Last checkpoint:")).split(": ", 1)[1]
    assert [p.name for p in Path(last).parent.iterdir()] == ["last.ckpt"]
    # Fewer steps than the logging interval: nothing was logged, and the table says so.
    status, out, err = terminal(
        monkeypatch, capsys, "fit", "--config", str(TINY), "--trainer.limit_val_batches=0", "--trainer.max_steps=2",
        "--trainer.log_every_n_steps=5", "--trainer.enable_progress_bar=false", "--trainer.logger=false",
    )  # fmt: skip
    assert status == 0 and "Final metrics: none logged (every 5 steps" in out, out + err[-3000:]


def test_16_mixed_on_cpu_runs_as_bf16():
    with pytest.warns(UserWarning, match="bf16"):
        c = cli("fit", "--config", str(TINY), *FAST, "--trainer.precision=16-mixed")
    assert c.trainer.precision == "bf16-mixed"


def test_bf16_mixed_fits_on_cpu():
    c = cli("fit", "--config", str(TINY), "--trainer.max_epochs=1", "--trainer.precision=bf16-mixed")
    assert c.trainer.precision == "bf16-mixed"
    assert torch.isfinite(c.trainer.callback_metrics["val/loss"])


def test_fit_without_a_logger():
    # LearningRateMonitor is a default callback and raises without a logger: the CLI drops it instead.
    c = cli("fit", "--config", str(TINY), *FAST, "--trainer.logger=false")
    assert not c.trainer.loggers
    assert torch.isfinite(c.trainer.callback_metrics["val/loss"])
    # A second run without a logger starts afresh: Lightning resumes from any last.ckpt in its checkpoint
    # folder, so each run gets a folder of its own.
    again = cli("fit", "--config", str(TINY), *FAST, "--trainer.logger=false")
    assert again.trainer.global_step == c.trainer.global_step
    first, second = (Path(x.trainer.checkpoint_callback.last_model_path).parent for x in (c, again))
    assert first != second and first.parent.name.startswith("run-")


def test_summary_after_test_after_fit_names_the_checkpoints_written(capsys):
    """Testing the best checkpoint restores the checkpoint callback's state as saved then (before last.ckpt
    existed); the summary and the MLflow model must still name the files this run wrote."""
    c = cli(
        "fit",
        "--config",
        str(TINY),
        "--test_after_fit=true",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1",
        "--trainer.limit_test_batches=1",
        "--trainer.enable_progress_bar=false",
    )
    last = c.trainer.checkpoint_callback.last_model_path
    assert last and Path(last).is_file()
    assert f"Last checkpoint: {last}" in capsys.readouterr().out


def test_the_final_metrics_table_puts_the_monitored_metric_first_and_leaves_out_gradients_and_rates():
    from zoo.app.hooks import metrics_table

    metrics = {"grad/norm": 1.0, "lr-AdamW": 0.1, "epoch": 3, "train/loss": 0.5, "val/acc": 0.9, "val/loss": 0.4}
    table = metrics_table({k: torch.tensor(v) for k, v in metrics.items()}, monitor="val/loss")
    assert table[0] == "Final metrics:"
    assert [line.split()[0] for line in table[1:]] == ["val/loss", "val/acc", "train/loss"], table
    assert float(table[1].split()[1]) == pytest.approx(0.4)
    assert metrics_table({"grad/norm": torch.tensor(1.0)}) == []


def test_help_is_answered_before_torch_loads_and_names_mlflow_models_and_verbose():
    import subprocess
    import sys

    from conftest import ROOT

    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "cli.py"), "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "lightning", "mlflow", "jsonargparse"}, sorted(imported)
    for named in ("fit", "predict", "models:/<name>/<version>", "runs:/<run_id>/model", "--verbose", "--help"):
        assert named in proc.stdout, (named, proc.stdout)
