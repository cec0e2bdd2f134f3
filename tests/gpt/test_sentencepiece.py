"""A Llama-2-style folder with only a SentencePiece ``tokenizer.model``: the zoo's tokenizer (``zoo.io.sp_tokenizer``)
is the pipeline transformers' ``AutoTokenizer`` builds for it, key for key, so the ids and texts are equal on hard
strings; the imported model predicts with those ids, its checkpoint carries the tokenizer, and a model proto the zoo
cannot read exactly is refused in one line.

The SentencePiece models are trained here, offline, in well under a second (BPE with byte fallback, identity
normalization and whitespace kept, as Llama 2's).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from zoo.errors import InputError
from zoo.gpt import CausalLMModule, from_pretrained
from zoo.io import sp_tokenizer
from zoo.io.hf_tokenizer import from_folder
from zoo.io.tokenizers import tokenizer_from_dict

spm = pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

TEXT = [
    "The quick brown fox jumps over the lazy dog. Il était une fois un café.",
    "def f(x):\n\treturn x ** 2  # indented\n",
    "numbers 1234567 3.14159 and symbols !@#$%^&*() [INST] <<SYS>>",
] * 20
HARD = [
    "Hello world",
    "",
    " ",
    "   leading and trailing   ",
    "tabs\tand\nnewlines\r\n\n\n\t\t  mixed",
    "\n",
    "unicode: café naïve façade Ünïcödé ＦＵＬＬＷＩＤＴＨ",
    "emoji 🤗🚀👩‍👩‍👧 flags 🇫🇷",
    "CJK 日本語の文章 中文字符 한국어 텍스트",
    "special <s> in </s> the<unk>text</s>x",
    "</s> after a special",
    "a" * 300,
    "supercalifragilisticexpialidocious" * 12,
    "zero\u200bwidth and\u00a0nbsp and combining e\u0301",
    "▁already ▁▁ metaspace",
    "[INST] <<SYS>> <pad> <ctl> <usr>x<usr> look like specials",
]
FLAGS = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
LLAMA2 = {  # Llama-2-7b-hf's tokenizer_config.json, abridged
    "add_bos_token": True,
    "add_eos_token": False,
    "bos_token": {"__type": "AddedToken", "content": "<s>"} | FLAGS,
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": None,
    "legacy": False,
    "clean_up_tokenization_spaces": False,
    "tokenizer_class": "LlamaTokenizer",
    "added_tokens_decoder": {str(i): {"content": t} | FLAGS for i, t in enumerate(["<unk>", "<s>", "</s>"])},
}


def train(**options) -> bytes:
    buf = io.BytesIO()
    settings = dict(
        model_type="bpe",
        vocab_size=400,
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT), model_writer=buf, **settings | options)
    return buf.getvalue()


@pytest.fixture(scope="session")
def sp_model() -> bytes:
    return train()


@pytest.fixture(scope="session")
def tagged_model() -> bytes:
    """With a user-defined and a control piece, which are added tokens."""
    return train(user_defined_symbols=["<usr>"], control_symbols=["<ctl>"])


def write_folder(folder: Path, model: bytes, config: dict | None = LLAMA2, model_type: str = "llama") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model)
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return folder


LISTED = LLAMA2["added_tokens_decoder"]
UNLISTED = {k: v for k, v in LLAMA2.items() if k != "added_tokens_decoder"}  # as older Llama 2 configs
UNK_LSTRIP = {"__type": "AddedToken", "content": "<unk>"} | FLAGS | {"lstrip": True}
CASES = {  # name: (with user-defined and control pieces, tokenizer_config.json)
    "llama2": (False, LLAMA2),
    "legacy": (False, LLAMA2 | {"legacy": True}),
    "no prefix space": (False, LLAMA2 | {"add_prefix_space": False}),
    "eos not bos": (False, LLAMA2 | {"add_bos_token": False, "add_eos_token": True}),
    "no add_bos_token key": (False, {k: v for k, v in LLAMA2.items() if k != "add_bos_token"}),
    "a new pad token": (False, LLAMA2 | {"pad_token": "<pad>", "added_tokens_decoder": LISTED | {"400": {"content": "<pad>"}}}),  # noqa: E501
    "unk with lstrip": (False, LLAMA2 | {"unk_token": UNK_LSTRIP}),
    "a piece's flags kept": (False, UNLISTED | {"bos_token": LLAMA2["bos_token"] | {"lstrip": True}}),
    "listed flags win": (False, LLAMA2 | {"added_tokens_decoder": LISTED | {"1": LISTED["1"] | {"rstrip": True}}}),
    "tagged pieces": (True, LLAMA2),
    "a user-defined piece as eos": (True, LLAMA2 | {"eos_token": "<usr>", "add_eos_token": True}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_token_ids_and_texts_equal_autotokenizer_on_hard_strings(tmp_path, sp_model, tagged_model, name):
    tagged, config = CASES[name]
    folder = write_folder(tmp_path, tagged_model if tagged else sp_model, config)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert type(theirs).__name__ == "LlamaTokenizer"
    ours = from_folder(folder, model_type="llama")
    # The whole pipeline (vocabulary, merges, pre-tokenizer, decoder, added tokens and their flags, BOS/EOS template)
    assert json.loads(ours.hf.to_str()) == json.loads(theirs.backend_tokenizer.to_str())
    ours = tokenizer_from_dict(json.loads(json.dumps(ours.to_dict())))  # as a checkpoint or MLflow model holds it
    for text in HARD:
        ids = theirs.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
    assert ours.encode_batch(HARD) == [theirs.encode(t) for t in HARD]
    assert (ours.eos_id, ours.bos_id, ours.pad_id) == (theirs.eos_token_id, theirs.bos_token_id, theirs.pad_token_id)
    assert ours.vocab_size == len(theirs)


def test_sentencepiece_itself_would_give_other_ids(sp_model):
    """Why the zoo rebuilds transformers' pipeline instead of running sentencepiece: they differ on a leading space,
    a special token written in the text and a text starting with the metaspace."""
    sp = spm.SentencePieceProcessor(model_proto=sp_model)
    theirs = transformers.AutoTokenizer.from_pretrained(write_folder(Path("folder"), sp_model))
    differ = [t for t in (" x", "a </s> b", "▁x") if [1, *sp.encode(t)] != theirs.encode(t)]
    assert len(differ) == 3


def tiny_llama(vocab: int):
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)  # away from init's near-uniform logits: greedy choices are clear
    return model.eval()


@pytest.fixture(scope="module")
def llama(tmp_path_factory, sp_model):
    folder = write_folder(tmp_path_factory.mktemp("llama2"), sp_model)
    model = tiny_llama(spm.SentencePieceProcessor(model_proto=sp_model).get_piece_size())
    model.save_pretrained(folder)
    assert not (folder / "tokenizer.json").exists()
    return model, folder


def test_a_llama_folder_with_only_tokenizer_model_generates_as_transformers(llama):
    model, folder = llama
    module = from_pretrained(folder)
    prompt = "The quick brown fox"
    ids = transformers.AutoTokenizer.from_pretrained(folder)(prompt, return_tensors="pt").input_ids
    assert module.tokenizer.encode(prompt) == ids[0].tolist() and ids[0, 0] == 1  # BOS, as add_bos_token says
    theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)[0]
    ours = module.generate([ids[0]], max_new_tokens=8, temperature=0.0)[0]
    assert len(ours) == 8 and ours.tolist() == theirs[ids.shape[1] :].tolist()
    assert module.generate([prompt], max_new_tokens=8, temperature=0.0) == [module.tokenizer.decode(ours.tolist())]


def test_generation_stops_at_any_eos_id_generation_config_lists_as_transformers(llama, tmp_path):
    """Llama 3's generation_config.json lists three EOS ids; here the third greedy token is made a second one."""
    import shutil

    model, folder = llama
    folder = shutil.copytree(folder, tmp_path / "llama2")
    ids = torch.tensor([[1, 50, 60, 70]])
    free = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)[0, 4:]
    stop = int(free[2])
    assert stop not in free[:2].tolist() and 2 not in free[:2].tolist()
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, stop]}))
    module = from_pretrained(folder)
    assert module.tokenizer.stop_ids == (2, stop)
    theirs = transformers.LlamaForCausalLM.from_pretrained(folder).generate(ids, max_new_tokens=8, do_sample=False)
    assert theirs[0, 4:].tolist() == free[:3].tolist()  # transformers stops there too, and keeps the EOS
    assert module.generate([ids[0]], max_new_tokens=8, temperature=0.0)[0].tolist() == free[:2].tolist()
    again = tokenizer_from_dict(json.loads(json.dumps(module.tokenizer.to_dict())))  # as a checkpoint holds it
    assert again.stop_ids == (2, stop)


def test_the_checkpoint_carries_the_tokenizer_without_the_folder(llama, tmp_path):
    import shutil

    import lightning as L

    folder = shutil.copytree(llama[1], tmp_path / "llama2")
    module = from_pretrained(folder)
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, max_steps=0)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    shutil.rmtree(folder)
    back = CausalLMModule.load_from_checkpoint(tmp_path / "m.ckpt")
    assert back.tokenizer.to_dict() == module.tokenizer.to_dict()
    assert [back.tokenizer.encode(t) for t in HARD] == [module.tokenizer.encode(t) for t in HARD]


def _change(proto: bytes, edit) -> bytes:
    from sentencepiece import sentencepiece_model_pb2

    m = sentencepiece_model_pb2.ModelProto.FromString(proto)
    edit(m)
    return m.SerializeToString()


@pytest.mark.parametrize(
    "model, config, model_type, named",
    [
        (lambda m: m[: len(m) // 2], LLAMA2, "llama", "is not a SentencePiece model"),
        (lambda m: b"\x0a\x03abc", LLAMA2, "llama", "is not a SentencePiece model"),
        (lambda m: train(model_type="unigram", hard_vocab_limit=False), LLAMA2, "llama", "not a BPE model"),
        (lambda m: train(normalization_rule_name="nmt_nfkc"), LLAMA2, "llama", r"normalizes text \(nmt_nfkc\)"),
        (lambda m: train(remove_extra_whitespaces=True), LLAMA2, "llama", "folds whitespace runs"),
        (lambda m: train(byte_fallback=False, vocab_size=120), LLAMA2, "llama", "no byte fallback"),
        (lambda m: _change(m, lambda p: setattr(p.pieces[300], "piece", "x" * 600)), LLAMA2, "llama", "over 512"),
        (lambda m: _change(m, lambda p: setattr(p.pieces[300], "piece", p.pieces[301].piece)), LLAMA2, "llama", "same"),
        (lambda m: m, LLAMA2 | {"tokenizer_class": "T5Tokenizer"}, "llama", "tokenizer_class 'T5Tokenizer'"),
        (lambda m: m, None, "llama", "tokenizer_class None"),
        (lambda m: m, LLAMA2, "mistral", "model_type 'mistral'"),
        (
            lambda m: m,
            LLAMA2 | {"added_tokens_decoder": {"5": {"content": "<pad>"} | FLAGS}},
            "llama",
            r"added_tokens_decoder's 5: .* is not the tokenizer.model's '<0x02>'",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_model_the_zoo_cannot_read_exactly_is_refused_in_one_line(
    tmp_path, sp_model, model, config, model_type, named
):
    from zoo.gpt.formats.folder import Folder

    folder = write_folder(tmp_path, model(sp_model), config, model_type)
    with pytest.raises(InputError, match=named) as err:
        _ = Folder.read(folder).tokenizer  # what from_pretrained and tokenizer: pretrained read
    assert "\n" not in str(err.value)


def test_an_oversized_tokenizer_model_is_refused_unread(tmp_path, sp_model):
    folder = write_folder(tmp_path, sp_model)
    with (folder / "tokenizer.model").open("wb") as f:  # sparse: never on disk, only read up to the limit and one more
        f.truncate(sp_tokenizer.MAX_MODEL_BYTES + 1)
    with pytest.raises(InputError, match="is larger than 16,777,216 bytes"):
        from_folder(folder, model_type="llama")


@pytest.mark.parametrize(
    ("bound", "at", "named"),
    [
        ("MAX_PIECES", 399, "holds 400 pieces, more than the 399 the zoo reads"),
        ("MAX_MERGES", 10, "more than 10 merges"),
    ],
)
def test_a_model_past_the_counts_the_zoo_builds_is_refused_before_it_is_built(
    tmp_path, sp_model, monkeypatch, bound, at, named
):
    """A file within the size limit can hold ~2M pieces making 8.4M merges (30 s, 3.3 GB): counted first."""
    monkeypatch.setattr(sp_tokenizer, bound, at)
    monkeypatch.setattr(sp_tokenizer, "_add_tokens", lambda *a: pytest.fail("built past the bound"))
    with pytest.raises(InputError, match=named) as err:
        from_folder(write_folder(tmp_path, sp_model), model_type="llama")
    assert "\n" not in str(err.value)


def test_a_model_at_the_counts_is_built(tmp_path, sp_model, monkeypatch):
    from sentencepiece import sentencepiece_model_pb2

    pieces = sentencepiece_model_pb2.ModelProto.FromString(sp_model).pieces
    monkeypatch.setattr(sp_tokenizer, "MAX_PIECES", len(pieces))
    monkeypatch.setattr(
        sp_tokenizer, "MAX_MERGES", len(sp_tokenizer.merges({p.piece: i for i, p in enumerate(pieces)}))
    )
    assert from_folder(write_folder(tmp_path, sp_model), model_type="llama").vocab_size == len(pieces)
