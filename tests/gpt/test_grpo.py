"""GRPO on the GPT: rewards and their guard, the trust rule, the prompts, and a fit that learns what is rewarded."""

from __future__ import annotations

import gc
import json
import math
import time

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything

from datamodules import PromptDataModule
from zoo.errors import InputError
from zoo.gpt import GPT, GRPOModule
from zoo.gpt.generate import Generation
from zoo.gpt.tune.losses import GRPOLoss
from zoo.gpt.tune.rewards import ExactMatch, FormatCheck, NumericTolerance, Reward, StepReward, score
from zoo.io.tokenizers import ByteTokenizer
from zoo.train.optim import AdamWCosine

NET = dict(vocab_size=257, block_size=32, n_layer=1, n_embd=32, n_head=2)


class CountX(Reward):
    """A toy reward: the share of the completion's characters that are "x"."""

    def score_one(self, completion: str, answer: str) -> float:
        return completion.count("x") / max(len(completion), 1)


class XSteps(StepReward):
    """A toy step reward: every character is a step, 1 when it is "x"."""

    def steps(self, completion: str, answer: str) -> list[tuple[int, float]]:
        return [(i + 1, float(c == "x")) for i, c in enumerate(completion)]


class Echo(Reward):
    """1 when the completion is its answer."""

    def score_one(self, completion: str, answer: str) -> float:
        return float(completion == answer)


class Raises(Reward):
    def score_one(self, completion: str, answer: str) -> float:
        raise KeyError("boom")


class NaN(Reward):
    def score_one(self, completion: str, answer: str) -> float:
        return math.nan


class Hangs(Reward):
    def score_one(self, completion: str, answer: str) -> float:
        time.sleep(5)
        return 1.0


def test_rewards_compare_extracted_answers():
    worked = "3+9 = 12\n12-2 = 10\n#### 10"  # the arithmetic task's reference, a worked reply
    assert ExactMatch()(["so #### 10", "#### 1,0", "#### 11", "it is 10"], [worked] * 4) == [1.0, 1.0, 0.0, 1.0]
    assert FormatCheck()(["#### 10", "10"], ["10", "10"]) == [1.0, 0.0]
    assert NumericTolerance(tol=1.0)(["#### 11", "#### 12", "none"], ["10"] * 3) == [1.0, 0.0, 0.0]
    total, each, errors = score([ExactMatch(weight=2.0), FormatCheck(weight=0.5)], ["#### 10", "10"], ["10", "9"])
    assert total == [2.5, 0.0] and each == {"ExactMatch": [1.0, 0.0], "FormatCheck": [1.0, 0.0]} and errors == 0


@pytest.mark.parametrize(
    "reward, why", [(Raises(), "raised KeyError"), (NaN(), "not one finite number"), (Hangs(), "ran past")]
)
def test_a_failing_reward_stops_with_one_line_naming_it_and_the_completion(reward, why):
    with pytest.raises(InputError) as err:
        score([ExactMatch(), reward], ["#### 1", "the bad one"], ["1", "1"], timeout=0.2)
    message = str(err.value)
    assert "\n" not in message and type(reward).__name__ in message and why in message
    assert "'#### 1'" in message and "reward_errors=zero" in message  # the first completion it met


@pytest.mark.parametrize("reward", [Raises(), NaN(), Hangs()])
def test_with_reward_errors_zero_a_failure_scores_0_and_is_counted(reward):
    total, each, errors = score([ExactMatch(), reward], ["#### 1", "#### 2"], ["1", "1"], 0.2, "zero")
    assert total == [1.0, 0.0] and each[type(reward).__name__] == [0.0, 0.0] and errors == 2


def _module(rewards=None, lr=1e-2, max_new_tokens=6, **kwargs) -> GRPOModule:
    seed_everything(0)
    rewards = [CountX()] if rewards is None else rewards
    optimizer = AdamWCosine(lr=lr, weight_decay=0.0, warmup_steps=0, min_lr_ratio=1.0)
    defaults = dict(group_size=8, generation=Generation(max_new_tokens=max_new_tokens), optimizer=optimizer)
    module = GRPOModule(GPT(**NET), rewards=list(rewards), **(defaults | kwargs))
    module.tokenizer = ByteTokenizer()
    return module


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _prompts(tmp_path) -> PromptDataModule:
    path = _write(tmp_path / "prompts.jsonl", [{"question": q, "answer": "1"} for q in "abcd"])
    return PromptDataModule(path, val_path=path, tokenizer="bytes", batch_size=4)


def _trainer(tmp_path, steps, **kwargs) -> Trainer:
    return Trainer(
        max_steps=steps,
        max_epochs=-1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        default_root_dir=tmp_path,
        **{"limit_val_batches": 0} | kwargs,
    )


def test_rewards_of_row_r_are_against_the_answer_of_prompt_r_over_g():
    module = _module(rewards=[Echo()], group_size=2)
    scores = module.score_rows(["a", "b", "b", "x"], ["a", "b"])
    assert scores.outcome.tolist() == [1.0, 0.0, 1.0, 0.0] and scores.per_row == ["a", "a", "b", "b"]
    assert torch.equal(scores.total, scores.outcome) and scores.steps == [[]] * 4
    assert scores.metrics["rewards/Echo/mean"] == 0.5 and scores.metrics["reward_errors"] == 0.0


@pytest.mark.parametrize("reward", [CountX(), XSteps()])  # a score per completion; one per token (process)
def test_a_fit_makes_the_rewarded_token_more_frequent(tmp_path, reward):
    module, dm = _module(rewards=[reward], lr=3e-2), _prompts(tmp_path)
    dm.setup()
    prompts = next(iter(dm.train_dataloader()))["prompt_ids"]

    def share_of_x() -> float:
        rollout = module.rollout(prompts)
        texts = module.completions(rollout.completion_ids, rollout.completion_mask)
        return sum(CountX().score_one(t, "") for t in texts) / len(texts)

    before = share_of_x()
    trainer = _trainer(tmp_path, 8)
    trainer.fit(module, dm)
    after = share_of_x()
    assert after > before + 0.2
    metrics = trainer.callback_metrics
    expected = {"train/reward", "train/reward_std", "train/accuracy", "train/completion_length", "train/entropy"}
    assert expected | {
        "train/clip_ratio/region_mean",
        "train/reward_errors",
        f"train/rewards/{reward.name}/mean",
    } <= set(metrics)
    assert "train/kl" not in metrics and module._reference.copy is None  # beta 0: no reference built


def test_the_old_policy_is_the_sampling_pass_so_a_second_pass_moves_the_ratio(tmp_path):
    trainer = _trainer(tmp_path, 1)
    trainer.fit(_module(lr=0.05), _prompts(tmp_path))  # one pass: the ratio is 1 up to kernel noise
    assert trainer.callback_metrics["train/approx_kl"] < 1e-6
    trainer = _trainer(tmp_path, 2)
    trainer.fit(_module(lr=0.05, num_iterations=2), _prompts(tmp_path))  # the last pass after an update
    assert trainer.callback_metrics["train/approx_kl"] > 1e-4


def test_beta_builds_a_frozen_reference_and_logs_the_kl(tmp_path):
    module = _module(loss=GRPOLoss(beta=0.1))
    trainer = _trainer(tmp_path, 2)
    trainer.fit(module, _prompts(tmp_path))
    assert module._reference.copy is not None and trainer.callback_metrics["train/kl"] > 0  # not the policy
    assert all(k.startswith("net.") for k in module.state_dict())


def test_with_lora_the_kl_reference_is_the_base_with_adapters_off_and_no_copy(tmp_path):
    pytest.importorskip("peft")
    from zoo.gpt.tune.rollout import per_token_logps

    module, dm = _module(loss=GRPOLoss(beta=0.1), lr=0.05, adapt={"lora": {"r": 4}}), _prompts(tmp_path)
    # type(o), not isinstance: isinstance reads a weakref.proxy's __class__, which raises once its object is gone
    # (a dead proxy that an earlier test in the same worker left among the objects failed this test).
    nets_before = {id(o) for o in gc.get_objects() if issubclass(type(o), GPT)}
    trainer = _trainer(tmp_path, 3)
    trainer.fit(module, dm)
    # every GPT built since, dropped ones too
    new_nets = [o for o in gc.get_objects() if issubclass(type(o), GPT) and id(o) not in nets_before]
    assert new_nets == [] and module._reference.copy is None  # no second net in memory
    assert trainer.callback_metrics["train/kl"] > 0  # the adapters moved the policy off its reference
    base = GPT(**NET)
    state = module.net.state_dict()
    base.load_state_dict({k.replace(".base_layer", ""): v for k, v in state.items() if "lora_" not in k})
    rollout = module.rollout(next(iter(dm.train_dataloader()))["prompt_ids"])
    args = rollout.ids, rollout.completion_mask, 1.0, rollout.pad
    with torch.no_grad(), module.reference() as ref:
        ours = per_token_logps(ref, *args)
    torch.testing.assert_close(ours, per_token_logps(base.eval(), *args))
    assert not torch.allclose(per_token_logps(module.net, *args), ours)  # adapters back on after the reference
    with pytest.raises(InputError, match="adapter_weights.*merged"):  # its start is not the base
        GRPOModule(GPT(**NET), loss=GRPOLoss(beta=0.1), adapter_weights="adapter_folder")


def test_dr_grpo_divides_by_the_token_budget_which_a_trimmed_rollout_no_longer_shows():
    from zoo.gpt.tune.rollout import Rollout, per_token_logps

    module = _module(loss=GRPOLoss("dr_grpo"), max_new_tokens=6)
    ids, pad, mask = (
        torch.tensor([[65, 66, 67, 68], [65, 69, 70, 71]]),
        torch.zeros(2, dtype=torch.long),
        torch.ones(2, 3),
    )
    with torch.no_grad():
        old = per_token_logps(module.net, ids, mask, 1.0, pad)  # the ratio is 1: each token's loss is -A
    out = module.policy_loss(Rollout(ids, pad, mask, old), torch.tensor([1.0, 2.0]), slice(0, 2), None)
    torch.testing.assert_close(out["loss"], torch.tensor(-(1.0 * 3 + 2.0 * 3) / (2 * 6)))  # not / (2 * 3)


def test_validation_scores_greedy_replies_and_keeps_sample_rows(tmp_path):
    module = _module(val_samples=3)
    out = _trainer(tmp_path, 0, limit_val_batches=None).validate(module, _prompts(tmp_path), verbose=False)[0]
    assert {"val/accuracy", "val/reward"} <= set(out)
    assert len(module.completion_samples) == 3 and module.completion_samples[0]["prompt"].endswith("<|assistant|>\n")


def test_a_fit_without_rewards_is_one_line_saying_where_to_give_them(tmp_path):
    with pytest.raises(InputError, match="model.init_args.rewards"):
        _trainer(tmp_path, 1).fit(_module(rewards=()), _prompts(tmp_path))


MARKER = "grpo_reward_marker"


class Marker(Reward):
    """Writes a marker file when built: a stored config must never build it."""

    def __init__(self, folder: str = ".", weight: float = 1.0) -> None:
        super().__init__(weight)
        open(f"{folder}/{MARKER}", "w").close()


@pytest.mark.parametrize("class_path", ["zoo.gpt.tune.rewards.ExactMatch", f"{__name__}.Marker"])
def test_a_checkpoint_naming_a_reward_builds_nothing_from_it(tmp_path, class_path):
    module = _module(loss=GRPOLoss("dr_grpo", clip_high=0.3, scale_std=False, step_credit="own", rho_bar=2.0))
    assert "rewards" not in module.hparams  # never stored by the module itself
    trainer = _trainer(tmp_path, 0)
    trainer.strategy.connect(module)
    path = tmp_path / "crafted.ckpt"
    trainer.save_checkpoint(path, weights_only=True)
    ckpt = torch.load(path, weights_only=True)
    ckpt["hyper_parameters"]["rewards"] = [{"class_path": class_path, "init_args": {"weight": 3.0}}]
    torch.save(ckpt, path)
    loaded = GRPOModule.load_from_checkpoint(path, net=GPT(**NET))
    assert loaded.rewards == [] and "rewards" not in loaded.hparams
    assert not list(tmp_path.rglob(MARKER))
    assert loaded.loss == module.loss and loaded.max_new_tokens == 6  # the objective's settings, stored as fields


def test_prompts_come_from_questions_conversations_and_chat_records(tmp_path):
    records = [
        {"question": "What is 1+1?", "answer": "#### 2"},
        {"messages": [{"role": "user", "content": "hi"}], "answer": 3},
        {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "#### 4"}]},
    ]
    path = _write(tmp_path / "p.jsonl", records)
    dm = PromptDataModule(path, val_fraction=0.0, tokenizer="bytes", batch_size=3)
    dm.setup()
    batch = next(iter(dm.val_dataloader() if dm.val_set else dm._loader(dm.train_set, "val")))
    texts = [dm.tokenizer.decode(p.tolist()) for p in batch["prompt_ids"]]
    assert texts == [f"<|user|>\n{q}\n<|assistant|>\n" for q in ("What is 1+1?", "hi", "What is 2+2?")]
    assert batch["answers"] == ["#### 2", "3", "#### 4"]


def test_a_bad_prompt_record_is_named_by_file_and_line(tmp_path):
    path = _write(tmp_path / "p.jsonl", [{"question": "q", "answer": "1"}, {"question": "q"}])
    with pytest.raises(InputError, match=r"p\.jsonl:2 has the answer None"):
        PromptDataModule(path, tokenizer="bytes").setup()


def test_the_generated_task_validates_on_held_out_sft_questions_and_never_on_test_ones(tmp_path):
    from datamodules.arithmetic import ArithmeticTask

    task = ArithmeticTask(train=20, pairs=0, test=5)
    dm = PromptDataModule(str(tmp_path / "task"), tokenizer="bytes", val_fraction=0.25, generate=task)
    dm.prepare_data()
    dm.setup()
    assert len(dm.train_set) == 15 and len(dm.val_set) == 5
    questions = lambda items: {dm.tokenizer.decode(ids) for ids, _ in items}  # noqa: E731
    sft = [json.loads(line) for line in (tmp_path / "task" / "sft.jsonl").read_text().splitlines()]
    assert {m["messages"][0]["content"] for m in sft[15:]} == {q.split("\n")[1] for q in questions(dm.val_set)}
    test = [json.loads(line)["question"] for line in (tmp_path / "task" / "test.jsonl").read_text().splitlines()]
    assert not {q.split("\n")[1] for q in questions(dm.train_set) | questions(dm.val_set)} & set(test)
    assert all("####" in answer for _, answer in dm.train_set + dm.val_set)


@pytest.mark.slow  # a cli.py fit into MLflow: ~15 s beyond the imports
def test_the_grpo_config_fits_through_the_cli_from_given_weights(tmp_path):
    from conftest import CONFIGS, fit_in_folder

    from zoo.gpt.formats.hf import save_safetensors

    tiny = dict(n_layer=1, n_embd=32, n_head=2, block_size=96)  # a file of the net alone: its settings given
    start = GPT(vocab_size=257, **tiny)  # GeLU's approximation: no weights
    weights = save_safetensors(start, tmp_path / "sft.safetensors")  # as an SFT stage's model would be
    fitted = fit_in_folder(
        tmp_path,
        "--config",
        str(CONFIGS / "gpt" / "grpo_arithmetic.yaml"),
        f"--model.init_args.init_weights={weights}",
        *(f"--model.init_args.net.init_args.{k}={v}" for k, v in tiny.items()),
        "--model.init_args.group_size=2",
        "--model.init_args.generation.max_new_tokens=8",
        f"--data.init_args.path={tmp_path / 'arith'}",  # the task written into the test's folder
        "--data.init_args.generate.train=16",
        "--data.init_args.generate.pairs=0",
        "--data.init_args.generate.test=4",
        "--data.init_args.batch_size=2",
        "--data.init_args.val_batch_size=2",
        "--data.init_args.val_fraction=0.25",  # 4 of the 16 questions
        "--trainer.max_steps=2",
        "--trainer.val_check_interval=2",
        "--trainer.limit_val_batches=1",
        "--trainer.log_every_n_steps=1",
    )
    metrics = fitted.trainer.callback_metrics
    assert isinstance(fitted.model, GRPOModule) and {"train/reward", "val/accuracy", "val/reward"} <= set(metrics)
    assert fitted.trainer.global_step == 2 and fitted.trainer.checkpoint_callback.monitor == "val/accuracy"
    from callbacks import ProgressBar  # a long run shows how it goes: the bar, with reward, accuracy and tokens/s

    assert any(isinstance(c, ProgressBar) for c in fitted.trainer.callbacks)
    assert {"train/reward", "train/accuracy", "train/tokens_per_s"} <= set(fitted.trainer.progress_bar_metrics)
    path = fitted.trainer.checkpoint_callback.last_model_path
    assert "rewards" not in torch.load(path, weights_only=True)["hyper_parameters"]
    reloaded = GRPOModule.load_from_checkpoint(path)
    assert reloaded.loss == GRPOLoss("dapo", clip_high=0.28, step_credit="own") and reloaded.max_new_tokens == 8
    assert reloaded.rewards == [] and reloaded.generate(["1"], 3, temperature=0) == fitted.model.eval().generate(
        ["1"], 3, temperature=0
    )


# -- the answer rule: cli.py test's, on the user's own replies ------------------------------------------------------

ANSWER = "Answer: (.+)"
CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo")]


def _chat_records(tmp_path, name="capitals.jsonl", last_reply=None) -> str:
    """Chat records whose replies end ``Answer: <city>``, as a user's own data; ``last_reply`` replaces the last."""
    records = [
        {
            "messages": [
                {"role": "user", "content": f"What is the capital of {country}?"},
                {"role": "assistant", "content": f"Its government sits there.\nAnswer: {city}"},
            ]
        }
        for country, city in CAPITALS
    ]
    if last_reply is not None:
        records[-1]["messages"][-1]["content"] = last_reply
    return _write(tmp_path / name, records)


def test_rewards_read_answers_by_the_datas_answer_rule_strings_and_the_first_match():
    replies = ["Let me see.\nAnswer: Paris", "Answer: Paris.", "Answer: Rome", "Paris", "Answer: Paris or Rome"]
    reference = "It is in France.\nAnswer: Paris"
    assert ExactMatch()(replies, [reference] * 5, ANSWER) == [1.0, 1.0, 0.0, 0.0, 0.0]  # "(.+)" takes the line's rest
    first = r"Answer: (\d+)"
    assert ExactMatch()(["Answer: 0123 then 4567", "Answer: 4567"], ["Answer: 0123"] * 2, first) == [1.0, 0.0]
    two = ["Answer: 12, no, Answer: 4567", "#### 12\n#### 4567"]  # two matches: the first is the answer
    assert ExactMatch()(two, ["Answer: 12"], first)[:1] == ExactMatch()(two[1:], ["12"]) == [1.0]
    assert NumericTolerance(tol=1)(["Answer: 12 or 40", "#### 12"], ["13"] * 2, first) == [1.0, 0.0]
    total, each, _ = score([ExactMatch(), CountX()], ["Answer: Paris"], [reference], pattern=ANSWER)
    assert each["ExactMatch"] == [1.0] and total == [1.0]  # CountX takes no rule: called as before
    assert ExactMatch()(["so #### 10"], ["3+7 = 10\n#### 10"]) == [1.0]  # no pattern: GSM8K's, as before


def test_grpo_on_chat_records_with_answer_replies_rewards_the_right_ones_and_validation_counts_them(
    tmp_path, monkeypatch
):
    path = _chat_records(tmp_path)
    dm = PromptDataModule(path, val_path=path, tokenizer="bytes", batch_size=2, val_batch_size=4, answer_pattern=ANSWER)
    seen = []

    class Seen(ExactMatch):
        def score_answer(self, completion, answer, pattern):
            seen.append(pattern)
            return super().score_answer(completion, answer, pattern)

    module = _module(rewards=[Seen()], group_size=2)
    module.net = GPT(**(NET | {"block_size": 96}))  # room for the questions
    scores = module.score_rows(["Answer: Paris", "Answer: Lyon", "Answer: Rome", "Rome"], dm_answers(dm)[:2], ANSWER)
    assert scores.outcome.tolist() == [1.0, 0.0, 1.0, 0.0]
    replies = [f"Hmm.\nAnswer: {c}" for c in ("Paris", "Rome", "Lisbon", "Kyoto")]  # two right, two wrong

    def greedy(net, prompts, *args, **kwargs):
        return [torch.tensor(list(r.encode()), dtype=torch.long) for r in replies[: len(prompts)]]

    monkeypatch.setattr("zoo.gpt.tune.grpo.generate", greedy)
    trainer = _trainer(tmp_path, 1, limit_val_batches=None)
    trainer.fit(module, dm)  # a training step reads answers by the data's rule too
    assert set(seen) == {ANSWER} and "train/tokens_per_s" in trainer.progress_bar_metrics
    assert {"train/reward", "train/accuracy"} <= set(trainer.progress_bar_metrics)
    out = trainer.validate(module, dm, verbose=False)[0]
    assert out["val/accuracy"] == 0.5 and out["val/reward"] == 0.5
    # cli.py test's exact match on the same replies, by the same rule, scores the same
    from datamodules.tasks import TaskDataModule

    monkeypatch.setattr("zoo.gpt.tasks.generate", greedy)
    questions = [{"question": f"Capital of {c}?", "answer": f"Answer: {city}"} for c, city in CAPITALS]
    task = TaskDataModule(_write(tmp_path / "q.jsonl", questions), kind="exact_match", answer_pattern=ANSWER)
    assert trainer.test(module, task, verbose=False)[0]["test/exact_match"] == 0.5


def dm_answers(dm: PromptDataModule) -> list[str]:
    dm.setup()
    return [answer for _, answer in dm.train_set]


def test_a_reply_the_rule_cannot_read_is_one_line_naming_file_and_line_or_skipped_and_counted(tmp_path):
    path = _chat_records(tmp_path, last_reply="It is Tokyo.")
    with pytest.raises(InputError) as err:
        PromptDataModule(path, tokenizer="bytes", answer_pattern=ANSWER).setup()
    message = str(err.value)
    assert "\n" not in message and "capitals.jsonl:4 has a reply in which the answer rule" in message
    assert "'It is Tokyo.'" in message and "skip_bad_records" in message
    dm = PromptDataModule(path, tokenizer="bytes", answer_pattern=ANSWER, skip_bad_records=True, val_fraction=0.0)
    dm.setup()
    assert dm.skipped == 1 and len(dm.train_set) == 3
    with pytest.raises(InputError, match=r"capitals\.jsonl:1 has a reply in which the answer rule '#### <number>'"):
        PromptDataModule(_chat_records(tmp_path), tokenizer="bytes").setup()  # GSM8K's rule by default
    with pytest.raises(InputError, match="has 2 groups"):
        PromptDataModule(path, tokenizer="bytes", answer_pattern="(A): (.+)")


def test_an_answer_pattern_with_a_colon_on_the_command_line_is_a_string(tmp_path, monkeypatch):
    """cli.py's own parser: jsonargparse read ``Answer: (\\d+)`` as a YAML mapping and refused it (Expected a str)."""
    from conftest import CONFIGS

    from cli import main

    monkeypatch.chdir(tmp_path)
    path = _chat_records(tmp_path)
    built = main(
        [  # run=False: LightningCLI has no subcommand
            "--config",
            str(CONFIGS / "gpt" / "grpo_arithmetic.yaml"),
            "--data.init_args.generate=null",
            f"--data.init_args.path={path}",
            r"--data.init_args.answer_pattern=Answer: (\d+)",
            "--model.init_args.rewards=[{class_path: zoo.gpt.tune.rewards.FormatCheck, init_args: {pattern: 'A: b'}}]",
            "--model.init_args.net.init_args.n_layer=1",  # a deeper flag still reads its own type
            "--trainer.logger=false",
        ],
        run=False,
    )
    assert built.datamodule.answer_pattern == r"Answer: (\d+)" and built.model.net.n_layer == 1
    assert built.model.rewards[0].pattern.pattern == "A: b"


def test_a_bad_loss_setting_is_one_line_naming_its_key():
    for field, value in [("loss_type", "ppo"), ("clip_low", 1.0), ("beta", -0.1), ("step_credit", "all")]:
        with pytest.raises(InputError, match=rf"^model\.init_args\.loss\.{field}=.* must be .*loss\.{field}=") as err:
            GRPOModule(GPT(**NET), loss={field: value})
        assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="rho_bar"):
        GRPOLoss(rho_bar=0.5)
