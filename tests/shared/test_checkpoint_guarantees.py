"""What a checkpoint guarantees (issue 17): one weights-only reader behind every way in, files that do not load say
which of truncated / not a checkpoint / would run code they are, and a checkpoint meeting a config says who wins."""

from __future__ import annotations

import json
import os
import pickle
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import CONFIGS, cli

from zoo.cnn import ClassifierModule
from zoo.io.weights import CheckpointError, UnsafeCheckpointError

TINY = str(CONFIGS / "cnn" / "convnet_digits.yaml")
FAST = ("--trainer.max_epochs=1", "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=2")


class _Payload:
    """Unpickled, it would create ``marker``: the proof that a load ran code from the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _crafted(tmp_path: Path, name: str = "evil.ckpt", zip_format: bool = True) -> tuple[Path, Path]:
    """A checkpoint-shaped file carrying the payload (torch.save's zip format, or a plain pickle) and its marker."""
    marker, path = tmp_path / f"pwned-{name}", tmp_path / name
    ckpt = {"state_dict": {"net.head.weight": _Payload(marker)}, "hyper_parameters": {}}
    if zip_format:
        torch.save(ckpt, path)
    else:
        path.write_bytes(pickle.dumps(ckpt))
    return path, marker


@pytest.fixture
def trained(digits_fit) -> Path:
    """The best checkpoint of the shared one-epoch digits fit (conftest)."""
    return digits_fit.best


def cli_error(monkeypatch, capsys, *args: str) -> str:
    """``python cli.py <args>`` as a terminal runs it (cli.run), in-process: the one ``error:`` line it exits with."""
    from cli import run

    monkeypatch.setattr(sys, "argv", ["cli.py", *args])
    with pytest.raises(SystemExit) as exit_info:
        run()
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 1 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    return errors[0]


# -- 1. no code from any file, by any path -------------------------------------------------------------------


def _module_classes():
    from zoo.clip import ContrastiveModule
    from zoo.diffusion import DiffusionModule
    from zoo.gpt import CausalLMModule
    from zoo.rl import A2CModule, IMPALAModule, PPOModule, SACModule, TD3Module

    return [
        ClassifierModule,
        CausalLMModule,
        ContrastiveModule,
        DiffusionModule,
        PPOModule,
        A2CModule,
        IMPALAModule,
        SACModule,
        TD3Module,
    ]


@pytest.mark.parametrize("zip_format", [True, False], ids=["torch.save", "pickle"])
@pytest.mark.parametrize("cls", _module_classes(), ids=lambda c: c.__name__)
def test_every_modules_load_from_checkpoint_refuses_code(tmp_path, cls, zip_format):
    path, marker = _crafted(tmp_path, zip_format=zip_format)
    with pytest.raises(
        UnsafeCheckpointError, match=rf"{path.name}: it is a pickle that would execute code .*posix\.system"
    ):
        cls.load_from_checkpoint(path)
    assert not marker.exists()


def test_load_from_a_url_is_weights_only_too(tmp_path, served, trained):
    # Lightning's own load_from_checkpoint unpickles an http(s) path with weights_only=False: this ran the payload.
    path, marker = _crafted(tmp_path)
    with pytest.raises(UnsafeCheckpointError, match=rf"{served}/evil.ckpt: it is a pickle that would execute code"):
        ClassifierModule.load_from_checkpoint(f"{served}/evil.ckpt")
    assert not marker.exists()
    (tmp_path / "good.ckpt").write_bytes(trained.read_bytes())
    remote, local = (
        ClassifierModule.load_from_checkpoint(f"{served}/good.ckpt"),
        ClassifierModule.load_from_checkpoint(trained),
    )
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(remote.eval()(x), local.eval()(x), rtol=0, atol=0)


def test_cli_ckpt_path_refuses_code_naming_the_file(tmp_path, monkeypatch, capsys):
    path, marker = _crafted(tmp_path)
    line = cli_error(monkeypatch, capsys, "validate", "--config", TINY, f"--ckpt_path={path}")
    assert f"refused to load {path}: it is a pickle that would execute code" in line and "posix.system" in line
    assert not marker.exists()


def test_cli_reads_a_url_weights_only(tmp_path, served, trained, monkeypatch, capsys):
    path, marker = _crafted(tmp_path)
    line = cli_error(monkeypatch, capsys, "validate", f"--ckpt_path={served}/{path.name}")
    assert f"{served}/evil.ckpt: it is a pickle that would execute code" in line and not marker.exists()
    (tmp_path / "good.ckpt").write_bytes(trained.read_bytes())
    remote = cli("validate", f"--ckpt_path={served}/good.ckpt", *FAST[2:])
    local = cli("validate", f"--ckpt_path={trained}", *FAST[2:])
    assert remote.trainer.callback_metrics["val/acc"] == local.trainer.callback_metrics["val/acc"]


def test_init_weights_refuses_code(tmp_path, monkeypatch, capsys):
    path, marker = _crafted(tmp_path, "evil.pth")
    line = cli_error(monkeypatch, capsys, "fit", "--config", TINY, *FAST, f"--model.init_args.init_weights={path}")
    assert "would execute code" in line and "posix.system" in line and not marker.exists()


def _importers(tmp_path: Path, marker: Path):
    """Each importer with the payload where it reads weights: a Hugging Face, Llama, CLIP, diffusers folder, a file."""
    from zoo.clip.hf import load_hf_clip_into
    from zoo.cnn import TorchvisionNet
    from zoo.diffusion.convert import load_dit_weights
    from zoo.gpt.formats.hf import load_pretrained

    def folder(name: str, weights: str, config: dict) -> Path:
        (tmp_path / name).mkdir()
        torch.save({"w": _Payload(marker)}, tmp_path / name / weights)
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        return tmp_path / name

    return {
        "gpt2": lambda: load_pretrained(None, folder("gpt2", "pytorch_model.bin", {"model_type": "gpt2"})),
        "llama": lambda: load_pretrained(None, folder("llama", "pytorch_model.bin", {"model_type": "llama"})),
        "clip": lambda: load_hf_clip_into(None, folder("clip", "pytorch_model.bin", {})),
        "diffusers": lambda: load_dit_weights(None, folder("dit", "diffusion_pytorch_model.bin", {})),
        "torchvision": lambda: TorchvisionNet("resnet18", 1000, weights_path=str(_crafted(tmp_path, "tv.pth")[0])),
    }


@pytest.mark.parametrize("importer", ["gpt2", "llama", "clip", "diffusers", "torchvision"])
def test_importers_refuse_code(tmp_path, importer):
    marker = tmp_path / "pwned-evil.ckpt"
    with pytest.raises(UnsafeCheckpointError, match="would execute code"):
        _importers(tmp_path, marker)[importer]()
    assert not marker.exists() and not (tmp_path / "pwned-tv.pth").exists()


# -- 6. truncated and foreign files say so -------------------------------------------------------------------


def _broken(trained: Path, tmp_path: Path, kind: str) -> tuple[Path, str]:
    path = tmp_path / f"{kind}.ckpt"
    if kind == "truncated":
        data = trained.read_bytes()[: trained.stat().st_size // 2]
        path.write_bytes(data)
        return path, rf"{path} is truncated \({len(data)} bytes\)"
    if kind == "random":
        path.write_bytes(
            torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
            .numpy()
            .tobytes()
        )
        return path, rf"{path} is not a PyTorch checkpoint"
    path, _ = _crafted(tmp_path, f"{kind}.ckpt")
    return path, rf"refused to load {path}: it is a pickle that would execute code"


@pytest.mark.parametrize("kind", ["truncated", "random", "code"])
def test_a_file_that_does_not_load_says_why_in_one_line(trained, tmp_path, monkeypatch, capsys, kind):

    path, says = _broken(trained, tmp_path, kind)
    line = cli_error(monkeypatch, capsys, "validate", "--config", TINY, f"--ckpt_path={path}")
    assert re.search(says, line), line
    others = {"truncated": "truncated", "random": "not a PyTorch checkpoint", "code": "would execute code"}
    assert [k for k, v in others.items() if v in line] == [kind], line  # one verdict, the right one
    with pytest.raises(CheckpointError, match=says):
        ClassifierModule.load_from_checkpoint(path)


def _safetensors(header, data: bytes = bytes(16), length: int | None = None) -> bytes:
    """A safetensors file: the header's length (or ``length``, a lie), the header (JSON or raw bytes), the data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return (len(raw) if length is None else length).to_bytes(8, "little") + raw + data


def _tampered_zip(member: str, declared: int) -> bytes:
    """torch.save's zip with ``member``'s sizes, in its local header and the central directory, set to ``declared``."""
    import io
    import struct
    import zipfile

    buffer = io.BytesIO()
    torch.save({"state_dict": {"w": torch.arange(64.0)}}, buffer)
    data = bytearray(buffer.getvalue())
    (info,) = [i for i in zipfile.ZipFile(buffer).infolist() if i.filename.endswith(member)]
    struct.pack_into("<II", data, info.header_offset + 18, declared, declared)  # local header: sizes at 18
    central = data.find(b"PK\x01\x02")  # the central directory's first entry
    while data[central + 46 : central + 46 + len(info.filename)] != info.filename.encode():
        central = data.find(b"PK\x01\x02", central + 4)
    struct.pack_into("<II", data, central + 20, declared, declared)  # central directory entry: sizes at 20
    return bytes(data)


W = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
# Files that declare sizes or offsets they do not have: each is one CheckpointError naming the file and what is
# wrong, never a MemoryError, an OverflowError or a traceback.
ABSURD = {
    "header length 2**63": (
        "w.safetensors",
        _safetensors({"w": W}, length=2**63),
        "corrupt.*declare a 9223372036854775808-byte header",
    ),
    "header length 2**62": (
        "w.safetensors",
        _safetensors({"w": W}, length=2**62),
        "corrupt.*-byte header, past safetensors' limit",
    ),
    "header longer than the file": ("w.safetensors", _safetensors({"w": W}, length=10**6), "is truncated"),
    "header not JSON": ("w.safetensors", _safetensors(b"{not json"), "corrupt.*header is not safetensors' JSON"),
    "header a list": ("w.safetensors", _safetensors([1, 2]), "corrupt.*header is not safetensors' JSON"),
    "an entry not a dict": ("w.safetensors", _safetensors({"w": 3}), "corrupt.*header is not safetensors' JSON"),
    "offsets past the data": ("w.safetensors", _safetensors({"w": {**W, "data_offsets": [0, 2**40]}}), "is truncated"),
    "negative offsets": (
        "w.safetensors",
        _safetensors({"w": {**W, "data_offsets": [-4, 12]}}),
        r"data_offsets \[-4, 12\]",
    ),
    "a shape its bytes do not hold": (
        "w.safetensors",
        _safetensors({"w": {**W, "shape": [2**40]}}),
        r"corrupt.*tensor 'w' \(F32, shape \[1099511627776\]\) needs 4398046511104 bytes",
    ),
    "a zip record past the end": (
        "w.ckpt",
        _tampered_zip("data/0", 2**32 - 1),
        "corrupt.*record .*data/0 holds 4294967295 bytes",
    ),
    "a zip data.pkl past the end": (
        "w.ckpt",
        _tampered_zip("data.pkl", 2**31),
        "corrupt.*record .*data.pkl declares 2147483648",
    ),
}


@pytest.mark.parametrize("case", ABSURD)
def test_absurd_sizes_and_headers_are_one_error_naming_the_file(tmp_path, case, monkeypatch, capsys):
    import fsspec

    from zoo.io.weights import load_file

    name, data, says = ABSURD[case]
    (tmp_path / name).write_bytes(data)
    with fsspec.open(f"memory://{tmp_path.name}/{name}", "wb") as f:
        f.write(data)
    for path in (str(tmp_path / name), f"memory://{tmp_path.name}/{name}"):  # a local file, downloaded bytes
        with pytest.raises(CheckpointError) as err:
            load_file(path)
        assert str(err.value).startswith(f"{path} is ") and "\n" not in str(err.value), str(err.value)
        assert re.search(says, str(err.value)), str(err.value)
    if name.endswith(".ckpt"):  # through the command line: one error line
        line = cli_error(monkeypatch, capsys, "validate", "--config", TINY, f"--ckpt_path={tmp_path / name}")
        assert re.search(says, line), line


# -- 4. a checkpoint meets a config, loudly ------------------------------------------------------------------


def test_a_shape_changing_override_is_refused_naming_the_key(trained, monkeypatch, capsys):
    line = cli_error(
        monkeypatch, capsys, "validate", f"--ckpt_path={trained}", "--model.init_args.net.init_args.width=16"
    )
    assert "model.init_args.net.init_args.width=16 (trained with 8) changes the shape" in line, line


def test_other_overrides_win_and_are_listed(trained, caplog):
    import logging

    with caplog.at_level(logging.INFO):
        c = cli("validate", f"--ckpt_path={trained}", "--model.init_args.label_smoothing=0.1", *FAST[2:])
    assert c.model.hparams.label_smoothing == 0.1
    assert "model.init_args.label_smoothing: 0.1 (this run's config) wins over the checkpoint's 0.0" in caplog.text


def test_a_resume_lists_its_overrides_and_keeps_the_sizes_it_derived(trained, caplog):
    import logging

    # The YAML leaves num_classes to the data (None); the checkpoint recorded 10: no difference, no refusal.
    with caplog.at_level(logging.INFO):
        c = cli(
            "fit",
            "--config",
            TINY,
            *FAST,
            "--trainer.max_epochs=2",
            f"--ckpt_path={trained}",
            "--model.init_args.label_smoothing=0.1",
        )
    assert c.trainer.current_epoch == 2 and c.model.hparams.label_smoothing == 0.1
    listed = [line for line in caplog.text.splitlines() if "wins over the checkpoint's" in line]
    assert len(listed) == 1 and "model.init_args.label_smoothing: 0.1" in listed[0], caplog.text[-2000:]


def test_a_checkpoint_of_another_module_class_is_refused_in_one_line(trained, tmp_path, monkeypatch, capsys):
    gpt = yaml.safe_load((CONFIGS / "gpt" / "gpt_tiny.yaml").read_text())["model"]
    ckpt = torch.load(trained, weights_only=True)
    ckpt["hyper_parameters"] = {"_class_path": gpt["class_path"], **gpt["init_args"]}
    torch.save(ckpt, tmp_path / "gpt.ckpt")
    line = cli_error(monkeypatch, capsys, "validate", "--config", TINY, f"--ckpt_path={tmp_path / 'gpt.ckpt'}")
    assert (
        f"{tmp_path / 'gpt.ckpt'} holds a zoo.gpt.CausalLMModule checkpoint; this run's model is "
        "zoo.cnn.ClassifierModule; drop --config"
    ) in line, line


def test_a_fine_tuned_checkpoint_never_needs_its_init_weights_again(trained, tmp_path):
    weights = tmp_path / "pretrained.ckpt"
    weights.write_bytes(trained.read_bytes())
    tuned = cli("fit", "--config", TINY, *FAST, f"--model.init_args.init_weights={weights}")
    best = tuned.trainer.checkpoint_callback.best_model_path
    weights.unlink()  # the pretrained weights are gone: the checkpoint alone must do
    v = cli("validate", f"--ckpt_path={best}", *FAST[2:])
    assert v.model.hparams.init_weights is None  # a stored location: not the file's to choose, and never read
    assert float(v.trainer.callback_metrics["val/acc"]) == pytest.approx(
        float(tuned.trainer.checkpoint_callback.best_model_score)
    )
    ClassifierModule.load_from_checkpoint(best)  # nor in Python
