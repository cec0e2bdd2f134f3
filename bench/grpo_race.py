"""GRPO race: TRL's ``GRPOTrainer`` against the zoo's ``GRPOModule`` on the same model, task, reward and settings:
learner steps and CPU seconds to a held-out accuracy.

The model: a byte-level zoo GPT (EOS 256) given by ``--init``: a zoo ``.ckpt`` (say the SFT stage's, of
``chat_arithmetic.yaml``), a safetensors file of a Llama-shaped net with ``--shape``, or a Hugging Face folder;
written once as a Hugging Face folder, ``LlamaForCausalLM`` for a RoPE net (``zoo.gpt.formats.llama.export_hf``), else
``GPT2LMHeadModel`` (``zoo.gpt.formats.hf.export_gpt2``). TRL loads that folder with transformers; the zoo arm loads the
same folder as its ``init_weights`` through ``configs/gpt/grpo_arithmetic_llama.yaml`` (full weights: ``adapt`` null),
so both start from the same tensors. TRL gets the zoo's byte tokenizer as a transformers tokenizer (``ZooBytes``: id b
is byte b, EOS 256 is its ``eos_token`` and pad), so a completion stops where the zoo's does.

Both arms, the same settings (``SETTINGS`` and the command line):
    prompts        the arithmetic task's training questions (``datamodules.PromptDataModule`` with ``generate``),
                   rendered in the zoo's chat format; TRL gets them as text, which ``ZooBytes`` encodes to the same ids
    reward         exact match of the final answer (``zoo.gpt.tasks.correct``: "#### n", else the last number);
                   TRL's reward function calls the same rule
    sampling       G completions per prompt, temperature, top_p 1, no top_k, max_new_tokens (TRL's
                   max_completion_length), stopping at EOS 256
    objective      --loss-type (grpo), the ratio clipped at 0.2 below and --epsilon-high (0.2) above, std-scaled
                   group advantages, beta 0 (no reference), one pass (num_iterations 1), one optimizer step per
                   batch of B prompts (TRL: per_device_train_batch_size B * G, steps_per_generation 1)
    optimizer      AdamW lr, betas (0.9, 0.999), eps 1e-8, no weight decay, constant rate, no warmup, gradients
                   clipped at norm 1
Two more arms add a score per worked line (``zoo.gpt.tune.rewards.WorkedLines``), the zoo's own recipe for this task:
``zoo-process`` credits each line's score to its tokens (process supervision, per-token advantages, ``--step-credit``);
``trl-process`` gives TRL the same lines' scores the only way its trainer takes them, one number per completion
(their mean, a second reward function beside exact match). ``--arms trl zoo trl-process zoo-process``.
Evaluation, one function for every arm (``accuracy``): greedy replies (the zoo's ``generate``, KV cache) to the first
``--eval-prompts`` held-out questions of the task's test.jsonl, exact match; TRL's weights are copied into a zoo net
for it (``hf_to_zoo``). Every ``--eval-every`` learner steps; the first evaluation at or above ``--target`` is the
hit, and the run stops there. Time: CPU seconds of the run's process and its children (``--clock cpu``, the
default: user + system time, which time-slicing on a busy machine does not inflate) or wall seconds, from the first
training step, evaluations taken out. Each run is a fresh process with ``--threads`` intra-op threads,
``--processes`` at a time; arms alternate (trl seed 0, zoo seed 0, zoo seed 1, trl seed 1, ...).

    python bench/grpo_race.py --init <sft.ckpt> --target 0.3 --max-steps 200 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench._common import QUIET_FIT, cpu_model, race_process, race_runs, table  # noqa: E402

ZOO_CONFIG = "configs/gpt/grpo_arithmetic_llama.yaml"
SETTINGS = {
    "group_size": 8, "temperature": 1.0, "lr": 1e-4, "max_new_tokens": 48, "batch_prompts": 8, "loss_type": "grpo",
    "epsilon_high": 0.2, "step_credit": "later",
}  # fmt: skip
TASK = {"digits": 1, "terms": 3, "ops": "+-", "train": 2000, "pairs": 0, "test": 200, "seed": 0}
EOS = 256
SETTING_HELP = {
    "loss_type": "grpo, dr_grpo or dapo (both arms)",
    "epsilon_high": "the ratio's clip above 1 (both arms; above 0.2: DAPO's clip-higher)",
    "step_credit": "the zoo-process arm's: later or own (GRPOModule's loss.step_credit)",
}
# the zoo's arms: "zoo" with TRL's reward alone; "zoo-process" adds a score per worked line (process supervision,
# which TRL's GRPOTrainer has no way to credit per token): the zoo's own recipe for this task
ZOO_REWARDS = {
    "zoo": [{"class_path": "zoo.gpt.tune.rewards.ExactMatch"}],
    "zoo-process": [
        {"class_path": "zoo.gpt.tune.rewards.ExactMatch"},
        {"class_path": "zoo.gpt.tune.rewards.WorkedLines"},
    ],
}
# TRL's arms: "trl-process" gets the same two rewards, the lines' as one number per completion (their mean score,
# what the zoo logs as WorkedLines' reward): the most TRL's trainer can take of them
TRL_ARMS = ("trl", "trl-process")
ARMS = (*TRL_ARMS, *ZOO_REWARDS)


# -- the model, the task and the evaluation, shared by both arms --------------------------------------------------


def export_start(init: str, folder: Path, shape: dict) -> Path:
    """The starting net as a Hugging Face folder (Llama for a RoPE net, else GPT-2, EOS 256): a folder as it is,
    else a zoo ``.ckpt``'s net or a safetensors file of a Llama-shaped GPT of ``shape`` exported."""
    from zoo.gpt import GPT, RMSNorm, SwiGLU
    from zoo.gpt.formats.hf import export_gpt2, load_safetensors
    from zoo.gpt.formats.llama import export_hf
    from zoo.gpt.module import CausalLMModule

    if Path(init).is_dir():
        return Path(init)
    if init.endswith(".safetensors"):
        net = GPT(vocab_size=EOS + 1, position="rope", norm=RMSNorm, mlp=SwiGLU, bias=False, **shape)
        net = load_safetensors(net, init)
    else:
        net = CausalLMModule.load_from_checkpoint(init, map_location="cpu", weights_only=True).net
    return export_hf(net, folder) if net.position == "rope" else export_gpt2(net, folder, EOS)


def zoo_net(folder: str):
    """The folder's net as a zoo GPT, and the function that renames its transformers state dict into the net's."""
    from zoo.gpt.formats import hf, llama
    from zoo.io.files import read_config

    if read_config(Path(folder) / "config.json").get("model_type") == "gpt2":
        return hf.load_gpt2(folder), hf.hf_to_zoo
    return llama.load_hf(folder), llama.hf_to_zoo


def prompts(task_dir: Path, task: dict) -> tuple[list[tuple[str, str]], list[tuple[list[int], str]]]:
    """The training prompts as (text, answer) and the held-out ones, test.jsonl's, as (ids, answer), as
    PromptDataModule reads them (the training ones are its training split of sft.jsonl, the zoo arm's)."""
    from datamodules import PromptDataModule
    from datamodules.arithmetic import ArithmeticTask

    dm = PromptDataModule(str(task_dir), tokenizer="bytes", generate=ArithmeticTask(**task))
    dm.prepare_data()
    dm.setup()
    test = str(Path(task_dir) / "test.jsonl")
    held_out = PromptDataModule(test, tokenizer="bytes", val_path=test)
    held_out.setup()
    return [(dm.tokenizer.decode(ids), a) for ids, a in dm.train_set], list(held_out.val_set)


@torch.no_grad()
def accuracy(net, held_out: list[tuple[list[int], str]], max_new_tokens: int, batch: int = 50) -> float:
    """Greedy exact match of ``net`` on the held-out prompts."""
    from zoo.gpt.generate import generate
    from zoo.gpt.tasks import correct
    from zoo.io.tokenizers import ByteTokenizer

    tok, hits, training = ByteTokenizer(), 0, net.training
    net.eval()
    for i in range(0, len(held_out), batch):
        rows = held_out[i : i + batch]
        out = generate(net, [torch.tensor(ids) for ids, _ in rows], max_new_tokens, 0.0, stop_ids=(EOS,))
        hits += sum(correct(tok.decode(o.tolist()), a) for o, (_, a) in zip(out, rows))
    net.train(training)
    return hits / len(held_out)


def cpu_seconds() -> float:
    """User + system time of this process and its finished children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class Race:
    """One run's evaluations every ``every`` learner steps, the clock without them, and the hit."""

    def __init__(self, held_out, every: int, target: float, max_new_tokens: int, clock: str) -> None:
        self.held_out, self.every, self.target, self.max_new_tokens = held_out, every, target, max_new_tokens
        self.read = cpu_seconds if clock == "cpu" else time.perf_counter
        self.out, self.t0 = 0.0, None
        self.evals: list[tuple[int, float, float]] = []  # (step, accuracy, seconds)
        self.hit: dict | None = None

    def evaluate(self, net) -> float:
        """The score the target is set on: greedy exact match on the held-out prompts."""
        return accuracy(net, self.held_out, self.max_new_tokens)

    def start(self, net) -> None:
        self.evals.append((0, self.evaluate(net), 0.0))
        self.t0 = self.read()

    def step(self, steps: int, net) -> bool:
        """After learner step ``steps``: evaluate when due; True once the target is hit."""
        if steps % self.every:
            return False
        paused = self.read()
        seconds = paused - self.t0 - self.out
        acc = self.evaluate(net)
        self.evals.append((steps, acc, seconds))
        if acc >= self.target and self.hit is None:
            self.hit = {"steps": steps, "seconds": seconds, "accuracy": acc}
        self.out += self.read() - paused
        return self.hit is not None

    def result(self, arm: str, seed: int) -> dict:
        return {"arm": arm, "seed": seed, "hit": self.hit, "evals": self.evals, "threads": torch.get_num_threads()}


# -- TRL's arm ------------------------------------------------------------------------------------------------------


def zoo_bytes():
    """The zoo's ByteTokenizer as a transformers tokenizer: id b is byte b, EOS 256 (also pad), no BOS."""
    from transformers import PreTrainedTokenizer

    eos = "<|eos|>"

    class ZooBytes(PreTrainedTokenizer):
        model_input_names = ["input_ids", "attention_mask"]

        def __init__(self, **kwargs) -> None:
            super().__init__(eos_token=eos, pad_token=eos, **kwargs)

        @property
        def vocab_size(self) -> int:
            return EOS + 1

        def get_vocab(self) -> dict[str, int]:
            return {chr(i): i for i in range(EOS)} | {eos: EOS}

        def _tokenize(self, text: str, **kwargs) -> list[str]:
            return [chr(b) for b in text.encode("utf-8")]

        def _convert_token_to_id(self, token: str) -> int:
            return EOS if token == eos else ord(token)

        def _convert_id_to_token(self, index: int) -> str:
            return eos if index == EOS else chr(index)

        def convert_tokens_to_string(self, tokens: list[str]) -> str:
            return bytes(ord(t) for t in tokens if t != eos).decode("utf-8", errors="replace")

        def save_vocabulary(self, save_directory, filename_prefix=None) -> tuple:
            return ()

    return ZooBytes()


def exact_match(prompts, completions, answer, **kwargs) -> list[float]:
    """TRL's reward function: the zoo's answer rule (``zoo.gpt.tasks.correct``, GSM8K's by default)."""
    from zoo.gpt.tasks import correct

    return [float(correct(c, a)) for c, a in zip(completions, answer)]


def worked_lines(prompts, completions, answer, **kwargs) -> list[float]:
    """TRL's reward function for the lines: ``zoo.gpt.tune.rewards.WorkedLines``' mean score per completion."""
    from zoo.gpt.tune.rewards import WorkedLines

    return WorkedLines()(completions, answer)


def trl_run(job: dict) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    s, model_dir = job["settings"], job["model"]
    train, held_out = prompts(Path(job["task"]), job["task_settings"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.generation_config.update(eos_token_id=EOS, pad_token_id=EOS, bos_token_id=None)  # the zoo model's stop
    net, to_zoo = zoo_net(model_dir)  # the evaluation's net: TRL's weights copied in
    race = Race(held_out, job["eval_every"], job["target"], s["max_new_tokens"], job["clock"])
    g = s["group_size"]
    config = GRPOConfig(
        output_dir=str(Path(job["work"]) / f"trl-{job['seed']}"), use_cpu=True, report_to="none", save_strategy="no",
        seed=job["seed"], max_steps=job["max_steps"], logging_steps=10**9, disable_tqdm=True, bf16=False,
        per_device_train_batch_size=s["batch_prompts"] * g, steps_per_generation=1, num_generations=g,
        max_completion_length=s["max_new_tokens"], temperature=s["temperature"], top_p=1.0, top_k=0,
        learning_rate=s["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9,
        adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, beta=0.0, loss_type=s["loss_type"],
        scale_rewards="group", num_iterations=1, epsilon=0.2, epsilon_high=s["epsilon_high"], dataloader_num_workers=0,
    )  # fmt: skip

    class Evaluations(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            race.start(net)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % race.every == 0:
                net.load_state_dict(to_zoo(model.state_dict(), net))
            if race.step(state.global_step, net):
                control.should_training_stop = True

    data = Dataset.from_list([{"prompt": p, "answer": a} for p, a in train])
    rewards = [exact_match, worked_lines] if job["arm"] == "trl-process" else exact_match
    trainer = GRPOTrainer(
        model=model, reward_funcs=rewards, args=config, train_dataset=data, processing_class=zoo_bytes(),
        callbacks=[Evaluations()],
    )  # fmt: skip
    trainer.train()
    keys = ("eos_token_id", "pad_token_id", "do_sample", "temperature", "top_p", "top_k", "max_new_tokens")
    generation = {k: getattr(trainer.generation_config, k) for k in keys}
    return race.result(job["arm"], job["seed"]) | {"generation": generation}


# -- the zoo's arm --------------------------------------------------------------------------------------------------


def zoo_run(job: dict) -> dict:
    from lightning.pytorch import Callback

    from cli import main

    s = job["settings"]
    args = [
        "--config", str(ROOT / ZOO_CONFIG), f"--seed_everything={job['seed']}", f"--data.init_args.seed={job['seed']}",
        f"--model.init_args.init_weights={job['model']}", "--model.init_args.adapt=null",
        f"--model.init_args.rewards={json.dumps(ZOO_REWARDS[job['arm']])}",
        f"--model.init_args.group_size={s['group_size']}", f"--model.init_args.temperature={s['temperature']}",
        f"--model.init_args.generation.max_new_tokens={s['max_new_tokens']}", "--model.init_args.top_p=null",
        f"--model.init_args.loss.loss_type={s['loss_type']}", f"--model.init_args.loss.clip_high={s['epsilon_high']}",
        f"--model.init_args.loss.step_credit={s['step_credit']}", "--model.init_args.loss.beta=0.0",
        "--model.init_args.num_iterations=1",
        f"--model.init_args.optimizer.lr={s['lr']}", "--model.init_args.optimizer.betas=[0.9, 0.999]",
        "--model.init_args.max_grad_norm=1.0", "--data.init_args.tokenizer=bytes",
        f"--data.init_args.path={job['task']}", f"--data.init_args.batch_size={s['batch_prompts']}",
        *(f"--data.init_args.generate.{k}={v}" for k, v in job["task_settings"].items()),
        f"--trainer.max_steps={job['max_steps']}", *QUIET_FIT,
    ]  # fmt: skip
    _, held_out = prompts(Path(job["task"]), job["task_settings"])
    race = Race(held_out, job["eval_every"], job["target"], s["max_new_tokens"], job["clock"])

    class Evaluations(Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            race.start(pl_module.net)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if race.step(trainer.global_step, pl_module.net):
                trainer.should_stop = True

    cli = main(args, run=False)
    cli.trainer.callbacks.append(Evaluations())
    cli.trainer.fit(cli.model, cli.datamodule)
    return race.result(job["arm"], job["seed"])


def _one(job: dict) -> dict:
    race_process(job["threads"])
    sys.path.insert(0, str(ROOT))
    r = trl_run(job) if job["arm"] in TRL_ARMS else zoo_run(job)
    print(f"  {r['arm']} seed {r['seed']}: hit {r['hit']}; evaluations (step, accuracy, s) {r['evals']}", flush=True)
    return r


# -- the report -----------------------------------------------------------------------------------------------------


def summary(results: list[dict], target: float) -> str:
    rows = []
    for arm in ARMS:
        rs = [r for r in results if r["arm"] == arm]
        if not rs:
            continue
        hits = [r["hit"] for r in rs if r["hit"]]
        median = lambda xs: f"{statistics.median(xs):.0f}" if xs else "-"  # noqa: E731
        start, end = (statistics.mean(r["evals"][i][1] for r in rs) for i in (0, -1))
        per_step = statistics.median(r["evals"][-1][2] / r["evals"][-1][0] for r in rs if r["evals"][-1][0])
        rows.append([
            arm, f"{len(hits)} / {len(rs)}", median([h["steps"] for h in hits]), median([h["seconds"] for h in hits]),
            f"{per_step:.3f}", f"{start:.3f}", f"{end:.3f}",
        ])  # fmt: skip
    headers = [
        "arm", f"runs reaching {target}", "learner steps (median)", "seconds (median)", "seconds / step (median)",
        "start acc", "end acc (mean)",
    ]  # fmt: skip
    return table(headers, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--init", required=True, help="a zoo .ckpt or safetensors file of a byte-level GPT, or a Hugging Face folder"
    )
    ap.add_argument(
        "--shape", default='{"n_layer": 2, "n_embd": 64, "n_head": 4, "block_size": 96}',
        help="a safetensors --init's net (JSON): RoPE, RMSNorm, SwiGLU, no biases, tied head, 257 byte ids",
    )  # fmt: skip
    ap.add_argument("--target", type=float, default=0.3, help="held-out greedy exact match to reach")
    ap.add_argument("--max-steps", type=int, default=200, help="learner steps before a run gives up")
    ap.add_argument("--eval-every", type=int, default=10, help="learner steps between evaluations")
    ap.add_argument("--eval-prompts", type=int, default=100, help="held-out questions evaluated")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=["trl", "zoo"])
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--processes", type=int, default=1, help="runs at a time (the CPU clock is per run)")
    for k, v in SETTINGS.items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v, help=SETTING_HELP.get(k))
    for k in ("digits", "terms"):
        ap.add_argument(f"--{k}", type=int, default=TASK[k], help="the task's (must be the SFT model's)")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    TASK.update(digits=args.digits, terms=args.terms, test=args.eval_prompts)
    settings = {k: getattr(args, k) for k in SETTINGS}
    work = Path(args.workdir or tempfile.mkdtemp(prefix="grpo-race-"))
    model = export_start(args.init, work / "model", json.loads(args.shape))
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"== GRPO race: TRL GRPOTrainer vs zoo GRPOModule, from {args.init} ({model})")
    print(f"CPU: {cpu_model()}; {os.cpu_count()} CPUs; load average (1/5/15 min) at start: {load}")
    print(f"settings {json.dumps(settings)}; task {json.dumps(TASK)}; target {args.target}; clock {args.clock}")
    jobs = []
    for i, seed in enumerate(args.seeds):  # alternating: ABBA over seeds
        arms = args.arms if i % 2 == 0 else args.arms[::-1]
        jobs += [
            dict(arm=arm, seed=seed, model=str(model), task=str(work / "task"), task_settings=TASK, work=str(work),
                 settings=settings,
                 target=args.target, max_steps=args.max_steps, eval_every=args.eval_every, clock=args.clock,
                 threads=args.threads)
            for arm in arms
        ]  # fmt: skip
    prompts(work / "task", TASK)  # written once, before the runs read it
    results = list(race_runs(_one, jobs, args.processes))
    print(summary(results, args.target))
    print(f"load average at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
