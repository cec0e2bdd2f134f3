"""``zoo.gpt.from_pretrained`` against transformers: a Hugging Face folder (tiny random model of each supported
architecture, its tokenizer trained here offline) arrives whole, with logits, greedy continuations and token ids
equal to transformers', and a load that cannot be exact is refused in one line.

Every weight of each reference is perturbed (norms and biases included), so a dropped bias, a missed norm or a
swapped projection shows in the logits; the perturbation test changes each source tensor in turn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HFTokenizer

from zoo.errors import InputError
from zoo.gpt import GPT, CausalLMModule, from_pretrained
from zoo.io.tokenizers import tokenizer_from_dict

transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-5, rtol=1e-5)
LLAMA3_SPLIT = (  # Llama 3's pre-tokenizer regex, as its tokenizer.json holds it
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Il était une fois, à Paris, un café où l'on parlait français et 日本語 and 中文.",
    "def f(x):\n\treturn x ** 2  # indented\n\n\n",
    "emoji 🤗🚀 and numbers 1234567 3.14159 and symbols !@#$%^&*()",
] * 20
TEMPLATE = "{% for m in messages %}<|start|>{{ m['role'] }}\n{{ m['content'] }}<|eot_id|>{% endfor %}"
HARD = [
    "Hello world",
    "",
    " ",
    "   leading and trailing   ",
    "tabs\tand\nnewlines\r\n\n\n\t\t  mixed",
    "unicode: café naïve façade Ünïcödé ＦＵＬＬＷＩＤＴＨ",
    "emoji 🤗🚀👩‍👩‍👧 flags 🇫🇷",
    "CJK 日本語の文章 中文字符 한국어 텍스트",
    "special <|eot_id|> in the text<|end_of_text|>and <|endoftext|> too",
    "<|begin_of_text|><|begin_of_text|>",
    "a" * 300,
    "supercalifragilisticexpialidocious" * 12,
    "zero\u200bwidth and\u00a0nbsp and combining e\u0301",
    "numbers 1234567890 00000 3.14159 -2e10",
    "<s> </s> <unk> [INST] look like specials but are not",
]


# -- tokenizers, trained here: a Llama-3-like, a GPT-2-like and a SentencePiece-converted (Llama-2-like) one ---------


def _byte_level(split: bool) -> HFTokenizer:
    hf = HFTokenizer(models.BPE())
    if split:  # Llama 3: its own regex, then bytes
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    return hf


def _train(hf: HFTokenizer, specials: list[str], vocab_size: int = 360, alphabet=None) -> HFTokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet() if alphabet is None else alphabet
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet, show_progress=False
    )
    hf.train_from_iterator(CORPUS, trainer)
    return hf


def _llama3_tokenizer() -> tuple[HFTokenizer, dict]:
    hf = _train(_byte_level(True), ["<|begin_of_text|>", "<|end_of_text|>", "<|start|>", "<|eot_id|>"])
    bos = "<|begin_of_text|>"
    hf.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, hf.token_to_id(bos))]
    )
    return hf, {"bos_token": bos, "eos_token": "<|eot_id|>", "chat_template": TEMPLATE}


def _gpt2_tokenizer() -> tuple[HFTokenizer, dict]:
    hf = _train(_byte_level(False), ["<|endoftext|>"])
    return hf, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}


def _sentencepiece_tokenizer() -> tuple[HFTokenizer, dict]:
    """What transformers' converter writes for a Llama-2 / Mistral tokenizer.model: Metaspace BPE with byte
    fallback (the 256 <0xNN> tokens appended to the trained vocabulary), BOS by the post-processor."""
    hf = HFTokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    hf.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    hf = _train(hf, ["<unk>", "<s>", "</s>"], 300, alphabet=[])
    spec = json.loads(hf.to_str())
    vocab = spec["model"]["vocab"]
    vocab |= {f"<0x{b:02X}>": len(vocab) + b for b in range(256)}
    hf = HFTokenizer.from_str(json.dumps(spec))
    hf.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    hf.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", hf.token_to_id("<s>"))]
    )
    return hf, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


TOKENIZERS = {"llama3": _llama3_tokenizer, "gpt2": _gpt2_tokenizer, "sentencepiece": _sentencepiece_tokenizer}


def write_tokenizer(folder: Path, kind: str) -> int:
    """tokenizer.json and tokenizer_config.json of ``kind`` in ``folder``; returns the vocabulary size."""
    hf, config = TOKENIZERS[kind]()
    folder.mkdir(parents=True, exist_ok=True)
    hf.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 64, **config}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return hf.get_vocab_size(with_added_tokens=True)


# -- tiny models of each architecture ---------------------------------------------------------------------------------


def _perturb(model):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.3)
    return model.eval()


def _llama_like(vocab: int, **extra) -> dict:
    return (
        dict(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0},
            attn_implementation="eager",
        )
        | extra
    )


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500.0,
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,  # head size 16, base 500: wavelengths in all three bands (6 to 1186)
}
ARCHITECTURES = {
    "gpt2": lambda v: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=v, n_positions=64, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0)
    ),
    "llama": lambda v: transformers.LlamaForCausalLM(transformers.LlamaConfig(**_llama_like(v))),
    "llama3.2-tied-rope-scaling": lambda v: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            **_llama_like(v, tie_word_embeddings=True, max_position_embeddings=128, rope_parameters=LLAMA3_ROPE)
        )
    ),
    "mistral": lambda v: transformers.MistralForCausalLM(
        transformers.MistralConfig(**_llama_like(v, sliding_window=None))
    ),
    "qwen2": lambda v: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_llama_like(v))),
    "qwen3": lambda v: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**_llama_like(v, head_dim=24))),
    "mixtral": lambda v: transformers.MixtralForCausalLM(
        transformers.MixtralConfig(**_llama_like(v, num_local_experts=4, num_experts_per_tok=2, sliding_window=None))
    ),
    "deepseek_v3": lambda v: transformers.DeepseekV3ForCausalLM(
        transformers.DeepseekV3Config(
            **_llama_like(v, num_key_value_heads=4)
            | dict(
                moe_intermediate_size=24,
                kv_lora_rank=16,
                q_lora_rank=24,
                qk_nope_head_dim=12,
                qk_rope_head_dim=8,
                v_head_dim=10,
                first_k_dense_replace=1,
                n_routed_experts=4,
                num_experts_per_tok=2,
                n_group=2,
                topk_group=1,
            )
        )
    ),
}


def write_model(folder: Path, arch: str, tokenizer: str = "llama3"):
    """A tiny random ``arch`` model saved with its tokenizer; returns the transformers model."""
    vocab = write_tokenizer(folder, tokenizer)
    torch.manual_seed(0)
    model = _perturb(ARCHITECTURES[arch](vocab))
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = write_model(folder, request.param)
    return model, from_pretrained(folder), folder


def test_logits_equal_transformers(pair):
    model, module, _ = pair
    x = torch.randint(0, model.config.vocab_size, (2, 29))
    with torch.no_grad():
        torch.testing.assert_close(module(x), model(x).logits, **TOL)


def test_text_generation_is_transformers_greedy_continuation(pair):
    model, module, folder = pair
    prompt = "The quick brown fox"
    ours = module.generate([prompt], max_new_tokens=8, temperature=0.0)[0]
    ids = transformers.AutoTokenizer.from_pretrained(folder)(prompt, return_tensors="pt").input_ids
    mask = torch.ones_like(ids)  # BOS is id 0 here, which transformers would take for padding
    theirs = model.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert module.tokenizer.encode(prompt) == ids[0].tolist()
    assert ours == module.tokenizer.decode(theirs[0, ids.shape[1] :].tolist())


def test_the_module_carries_tokenizer_and_net_config_into_its_checkpoint(pair, tmp_path):
    model, module, _ = pair
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    module.on_save_checkpoint(checkpoint)
    assert tokenizer_from_dict(checkpoint["tokenizer"]).to_dict() == module.tokenizer.to_dict()
    assert checkpoint["hyper_parameters"]["net"]["class_path"] == "zoo.gpt.GPT"
    assert module.hparams.compile is False and module.hparams.adapt is None  # every setting, read by a fit
    assert module.tokenizer.chat_template == TEMPLATE and module.hparams.generation["temperature"] == 0.0


def test_changing_any_source_tensor_changes_the_output(tmp_path):
    """Each tensor of the file in turn, for the architectures with the most kinds of tensors."""
    for arch in ("qwen3", "qwen2", "deepseek_v3", "gpt2"):
        folder = tmp_path / arch
        write_model(folder, arch)
        weights = load_file(folder / "model.safetensors")
        x = torch.randint(0, 300, (1, 16))
        with torch.no_grad():
            base = from_pretrained(folder)(x)
            for name, tensor in weights.items():
                # A ramp, not a constant: a router's bias shifted evenly would choose the same experts.
                ramp = torch.linspace(0.2, 1.0, tensor.numel()).view_as(tensor)
                save_file(weights | {name: tensor + ramp}, folder / "model.safetensors")
                assert not torch.allclose(from_pretrained(folder)(x), base, atol=1e-4), f"{arch}: {name} unused"
        save_file(weights, folder / "model.safetensors")


@pytest.mark.parametrize("kind", list(TOKENIZERS))
def test_token_ids_equal_autotokenizer_on_hard_strings(tmp_path, kind):
    write_tokenizer(tmp_path, kind)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    from zoo.io.hf_tokenizer import from_folder

    ours = tokenizer_from_dict(from_folder(tmp_path).to_dict())  # through a checkpoint
    for text in HARD:
        ids = theirs.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
    assert ours.encode_batch(HARD) == [theirs.encode(t) for t in HARD]
    assert (ours.eos_id, ours.bos_id) == (theirs.eos_token_id, theirs.bos_token_id)


def test_generation_config_sets_predict_defaults(tmp_path):
    write_model(tmp_path, "llama")
    config = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "eos_token_id": [5, 6], "max_new_tokens": 17}
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    g = from_pretrained(tmp_path).hparams.generation
    assert (g["temperature"], g["top_p"], g["top_k"], g["max_new_tokens"]) == (0.6, 0.9, None, 17)


PENALIZED = {  # as Qwen2.5's, with settings the zoo lacks at their neutral values (beams: 1), which it accepts
    "do_sample": False,
    "repetition_penalty": 1.3,
    "num_beams": 1,
    "bos_token_id": 0,
    "transformers_version": "4.57.0",
}


def _transformers_greedy(folder: Path, ids: torch.Tensor, n: int) -> list[int]:
    """transformers' continuation of ``ids`` as its ``generate`` reads the folder (generation_config.json included)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert model.generation_config.repetition_penalty == PENALIZED["repetition_penalty"]  # read from the file
    out = model.generate(ids[None], attention_mask=torch.ones_like(ids[None]), max_new_tokens=n, min_new_tokens=n)
    return out[0, ids.numel() :].tolist()


def _predicted(module: CausalLMModule, ids: torch.Tensor) -> str:
    """predict's continuation of ``ids`` with the module's own ``generation`` (its hparams)."""
    return module.predict_step({"prompt_ids": [ids], "text": [""]}, 0)["completion"][0]


def test_a_folders_repetition_penalty_decodes_as_transformers_generate(tmp_path):
    """Qwen2.5's generation_config.json states repetition_penalty 1.05; predict's greedy decoding through
    ``from_pretrained`` then equals transformers' ``generate`` token for token, and differs without the penalty."""
    write_model(tmp_path, "qwen2")
    (tmp_path / "generation_config.json").write_text(json.dumps(PENALIZED))
    module = from_pretrained(tmp_path)
    assert module.hparams.generation["repetition_penalty"] == 1.3 and module.hparams.generation["temperature"] == 0
    ids = torch.tensor(module.tokenizer.encode("the the the cat the cat"))
    module.hparams.generation["max_new_tokens"] = 16
    theirs = _transformers_greedy(tmp_path, ids, 16)
    assert _predicted(module, ids) == module.tokenizer.decode(theirs)
    from zoo.gpt.generate import generate

    assert generate(module.net, [ids], 16, temperature=0)[0].tolist() != theirs  # the penalty changes this output


def test_sampling_with_a_repetition_penalty_draws_transformers_tokens_for_the_same_seed(tmp_path):
    """Sampled, the same tokens as transformers' ``generate`` for the same seed: the same processed distribution drawn
    by one ``torch.multinomial`` a step from the same random stream (held by a generator here, global there)."""
    from zoo.gpt.generate import generate

    write_model(tmp_path, "qwen2")
    sampled = PENALIZED | {"do_sample": True, "temperature": 0.9, "top_k": 0, "top_p": 1.0}
    (tmp_path / "generation_config.json").write_text(json.dumps(sampled))
    module, model = from_pretrained(tmp_path), transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids, g = torch.tensor(module.tokenizer.encode("the the the cat the cat")), module.hparams.generation
    unpenalized = 0
    for seed in range(3):
        torch.manual_seed(seed)
        out = model.generate(ids[None], attention_mask=torch.ones_like(ids[None]), max_new_tokens=12, min_new_tokens=12)
        draw = dict(temperature=g["temperature"], generator=torch.Generator().manual_seed(seed))
        ours = generate(module.net, [ids], 12, repetition_penalty=g["repetition_penalty"], **draw)[0].tolist()
        assert ours == out[0, ids.numel() :].tolist()
        draw["generator"].manual_seed(seed)
        unpenalized += generate(module.net, [ids], 12, **draw)[0].tolist() != ours
    assert unpenalized > 0  # the penalty changes the draws


def test_the_cli_takes_a_folders_generation_defaults_under_its_own(tmp_path):
    """``init_weights: <folder>`` through cli.py: the folder's generation_config.json as from_pretrained reads it,
    each field the config states itself (max_new_tokens here) its own; predict's tokens are transformers'."""
    from cli import main

    folder = tmp_path / "qwen2"
    write_model(folder, "qwen2")
    (folder / "generation_config.json").write_text(json.dumps(PENALIZED))
    model = {"class_path": "zoo.gpt.CausalLMModule", "init_args": {"net": "zoo.gpt.GPT", "init_weights": str(folder)}}
    (tmp_path / "text.txt").write_text("the cat sat. " * 50)
    text = {"path": str(tmp_path / "text.txt"), "block_size": 16}
    data = {"class_path": "datamodules.TextDataModule", "init_args": text}
    args = [f"--model={json.dumps(model)}", "--model.init_args.generation.max_new_tokens=12"]
    c = main([*args, f"--data={json.dumps(data)}", "--trainer.logger=false"], run=False)
    reference = from_pretrained(folder)
    assert c.model.hparams.generation == reference.hparams.generation | {"max_new_tokens": 12}
    c.model.trainer = None
    c.model.setup("predict")
    c.model.tokenizer = reference.tokenizer
    ids = torch.tensor(reference.tokenizer.encode("the the the cat the cat"))
    assert _predicted(c.model.eval(), ids) == reference.tokenizer.decode(_transformers_greedy(folder, ids, 12))


@pytest.mark.parametrize(
    "setting, named",
    [
        ({"num_beams": 4}, "num_beams=4"),
        ({"no_repeat_ngram_size": 3}, "no_repeat_ngram_size=3"),
        ({"x": 1}, "x"),
        ({"repetition_penalty": "1.3"}, "repetition_penalty='1.3'"),
    ],
)
def test_a_decoding_setting_the_zoo_lacks_is_refused_in_one_line(tmp_path, setting, named):
    write_model(tmp_path, "llama")
    (tmp_path / "generation_config.json").write_text(json.dumps(PENALIZED | {"num_beams": 1} | setting))
    with pytest.raises(InputError, match=named) as err:
        from_pretrained(tmp_path)
    assert "\n" not in str(err.value)


def test_the_eos_comes_from_generation_config_when_tokenizer_config_has_none(tmp_path):
    write_model(tmp_path, "llama")
    tok_config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tok_config | {"eos_token": None}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3]}))
    assert from_pretrained(tmp_path).tokenizer.eos_id == 2


def test_a_leftover_or_missing_tensor_is_refused_in_one_line(tmp_path):
    write_model(tmp_path, "llama")
    weights = load_file(tmp_path / "model.safetensors")
    save_file(weights | {"model.layers.2.input_layernorm.weight": torch.ones(64)}, tmp_path / "model.safetensors")
    with pytest.raises(InputError, match=r"1 tensors .* no place for \(model.layers.2.input_layernorm.weight\)"):
        from_pretrained(tmp_path)
    del weights["model.layers.1.post_attention_layernorm.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(InputError, match="lacks the tensor 'model.layers.1.post_attention_layernorm.weight'"):
        from_pretrained(tmp_path)


def test_an_untied_head_in_a_tied_config_is_refused(tmp_path):
    write_model(tmp_path, "llama3.2-tied-rope-scaling")
    weights = load_file(tmp_path / "model.safetensors")
    weights["lm_head.weight"] = torch.randn_like(weights["model.embed_tokens.weight"])
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(InputError, match="differs from its token embedding"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 500.0, "factor": 4.0}}, "'dynamic'"),
        ({"sliding_window": 16}, "sliding_window 16"),
        ({"model_type": "bloom"}, "model_type 'bloom'"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "attention_bias and mlp_bias differ"),
    ],
)
def test_options_the_zoo_lacks_are_refused_by_name(tmp_path, change, named):
    write_model(tmp_path, "llama")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(ValueError, match=named):
        from_pretrained(tmp_path)


def test_init_weights_of_the_same_folder_loads_the_same_net(tmp_path):
    write_model(tmp_path, "qwen3")
    module = from_pretrained(tmp_path)
    from zoo.gpt.pretrained import net_kwargs, read_folder

    again = CausalLMModule(net=GPT(**net_kwargs(read_folder(tmp_path)[1])), init_weights=str(tmp_path))
    again.setup("fit")
    x = torch.randint(0, 300, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(x), module(x), atol=0, rtol=0)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama3.2-tied-rope-scaling"])
def test_an_imported_net_exports_back_to_transformers_with_the_same_logits(tmp_path, arch):
    from zoo.gpt.formats.llama import export_hf

    model = write_model(tmp_path / "in", arch)
    net = from_pretrained(tmp_path / "in").net
    export_hf(net, tmp_path / "out")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(back) is type(model)
    x = torch.randint(0, model.config.vocab_size, (2, 20))
    with torch.no_grad():
        torch.testing.assert_close(back(x).logits, model(x).logits, **TOL)


@pytest.mark.parametrize("arch", ["qwen3", "llama3.2-tied-rope-scaling"])
def test_a_checkpoint_of_an_imported_model_rebuilds_it_without_the_folder(tmp_path, arch):
    import shutil

    import lightning as L

    write_model(tmp_path / "hf", arch)
    module = from_pretrained(tmp_path / "hf")
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    shutil.rmtree(tmp_path / "hf")
    back = CausalLMModule.load_from_checkpoint(tmp_path / "m.ckpt").eval()
    x = torch.randint(0, 300, (1, 10))
    with torch.no_grad():
        assert torch.equal(back(x), module(x))
    assert back.tokenizer.to_dict() == module.tokenizer.to_dict()


def test_the_cli_fine_tunes_a_folder_with_no_net_block_and_the_folders_tokenizer(tmp_path):
    """``init_weights: <folder>`` with ``net: zoo.gpt.GPT`` alone: the net's architecture is the folder's config.json
    (zoo.app.pretrained.net_from_source), the text is tokenised by the folder's tokenizer, the weights load exactly."""
    from conftest import cli

    folder = tmp_path / "qwen3"
    write_model(folder, "qwen3")
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 200)
    config = tmp_path / "finetune.yaml"
    config.write_text(
        json.dumps(
            {
                "model": {
                    "class_path": "zoo.gpt.CausalLMModule",
                    "init_args": {"net": {"class_path": "zoo.gpt.GPT"}, "init_weights": str(folder)},
                },
                "data": {
                    "class_path": "datamodules.TextDataModule",
                    "init_args": {
                        "path": str(tmp_path / "text.txt"),
                        "tokenizer": "pretrained",
                        "pretrained_dir": str(folder),
                        "block_size": 16,
                        "batch_size": 2,
                        "samples_per_epoch": 4,
                        "val_samples": 2,
                    },
                },
                "trainer": {"max_steps": 2, "logger": False, "enable_progress_bar": False},
            }
        )
    )
    reference = from_pretrained(folder)
    from cli import main

    c = main(["--config", str(config)], run=False)  # built, not run: its weights load at setup
    c.datamodule.setup("fit")
    c.model.trainer = None
    c.model.setup("fit")
    ours, theirs = c.model.hparams.net["init_args"], reference.hparams.net["init_args"]
    assert {k: ours[k] for k in ("vocab_size", "n_layer", "n_embd", "n_head", "mlp_hidden")} == {
        k: theirs[k] for k in ("vocab_size", "n_layer", "n_embd", "n_head", "mlp_hidden")
    }  # the folder's architecture, recorded in the run's config and checkpoints
    x = torch.randint(0, reference.net.vocab_size, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(c.model.eval()(x), reference(x), atol=0, rtol=0)
    assert c.datamodule.tokenizer.to_dict() == reference.tokenizer.to_dict()
    c = cli("fit", "--config", str(config))  # and it trains
    assert c.trainer.global_step == 2 and not torch.equal(c.model.net.tok_emb.weight, reference.net.tok_emb.weight)
    # its checkpoint validates from its stored config, whose locations (the folder) are the user's to give again
    last = c.trainer.checkpoint_callback.last_model_path
    v = cli("validate", "--ckpt_path", last, f"--data.init_args.pretrained_dir={folder}", "--trainer.logger=false")
    assert v.datamodule.tokenizer.to_dict() == reference.tokenizer.to_dict()
