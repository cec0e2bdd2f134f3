"""``python -m zoo.tracking log-model <ckpt> [--registered_model_name NAME]``."""

from __future__ import annotations

from pathlib import Path

from zoo.tracking.models import log_checkpoint_model, tracking_uri


def main(argv: list[str] | None = None) -> None:
    """``python -m zoo.tracking log-model <ckpt> [--registered_model_name NAME]``: a checkpoint as an MLflow
    model, into its own training run when the checkpoint lies in ``<root>/<experiment>/<run>/checkpoints``."""
    import argparse

    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    parser = argparse.ArgumentParser(prog="python -m zoo.tracking")
    sub = parser.add_subparsers(dest="command", required=True).add_parser("log-model", help=main.__doc__)
    sub.add_argument("ckpt")
    sub.add_argument("--registered_model_name")
    sub.add_argument("--run_id", help="the run to log into (default: the checkpoint's own run, else a new one)")
    sub.add_argument("--class_path", help="the module's class, for a checkpoint not written through cli.py")
    sub.add_argument("--experiment_name", default="zoo")
    args = parser.parse_args(argv)
    client = MlflowClient(tracking_uri())
    run_id = args.run_id or Path(args.ckpt).resolve().parent.parent.name
    try:
        client.get_run(run_id)
    except MlflowException:
        experiment = client.get_experiment_by_name(args.experiment_name)
        exp_id = experiment.experiment_id if experiment else client.create_experiment(args.experiment_name)
        run_id = client.create_run(exp_id, run_name=f"log-model-{Path(args.ckpt).stem}").info.run_id
        client.set_terminated(run_id)
    print(
        f"MLflow model: {log_checkpoint_model(args.ckpt, client, run_id, args.registered_model_name, args.class_path)}"
    )


if __name__ == "__main__":
    main()
