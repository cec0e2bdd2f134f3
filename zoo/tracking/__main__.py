"""``python -m zoo.tracking log-model <ckpt> [--registered_model_name NAME]`` and
``python -m zoo.tracking export-policy <ckpt | models:/... | runs:/...> <out.pt2>`` and
``python -m zoo.tracking verify <models:/... | runs:/...>`` (exit status 0 when every file is as logged and its code is
the installed zoo's) and
``python -m zoo.tracking lm-eval <ckpt | models:/... | runs:/...> --tasks <names>`` (``python -m zoo.gpt lm-eval``'s
options, on a registered model too) and
``python -m zoo.tracking serve <models:/... | runs:/... | ckpt>`` (``python -m zoo.gpt serve``'s OpenAI-compatible
server and options, on a registered model).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from zoo.gpt.__main__ import lm_eval_arguments, serve_arguments
from zoo.tracking.models import load_model, log_checkpoint_model, tracking_uri


def log_model(args) -> None:
    """A checkpoint as an MLflow model, into its own training run when the checkpoint lies in
    ``<root>/<experiment>/<run>/checkpoints``."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

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


def export_policy(args) -> None:
    """An RL agent's deterministic policy as one ``torch.export`` program (``zoo.rl.export``), from a checkpoint or
    a model in MLflow (rebuilt weights-only, its classes checked against the allowlist)."""
    from zoo.errors import InputError
    from zoo.rl.export import export_policy as export

    agent = load_model(args.model)
    if not callable(getattr(agent, "policy", None)):
        raise InputError(f"{args.model} is a {type(agent).__qualname__}, not an RL agent: only agents have a policy")
    print(f"Exported the policy of {args.model} to {export(agent, args.out).resolve()}")


def verify(args) -> None:
    """Whether a logged model is what mlflow.pyfunc.load_model and mlflow models serve should read: every file as the
    manifest recorded when it was logged, and its bundled code the installed zoo's; exit status 0 when so, else 1."""
    from zoo.tracking.code import verify as check

    if not check(args.model, tracking_uri()):
        sys.exit(1)


def lm_eval(args) -> None:
    """lm-evaluation-harness tasks on a GPT checkpoint or registered model, rebuilt weights-only (its classes checked
    against the allowlist) as load_model rebuilds any; the options are python -m zoo.gpt lm-eval's."""
    from zoo.errors import InputError
    from zoo.gpt import CausalLMModule
    from zoo.gpt.__main__ import lm_eval_main  # imports lm-eval, an optional extra

    module = load_model(args.checkpoint)
    if not isinstance(module, CausalLMModule):
        raise InputError(f"{args.checkpoint} is a {type(module).__qualname__}, not a language model (zoo.gpt)")
    lm_eval_main(args, module)


def serve(args) -> None:
    """An OpenAI-compatible server (python -m zoo.gpt serve) of a registered GPT, rebuilt weights-only as load_model
    rebuilds any, its generation defaults the ones it was registered with."""
    from zoo.errors import InputError
    from zoo.gpt import CausalLMModule
    from zoo.gpt.__main__ import serve_main

    module = load_model(args.model)
    if not isinstance(module, CausalLMModule):
        raise InputError(f"{args.model} is a {type(module).__qualname__}, not a language model (zoo.gpt)")
    serve_main(args, module.eval(), served_name(args.model))


def served_name(uri: str) -> str:
    """The name clients call a model by: ``<name>/<version>`` or ``<name>@<alias>`` as given, a run's id, a file's
    stem."""
    if uri.startswith("models:/"):
        return uri.removeprefix("models:/").rstrip("/")
    return uri.removeprefix("runs:/").split("/")[0] if uri.startswith("runs:/") else Path(uri).stem


def main(argv: list[str] | None = None) -> None:
    import argparse

    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = "--verbose" in argv or bool(os.environ.get("ZOO_VERBOSE"))
    argv = [a for a in argv if a != "--verbose"]
    parser = argparse.ArgumentParser(prog="python -m zoo.tracking", epilog="--verbose: the full traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("log-model", help=log_model.__doc__)
    sub.add_argument("ckpt")
    sub.add_argument("--registered_model_name")
    sub.add_argument("--run_id", help="the run to log into (default: the checkpoint's own run, else a new one)")
    sub.add_argument("--class_path", help="the module's class, for a checkpoint not written through cli.py")
    sub.add_argument("--experiment_name", default="zoo")
    sub.set_defaults(run=log_model)
    sub = commands.add_parser("export-policy", help=export_policy.__doc__)
    sub.add_argument("model", help="a checkpoint file, models:/<name>/<version>, models:/<name>@<alias> or runs:/...")
    sub.add_argument("out", help="the .pt2 file to write")
    sub.set_defaults(run=export_policy)
    sub = commands.add_parser("verify", help=verify.__doc__)
    sub.add_argument("model", help="models:/<name>/<version>, models:/<name>@<alias> or runs:/<id>/<path>")
    sub.set_defaults(run=verify)
    sub = commands.add_parser("lm-eval", help=lm_eval.__doc__)
    lm_eval_arguments(sub, "a checkpoint file, models:/<name>/<version>, models:/<name>@<alias> or runs:/...")
    sub.set_defaults(run=lm_eval)
    sub = commands.add_parser("serve", help=serve.__doc__)
    serve_arguments(sub, "models:/<name>/<version>, models:/<name>@<alias>, runs:/... or a checkpoint file")
    sub.set_defaults(run=serve)
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except Exception as err:  # bad input at a terminal: one line naming it; the traceback behind --verbose
        if verbose:
            raise
        from zoo.errors import one_line

        sys.exit(f"error: {one_line(err)}\n(the full traceback: rerun with --verbose)")


if __name__ == "__main__":
    from zoo import watchdog

    watchdog.start()  # Ctrl-C and SIGTERM end the command, whatever it is stuck in
    main()
