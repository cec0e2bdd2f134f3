"""Phi-3 and Phi-4-mini folders (``model_type: phi3``, ``zoo.gpt.formats.phi3``) against transformers' own
``Phi3ForCausalLM``: tiny random models it saved itself, settings varied (full and partial RoPE, plain and LongRoPE
with sequences on both sides of the original context, GQA, tied and untied heads), load with transformers' logits,
decode greedily as its ``generate`` does (the LongRoPE switch inside a decoding included), export back to folders it
loads with the same logits, and what cannot be exact is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_gpt_pretrained import TOL, _perturb, write_tokenizer

from zoo.errors import InputError
from zoo.gpt import from_pretrained
from zoo.gpt.generate import generate

transformers = pytest.importorskip("transformers")

ORIGINAL = 16  # original_max_position_embeddings: sequences of 17+ tokens take LongRoPE's long factors
VARIANTS = {
    # Phi-3-mini-like: full RoPE, no scaling, GQA, untied head
    "phi3": dict(num_key_value_heads=2),
    # Phi-4-mini-like: partial RoPE (12 of 16 channels), LongRoPE with the attention factor derived, tied head
    "phi4-mini": dict(
        partial_rotary_factor=0.75,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 4.0], "long_factor": [1.5] * 6},
        tie_word_embeddings=True,
        num_key_value_heads=1,
    ),
    # Phi-3-mini-128k-like: full RoPE, LongRoPE under its older name "su", an explicit attention factor
    "phi3-128k": dict(
        rope_scaling={
            "type": "su",
            "original_max_position_embeddings": ORIGINAL,  # transformers 5.24 fills it only for the newer name
            "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0],
            "long_factor": [2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0],
            "attention_factor": 1.3,
        },
        num_key_value_heads=4,
    ),
}


def phi3_config(vocab: int, **extra) -> dict:
    return (
        dict(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            original_max_position_embeddings=ORIGINAL,
            rope_theta=500.0,
            sliding_window=None,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            attn_implementation="eager",
        )
        | extra
    )


def write_phi3(folder: Path, variant: str):
    """A tiny random Phi-3 ``variant`` saved by transformers with a tokenizer; returns the transformers model."""
    vocab = write_tokenizer(folder, "llama3")
    torch.manual_seed(0)
    model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**phi3_config(vocab, **VARIANTS[variant])))
    _perturb(model).save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = write_phi3(folder, request.param)
    return model, from_pretrained(folder), folder


@pytest.mark.parametrize("length", [ORIGINAL - 3, ORIGINAL, ORIGINAL + 1, 48])
def test_logits_equal_transformers_on_both_sides_of_the_original_context(pair, length):
    model, module, _ = pair
    x = torch.randint(0, model.config.vocab_size, (2, length))
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x).logits, **TOL)


def test_the_net_is_what_the_config_states(pair):
    model, module, _ = pair
    attn, config = module.net.blocks[0].attn, model.config
    assert attn.rope_dim == int(16 * config.rope_parameters.get("partial_rotary_factor", 1.0))
    assert attn.n_kv_head == config.num_key_value_heads
    assert (module.net.lm_head.weight is module.net.tok_emb.weight) == config.tie_word_embeddings
    scaling = module.net.rope_scaling
    if scaling is not None:  # the attention factor as transformers' rotary embedding computes it
        assert scaling.attention_factor == pytest.approx(model.model.rotary_emb.attention_scaling, rel=1e-12)


@pytest.mark.parametrize("prompt, new", [(12, 10), (20, 4)])
def test_greedy_decoding_is_transformers_generate_across_the_longrope_switch(pair, prompt, new):
    """12 + 10 tokens cross the original context inside the decoding (transformers drops its cache there and the
    zoo re-prefills); 20 start past it."""
    model, module, _ = pair
    torch.manual_seed(prompt)
    ids = torch.randint(3, model.config.vocab_size, (1, prompt))
    theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new)
    assert generate(module.net, [ids[0]], new, temperature=0.0)[0].tolist() == theirs[0, prompt:].tolist()


def test_text_generation_is_transformers_greedy_continuation(pair):
    model, module, folder = pair
    prompt = "The quick brown fox"
    ours = module.generate([prompt], max_new_tokens=8, temperature=0.0)[0]
    ids = transformers.AutoTokenizer.from_pretrained(folder)(prompt, return_tensors="pt").input_ids
    theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8)
    assert ours == module.tokenizer.decode(theirs[0, ids.shape[1] :].tolist())


def test_an_imported_phi3_exports_back_with_the_same_logits(pair, tmp_path):
    from zoo.gpt.formats.phi3 import export_phi3

    model, module, _ = pair
    export_phi3(module.net, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(back) is transformers.Phi3ForCausalLM
    assert (tmp_path / "out" / "model.safetensors").is_file()
    x = torch.randint(0, model.config.vocab_size, (2, 24))  # past the original context
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, **TOL)
        torch.testing.assert_close(back(x[:, :10]).logits, model(x[:, :10]).logits, **TOL)


def test_a_full_rope_phi3_exports_as_llama_and_a_partial_one_is_refused_there(tmp_path):
    from zoo.gpt.formats.llama import export_hf

    model = write_phi3(tmp_path / "phi3", "phi3")
    export_hf(from_pretrained(tmp_path / "phi3").net, tmp_path / "llama")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "llama").eval()
    assert type(back) is transformers.LlamaForCausalLM
    x = torch.randint(0, model.config.vocab_size, (1, 20))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, **TOL)
    write_phi3(tmp_path / "phi4", "phi4-mini")
    with pytest.raises(InputError, match="--format phi3"):
        export_hf(from_pretrained(tmp_path / "phi4").net, tmp_path / "no")


def test_changing_any_source_tensor_changes_the_output(tmp_path):
    from zoo.gpt.formats.hf import pretrained_gpt
    from zoo.gpt.pretrained import net_kwargs, read_folder

    write_phi3(tmp_path, "phi3")
    weights, kwargs = load_file(tmp_path / "model.safetensors"), net_kwargs(read_folder(tmp_path)[1])
    x = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        before = pretrained_gpt(kwargs, tmp_path)(x)
        for key in weights:
            changed = dict(weights) | {key: weights[key] + 0.5 * torch.randn_like(weights[key])}
            save_file(changed, tmp_path / "model.safetensors")
            assert not torch.allclose(pretrained_gpt(kwargs, tmp_path)(x), before), key
    assert {k.split(".")[-2] for k in weights} >= {"qkv_proj", "gate_up_proj", "o_proj", "down_proj"}


def test_a_phi3_mini_4k_window_loads_as_transformers_masks_it_and_exports_back(tmp_path):
    """Phi-3-mini-4k states sliding_window 2047 of a 4096 context, which transformers' Phi-3 applies in every layer:
    here 7 of 64, over 40 tokens (most keys out of every window); the export states it again."""
    from zoo.gpt.formats.phi3 import export_phi3

    vocab = write_tokenizer(tmp_path / "in", "llama3")
    torch.manual_seed(0)
    model = transformers.Phi3ForCausalLM(transformers.Phi3Config(**phi3_config(vocab, sliding_window=7)))
    _perturb(model).save_pretrained(tmp_path / "in")
    module = from_pretrained(tmp_path / "in")
    assert module.net.sliding_window == 7 and set(module.net.layer_types) == {"sliding_attention"}
    x = torch.randint(0, vocab, (2, 40))
    with torch.no_grad():
        want = model(x).logits
        torch.testing.assert_close(module(x), want, **TOL)
        unwindowed = transformers.Phi3ForCausalLM(model.config.__class__(**phi3_config(vocab))).eval()
        unwindowed.load_state_dict(model.state_dict())
        assert not torch.allclose(unwindowed(x).logits, want, atol=1e-3)  # the window matters over 40 tokens
    export_phi3(module.net, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert back.config.sliding_window == 7
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, want, **TOL)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 500.0, "factor": 2.0}}, "'dynamic'"),
        ({"rope_parameters": {"rope_theta": 500.0, "partial_rotary_factor": 0.2}}, "partial_rotary_factor 0.2"),
        ({"head_dim": 32}, "head_dim 32"),
        ({"rope_scaling": {"rope_type": "longrope", "original_max_position_embeddings": 8}}, "8 in its RoPE"),
        ({"quantization_config": {"bits": 4}}, "quantization_config"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_what_the_zoo_would_compute_otherwise_is_refused_by_name(tmp_path, change, named):
    write_phi3(tmp_path, "phi3")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(ValueError, match=named):
        from_pretrained(tmp_path)


def test_longrope_factors_of_the_wrong_length_are_refused(tmp_path):
    write_phi3(tmp_path, "phi4-mini")
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"]["long_factor"] = [1.0] * 8
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="lists of 6 numbers"):
        from_pretrained(tmp_path)


@pytest.mark.slow  # ~15 s of CPU: a cli.py fit; test_gpt_pretrained's cli fine-tune runs in the default suite
def test_a_lora_fine_tune_through_the_cli_exports_back_to_transformers_with_its_logits(tmp_path, capsys):
    """``cli.py fit`` with ``init_weights: <Phi-4-mini-style folder>`` and LoRA, then ``python -m zoo.gpt export``
    (its default format: the folder's, phi3): merged, one Phi3ForCausalLM; unmerged, the base and a PEFT adapter.
    Both give the fine-tuned module's logits in transformers."""
    peft = pytest.importorskip("peft")
    from conftest import cli

    from zoo.gpt.__main__ import main as zoo_gpt

    folder = tmp_path / "phi4"
    write_phi3(folder, "phi4-mini")
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 200)
    model = {"net": {"class_path": "zoo.gpt.GPT"}, "init_weights": str(folder), "adapt": {"lora": {"r": 4}}}
    model["optimizer"] = {"lr": 0.05, "warmup_steps": 0}  # far enough from the base in 2 steps to tell apart
    data = {"path": str(tmp_path / "text.txt"), "tokenizer": "pretrained", "pretrained_dir": str(folder)}
    data |= {"block_size": 16, "batch_size": 2, "samples_per_epoch": 4, "val_samples": 2}
    config = {
        "model": {"class_path": "zoo.gpt.CausalLMModule", "init_args": model},
        "data": {"class_path": "datamodules.TextDataModule", "init_args": data},
        "trainer": {"max_steps": 2, "logger": False, "enable_progress_bar": False, "default_root_dir": str(tmp_path)},
    }
    (tmp_path / "lora.yaml").write_text(json.dumps(config))
    c = cli("fit", "--config", str(tmp_path / "lora.yaml"))
    ckpt = c.trainer.checkpoint_callback.last_model_path
    x = torch.randint(0, c.model.net.vocab_size, (2, 20))  # past the original context: LongRoPE's long factors
    with torch.no_grad():
        tuned = c.model.eval()(x)
    base = ["--init-weights", str(folder)]  # a LoRA checkpoint leaves its frozen base out
    zoo_gpt(["export", ckpt, str(tmp_path / "merged"), "--merge", *base])
    zoo_gpt(["export", ckpt, str(tmp_path / "base"), *base])
    assert "adapter" in capsys.readouterr().out
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
    with torch.no_grad():
        assert not torch.allclose(base(x).logits, tuned, atol=1e-3)  # the fine-tune moved the logits
    adapted = peft.PeftModel.from_pretrained(base, tmp_path / "base" / "adapter").eval()  # adapts base in place
    assert type(merged) is transformers.Phi3ForCausalLM
    with torch.no_grad():
        torch.testing.assert_close(merged(x).logits, tuned, **TOL)
        torch.testing.assert_close(adapted(x).logits, tuned, **TOL)


def test_an_untied_head_missing_from_the_files_is_refused_not_taken_from_the_embedding(tmp_path):
    write_phi3(tmp_path, "phi3")
    weights = load_file(tmp_path / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(InputError, match="lacks the tensor 'lm_head.weight'"):
        from_pretrained(tmp_path)


def test_a_checkpoint_of_an_imported_phi4_mini_rebuilds_it_without_the_folder(tmp_path):
    """Its LongRoPE settings and partial RoPE are recorded in the net's config and read back from it."""
    import shutil

    import lightning as L

    from zoo.gpt import CausalLMModule

    write_phi3(tmp_path / "hf", "phi4-mini")
    module = from_pretrained(tmp_path / "hf")
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    shutil.rmtree(tmp_path / "hf")
    back = CausalLMModule.load_from_checkpoint(tmp_path / "m.ckpt").eval()
    assert back.net.rope_scaling == module.net.rope_scaling and back.net.blocks[0].attn.rope_dim == 12
    x = torch.randint(0, 300, (1, 20))
    with torch.no_grad():
        assert torch.equal(back(x), module(x))


def test_a_draft_whose_request_crosses_the_longrope_switch_is_refused(pair):
    from zoo.gpt.speculative import speculative_generate

    _, module, _ = pair
    if module.net.rope_scaling is None:
        pytest.skip("no LongRoPE: nothing switches")
    ids = torch.randint(3, 300, (12,))
    with pytest.raises(InputError, match="decode without a draft"):
        speculative_generate(module.net, module.net, [ids], 10, temperature=0.0)
    assert len(speculative_generate(module.net, module.net, [ids], 4, temperature=0.0)[0][0]) == 4  # inside: fine


def test_the_default_export_format_is_the_one_the_model_started_from(tmp_path):
    from zoo.gpt import GPT, CausalLMModule
    from zoo.gpt.export import default_format
    from zoo.gpt.pretrained import net_kwargs, read_folder

    write_phi3(tmp_path / "phi3", "phi3")  # full RoPE, no LongRoPE: a Llama could hold it too
    write_phi3(tmp_path / "phi4", "phi4-mini")
    net = GPT(**net_kwargs(read_folder(tmp_path / "phi3")[1]))
    assert default_format(CausalLMModule(net=net, init_weights=str(tmp_path / "phi3"))) == "phi3"
    assert default_format(CausalLMModule(net=net)) == "llama"
    assert default_format(from_pretrained(tmp_path / "phi4")) == "phi3"  # only a Phi-3 holds partial RoPE
    assert default_format(CausalLMModule(net=GPT(vocab_size=10, n_layer=1, n_embd=16, n_head=2))) == "gpt2"


def test_a_net_a_phi3_cannot_hold_is_refused_naming_the_format_that_can(tmp_path):
    from zoo.gpt import GPT, RMSNorm, SwiGLU
    from zoo.gpt.formats.phi3 import export_phi3

    tiny = dict(vocab_size=10, block_size=8, n_layer=1, n_embd=16, n_head=2)
    with pytest.raises(InputError, match="--format gpt2"):
        export_phi3(GPT(**tiny), tmp_path)
    with pytest.raises(InputError, match="q/k/v biases.*--format llama"):
        export_phi3(GPT(**tiny, norm=RMSNorm, mlp=SwiGLU, position="rope", bias=True), tmp_path)
