"""From a language model to an assistant, offline on a CPU: base -> SFT -> DPO, and SFT -> GRPO, on the generated
arithmetic task.

Every stage is a ``cli.py`` subprocess, as a user types it, into one MLflow store: each fit registers its model
(``registered_model_name``) and carries its stage (``--trainer.logger.init_args.stage``); the next stage starts from
``models:/<name>/<version>``, whose net is built as that model stores it (no net is written here). Each stage is
then scored with ``cli.py test --ckpt_path models:/... --data datamodules.TaskDataModule`` on the task's held-out
``test.jsonl`` (exact match of the greedy reply's ``#### n``, chat prompts) and ``mc.jsonl`` (multiple choice by
log-likelihood). Printed: the report card of the last seed's lineage (``zoo.tracking.report``) and a table of stage x
(exact match, acc) as mean ± std over seeds, with the CPU minutes each stage's subprocesses used (their user + system
time, which a busy machine does not inflate).

Tracks:
  - ``zoo``: the byte-level GPT of ``configs/gpt/arithmetic_base.yaml`` pretrained on the task's plain text, then
    ``chat_arithmetic.yaml`` (full-weight SFT), ``dpo_tiny.yaml`` (DPO against the SFT weights) and
    ``grpo_arithmetic.yaml`` (stage "rl": GRPO from the SFT weights, exact-match reward), and ``sft_more``:
    ``chat_arithmetic.yaml`` again from the SFT model, for the rl stage's CPU seconds (fit and evaluations; or
    ``--sft-more-cpu``: the steps from the sft stage's CPU per step), validated every 250 steps, the best by validation
    loss registered and scored: the compute-matched row GRPO must beat, not only the SFT it started from.
  - ``llama``: a tiny Llama-style folder written here with random weights (transformers' ``LlamaConfig``) and real
    tokenizer files (a byte-level BPE trained on the task's text with ``tokenizers``, and a Llama-3-style chat
    template with its special tokens), nothing downloaded; its base is registered as imported (one step at learning
    rate 1e-30: LoRA's B moves by 1e-30, which no float32 weight notices, and ``cli.py test`` takes a checkpoint's
    tokenizer) and scored, then SFT with LoRA, then DPO with LoRA
    (the reference: the same net with its adapters off, i.e. the SFT weights); no rl stage.

The task's data is the same for every seed (``generate.seed`` 0); a seed changes the initialisation and the batches.

    python bench/assistant.py --track zoo --seeds 0 1 2     # minutes of CPU per seed
    python bench/assistant.py --track zoo --seeds 0 --stages base sft sft_more --sft-more-cpu 960  # rl's 16 CPU min
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import cpu_model, table  # noqa: E402

TASK = {"digits": 1, "terms": 4, "ops": "+-", "train": 8000, "pairs": 2000, "test": 500, "seed": 0}
STAGES = ["base", "sft", "dpo", "rl", "sft_more"]  # the stages run, set from --stages
# DPO, GRPO and more SFT all start from the SFT model; sft_more is SFT continued for GRPO's CPU time (the
# compute-matched row a later stage must beat, not only the SFT it started from)
PARENT = {"sft": "base", "dpo": "sft", "rl": "sft", "sft_more": "sft"}
EVALS = {"test.jsonl": "exact_match", "mc.jsonl": "multiple_choice"}
LLAMA3 = (
    "{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + "
    "m['content'] | trim + '<|eot_id|>' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Lightning's box of test metrics (the report card's rows, "| test/acc | <base> | ...", are not this run's)
METRIC = re.compile(r"│\s*(test/[\w/]+)\s*│\s*(-?[\d.eE+-]+)\s*│")


def cpu_seconds() -> float:
    """User + system time of the finished subprocesses so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def cli(folder: Path, *args: str) -> str:
    """``python cli.py <args>`` run in ``folder`` into its MLflow store; its output (stdout and stderr)."""
    env = os.environ | {"MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *args], cwd=folder, env=env, capture_output=True, text=True
    )
    if proc.returncode:
        raise SystemExit(f"cli.py {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def registered(output: str) -> str:
    found = re.findall(r"= (models:/\S+/\d+)", output)
    if not found:
        raise SystemExit(f"no registered model in the fit's output:\n{output[-2000:]}")
    return found[-1]


def test_metrics(output: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for line in output.splitlines() if (m := METRIC.search(line))}


def card_of(output: str) -> str:
    if "Report card" not in output:
        return "(no report card)"
    lines = output[output.rindex("Report card") :].splitlines()
    return "\n".join(itertools.takewhile(lambda line: line.startswith("|"), lines[1:]))


def evaluate(folder: Path, model: list[str]) -> tuple[dict[str, float], str]:
    """Exact match and multiple-choice accuracy of one stage's model; the output of the last test."""
    scores, out = {}, ""
    for name, kind in EVALS.items():
        out = cli(
            folder, "test", *model, "--data", "datamodules.TaskDataModule",
            f"--data.init_args.path=data/arithmetic/{name}", f"--data.init_args.kind={kind}",
            "--data.init_args.chat=true", "--data.init_args.max_new_tokens=48", "--data.init_args.batch_size=50",
        )  # fmt: skip
        scores |= test_metrics(out)
    return scores, out


def stage_args(track: str, folder: Path, seed: int, steps: dict[str, int]) -> dict[str, list[str]]:
    """Each stage's fit arguments (the parent model is added when the previous stage has registered)."""
    common = [f"--seed_everything={seed}", "--trainer.check_val_every_n_epoch=null", "--trainer.limit_val_batches=8"]
    extra = {s: [] for s in STAGES}
    if track == "zoo":  # the base's net (sft's config states it too, so both are sized); dpo and rl build sft's
        size = {"n_layer": SIZE["layers"], "n_embd": SIZE["width"]}
        extra["base"] = extra["sft"] = [f"--model.init_args.net.init_args.{k}={v}" for k, v in size.items()]
        extra["sft_more"] = extra["sft"]
        common += [f"--data.init_args.generate.{k}={TASK[k]}" for k in ("digits", "terms")]
        configs = {s: ROOT / "configs" / "gpt" / TASK_YAMLS[s] for s in STAGES}
    else:  # the imported folder is the base: registered with its tokenizer (one no-op step)
        configs = {s: write_llama_configs(folder) / f"{s}.yaml" for s in STAGES}
        steps, extra["base"] = steps | {"base": 1}, ["--model.init_args.optimizer.lr=1e-30"]
    return {
        s: ["fit", "--config", str(configs[s]), f"--trainer.max_steps={steps[s]}", *common, *extra[s],
            f"--trainer.val_check_interval={VAL_EVERY.get(s, steps[s])}",  # once, at the end (sft_more: the best)
            f"--trainer.logger.init_args.stage={s}", f"--trainer.logger.init_args.registered_model_name={track}-{s}"]
        for s in STAGES
    }  # fmt: skip


TASK_YAMLS = {"base": "arithmetic_base.yaml", "sft": "chat_arithmetic.yaml", "dpo": "dpo_tiny.yaml",
              "rl": "grpo_arithmetic.yaml", "sft_more": "chat_arithmetic.yaml"}  # fmt: skip
VAL_EVERY = {"sft_more": 250}  # the registered model is the best by validation loss of these checks
MATCHED_CPU = {"sft_more": 0.0}  # CPU seconds for the stage, fit and evaluations (--sft-more-cpu); 0: the rl stage's
SIZE = {"layers": 4, "width": 128}  # both tracks' nets (the configs' own by default); set from --layers, --width


def matched_steps(budget: float, sft_fit_cpu: float, sft_steps: int, sft_eval_cpu: float, every: int) -> int:
    """SFT steps that spend ``budget`` CPU seconds, fit and evaluations, at the sft stage's CPU per step (its start-up
    included), in whole validation intervals of ``every`` steps so that the last steps are validated too."""
    per_step = sft_fit_cpu / sft_steps
    return every * max(1, round((budget - sft_eval_cpu) / per_step / every))


def one_seed(track: str, folder: Path, seed: int, steps: dict[str, int]) -> tuple[dict, dict, str]:
    """Scores and CPU seconds per stage for one seed, and the last report card printed."""
    folder.mkdir(parents=True, exist_ok=True)
    scores, cpu, models, out = {}, {}, {}, ""
    if track == "llama":
        build_llama(folder, seed)
    args = stage_args(track, folder, seed, steps)
    fit_cpu, eval_cpu = {}, {}
    for stage in STAGES:
        start = cpu_seconds()
        parent = models.get(PARENT.get(stage))
        start_from = [f"--model.init_args.init_weights={parent}"] if parent else []
        if stage == "sft_more" and (budget := MATCHED_CPU[stage] or cpu.get("rl")):  # given, else this seed's rl's
            n = matched_steps(budget, fit_cpu["sft"], steps["sft"], eval_cpu["sft"], VAL_EVERY[stage])
            args = stage_args(track, folder, seed, steps | {stage: n})
            print(
                f"  seed {seed} {stage}: {n} steps ({fit_cpu['sft'] / steps['sft']:.3f} CPU s a step of sft)",
                flush=True,
            )
        models[stage] = registered(cli(folder, *args[stage], *start_from))
        fit_cpu[stage] = cpu_seconds() - start
        scores[stage], out = evaluate(folder, ["--ckpt_path", models[stage]])
        cpu[stage] = cpu_seconds() - start
        eval_cpu[stage] = cpu[stage] - fit_cpu[stage]
        print(f"  seed {seed} {stage}: {json.dumps(scores[stage])}  ({cpu[stage] / 60:.1f} CPU min)", flush=True)
    return scores, cpu, card_of(out)


# -- the llama track's folder ----------------------------------------------------------------------------------


def build_llama(folder: Path, seed: int) -> Path:
    """A Llama-style folder: random weights and a BPE trained on the task's text with a Llama-3-style template."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    sys.path.insert(0, str(ROOT))
    from datamodules.arithmetic import PRETRAIN_FILE, ArithmeticTask, prepare_task

    text = (prepare_task(folder / "data" / "arithmetic", ArithmeticTask(**TASK)) / PRETRAIN_FILE).read_text()
    out = folder / "llama"
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence(  # digits one by one (as Llama 2's), then bytes
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    hf.train_from_iterator(text.split("\n\n"), trainer)
    out.mkdir(parents=True, exist_ok=True)
    hf.save(str(out / "tokenizer.json"))
    tokens = {"bos_token": SPECIALS[0], "eos_token": "<|eot_id|>", "pad_token": "<|end_of_text|>"}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **tokens, "chat_template": LLAMA3}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    torch.manual_seed(seed)
    llama = transformers.LlamaConfig(
        vocab_size=hf.get_vocab_size(), hidden_size=SIZE["width"], intermediate_size=2 * SIZE["width"],
        num_hidden_layers=SIZE["layers"],
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
        bos_token_id=hf.token_to_id(SPECIALS[0]), eos_token_id=hf.token_to_id("<|eot_id|>"),
    )  # fmt: skip
    transformers.LlamaForCausalLM(llama).save_pretrained(out)
    return out


def write_llama_configs(folder: Path) -> Path:
    """SFT and DPO configs of the llama track, LoRA on every linear layer of the imported net."""
    llama, configs = folder / "llama", folder / "configs"
    configs.mkdir(exist_ok=True)
    data = {"path": "data/arithmetic", "tokenizer": "pretrained", "pretrained_dir": str(llama), "block_size": 80,
            "batch_size": 32, "generate": TASK}  # fmt: skip
    # The net is init_weights': the folder's config for the base, then each registered model's own (zoo.app.pretrained).
    module = {
        "net": {"class_path": "zoo.gpt.GPT"},
        "adapt": {"lora": {"r": 16}},
        "generation": {"max_new_tokens": 48, "temperature": 0.0},
    }
    sft = {
        "model": {"class_path": "zoo.gpt.CausalLMModule", "init_args": module | {"optimizer": {"lr": 0.003}}},
        "data": {"class_path": "datamodules.ChatDataModule", "init_args": data | {"val_fraction": 0.05}},
        "trainer": {"max_epochs": -1, "enable_progress_bar": False, "log_every_n_steps": 25},
    }
    dpo = {
        "model": {"class_path": "zoo.gpt.DPOModule", "init_args": module | {"optimizer": {"lr": 0.0003}}},
        "data": {"class_path": "datamodules.PreferenceDataModule", "init_args": data | {"batch_size": 8}},
        "trainer": {"max_epochs": -1, "enable_progress_bar": False, "log_every_n_steps": 5},
    }
    base = json.loads(json.dumps(sft))
    base["model"]["init_args"]["init_weights"] = str(llama)  # the later stages start from the registered models
    for name, config in (("base", base), ("sft", sft), ("dpo", dpo)):  # JSON is YAML
        (configs / f"{name}.yaml").write_text(json.dumps(config, indent=1))
    return configs


# -- the report -----------------------------------------------------------------------------------------------


def mean_std(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs) if len(xs) > 1 else 0:.3f}"


def report(track: str, runs: list[tuple[dict, dict, str]]) -> str:
    rows = []
    for stage in STAGES:
        got = [(s[stage], c[stage]) for s, c, _ in runs]
        rows.append([
            stage,
            mean_std([s.get("test/exact_match", float("nan")) for s, _ in got]),
            mean_std([s.get("test/acc", float("nan")) for s, _ in got]),
            f"{statistics.mean(c for _, c in got) / 60:.1f}",
        ])  # fmt: skip
    headers = [f"{track} ({len(runs)} seeds)", "exact match", "acc (mc)", "CPU min / seed"]
    return table(headers, rows)


SEED_LINE = re.compile(r"^  seed (\d+) (\w+): (\{.*\})  \(([\d.]+) CPU min\)$")


def collected(logs: list[str]) -> list[tuple[dict, dict, str]]:
    """The per-seed lines of earlier runs' output (one seed per process, run side by side) as ``one_seed``'s."""
    runs: dict[str, tuple[dict, dict, str]] = {}
    for log in logs:
        for line in Path(log).read_text().splitlines():
            if m := SEED_LINE.match(line):
                scores, cpu, _ = runs.setdefault(m.group(1), ({}, {}, ""))
                scores[m.group(2)], cpu[m.group(2)] = json.loads(m.group(3)), float(m.group(4)) * 60
    if not runs:
        raise SystemExit(f"no per-seed lines in {logs}")
    return list(runs.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--track", choices=("zoo", "llama"), default="zoo")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    # The defaults are the configs' own (the README's figures); smaller nets or fewer steps for a quick look.
    ap.add_argument("--base-steps", type=int, default=400, help="zoo track: pretraining steps")
    ap.add_argument("--sft-steps", type=int, default=250)
    ap.add_argument("--dpo-steps", type=int, default=50)
    ap.add_argument("--rl-steps", type=int, default=600, help="GRPO steps (stage rl)")
    ap.add_argument("--sft-more-steps", type=int, default=3000, help="stage sft_more: SFT continued from sft's model")
    ap.add_argument(
        "--sft-more-cpu", type=float, default=0.0,
        help="stage sft_more: its CPU seconds (fit and evaluations; the steps from sft's CPU per step); 0: the rl "
        "stage's of the same seed when it ran, else --sft-more-steps",
    )  # fmt: skip
    ap.add_argument(
        "--stages",
        nargs="+",
        choices=STAGES,
        help="default: all (llama: no rl, sft_more); dpo, rl, sft_more start from sft",
    )
    ap.add_argument("--layers", type=int, default=4, help="layers of both tracks' nets (configs: 4)")
    ap.add_argument("--width", type=int, default=128, help="model width of both tracks' nets, 4 heads (configs: 128)")
    ap.add_argument("--digits", type=int, default=1, help="the task's difficulty: digits of a number (configs: 1)")
    ap.add_argument("--terms", type=int, default=4, help="the task's difficulty: numbers per problem (configs: 4)")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each cli.py process (0: torch's)")
    ap.add_argument("--workdir", default=None, help="where the stores and task go (default: a temporary folder)")
    ap.add_argument("--collect", nargs="+", help="only tabulate the seeds in these earlier runs' outputs")
    args = ap.parse_args()
    if args.collect:
        runs = collected(args.collect)
        STAGES[:] = [s for s in STAGES if all(s in r[0] for r in runs)]
        return print(report(args.track, runs))
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    SIZE.update(layers=args.layers, width=args.width)
    TASK.update(digits=args.digits, terms=args.terms)
    args.stages = args.stages or [s for s in STAGES if args.track == "zoo" or s not in ("rl", "sft_more")]
    if {"rl", "sft_more"} & set(args.stages) and args.track != "zoo":
        ap.error("the rl and sft_more stages run on the zoo track (GRPO from an imported folder: docs/gpt-tune.md)")
    missing = {PARENT[s] for s in args.stages if s in PARENT} - set(args.stages)
    if missing:
        ap.error(f"--stages needs {sorted(missing)} too: each stage starts from its parent's model")
    STAGES[:] = [s for s in STAGES if s in args.stages]
    what = ", ".join(f"{PARENT[s]} -> {s}" for s in STAGES if s in PARENT)
    print(f"== {what}, track {args.track}, seeds {args.seeds}, {args.layers} layers x {args.width} wide")
    steps = {"base": args.base_steps, "sft": args.sft_steps, "dpo": args.dpo_steps, "rl": args.rl_steps,
             "sft_more": args.sft_more_steps}  # fmt: skip
    MATCHED_CPU["sft_more"] = args.sft_more_cpu
    print(f"steps: {', '.join(f'{s} {steps[s]}' for s in STAGES)}; task {TASK}")
    print(f"CPU: {cpu_model()}; {os.cpu_count()} CPUs; load average (1/5/15 min) at start: {load}")
    print("times: CPU minutes (user + system) of each stage's cli.py processes, fit and both evaluations")
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="assistant-"))
    runs = [one_seed(args.track, work / f"{args.track}-seed{s}", s, steps) for s in args.seeds]
    print(f"\nReport card of seed {args.seeds[-1]} ({work}):\n{runs[-1][2]}\n")
    print(report(args.track, runs))
    print(f"load average at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
