"""LoRA and freezing (zoo.adapt) on the GPT family: closed-form outputs, what trains, merging, checkpoints, the
registered model; the other families' wiring is tested beside each family."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from lightning.pytorch import Trainer
from torch.utils.data import DataLoader, TensorDataset

from zoo.adapt import Adaptation, LoRA, adapt, merge
from zoo.errors import InputError
from zoo.gpt import GPT, CausalLMModule

pytest.importorskip("peft")


def tiny(adaptation: Adaptation | None) -> CausalLMModule:
    torch.manual_seed(0)
    net = GPT(vocab_size=48, n_layer=2, n_embd=32, n_head=4, block_size=16)
    return CausalLMModule(net, adapt=adaptation)


def ids(n: int = 4) -> torch.Tensor:
    return torch.randint(0, 48, (n, 16), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("rslora", [False, True])
def test_lora_starts_at_the_base_function_and_adds_alpha_over_r_times_ba(rslora):
    base = tiny(None)
    module = copy.deepcopy(base)
    adapt(module, Adaptation(lora=LoRA(r=4, alpha=8.0, rslora=rslora)))
    torch.testing.assert_close(module(ids()), base(ids()), rtol=0, atol=0)  # B = 0 at the start
    layer = module.net.blocks[0].attn.qkv
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    torch.nn.init.normal_(b)
    x = torch.randn(3, 32)
    scale = 8.0 / (math.sqrt(4) if rslora else 4)
    expected = torch.nn.functional.linear(x, base.net.blocks[0].attn.qkv.weight + scale * b @ a, layer.base_layer.bias)
    torch.testing.assert_close(layer(x), expected)


def test_only_the_adapters_and_what_trainable_names_train():
    module = tiny(Adaptation(lora=LoRA(r=2), trainable=("net.pos_emb.*",)))
    adapt(module, module.hparams.adapt)
    training = {n for n, p in module.named_parameters() if p.requires_grad}
    assert "net.pos_emb.weight" in training
    assert all("lora_" in n for n in training - {"net.pos_emb.weight"})
    wrapped = {n.split(".lora_A")[0] for n in training if ".lora_A." in n}
    # Every hidden linear layer, none of the io layers (embeddings, the tied head).
    layers = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    assert wrapped == {f"net.blocks.{i}.{layer}" for i in range(2) for layer in layers}


def test_freezing_alone_trains_what_trainable_names():
    module = tiny(Adaptation(trainable=("net.blocks.1.*",)))
    adapt(module, module.hparams.adapt)
    assert {n for n, p in module.named_parameters() if p.requires_grad} == {
        n for n, _ in module.named_parameters() if n.startswith("net.blocks.1.")
    }


@pytest.mark.parametrize(
    "adaptation, named",
    [
        (Adaptation(lora=LoRA(targets=("net.blocks.*.attn.nope",))), "adapt.lora.targets: 'net.blocks.*.attn.nope'"),
        (Adaptation(trainable=("net.head.*",)), "adapt.trainable: 'net.head.*' names no parameter"),
    ],
)
def test_a_glob_that_names_nothing_is_refused_by_name(adaptation, named):
    with pytest.raises(InputError, match=named.replace("*", r"\*").replace(".", r"\.")):
        adapt(tiny(adaptation), adaptation)


def test_merge_keeps_the_function_and_restores_the_plain_names():
    plain_keys = set(tiny(None).state_dict())
    module = tiny(Adaptation(lora=LoRA(r=4, targets=("net.blocks.*.attn.*",), dora=True)))
    adapt(module, module.hparams.adapt)
    for name, p in module.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    before = module(ids())
    merge(module)
    assert set(module.state_dict()) == plain_keys
    torch.testing.assert_close(module(ids()), before, rtol=1e-5, atol=1e-5)


def test_a_fit_trains_the_adapters_alone_and_its_checkpoint_reloads(tmp_path):
    module = tiny(Adaptation(lora=LoRA(r=4), trainable=("net.pos_emb.*",)))
    x = ids(16)
    data = DataLoader(TensorDataset(x, torch.roll(x, -1, 1)), batch_size=4)
    trainer = Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(module, data)
    start = tiny(None).state_dict()
    for name, value in module.state_dict().items():
        plain = name.replace(".base_layer.", ".")
        if "lora_" in name or plain == "net.pos_emb.weight":
            assert "lora_A" in name or not torch.equal(value, start.get(plain, torch.zeros(0))), name
        else:
            assert torch.equal(value, start[plain]), f"{name} trained"
    trainer.save_checkpoint(tmp_path / "lora.ckpt")
    net = GPT(vocab_size=48, n_layer=2, n_embd=32, n_head=4, block_size=16)
    again = CausalLMModule.load_from_checkpoint(tmp_path / "lora.ckpt", net=net)
    torch.testing.assert_close(again(ids()), module(ids()), rtol=0, atol=0)


def test_a_lora_checkpoint_leaves_the_base_out_and_takes_it_again_from_init_weights(tmp_path):
    from zoo.errors import CheckpointError
    from zoo.gpt.formats.hf import save_safetensors

    base = tmp_path / "base.safetensors"
    save_safetensors(tiny(None).net, base)
    module = tiny(Adaptation(lora=LoRA(r=4)))
    module.hparams.init_weights = str(base)
    x = ids(16)
    data = DataLoader(TensorDataset(x, torch.roll(x, -1, 1)), batch_size=4)
    trainer = Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(module, data)
    trainer.save_checkpoint(tmp_path / "lora.ckpt")
    stored = torch.load(tmp_path / "lora.ckpt", weights_only=True)
    assert all("lora_" in k for k in stored["state_dict"]), "the frozen base was stored again"

    def load(**kwargs):
        net = GPT(vocab_size=48, n_layer=2, n_embd=32, n_head=4, block_size=16)
        return CausalLMModule.load_from_checkpoint(tmp_path / "lora.ckpt", net=net, **kwargs)

    torch.testing.assert_close(load(init_weights=str(base))(ids()), module(ids()), rtol=0, atol=0)
    with pytest.raises(CheckpointError, match="give the base it was trained on as init_weights"):
        load()
    other = tmp_path / "other.safetensors"
    torch.manual_seed(5)
    save_safetensors(GPT(vocab_size=48, n_layer=2, n_embd=32, n_head=4, block_size=16), other)
    with pytest.raises(CheckpointError, match="is not the base these LoRA adapters were trained on"):
        load(init_weights=str(other))
    # a fit resumed from it reads the base again, and goes on from the trained adapters
    again = tiny(Adaptation(lora=LoRA(r=4)))
    again.hparams.init_weights = str(base)
    resumed = Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    resumed.fit(again, data, ckpt_path=tmp_path / "lora.ckpt")
    assert resumed.global_step == 3


def test_a_bf16_base_halves_the_frozen_layers_computes_as_autocast_would_and_merges_at_full_precision():
    module = tiny(Adaptation(lora=LoRA(r=4), base_dtype="bfloat16"))
    reference = tiny(Adaptation(lora=LoRA(r=4)))
    adapt(module, module.hparams.adapt)
    adapt(reference, reference.hparams.adapt)
    reference.load_state_dict(module.state_dict())  # the same adapters, the base rounded to bf16 and back
    layer = module.net.blocks[0].attn.qkv
    assert layer.base_layer.weight.dtype == torch.bfloat16 and layer.lora_A["default"].weight.dtype == torch.float32
    for name, p in module.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    reference.load_state_dict(module.state_dict())
    out = module(ids())
    assert out.dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference.net.blocks[0].attn.qkv.base_layer(torch.ones(2, 32))
    torch.testing.assert_close(layer.base_layer(torch.ones(2, 32)), expected.float())
    merge(module)
    assert module.net.blocks[0].attn.qkv.weight.dtype == torch.float32
    torch.testing.assert_close(module(ids()), out, rtol=2e-2, atol=2e-2)  # the base now computes in fp32


@pytest.mark.slow  # a fresh interpreter (~10 s): PEFT must not be imported yet when the stored config is built
def test_a_lora_checkpoint_loads_in_a_process_that_has_not_imported_peft(tmp_path):
    import subprocess
    import sys

    module = tiny(Adaptation(lora=LoRA(r=4)))
    adapt(module, module.hparams.adapt)
    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp_path / "lora.ckpt")
    code = (
        "import sys; from zoo.gpt import GPT, CausalLMModule; assert 'peft' not in sys.modules; "
        f"m = CausalLMModule.load_from_checkpoint({str(tmp_path / 'lora.ckpt')!r}, "
        "net=GPT(vocab_size=48, n_layer=2, n_embd=32, n_head=4, block_size=16)); "
        "print(type(m.net.blocks[0].attn.qkv).__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith("peft.")
