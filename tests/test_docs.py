"""The manual (docs/): it builds with warnings as errors, its first page runs as written (on the tiny config), and
every command in it is run by a named test or says what it needs that a test machine has not got."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import CONFIGS, ROOT, cli, output

DOCS = ROOT / "docs"
TESTS = ROOT / "tests"

# Each command of the manual (a regular expression over the line, continuations joined) and either the test that
# runs it (the same command, or its family's tiny config through the same path) or what it needs.
NEEDS = ("a template", "data you give", "minutes of CPU", "a GPU", "several machines", "a running server")
COVERED: list[tuple[str, str]] = [
    (r"^python cli\.py (fit|validate|test|predict) +--config configs/<family>", "a template"),
    (
        r"^python -m zoo\.gpt export <lora\.ckpt>",
        "tests/gpt/test_gpt_export.py::test_an_exported_lora_checkpoint_loads_in_transformers_and_peft_with_the_zoos_ids_and_logits",
    ),
    (
        r"^python -m zoo\.gpt export <last\.ckpt>",
        "tests/gpt/test_gpt_cli.py::test_tiny_fits_then_predicts_from_its_checkpoint_and_reloads_alone",
    ),
    (
        r"^python -m zoo\.gpt lm-eval <lora\.ckpt> --init-weights",
        "tests/gpt/test_gpt_export.py::test_lm_eval_runs_on_a_lora_checkpoint_given_its_base",
    ),
    (r"convnet_digits\.yaml --print_config", "tests/test_docs.py::test_print_config_prints_every_option_resolved"),
    (
        r"^python -m pytest tests/gpt/test_gpt_pretrained\.py",
        "tests/test_docs.py::test_the_parity_page_reruns_every_test_it_cites",
    ),
    (
        r"init_weights=models:/arith-sft/1 --print_config",
        "tests/app/test_net_from_registry.py::test_an_alias_names_the_model_and_print_config_shows_its_net",
    ),
    (
        r"gpt_tiny\.yaml --help",
        "tests/app/test_bad_input.py::test_help_with_a_config_lists_its_models_and_datas_options",
    ),
    (r"configs/clip/vit_shapes\.yaml$", "minutes of CPU"),
    (
        r"configs/clip/vit_shapes\.yaml --ckpt_path",
        "tests/clip/test_clip_cli.py::test_tiny_fits_into_mlflow_then_predicts_from_its_checkpoint",
    ),
    (
        r"zeroshot_folder\.yaml",
        "tests/clip/test_clip_pretrained.py::test_zeroshot_preset_predicts_a_folder_as_transformers_would_with_openais_templates",
    ),
    (
        r"finetune_csv\.yaml",
        "tests/clip/test_clip_cli.py::test_finetune_preset_starts_from_hf_weights_and_tokenizer_on_a_csv",
    ),
    (
        r"clip/tiny\.yaml --trainer\.logger",
        "tests/app/test_after_fit.py::test_clip_registered_model_zero_shot_and_embeddings_without_the_config",
    ),
    (
        r"models:/clip/1",
        "tests/app/test_after_fit.py::test_clip_registered_model_zero_shot_and_embeddings_without_the_config",
    ),
    (
        r"registered_model_name=digits$",
        "tests/tracking/test_registry.py::test_fit_registers_a_logged_model_with_the_runs_evaluation_metrics",
    ),
    (
        r"set_registered_model_alias\('digits'",
        "tests/app/test_after_fit.py::test_cnn_registered_model_predicts_new_files_without_the_config",
    ),
    (
        r"models:/digits@champion --data",
        "tests/app/test_after_fit.py::test_cnn_registered_model_predicts_new_files_without_the_config",
    ),
    (
        r"test --ckpt_path models:/digits@champion",
        "tests/app/test_after_fit.py::test_validate_and_test_take_the_checkpoints_own_data_and_log_a_confusion_figure",
    ),
    (
        r"validate --ckpt_path models:/digits/1",
        "tests/tracking/test_registry.py::test_validate_from_a_registered_model_equals_the_checkpoint",
    ),
    (
        r"zoo\.tracking log-model",
        "tests/tracking/test_registry.py::test_log_model_from_a_checkpoint_adds_a_version_and_keeps_the_first",
    ),
    (
        r"adapt\.lora\.r=4",
        "tests/adapt/test_adapt_families.py::test_a_lora_fit_through_the_cli_registers_a_merged_model_that_predicts_as_its_checkpoint",
    ),
    (r"autoencoder_shapes\.yaml", "minutes of CPU"),
    (
        r"latent_flow_dit_shapes\.yaml",
        "tests/diffusion/test_latent.py::test_the_tiny_latent_config_trains_on_weights_from_a_path_given_on_the_command_line",
    ),
    (
        r"^python cli\.py predict --ckpt_path <last\.ckpt>",
        "tests/diffusion/test_diffusion_use.py::test_predict_writes_a_readable_png_per_sample_and_a_grid",
    ),
    (r"bench/(latent|diffusion)_quality\.py", "minutes of CPU"),
    (r"ddpm_unet_shapes\.yaml$", "minutes of CPU"),
    (
        r"registered_model_name=shapes-ddpm",
        "tests/tracking/test_registry.py::test_every_family_logs_a_model_that_rebuilds_its_module",
    ),
    (
        r"models:/shapes-ddpm/1",
        "tests/tracking/test_scoring_server.py::test_every_family_is_served_as_it_answers_in_process",
    ),
    (r"^python cli\.py fit --config configs/gpt/gpt_char_shakespeare\.yaml$", "minutes of CPU"),
    (r"^python cli\.py fit --config configs/gpt/chat_arithmetic\.yaml$", "minutes of CPU"),
    (
        r"predict --config configs/gpt/gpt_char_shakespeare\.yaml --ckpt_path",
        "tests/gpt/test_gpt_use.py::test_predict_from_a_prompts_file_without_the_corpus",
    ),
    (
        r"registered_model_name=shakespeare-char",
        "tests/gpt/test_gpt_use.py::test_the_logged_model_scores_and_continues_new_text_with_its_own_characters",
    ),
    (
        r"models:/shakespeare-char/1",
        "tests/gpt/test_gpt_use.py::test_the_logged_model_scores_and_continues_new_text_with_its_own_characters",
    ),
    (
        r"data\.init_args\.path=my_book\.txt",
        "tests/test_docs.py::test_the_first_page_trains_and_prompts_a_gpt_on_a_text_file",
    ),
    (
        r"--ckpt_path runs/<experiment>/<run>/checkpoints/last\.ckpt",
        "tests/test_docs.py::test_the_first_page_trains_and_prompts_a_gpt_on_a_text_file",
    ),
    (
        r"^mlflow models serve",
        "tests/tracking/test_scoring_server.py::test_every_family_is_served_as_it_answers_in_process",
    ),
    (
        r"^curl -s localhost:5001/invocations",
        "tests/tracking/test_scoring_server.py::test_every_family_is_served_as_it_answers_in_process",
    ),
    (r"^mlflow server --host", "a running server"),
    (r"^MLFLOW_TRACKING_URI=http", "tests/tracking/test_mlflow.py::test_tracking_server_from_env"),
    (
        r"registered_model_name=cartpole-ppo",
        "tests/tracking/test_export_policy.py::test_a_registered_agent_exports_by_name_and_acts_as_trained",
    ),
    (r"models:/cartpole-ppo/1 --data", "tests/rl/test_rl_use.py::test_play_writes_every_episode_and_a_video_of_one"),
    (
        r"zoo\.rl\.export runs/",
        "tests/rl/test_rl_export.py::test_checkpoint_exports_through_the_entry_point_and_plays_with_torch_alone",
    ),
    (
        r"zoo\.tracking export-policy",
        "tests/tracking/test_export_policy.py::test_a_registered_agent_exports_by_name_and_acts_as_trained",
    ),
    (
        r"torch\.export\.load\('policy\.pt2'\)",
        "tests/rl/test_rl_export.py::test_checkpoint_exports_through_the_entry_point_and_plays_with_torch_alone",
    ),
    (r"configs/trainer/(ddp|fsdp)\.yaml", "a GPU"),
    (
        r"clip/wiseft_tiny\.yaml",
        "tests/callbacks/test_wiseft.py::test_clip_sweep_logs_table_and_plot_and_registers_the_chosen_point",
    ),
    (
        r"trainer/wiseft\.yaml",
        "tests/callbacks/test_wiseft.py::test_cnn_sweep_on_its_family_metric_is_tested_and_resumes_with_its_start",
    ),
    (
        r"zoo\.train\.parallel runs/",
        "tests/app/test_strategies.py::test_fsdp2_two_processes_train_checkpoint_consolidate_reload",
    ),
    (r"^(torchrun|srun) ", "several machines"),
    (
        r"^python cli\.py test --ckpt_path <last\.ckpt> --data datamodules\.TaskDataModule",
        "tests/gpt/test_gpt_tasks.py::test_cli_test_scores_a_task_file_from_the_checkpoint_alone",
    ),
    (
        r"^python -m zoo\.gpt lm-eval <last\.ckpt> (?!.*--apply-chat-template)",
        "tests/gpt/test_gpt_tasks.py::test_lm_eval_local_task_agrees_with_task_datamodule",
    ),
    (
        r"^python -m zoo\.tracking lm-eval models:/",
        "tests/gpt/test_gpt_tasks.py::test_lm_eval_on_a_registered_model_equals_its_checkpoint",
    ),
    (
        r"^python -m zoo\.gpt lm-eval .*--apply-chat-template",
        "tests/gpt/test_gpt_tasks.py::test_lm_eval_chat_agrees_with_task_datamodules_chat",
    ),
    (
        r"configs/gpt/grpo_arithmetic\.yaml --model\.init_args\.init_weights=<",
        "tests/gpt/test_grpo.py::test_the_grpo_config_fits_through_the_cli_from_given_weights",
    ),
    (
        r"configs/gpt/grpo_arithmetic_llama\.yaml",
        "tests/gpt/test_grpo_llama.py::test_the_grpo_config_runs_from_a_llama_folder_with_lora_and_registers",
    ),
    (
        r"^python cli\.py (fit --config grpo\.yaml|test --ckpt_path <best\.ckpt> .*TaskDataModule)",
        "tests/test_docs.py::test_grpo_on_your_own_chat_files_runs_as_the_manual_shows",
    ),
    (
        r"configs/gpt/grpo_guess_number\.yaml|^python cli\.py test --ckpt_path <best\.ckpt>$",
        "tests/gpt/test_episodes.py::test_the_env_config_fits_and_tests_through_the_cli",
    ),
    (
        r"configs/gpt/dpo_tiny\.yaml --data\.init_args\.path",
        "tests/gpt/test_dpo.py::test_the_tiny_dpo_config_fits_through_the_cli",
    ),
    (
        r"registered_model_name=arith-|--ckpt_path models:/arith-dpo/1",
        "tests/gpt/test_assistant_stages.py::test_base_sft_dpo_stages_report_one_card_and_a_task_evaluation_fills_it",
    ),
    (r"^python bench/assistant\.py", "minutes of CPU"),
    (
        r"^python -m zoo\.gpt serve ",
        "tests/gpt/test_serve_cli.py::test_an_imported_llama_folder_streams_its_greedy_generate_answer",
    ),
    (
        r"^python -m zoo\.tracking serve models:/",
        "tests/gpt/test_serve_cli.py::test_a_registered_model_streams_by_name_with_its_own_generation_defaults",
    ),
    (r"^curl -s localhost:8000/v1/", "a running server"),
    (r"^python bench/serve\.py", "minutes of CPU"),
    # README.md's two commands: CI's (.ci/run runs them as written; its other commands are the manual's).
    (
        r"^python3 -m venv \.venv && |^pip install -c constraints\.txt -e \"\.\[test\]\" && python -m pytest$",
        "tests/test_readme.py::test_ci_runs_the_readme_commands_as_written_the_first_on_a_base_install",
    ),
    (r"^python bench/grpo_race\.py", "minutes of CPU"),
    (r"^python bench/agentic_race\.py", "minutes of CPU"),
    (r"^python bench/serve_engine\.py", "minutes of CPU"),
    (r"^python bench/agentic\.py", "minutes of CPU"),
    (r"^python bench/agentic_tasks\.py", "minutes of CPU"),
]


def manual_commands() -> list[tuple[str, str]]:
    """(page, command) for every command line in the manual's and the README's bash blocks, continuations joined."""
    found = []
    for page in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                line = " ".join(line.split("  #")[0].split())  # a trailing comment is prose
                if line and not line.startswith("#"):
                    found.append((page.name, line))
    return found


def test_the_manual_builds_with_warnings_as_errors(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()


def test_every_command_in_the_manual_is_run_by_a_test_or_says_what_it_needs():
    used = set()
    for page, command in manual_commands():
        rules = [(i, how) for i, (pattern, how) in enumerate(COVERED) if re.search(pattern, command)]
        assert len(rules) == 1, f"{page}: {command!r} matches {len(rules)} rules of tests/test_docs.py's COVERED"
        used.add(rules[0][0])
    assert used == set(range(len(COVERED))), [COVERED[i][0] for i in set(range(len(COVERED))) - used]
    for _, how in COVERED:
        if how in NEEDS:
            continue
        file, _, name = how.partition("::")
        assert f"def {name}(" in (ROOT / file).read_text(), f"{how} names no test"


def test_the_first_page_trains_and_prompts_a_gpt_on_a_text_file(tmp_path):
    """docs/index.md as written, on the tiny config: fit on a text file of one's own, prompt the checkpoint with no
    YAML, score another file, and load it in Python."""
    from zoo.gpt import CausalLMModule

    text = "It was the best of times, it was the worst of times, it was the age of wisdom.\n" * 40
    (tmp_path / "my_book.txt").write_text(text)
    (tmp_path / "other.txt").write_text(text[:900])
    tiny = str(CONFIGS / "gpt" / "gpt_tiny.yaml")
    fit = cli("fit", "--config", tiny, f"--data.init_args.path={tmp_path / 'my_book.txt'}", "--trainer.max_steps=4")
    last = fit.trainer.checkpoint_callback.last_model_path
    cli(
        "predict",
        f"--ckpt_path={last}",
        '--data.init_args.prompts=["Once upon a time"]',
        "--model.init_args.generation.max_new_tokens=5",
    )
    rows = output("predictions.jsonl").read_text().splitlines()
    assert len(rows) == 1 and '"prompt": "Once upon a time"' in rows[0]
    scored = cli("test", f"--ckpt_path={last}", f"--data.init_args.test_path={tmp_path / 'other.txt'}")
    assert float(scored.trainer.callback_metrics["test/loss"]) > 0
    model = CausalLMModule.load_from_checkpoint(last)
    assert isinstance(model.generate(["Once upon a time"], max_new_tokens=5)[0], str)


def test_the_parity_page_reruns_every_test_it_cites():
    """docs/parity.md's figures each name the test measuring them; its command reruns exactly those files (the suite
    runs them too), so a row cannot cite a test that is gone or that the command leaves out."""
    command = next(c for p, c in manual_commands() if p == "parity.md")
    files = command.split()[3:]
    assert files and all((ROOT / f).is_file() for f in files)
    cited = set(re.findall(r"`(test_\w+\.py)`", (DOCS / "parity.md").read_text()))
    assert cited == {f.rsplit("/", 1)[1] for f in files}


def test_print_config_prints_every_option_resolved(capsys):
    with pytest.raises(SystemExit) as done:
        cli("fit", "--config", str(CONFIGS / "cnn" / "convnet_digits.yaml"), "--print_config")
    printed = capsys.readouterr().out
    assert done.value.code in (0, None) and "class_path: zoo.cnn.ClassifierModule" in printed
    assert "class_path: datamodules.DigitsDataModule" in printed and "batch_size:" in printed


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_every_page_is_in_the_menu(page):
    assert f": {page}" in (ROOT / "mkdocs.yml").read_text()


@pytest.mark.slow  # transformers writes a tiny folder, a two-step GRPO fit with LoRA into MLflow, a test: ~40 s
def test_grpo_on_your_own_chat_files_runs_as_the_manual_shows(tmp_path, monkeypatch):
    """docs/gpt-tune.md's GRPO on a user's own chat records with ``Answer: ...`` replies: its grpo.yaml and its two
    commands as written (the answer rule on the command line, with its ": "), on a tiny Llama-style folder in place
    of Llama-3.2-1B-Instruct and a few steps."""
    import json
    import shlex
    import textwrap

    pytest.importorskip("peft")
    from conftest import fit_in_folder

    from bench import assistant
    from zoo.gpt.tune.rewards import ExactMatch, FormatCheck

    monkeypatch.setattr(assistant, "TASK", {"digits": 1, "terms": 2, "ops": "+", "train": 8, "pairs": 0, "test": 2})
    monkeypatch.setattr(assistant, "SIZE", {"layers": 1, "width": 32})
    folder = str(assistant.build_llama(tmp_path, 0))
    page = (DOCS / "gpt-tune.md").read_text()
    yaml = re.search(r"```yaml\n( *# grpo\.yaml \(yours\).*?)```", page, re.S)[1]
    (tmp_path / "grpo.yaml").write_text(textwrap.dedent(yaml).replace("Llama-3.2-1B-Instruct", folder))
    (fit_line,) = [c for _, c in manual_commands() if "grpo.yaml" in c]
    (test_line,) = [c for _, c in manual_commands() if "<best.ckpt>" in c and "Llama-3.2-1B-Instruct" in c]
    cities = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Peru", "Lima")]
    for name, part in (("train", cities[:3]), ("val", cities[1:])):
        chats = [
            {
                "messages": [
                    {"role": "user", "content": f"Capital of {country}?"},
                    {"role": "assistant", "content": f"It is {city}.\nAnswer: {city}"},
                ]
            }
            for country, city in part
        ]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    test = [{"question": f"Capital of {country}?", "answer": city} for country, city in cities]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in test))
    tiny = ["--model.init_args.group_size=2", "--model.init_args.generation.max_new_tokens=6"]
    tiny += ["--trainer.max_steps=2"]
    tiny += ["--trainer.val_check_interval=2", "--data.init_args.batch_size=2", "--trainer.log_every_n_steps=1"]
    fitted = fit_in_folder(tmp_path, *shlex.split(fit_line)[3:], *tiny)
    assert fitted.cli.datamodule.answer_pattern == "Answer: (.+)" and fitted.trainer.global_step == 2
    assert [type(r) for r in fitted.model.rewards] == [ExactMatch, FormatCheck]
    assert {"val/accuracy", "val/reward", "train/reward"} <= set(fitted.trainer.callback_metrics)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    test_line = test_line.replace("<best.ckpt>", str(fitted.best)).replace("Llama-3.2-1B-Instruct", folder)
    scored = cli(*shlex.split(test_line)[2:], "--data.init_args.max_new_tokens=6")
    assert "test/exact_match" in scored.trainer.callback_metrics
    assert scored.datamodule.answer_pattern == "Answer: (.+)"
