"""The configs of bench/agentic_tasks.py (SFT on a scripted player's traces, then GRPO with the text environment):
each parses into its module and data, runs one step on a tiny net (fast_dev_run: no MLflow, the scripted episodes
written small; slow: ~10 s each on a loaded machine), and the mixed scripted players are imperfect as the configs
say."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
from conftest import CONFIGS, cli

from zoo.gpt.tune.envs.scripted import scripted_episodes

TINY = [f"--model.init_args.net.init_args.{k}={v}" for k, v in (("n_layer", 1), ("n_embd", 16), ("n_head", 2))]
SFT = ["sft_calculator.yaml", "sft_guess_number.yaml", "sft_frozenlake.yaml"]
GRPO = {
    "grpo_calculator.yaml": 112,  # a tool call's bytes
    "grpo_frozenlake.yaml": 8,
}


@pytest.mark.parametrize("name", [*SFT, *GRPO])
def test_a_config_parses_into_its_module_and_data(name):
    from cli import main

    c = main(["--config", str(CONFIGS / "gpt" / name)], run=False)
    kind = ("CausalLMModule", "ChatDataModule") if name in SFT else ("GRPOModule", "EpisodeDataModule")
    assert (type(c.model).__name__, type(c.datamodule).__name__) == kind


@pytest.mark.slow
@pytest.mark.parametrize("name", SFT)
def test_an_sft_config_writes_its_episodes_and_runs_a_step(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = cli("fit", "--config", str(CONFIGS / "gpt" / name), *TINY, "--data.init_args.episodes.n=24",
            "--data.init_args.batch_size=4", "--trainer.fast_dev_run=1")  # fmt: skip
    assert (tmp_path / c.datamodule.path / "episodes.jsonl").exists()
    assert c.trainer.global_step == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", GRPO)
def test_a_grpo_config_plays_a_step_of_episodes(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    block = f"--model.init_args.net.init_args.block_size={GRPO[name] + 144}"  # the prompt and a turn's budget
    c = cli("fit", "--config", str(CONFIGS / "gpt" / name), *TINY, block, "--model.init_args.group_size=2",
            "--model.init_args.generation.max_new_tokens=4", "--data.init_args.batch_size=1",
            "--data.init_args.val_batch_size=2", "--trainer.fast_dev_run=1")  # fmt: skip
    assert c.trainer.global_step == 1 and "val/turns" in c.trainer.callback_metrics


def test_the_mixed_players_are_imperfect_teachers():
    calc = scripted_episodes("zoo/Calculator-v0", n=200, seed=0, player="mixed")
    called = statistics.mean(any(m["role"] == "tool" for m in e) for e in calc)
    assert 0.15 < called < 0.35  # a quarter call the calculator
    guess = scripted_episodes("zoo/GuessNumber-v0", n=100, seed=0, player="mixed", max_turns=30)
    turns = statistics.mean(sum(m["role"] == "assistant" for m in e) for e in guess)
    assert 10 < turns < 16  # binary search needs at most 7


def test_the_sloppy_calculator_player_always_calls_and_drops_the_last_term_three_times_in_four():
    from zoo.gpt.tune.envs import make
    from zoo.gpt.tune.envs.calculator import evaluate
    from zoo.gpt.tune.envs.scripted import PLAYER_STREAM, PLAYERS, play

    env, rng, rows = make("zoo/Calculator-v0", split="all"), np.random.default_rng([0, PLAYER_STREAM]), []
    for seed in range(300):
        messages, total, info = play(env, PLAYERS["zoo/Calculator-v0"]["sloppy"], rng, seed)
        question = messages[0]["content"][len("What is ") : -1]
        call = json.loads(messages[1]["content"][len("<tool_call>") : -len("</tool_call>")])["arguments"]
        whole = call["expression"] == question
        # the slip is the last term only: the call is the question's start, a term shorter
        assert whole or question.startswith(call["expression"] + " ") and len(question.split()) == 7
        assert info["tool_calls"] == 1 and messages[-1]["content"] == f"Answer: {evaluate(call['expression'])}"
        rows.append((whole, total))
    assert 0.15 < statistics.mean(w for w, _ in rows) < 0.35
    assert all(t == 1.0 for w, t in rows if w)  # a whole call is always right; a slip rarely


def test_the_episode_data_has_the_tokenizer_once_set_up():
    from datamodules.episodes import EpisodeDataModule

    data = EpisodeDataModule("zoo/GuessNumber-v0")
    data.setup("fit")  # the module takes it at its own setup: a net from init_weights was sized by nothing here
    assert data.tokenizer is not None and data.tokenizer.vocab_size == 257


@pytest.mark.parametrize("name", SFT)
def test_an_sft_config_holds_its_teachers_episodes_whole(name):
    """A conversation past block_size loses its later replies (ChatDataModule counts them as cut): the calculator's
    answer after the tool's result is what RL needs the SFT model to have learnt."""
    import yaml

    from zoo.gpt.tune.envs import make
    from zoo.gpt.tune.episodes import scaffold_for
    from zoo.io.tokenizers import ByteTokenizer

    config = yaml.safe_load((CONFIGS / "gpt" / name).read_text())
    block, data = config["model"]["init_args"]["net"]["init_args"]["block_size"], config["data"]["init_args"]
    spec = data["episodes"]
    scaffold = scaffold_for(ByteTokenizer(), make(spec["env_id"], **spec.get("env_kwargs", {})))
    episodes = scripted_episodes(spec["env_id"], n=200, seed=0, player=spec["player"], **spec.get("env_kwargs", {}))
    longest = max(len(scaffold.render(e, False).ids) for e in episodes)
    assert longest <= block + 1, f"{name}: an episode of {longest} tokens, block_size {block}"


@pytest.mark.parametrize("name", SFT)
def test_a_turns_token_budget_holds_the_teachers_longest_reply_and_its_end(name):
    """A reply cut at max_new_tokens is no move at all (``Move: ri``): FrozenLake's budget of 8 bytes could not
    write ``Move: right``, so every test episode of the SFT model ran out its tokens re-told the format."""
    import yaml

    from zoo.io.tokenizers import ByteTokenizer

    sft = yaml.safe_load((CONFIGS / "gpt" / name).read_text())
    grpo = yaml.safe_load((CONFIGS / "gpt" / name.replace("sft_", "grpo_")).read_text())
    spec = sft["data"]["init_args"]["episodes"]
    episodes = scripted_episodes(spec["env_id"], n=200, seed=0, player=spec["player"], **spec.get("env_kwargs", {}))
    longest = max(len(ByteTokenizer().encode(m["content"])) for e in episodes for m in e if m["role"] == "assistant")
    for config in (sft, grpo):
        budget = config["model"]["init_args"]["generation"]["max_new_tokens"]
        assert longest + 1 <= budget, f"{name}: a reply of {longest} tokens and its end, max_new_tokens {budget}"
