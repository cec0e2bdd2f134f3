"""Chat data: a folder's chat template renders the ids transformers' ``apply_chat_template`` gives, the loss mask
covers exactly the assistant's tokens (transformers' ``{% generation %}`` mask), a template is sandboxed data,
conversations are cut at whole turns, malformed records are named by file and line, and a LoRA SFT fit through
``cli.py`` learns the replies only."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from test_gpt_pretrained import _byte_level, _train, write_model
from tokenizers import processors

from datamodules import ChatDataModule
from zoo.errors import InputError
from zoo.gpt.losses import IGNORE_INDEX
from zoo.io.chat_template import chat_renderer, render
from zoo.io.hf_tokenizer import from_folder
from zoo.io.tokenizers import ByteTokenizer

transformers = pytest.importorskip("transformers")

SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]
CHATML = """{%- for message in messages %}
    {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # Qwen2.5's, without its tools and default system prompt
LLAMA3 = (
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>"
    "\n\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)
LLAMA2_INDENTED = """{% for message in messages %}
    {% if message['role'] == 'user' %}
        {{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}
    {% elif message['role'] == 'system' %}
        {{ '<<SYS>>\n' + message['content'] + '\n<</SYS>>\n\n' }}
    {% else %}
        {{ ' ' + message['content'] + ' ' + eos_token }}
    {% endif %}
{% endfor %}"""  # indented blocks: what trim_blocks and lstrip_blocks take out
# TRL's kind: the reply and its end-of-turn inside {% generation %}, for transformers' assistant mask.
CHATML_GENERATION = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
    "{{ m['content'] + '<|im_end|>\n' }}{% endgeneration %}{% else %}{{ '<|im_start|>' + m['role'] + '\n' + "
    "m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_GENERATION = (
    "{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' }}"
    "{%- if m['role'] == 'assistant' %}{% generation %}{{- m['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{%- else %}{{- m['content'] | trim + '<|eot_id|>' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "The quick brown fox?"},
    {"role": "assistant", "content": "Jumps over the lazy dog. 日本語"},
    {"role": "user", "content": "  And the café?  "},
    {"role": "assistant", "content": "def f(x):\n\treturn x ** 2"},
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("chat_tokenizer"))


def write_tokenizer(folder):
    """A byte-level BPE trained here with Llama 3's and ChatML's control tokens; BOS added by its post-processor
    (which apply_chat_template leaves out)."""
    hf = _train(_byte_level(True), SPECIALS)
    bos = SPECIALS[0]
    hf.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, hf.token_to_id(bos))])
    hf.save(str(folder / "tokenizer.json"))
    return folder


def _with_template(folder, template: str):
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": "<|eot_id|>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": template}))
    return from_folder(folder), transformers.AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("template", [CHATML, LLAMA3, LLAMA2_INDENTED], ids=["chatml", "llama3", "llama2"])
@pytest.mark.parametrize("prompt", [False, True], ids=["whole", "generation_prompt"])
def test_rendered_ids_equal_transformers_apply_chat_template(tokenizer_dir, template, prompt):
    ours, theirs = _with_template(tokenizer_dir, template)
    for messages in (CONVERSATION, CONVERSATION[1:2], CONVERSATION[:3]):
        expected = theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=prompt)["input_ids"]
        assert chat_renderer(ours)(messages, prompt).ids == expected


@pytest.mark.parametrize("template", [CHATML_GENERATION, LLAMA3_GENERATION], ids=["chatml", "llama3"])
def test_the_assistant_mask_is_transformers_generation_block_mask(tokenizer_dir, template):
    ours, theirs = _with_template(tokenizer_dir, template)
    expected = theirs.apply_chat_template(CONVERSATION, return_assistant_tokens_mask=True, return_dict=True)
    rendered = chat_renderer(ours)(CONVERSATION)
    assert rendered.ids == expected["input_ids"]
    assert [int(m) for m in rendered.mask] == expected["assistant_masks"]
    assert sum(rendered.mask) > 10 and len(rendered.turn_ends) == 2


# A generation prompt that ends in a space, which a byte-level BPE merges into the reply's first token (" the").
SPACE_BEFORE_REPLY = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ 'Assistant: ' }}{% generation %}"
    "{{ m['content'] + '<|eot_id|>' }}{% endgeneration %}{% else %}{{ 'User: ' + m['content'] + '\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant: ' }}{% endif %}"
)


def test_a_token_straddling_the_reply_boundary_is_learned_as_the_replys(tokenizer_dir):
    ours, theirs = _with_template(tokenizer_dir, SPACE_BEFORE_REPLY)
    messages = [{"role": "user", "content": "The quick brown fox?"}, {"role": "assistant", "content": "the lazy dog."}]
    rendered = chat_renderer(ours)(messages)
    expected = theirs.apply_chat_template(messages, return_assistant_tokens_mask=True, return_dict=True)
    assert rendered.ids == expected["input_ids"]
    assert [int(m) for m in rendered.mask] == expected["assistant_masks"]
    start = rendered.text.index("the lazy")  # where the reply's text begins
    offsets = ours.hf.encode(rendered.text, add_special_tokens=False).offsets
    k = next(k for k, (_, end) in enumerate(offsets) if end > start)  # the token " the": the prompt's space in it
    assert offsets[k][0] < start and rendered.mask[k] and not rendered.mask[k - 1]


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("{{ ''.__class__.__mro__ }}", "sandbox refuses"),
        ("{{ cycler.__init__.__globals__ }}", "sandbox refuses"),
        ("{{ messages.__class__.__base__.__subclasses__() }}", "sandbox refuses"),
        ("{% set ns = namespace(_x=1) %}", "sandbox refuses"),
        ("{{ messages.append(1) }}", "sandbox refuses"),
        ("{{ 'a' * 10**8 }}", "past its budget"),  # 100 MB, refused before it is allocated
        ("{% include 'tokenizer.json' %}", "no loader"),
        ("{% for m in messages %", "not a Jinja template"),
    ],
)
def test_a_template_that_reaches_outside_its_data_is_refused_in_one_line(template, why):
    with pytest.raises(InputError, match=f"chat_template.*{why}"):
        render(template, CONVERSATION)


LOOP = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"  # 10^10 steps, no output
BOMBS = {
    "nested loops": (LOOP, "steps"),
    "a branching recursion": (
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
        "steps",
    ),
    "a string that doubles": (
        "{% set ns = namespace(x='ab') %}{% for i in range(64) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
        "characters",
    ),
    "a list that doubles": (
        "{% set ns = namespace(x=[1]) %}{% for i in range(64) %}{% set ns.x = ns.x + ns.x %}{% endfor %}",
        "characters",
    ),
    "a wide filter": ("{{ 'a'|center(10**9) }}", "characters"),
    "a replace that multiplies": ("{{ ('a' * 10**6)|replace('a', 'b' * 10**6) }}", "characters"),
    "a wide format": ("{{ '{:0999999999}'.format(1) }}", "7 digits"),
    "a wide % format": ("{{ '%0999999999d'|format(1) }}", "7 digits"),
    "an output without bound": ("{% for i in range(99999) %}{{ 'a' * 10**5 }}{% endfor %}", "characters"),
    # one string written again and again: nothing new is made, the output alone grows
    "an output of one string": (
        "{% set x = 'a' * 10**6 %}{% for i in range(99999) %}{{ x }}{% endfor %}",
        "characters",
    ),
}


@pytest.mark.parametrize("name", BOMBS)
def test_a_template_bomb_is_one_line_within_its_budget(name, monkeypatch):
    from zoo.io import chat_template

    monkeypatch.setattr(chat_template, "TEMPLATE_STEPS", 20_000)  # a real template takes a few thousand
    template, why = BOMBS[name]
    start = time.monotonic()
    with pytest.raises(InputError, match=f"chat_template ran past its budget: .*{why}"):
        render(template, CONVERSATION)
    assert time.monotonic() - start < 2


def test_a_template_bomb_stops_at_its_deadline_even_within_its_steps(monkeypatch):
    from zoo.io import chat_template

    monkeypatch.setattr(chat_template, "TEMPLATE_SECONDS", 0.2)
    # within its steps: an idle machine runs the default 10^6 in under 0.2 s, and the steps would stop it first
    monkeypatch.setattr(chat_template, "TEMPLATE_STEPS", 10**12)
    start = time.monotonic()
    with pytest.raises(InputError, match=r"ran past its budget: more than 0.2 s"):
        render(LOOP, CONVERSATION)
    assert time.monotonic() - start < 1.5


def test_a_long_conversation_renders_within_the_budget(monkeypatch):
    """The budget is not a limit on real use: 200 turns of 2,000 characters through a template that rebuilds its
    text as it grows (the costliest habit real templates have) and loops over its messages twice."""
    from zoo.io import chat_template

    template = (
        "{% set ns = namespace(text='') %}{% for m in messages %}{% set ns.text = ns.text ~ '<|' ~ m['role'] ~ "
        "'|>' ~ m['content'] %}{% endfor %}{{ ns.text }}{% for m in messages %}{{ loop.index }}{% endfor %}"
    )
    turns = [{"role": ("user", "assistant")[i % 2], "content": "x" * 2000} for i in range(200)]
    assert len(chat_template.render(template, turns)) > 400_000


def test_a_template_that_rewrites_earlier_turns_is_one_sequence_per_reply_and_one_that_drops_them_is_refused(
    tokenizer_dir,
):
    from zoo.io.chat_template import chat_examples

    drops_replies = (  # as Qwen3 drops the reasoning of earlier replies: only the last reply is written
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}{{ m['content'] + '<|eot_id|>' }}"
        "{% endif %}{% endfor %}"
    )
    ours, _ = _with_template(tokenizer_dir, drops_replies)
    with pytest.raises(InputError, match="rewrites earlier turns.*one reply at a time"):
        chat_renderer(ours)(CONVERSATION)  # one sequence: what preference data needs
    examples = chat_examples(ours)(CONVERSATION)
    assert [ours.hf.decode([t for t, m in zip(e.ids, e.mask) if m], False) for e in examples] == [
        CONVERSATION[i]["content"] + "<|eot_id|>" for i in (2, 4)
    ]
    only_last = "{% for m in messages %}{% if loop.last %}{{ m['content'] }}{% endif %}{% endfor %}"
    ours, _ = _with_template(tokenizer_dir, only_last)
    with pytest.raises(InputError, match="does not begin with its generation prompt"):
        chat_examples(ours)(CONVERSATION)


def test_the_default_format_masks_each_reply_and_its_eos():
    rendered = chat_renderer(ByteTokenizer())(CONVERSATION)
    text = bytes(i for i, m in zip(rendered.ids, rendered.mask) if m and i < 256).decode()
    assert text == CONVERSATION[2]["content"] + CONVERSATION[4]["content"]
    assert [i for i, m in zip(rendered.ids, rendered.mask) if m and i == 256] == [256, 256]
    assert rendered.turn_ends[-1] == len(rendered.ids) and rendered.ids[-1] == 256


def test_a_folder_without_a_template_and_a_character_tokenizer_are_refused_for_chat(tokenizer_dir):
    from zoo.io.tokenizers import CharTokenizer

    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|eot_id|>"}))
    with pytest.raises(InputError, match="no chat_template"):
        chat_renderer(from_folder(tokenizer_dir))
    with pytest.raises(InputError, match="character tokenizer"):
        chat_renderer(CharTokenizer("abc"))


def test_bytes_chat_data_learns_each_reply_and_its_eos(tmp_path):
    path = _write_jsonl(tmp_path / "c.jsonl", [{"prompt": "2+2?", "completion": "4"}] * 3)
    dm = ChatDataModule(str(path), tokenizer="bytes", val_fraction=0, batch_size=3)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (3, len("<|user|>\n2+2?\n<|assistant|>\n4")) and (y != IGNORE_INDEX).sum() == 3 * 2
    assert y[0, -2:].tolist() == [ord("4"), ByteTokenizer.eos_id]


def _write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _dm(path, tokenizer_dir, **kwargs) -> ChatDataModule:
    dm = ChatDataModule(str(path), tokenizer="pretrained", pretrained_dir=str(tokenizer_dir), **kwargs)
    dm.setup("fit")
    return dm


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat_llama")
    write_model(folder, "llama")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] += "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_targets_are_the_assistant_tokens_only_and_padding_is_ignored(tmp_path, model_dir):
    records = [{"messages": CONVERSATION}, {"prompt": "Hi", "completion": "Hello there"}] * 2
    dm = _dm(_write_jsonl(tmp_path / "c.jsonl", records), model_dir, val_fraction=0.5, block_size=200, batch_size=2)
    x, y = next(iter(dm.val_dataloader()))
    tok = dm.tokenizer
    for b, messages in enumerate([CONVERSATION, [{"role": "user", "content": "Hi"}]]):
        learned = [int(t) for t in y[b] if t != IGNORE_INDEX]
        replies = [m["content"] for m in messages if m["role"] == "assistant"] or ["Hello there"]
        assert tok.decode(learned).replace("<|eot_id|>", "") == "".join(replies)
    assert (x[1, (y[1] == IGNORE_INDEX).nonzero()[-1]] == tok.eos_id).item()  # right padding: pad id, EOS here
    shifted = y[:, :-1] != IGNORE_INDEX
    assert torch.equal(x[:, 1:][shifted], y[:, :-1][shifted])  # targets are the next inputs


def test_long_conversations_keep_whole_turns_or_are_dropped(tmp_path, model_dir):
    long = [{"role": "user", "content": "q " * 5}, {"role": "assistant", "content": "a " * 5}] * 4
    records = [{"messages": long}, {"prompt": "q " * 80, "completion": "a"}, {"prompt": "q", "completion": "a"}]
    whole = chat_renderer(from_folder(model_dir))(long)
    dm = _dm(_write_jsonl(tmp_path / "c.jsonl", records), model_dir, val_fraction=0, block_size=whole.turn_ends[1])
    ids = dm.train_set.items[0][0]
    assert len(ids) == whole.turn_ends[1] and ids.tolist() == whole.ids[: whole.turn_ends[1]]  # two turns of four
    assert len(dm.train_set) == 2 and dm.dropped == 1 and dm.cut == 1  # the long one lost its later replies
    whole_dm = _dm(_write_jsonl(tmp_path / "c.jsonl", records), model_dir, val_fraction=0, block_size=len(whole.ids))
    assert whole_dm.cut == 0 and len(whole_dm.train_set.items[0][0]) == len(whole.ids)


def test_a_conversation_of_block_size_plus_one_tokens_is_kept_whole_and_one_more_is_dropped(tmp_path):
    long = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "the answer"}]
    n = len(chat_renderer(ByteTokenizer())(long).ids)  # one reply: its only whole-turn cut is its end
    path = _write_jsonl(tmp_path / "c.jsonl", [{"messages": long}, {"prompt": "q", "completion": "a"}])
    kept = ChatDataModule(str(path), tokenizer="bytes", block_size=n - 1, val_fraction=0, batch_size=2)
    kept.setup("fit")
    ids, labels = kept.train_set.items[0]
    assert kept.dropped == kept.cut == 0 and len(ids) == n
    assert (labels != IGNORE_INDEX).sum() == len("the answer") + 1  # + EOS
    assert next(iter(kept.train_dataloader()))[0].shape[1] == n - 1  # T = block_size
    dropped = ChatDataModule(str(path), tokenizer="bytes", block_size=n - 2, val_fraction=0, batch_size=2)
    dropped.setup("fit")
    assert dropped.dropped == 1 and len(dropped.train_set) == 1


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}, "role 'tool'"),
        ({"messages": [{"role": "user", "content": "x"}]}, "no assistant turn"),
        ({"messages": [{"role": "user", "content": ["x"]}, {"role": "assistant", "content": "y"}]}, "list content"),
        ({"prompt": "x", "completion": 3}, "not both strings"),
        ("{not json", "Expecting property name"),
    ],
)
def test_a_malformed_record_is_named_by_file_and_line_or_skipped_and_counted(tmp_path, model_dir, record, why):
    good = {"prompt": "q", "completion": "a"}
    path = _write_jsonl(tmp_path / "c.jsonl", [good, good, record, good])
    with pytest.raises(InputError, match=f"c.jsonl:3 .*{why}.*skip_bad_records"):
        _dm(path, model_dir)
    dm = _dm(path, model_dir, skip_bad_records=True, val_fraction=0)
    assert dm.skipped == 1 and len(dm.train_set) == 3


def test_the_validation_loss_is_the_mean_over_assistant_tokens(tmp_path, model_dir):
    from zoo.gpt import from_pretrained

    records = [
        {"messages": CONVERSATION},
        {"prompt": "Hi", "completion": "Hello there"},
        {"prompt": "a", "completion": "b"},
    ]
    dm = _dm(_write_jsonl(tmp_path / "c.jsonl", records), model_dir, val_fraction=0.9, block_size=200, batch_size=2)
    module = from_pretrained(model_dir).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i, (x, y) in enumerate(dm.val_dataloader()):
            module.validation_step((x, y), i)
            logits = module(x)
            for b in range(len(x)):
                for t in (y[b] != IGNORE_INDEX).nonzero().flatten().tolist():
                    total += torch.nn.functional.cross_entropy(logits[b, t], y[b, t]).item()
                    count += 1
    assert count == sum(int((labels[1:] != IGNORE_INDEX).sum()) for _, labels in dm.val_set.items)
    assert module.val_loss.compute().item() == pytest.approx(total / count, rel=1e-5)


@pytest.mark.slow  # ~8 s beyond the cli's imports: the LoRA cli.py fit of a folder (test_gpt_lora) is slow too
def test_a_lora_sft_fit_through_the_cli_learns_the_replies_only(tmp_path, model_dir):
    from conftest import fit_in_folder

    pytest.importorskip("peft")
    records = [{"messages": CONVERSATION}, {"prompt": "Hi", "completion": "Hello there"}] * 4
    path = _write_jsonl(tmp_path / "chat.jsonl", records)
    model = {"net": {"class_path": "zoo.gpt.GPT"}, "init_weights": str(model_dir), "adapt": {"lora": {"r": 4}}}
    data = {"path": str(path), "pretrained_dir": str(model_dir), "block_size": 48, "batch_size": 2}
    config = {
        "model": {"class_path": "zoo.gpt.CausalLMModule", "init_args": model},
        "data": {"class_path": "datamodules.ChatDataModule", "init_args": data | {"val_fraction": 0.25}},
        "trainer": {"max_steps": 2, "enable_progress_bar": False, "callbacks": []},
    }
    (tmp_path / "sft.yaml").write_text(json.dumps(config))
    fitted = fit_in_folder(tmp_path, "--config", str(tmp_path / "sft.yaml"))
    trained = {n for n, p in fitted.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    _, y = next(iter(fitted.trainer.datamodule.train_dataloader()))
    learned = np.unique(y[y != IGNORE_INDEX].numpy())
    prompt_only = set(fitted.model.tokenizer.hf.encode("The quick brown fox?", add_special_tokens=False).ids)
    assert 0 < (y != IGNORE_INDEX).sum() < y.numel() / 2 and not prompt_only <= set(learned.tolist())
    assert torch.isfinite(fitted.trainer.callback_metrics["val/loss"])
