"""GPT-2 weights from and to Hugging Face folders, against transformers' own GPT2LMHeadModel."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from zoo.gpt import GPT, MHA, GeluMLP, RMSNorm, SwiGLU
from zoo.gpt.formats.hf import export_gpt2, load_gpt2, load_safetensors, save_safetensors

transformers = pytest.importorskip("transformers")


def reference(n_positions: int = 64, tie: bool = True):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=211,
        n_positions=n_positions,
        n_embd=48,
        n_layer=3,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=tie,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # random biases and norms too, so a missed key or a wrong transpose shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_imported_gpt2_matches_transformers_logits(tmp_path, safe):
    model = reference()
    model.save_pretrained(tmp_path, safe_serialization=safe)
    net = load_gpt2(tmp_path).eval()
    assert net.blocks[0].mlp.approximate == "tanh"  # GPT-2's weights were trained with gelu_new
    x = torch.randint(0, 211, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(net(x), model(x).logits, atol=1e-4, rtol=0)


def test_untied_head_imports(tmp_path):
    model = reference(tie=False)
    model.save_pretrained(tmp_path)
    net = load_gpt2(tmp_path).eval()
    assert net.lm_head.weight is not net.tok_emb.weight
    x = torch.randint(0, 211, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(net(x), model(x).logits, atol=1e-4, rtol=0)


# An epsilon far above the activations' variance (~1e-3 at init), so that a norm built or exported with another shows.
@pytest.mark.parametrize(("gelu", "eps"), [("tanh", 1e-5), ("exact", 1e-2)])
def test_exported_folder_loads_in_transformers_with_the_same_logits(tmp_path, gelu, eps):
    torch.manual_seed(1)
    net = GPT(
        vocab_size=150,
        block_size=32,
        n_layer=2,
        n_embd=32,
        n_head=4,
        mlp=partial(GeluMLP, approximate=gelu),
        norm_eps=eps,
    ).eval()
    export_gpt2(net, tmp_path / "hf")
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    assert model.config.activation_function == {"tanh": "gelu_new", "exact": "gelu"}[gelu]
    assert model.config.layer_norm_epsilon == eps
    assert load_gpt2(tmp_path / "hf").blocks[0].mlp.approximate == net.blocks[0].mlp.approximate
    x = torch.randint(0, 150, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, net(x), atol=1e-4, rtol=0)


def test_export_refuses_a_net_gpt2_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="GPT-2-shaped"):
        export_gpt2(GPT(vocab_size=50, block_size=16, n_layer=1, n_embd=16, n_head=2, position="rope"), tmp_path)
    for part in (dict(mlp=SwiGLU), dict(norm=RMSNorm)):  # each class states the layout it exports to
        with pytest.raises(ValueError, match="GPT-2-shaped"):
            export_gpt2(GPT(vocab_size=50, block_size=16, n_layer=1, n_embd=16, n_head=2, **part), tmp_path)


def test_safetensors_round_trip_with_tied_embeddings(tmp_path):
    torch.manual_seed(2)
    a = GPT(
        vocab_size=50,
        block_size=16,
        n_layer=1,
        n_embd=16,
        n_head=2,
        attention=partial(MHA, n_kv_head=1),
        position="rope",
    )
    path = save_safetensors(a, tmp_path / "w.safetensors")
    torch.manual_seed(3)
    b = load_safetensors(
        GPT(
            vocab_size=50,
            block_size=16,
            n_layer=1,
            n_embd=16,
            n_head=2,
            attention=partial(MHA, n_kv_head=1),
            position="rope",
        ),
        path,
    )
    assert b.lm_head.weight is b.tok_emb.weight
    x = torch.randint(0, 50, (1, 16))
    torch.testing.assert_close(a(x), b(x))


def test_wrong_shape_lists_the_keys(tmp_path):
    reference().save_pretrained(tmp_path)
    net = GPT(vocab_size=211, block_size=64, n_layer=3, n_embd=48, n_head=4, mlp_hidden=100)
    from zoo.gpt.formats.hf import load_gpt2_into

    with pytest.raises(ValueError, match="mlp.fc.weight"):
        load_gpt2_into(net, tmp_path)
