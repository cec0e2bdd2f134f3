"""bench/agentic_race.py's parts: the settings check refuses arms that differ, both arms' configs read back equal
(and a changed one is refused), and TRL's rollouts lay an episode out as the zoo's chat format renders it, the
environment's turns masked and its return the reward."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("agentic_race", ROOT / "bench" / "agentic_race.py")
agentic_race = importlib.util.module_from_spec(spec)
spec.loader.exec_module(agentic_race)


def test_the_settings_check_names_each_setting_that_differs():
    same = {"group_size": 8, "temperature": 1.0, "env_kwargs": {"max_turns": 10}}
    agentic_race.check_same(same, dict(same))
    with pytest.raises(ValueError, match=r"temperature: trl 1.0, zoo 0.9\)") as err:
        agentic_race.check_same(same, same | {"temperature": 0.9})
    assert "group_size" not in str(err.value)
    with pytest.raises(ValueError, match=r"top_p: trl <none>, zoo 1.0"):
        agentic_race.check_same(same, same | {"top_p": 1.0})


class ScriptedTrainer:
    """What ``TurnRollouts`` reads of TRL's trainer: its environments (reset by TRL) and a turn's generation, here
    the binary player's replies, each ended by EOS."""

    def __init__(self, games, replies):
        self.environments, self.replies = games, replies

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations):
        from zoo.io.tokenizers import ByteTokenizer

        tok = ByteTokenizer()
        return [tok.encode(self.replies[tuple(ids)]) + [tok.eos_id] for ids in prompt_ids], None


def test_trls_rollouts_are_the_zoos_episodes_with_the_env_turns_masked_and_its_return_the_reward():
    from zoo.gpt.tune.envs.scripted import scripted_episodes
    from zoo.io.chat_template import chat_renderer
    from zoo.io.tokenizers import ByteTokenizer

    settings = {"max_turns": 10, "turn_cost": 0.05}
    games = [agentic_race.GuessGame(settings) for _ in range(3)]
    conversations = []
    for seed, game in zip((4, 7, 11), games):
        assert game.reset(seed=seed, prompt=[]) == "Guess my number from 1 to 100. Reply Guess: N."
        (played,) = scripted_episodes(agentic_race.ENV_ID, 1, seed, "binary", **settings)
        conversations.append(played)
    # each turn's reply keyed by the ids it continues, as the zoo's format renders them: a rollout whose context is
    # laid out otherwise finds no reply
    render, replies = chat_renderer(ByteTokenizer()), {}
    for played in conversations:
        for k, m in enumerate(played):
            if m["role"] == "assistant":
                replies[tuple(render(played[:k], True).ids)] = m["content"]
    out = agentic_race.TurnRollouts(10, 496)([], ScriptedTrainer(games, replies))
    for k, played in enumerate(conversations):
        whole = render(played, False)
        assert out["prompt_ids"][k] + out["completion_ids"][k] == whole.ids
        start = len(out["prompt_ids"][k])
        assert out["env_mask"][k] == [int(x) for x in whole.mask[start:]]  # only the replies (and their EOS) trained
        turns = sum(m["role"] == "assistant" for m in played)
        assert games[k].get_reward() == pytest.approx(1.0 - 0.05 * turns) and turns <= 7


@pytest.mark.slow  # TRL's import and trainer and a cli.py run built: about 10 s; the check itself is tested above
def test_both_arms_read_back_the_same_settings_and_one_changed_is_refused(tmp_path):
    pytest.importorskip("trl")
    import torch

    from zoo.gpt import GPT
    from zoo.gpt.formats.hf import export_gpt2

    torch.manual_seed(0)
    folder = export_gpt2(GPT(vocab_size=257, block_size=128, n_layer=1, n_embd=16, n_head=2), tmp_path / "m", 256)
    s = agentic_race.SETTINGS | {"group_size": 2, "seeds_per_step": 3, "turn_cost": 0.1}
    trainer = agentic_race.trl_trainer(str(folder), s, 0, 1, str(tmp_path / "trl"))
    cli = agentic_race.zoo_cli(str(folder), s, 0, 1)
    trl, zoo = agentic_race.trl_settings(trainer), agentic_race.zoo_settings(cli)
    agentic_race.check_same(trl, zoo)
    assert trl["seeds_per_step"] == 3 and trl["max_tokens"] == 128 - 16 and trl["env_kwargs"]["turn_cost"] == 0.1
    trainer.temperature = 0.7  # what TRL's loss divides the logits by
    with pytest.raises(ValueError, match="temperature: trl 0.7, zoo 1.0"):
        agentic_race.check_same(agentic_race.trl_settings(trainer), zoo)
    cli.datamodule.env.kwargs["turn_cost"] = 0.0  # the zoo's episodes scored otherwise
    with pytest.raises(ValueError, match="env_kwargs"):
        agentic_race.check_same(trl, agentic_race.zoo_settings(cli))
