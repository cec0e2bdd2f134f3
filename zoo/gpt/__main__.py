"""``python -m zoo.gpt export <lightning.ckpt> <out_folder> [--format gpt2|llama] [--merge]``: a zoo GPT checkpoint as a
Hugging Face model folder (``zoo.gpt.hf`` for GPT-2, ``zoo.gpt.llama`` for Llama, Mixtral and DeepSeek-V3). A
checkpoint with LoRA adapters writes the base model there and the adapters as PEFT's ``<out_folder>/adapter``
(``zoo.gpt.peft_adapter``), or with ``--merge`` one model with the adapters folded in.

``python -m zoo.gpt lm-eval <lightning.ckpt> --tasks <names> [--include-path <folder>] [--apply-chat-template]``:
lm-evaluation-harness tasks on the checkpoint (``zoo.gpt.lm_eval``; the optional extra ``eval``), the table printed and
``--output`` a JSON file."""

from __future__ import annotations

import argparse
from pathlib import Path

from zoo.adapt import merge
from zoo.errors import missing_extra
from zoo.gpt.hf import export_gpt2
from zoo.gpt.llama import export_hf
from zoo.gpt.module import CausalLMModule
from zoo.gpt.peft_adapter import lora_layers, plain_layers, save_adapter


def main() -> None:
    parser = argparse.ArgumentParser(description="Export a zoo GPT checkpoint as a Hugging Face model folder.")
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="Lightning checkpoint -> Hugging Face folder")
    exp.add_argument("checkpoint")
    exp.add_argument("folder")
    exp.add_argument(
        "--format",
        choices=["gpt2", "llama"],
        default="gpt2",
        help="gpt2: GPT2LMHeadModel; llama: LlamaForCausalLM for MHA/GQA (MixtralForCausalLM with a softmax MoE), "
        "DeepseekV3ForCausalLM for MLA (dense or sigmoid_bias MoE)",
    )
    exp.add_argument(
        "--merge",
        action="store_true",
        help="fold LoRA adapters into the weights (one model, no PEFT) instead of writing them to <folder>/adapter",
    )
    exp.add_argument(
        "--init-weights",
        help="the base a LoRA checkpoint was trained on (its init_weights: such checkpoints leave the base out)",
    )
    _add_lm_eval(sub)
    args = parser.parse_args()
    if args.command == "lm-eval":
        return lm_eval_main(args)
    given = {"init_weights": args.init_weights} if args.init_weights else {}
    module = CausalLMModule.load_from_checkpoint(args.checkpoint, map_location="cpu", weights_only=True, **given)
    if args.merge and lora_layers(module.net):
        merge(module)
    eos = module.tokenizer.eos_id if module.tokenizer is not None else None
    with plain_layers(module.net):  # the base model: what the adapters, if any, were trained on
        written = (
            export_hf(module.net, args.folder) if args.format == "llama" else export_gpt2(module.net, args.folder, eos)
        )
    print(f"Wrote {written}")
    if lora_layers(module.net):
        print(f"Wrote {save_adapter(module, Path(args.folder) / 'adapter', args.format, base=args.folder)} (PEFT LoRA)")


def _add_lm_eval(sub) -> None:
    ev = sub.add_parser("lm-eval", help="lm-evaluation-harness tasks on a Lightning checkpoint")
    lm_eval_arguments(ev, "a Lightning checkpoint (a registered model: python -m zoo.tracking lm-eval)")


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
    manager = TaskManager(include_path=args.include_path or None, include_defaults=not args.no_builtin_tasks)
    model = ZooLM(args.checkpoint if module is None else module, batch_size=args.batch_size, device=args.device)
    results = lm_eval.simple_evaluate(
        model=model,
        tasks=args.tasks.split(","),
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


if __name__ == "__main__":
    main()
