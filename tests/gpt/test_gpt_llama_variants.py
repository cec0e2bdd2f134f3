"""SmolLM3, OLMo 2 and Granite folders (``zoo.gpt.formats.llama_variants``) against transformers: tiny random models it
saved itself, with their switches set away from Llama's (NoPE layers at two intervals and a list, post-norms with GQA,
multipliers that are not 1), load with transformers' logits over the whole context and its greedy continuation, export
back to a folder of the same model type with the same logits, and what the zoo cannot hold is refused in one line.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_gpt_pretrained import _llama_like, _perturb, write_tokenizer

from zoo.errors import InputError
from zoo.gpt import from_pretrained
from zoo.gpt.formats.llama import export_hf

transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-5, rtol=1e-5)
CONTEXT = 64  # every test sequence fills it: the NoPE layers and RoPE differ most at the far positions
IDS = dict(pad_token_id=None, bos_token_id=0, eos_token_id=3)  # the llama3 tokenizer's (SmolLM3's default: 128000...)
GRANITE = dict(embedding_multiplier=3.0, residual_multiplier=0.4, attention_multiplier=0.05, logits_scaling=2.5)
VARIANTS = {
    # NoPE every 3rd layer of 4 (layer 2); the tied head SmolLM3 has
    "smollm3-interval3": lambda v: transformers.SmolLM3ForCausalLM(
        transformers.SmolLM3Config(**IDS | _llama_like(v, num_hidden_layers=4, no_rope_layer_interval=3))
    ),
    # a stated list: layers 0 and 3 without RoPE, untied, MQA, a sliding window the context never reaches
    "smollm3-list": lambda v: transformers.SmolLM3ForCausalLM(
        transformers.SmolLM3Config(
            **IDS
            | _llama_like(v, num_hidden_layers=4, num_key_value_heads=1, tie_word_embeddings=False)
            | dict(no_rope_layers=[0, 1, 1, 0], use_sliding_window=True, sliding_window=CONTEXT)
        )
    ),
    "olmo2": lambda v: transformers.Olmo2ForCausalLM(
        transformers.Olmo2Config(**IDS | _llama_like(v, rms_norm_eps=1e-4))
    ),
    "granite": lambda v: transformers.GraniteForCausalLM(transformers.GraniteConfig(**IDS | _llama_like(v) | GRANITE)),
}
CONFIGS = {
    "smollm3": transformers.SmolLM3Config,
    "olmo2": transformers.Olmo2Config,
    "granite": transformers.GraniteConfig,
}


def write_variant(folder, arch: str):
    vocab = write_tokenizer(folder, "llama3")
    torch.manual_seed(0)
    model = _perturb(VARIANTS[arch](vocab))
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = write_variant(folder, request.param)
    return model, from_pretrained(folder), folder


def _logits(model, x):
    with torch.no_grad():
        out = model(x)
    return getattr(out, "logits", out)


def test_logits_over_the_whole_context_equal_transformers(pair):
    model, module, _ = pair
    x = torch.randint(0, model.config.vocab_size, (2, CONTEXT))
    torch.testing.assert_close(_logits(module, x), _logits(model, x), **TOL)


def test_greedy_generation_equals_transformers_generate(pair):
    model, module, folder = pair
    prompt = "The quick brown fox jumps over the lazy dog. The quick"
    ids = transformers.AutoTokenizer.from_pretrained(folder)(prompt, return_tensors="pt").input_ids
    n = 12  # each token greedy: one logit out of place changes the rest
    theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n)
    ours = module.generate([prompt], max_new_tokens=n, temperature=0.0)[0]
    assert module.tokenizer.encode(prompt) == ids[0].tolist()
    assert ours == module.tokenizer.decode(theirs[0, ids.shape[1] :].tolist())


def test_export_writes_the_same_model_type_with_the_same_logits(pair, tmp_path):
    model, module, _ = pair
    export_hf(module.net, tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(back) is type(model)
    x = torch.randint(0, model.config.vocab_size, (2, CONTEXT))
    torch.testing.assert_close(_logits(back, x), _logits(model, x), **TOL)


def test_a_config_stating_only_the_nope_interval_loads_as_transformers_derives_it(tmp_path):
    """A config.json with ``no_rope_layer_interval`` and no list (transformers writes both; an edited or older file
    may not): the NoPE layers are those transformers' config class derives."""
    write_variant(tmp_path, "smollm3-interval3")
    config = json.loads((tmp_path / "config.json").read_text())
    del config["no_rope_layers"], config["layer_types"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert model.config.no_rope_layers == [1, 1, 0, 1]
    x = torch.randint(0, model.config.vocab_size, (1, CONTEXT))
    torch.testing.assert_close(_logits(from_pretrained(tmp_path), x), _logits(model, x), **TOL)


def test_the_switches_off_export_as_llama(tmp_path):
    """A SmolLM3 with no NoPE layer and a Granite whose multipliers are 1 and scale 1/sqrt(d) are Llamas."""
    write_variant(tmp_path / "in", "granite")
    config = json.loads((tmp_path / "in" / "config.json").read_text())
    plain = dict(embedding_multiplier=1, residual_multiplier=1, logits_scaling=1, attention_multiplier=1.0)
    (tmp_path / "in" / "config.json").write_text(json.dumps(config | plain))
    net = from_pretrained(tmp_path / "in").net
    for block in net.blocks:
        block.attn.scale = None  # 1/sqrt(d): Llama's
    export_hf(net, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "llama"


def test_every_field_of_transformers_config_classes_is_read_with_its_defaults():
    from zoo.gpt.formats import llama_variants as v

    for kind, cls in CONFIGS.items():
        known = v.LLAMA_FIELDS | v.INERT | v.OWN_FIELDS[kind]
        assert set(cls.__annotations__) <= known, (kind, set(cls.__annotations__) - known)
        default = cls()
        for key, value in v.DEFAULTS[kind].items():
            theirs = default.rope_parameters["rope_theta"] if key == "rope_theta" else getattr(default, key, None)
            if key in ("rope_parameters", "no_rope_layers", "layer_types", "num_key_value_heads") and value is None:
                continue  # derived by the class from the others, as here
            assert value == theirs, (kind, key, value, theirs)


def test_changing_any_source_tensor_changes_the_output(tmp_path):
    """OLMo 2's norms each in turn: its post-norms and whole-width q/k norms are all used (SmolLM3's and Granite's
    tensors are Llama's, which test_gpt_pretrained perturbs)."""
    from zoo.gpt.formats.hf import pretrained_gpt
    from zoo.gpt.pretrained import net_kwargs, read_folder

    write_variant(tmp_path, "olmo2")
    kwargs = net_kwargs(read_folder(tmp_path)[1])
    weights = load_file(tmp_path / "model.safetensors")
    x = torch.randint(0, 300, (1, 16))
    base = _logits(pretrained_gpt(kwargs, tmp_path), x)
    for name, tensor in weights.items():
        if "norm" not in name:
            continue  # the projections are Llama's, perturbed by test_gpt_pretrained; the norms are OLMo 2's own
        ramp = torch.linspace(0.2, 1.0, tensor.numel()).view_as(tensor)
        save_file(weights | {name: tensor + ramp}, tmp_path / "model.safetensors")
        assert not torch.allclose(_logits(pretrained_gpt(kwargs, tmp_path), x), base, atol=1e-4), f"{name} unused"


@pytest.mark.parametrize(
    "arch, change, named",
    [
        ("smollm3-list", {"sliding_window": 16}, r"layers \[0, 3\] attend through a sliding_window of 16"),
        ("smollm3-list", {"layer_types": ["sliding_attention"] * 4, "sliding_window": None}, "sliding_window of None"),
        ("smollm3-list", {"no_rope_layers": [0, 1]}, "no_rope_layers"),
        ("smollm3-list", {"no_rope_layers": None, "no_rope_layer_interval": 0}, "no_rope_layer_interval 0"),
        ("olmo2", {"attention_bias": True}, "OLMo 2 with attention_bias"),
        ("granite", {"logits_scaling": "2"}, "logits_scaling '2'"),
        ("granite", {"attention_multiplier": 0}, "attention_multiplier 0"),
    ],
)
def test_what_the_zoo_cannot_hold_is_refused_in_one_line(tmp_path, arch, change, named):
    write_variant(tmp_path, arch)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(InputError, match=named) as err:
        from_pretrained(tmp_path)
    assert "\n" not in str(err.value)


def test_a_folder_into_a_net_built_without_its_switches_is_refused(tmp_path):
    """Granite's weights are Llama's names: loaded into a Llama net they would fit and compute another function."""
    from zoo.gpt import GPT
    from zoo.gpt.formats.hf import load_pretrained
    from zoo.gpt.pretrained import net_kwargs, read_folder

    write_variant(tmp_path, "granite")
    kwargs = net_kwargs(read_folder(tmp_path)[1])
    net = GPT(**{k: v for k, v in kwargs.items() if k not in ("embedding_multiplier",)})
    with pytest.raises(InputError, match=r"embedding_multiplier=3.0 \(the net: 1.0\)"):
        load_pretrained(net, tmp_path)


def test_a_mix_of_switches_has_no_hugging_face_form(tmp_path):
    write_variant(tmp_path, "olmo2")
    net = from_pretrained(tmp_path).net
    net.logits_scaling = 2.0
    with pytest.raises(InputError, match="no Hugging Face form"):
        export_hf(net, tmp_path / "out")


@pytest.mark.slow  # ~6 s of CPU: cli.py's parser built twice (the LoRA test below takes SmolLM3's NoPE list through it)
def test_init_weights_through_the_cli_builds_each_variant_from_its_folder(tmp_path):
    """``init_weights: <folder>`` with ``net: zoo.gpt.GPT`` alone: the switches travel through the CLI's parsed config
    (``GPT``'s and ``MHA``'s arguments) and the net computes what from_pretrained's does."""
    from cli import main

    (tmp_path / "text.txt").write_text("the cat sat. " * 50)
    data = {
        "class_path": "datamodules.TextDataModule",
        "init_args": {"path": str(tmp_path / "text.txt"), "block_size": 16},
    }
    for arch in ("olmo2", "granite"):
        folder = tmp_path / arch
        write_variant(folder, arch)
        model = {
            "class_path": "zoo.gpt.CausalLMModule",
            "init_args": {"net": "zoo.gpt.GPT", "init_weights": str(folder)},
        }
        c = main([f"--model={json.dumps(model)}", f"--data={json.dumps(data)}", "--trainer.logger=false"], run=False)
        c.model.trainer = None
        c.model.setup("fit")
        x = torch.randint(0, 300, (1, CONTEXT))
        assert torch.equal(_logits(c.model.eval(), x), _logits(from_pretrained(folder), x)), arch


@pytest.mark.slow  # ~15 s: a cli.py LoRA fit of a SmolLM3 folder, exported twice and read back by transformers and PEFT
def test_a_lora_fine_tune_of_a_smollm3_folder_exports_back_with_the_zoos_logits(tmp_path):
    """``python cli.py fit`` with ``init_weights: <SmolLM3 folder>`` and a LoRA setting, then ``python -m zoo.gpt
    export`` of its checkpoint, merged and as a PEFT adapter: a SmolLM3 folder (NoPE layers kept) whose logits in
    transformers (with PEFT on the adapter) are the fine-tuned module's."""
    peft = pytest.importorskip("peft")
    from conftest import cli

    from zoo.gpt.__main__ import main as zoo_gpt

    folder = tmp_path / "smollm3"
    write_variant(folder, "smollm3-interval3")
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 200)
    model = {"net": {"class_path": "zoo.gpt.GPT"}, "init_weights": str(folder), "adapt": {"lora": {"r": 4}}}
    model["optimizer"] = {"lr": 0.05}  # the adapters far from zero in 3 steps
    data = {"path": str(tmp_path / "text.txt"), "tokenizer": "pretrained", "pretrained_dir": str(folder)}
    data |= {"block_size": 32, "batch_size": 2, "samples_per_epoch": 4, "val_samples": 2}
    config = {
        "model": {"class_path": "zoo.gpt.CausalLMModule", "init_args": model},
        "data": {"class_path": "datamodules.TextDataModule", "init_args": data},
        "trainer": {"max_steps": 3, "logger": False, "enable_progress_bar": False, "default_root_dir": str(tmp_path)},
    }
    (tmp_path / "lora.yaml").write_text(json.dumps(config))
    fitted = cli("fit", "--config", str(tmp_path / "lora.yaml"))
    ckpt = fitted.trainer.checkpoint_callback.last_model_path
    x = torch.randint(0, fitted.model.net.vocab_size, (2, CONTEXT))
    ours = _logits(fitted.model.eval(), x)
    base = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert (ours - _logits(base, x)).abs().max() > 1e-2  # the adapters changed the function
    for merge in (True, False):
        out = tmp_path / f"hf-{merge}"
        zoo_gpt(["export", ckpt, str(out), "--format", "llama", "--init-weights", str(folder)] + ["--merge"] * merge)
        assert json.loads((out / "config.json").read_text())["model_type"] == "smollm3"
        back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        if not merge:
            back = peft.PeftModel.from_pretrained(back, out / "adapter").eval()
        torch.testing.assert_close(_logits(back, x), ours, **TOL)
