"""``python -m zoo.gpt export <lightning.ckpt> <folder> [--format gpt2|llama|phi3] [--merge] [--init-weights <base>]``:
a zoo GPT checkpoint as a whole Hugging Face model folder (``zoo.gpt.export``: the net, its tokenizer files and
chat template, generation_config.json; ``zoo.gpt.formats.hf`` for GPT-2, ``zoo.gpt.formats.llama`` for Llama, Mixtral
and DeepSeek-V3). A checkpoint with LoRA adapters writes the base model there and the adapters as PEFT's
``<out_folder>/adapter`` (``zoo.gpt.formats.peft_adapter``), or with ``--merge`` one model with the adapters folded in.

``python -m zoo.gpt lm-eval <lightning.ckpt> --tasks <names> [--include-path <folder>] [--apply-chat-template]``:
lm-evaluation-harness tasks on the checkpoint (``zoo.gpt.lm_eval``; the optional extra ``eval``), the table printed and
``--output`` a JSON file.

``python -m zoo.gpt serve <lightning.ckpt | folder> [--port 8000]``: an OpenAI-compatible server of the model
(``zoo.gpt.serve``: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/health``, streamed as server-sent
events); a registered model: ``python -m zoo.tracking serve models:/<name>/<version>``.

A LoRA checkpoint leaves its frozen base out: both take it as ``--init-weights`` (the model it was trained on). Bad
input is one ``error:`` line; ``--verbose`` shows the traceback.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from pathlib import Path

from zoo.errors import InputError, MissingBaseError, missing_extra
from zoo.gpt.module import CausalLMModule

BASE_HELP = "the base a LoRA checkpoint was trained on (its init_weights: such checkpoints leave the base out)"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = "--verbose" in argv or bool(os.environ.get("ZOO_VERBOSE"))
    argv = [a for a in argv if a != "--verbose"]
    parser = argparse.ArgumentParser(
        prog="python -m zoo.gpt",
        description="Export a zoo GPT checkpoint as a Hugging Face model folder, or run lm-eval tasks on it.",
        epilog="--verbose: the full traceback of an error",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="Lightning checkpoint -> Hugging Face folder")
    exp.add_argument("checkpoint")
    exp.add_argument("folder")
    exp.add_argument(
        "--format",
        choices=["gpt2", "llama", "phi3"],
        default=None,
        help="gpt2: GPT2LMHeadModel; llama: LlamaForCausalLM for MHA/GQA (MixtralForCausalLM with a softmax MoE), "
        "DeepseekV3ForCausalLM for MLA (dense or sigmoid_bias MoE); phi3: Phi3ForCausalLM (fused projections, partial "
        "RoPE, longrope). Default: phi3 for a model fine-tuned from a Phi-3 folder or one only Phi-3 holds, else gpt2 "
        "for learned positions, llama for RoPE",
    )
    exp.add_argument(
        "--merge",
        action="store_true",
        help="fold LoRA adapters into the weights (one model, no PEFT) instead of writing them to <folder>/adapter",
    )
    exp.add_argument("--init-weights", help=BASE_HELP)
    _add_lm_eval(sub)
    srv = sub.add_parser("serve", help="an OpenAI-compatible server of a checkpoint or a Hugging Face folder")
    serve_arguments(srv, "a Lightning checkpoint or a Hugging Face model folder (a registered model: python -m "
                    "zoo.tracking serve models:/<name>/<version>)")  # fmt: skip
    srv.add_argument("--init-weights", help=BASE_HELP)
    args = parser.parse_args(argv)
    try:
        {"lm-eval": lm_eval_main, "serve": serve_main}.get(args.command, export_main)(args)
    except MissingBaseError:
        if verbose:
            raise
        sys.exit(
            f"error: {args.checkpoint} holds LoRA adapters without their frozen base: give the model they were "
            f"trained on, --init-weights <its folder or file>"
        )
    except Exception as err:  # bad input at a terminal: one line naming it; the traceback behind --verbose
        if verbose:
            raise
        from zoo.errors import one_line

        sys.exit(f"error: {one_line(err)}\n(the full traceback: rerun with --verbose)")


def export_main(args) -> None:
    from zoo.gpt.export import export

    given = {"init_weights": args.init_weights} if args.init_weights else {}
    module = CausalLMModule.load_from_checkpoint(args.checkpoint, map_location="cpu", weights_only=True, **given)
    for line in export(module, args.folder, args.format, args.merge):
        print(f"Wrote {line}" if not line.startswith("no ") else f"Note: {line}")


def _add_lm_eval(sub) -> None:
    ev = sub.add_parser("lm-eval", help="lm-evaluation-harness tasks on a Lightning checkpoint")
    lm_eval_arguments(ev, "a Lightning checkpoint (a registered model: python -m zoo.tracking lm-eval)")
    ev.add_argument("--init-weights", help=BASE_HELP)


def lm_eval_arguments(ev: argparse.ArgumentParser, model_help: str) -> None:
    """The lm-eval command's arguments (``zoo.tracking``'s, for registered models, are the same)."""
    ev.add_argument("checkpoint", help=model_help)
    ev.add_argument("--tasks", required=True, help="comma-separated task (or group) names")
    ev.add_argument(
        "--include-path",
        action="append",
        default=[],
        help="a folder of task YAMLs (repeatable); lm-eval runs what they name (!function), so only your own",
    )
    ev.add_argument("--no-builtin-tasks", action="store_true", help="index only the --include-path tasks (faster)")
    ev.add_argument("--num-fewshot", type=int)
    ev.add_argument("--limit", type=float, help="at most this many documents per task (a fraction if < 1)")
    ev.add_argument("--batch-size", type=int, default=16, help="rows per forward")
    ev.add_argument("--device", default="cpu")
    ev.add_argument("--output", help="write lm-eval's results (metrics per task) to this JSON file")
    ev.add_argument(
        "--apply-chat-template",
        action="store_true",
        help="render each prompt with the model's chat template (a user turn and the generation prompt): an imported "
        "tokenizer's, else the zoo's default format; a multiple-choice choice is then the reply",
    )
    ev.add_argument(
        "--fewshot-as-multiturn",
        choices=["true", "false"],
        help="with --apply-chat-template: few-shot examples as user/assistant turns (default true), or one user turn",
    )
    ev.add_argument("--system-instruction", help="a system prompt (a system turn with --apply-chat-template)")


def lm_eval_main(args, module: CausalLMModule | None = None) -> None:
    """The lm-eval command: ``args.checkpoint``'s model, or ``module`` (already loaded) under that name."""
    import json

    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
        from lm_eval.utils import make_table
    except ImportError:
        raise SystemExit(f"error: {missing_extra('lm_eval', 'python -m zoo.gpt lm-eval')}") from None
    from zoo.gpt.lm_eval import ZooLM

    multiturn = args.fewshot_as_multiturn
    if multiturn is not None and not args.apply_chat_template:
        raise SystemExit("error: --fewshot-as-multiturn needs --apply-chat-template (turns exist in a chat only)")
    base = getattr(args, "init_weights", None)  # zoo.tracking's models are whole: it has no such option
    pretrained = args.checkpoint if module is None else module
    model = ZooLM(pretrained, batch_size=args.batch_size, device=args.device, init_weights=base)  # before the tasks
    manager = TaskManager(include_path=args.include_path or None, include_defaults=not args.no_builtin_tasks)
    results = lm_eval.simple_evaluate(
        model=model,
        tasks=known_tasks(args.tasks, manager.all_tasks, args.no_builtin_tasks),
        task_manager=manager,
        num_fewshot=args.num_fewshot,
        limit=args.limit,
        log_samples=False,
        apply_chat_template=args.apply_chat_template,
        fewshot_as_multiturn=args.apply_chat_template and multiturn != "false",
        system_instruction=args.system_instruction,
    )
    print(make_table(results))
    if args.output:
        Path(args.output).write_text(json.dumps(results["results"], indent=2, default=str))
        print(f"Wrote {args.output}")


def serve_arguments(srv: argparse.ArgumentParser, model_help: str) -> None:
    """The serve command's arguments (``zoo.tracking``'s, for registered models, are the same)."""
    srv.add_argument("model", help=model_help)
    srv.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--name", help="the model name clients send (default: the checkpoint's, folder's or model's)")
    srv.add_argument("--max-batch", type=int, default=8, help="requests decoded together at most")
    srv.add_argument("--max-queue", type=int, default=64, help="requests waiting at most; past it: 429")
    srv.add_argument("--max-tokens-cap", type=int, help="generated tokens per choice at most (default: the context)")
    srv.add_argument("--max-prompt-tokens", type=int, help="prompt tokens at most (default: the context - 1)")
    srv.add_argument("--max-n", type=int, default=8, help="choices per request at most")
    srv.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take, queued and decoding")
    srv.add_argument("--device", default="cpu")


def serve_main(args, module: CausalLMModule | None = None, name: str | None = None) -> None:
    """The serve command: ``args.model``'s model, or ``module`` (already loaded) as ``name``."""
    from zoo.gpt.serve import server_for
    from zoo.gpt.serve.app import serve

    if module is None:
        module, path = _served_module(args), Path(args.model).resolve()
        name = path.stem if path.is_file() else path.name
    app, limits = server_for(module.to(args.device), args.name or name, args)
    print(f"Serving {args.name or name} on http://{args.host}:{args.port}/v1 (context {limits.context} tokens)")
    serve(app, args.host, args.port)


def _served_module(args) -> CausalLMModule:
    if args.model.startswith(("models:/", "runs:/")):
        raise InputError(f"{args.model} is an MLflow model: serve it with python -m zoo.tracking serve {args.model}")
    if Path(args.model).is_dir():
        from zoo.gpt.pretrained import from_pretrained

        return from_pretrained(args.model)
    given = {"init_weights": args.init_weights} if args.init_weights else {}
    return CausalLMModule.load_from_checkpoint(args.model, map_location="cpu", weights_only=True, **given).eval()


def known_tasks(names: str, known: list[str], builtin_off: bool = False) -> list[str]:
    """``--tasks`` as a list, each a task, group or tag lm-eval indexed (``known``) or a task YAML file: an unknown
    name is one line naming the closest known ones, before any task loads (lm-eval would load the names before it
    first, datasets and downloads included, then raise a KeyError)."""
    tasks = [t.strip() for t in names.split(",") if t.strip()]
    if not tasks:
        raise SystemExit("error: --tasks names no task: pass --tasks <name>[,<name>...] (python -m lm_eval ls tasks)")
    indexed = set(known)
    for task in tasks:
        if task in indexed or (Path(task).suffix in (".yaml", ".yml") and Path(task).is_file()):
            continue
        near = difflib.get_close_matches(task, known, n=3, cutoff=0.7)
        hint = f"; did you mean {' or '.join(map(repr, near))}?" if near else ""
        where = (
            "the --include-path folders (--no-builtin-tasks)" if builtin_off else "lm-eval's tasks or --include-path"
        )
        raise SystemExit(
            f"error: --tasks {task!r} is not a task, group or tag of {where}{hint} (python -m lm_eval ls tasks lists "
            "them; a task of your own: --include-path <its folder>)"
        )
    return tasks


if __name__ == "__main__":
    from zoo import watchdog

    watchdog.start()  # Ctrl-C and SIGTERM end the command, whatever it is stuck in
    main()
