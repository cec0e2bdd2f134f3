"""bench/grpo_race.py's parts: TRL's tokenizer is the zoo's bytes with its stop token as EOS, TRL's reward is the
zoo's rule, and both arms wired end to end for a few steps from one exported tiny Llama-shaped GPT."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("grpo_race", ROOT / "bench" / "grpo_race.py")
grpo_race = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grpo_race)


def test_trls_tokenizer_is_the_zoos_bytes_and_stops_at_its_eos():
    from zoo.io.tokenizers import ByteTokenizer

    tok, ours = grpo_race.zoo_bytes(), ByteTokenizer()
    text = "<|user|>\nWhat is 3+4-1?\n<|assistant|>\n"
    assert tok(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert tok.eos_token_id == tok.pad_token_id == ours.eos_id and ours.stop_ids == (tok.eos_token_id,)
    assert tok.bos_token_id is None and tok.decode([*ours.encode("#### 6"), 256], skip_special_tokens=True) == "#### 6"
    worked = "3+4 = 7\n7-1 = 6\n#### 6"
    assert grpo_race.exact_match(["p"] * 3, ["#### 6", "it is 6", "#### 7"], [worked] * 3) == [1.0, 1.0, 0.0]


def _checkpoint(net, size: dict, path) -> str:
    """A checkpoint of ``net`` as cli.py writes one: its net's config among the hyperparameters."""
    import torch
    from lightning.pytorch import Trainer

    from zoo.gpt import CausalLMModule

    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(CausalLMModule(net))
    trainer.save_checkpoint(path, weights_only=True)
    ckpt = torch.load(path, weights_only=True)
    ckpt["hyper_parameters"]["net"] = {"class_path": "zoo.gpt.GPT", "init_args": {"vocab_size": 257, **size}}
    torch.save(ckpt, path)
    return str(path)


@pytest.mark.slow  # TRL's import and trainer, a cli.py fit: tens of seconds each
@pytest.mark.parametrize("shape", ["llama", "gpt2"])
def test_both_arms_run_from_the_same_exported_weights(tmp_path, shape):
    pytest.importorskip("trl")
    import torch

    from zoo.gpt import GPT, RMSNorm, SwiGLU
    from zoo.gpt.formats.hf import save_safetensors

    torch.manual_seed(0)
    size = dict(block_size=64, n_layer=1, n_embd=32, n_head=2)
    if shape == "llama":  # a safetensors file and its shape
        net = GPT(vocab_size=257, position="rope", norm=RMSNorm, mlp=SwiGLU, bias=False, **size)
        init = str(save_safetensors(net, tmp_path / "net.safetensors"))
    else:  # a checkpoint of chat_arithmetic.yaml's kind of net
        net = GPT(vocab_size=257, **size)
        init = _checkpoint(net, size, tmp_path / "sft.ckpt")
    model = grpo_race.export_start(init, tmp_path / "model", size)
    for k, v in grpo_race.zoo_net(str(model))[0].state_dict().items():  # the folder holds the given weights
        torch.testing.assert_close(v, net.state_dict()[k], rtol=0, atol=0, msg=k)
    task = grpo_race.TASK | {"train": 16, "test": 8}
    settings = grpo_race.SETTINGS | {"group_size": 2, "lr": 1e-3, "max_new_tokens": 8, "batch_prompts": 2}
    job = dict(model=str(model), task=str(tmp_path / "task"), task_settings=task, work=str(tmp_path), seed=0,
               settings=settings, target=2.0, max_steps=2, eval_every=1, clock="cpu", threads=1)  # fmt: skip
    grpo_race.prompts(tmp_path / "task", task)
    trl, zoo = grpo_race.trl_run(job | {"arm": "trl"}), grpo_race.zoo_run(job | {"arm": "zoo"})
    generation = {"eos_token_id": [256], "pad_token_id": 256, "do_sample": True, "temperature": 1.0, "top_p": 1.0}
    assert trl["generation"] == generation | {"top_k": 0, "max_new_tokens": 8}  # TRL samples as the zoo's rollouts
    assert [s for s, _, _ in trl["evals"]] == [s for s, _, _ in zoo["evals"]] == [0, 1, 2]
    assert trl["evals"][0][1] == zoo["evals"][0][1]  # the same weights, the same evaluation
    assert trl["hit"] is zoo["hit"] is None and all(t >= 0 for _, _, t in trl["evals"] + zoo["evals"])
    process = grpo_race.zoo_run(job | {"arm": "zoo-process", "max_steps": 1})  # the zoo's recipe: + WorkedLines
    assert process["arm"] == "zoo-process" and process["evals"][0][1] == zoo["evals"][0][1]
    trl_lines = grpo_race.trl_run(job | {"arm": "trl-process", "max_steps": 1})  # TRL: the lines' mean as a reward
    assert trl_lines["arm"] == "trl-process" and trl_lines["evals"][0][1] == zoo["evals"][0][1]
    table = grpo_race.summary([trl, zoo, process, trl_lines], 2.0).splitlines()
    assert [row.split()[0] for row in table[2:]] == ["trl", "trl-process", "zoo", "zoo-process"]


def test_the_held_out_questions_are_test_jsonls_and_trls_lines_reward_is_worked_lines(tmp_path):
    import json

    from zoo.gpt.tune.rewards import WorkedLines

    task = grpo_race.TASK | {"train": 40, "test": 12}
    train, held_out = grpo_race.prompts(tmp_path, task)
    test = [json.loads(line) for line in (tmp_path / "test.jsonl").read_text().splitlines()]
    assert len(held_out) == len(test) == 12 and len(train) == 36  # sft.jsonl's training split: 90%
    assert [a for _, a in held_out] == [r["answer"] for r in test]
    asked = {q for q, _ in train}
    assert not any(r["question"] in q for r in test for q in asked)  # none of them trained on
    worked = test[0]["answer"]
    lines = ["p"] * 3, [worked, "1+1 = 3\n#### 2", "no lines"], [worked] * 3
    assert grpo_race.worked_lines(*lines) == WorkedLines()(*lines[1:]) and grpo_race.worked_lines(*lines)[0] == 1.0
