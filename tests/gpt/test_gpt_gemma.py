"""Gemma 2, Gemma 3 (text) and sliding-window Mistral/Qwen2 folders against transformers: tiny random models each
library saved itself, sequences longer than the window, settings varied (soft-capping on and off, windows, patterns,
RoPE bases), loaded by ``zoo.gpt.from_pretrained`` with transformers' logits, greedy continuations and token ids, and
exported back to a folder transformers loads with the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_gpt_pretrained import CORPUS, HARD, TOL, _llama_like, _perturb
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from zoo.errors import InputError
from zoo.gpt import GPT, from_pretrained
from zoo.gpt.formats.llama import export_hf

transformers = pytest.importorskip("transformers")

# Gemma 3's chat template (system folded into the first user turn, "model" for the assistant), as its folders ship it.
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + "
    "'\\n\\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = \"\" -%}{%- set "
    "loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}{%- if (message['role'] == 'user') "
    '!= (loop.index0 % 2 == 0) -%}{{ raise_exception("Conversation roles must alternate user/assistant/user/'
    "assistant/...\") }}{%- endif -%}{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- else "
    "-%}{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if "
    "loop.first else \"\") }}{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{%- endfor -%}{%- if "
    "add_generation_prompt -%}{{'<start_of_turn>model\\n'}}{%- endif -%}"
)
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]


def write_gemma_tokenizer(folder: Path) -> int:
    """A Gemma tokenizer as transformers' GemmaTokenizer builds one (spaces as "▁", no prefix space, byte fallback,
    BOS added) with Gemma 3's specials and chat template; returns the vocabulary size."""
    hf = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    hf.normalizer = normalizers.Replace(" ", "▁")
    hf.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, initial_alphabet=[], show_progress=False)
    hf.train_from_iterator(CORPUS, trainer)
    spec = json.loads(hf.to_str())
    vocab = spec["model"]["vocab"]
    vocab |= {f"<0x{b:02X}>": len(vocab) + b for b in range(256)}
    hf = HFTokenizer.from_str(json.dumps(spec))
    hf.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    hf.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    folder.mkdir(parents=True, exist_ok=True)
    hf.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
    config |= {"unk_token": "<unk>", "add_bos_token": True, "chat_template": GEMMA3_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return hf.get_vocab_size(with_added_tokens=True)


def _gemma_like(vocab: int, **extra) -> dict:
    return (
        dict(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            max_position_embeddings=64,
            rms_norm_eps=1e-5,
            query_pre_attn_scalar=20,  # not head_dim: a scale of 1/sqrt(d) would fail
            sliding_window=7,
            attn_implementation="eager",
        )
        | extra
    )


GEMMA3_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 50.0},
    "full_attention": {"rope_type": "default", "rope_theta": 1000.0},
}
ARCHITECTURES = {
    "gemma2": lambda v: transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(**_gemma_like(v, final_logit_softcapping=3.0, attn_logit_softcapping=2.0))
    ),
    "gemma2-uncapped-window5": lambda v: transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(
            **_gemma_like(v, final_logit_softcapping=None, attn_logit_softcapping=None, sliding_window=5)
        )
    ),
    "gemma3": lambda v: transformers.Gemma3ForCausalLM(
        transformers.Gemma3TextConfig(**_gemma_like(v, sliding_window_pattern=3, rope_parameters=GEMMA3_ROPE))
    ),
    "gemma3-capped-untied-window9": lambda v: transformers.Gemma3ForCausalLM(
        transformers.Gemma3TextConfig(
            **_gemma_like(
                v,
                layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
                sliding_window=9,
                final_logit_softcapping=4.0,
                tie_word_embeddings=False,
                rope_parameters=GEMMA3_ROPE,
            )
        )
    ),
    "mistral-window6": lambda v: transformers.MistralForCausalLM(
        transformers.MistralConfig(**_llama_like(v, sliding_window=6))
    ),
    "qwen2-window5-from-layer1": lambda v: transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**_llama_like(v, use_sliding_window=True, sliding_window=5, max_window_layers=1))
    ),
}


def write_model(folder: Path, arch: str):
    """A tiny random ``arch`` model saved with a Gemma tokenizer; returns the transformers model."""
    vocab = write_gemma_tokenizer(folder)
    torch.manual_seed(0)
    model = _perturb(ARCHITECTURES[arch](vocab))
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = write_model(folder, request.param)
    return model, from_pretrained(folder), folder


def test_logits_equal_transformers_past_the_window(pair):
    model, module, _ = pair
    x = torch.randint(0, model.config.vocab_size, (2, 40))  # windows of 5 to 9: most keys out of reach
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x).logits, **TOL)
    assert "sliding_attention" in module.net.layer_types


def test_greedy_generation_past_the_window_is_transformers_and_rows_pad_alike(pair):
    """The cached decoding masks the keys that left the window as transformers' does; a left-padded row of a batch
    decodes what it decodes alone."""
    from zoo.gpt.generate import generate

    model, module, _ = pair
    ids, other = torch.randint(7, model.config.vocab_size, (4,)), torch.randint(7, model.config.vocab_size, (9,))
    mask = torch.ones(1, 4, dtype=torch.long)
    theirs = model.generate(ids[None], attention_mask=mask, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    ours = generate(module.net, [ids, other], 12, temperature=0)  # 16 and 21 slots: past every window (5 to 9)
    assert ours[0].tolist() == theirs[0, 4:].tolist()
    assert ours[1].tolist() == generate(module.net, [other], 12, temperature=0)[0].tolist()


def test_an_imported_net_exports_back_to_transformers_with_the_same_logits(pair, tmp_path):
    model, module, _ = pair
    export_hf(module.net, tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(back) is type(model)
    x = torch.randint(0, model.config.vocab_size, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, **TOL)


def test_a_key_out_of_the_window_changes_no_sliding_layers_output():
    """The training mask: with every layer sliding, position i reads positions i-W+1..i only."""
    net = GPT(vocab_size=50, block_size=32, n_layer=2, n_embd=32, n_head=4, position="rope", sliding_window=4).eval()
    x = torch.randint(0, 50, (1, 20))
    y = x.clone()
    y[0, 5] = (x[0, 5] + 1) % 50
    with torch.no_grad():
        a, b = net(x), net(y)
    # two layers of W=4 reach 2 * 3 = 6 positions back: 5..11 change, 12 on do not
    assert torch.equal(a[0, :5], b[0, :5]) and torch.equal(a[0, 12:], b[0, 12:])
    assert not torch.allclose(a[0, 11], b[0, 11])


RAW = {  # config.json as older transformers (and the hub's Gemma 3 270M) write it: no layer_types, old RoPE keys
    "gemma3_text": dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=128,
        rope_theta=1000.0,
        rope_local_base_freq=50.0,
        rope_scaling=None,
        sliding_window=16,
        sliding_window_pattern=3,
        query_pre_attn_scalar=20,
    ),
    "gemma2": dict(  # what transformers fills in: head_dim 256, 4 key-value heads, window 4096, soft-caps 50 and 30
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=5, num_attention_heads=4
    ),
    "qwen2": dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_sliding_window=True,
        sliding_window=16,
        max_window_layers=2,
    ),
}


@pytest.mark.parametrize("kind", list(RAW))
def test_a_config_json_reads_as_transformers_reads_it(kind):
    """Each setting the zoo derives from a config.json (layer pattern, window, RoPE bases, defaults of the fields left
    out) is what transformers' config class derives from the same dict."""
    from zoo.gpt.pretrained import net_kwargs

    theirs = transformers.AutoConfig.for_model(kind, **RAW[kind])
    ours = net_kwargs(dict(RAW[kind], model_type=kind))
    attn, rope = ours["attention"].keywords, theirs.rope_parameters
    assert (ours["layer_types"], ours["sliding_window"]) == (theirs.layer_types, theirs.sliding_window)
    head_dim = getattr(theirs, "head_dim", 16)  # Qwen2's is hidden_size / heads, 16
    assert (attn["n_kv_head"], attn.get("head_dim", 16)) == (theirs.num_key_value_heads, head_dim)
    assert ours["block_size"] == theirs.max_position_embeddings
    if kind == "gemma3_text":
        assert ours["rope_base"] == rope["full_attention"]["rope_theta"]
        assert ours["rope_local_base"] == rope["sliding_attention"]["rope_theta"]
    else:
        assert ours["rope_base"] == rope["rope_theta"]
    if kind.startswith("gemma"):
        assert attn["scale"] == theirs.query_pre_attn_scalar**-0.5
        assert ours["logit_softcap"] == theirs.final_logit_softcapping
        assert attn.get("softcap") == (theirs.attn_logit_softcapping if kind == "gemma2" else None)


def test_token_ids_and_the_chat_template_are_autotokenizers(tmp_path):
    write_model(tmp_path, "gemma3")
    theirs, ours = transformers.AutoTokenizer.from_pretrained(tmp_path), from_pretrained(tmp_path).tokenizer
    for text in HARD:
        assert ours.encode(text) == theirs.encode(text), text
    from zoo.io.chat_template import chat_renderer

    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": " Hi there 🤗\n"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "And 1234?"},
    ]
    rendered = chat_renderer(ours)(chat, True)
    assert rendered.ids == theirs.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    assert ours.bos_id == 2 and ours.eos_id == 1


def test_changing_any_source_tensor_changes_the_output(tmp_path):
    """Each tensor of a full layer (0), a sliding one (1) and outside the layers, in a Gemma 3 with every kind (q/k
    norms, an untied head); every tensor of the file is used or the load is refused (``check_all_used``)."""
    from zoo.gpt.formats.hf import pretrained_gpt
    from zoo.gpt.pretrained import net_kwargs, read_folder

    write_model(tmp_path, "gemma3-capped-untied-window9")
    kwargs = net_kwargs(read_folder(tmp_path)[1])
    weights = load_file(tmp_path / "model.safetensors")
    x = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        base = pretrained_gpt(kwargs, tmp_path)(x)
        for name, tensor in weights.items():
            if name.startswith(("model.layers.2.", "model.layers.3.")):
                continue
            ramp = torch.linspace(0.2, 1.0, tensor.numel()).view_as(tensor)
            save_file(weights | {name: tensor + ramp}, tmp_path / "model.safetensors")
            assert not torch.allclose(pretrained_gpt(kwargs, tmp_path)(x), base, atol=1e-4), f"{name} unused"


@pytest.mark.parametrize(
    "arch, change, named",
    [
        (
            "gemma3",
            {"rope_parameters": GEMMA3_ROPE | {"full_attention": {"rope_type": "linear", "factor": 8.0}}},
            "linear",
        ),
        ("gemma3", {"rope_parameters": {"rope_type": "default", "rope_theta": 10.0}}, "keys them by layer type"),
        ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("gemma2", {"attention_bias": True}, "attention_bias"),
        ("gemma2", {"hidden_activation": "relu"}, "hidden_activation 'relu'"),
        ("gemma2", {"layer_types": ["sliding_attention"] * 3}, "each of the 4 layers"),
    ],
)
def test_gemma_options_the_zoo_lacks_are_refused_in_one_line(tmp_path, arch, change, named):
    write_model(tmp_path, arch)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(ValueError, match=named) as err:
        from_pretrained(tmp_path)
    assert "\n" not in str(err.value)


def test_a_net_with_gemma_settings_does_not_export_as_llama_or_gpt2(tmp_path):
    from functools import partial

    from zoo.gpt import MHA, RMSNorm, SwiGLU

    llama = dict(vocab_size=40, n_layer=2, n_embd=32, n_head=4, norm=RMSNorm, mlp=SwiGLU, position="rope", bias=False)
    for extra, named in [
        ({"logit_softcap": 5.0}, "logit_softcap"),
        ({"attention": partial(MHA, softcap=5.0)}, "softcap"),
        ({"sliding_window": 4, "layer_types": ["sliding_attention", "full_attention"]}, "sliding-window layers"),
    ]:
        with pytest.raises(InputError, match=named):
            export_hf(GPT(**llama, **extra), tmp_path)
    from zoo.gpt.formats.hf import export_gpt2

    with pytest.raises(InputError, match="no embed_scale, logit_softcap, sliding_window"):
        export_gpt2(
            GPT(vocab_size=40, n_layer=1, n_embd=32, n_head=4, embed_scale=2.0, logit_softcap=5.0, sliding_window=4),
            tmp_path,
        )


@pytest.mark.slow  # ~15 s: a cli.py fit, an export and two transformers loads
def test_lora_on_a_gemma3_folder_through_the_cli_exports_back_with_transformers_logits(tmp_path):
    """A Gemma-3-style folder fine-tuned with LoRA by ``cli.py fit`` (``init_weights: <folder>``, no net block), the
    checkpoint exported merged by ``python -m zoo.gpt export``: transformers loads it with the fine-tuned logits."""
    from conftest import cli

    peft = pytest.importorskip("peft")

    from zoo.gpt import CausalLMModule
    from zoo.gpt.__main__ import main as export_main

    folder = tmp_path / "gemma3"
    write_model(folder, "gemma3")
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 200)
    model = {"net": {"class_path": "zoo.gpt.GPT"}, "init_weights": str(folder), "adapt": {"lora": {"r": 4}}}
    model["optimizer"] = {"lr": 0.05}  # a few steps that move the logits
    data = {"path": str(tmp_path / "text.txt"), "tokenizer": "pretrained", "pretrained_dir": str(folder)}
    data |= {"block_size": 16, "batch_size": 2, "samples_per_epoch": 4, "val_samples": 2}
    config = {
        "model": {"class_path": "zoo.gpt.CausalLMModule", "init_args": model},
        "data": {"class_path": "datamodules.TextDataModule", "init_args": data},
        "trainer": {"max_steps": 3, "logger": False, "enable_progress_bar": False, "default_root_dir": str(tmp_path)},
    }
    (tmp_path / "lora.yaml").write_text(json.dumps(config))
    fitted = cli("fit", "--config", str(tmp_path / "lora.yaml"))
    trained = {n for n, p in fitted.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    ckpt = fitted.trainer.checkpoint_callback.last_model_path
    for merge in ([], ["--merge"]):
        out = str(tmp_path / f"out{merge}")
        export_main(["export", ckpt, out, "--format", "llama", *merge, "--init-weights", str(folder)])
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out['--merge']").eval()
    adapted = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out[]"), tmp_path / "out[]" / "adapter"
    ).eval()
    base = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tuned = CausalLMModule.load_from_checkpoint(ckpt, init_weights=str(folder)).eval()
    x = torch.randint(0, base.config.vocab_size, (1, 24))
    with torch.no_grad():
        torch.testing.assert_close(merged(x).logits, tuned(x), **TOL)
        torch.testing.assert_close(adapted(x).logits, tuned(x), **TOL)
        assert not torch.allclose(merged(x).logits, base(x).logits, atol=1e-3)  # the fine-tune is in it
