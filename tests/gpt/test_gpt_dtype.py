"""A folder loads in the dtype asked for (``zoo.io.dtypes``): ``auto`` is the folder's as transformers 5 reads it, every
tensor lands in that dtype without a float32 detour, the logits are transformers' loaded with the same dtype, and
through a trainer the weights are those ``trainer.precision`` trains.

Tolerances: float32 as the other parity tests (1e-5); in bfloat16 and float16 the zoo rotates RoPE and normalises in
float32 where transformers rounds some products to the weights' dtype, so the two round differently: the logits within
2**-5 (bfloat16) and 2**-8 (float16) of the largest one (measured: up to 0.019 and 0.0023 of it, Mixtral and DeepSeek-V3
the widest), and the zoo's no further from the float32 logits than transformers' own (at most 1.25 times, measured
0.90-1.03).
"""

from __future__ import annotations

import json

import pytest
import torch
from test_gpt_pretrained import write_model

from zoo.errors import InputError
from zoo.gpt import CausalLMModule, from_pretrained
from zoo.io import meta_load
from zoo.io.checkpoint import module_from

transformers = pytest.importorskip("transformers")

WITHIN = {torch.float32: None, torch.bfloat16: 2**-5, torch.float16: 2**-8}
CHOICES = {"auto": torch.bfloat16, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@pytest.fixture(scope="module", params=["gpt2", "llama", "deepseek_v3"])
def bf16_folder(request, tmp_path_factory):
    """A tiny random ``arch`` folder saved by transformers in bfloat16 (config.json's ``dtype`` says so)."""
    folder = tmp_path_factory.mktemp(request.param)
    write_model(folder, request.param).to(torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama_bf16(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    write_model(folder, "llama").to(torch.bfloat16).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("choice", list(CHOICES))
def test_every_tensor_is_in_the_dtype_asked_and_the_logits_are_transformers_in_it(bf16_folder, choice):
    ours = from_pretrained(bf16_folder, dtype=choice).net
    theirs = transformers.AutoModelForCausalLM.from_pretrained(bf16_folder, dtype=choice).eval()
    dtype = CHOICES[choice]
    assert theirs.dtype == dtype  # transformers' auto reads the folder as the zoo does
    assert {n: p.dtype for n, p in ours.named_parameters()} == {n: dtype for n, _ in ours.named_parameters()}
    kept = {n: b.dtype for n, b in ours.named_buffers() if b.is_floating_point()}
    # RoPE's tables from a float32 inv_freq, DeepSeek's routing bias in float32: as transformers keeps them
    assert kept == {n: torch.float32 for n in kept}
    assert all(b.dtype == torch.float32 for n, b in theirs.named_buffers() if n.endswith(("inv_freq", "_bias")))
    x = torch.randint(0, theirs.config.vocab_size, (2, 17))
    with torch.no_grad():
        a, b = ours(x), theirs(x).logits
    assert a.dtype == b.dtype == dtype
    if WITHIN[dtype] is None:
        return torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    a, b = a.float(), b.float()
    assert (a - b).abs().max() <= WITHIN[dtype] * b.abs().max()
    exact = transformers.AutoModelForCausalLM.from_pretrained(bf16_folder, dtype="float32").eval()
    with torch.no_grad():
        r = exact(x).logits
    assert (a - r).abs().max() <= 1.25 * (b - r).abs().max()


def test_a_bf16_folder_read_as_bf16_keeps_the_tensors_as_read(bf16_folder, monkeypatch):
    reads, get = {}, meta_load.TensorFiles.__getitem__

    def spied_get(self, key):
        tensor = get(self, key)
        reads[tensor.data_ptr()] = tensor.dtype
        return tensor

    monkeypatch.setattr(meta_load.TensorFiles, "__getitem__", spied_get)
    net = from_pretrained(bf16_folder, dtype="bfloat16").net
    norm = net.norm_f.weight  # taken as read by every layout: no float32 copy made on the way
    assert reads.get(norm.data_ptr()) == torch.bfloat16 and set(reads.values()) == {torch.bfloat16}


def test_auto_without_a_stated_dtype_is_the_weights_and_another_dtype_is_refused(tmp_path):
    folder = tmp_path / "llama"
    write_model(folder, "llama").to(torch.float16).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("dtype", None)
    (folder / "config.json").write_text(json.dumps(config))
    assert transformers.AutoModelForCausalLM.from_pretrained(folder).dtype == torch.float16
    assert from_pretrained(folder).net.tok_emb.weight.dtype == torch.float16
    (folder / "config.json").write_text(json.dumps(config | {"dtype": "bfloat16"}))  # the config's over the weights'
    assert transformers.AutoModelForCausalLM.from_pretrained(folder).dtype == torch.bfloat16
    assert from_pretrained(folder).net.tok_emb.weight.dtype == torch.bfloat16
    (folder / "config.json").write_text(json.dumps(config | {"torch_dtype": "float64"}))  # transformers 4's key
    with pytest.raises(InputError, match=r"states dtype 'float64': the zoo loads float32, bfloat16, float16"):
        from_pretrained(folder)
    assert from_pretrained(folder, dtype="float32").net.tok_emb.weight.dtype == torch.float32


def test_the_memory_budget_counts_the_dtype_loaded(llama_bf16, monkeypatch):
    fp32 = sum(p.numel() * 4 for p in from_pretrained(llama_bf16, dtype="float32").net.parameters())
    monkeypatch.setenv("ZOO_MEMORY_GIB", str(0.75 * fp32 / 2**30))  # room for bf16 weights, not float32 ones
    assert from_pretrained(llama_bf16).net.tok_emb.weight.dtype == torch.bfloat16
    with pytest.raises(InputError, match="over the bound"):
        from_pretrained(llama_bf16, dtype="float32")


def _trained_under(folder, precision: str, init_dtype: str = "auto") -> CausalLMModule:
    """A module whose ``init_weights`` is ``folder``, set up under a trainer of ``precision`` (as a fit sets it up)."""
    import lightning.pytorch as pl

    built = from_pretrained(folder, dtype="float32")
    module = CausalLMModule(built.net, init_weights=str(folder), init_dtype=init_dtype)
    module.trainer = pl.Trainer(precision=precision, accelerator="cpu", logger=False, enable_progress_bar=False)
    module.setup("fit")
    return module


@pytest.mark.parametrize(
    "precision, init_dtype, trained",
    [
        ("bf16-true", "auto", torch.bfloat16),
        ("32-true", "auto", torch.float32),  # upcast, with a line
        ("bf16-mixed", "auto", torch.float32),  # mixed precision's float32 master weights
    ],
)
def test_init_weights_loads_in_the_dtype_the_trainer_precision_trains(
    llama_bf16, capsys, precision, init_dtype, trained
):
    module = _trained_under(llama_bf16, precision, init_dtype)
    assert {p.dtype for p in module.net.parameters()} == {trained}
    assert module.net.rope_cos.dtype == torch.float32
    said = capsys.readouterr().err  # a line where auto gives way to the precision, none where the folder's is kept
    assert ("holds bfloat16: loaded as float32" in said) == (trained == torch.float32 and init_dtype == "auto")
    assert "holds float32" not in said


@pytest.mark.parametrize("precision, init_dtype", [("32-true", "bfloat16"), ("bf16-true", "float32")])
def test_an_init_dtype_the_trainer_precision_contradicts_is_refused(llama_bf16, precision, init_dtype):
    with pytest.raises(InputError, match=rf"init_dtype={init_dtype} contradicts trainer.precision={precision}"):
        _trained_under(llama_bf16, precision, init_dtype)


def test_a_model_stored_in_bf16_is_rebuilt_in_bf16(llama_bf16, tmp_path):
    """What a checkpoint and registration store (the state dict as trained) and what ``load_from_checkpoint``,
    ``load_model`` and the MLflow pyfunc (``module_from``) rebuild from it, without a trainer."""
    import lightning

    module = from_pretrained(llama_bf16)
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint | {"pytorch-lightning_version": lightning.__version__}, tmp_path / "bf16.ckpt")
    spec = {"class_path": "zoo.gpt.CausalLMModule", "init_args": dict(module.hparams)}
    x = torch.randint(0, module.net.vocab_size, (1, 9))
    for rebuilt in (
        module_from(spec, module.state_dict()),
        CausalLMModule.load_from_checkpoint(tmp_path / "bf16.ckpt"),
    ):
        assert {p.dtype for p in rebuilt.net.parameters()} == {torch.bfloat16}
        assert rebuilt.net.rope_cos.dtype == torch.float32
        with torch.no_grad():
            assert torch.equal(rebuilt.eval()(x), module(x))


def _cli_config(folder, tmp_path, precision: str) -> str:
    """A fine-tune of ``folder`` under ``precision`` with ``init_dtype: bfloat16``, as a user's YAML states it."""
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 200)
    model = {"net": {"class_path": "zoo.gpt.GPT"}, "init_weights": str(folder), "init_dtype": "bfloat16"}
    data = {"path": str(tmp_path / "text.txt"), "tokenizer": "pretrained", "pretrained_dir": str(folder)}
    data |= {"block_size": 16, "batch_size": 2, "samples_per_epoch": 4, "val_samples": 2}
    trainer = {"max_steps": 1, "logger": False, "enable_progress_bar": False, "default_root_dir": str(tmp_path)}
    config = {
        "model": {"class_path": "zoo.gpt.CausalLMModule", "init_args": model},
        "data": {"class_path": "datamodules.TextDataModule", "init_args": data},
        "trainer": trainer | {"precision": precision},
    }
    (tmp_path / "bf16.yaml").write_text(json.dumps(config))
    return str(tmp_path / "bf16.yaml")


@pytest.mark.parametrize("precision", ["bf16-true", "32-true"])
def test_cli_init_dtype_meets_the_trainer_precision_it_states(llama_bf16, tmp_path, precision):
    from cli import main

    c = main(["--config", _cli_config(llama_bf16, tmp_path, precision)], run=False)  # built: weights load at setup
    c.model.trainer = c.trainer
    if precision == "32-true":
        with pytest.raises(InputError, match=r"^model.init_args.init_dtype=bfloat16 contradicts trainer.precision=32"):
            c.model.setup("fit")
        return
    c.model.setup("fit")
    assert {p.dtype for p in c.model.net.parameters()} == {torch.bfloat16}


@pytest.mark.slow  # ~20 s on 2 loaded cores: two cli.py runs (a fit, a refused one); the rule itself is tested above
def test_through_cli_a_bf16_folder_fits_in_bf16_under_bf16_true_and_a_contradiction_is_one_line(
    llama_bf16, tmp_path, monkeypatch, capsys
):
    from conftest import cli, terminal

    config = _cli_config(llama_bf16, tmp_path, "bf16-true")
    c = cli("fit", "--config", config)
    assert c.trainer.global_step == 1 and {p.dtype for p in c.model.net.parameters()} == {torch.bfloat16}
    stored = torch.load(c.trainer.checkpoint_callback.last_model_path, weights_only=True)["state_dict"]
    assert stored["net.tok_emb.weight"].dtype == torch.bfloat16  # a checkpoint keeps the dtype it trained in
    status, _, err = terminal(monkeypatch, capsys, "fit", "--config", config, "--trainer.precision=32-true")
    assert status != 0
    assert err.strip().splitlines()[-2].startswith("error: model.init_args.init_dtype=bfloat16 contradicts")
