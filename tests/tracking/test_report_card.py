"""The report card: stages followed through parent models, evaluations nested under their stage each in the rows of
the data it scored, the training run's own card filled by a later evaluation, loops cut."""

from __future__ import annotations

import os
from pathlib import Path

from mlflow.tracking import MlflowClient

from zoo.tracking.models import staged_tags
from zoo.tracking.report import EVALUATED_TAG, PARENT_TAG, STAGE_TAG, lineage, log_report_card, report_card


def _run(client, exp, name, metrics, tags=None, parent=None):
    tags = {**(tags or {}), **({"mlflow.parentRunId": parent} if parent else {})}
    run_id = client.create_run(exp, run_name=name, tags=tags).info.run_id
    for k, v in metrics.items():
        client.log_metric(run_id, k, v)
    client.set_terminated(run_id)
    return run_id


def _version(client, name, run_id):
    try:
        client.create_registered_model(name)
    except Exception:  # it exists
        pass
    return client.create_model_version(name, f"runs:/{run_id}/model", run_id, staged_tags(client.get_run(run_id)))


def test_card_follows_parents_through_the_registry_and_takes_nested_evaluations():
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp = client.create_experiment("stages")
    base = _run(client, exp, "base-run", {"val/loss": 2.0, "train/loss": 2.1, "lr-AdamW": 1e-3},
                {STAGE_TAG: "base", PARENT_TAG: "/some/imported/folder"})  # fmt: skip
    v1 = _version(client, "assistant", base)
    assert v1.tags == {STAGE_TAG: "base", PARENT_TAG: "/some/imported/folder"}
    sft = _run(client, exp, "sft-run", {"val/loss": 1.0}, {STAGE_TAG: "sft", PARENT_TAG: "models:/assistant/1"})
    on = {EVALUATED_TAG: "tasks/test.jsonl"}
    _run(client, exp, "sft-eval-old", {"test/exact_match": 0.1}, on, parent=sft)
    _run(client, exp, "sft-eval", {"test/exact_match": 0.25}, on, parent=sft)
    _version(client, "assistant", sft)
    dpo = _run(client, exp, "dpo-run", {"val/loss": 0.9}, {STAGE_TAG: "dpo", PARENT_TAG: "models:/assistant/2"})

    assert [r.info.run_id for r in lineage(client, dpo)] == [base, sft, dpo]
    text = report_card(client, dpo, current={"test/exact_match": 0.5})
    lines = text.splitlines()
    assert lines[0] == "| metric | base | sft | dpo |"
    assert "| test/exact_match | - | - | 0.5 |" in lines  # the current run's own
    assert "| test/exact_match on tasks/test.jsonl | - | 0.25 | - |" in lines  # the newest evaluation of that file
    assert "| val/loss | 2 | 1 | 0.9 |" in lines
    assert not any("lr-AdamW" in line for line in lines)  # not a metric a stage is judged by

    # An evaluation nested under the sft run reports the sft stage's lineage and logs the card into its own run and
    # into the sft run's, which it fills.
    evaluation = _run(client, exp, "sft-eval-new", {}, on, parent=sft)
    logged = log_report_card(client, evaluation, {"test/exact_match": 0.3})
    assert logged.splitlines()[0] == "| metric | base | sft |"
    assert "| test/exact_match on tasks/test.jsonl | - | 0.3 |" in logged
    for run_id in (evaluation, sft):
        assert Path(client.download_artifacts(run_id, "report.md")).read_text() == logged + "\n"


def test_each_evaluated_file_has_its_own_rows_and_the_newest_of_a_file_wins():
    """The issue's case: a test on the validation prompts after one on the test file took the test file's cell."""
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp = client.create_experiment("files")
    sft = _run(client, exp, "sft-run", {"val/loss": 1.0}, {STAGE_TAG: "sft"})
    _run(client, exp, "on-test", {"test/exact_match": 0.485}, {EVALUATED_TAG: "test.jsonl"}, parent=sft)
    _run(client, exp, "on-val", {"test/exact_match": 0.545}, {EVALUATED_TAG: "val.jsonl"}, parent=sft)
    _run(client, exp, "before-the-tag", {"test/acc": 0.7}, parent=sft)  # says nothing: its rows as they are
    lines = report_card(client, sft).splitlines()
    assert lines[2:] == [
        "| test/acc | 0.7 |",
        "| test/exact_match on test.jsonl | 0.485 |",
        "| test/exact_match on val.jsonl | 0.545 |",
        "| val/loss | 1 |",
    ], lines
    again = _run(client, exp, "on-test-again", {}, {EVALUATED_TAG: "test.jsonl"}, parent=sft)
    logged = log_report_card(client, again, {"test/exact_match": 0.5})  # still logging: its metrics passed
    assert logged.splitlines()[2:] == [lines[2], "| test/exact_match on test.jsonl | 0.5 |", *lines[4:]], logged
    assert Path(client.download_artifacts(sft, "report.md")).read_text() == logged + "\n"


def test_no_stage_no_card_and_a_parent_loop_ends():
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp = client.create_experiment("loops")
    plain = _run(client, exp, "plain", {"val/loss": 1.0})
    assert report_card(client, plain) is None and log_report_card(client, plain) is None
    a = _run(client, exp, "a", {"val/loss": 1.0}, {STAGE_TAG: "a"})
    client.set_tag(a, PARENT_TAG, f"runs:/{a}/model")  # a run written as its own parent
    assert [r.info.run_id for r in lineage(client, a)] == [a]
    b = _run(client, exp, "b", {}, {STAGE_TAG: "b", PARENT_TAG: "models:/no-such-model/9"})  # a parent gone
    assert report_card(client, b).splitlines()[0] == "| metric | b |"


def test_an_evaluation_names_the_file_its_data_scores_else_the_datas_class(tmp_path):
    from datamodules import TaskDataModule, TextDataModule
    from zoo.app.hooks import evaluated_data

    records, text = tmp_path / "val.jsonl", tmp_path / "held_out.txt"
    records.write_text('{"question": "1+1", "answer": "2"}\n')
    text.write_text("some text")
    assert evaluated_data(TaskDataModule(str(records), "exact_match"), "test") == str(records)
    assert evaluated_data(TaskDataModule(str(records), "exact_match"), "validate") == str(records)
    held_out = TextDataModule(str(text), test_path=str(text))
    assert evaluated_data(held_out, "test") == str(text)
    assert evaluated_data(held_out, "validate") == "TextDataModule"  # the corpus's validation split
