"""Stage by stage: a run's stage and parent model as tags, and the report card of its lineage.

A run started with ``--trainer.logger.init_args.stage=<name>`` is tagged ``zoo.pipeline_stage``; one whose module
starts from ``init_weights`` is tagged ``zoo.parent_model`` with what the user typed (``models:/...``, ``runs:/...``
or a checkpoint path), and the model versions it registers carry both tags. The lineage of a run follows its parent back
through the runs that trained each parent (``zoo.tracking.models.training_run``) until a parent is not a run's (an
imported folder, say: the first column's source). The report card has one column per stage, oldest first, and one
row per metric the stages are judged by (``ranked_metrics``: ``val/``, ``test/`` and the training loss), each
stage's value being its training run's last, overwritten by the evaluations nested under it (``cli.py test
--ckpt_path models:/...`` runs), the newest last, as nanochat's ``report.md``.
"""

from __future__ import annotations

import math
from typing import Any

from zoo.tracking.models import ranked_metrics, training_run
from zoo.tracking.runs import PARENT_TAG, STAGE_TAG

REPORT_FILE = "report.md"
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


def stage_metrics(client, run) -> dict[str, float]:
    """The run's last metrics, then those of the evaluations nested under it, oldest first (newer ones win)."""
    metrics = dict(run.data.metrics)
    children = client.search_runs(
        [run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'", order_by=["attributes.start_time"]
    )
    for child in children:
        metrics.update(child.data.metrics)
    return metrics


def log_report_card(client, run_id: str, current: dict[str, float] | None = None) -> str | None:
    """The card of the stage ``run_id`` belongs to (its own, or the training run an evaluation is nested under),
    logged to ``run_id`` as ``report.md``; None when its lineage has no stage."""
    tags = client.get_run(run_id).data.tags
    text = report_card(client, tags.get("mlflow.parentRunId") or run_id, current)
    if text is not None:
        client.log_text(run_id, text + "\n", REPORT_FILE)
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


def report_card(client, run_id: str, current: dict[str, float] | None = None) -> str | None:
    """The card of ``run_id``'s lineage, None when no run of it has a stage; ``current``: metrics of the run still
    being logged (asynchronously: not all in the store yet), over its own."""
    runs = lineage(client, run_id)
    if not any(STAGE_TAG in run.data.tags for run in runs):
        return None
    columns = []
    for i, run in enumerate(runs):
        metrics = stage_metrics(client, run)
        if i == len(runs) - 1 and current:
            metrics.update(current)
        stage = run.data.tags.get(STAGE_TAG) or run.info.run_name or run.info.run_id[:8]
        columns.append((stage, metrics))
    return card(columns)
