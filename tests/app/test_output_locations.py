"""Where a run writes is the run's own: a checkpoint never chooses an output folder, every output lands under the
run's folder (never in the working directory, never outside), and no output replaces an existing file.

The attacks are checkpoints that passed ``torch.load(weights_only=True)``: a real tiny checkpoint whose stored data
config names a folder outside the run, holding a user's file under the very name predict would write.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, cli, terminal
from lightning.pytorch import Trainer

import datamodules.gym_envs  # noqa: F401  registers NumpyCartPole-v1, which renders without pygame
from datamodules import ShapesDataModule
from zoo.errors import InputError
from zoo.io.build import drops_location
from zoo.io.files import check_output_name
from zoo.tracking import new_run_dir, run_dir

DIFFUSION_TINY = str(CONFIGS / "diffusion" / "tiny.yaml")
USERS_FILE = b"a user's file, not the zoo's"

pytestmark = pytest.mark.usefixtures("one_thread")


def _fit_once(tmp_path_factory, tracking_uri: str, *args: str) -> Path:
    """The last checkpoint of a tiny fit in a folder of its own, shared by the tests of this file."""
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("fit"))
        mp.setenv("MLFLOW_TRACKING_URI", tracking_uri)
        torch.set_num_threads(1)
        try:
            return Path(cli("fit", *args).trainer.checkpoint_callback.last_model_path).resolve()
        finally:
            torch.set_num_threads(threads)


@pytest.fixture
def ppo_checkpoint(ppo_fit) -> Path:
    return ppo_fit.last  # the tiny PPO config fitted once for the suite (conftest)


@pytest.fixture(scope="module")
def diffusion_checkpoint(tmp_path_factory, _shared_tracking_uri) -> Path:
    return _fit_once(tmp_path_factory, _shared_tracking_uri, "--config", DIFFUSION_TINY, "--trainer.max_epochs=1")


def _tampered(ckpt: Path, out: Path, **data) -> Path:
    """``ckpt`` with its stored data config changed, still a plain-data (weights-only) checkpoint."""
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["datamodule_hyper_parameters"] = {**checkpoint["datamodule_hyper_parameters"], **data}
    torch.save(checkpoint, out)
    return out


def _users_folder(tmp_path: Path, *names: str) -> Path:
    """A folder outside any run holding a user's files under the names predict would write."""
    folder = tmp_path.parent / f"{tmp_path.name}-users-folder"
    folder.mkdir()
    for name in names:
        (folder / name).write_bytes(USERS_FILE)
    return folder


def _unchanged(folder: Path, *names: str) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted(names), "predict wrote into the user's folder"
    for name in names:
        assert (folder / name).read_bytes() == USERS_FILE, f"predict replaced the user's {name}"


@pytest.mark.parametrize("video_dir", ["absolute", "../../../escape"])
def test_a_checkpoint_never_chooses_where_the_video_goes(tmp_path, ppo_checkpoint, video_dir):
    gif = "NumpyCartPole-v1_episode.gif"
    users = _users_folder(tmp_path, gif)
    value = str(users) if video_dir == "absolute" else video_dir + "/" + users.name
    evil = _tampered(
        ppo_checkpoint,
        tmp_path / "shared.ckpt",
        env_id="NumpyCartPole-v1",
        record_video=True,
        env_kwargs={"width": 24, "height": 16},
        video_dir=value,
    )
    p = cli("predict", "--ckpt_path", str(evil))
    _unchanged(users, gif)
    video = run_dir(p.trainer) / "videos" / gif  # where a run's video goes when the user names no folder
    assert video.stat().st_size > 0 and video.read_bytes()[:3] == b"GIF"


def test_a_checkpoint_never_chooses_where_samples_go_and_nothing_lands_in_the_working_directory(
    tmp_path, diffusion_checkpoint
):
    class_name = ShapesDataModule(image_size=8).class_names[0]  # the data tiny.yaml trains on
    names = [f"0000_{class_name}.png", "grid.png", "grid_0000.png"]  # today's names and the old per-batch grid's
    users = _users_folder(tmp_path, *names)
    evil = _tampered(diffusion_checkpoint, tmp_path / "shared.ckpt", output_dir=str(users), num_samples=2, labels=[0])
    before = set(os.listdir("."))
    p = cli("predict", "--ckpt_path", str(evil))
    _unchanged(users, *names)
    assert set(os.listdir(".")) - before <= {"runs", "mlruns"}  # the run's folder and MLflow's artifact store
    folder = run_dir(p.trainer).resolve()
    rows = [json.loads(line) for line in (folder / "predictions.jsonl").read_text().splitlines()]
    assert [Path(r["image"]).name for r in rows] == [f"0000_{class_name}.png", f"0001_{class_name}.png"]
    for row in rows:  # predictions.jsonl names the files where they are: inside the run's folder
        assert Path(row["image"]).resolve().parent == folder / "images" and Path(row["image"]).is_file()


def test_a_users_output_folder_is_a_name_inside_the_run_folder(diffusion_checkpoint):
    p = cli(
        "predict",
        "--ckpt_path",
        str(diffusion_checkpoint),
        "--data.init_args.num_samples=1",
        "--data.init_args.output_dir=samples/ddim",
    )
    assert (run_dir(p.trainer) / "samples" / "ddim" / "grid.png").is_file()
    assert not Path("samples").exists()


def test_two_predicts_never_overwrite_each_others_outputs(ppo_checkpoint):
    first = cli("predict", "--ckpt_path", str(ppo_checkpoint))
    written = run_dir(first.trainer) / "predictions.csv"
    mine = written.read_bytes()
    second = cli("predict", "--ckpt_path", str(ppo_checkpoint), "--data.init_args.predict_episodes=1")
    assert run_dir(second.trainer) != run_dir(first.trainer) and written.read_bytes() == mine
    # Even logging into the same MLflow run, hence the same folder, the second writes beside the first.
    third = cli(
        "predict",
        "--ckpt_path",
        str(ppo_checkpoint),
        "--data.init_args.predict_episodes=1",
        f"--trainer.logger.init_args.run_id={first.trainer.logger.run_id}",
    )
    assert run_dir(third.trainer) == run_dir(first.trainer) and written.read_bytes() == mine
    rows = list(csv.DictReader((written.parent / "predictions-1.csv").read_text().splitlines()))
    assert [int(r["episode"]) for r in rows] == [0]


@pytest.mark.parametrize("name", ["/tmp/elsewhere", "../elsewhere", "videos/../../elsewhere", ".."])
def test_an_output_name_that_leaves_the_run_folder_is_refused_naming_the_key(name):
    with pytest.raises(InputError, match=r"data\.init_args\.video_dir=.*outside the run's folder"):
        check_output_name("data.init_args.video_dir", name)


@pytest.mark.parametrize("name", [None, "videos", "a/b", "a/../b", "./videos", "..videos"])
def test_an_output_name_inside_the_run_folder_is_kept(name):
    assert check_output_name("data.init_args.video_dir", name) == name


def test_a_users_folder_outside_the_run_is_one_error_line(ppo_checkpoint, monkeypatch, capsys):
    status, out, err = terminal(
        monkeypatch, capsys, "predict", "--ckpt_path", str(ppo_checkpoint), "--data.init_args.video_dir=/tmp/elsewhere"
    )
    assert status != 0
    lines = [line for line in out.splitlines() + err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "data.init_args.video_dir='/tmp/elsewhere' is outside the run's folder" in lines[0]
    assert "Traceback" not in err


def test_every_dropped_key_is_an_argument_of_a_datamodule():
    import inspect

    import datamodules

    classes = [getattr(datamodules, name) for name in datamodules.__all__]
    for key in ("video_dir", "output_dir", "download", "root", "path", "paths", "gpt2_dir", "prompts_file"):
        assert drops_location(key) and any(key in inspect.signature(cls).parameters for cls in classes), key
    for key in ("batch_size", "env_id", "image_size", "tokenizer", "num_envs", "seed"):
        assert not drops_location(key), key


def test_two_runs_started_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    monkeypatch.setattr("zoo.tracking.runs.time.strftime", lambda fmt: "20260101-000000")
    trainer = Trainer(logger=False, default_root_dir=str(tmp_path), enable_checkpointing=False)
    folders = {new_run_dir(trainer, "predict") for _ in range(100)}
    assert len(folders) == 100
