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
