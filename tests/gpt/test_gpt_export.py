"""``python -m zoo.gpt export`` writes a whole Hugging Face folder (``zoo.gpt.export``): transformers'
``AutoTokenizer``, ``AutoModelForCausalLM`` and ``GenerationConfig`` and PEFT's ``PeftModel`` read the zoo's ids (hard
strings, special tokens, chats rendered by the chat template), logits and decoding from it, for each tokenizer kind, as
GPT-2 and as Llama, with and without ``--merge``; ``zoo.gpt.from_pretrained`` reads the same module back.
``lm-eval`` takes a LoRA checkpoint with its base, or refuses in one line."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from test_gpt_pretrained import CORPUS, HARD, write_tokenizer

from zoo.adapt import Adaptation, LoRA
from zoo.errors import InputError
from zoo.gpt import GPT, MHA, Generation, RMSNorm, SwiGLU, from_pretrained
from zoo.gpt.__main__ import main
from zoo.gpt.export import generation_config
from zoo.gpt.formats.hf import export_gpt2
from zoo.gpt.formats.llama import export_hf
from zoo.gpt.formats.peft_adapter import load_adapter
from zoo.gpt.pretrained import generation_defaults, recorded_module
from zoo.io import hf_tokenizer
from zoo.io.chat_template import chat_renderer, template_source
from zoo.io.tokenizers import BPETokenizer, ByteTokenizer, CharTokenizer, OpenCLIPTokenizer

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TOL = dict(atol=1e-5, rtol=1e-5)
CHAT = [  # leading spaces, unicode, a newline and spaces inside a turn, two replies
    {"role": "system", "content": "Réponds brièvement. 日本語"},
    {"role": "user", "content": " Hi  there 🤗\nhow are\tyou?"},
    {"role": "assistant", "content": "Très bien, merci! 👍 "},
    {"role": "user", "content": "And numbers 1234567?"},
    {"role": "assistant", "content": " 3.14159\n"},
]

SEAMS = [  # whitespace where a header meets a content, and an empty reply
    {"role": "user", "content": "  two spaces first, a space last "},
    {"role": "assistant", "content": ""},
    {"role": "system", "content": "\n\n"},
]


def bytes_tokenizer(tmp_path):
    return ByteTokenizer()


def chars_tokenizer(tmp_path):
    return CharTokenizer.fit("".join(HARD))


def bpe_tokenizer(tmp_path):
    return BPETokenizer.train(CORPUS, vocab_size=400)


def llama3_tokenizer(tmp_path):
    """An imported folder's tokenizer: BOS added, a chat template, two EOS ids (as Llama 3's generation_config)."""
    write_tokenizer(tmp_path / "imported", "llama3")
    tok = hf_tokenizer.from_folder(tmp_path / "imported")
    return hf_tokenizer.from_folder(tmp_path / "imported", [tok.eos_id, tok.hf.token_to_id("<|end_of_text|>")])


def sentencepiece_tokenizer(tmp_path):
    """A Llama-2-style tokenizer.model, rebuilt as a pipeline on import (``zoo.io.sp_tokenizer``)."""
    pytest.importorskip("sentencepiece")
    from test_sentencepiece import LLAMA2, train, write_folder

    return hf_tokenizer.from_folder(write_folder(tmp_path / "sp", train(), LLAMA2), model_type="llama")


KINDS = {
    "bytes": bytes_tokenizer,
    "chars": chars_tokenizer,
    "bpe": bpe_tokenizer,
    "llama3": llama3_tokenizer,
    "sentencepiece": sentencepiece_tokenizer,
}


def chat_ids(tokenizer, messages: list[dict], prompt: bool = False) -> list[int]:
    return chat_renderer(tokenizer)(messages, prompt).ids


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_tokenizer_files_give_autotokenizer_and_the_zoo_the_same_ids(tmp_path, kind):
    ours = KINDS[kind](tmp_path)
    folder = tmp_path / "out"
    folder.mkdir()
    hf_tokenizer.to_folder(ours, folder, template_source(ours), 64)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    back = hf_tokenizer.from_folder(folder)  # what zoo.gpt.from_pretrained reads
    eos = theirs.convert_ids_to_tokens(ours.eos_id)
    for text in HARD:
        ids = theirs.encode(text)
        if eos in text and kind in ("bytes", "chars"):  # EOS has a text in the folder only (a chat's end of reply)
            pieces = [ours.encode(part) for part in text.split(eos)]
            assert ids == [i for k, p in enumerate(pieces) for i in ([ours.eos_id] if k else []) + p], text
        else:
            assert ids == ours.encode(text), text
        assert back.encode(text) == ids, text
        assert theirs.decode(ids, skip_special_tokens=True) == ours.decode(ids) == back.decode(ids), text
    bos, pad = getattr(ours, "bos_id", None), getattr(ours, "pad_id", None)
    assert (theirs.eos_token_id, theirs.bos_token_id, theirs.pad_token_id) == (ours.eos_id, bos, pad)
    assert (back.eos_id, back.bos_id, back.pad_id) == (ours.eos_id, bos, pad)
    assert len(theirs) == ours.vocab_size == back.vocab_size
    if template_source(ours) is None:  # chats refused by the zoo (a character tokenizer, an import without one)
        assert "chat_template" not in json.loads((folder / "tokenizer_config.json").read_text())
        return
    seams = [] if kind == "bpe" else [(SEAMS, False)]  # header and content encoded apart: docs/gpt-formats.md
    for messages, prompt in ((CHAT, False), (CHAT[:-1], True), (CHAT[:2], True), *seams):
        ids = theirs.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=True, return_dict=False)
        assert ids == chat_ids(ours, messages, prompt) == chat_ids(back, messages, prompt)


def test_a_bpe_chat_differs_from_the_templates_ids_only_where_whitespace_meets_a_seam(tmp_path):
    """The zoo encodes a turn's header and its content apart, transformers the rendered text whole: with merges that
    join whitespace (trained on whitespace runs here), the ids differ only when a content is empty or starts with
    whitespace, or a system or user turn's ends with it (docs/gpt-formats.md)."""
    import random

    ours = BPETokenizer.train(CORPUS + ["\n  \n\t\r\n  x  y\n\n\n !!\n\n"] * 5, vocab_size=500)
    hf_tokenizer.to_folder(ours, tmp_path, template_source(ours), 64)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    rng, parts = random.Random(0), [" ", "\n", "\t", "\r", "a", "é", "1", "!", "🤗", "x y", "<|endoftext|>"]
    seen = {True: 0, False: 0}
    for _ in range(400):
        turns = [(rng.choice(("system", "user", "assistant")), rng.randint(0, 5)) for _ in range(rng.randint(1, 3))]
        messages = [{"role": r, "content": "".join(rng.choice(parts) for _ in range(n))} for r, n in turns]
        seam = any(
            not m["content"] or m["content"][0].isspace() or (m["role"] != "assistant" and m["content"][-1].isspace())
            for m in messages
        )
        prompt = rng.random() < 0.5
        same = theirs.apply_chat_template(messages, add_generation_prompt=prompt, return_dict=False) == chat_ids(
            ours, messages, prompt
        )
        assert same or seam, messages
        seen[seam] += not same
    assert seen[True] > 0  # the seams do differ with such merges: the rule is not vacuous


def test_a_tokenizer_without_a_tokenizer_json_form_is_refused_in_one_line():
    with pytest.raises(InputError, match=r"^open_clip's tokenizer cleans text .* not written as one$"):
        OpenCLIPTokenizer.pipeline(None)


@pytest.mark.parametrize(
    "generation",
    [
        Generation(temperature=0.0, top_k=3, max_new_tokens=7, repetition_penalty=1.05),
        Generation(temperature=0.7, top_p=0.9),
    ],
)
def test_generation_config_reads_back_in_transformers_and_the_zoo(tmp_path, generation):
    tok = llama3_tokenizer(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps(generation_config(generation, tok)))
    theirs = transformers.GenerationConfig.from_pretrained(tmp_path)
    assert theirs.eos_token_id == list(tok.stop_ids) and len(tok.stop_ids) == 2
    assert (theirs.bos_token_id, theirs.pad_token_id) == (tok.bos_id, None)
    assert theirs.max_new_tokens == generation.max_new_tokens
    assert (theirs.repetition_penalty or 1.0) == generation.repetition_penalty  # unset: None, no penalty
    sampled = generation.temperature > 0
    assert theirs.do_sample == sampled
    if sampled:
        assert (theirs.temperature, theirs.top_k, theirs.top_p) == (0.7, 0, 0.9)  # 0: all tokens (unset is 50)
    assert generation_defaults(tmp_path) == Generation(
        max_new_tokens=generation.max_new_tokens,
        temperature=generation.temperature,
        top_k=generation.top_k if sampled else None,
        top_p=generation.top_p if sampled else None,
        repetition_penalty=generation.repetition_penalty,
    )


# -- a LoRA checkpoint through python -m zoo.gpt export, as GPT-2 and as Llama -----------------------------------------

NETS = {
    "gpt2": dict(n_layer=2, n_embd=32, n_head=4, block_size=256),
    "llama": dict(
        n_layer=2,
        n_embd=32,
        n_head=4,
        block_size=256,
        attention=partial(MHA, n_kv_head=2),
        norm=RMSNorm,
        mlp=SwiGLU,
        mlp_hidden=48,
        position="rope",
        bias=False,
        tie_embeddings=False,
    ),
}
TOKENIZERS = {"gpt2": bytes_tokenizer, "llama": llama3_tokenizer}  # without and with BOS, one and two EOS ids
GENERATION = Generation(temperature=0.7, top_k=5, max_new_tokens=9)


@pytest.fixture(scope="module", params=list(NETS))
def lora_checkpoint(request, tmp_path_factory):
    """A LoRA fine-tune of a base folder (its adapters trained: B random), saved without its base; with the module."""
    layout, tmp = request.param, tmp_path_factory.mktemp(request.param)
    tokenizer = TOKENIZERS[layout](tmp)
    kwargs = {"vocab_size": tokenizer.vocab_size + 3} | NETS[
        layout
    ]  # a net's vocabulary may be larger than the tokenizer's
    torch.manual_seed(0)
    base = tmp / "base"
    (export_hf if layout == "llama" else export_gpt2)(GPT(**kwargs), base)
    lora = Adaptation(lora=LoRA(r=4, alpha=8))
    module = recorded_module(GPT(**kwargs), kwargs, init_weights=str(base), adapt=lora, generation=GENERATION)
    module.setup("fit")
    module.configure_model()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.2)
    module.tokenizer = tokenizer
    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp / "lora.ckpt")
    return layout, tmp / "lora.ckpt", base, module.eval()


def logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        out = model.eval()(torch.tensor([ids]))
    return getattr(out, "logits", out)


@pytest.mark.parametrize("merge", [False, True], ids=["adapter", "merged"])
def test_an_exported_lora_checkpoint_loads_in_transformers_and_peft_with_the_zoos_ids_and_logits(
    lora_checkpoint, tmp_path, merge, monkeypatch, capsys
):
    layout, ckpt, base, module = lora_checkpoint
    folder = tmp_path / "hf"
    argv = ["export", str(ckpt), str(folder), "--format", layout, "--init-weights", str(base)]
    main(argv + ["--merge"] * merge)
    out = capsys.readouterr().out
    assert ("(PEFT LoRA)" in out) != merge and "generation_config.json" in out and "tokenizer.json" in out
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = "Réponds 🤗  <|eot_id|> x"  # a special token of the imported tokenizer, bytes to the byte tokenizer
    ids = tokenizer.encode(text)
    assert ids == module.tokenizer.encode(text)
    chat = tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=False)
    assert chat == chat_ids(module.tokenizer, CHAT)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    ours = logits(module, chat)
    if not merge:
        model = peft.PeftModel.from_pretrained(model, folder / "adapter")
    torch.testing.assert_close(logits(model, chat), ours, **TOL)
    config = transformers.GenerationConfig.from_pretrained(folder)
    stop = list(module.tokenizer.stop_ids)
    assert (config.do_sample, config.temperature, config.top_k, config.max_new_tokens) == (True, 0.7, 5, 9)
    assert config.eos_token_id == (stop if len(stop) > 1 else stop[0])
    # and back into the zoo: the same ids, logits, chat and decoding
    back = from_pretrained(folder)
    if not merge:
        back = load_adapter(back, folder / "adapter")
    torch.testing.assert_close(logits(back, chat), ours, **TOL)
    assert back.tokenizer.encode(text) == ids and chat_ids(back.tokenizer, CHAT) == chat
    assert back.tokenizer.stop_ids == module.tokenizer.stop_ids
    assert Generation.of(back.hparams.generation) == GENERATION


def test_export_and_lm_eval_refuse_a_lora_checkpoint_without_its_base_in_one_line(lora_checkpoint, tmp_path):
    _, ckpt, _, _ = lora_checkpoint
    for argv in (["export", str(ckpt), str(tmp_path / "hf")], ["lm-eval", str(ckpt), "--tasks", "x"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        message = str(exit_info.value.code)
        assert message.startswith("error: ") and "\n" not in message, message
        assert message.endswith("holds LoRA adapters without their frozen base: give the model they were trained on, "
                                "--init-weights <its folder or file>")  # fmt: skip


def test_zoolm_loads_a_lora_checkpoint_given_its_base(lora_checkpoint):
    pytest.importorskip("lm_eval")
    from zoo.gpt.lm_eval import ZooLM

    _, ckpt, base, module = lora_checkpoint
    lm = ZooLM(str(ckpt), init_weights=str(base))
    ids = module.tokenizer.encode("the cat sat")
    torch.testing.assert_close(logits(lm.module, ids), logits(module, ids))


@pytest.mark.slow  # lm-eval's and datasets' imports, a datasets cache: ~8 s
def test_lm_eval_runs_on_a_lora_checkpoint_given_its_base(lora_checkpoint, tmp_path, monkeypatch, capsys):
    pytest.importorskip("lm_eval")
    from test_gpt_tasks import local_task

    layout, ckpt, base, _ = lora_checkpoint
    _, tasks = local_task(tmp_path, monkeypatch)
    out = tmp_path / "results.json"
    argv = ["lm-eval", str(ckpt), "--tasks", "zoo_mc", "--include-path", str(tasks), "--no-builtin-tasks"]
    main(argv + ["--init-weights", str(base), "--output", str(out)])
    assert "zoo_mc" in capsys.readouterr().out
    assert 0 <= json.loads(out.read_text())["zoo_mc"]["acc,none"] <= 1


def test_a_checkpoint_without_a_tokenizer_exports_its_weights_and_says_so(tmp_path):
    from zoo.gpt import CausalLMModule
    from zoo.gpt.export import export

    lines = export(CausalLMModule(GPT(vocab_size=50, **NETS["gpt2"])), tmp_path)
    assert any(line.startswith("no tokenizer: ") for line in lines)
    assert not (tmp_path / "tokenizer.json").exists() and (tmp_path / "model.safetensors").is_file()
    assert "eos_token_id" not in json.loads((tmp_path / "generation_config.json").read_text())


def test_the_folder_is_written_through_links_planted_in_it(tmp_path):
    """Each file replaces a link at its name (``zoo.io.files.replacing``), never writes through it."""
    target = tmp_path / "victim.txt"
    target.write_text("kept")
    folder = tmp_path / "hf"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).symlink_to(target)
    hf_tokenizer.to_folder(ByteTokenizer(), folder, None, 16)
    assert target.read_text() == "kept" and not (folder / "tokenizer.json").is_symlink()
    assert Path(folder / "tokenizer.json").stat().st_size > 0
