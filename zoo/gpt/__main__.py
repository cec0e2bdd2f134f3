"""``python -m zoo.gpt export <lightning.ckpt> <out_folder> [--format gpt2|llama]``: a zoo GPT checkpoint as a
Hugging Face model folder (``zoo.gpt.hf`` for GPT-2, ``zoo.gpt.llama`` for Llama, Mixtral and DeepSeek-V3)."""

from __future__ import annotations

import argparse

from zoo.gpt.hf import export_gpt2
from zoo.gpt.llama import export_hf
from zoo.gpt.module import CausalLMModule


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
    args = parser.parse_args()
    module = CausalLMModule.load_from_checkpoint(args.checkpoint, map_location="cpu", weights_only=True)
    if args.format == "llama":
        print(f"Wrote {export_hf(module.net, args.folder)}")
        return
    eos = module.tokenizer.eos_id if module.tokenizer is not None else None
    print(f"Wrote {export_gpt2(module.net, args.folder, eos)}")


if __name__ == "__main__":
    main()
