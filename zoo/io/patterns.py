"""The regexes a stored tokenizer may run: a ``tokenizer.json`` (a folder's, or a checkpoint's) is a pipeline whose
normalizer, pre-tokenizer and decoder may hold patterns (``Split``, ``Replace``), which the ``tokenizers`` library
runs natively (Oniguruma, in Rust, holding the GIL): nothing in the process can interrupt one, so a pattern that
backtracks without end on some text (``(a+)+$``) hangs whatever encodes that text, a server's request included.

A deadline cannot be given to such a run, and a test on probe strings proves nothing about the next text, so the
rule is on the pattern itself, read back from what ``tokenizers`` built (its own serialization, so the rule and the
engine read the same pattern):
  - one of the patterns published tokenizers use (``KNOWN``: GPT-2's, Llama 3's, Qwen's, OpenAI's o200k,
    DeepSeek-V3's, CLIP's pre-tokenizer splits and transformers' whitespace normalizers), taken whole;
  - or an alternation of literal strings (no quantifier, class, group or lettered escape: what transformers writes to
    split out a SentencePiece model's user-defined pieces), which matches in time linear in the text;
  - else refused in one line naming the pattern. ``ZOO_TRUST_TOKENIZER_REGEX=1`` takes any pattern, for a tokenizer
    the user made; a hang is then ended by Ctrl-C or SIGTERM through ``zoo.watchdog`` (a command's only bound).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from zoo.errors import InputError

TRUST_ENV = "ZOO_TRUST_TOKENIZER_REGEX"
KNOWN = frozenset(
    {
        # GPT-2's (tiktoken r50k), as a Split
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
        # Llama 3's (tiktoken cl100k)
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
        # Qwen2's and Qwen3.5's (transformers' tokenization_qwen2.py, tokenization_qwen3_5.py)
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
        # OpenAI's o200k (GPT-4o; Phi-4-mini's, Llama 4's tokenizer.json: transformers' gguf_tokenizer_mapping.py)
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
        r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
        r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        # DeepSeek-V3's three Splits in sequence (its tokenizer.json: digits, CJK runs, the rest), the third with CR
        # and LF written as the characters themselves, as that file has them
        r"\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
        # OpenAI CLIP's (open_clip's SimpleTokenizer; zoo.io.tokenizers.OpenCLIPTokenizer)
        r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
        # transformers' normalizers (convert_slow_tokenizer.py and the models' tokenization files)
        r" {2,}",
        r"\s+",
        r"\s{2,}|[\n\r\t]",
        r"[\n\r\t]",
        r"\A +| +\z",
        r"\A▁",
        r" +▁",
        r"^▁+$",
        r"\n",
    }
)
# A literal string: characters other than the regex syntax, or a backslash before a character that is no letter or
# digit (re.escape's form: ``\.``, ``\ ``), never a lettered escape (``\g<name>`` recurses, ``\1`` refers back).
_LITERAL = r"(?:[^\\*+?{}()\[\]|.^$]|\\[^0-9A-Za-z])+"
_ALTERNATION = re.compile(rf"{_LITERAL}(?:\|{_LITERAL})*")


def check_patterns(tokenizer: Any, source: str) -> None:
    """Refuses, in one line naming ``source``, a ``tokenizers`` pipeline holding a regex outside the rule above."""
    if os.environ.get(TRUST_ENV) == "1":
        return
    for part in (tokenizer.normalizer, tokenizer.pre_tokenizer, tokenizer.decoder, tokenizer.post_processor):
        for pattern in _regexes(json.loads(part.__getstate__()) if part is not None else None):
            if pattern not in KNOWN and not _ALTERNATION.fullmatch(pattern):
                raise InputError(
                    f"{source} holds the regex {pattern[:200]!r}, which is neither one published tokenizers use nor "
                    f"literal strings: the tokenizers library runs it natively, where no deadline reaches (one that "
                    f"backtracks hangs on some text); for a tokenizer you made, {TRUST_ENV}=1 takes it"
                )


def _regexes(node: Any) -> list[str]:
    """Every ``{"Regex": pattern}`` in a component's JSON (how tokenizers writes a Split's or a Replace's)."""
    if isinstance(node, dict):
        found = [node["Regex"]] if isinstance(node.get("Regex"), str) else []
        return found + [p for value in node.values() for p in _regexes(value)]
    if isinstance(node, list):
        return [p for value in node for p in _regexes(value)]
    return []
