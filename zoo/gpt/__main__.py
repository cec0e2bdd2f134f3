"""``python -m zoo.gpt export <lightning.ckpt> <out_folder> [--format gpt2|llama] [--merge]``: a zoo GPT checkpoint as a
Hugging Face model folder (``zoo.gpt.hf`` for GPT-2, ``zoo.gpt.llama`` for Llama, Mixtral and DeepSeek-V3). A
checkpoint with LoRA adapters writes the base model there and the adapters as PEFT's ``<out_folder>/adapter``
(``zoo.gpt.peft_adapter``), or with ``--merge`` one model with the adapters folded in."""

from __future__ import annotations

import argparse
from pathlib import Path

from zoo.adapt import merge
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
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
