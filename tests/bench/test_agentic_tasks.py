"""bench/agentic_tasks.py's stages: what each fit is told (the tool denied to notool, sft_more validated to keep
its best, the per-task GRPO settings for GRPO only)."""

from bench.agentic_tasks import VAL_EVERY, chosen_stages, fit_args


def test_each_stage_is_fitted_from_its_config_with_its_own_settings():
    rl, notool = fit_args("calculator", "rl", 0, 60), fit_args("calculator", "notool", 0, 60)
    assert "--model.init_args.episodes.max_turns=1" in notool and not any("max_turns" in a for a in rl)
    assert rl[2].endswith("grpo_calculator.yaml") and notool[2].endswith("grpo_calculator.yaml")
    more = fit_args("guess_number", "sft_more", 1, 1500)
    assert more[2].endswith("sft_guess_number.yaml") and f"--trainer.val_check_interval={VAL_EVERY}" in more
    assert "--seed_everything=1" in more and "--trainer.max_steps=1500" in more
    assert not any("lr=" in a for a in more) and any("lr=" in a for a in fit_args("guess_number", "rl", 1, 80))
    assert more[-1] == "--trainer.logger.init_args.registered_model_name=guess_number-sft_more"


def test_a_given_sft_model_is_the_sft_stage_the_wanted_ones_start_from():
    assert chosen_stages("calculator", ["rl"], "models:/calculator-sft/1") == ["sft", "rl"]
    assert chosen_stages("calculator", ["sft_more", "rl"], None) == ["rl", "sft_more"]  # the task's order
    assert chosen_stages("frozenlake", None, None) == ["sft", "rl", "sft_more"]
