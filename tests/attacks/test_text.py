"""Text that is code: Jinja chat templates that reach for Python's internals or loop without end, regexes that
backtrack without end (a tokenizer.json ``Split``, an answer rule), and tokenizer files whose sizes are bombs. Each row
is one payload, replayed through every loader it reaches; ``harness`` says what must hold."""

from __future__ import annotations

import json
import shutil

import pytest
from builders import python, tiny_gpt2_folder
from harness import HANG, Payload, cases, replay, warm_up

# CVE-2024-34359 ("Llama Drama"): llama-cpp-python rendered a GGUF's chat_template in an unsandboxed jinja2 -> RCE.
SSTI = "CVE-2024-34359 (chat_template SSTI)"
MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
EOS = "<|endoftext|>"


@pytest.fixture(scope="module", autouse=True)
def _warm():
    warm_up()
    import jinja2.sandbox  # noqa: F401
    from sentencepiece import sentencepiece_model_pb2  # noqa: F401


def folder_with(config: dict | None = None, tokenizer=None, files: dict | None = None):
    """The tiny GPT-2 folder with ``config`` as its tokenizer_config.json, ``tokenizer(json) -> json`` applied to its
    tokenizer.json, ``files`` written beside (``OUTSIDE`` and ``MARKER_CODE`` filled in)."""

    def make(folder, outside):
        out = folder / "gpt2"
        shutil.copytree(tiny_gpt2_folder("a b c d e hi hello", 270), out)
        text = json.dumps({"eos_token": EOS, **(config or {})})
        text = text.replace("OUTSIDE", str(outside)).replace("MARKER_CODE", python(outside).replace('"', '\\"'))
        (out / "tokenizer_config.json").write_text(text)
        if tokenizer is not None:
            (out / "tokenizer.json").write_text(json.dumps(tokenizer(json.loads((out / "tokenizer.json").read_text()))))
        for name, content in (files or {}).items():
            (out / name).write_bytes(content if isinstance(content, bytes) else content.encode())
        return out

    return make


def template(source: str):
    return folder_with({"chat_template": source})


# -- loaders ------------------------------------------------------------------------------------------------------


def _render(p):
    from zoo.io.chat_template import render

    source = json.loads((p / "tokenizer_config.json").read_text())["chat_template"]
    return render(source, MESSAGES, True, eos_token=EOS)


def _folder_chat(p):
    from zoo.io.chat_template import chat_renderer
    from zoo.io.hf_tokenizer import from_folder

    return chat_renderer(from_folder(p))(MESSAGES, True).text


def _checkpoint_chat(p):
    """The template as a checkpoint carries it (its tokenizer's dict), rendered for a chat: what serving does."""
    from zoo.io.chat_template import chat_renderer
    from zoo.io.tokenizers import tokenizer_from_dict

    config = json.loads((p / "tokenizer_config.json").read_text())
    d = {"kind": "hf", "json": (p / "tokenizer.json").read_text(), "special": {"eos": EOS}}
    return chat_renderer(tokenizer_from_dict({**d, "chat_template": config.get("chat_template")}))(MESSAGES, True).text


def _module_chat(p):
    from zoo.gpt import from_pretrained

    return from_pretrained(p).chat_prompt(MESSAGES[:1]).tolist()


TEXT = ("a" * 21 + "!") * 60  # what a catastrophic pattern backtracks on, chunk by chunk


def _folder_encode(p):
    from zoo.io.hf_tokenizer import from_folder

    return len(from_folder(p).encode(TEXT))


def _checkpoint_encode(p):
    from zoo.io.tokenizers import tokenizer_from_dict

    d = {"kind": "hf", "json": (p / "tokenizer.json").read_text(), "special": {"eos": EOS}}
    return len(tokenizer_from_dict(d).encode(TEXT))


def _folder_tokenizer(p):
    from zoo.io.hf_tokenizer import from_folder

    return from_folder(p).vocab_size


def _answer(fn: str):
    def load(p):
        from zoo.gpt import tasks

        pattern = (p / "answer_pattern.txt").read_text()
        tasks.check_pattern(pattern)
        return getattr(tasks, fn)(TEXT, pattern)

    return load


def zeroshot_templates(*templates: str):
    """A file of zero-shot settings (class names, templates), as a checkpoint's inputs or a request carries them."""

    def make(folder, outside):
        path = folder / "zeroshot.json"
        path.write_text(json.dumps({"class_names": ["cat"], "templates": list(templates)}))
        return path

    return make


def _clip_zeroshot(p):
    """A tiny CLIP module's zero-shot prediction with the file's class names and templates (the prompts built)."""
    import torch

    from zoo.clip import CLIP
    from zoo.clip.module import ContrastiveModule
    from zoo.clip.towers import TextTransformer, VisionTransformer

    small = {"width": 8, "layers": 1, "heads": 1, "embed_dim": 8}
    net = CLIP(VisionTransformer(image_size=8, patch_size=4, **small), TextTransformer(16, 8, **small))
    batch = {"mode": "zeroshot", "index": torch.arange(1), "image": torch.zeros(1, 3, 8, 8)}
    return ContrastiveModule(net).predict_step({**batch, **json.loads(p.read_text())}, 0)


LOADERS = {
    "clip_zeroshot": _clip_zeroshot,
    "render": _render,
    "folder_chat": _folder_chat,
    "checkpoint_chat": _checkpoint_chat,
    "module_chat": _module_chat,
    "folder_encode": _folder_encode,
    "checkpoint_encode": _checkpoint_encode,
    "folder_tokenizer": _folder_tokenizer,
    "read_answer": _answer("read_answer"),
    "extract_answer": _answer("extract_answer"),
}
CHAT = ("render", "folder_chat", "checkpoint_chat")
ANSWER = ("read_answer", "extract_answer")


# -- tokenizer files --------------------------------------------------------------------------------------------


def split_pattern(pattern: str):
    """tokenizer.json's pre-tokenizer a Split on ``pattern`` (tokenizers runs it with Oniguruma, backtracking)."""

    def edit(tok: dict) -> dict:
        split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
        tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, tok["pre_tokenizer"]]}
        return tok

    return folder_with(tokenizer=edit)


def replace_pattern(pattern: str):
    def edit(tok: dict) -> dict:
        tok["normalizer"] = {"type": "Replace", "pattern": {"Regex": pattern}, "content": "x"}
        return tok

    return folder_with(tokenizer=edit)


def sentencepiece(pieces: list[str]):
    """A Llama-2-style folder whose tokenizer.model is a BPE SentencePiece model of ``pieces`` (byte fallback)."""

    def make(folder, outside):
        from sentencepiece import sentencepiece_model_pb2 as pb

        proto = pb.ModelProto()
        proto.trainer_spec.model_type = 2
        proto.trainer_spec.byte_fallback = True
        proto.normalizer_spec.remove_extra_whitespaces = False
        for piece, kind in [("<unk>", 2), ("<s>", 3), ("</s>", 3)]:
            proto.pieces.add(piece=piece, score=0, type=kind)
        for b in range(256):
            proto.pieces.add(piece=f"<0x{b:02X}>", score=0, type=6)
        for i, piece in enumerate(pieces):
            proto.pieces.add(piece=piece, score=-i, type=1)
        out = folder / "llama"
        out.mkdir()
        (out / "tokenizer.model").write_bytes(proto.SerializeToString())
        (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
        return out

    return make


# Every run of one letter up to the piece bound: 26 x 512 pieces, 3.4 million merges (quadratic in a piece's length).
MERGE_BOMB = [c * n for c in "abcdefghijklmnopqrstuvwxyz" for n in range(1, 513)]
REDOS = "ReDoS in tokenizers' patterns (transformers CVE-2024-12720, CVE-2025-1194 class)"

# fmt: off
PAYLOADS = [
    Payload("ssti-mro-subclasses", SSTI + ": ''.__class__.__mro__", template("{{ ''.__class__.__mro__[1].__subclasses__() }}"), CHAT, refuse=False),
    Payload("ssti-cycler-globals", SSTI + ": cycler.__init__.__globals__", template("{{ cycler.__init__.__globals__.os.popen('MARKER_CODE').read() }}"), (*CHAT, "module_chat"), refuse=False),
    Payload("ssti-lipsum-globals", SSTI + ": lipsum.__globals__", template("{{ lipsum.__globals__['os'].system('touch OUTSIDE/MARKER') }}"), CHAT, refuse=False),
    Payload("ssti-joiner-globals", SSTI + ": joiner.__init__.__globals__", template("{{ joiner.__init__.__globals__['__builtins__']['exec']('MARKER_CODE') }}"), CHAT, refuse=False),
    Payload("ssti-namespace-globals", SSTI + ": namespace.__init__.__globals__", template("{{ namespace.__init__.__globals__['os'].system('touch OUTSIDE/MARKER') }}"), CHAT, refuse=False),
    Payload("ssti-attr-filter-escapes", SSTI + ": |attr with \\x5f escapes", template("{{ ''|attr('\\x5f\\x5fclass\\x5f\\x5f')|attr('\\x5f\\x5fbase\\x5f\\x5f') }}"), CHAT, refuse=False),
    Payload("ssti-format-string", SSTI + ": str.format reaching attributes", template("{{ '{0.__class__.__base__.__subclasses__}'.format('') }}"), CHAT),
    Payload("ssti-self-context", SSTI + ": self._TemplateReference__context", template("{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch OUTSIDE/MARKER') }}"), CHAT, refuse=False),
    Payload("ssti-helper-globals", SSTI + ": the environment's own helpers (raise_exception.__globals__)", template("{{ raise_exception.__globals__['os'].system('touch OUTSIDE/MARKER') }}"), CHAT, refuse=False),
    Payload("ssti-namespace-dunder", "transformers TemplateNamespace: _-names stored on a namespace", template("{% set ns = namespace(__class__=1) %}{{ ns }}"), CHAT),
    Payload("ssti-mutate-messages", "jinja2 ImmutableSandboxedEnvironment: list.append on the input", template("{{ messages.append({'role': 'system', 'content': 'x'}) }}"), CHAT),
    Payload("ssti-include-file", "jinja2 include/import of a file by path", template("{% include '/etc/passwd' %}"), CHAT),
    Payload("ssti-dict-type", "transformers TemplateDict: the dict type itself", template("{{ dict.__class__.__subclasses__() }}"), CHAT, refuse=False),
    Payload("template-macro-recursion", "recursion bombs (CWE-674) in a template", template("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), CHAT),
    Payload("template-repeat-bomb", "allocation bombs: 'a' * 10**12", template("{{ 'a' * 10**12 }}"), CHAT),
    Payload("template-power-bomb", "allocation bombs: 2 ** 99999999", template("{{ 2 ** 99999999 }}"), CHAT),
    Payload("template-doubling-bomb", "allocation bombs: a string doubled 40 times", template("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}"), ("render",), isolate=True, deadline=HANG),
    Payload("template-loop-bomb", "issue 52: a chat template in the serving path (nested ranges, 1e10 steps)", template("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"), ("module_chat",), isolate=True, deadline=HANG),
    Payload("template-huge", "a template past the size read", template("{{ 'x' }}" * 30_000), CHAT),
    Payload("template-not-a-string", "a named list of templates (transformers' multi-template form)", folder_with({"chat_template": [{"name": "default", "template": "{{ cycler.__init__.__globals__ }}"}]}), CHAT[1:]),
    Payload("chat-template-jinja-file", SSTI + ": chat_template.jinja beside the config", folder_with(files={"chat_template.jinja": "{{ cycler.__init__.__globals__.os.system('touch OUTSIDE/MARKER') }}"}), ("folder_chat", "module_chat"), refuse=False),
    Payload("clip-template-width-bomb", "str.format width bombs in a stored zero-shot template", zeroshot_templates("a {0:>999999999}"), ("clip_zeroshot",), named=("{0:>999999999}",)),
    Payload("clip-template-attribute", "str.format attribute access (Python format-string injection)", zeroshot_templates("{0.__class__.__mro__}"), ("clip_zeroshot",), named=("{0.__class__.__mro__}",)),
    # regexes that backtrack without end
    Payload("redos-tokenizer-split", REDOS, split_pattern("(a+)+$"), ("folder_encode",), isolate=True, deadline=HANG),
    Payload("redos-tokenizer-replace", REDOS + ": a normalizer's Replace", replace_pattern("(a|aa)+$"), ("folder_encode",), isolate=True, deadline=HANG),
    Payload("redos-answer-pattern", "issue 52: answer_pattern ReDoS (CWE-1333)", folder_with(files={"answer_pattern.txt": "(a+)+$"}), ("read_answer",), named=("answer rule",), isolate=True),
    Payload("answer-pattern-too-long", "issue 52: answer_pattern size", folder_with(files={"answer_pattern.txt": "(a)" + "b" * 5000}), ANSWER),
    # tokenizer bombs
    Payload("sp-merges-3.4m", "issue 52: a SentencePiece model with millions of merges", sentencepiece(MERGE_BOMB), ("folder_tokenizer",), isolate=True, deadline=HANG),
    Payload("sp-piece-too-long", "tokenizer bombs: a piece past the bound (quadratic merges)", sentencepiece(["a" * 600]), ("folder_tokenizer",)),
]
# fmt: on


@pytest.mark.parametrize(("payload", "loader"), cases(PAYLOADS, LOADERS))
def test_text_that_is_code_runs_nothing_and_ends_in_one_line(payload, loader, tmp_path):
    replay(payload, LOADERS[loader], tmp_path)
