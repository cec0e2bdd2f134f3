"""Templates that rewrite earlier turns (Qwen3 keeps the reasoning of the replies after the last user turn only;
DeepSeek-V3's drops every reply's reasoning and opens the next with ``<think>\\n``): a prompt renders the ids
transformers' ``apply_chat_template(..., add_generation_prompt=True)`` gives, through the module and the served
model too; training is one sequence per reply with TRL's prompt-completion mask, or, with TRL's own training
template in the folder, one sequence with TRL's ``{% generation %}`` mask; a template whose generation prompt does
not begin its reply is refused for training in one line naming the alternative."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_gpt_pretrained import _byte_level

from datamodules import ChatDataModule
from datamodules.text import IGNORE_INDEX
from zoo.errors import InputError
from zoo.io.chat_template import chat_examples, chat_renderer
from zoo.io.hf_tokenizer import from_folder

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")  # its copies of the published templates, byte-identical to the hub's

TEMPLATES = Path(trl.__file__).parent / "chat_templates"
QWEN3 = {
    "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"],
    "config": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None},
    "template": "qwen3.jinja",
}
DEEPSEEK_V3 = {
    "specials": ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
    + ["<think>", "</think>"],
    "config": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "template": "deepseekv3.jinja",  # the R1-style one: its generation prompt ends with <think>\n
}
THOUGHT = "<think>\nSum the digits: 2 and 2.\n</think>\n\n"
TURNS = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4, of course."},
    {"role": "user", "content": "And  3+3?  日本"},
    {"role": "assistant", "content": "6."},
    {"role": "user", "content": "Thanks!"},
    {"role": "assistant", "content": "You're welcome."},
]


def thinking(messages: list[dict]) -> list[dict]:
    """The same turns with a reasoning block before each reply."""
    return [m | {"content": THOUGHT + m["content"]} if m["role"] == "assistant" else m for m in messages]


def write_folder(folder: Path, kind: dict, template: str | None = None) -> Path:
    from test_gpt_pretrained import _train

    hf = _train(_byte_level(True), kind["specials"], 420)
    folder.mkdir(parents=True, exist_ok=True)
    hf.save(str(folder / "tokenizer.json"))
    template = template or (TEMPLATES / kind["template"]).read_text()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **kind["config"], "chat_template": template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module", params=[QWEN3, DEEPSEEK_V3], ids=["qwen3", "deepseek_v3"])
def folder(request, tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp(request.param["template"].split(".")[0]), request.param)


PROMPTS = {  # 1-, 2- and 3-turn conversations ending in a user turn
    "1-turn": TURNS[:2],
    "2-turn": TURNS[:4],
    "3-turn": TURNS[:6],
    "3-turn-no-system": TURNS[1:6],
}


@pytest.mark.parametrize("think", [False, True], ids=["plain", "think"])
@pytest.mark.parametrize("turns", PROMPTS)
def test_a_prompt_renders_transformers_ids_whatever_the_template_does_to_earlier_turns(folder, turns, think):
    messages = thinking(PROMPTS[turns]) if think else PROMPTS[turns]
    ours, theirs = from_folder(folder), transformers.AutoTokenizer.from_pretrained(folder)
    expected = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert chat_renderer(ours)(messages, True).ids == expected


def trl_completion_mask(theirs, prompt: list[dict], completion: list[dict], **kwargs) -> tuple[list[int], list[int]]:
    """TRL's SFT on a conversational prompt-completion record (``sft_trainer.tokenize_fn``): the pair's ids, and
    its completion mask from where the prompt's ids and the pair's part (``common_prefix_length``)."""
    from trl.data_utils import common_prefix_length

    prompt_ids = theirs.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, **kwargs)["input_ids"]
    ids = theirs.apply_chat_template(prompt + completion, tokenize=True, **kwargs)["input_ids"]
    start = common_prefix_length(prompt_ids, ids)
    return ids, [0] * start + [1] * (len(ids) - start)


@pytest.mark.parametrize("think", [False, True], ids=["plain", "think"])
def test_a_qwen3_three_turn_conversation_trains_one_sequence_per_reply_with_trls_mask(tmp_path, think):
    """Each reply after the very prompt Qwen3 renders for it at inference (earlier reasoning dropped): the ids of
    ``apply_chat_template(messages[:i+1])`` and TRL's completion mask for prompt ``messages[:i]``."""
    folder = write_folder(tmp_path, QWEN3)
    ours, theirs = from_folder(folder), transformers.AutoTokenizer.from_pretrained(folder)
    messages = thinking(TURNS) if think else TURNS
    examples = chat_examples(ours)(messages)
    replies = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(examples) == len(replies) == 3
    for example, i in zip(examples, replies, strict=True):
        ids, mask = trl_completion_mask(theirs, messages[:i], messages[i : i + 1])
        assert example.ids == ids and [int(m) for m in example.mask] == mask
        assert example.turn_ends == [len(ids)]
        learned = theirs.decode([t for t, m in zip(ids, mask, strict=True) if m])
        assert learned.startswith(THOUGHT if think else "<think>\n\n</think>\n\n") and "<|im_end|>" in learned


@pytest.mark.parametrize("think", [False, True], ids=["plain", "think"])
def test_with_trls_qwen3_training_template_the_conversation_is_one_sequence_with_trls_mask(tmp_path, think):
    """TRL's own way (``assistant_only_loss``): its training template, which keeps every reply's reasoning block,
    in the folder; the zoo renders one sequence and its mask is transformers' ``{% generation %}`` mask."""
    from trl.chat_template_utils import get_training_chat_template

    qwen3 = transformers.AutoTokenizer.from_pretrained(write_folder(tmp_path / "qwen3", QWEN3))
    training = get_training_chat_template(qwen3)
    folder = write_folder(tmp_path / "training", QWEN3, training)
    ours, theirs = from_folder(folder), transformers.AutoTokenizer.from_pretrained(folder)
    messages = thinking(TURNS) if think else TURNS
    (example,) = chat_examples(ours)(messages)
    expected = theirs.apply_chat_template(messages, return_assistant_tokens_mask=True, return_dict=True)
    assert example.ids == expected["input_ids"] and [int(m) for m in example.mask] == expected["assistant_masks"]
    assert len(example.turn_ends) == 3


def test_a_template_whose_prompt_opens_the_reply_is_refused_for_training_naming_trls_template(tmp_path):
    folder = write_folder(tmp_path / "v3", DEEPSEEK_V3)
    with pytest.raises(InputError, match=r"<think>.*deepseek_r1_distill_training.jinja") as err:
        chat_examples(from_folder(folder))(TURNS[1:3])
    assert "\n" not in str(err.value)
    distill = (TEMPLATES / "deepseek_r1_distill_training.jinja").read_text()
    ours = from_folder(write_folder(tmp_path / "distill", DEEPSEEK_V3, distill))
    (example,) = chat_examples(ours)(thinking(TURNS[1:5]))  # the named alternative trains reasoning replies
    learned = ours.hf.decode([t for t, m in zip(example.ids, example.mask, strict=True) if m], False)
    eos = DEEPSEEK_V3["config"]["eos_token"]
    assert learned == "".join(THOUGHT.removeprefix("<think>\n") + m["content"] + eos for m in TURNS[2:5:2])


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory):
    """A tiny random Qwen3 saved by transformers with the tokenizer and Qwen3's template above."""
    import torch
    from test_gpt_pretrained import _llama_like, _perturb

    folder = write_folder(tmp_path_factory.mktemp("qwen3_model"), QWEN3)
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    config = _llama_like(len(vocab), head_dim=24, max_position_embeddings=256)
    torch.manual_seed(0)
    _perturb(transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config))).save_pretrained(folder)
    return folder


def test_the_datamodule_learns_each_reply_once_after_its_own_prompt(tmp_path, qwen3_model):
    folder = qwen3_model
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": thinking(TURNS)}) + "\n" + json.dumps({"messages": TURNS[1:3]}) + "\n")
    dm = ChatDataModule(str(path), pretrained_dir=str(folder), val_fraction=0, block_size=512, batch_size=4)
    dm.setup("fit")
    assert len(dm.train_set) == 4 and dm.per_turn == 1  # three sequences for the three replies, one for the pair
    tok = dm.tokenizer
    learned = [tok.hf.decode([int(t) for t in labels if t != IGNORE_INDEX], False) for _, labels in dm.train_set.items]
    assert [text.removeprefix(THOUGHT) for text in learned[:3]] == [
        m["content"] + "<|im_end|>\n" for m in TURNS if m["role"] == "assistant"
    ]


def test_a_three_turn_qwen3_conversation_is_answered_after_transformers_prompt(qwen3_model):
    """``chat_prompt`` (what the served pyfunc renders each row's messages with): transformers' ids, earlier
    reasoning dropped, and the greedy reply ``generate()``'s."""
    import torch

    from zoo.gpt import from_pretrained

    module = from_pretrained(qwen3_model).eval()
    theirs = transformers.AutoTokenizer.from_pretrained(qwen3_model)
    chat = thinking(PROMPTS["3-turn"])
    expected = theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert module.chat_prompt(chat).tolist() == expected
    model = transformers.AutoModelForCausalLM.from_pretrained(qwen3_model)
    new = model.generate(torch.tensor([expected]), do_sample=False, max_new_tokens=5)[0, len(expected) :]
    (ours,) = module.generate([module.chat_prompt(chat)], max_new_tokens=5, temperature=0)
    assert ours.tolist() == new.tolist()[: len(ours)] and len(ours) > 0


@pytest.mark.slow  # a cli.py fit and an MLflow pyfunc load: ~10 s beyond the imports (the LoRA SFT fit is slow too)
def test_a_qwen3_three_turn_conversation_trains_through_the_cli_and_serves(tmp_path, qwen3_model):
    """The issue's done-when: a tiny Qwen3 folder fine-tuned through ``cli.py`` on a three-turn conversation (one
    sequence per reply), then its logged model answers that conversation after transformers' prompt."""
    import mlflow
    from conftest import fit_in_folder

    records = [{"messages": thinking(TURNS)}, {"messages": TURNS}] * 2
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    model = {"net": {"class_path": "zoo.gpt.GPT"}, "init_weights": str(qwen3_model)}
    data = {"path": str(path), "pretrained_dir": str(qwen3_model), "block_size": 256, "batch_size": 3}
    config = {
        "model": {"class_path": "zoo.gpt.CausalLMModule", "init_args": model},
        "data": {"class_path": "datamodules.ChatDataModule", "init_args": data | {"val_fraction": 0.5}},
        "trainer": {"max_steps": 2, "enable_progress_bar": False, "callbacks": []},
    }
    (tmp_path / "sft.yaml").write_text(json.dumps(config))
    fitted = fit_in_folder(tmp_path, "--config", str(tmp_path / "sft.yaml"))
    dm = fitted.trainer.datamodule
    assert (len(dm.train_set), len(dm.val_set), dm.per_turn) == (6, 6, 4)
    served = mlflow.pyfunc.load_model(f"runs:/{fitted.trainer.logger.run_id}/model")
    chat = thinking(PROMPTS["3-turn"])
    out = served.predict({"messages": chat}, params={"temperature": 0.0, "max_new_tokens": 4})
    theirs = transformers.AutoTokenizer.from_pretrained(qwen3_model)
    expected = theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert fitted.model.chat_prompt(chat).tolist() == expected
    (reply,) = fitted.model.generate([fitted.model.chat_prompt(chat)], max_new_tokens=4, temperature=0)
    assert list(out["completion"]) == [fitted.model.tokenizer.decode(reply.tolist())]


def test_a_preference_pair_after_earlier_turns_learns_its_reply_after_the_prompt_qwen3_renders(tmp_path, qwen3_model):
    """DPO on a Qwen3 conversation (the prompt holds an earlier reply): each side is ``apply_chat_template(prompt +
    [reply])``, learned from where TRL's DPO parts the prompt's ids from the pair's."""
    from datamodules import PreferenceDataModule

    prompt = thinking(TURNS[:4])
    chosen, rejected = [TURNS[4]], [{"role": "assistant", "content": THOUGHT + "7."}]
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}) + "\n")
    dm = PreferenceDataModule(str(path), pretrained_dir=str(qwen3_model), val_fraction=0, block_size=512)
    dm.setup("fit")
    theirs = transformers.AutoTokenizer.from_pretrained(qwen3_model)
    for (ids, labels), completion in zip(dm.train_set.items[0], (chosen, rejected), strict=True):
        expected, mask = trl_completion_mask(theirs, prompt, completion)
        assert ids.tolist() == expected
        assert labels.tolist() == [t if m else IGNORE_INDEX for t, m in zip(expected, mask, strict=True)]
    two = [TURNS[2], TURNS[4]]  # a completion of two replies in a row
    path.write_text(json.dumps({"prompt": prompt[:2], "chosen": two, "rejected": [TURNS[2], *rejected]}))
    with pytest.raises(InputError, match="pairs.jsonl:1 cannot be rendered: "):  # the first reply rewritten
        PreferenceDataModule(str(path), pretrained_dir=str(qwen3_model), val_fraction=0, block_size=512).setup("fit")
