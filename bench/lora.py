"""LoRA fine-tuning of an imported Llama-style model: the zoo's LoRA against its full fine-tune and against PEFT on
transformers' model, same weights, data, rank, optimizer and precision.

Arms, each in a fresh process (so each peak is its own), alternating over rounds:
  zoo-full   ``CausalLMModule(init_weights=<folder>)`` through Lightning's Trainer: every weight trains
  zoo-lora   the same with ``adapt: {lora: {r, alpha}}``: LoRA on every hidden linear layer, the rest frozen
  peft       ``peft.get_peft_model(AutoModelForCausalLM.from_pretrained(folder), LoraConfig(r, alpha, the same 7
             projections))`` in a plain PyTorch loop (the peer's fastest case: no Trainer around it)

The folder holds random weights (transformers' ``LlamaConfig``, written once); the data is a learnable sequence
(x[t+1] = (5 x[t] + 3) mod V from random starts) so the loss falls. AdamW at a constant rate, no weight decay;
bf16 autocast on a GPU, fp32 on a CPU. Figures: median step time after 3 warm-up steps, peak memory (GPU: the
allocator's peak; CPU: the process's peak RSS), the last step's loss, trainable parameters.

    python bench/lora.py --size mini --steps 10 --clock cpu     # a few minutes on a 2-core CPU (22M parameters)
    python bench/lora.py --size 1b --steps 30                   # on a GPU: a 1.2B Llama-style model
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

SIZES = {  # LlamaConfig fields
    "tiny": dict(hidden_size=128, intermediate_size=344, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=2048),
    "mini": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
                 num_key_value_heads=2, vocab_size=8000),
    "small": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                  num_key_value_heads=4, vocab_size=32000),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=32000),
}  # fmt: skip
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_folder(folder: Path, size: str) -> None:
    import transformers

    config = transformers.LlamaConfig(**SIZES[size], max_position_embeddings=2048, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)


def batches(vocab: int, batch: int, length: int, steps: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        x = torch.empty(batch, length + 1, dtype=torch.long)
        x[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        for t in range(length):  # the sequence is the point here, not speed: (B,) per step
            x[:, t + 1] = (5 * x[:, t] + 3) % vocab
        out.append((x[:, :-1].to(device), x[:, 1:].to(device)))
    return out


class StepClock:
    """Per-step times (wall, or this process's CPU time with ``--clock cpu``) and losses, the device synchronised at
    both ends of each step."""

    clock = time.perf_counter

    def __init__(self, device) -> None:
        self.device, self.times, self.losses, self.t0 = device, [], [], 0.0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.t0 = self.clock()

    def stop(self, loss: torch.Tensor) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.times.append(self.clock() - self.t0)
        self.losses.append(float(loss))


def run_zoo(folder: Path, args, device, lora: bool) -> dict:
    from lightning.pytorch import Callback, Trainer

    from zoo.adapt import Adaptation, LoRA
    from zoo.gpt import GPT, CausalLMModule
    from zoo.gpt.pretrained import net_kwargs, read_folder
    from zoo.train.optim import AdamWCosine

    _, config = read_folder(folder)
    adapt = Adaptation(lora=LoRA(r=args.rank, alpha=2.0 * args.rank)) if lora else None
    optimizer = AdamWCosine(lr=args.lr, weight_decay=0.0, warmup_steps=0, min_lr_ratio=1.0)
    net = GPT(**net_kwargs(config, folder))
    module = CausalLMModule(net, optimizer=optimizer, init_weights=str(folder), adapt=adapt)
    clock = StepClock(device)

    class Timer(Callback):
        def on_train_batch_start(self, *a) -> None:
            clock.start()

        def on_train_batch_end(self, trainer, pl_module, outputs, *a) -> None:
            clock.stop(outputs["loss"])

    data = batches(config["vocab_size"], args.batch, args.length, args.steps, "cpu")
    trainer = Trainer(
        accelerator=device.type, devices=1, max_steps=args.steps, precision=args.precision, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[Timer()],
    )  # fmt: skip
    trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=None))
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return {"times": clock.times, "losses": clock.losses, "trainable": trainable}


def run_peft(folder: Path, args, device) -> dict:
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).to(device)
    model = peft.get_peft_model(model, peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=TARGETS))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, fused=device.type == "cuda")
    clock = StepClock(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed")
    for x, y in batches(model.config.vocab_size, args.batch, args.length, args.steps, device):
        clock.start()
        with autocast:
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.stop(loss)
    return {"times": clock.times, "losses": clock.losses, "trainable": sum(p.numel() for p in params)}


def child(arm: str, folder: Path, args) -> None:
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result = run_peft(folder, args, device) if arm == "peft" else run_zoo(folder, args, device, arm == "zoo-lora")
    if device.type == "cuda":
        result["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    else:
        result["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--arms", default="zoo-lora,peft,zoo-full")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="cpu: process CPU time (busy machines)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.precision = "bf16-mixed" if args.device.startswith("cuda") else "32-true"
    if args.clock == "cpu":
        StepClock.clock = time.process_time
    if args.child:
        return child(args.child, Path(args.folder), args)
    from bench._common import cpu_model

    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else cpu_model()
    print(f"== LoRA: {args.size} Llama-style, batch {args.batch} x {args.length}, rank {args.rank}, {args.precision}")
    print(f"torch {torch.__version__}; device: {where}; {args.steps} steps, {args.rounds} rounds, arms alternating")
    print(f"threads: {torch.get_num_threads()}; clock: {args.clock}; load average at start: {os.getloadavg()[0]:.2f}")
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        write_folder(Path(tmp), args.size)
        weights = sum(f.stat().st_size for f in Path(tmp).glob("*.safetensors")) / 2**20
        arms = args.arms.split(",")
        for r in range(args.rounds):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                cmd = [sys.executable, __file__, *sys.argv[1:], "--child", arm, "--folder", tmp]
                env = {**os.environ, "PYTHONWARNINGS": "ignore"}
                out = subprocess.run(cmd, capture_output=True, text=True, env=env)
                line = next((s for s in out.stdout.splitlines() if s.startswith("RESULT ")), None)
                if line is None:
                    raise SystemExit(f"{arm} failed:\n{out.stderr[-3000:]}")
                results.setdefault(arm, []).append(json.loads(line[7:]))
    print(f"weights: {weights:.0f} MiB (fp32)")
    print(f"{'arm':10} {'trainable':>12} {'ms/step':>9} {'peak MiB':>9} {'first loss':>10} {'last loss':>9}")
    for arm, runs in results.items():
        ms = statistics.median(t * 1e3 for run in runs for t in run["times"][3:])
        peak = statistics.median(run["peak_mib"] for run in runs)
        first, last = runs[0]["losses"][0], runs[0]["losses"][-1]
        print(f"{arm:10} {runs[0]['trainable']:>12,} {ms:>9.1f} {peak:>9.0f} {first:>10.3f} {last:>9.3f}")


if __name__ == "__main__":
    main()
