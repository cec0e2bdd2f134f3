"""LoRA adapters in PEFT's format (``zoo.gpt.formats.peft_adapter``) against peft and transformers, on tiny GPT-2 and
Llama models: a zoo adapter loads in PEFT onto the exported model with the zoo's logits, an adapter PEFT trained loads
into the zoo with PEFT's, a fit starts from one, and what the zoo's LoRA cannot hold is refused in one line."""

from __future__ import annotations

import json
import math
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from safetensors.torch import load_file, save_file

from zoo.adapt import Adaptation, LoRA, adapt
from zoo.errors import InputError
from zoo.gpt import GPT, MHA, MLA, CausalLMModule, RMSNorm, SwiGLU
from zoo.gpt.formats.hf import export_gpt2, load_gpt2
from zoo.gpt.formats.llama import export_hf, load_hf
from zoo.gpt.formats.peft_adapter import load_adapter, plain_layers, save_adapter
from zoo.gpt.pretrained import recorded_module

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-5, rtol=1e-5)
V = 64
KWARGS = {
    "gpt2": dict(vocab_size=V, n_layer=2, n_embd=32, n_head=4, block_size=16),
    "llama": dict(
        vocab_size=V,
        n_layer=2,
        n_embd=32,
        n_head=4,
        block_size=16,
        attention=partial(MHA, n_kv_head=2),
        norm=RMSNorm,
        mlp=SwiGLU,
        mlp_hidden=48,
        position="rope",
        bias=False,
        tie_embeddings=False,
    ),
}
EXPORT, LOAD = {"gpt2": export_gpt2, "llama": export_hf}, {"gpt2": load_gpt2, "llama": load_hf}
# What a PEFT user would target: fused c_attn and one of GPT-2's two c_proj; q and v (not k) and gate (not up), so
# the zoo's fused layers hold some parts and not others.
PEFT_TARGETS = {"gpt2": ["c_attn", "mlp.c_proj"], "llama": ["q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]}


def ids() -> torch.Tensor:
    return torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(1))


def logits(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model.eval()(x)
    return getattr(out, "logits", out)


def trained(model):
    """Adapters as after training: B random, DoRA's magnitude moved off the weight's norm."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
            elif "lora_magnitude" in name:
                p.mul_(1 + 0.2 * torch.rand(p.shape, generator=g))
    return model


def peft_adapter(tmp_path: Path, layout: str, kind: str = "lora"):
    """A base folder the zoo exported, and an adapter PEFT trained on it (as transformers + PEFT user would)."""
    torch.manual_seed(0)
    EXPORT[layout](GPT(**KWARGS[layout]), tmp_path / "base")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    config = peft.LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=PEFT_TARGETS[layout],
        use_dora="dora" in kind,
        use_rslora="rslora" in kind,
        fan_in_fan_out=layout == "gpt2",
    )
    model = trained(peft.get_peft_model(hf, config))
    model.save_pretrained(tmp_path / "adapter")
    return tmp_path / "base", tmp_path / "adapter", model


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
@pytest.mark.parametrize("kind", ["lora", "dora+rslora"])
def test_a_zoo_adapter_loads_in_peft_onto_the_exported_model_with_equal_logits(tmp_path, layout, kind):
    torch.manual_seed(0)
    dora = kind != "lora"
    module = CausalLMModule(GPT(**KWARGS[layout]), adapt=Adaptation(lora=LoRA(r=4, alpha=8, rslora=dora, dora=dora)))
    adapt(module, module.hparams.adapt)
    ours = logits(trained(module), ids())
    with plain_layers(module.net):
        assert (logits(module, ids()) - ours).abs().max() > 0.05  # the adapters change the function
        EXPORT[layout](module.net, tmp_path / "base")
    save_adapter(module, tmp_path / "adapter", base=str(tmp_path / "base"))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (
        config["target_modules"]
        == {
            "gpt2": ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"],
            "llama": [f"mlp.{p}_proj" for p in ("down", "gate", "up")] + [f"self_attn.{p}_proj" for p in "koqv"],
        }[layout]
    )
    assert config["fan_in_fan_out"] == (layout == "gpt2") and config["use_dora"] == config["use_rslora"] == dora
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    torch.testing.assert_close(logits(peft.PeftModel.from_pretrained(hf, tmp_path / "adapter"), ids()), ours, **TOL)
    # and back into the zoo, at its own rank: the parts of a fused layer share its A
    back = load_adapter(CausalLMModule(LOAD[layout](tmp_path / "base")), tmp_path / "adapter")
    assert back.hparams.adapt["lora"] | {"targets": ()} == module.hparams.adapt["lora"]
    torch.testing.assert_close(logits(back, ids()), ours, **TOL)


@pytest.mark.parametrize("layout", ["gpt2", "llama"])
@pytest.mark.parametrize("kind", ["lora", "dora+rslora"])
def test_a_peft_adapter_loads_into_the_zoo_with_equal_logits(tmp_path, layout, kind):
    base, adapter, model = peft_adapter(tmp_path, layout, kind)
    module = load_adapter(CausalLMModule(LOAD[layout](base)), adapter)
    theirs = logits(model, ids())
    with model.disable_adapter():
        assert (logits(model, ids()) - theirs).abs().max() > 0.05
    torch.testing.assert_close(logits(module, ids()), theirs, **TOL)
    lora = module.hparams.adapt["lora"]
    k = 2 if layout == "llama" else 1  # q and v in one fused qkv: rank 2r, alpha so that alpha'/r' = alpha/r
    assert (lora["r"], lora["alpha"]) == (4 * k, 8 * (math.sqrt(k) if "rslora" in kind else k))
    assert all("lora_" in n for n, p in module.named_parameters() if p.requires_grad)


def test_a_fit_starts_from_a_peft_adapter_and_exports_it_back(tmp_path, monkeypatch, capsys):
    base, adapter, model = peft_adapter(tmp_path, "llama", "dora+rslora")
    net = GPT(**KWARGS["llama"])
    module = recorded_module(net, KWARGS["llama"], init_weights=str(base), adapter_weights=str(adapter))
    module.setup("fit")
    module.configure_model()  # what a fit does first: the adapter under the LoRA it needs
    theirs = logits(model, ids())
    torch.testing.assert_close(logits(module, ids()), theirs, **TOL)
    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    back = CausalLMModule.load_from_checkpoint(tmp_path / "m.ckpt", init_weights=str(base))  # the base left out
    assert back.hparams.adapter_weights is None and back.hparams.adapt["lora"]["r"] == 8  # a location is dropped
    torch.testing.assert_close(logits(back, ids()), theirs, **TOL)
    # python -m zoo.gpt export: the base folder and its PEFT adapter in <folder>/adapter; with --merge, one model
    from zoo.gpt.__main__ import main

    for folder, merge in (("out", []), ("merged", ["--merge"])):
        argv = ["zoo.gpt", "export", str(tmp_path / "m.ckpt"), str(tmp_path / folder), "--format", "llama", *merge]
        argv += ["--init-weights", str(base)]
        monkeypatch.setattr(sys, "argv", argv)
        main()
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    torch.testing.assert_close(logits(peft.PeftModel.from_pretrained(hf, tmp_path / "out" / "adapter"), ids()), theirs)
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(logits(merged, ids()), theirs, **TOL)
    assert not (tmp_path / "merged" / "adapter").exists() and "(PEFT LoRA)" in capsys.readouterr().out


def test_a_module_with_its_own_lora_names_the_one_an_adapter_needs(tmp_path):
    base, adapter, _ = peft_adapter(tmp_path, "llama")
    module = CausalLMModule(load_hf(base), adapt=Adaptation(lora=LoRA(r=4, alpha=8)))
    with pytest.raises(InputError, match=r'needs adapt.lora: \{"r": 8, "alpha": 16.0, .*"net.blocks.\*.attn.qkv"'):
        load_adapter(module, adapter)


@pytest.fixture(scope="module")
def zoo_adapter(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("adapter")
    torch.manual_seed(0)
    module = CausalLMModule(GPT(**KWARGS["llama"]), adapt=Adaptation(lora=LoRA(r=4, alpha=8)))
    adapt(module, module.hparams.adapt)
    save_adapter(trained(module), folder / "adapter")
    return folder / "adapter"


@pytest.mark.parametrize(
    "change, named",
    [
        ({"peft_type": "IA3"}, "peft_type 'IA3': the zoo reads LoRA adapters"),
        ({"rank_pattern": {"q_proj": 8}}, "sets rank_pattern={'q_proj': 8}, which the zoo's LoRA cannot hold"),
        ({"alpha_pattern": {"v_proj": 2}}, "sets alpha_pattern="),
        ({"bias": "lora_only"}, "sets bias='lora_only'"),
        ({"init_lora_weights": "pissa"}, "sets init_lora_weights='pissa'"),
        ({"modules_to_save": ["lm_head"]}, "sets modules_to_save=['lm_head']"),
        ({"a_future_option": 3}, "sets a_future_option=3"),
        ({"r": "4"}, "r='4'"),
        ({"auto_map": {"AutoModel": "x.Y"}}, "names custom code"),
    ],
)
def test_an_adapter_config_the_zoo_cannot_hold_is_refused_in_one_line(tmp_path, zoo_adapter, change, named):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes((zoo_adapter / "adapter_model.safetensors").read_bytes())
    config = json.loads((zoo_adapter / "adapter_config.json").read_text()) | change
    (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=named.replace("[", r"\[").replace("(", r"\(")) as err:
        load_adapter(CausalLMModule(GPT(**KWARGS["llama"])), folder)
    assert "\n" not in str(err.value)


Q = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda t: t | {"base_model.model.model.embed_tokens.lora_embedding_A": torch.ones(4, V)}, "embedding"),
        (lambda t: t | {k.replace(".0.", ".7."): v.clone() for k, v in t.items() if Q in k}, "adapts [^ ]*layers.7"),
        (lambda t: t | {Q + ".lora_B.weight": torch.ones(32, 5)}, "q_proj as"),
        (lambda t: {k: v for k, v in t.items() if k != Q + ".lora_B.weight"}, "only one of lora_A and lora_B"),
    ],
)
def test_adapter_tensors_the_net_has_no_place_for_are_refused_in_one_line(tmp_path, zoo_adapter, edit, named):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text((zoo_adapter / "adapter_config.json").read_text())
    save_file(edit(load_file(zoo_adapter / "adapter_model.safetensors")), folder / "adapter_model.safetensors")
    with pytest.raises(InputError, match=named) as err:
        load_adapter(CausalLMModule(GPT(**KWARGS["llama"])), folder)
    assert "\n" not in str(err.value)


def test_an_mla_net_refuses_an_adapter_whose_rope_rows_it_cannot_place(zoo_adapter):
    mla = partial(MLA, kv_lora_rank=8, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    net = GPT(**KWARGS["llama"] | {"attention": mla})
    with pytest.raises(InputError, match="does not load into an MLA net"):
        load_adapter(net, zoo_adapter)
