"""A stored tokenizer's regexes (``zoo.io.patterns``): the tokenizers library runs them in Rust, where no deadline
reaches, so one that is neither a published pattern nor literal strings is refused before anything is encoded,
from a folder and from a checkpoint alike, in one line naming it."""

from __future__ import annotations

import json
import re
import time

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from zoo.errors import InputError
from zoo.io import patterns
from zoo.io.hf_tokenizer import from_folder
from zoo.io.tokenizers import OpenCLIPTokenizer, tokenizer_from_dict

BOMB = r"(a+)+$"  # backtracks 2^n times on 'aaa...ab'


def pipeline(pattern: str, where: str = "pre_tokenizer") -> str:
    hf = Tokenizer(models.BPE({"a": 0, "b": 1, "<|endoftext|>": 2}, [], unk_token=None))
    if where == "pre_tokenizer":  # inside a Sequence, as Llama 3's is
        hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), "isolated")])
    elif where == "normalizer":
        hf.normalizer = normalizers.Replace(Regex(pattern), "")
    else:
        hf.decoder = decoders.Replace(Regex(pattern), "")
    return hf.to_str()


@pytest.mark.parametrize("where", ["pre_tokenizer", "normalizer", "decoder"])
def test_a_checkpoints_tokenizer_with_a_regex_that_backtracks_is_refused_in_one_line(where):
    start = time.monotonic()
    with pytest.raises(InputError, match=r"the checkpoint's bpe tokenizer holds the regex '\(a\+\)\+\$'") as err:
        tokenizer_from_dict({"kind": "bpe", "json": pipeline(BOMB, where)})
    assert "\n" not in str(err.value) and patterns.TRUST_ENV in str(err.value)
    assert time.monotonic() - start < 1


def test_a_folders_tokenizer_json_with_a_regex_that_backtracks_is_refused_in_one_line(tmp_path):
    (tmp_path / "tokenizer.json").write_text(pipeline(BOMB))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    with pytest.raises(InputError, match=rf"{re.escape(repr(str(tmp_path / 'tokenizer.json')))} holds the regex"):
        from_folder(tmp_path)


def test_a_regex_is_read_as_tokenizers_reads_it():
    """A pattern written twice (a duplicate key, which JSON readers settle differently): the pattern checked is the
    one tokenizers built, so whichever it keeps, the one that backtracks never runs."""
    bomb = '"' + BOMB.replace("\\", "\\\\") + '"'
    for first, last in ((bomb, '"x"'), ('"x"', bomb)):
        text = pipeline("x").replace('{"Regex":"x"}', f'{{"Regex":{first},"Regex":{last}}}')
        try:
            built = tokenizer_from_dict({"kind": "bpe", "json": text})
        except InputError:
            continue
        assert "(a+)" not in built.hf.pre_tokenizer.__getstate__().decode()


def test_the_user_takes_any_regex_for_a_tokenizer_they_made(monkeypatch):
    monkeypatch.setenv(patterns.TRUST_ENV, "1")
    assert tokenizer_from_dict({"kind": "bpe", "json": pipeline(BOMB)}).hf.pre_tokenizer is not None


@pytest.mark.parametrize("pattern", sorted(patterns.KNOWN))
def test_each_published_pattern_is_taken_and_tokenizers_compiles_it(pattern):
    assert tokenizer_from_dict({"kind": "bpe", "json": pipeline(pattern)}).encode("ab") == [0, 1]


def test_the_zoos_own_clip_pattern_is_a_published_one():
    assert OpenCLIPTokenizer.PATTERN in patterns.KNOWN


@pytest.mark.parametrize(
    ("pattern", "taken"),
    [
        ("|".join(re.escape(p) for p in ["<ctl>", "[INST]", "a b", "x.y", "\t"]), True),  # transformers' user pieces
        (r"<\|im_start\|>|<\|im_end\|>", True),
        ("abc", True),
        (r"a+", False),
        (r"a|b*", False),
        (r"(a)", False),
        (r"[ab]", False),
        (r"a{2}", False),
        (r"a.b", False),
        (r"(?<x>a|a\g<x>)", False),  # recursion: a quantifier without one
        (r"a\g<x>", False),
        (r"(a)\1", False),
        (r"\p{L}", False),
        ("", False),
        ("a||b", False),
    ],
)
def test_literal_strings_are_taken_and_nothing_that_repeats(pattern, taken):
    assert bool(patterns._ALTERNATION.fullmatch(pattern)) is taken


# OpenAI's o200k (transformers' own copy, which it writes into GPT-4o- and Llama 4-style tokenizer.json files) and
# DeepSeek-V3's three Splits (its hub tokenizer.json's, CR and LF written as characters).
O200K = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEEPSEEK_V3 = json.loads(
    r'["\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", "[!\"#$%&'
    r"'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+"
    r'[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]'
)  # the JSON text as the file has it ("\r" there is the character)
HARD = [
    "Hello World's CamelCaseWords don't",
    "tabs\tand\nnewlines\r\n\n\t  mixed / slashes/\n",
    "CJK 日本語の文章、カタカナ 中文字符 한국어",
    "numbers 1234567890 3.14159 -2e10 #include <stdio.h>",
    "café naïve e\u0301 🤗🚀 \u00a0nbsp",
]


@pytest.mark.parametrize("splits", [[O200K], DEEPSEEK_V3], ids=["o200k", "deepseek_v3"])
def test_a_folder_with_o200k_or_deepseek_v3_splits_loads_with_autotokenizers_ids(tmp_path, splits, monkeypatch):
    transformers = pytest.importorskip("transformers")
    from tokenizers import trainers

    assert all(s in patterns.KNOWN for s in splits)
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(s), "isolated") for s in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    hf.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"], initial_alphabet=alphabet)
    hf.train_from_iterator(HARD * 3, trainer)
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    ours, theirs = from_folder(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path)
    stored = json.loads((tmp_path / "tokenizer.json").read_text())["pre_tokenizer"]["pretokenizers"]
    assert [p["pattern"]["Regex"] for p in stored[:-1]] == splits  # the file holds the published text
    for text in HARD:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text
    monkeypatch.setattr(patterns, "KNOWN", patterns.KNOWN - set(splits))  # as before they were published here
    with pytest.raises(InputError, match="holds the regex"):
        from_folder(tmp_path)
