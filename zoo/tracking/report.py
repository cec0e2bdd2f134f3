"""Stage by stage: a run's stage and parent model as tags, and the report card of its lineage.

A run started with ``--trainer.logger.init_args.stage=<name>`` is tagged ``zoo.pipeline_stage``; one whose module
starts from ``init_weights`` is tagged ``zoo.parent_model`` with what the user typed (``models:/...``, ``runs:/...``
or a checkpoint path), and the model versions it registers carry both tags. The lineage of a run follows its parent back
through the runs that trained each parent (``zoo.tracking.models.training_run``) until a parent is not a run's (an
imported folder, say: the first column's source). The report card has one column per stage, oldest first, and one
row per metric the stages are judged by (``ranked_metrics``: ``val/``, ``test/`` and the training loss), each
stage's value being its training run's last. An evaluation nested under a stage's run (``cli.py test --ckpt_path
models:/...``) is tagged ``zoo.evaluated_on`` with the data it scored (a file, or the data's class), and its metrics
are rows of their own, ``<metric> on <data>``: two files never share a cell, and the newest evaluation of one file
wins, as nanochat's ``report.md``. The card is logged to the evaluation's run and to the training run it fills.
"""

from __future__ import annotations

import math
from typing import Any

from zoo.tracking.models import ranked_metrics, training_run
from zoo.tracking.runs import PARENT_TAG, STAGE_TAG

REPORT_FILE = "report.md"
EVALUATED_TAG = "zoo.evaluated_on"  # what an evaluation scored: the file its data names, else the data's class
_MAX_STAGES = 32  # a parent chain longer than this is a loop someone wrote into tags: stop there


def lineage(client, run_id: str) -> list[Any]:
    """The runs from the first ancestor to ``run_id``'s own run, each the training run of the next one's parent."""
    from mlflow.exceptions import MlflowException

    runs, seen = [], set()
    while run_id and run_id not in seen and len(runs) < _MAX_STAGES:
        seen.add(run_id)
        try:
            run = client.get_run(run_id)
        except MlflowException:
            break
        runs.append(run)
        parent = run.data.tags.get(PARENT_TAG)
        try:
            run_id = training_run(parent, client.tracking_uri) if parent else None
        except (MlflowException, OSError, ValueError):
            run_id = None  # a parent that is no run (a folder, a deleted version): the lineage starts here
    return runs[::-1]


def stage_metrics(client, run, current: dict[str, float] | None = None, current_run: str | None = None) -> dict:
    """The run's last metrics, and those of the evaluations nested under it, oldest first, each under
    ``<metric> on <data>`` (``evaluated_metrics``: the newest of one data wins); ``current``: the metrics of
    ``current_run`` (this run or one nested under it) still being logged, over its stored ones."""
    metrics = dict(run.data.metrics)
    if current and current_run == run.info.run_id:
        metrics.update(current)
    children = client.search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'", order_by=["attributes.start_time"]
    )
    for child in children:
        own = {**child.data.metrics, **(current if current and child.info.run_id == current_run else {})}
        metrics.update(evaluated_metrics(own, child.data.tags.get(EVALUATED_TAG)))
    return metrics


def evaluated_metrics(metrics: dict[str, float], data: str | None) -> dict[str, float]:
    """An evaluation's metrics keyed ``<metric> on <data>``, ``data`` being what it scored; as they are when it
    does not say (an evaluation logged before the tag was)."""
    return {f"{k} on {data}" if data else k: v for k, v in metrics.items()}


def log_report_card(client, run_id: str, current: dict[str, float] | None = None) -> str | None:
    """The card of the stage ``run_id`` belongs to (its own, or the training run an evaluation is nested under),
    logged as ``report.md`` to ``run_id`` and to that training run; None when its lineage has no stage.
    ``current``: ``run_id``'s metrics still being logged (asynchronously: not all in the store yet)."""
    stage_run = client.get_run(run_id).data.tags.get("mlflow.parentRunId") or run_id
    text = report_card(client, stage_run, current, current_run=run_id)
    if text is not None:
        for target in dict.fromkeys((run_id, stage_run)):
            client.log_text(target, text + "\n", REPORT_FILE)
    return text


def card(columns: list[tuple[str, dict[str, float]]]) -> str:
    """A markdown table: a row per metric any stage has (``ranked_metrics`` order), a column per stage."""
    keys = ranked_metrics({k for _, m in columns for k in m})
    head = "| metric | " + " | ".join(name for name, _ in columns) + " |"
    rows = [head, "|" + "---|" * (len(columns) + 1)]
    for key in keys:
        cells = [_cell(m.get(key)) for _, m in columns]
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _cell(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4g}"


def report_card(
    client, run_id: str, current: dict[str, float] | None = None, current_run: str | None = None
) -> str | None:
    """The card of ``run_id``'s lineage, None when no run of it has a stage; ``current``: the metrics of
    ``current_run`` (``run_id`` by default, or an evaluation nested under it) still being logged, over its own."""
    runs = lineage(client, run_id)
    if not any(STAGE_TAG in run.data.tags for run in runs):
        return None
    columns = []
    for run in runs:
        metrics = stage_metrics(client, run, current, current_run or run_id)
        stage = run.data.tags.get(STAGE_TAG) or run.info.run_name or run.info.run_id[:8]
        columns.append((stage, metrics))
    return card(columns)
