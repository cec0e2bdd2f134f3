"""Every input mistake a careless user makes is one ``error:`` line naming the input and its fix, a non-zero exit
and no traceback (README "When something is wrong"); an unreadable image among good ones is skipped with a warning
naming it, or fails naming it with ``on_unreadable=error``.

Most cases run ``cli.run()`` in this process (what ``python cli.py`` runs, without the interpreter start); one runs
``cli.py`` in a subprocess to show the same holds there and that ``--verbose`` brings the traceback back.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, ROOT, cli, run_cli

CNN = str(CONFIGS / "cnn" / "convnet_digits.yaml")
GPT = str(CONFIGS / "gpt" / "gpt_tiny.yaml")
CLIP = str(CONFIGS / "clip" / "tiny.yaml")
RL = str(CONFIGS / "rl" / "ppo_tiny.yaml")
# "Billion laughs": 9 levels of 9 aliases, a few hundred bytes that a tree walk expands to 9**9 values.
ALIAS_BOMB = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
ONE_STEP = ["--trainer.max_steps=1", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0"]


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def run_in_process(monkeypatch, capsys, *args: str, stream: str = "err") -> tuple[int, str]:
    """``python cli.py <args>`` in this process: its exit status and stderr (or stdout)."""
    import cli

    monkeypatch.setattr(sys, "argv", ["cli.py", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli.run()
    return exit_info.value.code, getattr(capsys.readouterr(), stream)


def _files(folder: Path) -> dict[str, str]:
    """Inputs the cases name: a GPT corpus, empty and binary text, a long prompt, caption CSVs, a sharded checkpoint
    folder, a file where a folder is expected."""
    from PIL import Image

    folder.mkdir(exist_ok=True)
    (folder / "corpus.txt").write_text("the cat sat on the mat\n" * 40)
    (folder / "empty.txt").write_text("")
    (folder / "binary.txt").write_bytes(bytes(range(256)) * 4)
    (folder / "long_prompt.txt").write_text("x" * 100 + "\n")
    (folder / "afile").write_text("a file, not a folder")
    (folder / "bomb.yaml").write_text(ALIAS_BOMB)
    (folder / "recursive.yaml").write_text("trainer: &t {callbacks: [*t]}\n")
    (folder / "pics").mkdir(exist_ok=True)
    rows = ["image,caption"]
    for i in range(6):
        Image.new("RGB", (16, 16), (40 * i, 0, 0)).save(folder / "pics" / f"{i}.png")
        rows.append(f"pics/{i}.png,a red square {i}")
    (folder / "captions.csv").write_text("\n".join(rows) + "\n")
    (folder / "no_caption_column.csv").write_text("\n".join(rows).replace("caption", "text") + "\n")
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save({"state_dict": {"net.w": torch.zeros(2)}}, checkpoint_id=folder / "sharded", no_dist=True)
    from safetensors.torch import save_file

    save_file({"wte.weight": torch.zeros(3, 4), "extra.bias": torch.zeros(2)}, folder / "other_net.safetensors")
    (folder / "hf_string_size").mkdir(exist_ok=True)  # a transformers folder whose config.json quotes a size
    (folder / "hf_string_size" / "config.json").write_text(json.dumps({**LLAMA_CONFIG, "hidden_size": "64"}))
    return {
        name: str(folder / name)
        for name in (
            "corpus.txt",
            "empty.txt",
            "binary.txt",
            "long_prompt.txt",
            "afile",
            "captions.csv",
            "no_caption_column.csv",
            "sharded",
            "pics",
            "bomb.yaml",
            "recursive.yaml",
            "other_net.safetensors",
            "hf_string_size",
        )
    }


# (command line, with {file} placeholders; text the one error line must hold: the input and the fix)
CASES = {
    "batch_size-negative": (
        ["fit", "--config", CNN, "--data.init_args.batch_size=-1"],
        ["data.init_args.batch_size=-1", "1 or more"],
    ),
    "batch_size-zero": (["fit", "--config", CLIP, "--data.init_args.batch_size=0"], ["data.init_args.batch_size=0"]),
    "num_workers-negative": (
        ["fit", "--config", CNN, "--data.init_args.num_workers=-1"],
        ["data.init_args.num_workers=-1", "0 or more"],
    ),
    "val_fraction-above-1": (
        ["fit", "--config", CNN, "--data.init_args.val_fraction=1.5"],
        ["data.init_args.val_fraction=1.5", "[0, 1)"],
    ),
    "misspelt-nested-key": (
        ["fit", "--config", CNN, "--model.init_args.net.init_args.widht=8"],
        ["model.init_args.net.init_args.widht", "zoo.cnn.ConvNet", "did you mean 'width'"],
    ),
    "max_steps-0": (["fit", "--config", CNN, "--trainer.max_steps=0"], ["trainer.max_steps=0", "trains nothing"]),
    "csv-smaller-than-a-batch": (
        [
            "fit",
            "--config",
            CLIP,
            "--data.init_args.path={captions.csv}",
            "--data.init_args.val_fraction=0.34",
            *ONE_STEP,
        ],
        ["no training batches", "batch_size"],
    ),
    "csv-missing-column": (
        ["fit", "--config", CLIP, "--data.init_args.path={no_caption_column.csv}"],
        ["no_caption_column.csv", "no column 'caption'", "caption_column"],
    ),
    "empty-corpus": (
        ["fit", "--config", GPT, "--data.init_args.path={empty.txt}", *ONE_STEP],
        ["empty.txt", "no text", "data.init_args.path"],
    ),
    "binary-corpus": (
        ["fit", "--config", GPT, "--data.init_args.path={binary.txt}", *ONE_STEP],
        ["binary.txt", "not UTF-8", "data.init_args.path"],
    ),
    "empty-prompts-file": (
        ["predict", "--config", GPT, "--data.init_args.prompts_file={empty.txt}"],
        ["prompts_file", "empty.txt", "no lines"],
    ),
    "binary-prompts-file": (
        ["predict", "--config", GPT, "--data.init_args.prompts_file={binary.txt}"],
        ["prompts_file", "binary.txt", "not UTF-8"],
    ),
    "max_new_tokens-negative": (
        ["predict", "--config", GPT, "--model.init_args.generation.max_new_tokens=-3"],
        ["model.init_args.generation.max_new_tokens=-3"],
    ),
    "prompt-past-block_size": (
        [
            "predict",
            "--config",
            GPT,
            "--data.init_args.path={corpus.txt}",
            "--data.init_args.prompts_file={long_prompt.txt}",
            "--model.init_args.generation.past_block_size=error",
        ],
        ["A prompt of 100 tokens", "block_size 64", "at most 63"],
    ),
    "tracking-uri-through-a-file": (
        ["fit", "--config", CNN, "--trainer.logger.init_args.tracking_uri=sqlite:///{afile}/m.db"],
        ["afile", "is a file, not a folder", "MLFLOW_TRACKING_URI"],
    ),
    "folder-as-ckpt_path": (
        ["validate", "--config", CNN, "--ckpt_path={pics}"],
        ["pics", "not a sharded checkpoint", "checkpoint file"],
    ),
    "lr-negative": (
        ["fit", "--config", CNN, "--model.init_args.optimizer.lr=-1"],
        ["lr=-1.0", "model.init_args.optimizer.lr"],
    ),
    "max_epochs-negative-lightning": (["fit", "--config", CNN, "--trainer.max_epochs=-5"], ["max_epochs", "-5"]),
    "devices-not-a-number": (
        ["fit", "--config", CNN, "--trainer.devices=abc"],
        ["trainer.devices='abc'", "should be an int > 0", "Pass another --trainer.devices"],
    ),
    "accelerator-unknown": (
        ["fit", "--config", CNN, "--trainer.accelerator=foo"],
        ["trainer.accelerator='foo'", "Available names are"],
    ),
    "num_nodes-0": (["fit", "--config", CNN, "--trainer.num_nodes=0"], ["trainer.num_nodes=0", "positive integer"]),
    "accumulate_grad_batches-0": (
        ["fit", "--config", CNN, "--trainer.accumulate_grad_batches=0", *ONE_STEP],
        ["trainer.accumulate_grad_batches=0", "1 or more"],
    ),
    "seed-negative": (["fit", "--config", CNN, "--seed_everything=-5"], ["seed_everything=-5", "0 to 4294967295"]),
    "seed-past-numpy": (
        ["validate", "--config", CNN, "--seed_everything=99999999999"],
        ["seed_everything=99999999999", "true for a random one"],
    ),
    "max_new_tokens-10**12": (
        ["predict", "--config", GPT, "--model.init_args.generation.max_new_tokens=1000000000000"],
        ["model.init_args.generation.max_new_tokens=1,000,000,000,000", "GiB", "ask for fewer"],
    ),
    "gym-unknown-env_kwargs-key": (
        ["fit", "--config", RL, "--data.init_args.env_kwargs={foo: 1}"],
        ["data.init_args.env_kwargs", "'foo'", "it takes: sutton_barto_reward"],
    ),
    "gym-unknown-env_id": (
        ["fit", "--config", RL, "--data.init_args.env_id=NoSuch-v1"],
        ["data.init_args.env_id='NoSuch-v1'", "doesn't exist"],
    ),
    "gym-num_envs-0": (["fit", "--config", RL, "--data.init_args.num_envs=0"], ["data.init_args.num_envs=0"]),
    "gym-wrapper-not-importable": (
        ["fit", "--config", RL, "--data.init_args.wrappers=[no.such.Wrapper]"],
        ["data.init_args.wrappers", "'no.such.Wrapper' cannot be imported"],
    ),
    "tracking-uri-unknown-scheme": (
        ["fit", "--config", CNN, "--trainer.logger.init_args.tracking_uri=foo://bar"],
        ["MLflow has no store for foo://bar", "sqlite://", "MLFLOW_TRACKING_URI"],
    ),
    "yaml-recursive-alias": (["fit", "--config", CNN, "--config", "{recursive.yaml}"], ["recursive YAML alias"]),
    "init_weights-of-another-net": (  # a load is exact or refused: what is left over and what is missing, one line
        ["fit", "--config", GPT, "--model.init_args.init_weights={other_net.safetensors}", *ONE_STEP],
        ["other_net.safetensors", "does not match the configured GPT", "extra.bias: not in model", "missing"],
    ),
    "config.json-string-hidden_size": (
        ["fit", "--config", GPT, "--model.init_args.init_weights={hf_string_size}", *ONE_STEP],
        ["hf_string_size/config.json", "hidden_size is '64' (str), expected an integer"],
    ),
    "sharded-folder-to-one-file-strategy": (
        ["validate", "--config", CNN, "--ckpt_path={sharded}"],
        ["sharded checkpoint folder", "fsdp.yaml", "zoo.train.parallel"],
    ),
}


LLAMA_CONFIG = {
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "max_position_embeddings": 32,
}
GPT2_CONFIG = {"model_type": "gpt2", "vocab_size": 64, "n_positions": 32, "n_layer": 1, "n_embd": 16, "n_head": 2}
CLIP_CONFIG = {
    "model_type": "clip",
    "projection_dim": 8,
    "text_config": {"hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1, "vocab_size": 64},
    "vision_config": {"hidden_size": 16, "image_size": 32, "patch_size": 8, "num_attention_heads": 2},
}


def _read_gpt(folder: Path):
    from zoo.gpt.pretrained import net_kwargs, read_folder

    return net_kwargs(read_folder(folder)[1], folder)


def _read_gpt2(folder: Path):
    from zoo.gpt.formats.hf import load_gpt2

    return load_gpt2(folder)


def _read_llama(folder: Path):
    from zoo.gpt.formats.llama import load_hf

    return load_hf(folder)


def _read_clip(folder: Path):
    from zoo.clip.hf import load_hf_clip

    return load_hf_clip(folder)


def _read_generation(folder: Path):
    from zoo.gpt.pretrained import generation_defaults

    return generation_defaults(folder)


# (reader, file, config, field changed (dotted: nested), wrong value, the words of the type expected)
WRONG_TYPES = [
    (_read_gpt, "config.json", LLAMA_CONFIG, "hidden_size", "64", "an integer"),
    (_read_gpt, "config.json", LLAMA_CONFIG, "num_attention_heads", 2.0, "an integer"),
    (_read_gpt, "config.json", LLAMA_CONFIG, "num_hidden_layers", True, "an integer"),  # true is not 1
    (_read_gpt, "config.json", LLAMA_CONFIG, "rms_norm_eps", "1e-6", "a number"),
    (_read_gpt, "config.json", LLAMA_CONFIG, "tie_word_embeddings", 1, "true or false"),  # 1 is not true
    (_read_gpt, "config.json", LLAMA_CONFIG, "rope_scaling.factor", "8", "a number"),
    (_read_gpt, "config.json", GPT2_CONFIG, "n_embd", "16", "an integer"),
    (_read_gpt2, "config.json", GPT2_CONFIG, "n_layer", None, "an integer"),
    (_read_llama, "config.json", LLAMA_CONFIG, "vocab_size", [64], "an integer"),
    (_read_clip, "config.json", CLIP_CONFIG, "vision_config.patch_size", "8", "an integer"),
    (_read_generation, "generation_config.json", {"do_sample": True}, "temperature", "0.7", "a number or null"),
    (_read_generation, "generation_config.json", {}, "do_sample", "yes", "true or false"),
]


@pytest.mark.parametrize(
    "read, name, config, field, value, expected", WRONG_TYPES, ids=lambda v: getattr(v, "__name__", None)
)
def test_a_config_field_of_the_wrong_type_is_one_line_naming_file_field_value_and_type(
    tmp_path, read, name, config, field, value, expected
):
    from zoo.errors import InputError

    config = json.loads(json.dumps(config))
    *parents, last = field.split(".")
    at = config
    for key in parents:
        at = at.setdefault(key, {})
    at[last] = value
    if name != "config.json":
        (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    (tmp_path / name).write_text(json.dumps(config))
    with pytest.raises(InputError) as err:
        read(tmp_path)
    message = str(err.value)
    assert "\n" not in message and f"{tmp_path / name}" in message, message
    assert f"{field} is {value!r} ({type(value).__name__}), expected {expected}" in message, message


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_an_input_mistake_is_one_error_line_naming_it(case, tmp_path, monkeypatch, capsys, one_thread):
    files = _files(tmp_path / "inputs")
    args, named = CASES[case]
    for name, path in files.items():
        args = [a.replace("{" + name + "}", path) for a in args]
    status, err = run_in_process(monkeypatch, capsys, *args)
    lines = error_lines(err)
    assert status != 0 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    for text in named:
        assert text in lines[0], (text, lines[0])


# A cli.py process each (the README test command's 10 minutes); the same refusals in process: the cases above of
# the misspelt width (its hint) and of the tracking URI's unknown scheme.
@pytest.mark.slow
def test_a_parser_error_is_one_line_through_a_subprocess(tmp_path):
    """``python cli.py`` itself: a key misspelt in YAML is one line and a hint, not the usage before it (60 lines)."""
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text(Path(CNN).read_text().replace("width: 8", "widht: 8"))
    proc = run_cli("fit", "--config", str(bad_yaml), timeout=300)
    assert proc.returncode == 2 and len(error_lines(proc.stderr)) == 1, proc.stderr[-3000:]
    assert "model.init_args.net.init_args.widht" in proc.stderr and "did you mean 'width'" in proc.stderr, proc.stderr
    assert "usage:" not in proc.stderr and len(proc.stderr.splitlines()) <= 2, proc.stderr


@pytest.mark.slow
def test_an_unknown_tracking_scheme_in_the_environment_is_one_line_through_a_subprocess(tmp_path):
    """``MLFLOW_TRACKING_URI=foo://bar``: three tracebacks (102 lines) before, one line now."""
    proc = run_cli("fit", "--config", CNN, env={"MLFLOW_TRACKING_URI": "foo://bar"}, timeout=300)
    lines = error_lines(proc.stderr)
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "foo://bar" in lines[0] and "MLFLOW_TRACKING_URI" in lines[0], lines


def test_a_yaml_alias_bomb_is_one_line_in_bounded_memory(tmp_path):
    """A "billion laughs" --config: one line. In a subprocess whose address space is capped, so that a regression
    fails as a MemoryError traceback rather than taking the machine's memory."""
    import resource

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))

    cmd = [sys.executable, str(ROOT / "cli.py"), "fit", "--config", CNN, "--config", str(bomb)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=cap, timeout=300
    )
    lines = error_lines(proc.stderr)
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "alias bomb" in lines[0] and "1,000,000 values" in lines[0], lines


def test_a_refused_generation_ends_its_run_failed(tmp_path, monkeypatch, capsys, one_thread):
    """The max_new_tokens refusal comes after predict opened its MLflow run: the run ends FAILED, not RUNNING."""
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    args = ["predict", "--config", GPT, "--model.init_args.generation.max_new_tokens=1000000000000"]
    status, err = run_in_process(monkeypatch, capsys, *args)
    assert status == 1 and len(error_lines(err)) == 1, err[-3000:]
    client = MlflowClient(store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs and {r.info.status for r in runs} == {"FAILED"}, [(r.info.run_name, r.info.status) for r in runs]


def test_verbose_keeps_jsonargparse_message_and_help_still_prints(monkeypatch, capsys):
    monkeypatch.setenv("ZOO_VERBOSE", "1")
    status, err = run_in_process(monkeypatch, capsys, "fit", "--config", CNN, "--model.init_args.net.init_args.widht=8")
    assert status == 2 and "Does not validate against any of the Union subtypes" in err, err[-3000:]
    status, out = run_in_process(monkeypatch, capsys, "fit", "--help", stream="out")
    assert status == 0 and "--trainer.max_steps" in out
    assert "models:/<name>@<alias>" in out and "--verbose" in out.split("--trainer.max_steps")[-1], out[-1000:]
    assert "This config's" not in out  # no config: no classes to show


def test_help_with_a_config_lists_its_models_and_datas_options(monkeypatch, capsys):
    status, out = run_in_process(monkeypatch, capsys, "fit", "--config", GPT, "--help", stream="out")
    assert status == 0 and "--trainer.max_steps" in out
    model, data = out.split("This config's model: zoo.gpt.CausalLMModule")[-1].split("This config's data: ")
    assert "--model.init_args.optimizer.lr" in model and "--model.init_args.net" in model
    assert data.startswith("datamodules.TextDataModule")
    assert (
        "--data.init_args.tokenizer {bytes,chars,bpe,gpt2,pretrained}" in data and "--data.init_args.block_size" in data
    )
    assert "usage:" not in model + data  # one usage, the command's


def test_an_unreadable_image_is_skipped_naming_it_or_fails_naming_it(tmp_path, monkeypatch, capsys, one_thread):
    from PIL import Image

    folder = tmp_path / "new"
    folder.mkdir()
    for i in range(2):
        Image.new("L", (8, 8), 100 * i).save(folder / f"{i}.png")
    (folder / "broken.png").write_bytes(b"<html>not an image</html>")
    fit = cli("fit", "--config", CNN, *ONE_STEP)
    ckpt = fit.trainer.checkpoint_callback.last_model_path
    with pytest.warns(UserWarning, match=r"skipped 1 file.*predicting the other 2.*broken\.png"):
        predict = cli("predict", f"--ckpt_path={ckpt}", f"--data.init_args.paths={folder}")
    lg = predict.trainer.logger
    with Path(predict.trainer.default_root_dir, lg.experiment_id, lg.run_id, "predictions.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(Path(r["path"]).name for r in rows) == ["0.png", "1.png"]  # the good files, predicted

    status, err = run_in_process(
        monkeypatch,
        capsys,
        "predict",
        f"--ckpt_path={ckpt}",
        f"--data.init_args.paths={folder}",
        "--data.init_args.on_unreadable=error",
    )
    lines = error_lines(err)
    assert status == 1 and len(lines) == 1 and "broken.png" in lines[0] and "on_unreadable=skip" in lines[0], err

    # A truncated file passes the header check and fails decoding, in a DataLoader worker: still one line naming it
    # (torch re-raises a worker's error with the worker's traceback as its message).
    (folder / "broken.png").unlink()
    Image.effect_noise((64, 64), 50).save(folder / "truncated.png")
    (folder / "truncated.png").write_bytes((folder / "truncated.png").read_bytes()[:300])
    status, err = run_in_process(
        monkeypatch,
        capsys,
        "predict",
        f"--ckpt_path={ckpt}",
        f"--data.init_args.paths={folder}",
        "--data.init_args.num_workers=1",
    )
    lines = error_lines(err)
    assert status == 1 and len(lines) == 1 and "truncated.png" in lines[0] and "Traceback" not in err, err[-3000:]
    assert "does not decode" in lines[0], lines


@pytest.mark.parametrize(
    "message, line",
    [
        (
            'Parser key "model":\n  Does not validate against any of the Union subtypes\n  Errors:\n'
            "    - Problem with given class_path 'zoo.cnn.NoSuchModule':\n        module 'zoo.cnn' has no attribute 'X'\n"
            "    - Expected a <class 'NoneType'>\n  Given value type: <class 'str'>",
            "model (zoo.cnn.NoSuchModule): module 'zoo.cnn' has no attribute 'X'",
        ),
        (
            "Parser key \"model\":\n  Errors:\n    - Problem with given class_path 'zoo.cnn.ClassifierModule':\n"
            "        Group 'optimizer' does not accept option 'learning_rat'\n    - Expected a <class 'NoneType'>",
            "model.init_args.optimizer.learning_rat (zoo.cnn.ClassifierModule): Group 'optimizer' does not accept option "
            "'learning_rat'",
        ),
        (
            'Parser key "trainer.precision":\n  Does not validate against any of the Union subtypes\n  Subtypes: [...]\n'
            "  Errors:\n    - Expected a typing.Literal[64, 32]\n    - Expected a typing.Literal['bf16-mixed']\n"
            "    - Expected a <class 'NoneType'>\n  Given value: 17",
            "trainer.precision: Expected a typing.Literal[64, 32] or Expected a typing.Literal['bf16-mixed']",
        ),
        ("Parser key \"config\": File does not exist: 'x.yaml'", "config: File does not exist: 'x.yaml'"),
    ],
    ids=["unknown-class", "unknown-group-option", "union-of-literals", "missing-config-file"],
)
def test_jsonargparse_messages_become_one_line_with_the_key_path(message, line):
    from zoo.app.parser import parser_error_line

    assert parser_error_line(message) == line
