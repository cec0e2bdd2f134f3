"""Agentic race: TRL's ``GRPOTrainer`` against the zoo's ``GRPOModule`` on a multi-turn game, from the same SFT
folder, with the same environment, rewards and settings: CPU seconds to a held-out greedy success rate.

The game: ``zoo/GuessNumber-v0`` (docs/gpt-envs.md): a number in 1..100, each reply ``Guess: N`` answered
``Higher.`` / ``Lower.`` as a user turn; reward 1 on success (less ``turn_cost`` a reply), ``max_turns`` replies.
The model: a byte-level zoo GPT (EOS 256) SFT-trained by ``cli.py fit`` on the ``random`` player's traces
(``ChatDataModule(episodes=...)``, 800 steps by default, about 200 CPU s; imperfect: about 7.5 guesses where
binary search needs at most 7), written once as a Hugging Face folder (``bench.grpo_race.export_start``) that both
arms start from: TRL loads it with transformers, the zoo arm names it as ``init_weights`` of
``configs/gpt/grpo_guess_number.yaml``. ``--init`` gives your own (a zoo ``.ckpt`` or a folder); left out, the SFT
stage runs here first (``--sft-steps``).

TRL's arm, through its multi-turn API: ``environment_factory`` makes one ``GuessGame`` per rollout, reset by TRL with
the dataset row's seed, holding the zoo's env (``zoo.gpt.tune.envs.make``, the same id and settings as the zoo
arm's data); the env owns the reward (``get_reward``: the episode's return). The game answers in user turns, not
tool results, so the turns are played by a ``rollout_func`` (TRL's path for environment feedback, as its OpenEnv
examples): each turn of the still-running episodes is sampled by TRL's own generation (``_generate_single_turn``:
transformers' ``generate`` with the trainer's generation config, the turn's budget its ``max_new_tokens``), the env
steps, and the template's scaffolding with the observation is appended as context (``env_mask`` 0: not trained on),
exactly as ``zoo.gpt.tune.episodes.play`` lays out an episode (the same ``Scaffold`` renders both). ``ZooBytes``
(``bench.grpo_race``) is TRL's tokenizer.

Settings, the same in both arms, read back from each side's own config objects before a run (``trl_settings``,
``zoo_settings``; a difference stops the run, ``check_same``): group size, temperature, top-p, top-k, tokens per turn,
turns per episode, tokens per episode, seeds per step, learning rate and schedule, AdamW's betas and weight decay,
gradient clipping, beta (no KL), the ratio's clip below and above, loss type, reward scaling, passes per batch,
and the environment's id and settings (its reward per episode).

Evaluation, one function for both arms (``success``): one greedy episode of each of ``--eval-seeds`` held-out seeds
(from 2,000,000, ``EpisodeDataModule``'s test seeds; training draws from 0..9,999) played by the zoo's episode loop;
TRL's weights copied into a zoo net for it. Every ``--eval-every`` learner steps; the first evaluation at or above
``--target`` is the hit, and the run stops there. Time: CPU seconds (user + system) of the run's process from the
first training step, evaluations taken out (``bench.grpo_race.Race``). Arms alternate over seeds (ABBA).

    python bench/agentic_race.py --target 0.5 --max-steps 60 --eval-seeds 50 --lr 2e-4 --processes 2 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench._common import QUIET_FIT, cpu_model, race_process, race_runs, table  # noqa: E402
from bench.grpo_race import EOS, Race, export_start, zoo_bytes, zoo_net  # noqa: E402

ENV_ID = "zoo/GuessNumber-v0"
ZOO_CONFIG = "configs/gpt/grpo_guess_number.yaml"
EVAL_SEED = 2_000_000  # EpisodeDataModule's first test seed: never trained on
TRAIN_SEEDS = 10_000
SETTINGS = {
    "group_size": 8, "temperature": 1.0, "max_new_tokens": 16, "max_turns": 10, "lr": 5e-5, "seeds_per_step": 4,
    "loss_type": "dapo", "clip_low": 0.2, "clip_high": 0.28, "turn_cost": 0.0,
}  # fmt: skip
SETTING_HELP = {
    "max_new_tokens": "a turn's token budget",
    "max_turns": "replies per episode (the env's max_turns too)",
    "seeds_per_step": "env seeds per learner step, each played group_size times",
    "loss_type": "grpo, dr_grpo or dapo",
    "turn_cost": "the env's reward less this per reply",
}
# the SFT stage: a small byte-level GPT on the random player's traces (imperfect), the model both arms start from
SFT_CONFIG = """\
model:
  class_path: zoo.gpt.CausalLMModule
  init_args:
    net:
      class_path: zoo.gpt.GPT
      init_args: {{block_size: 512, n_layer: 2, n_embd: 64, n_head: 4, dropout: 0.0}}
    optimizer: {{lr: 0.003, weight_decay: 0.1, warmup_steps: 20, min_lr_ratio: 0.1}}
    generation: {{max_new_tokens: 16, temperature: 0.0}}
data:
  class_path: datamodules.ChatDataModule
  init_args:
    path: {data}
    tokenizer: bytes
    batch_size: 16
    val_fraction: 0.02
    episodes: {{env_id: {env_id}, n: 2000, player: random, env_kwargs: {{max_turns: 10}}}}
trainer:
  max_steps: {steps}
  max_epochs: -1
  gradient_clip_val: 1.0
  limit_val_batches: 0
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {root}
"""


def env_kwargs(s: dict) -> dict:
    return {"max_turns": s["max_turns"], "turn_cost": s["turn_cost"]}


def episode_tokens(block_size: int, s: dict) -> int:
    """Tokens of a whole episode at most: the net's context less a turn's budget (TRL's generate writes a whole
    turn's positions before the episode's bound cuts it, and position ids past block_size do not exist)."""
    return block_size - s["max_new_tokens"]


# -- the SFT stage and the evaluation, shared by both arms ----------------------------------------------------------


def sft(work: Path, steps: int) -> Path:
    """The SFT stage's checkpoint, trained here with ``cli.py fit`` (once per ``work`` folder)."""
    from cli import main

    ckpt = work / "sft" / "last.ckpt"
    if ckpt.exists():
        return ckpt
    config = work / "sft.yaml"
    config.write_text(SFT_CONFIG.format(data=work / "sft_data", env_id=ENV_ID, steps=steps, root=work / "sft"))
    cli = main(["--config", str(config)], run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    cli.trainer.save_checkpoint(ckpt)
    return ckpt


@torch.no_grad()
def success(net, seeds: list[int], s: dict) -> tuple[float, float]:
    """Greedy success rate and mean turns of ``net`` over one episode of each seed (the zoo's episode loop)."""
    from zoo.gpt.tune.envs import make
    from zoo.gpt.tune.episodes import EnvRows, Episodes, episode_metrics, play_groups, scaffold_for
    from zoo.io.tokenizers import ByteTokenizer

    envs = EnvRows(lambda: make(ENV_ID, **env_kwargs(s)))
    bounds = Episodes(max_turns=s["max_turns"], max_tokens=episode_tokens(net.block_size, s))
    scaffold = scaffold_for(ByteTokenizer(), envs.first)
    episodes = play_groups(net, envs, seeds, 1, scaffold, bounds, s["max_new_tokens"], 0.0)
    m = episode_metrics(episodes)
    return m["success"], m["turns"]


class EpisodeRace(Race):
    """``Race`` scored by ``success`` on held-out seeds; each evaluation's mean turns kept beside it."""

    def __init__(self, seeds: list[int], settings: dict, every: int, target: float, clock: str) -> None:
        super().__init__(None, every, target, settings["max_new_tokens"], clock)
        self.seeds, self.settings, self.turns, self.label = seeds, settings, [], ""

    def evaluate(self, net) -> float:
        rate, turns = success(net, self.seeds, self.settings)
        self.turns.append(turns)
        return rate

    def step(self, steps: int, net) -> bool:
        hit, due = super().step(steps, net), steps % self.every == 0
        if due and self.label:  # each evaluation as it comes: a long run shows where it stands
            print(f"    {self.label} {self.evals[-1]} turns {self.turns[-1]:.2f}", flush=True)
        return hit


def check_same(a: dict, b: dict, names: tuple[str, str] = ("trl", "zoo")) -> None:
    """Stops with one line naming every setting whose value differs between the two arms' configs."""
    keys = sorted(set(a) | set(b))
    show = lambda d, k: repr(d[k]) if k in d else "<none>"  # noqa: E731
    diff = [f"{k}: {names[0]} {show(a, k)}, {names[1]} {show(b, k)}" for k in keys if a.get(k) != b.get(k)]
    if diff:
        raise ValueError(f"the arms' settings differ ({'; '.join(diff)}): the race compares equal settings only")


# -- TRL's arm ------------------------------------------------------------------------------------------------------


class GuessGame:
    """TRL's environment (``environment_factory``): the zoo's env, reset by TRL with the dataset row's ``seed``; its
    return is the reward (``get_reward``). Only ``reset`` and ``get_reward`` are public: TRL would offer any other
    public method to the model as a tool."""

    def __init__(self, kwargs: dict) -> None:
        from zoo.gpt.tune.envs import make

        self.kwargs = dict(kwargs)
        self.env = make(ENV_ID, **kwargs)
        self.messages: list[dict] = []
        self.total, self.done = 0.0, False

    def reset(self, seed: int, **row) -> str:
        messages, _ = self.env.reset(seed=int(seed))
        self.messages, self.total, self.done = list(messages), 0.0, False
        return messages[-1]["content"]  # TRL appends it to the row's (empty) user message

    def get_reward(self) -> float:
        return self.total

    def _step(self, text: str) -> list[dict]:
        obs, reward, terminated, truncated, _ = self.env.step(text)
        self.total += float(reward)
        self.done = terminated or truncated
        return obs


class TurnRollouts:
    """TRL's ``rollout_func``: the episodes of the batch's environments (``trainer.environments``, reset by TRL),
    each turn of those still running sampled together by TRL's generation, laid out as ``zoo.gpt.tune.episodes.play``
    lays out an episode: the first prompt, then replies (trained) and scaffolding with observations (``env_mask`` 0)."""

    def __init__(self, max_turns: int, max_tokens: int) -> None:
        from zoo.gpt.tune.episodes import Scaffold
        from zoo.io.tokenizers import ByteTokenizer

        self.tokenizer = ByteTokenizer()
        self.scaffold = Scaffold(self.tokenizer)
        self.max_turns, self.max_tokens = max_turns, max_tokens

    def __call__(self, prompts: list, trainer) -> dict:
        games: list[GuessGame] = trainer.environments
        messages = [list(g.messages) for g in games]
        prompt_ids = [self.scaffold.prompt(m) for m in messages]
        completion, mask = [[] for _ in games], [[] for _ in games]
        running = list(range(len(games)))
        for turn in range(self.max_turns):
            if not running:
                break
            inputs = [prompt_ids[i] + completion[i] for i in running]
            replies, _ = trainer._generate_single_turn(inputs, None, {}, num_generations=1)
            still = []
            for i, ids, reply in zip(running, inputs, replies):
                reply = list(reply)[: self.max_tokens - len(ids)]  # the zoo's turn budget: the room left
                completion[i] += reply
                mask[i] += [1] * len(reply)
                stop = reply[-1] if reply and reply[-1] == EOS else None
                text = self.tokenizer.decode(reply[:-1] if stop is not None else reply)
                obs = games[i]._step(text)
                replied = [*messages[i], {"role": "assistant", "content": text}]
                if games[i].done or turn + 1 == self.max_turns:
                    continue
                room = self.max_tokens - len(ids) - len(reply)
                after = self.scaffold.after(messages[i], text, obs, stop)
                if len(after) >= room:  # as play: the next turn needs one token of room
                    continue
                completion[i] += after
                mask[i] += [0] * len(after)
                messages[i] = replied + obs
                still.append(i)
            running = still
        return {"prompt_ids": prompt_ids, "completion_ids": completion, "logprobs": None, "env_mask": mask}


def trl_config(s: dict, seed: int, max_steps: int, out: str, max_tokens: int):
    from trl import GRPOConfig

    g = s["group_size"]
    return GRPOConfig(
        output_dir=out, use_cpu=True, report_to="none", save_strategy="no", seed=seed, max_steps=max_steps,
        logging_steps=10**9, disable_tqdm=True, bf16=False, per_device_train_batch_size=s["seeds_per_step"] * g,
        steps_per_generation=1, num_generations=g, max_completion_length=max_tokens,
        generation_kwargs={"max_new_tokens": s["max_new_tokens"]}, temperature=s["temperature"], top_p=1.0, top_k=0,
        learning_rate=s["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta1=0.9,
        adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, beta=0.0, loss_type=s["loss_type"],
        scale_rewards="group", num_iterations=1, epsilon=s["clip_low"], epsilon_high=s["clip_high"],
        dataloader_num_workers=0,
    )  # fmt: skip


def trl_trainer(model_dir: str, s: dict, seed: int, max_steps: int, out: str, callbacks=()):
    """TRL's GRPOTrainer for the race, built from the settings ``s`` (nothing trained yet)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    from zoo.io.chat_template import DEFAULT_TEMPLATE

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.generation_config.update(eos_token_id=EOS, pad_token_id=EOS, bos_token_id=None)  # the zoo model's stop
    max_tokens = episode_tokens(model.config.n_positions, s)
    kwargs = env_kwargs(s)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": ""}], "seed": k} for k in range(TRAIN_SEEDS)])
    tokenizer = zoo_bytes()
    tokenizer.chat_template = DEFAULT_TEMPLATE  # the zoo's format, which an exported folder carries, for TRL's checks
    return GRPOTrainer(
        model=model, args=trl_config(s, seed, max_steps, out, max_tokens), train_dataset=data,
        processing_class=tokenizer, environment_factory=lambda: GuessGame(kwargs),
        rollout_func=TurnRollouts(s["max_turns"], max_tokens), callbacks=list(callbacks),
    )  # fmt: skip


def trl_settings(trainer) -> dict:
    """The race's settings as TRL's trainer holds them."""
    a, game, rollouts = trainer.args, trainer._environment_pool[None][0], trainer.rollout_func
    sources = list(zip(trainer.reward_func_names, trainer.reward_weights.tolist()))
    reward = "the episode's return" if sources == [(type(game).__name__, 1.0)] else sources
    return {
        "group_size": trainer.num_generations, "temperature": trainer.temperature,
        "top_p": trainer.top_p, "top_k": trainer.top_k or None, "min_p": trainer.min_p,
        "max_new_tokens": trainer.generation_config.max_new_tokens, "max_turns": rollouts.max_turns,
        "max_tokens": rollouts.max_tokens, "seeds_per_step": a.per_device_train_batch_size // trainer.num_generations,
        "lr": a.learning_rate, "warmup_steps": a.warmup_steps, "schedule": a.lr_scheduler_type.value,
        "betas": (a.adam_beta1, a.adam_beta2), "adam_eps": a.adam_epsilon, "weight_decay": a.weight_decay,
        "max_grad_norm": a.max_grad_norm, "beta": trainer.beta, "clip_low": trainer.epsilon_low,
        "clip_high": trainer.epsilon_high, "loss_type": trainer.loss_type,
        "scale_std": trainer.scale_rewards == "group", "num_iterations": trainer.num_iterations,
        "env_id": game.env.spec.id, "env_kwargs": game.kwargs, "reward": reward,
    }  # fmt: skip


def trl_run(job: dict) -> dict:
    from transformers import TrainerCallback

    s, model_dir = job["settings"], job["model"]
    net, to_zoo = zoo_net(model_dir)  # the evaluation's net: TRL's weights copied in
    race = EpisodeRace(job["eval_seeds"], s, job["eval_every"], job["target"], job["clock"])
    race.label = f"{job['arm']} seed {job['seed']}:"

    class Evaluations(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            race.start(net)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % race.every == 0:
                net.load_state_dict(to_zoo(trainer.model.state_dict(), net))
            if race.step(state.global_step, net):
                control.should_training_stop = True

    out = str(Path(job["work"]) / f"trl-{job['seed']}")
    trainer = trl_trainer(model_dir, s, job["seed"], job["max_steps"], out, [Evaluations()])
    check_same(trl_settings(trainer), job["agreed"], ("trl", "agreed"))
    trainer.train()
    return race.result(job["arm"], job["seed"]) | {"turns": race.turns}


# -- the zoo's arm --------------------------------------------------------------------------------------------------


def zoo_args(model_dir: str, s: dict, seed: int, max_steps: int, max_tokens: int) -> list[str]:
    return [
        "--config", str(ROOT / ZOO_CONFIG), f"--seed_everything={seed}", f"--data.init_args.seed={seed}",
        f"--model.init_args.init_weights={model_dir}", "--model.init_args.rewards=[]",
        f"--model.init_args.group_size={s['group_size']}", f"--model.init_args.temperature={s['temperature']}",
        "--model.init_args.top_p=null", f"--model.init_args.generation.max_new_tokens={s['max_new_tokens']}",
        f"--model.init_args.episodes.max_turns={s['max_turns']}",
        f"--model.init_args.episodes.max_tokens={max_tokens}", "--model.init_args.episodes.turn_credit=false",
        f"--model.init_args.loss.loss_type={s['loss_type']}", f"--model.init_args.loss.clip_low={s['clip_low']}",
        f"--model.init_args.loss.clip_high={s['clip_high']}", "--model.init_args.loss.scale_std=true",
        "--model.init_args.loss.beta=0.0", "--model.init_args.num_iterations=1",
        "--model.init_args.minibatch_prompts=null", "--model.init_args.async_actors=0",
        f"--model.init_args.optimizer.lr={s['lr']}", "--model.init_args.optimizer.betas=[0.9, 0.999]",
        "--model.init_args.optimizer.weight_decay=0.0", "--model.init_args.optimizer.warmup_steps=0",
        "--model.init_args.optimizer.min_lr_ratio=1.0", "--model.init_args.max_grad_norm=1.0",
        f"--data.init_args.env_id={ENV_ID}", f"--data.init_args.env_kwargs={json.dumps(env_kwargs(s))}",
        "--data.init_args.tokenizer=bytes", f"--data.init_args.train_seeds={TRAIN_SEEDS}",
        f"--data.init_args.batch_size={s['seeds_per_step']}", f"--trainer.max_steps={max_steps}", *QUIET_FIT,
    ]  # fmt: skip


def zoo_cli(model_dir: str, s: dict, seed: int, max_steps: int):
    """The zoo's GRPO run for the race through ``cli.py``, built from the settings ``s`` (nothing trained yet)."""
    from cli import main
    from zoo.io.files import read_config

    block = read_config(Path(model_dir) / "config.json")["n_positions"]
    cli = main(zoo_args(model_dir, s, seed, max_steps, episode_tokens(block, s)), run=False)
    # EpisodeDataModule makes its tokenizer on first use, which sizing the net from the data would be; a folder's
    # net is sized by the folder, so nothing uses it before the module's setup reads it (None): make it now
    cli.datamodule.vocab_size  # noqa: B018
    return cli


def zoo_settings(cli) -> dict:
    """The race's settings as the zoo's module, its optimizer (built here as training builds it) and data hold them."""
    from zoo.gpt.generate import Generation
    from zoo.gpt.tune.episodes import Episodes
    from zoo.train.optim import AdamWCosine

    m, h, d = cli.model, cli.model.hparams, cli.datamodule
    settings, ep, loss = AdamWCosine.of(h.optimizer), Episodes.of(h.episodes), m.loss
    adamw = settings.build(m.net).param_groups[0]
    return {
        "group_size": h.group_size, "temperature": h.temperature, "top_p": h.top_p or 1.0, "top_k": None,
        "min_p": None, "max_new_tokens": Generation.of(h.generation).max_new_tokens, "max_turns": ep.max_turns,
        "max_tokens": ep.max_tokens, "seeds_per_step": d.batch_size, "lr": adamw["lr"],
        "warmup_steps": settings.warmup_steps, "schedule": "constant" if settings.min_lr_ratio == 1.0 else "cosine",
        "betas": tuple(adamw["betas"]), "adam_eps": adamw["eps"], "weight_decay": adamw["weight_decay"],
        "max_grad_norm": h.max_grad_norm, "beta": loss.beta, "clip_low": loss.clip_low, "clip_high": loss.clip_high,
        "loss_type": loss.loss_type, "scale_std": loss.scale_std, "num_iterations": h.num_iterations,
        "env_id": d.env.env_id, "env_kwargs": dict(d.env.kwargs),
        "reward": "each turn's, as steps" if ep.turn_credit else "the episode's return",
    }  # fmt: skip


def zoo_run(job: dict) -> dict:
    from lightning.pytorch import Callback

    s = job["settings"]
    race = EpisodeRace(job["eval_seeds"], s, job["eval_every"], job["target"], job["clock"])
    race.label = f"{job['arm']} seed {job['seed']}:"

    class Evaluations(Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            race.start(pl_module.net)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if race.step(trainer.global_step, pl_module.net):
                trainer.should_stop = True

    cli = zoo_cli(job["model"], s, job["seed"], job["max_steps"])
    check_same(zoo_settings(cli), job["agreed"], ("zoo", "agreed"))
    cli.trainer.callbacks.append(Evaluations())
    cli.trainer.fit(cli.model, cli.datamodule)
    return race.result(job["arm"], job["seed"]) | {"turns": race.turns}


def agreed_settings(model_dir: str, s: dict, work: Path) -> dict:
    """Both arms built from ``s`` (nothing trained) and their settings read back: the one dict they agree on, or one
    line naming what differs."""
    trl = trl_settings(trl_trainer(model_dir, s, 0, 1, str(work / "trl-check")))
    zoo = zoo_settings(zoo_cli(model_dir, s, 0, 1))
    check_same(trl, zoo)
    return trl


def _one(job: dict) -> dict:
    race_process(job["threads"])
    sys.path.insert(0, str(ROOT))
    r = trl_run(job) if job["arm"] == "trl" else zoo_run(job)
    evals = [(st, round(acc, 3), round(sec, 1), t) for (st, acc, sec), t in zip(r["evals"], r["turns"])]
    print(f"  {r['arm']} seed {r['seed']}: hit {r['hit']}; evaluations (step, success, s, turns) {evals}", flush=True)
    return r


# -- the report -----------------------------------------------------------------------------------------------------


def summary(results: list[dict], target: float) -> str:
    rows = []
    for arm in ("trl", "zoo"):
        rs = [r for r in results if r["arm"] == arm]
        if not rs:
            continue
        hits = [r["hit"] for r in rs if r["hit"]]
        median = lambda xs: f"{statistics.median(xs):.0f}" if xs else "-"  # noqa: E731
        start, end = (statistics.mean(r["evals"][i][1] for r in rs) for i in (0, -1))
        turns = statistics.mean(r["turns"][-1] for r in rs)
        per_step = statistics.median(r["evals"][-1][2] / r["evals"][-1][0] for r in rs if r["evals"][-1][0])
        rows.append([
            arm, f"{len(hits)} / {len(rs)}", median([h["steps"] for h in hits]), median([h["seconds"] for h in hits]),
            f"{per_step:.2f}", f"{start:.3f}", f"{end:.3f}", f"{turns:.2f}",
        ])  # fmt: skip
    headers = [
        "arm", f"runs reaching {target}", "learner steps (median)", "CPU s (median)", "CPU s / step (median)",
        "start success", "end success (mean)", "end turns (mean)",
    ]  # fmt: skip
    return table(headers, rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--init", default=None, help="a zoo .ckpt or a Hugging Face folder; left out: SFT here first")
    ap.add_argument("--sft-steps", type=int, default=800, help="the SFT stage's steps when --init is left out")
    ap.add_argument("--target", type=float, default=0.9, help="held-out greedy success rate to reach")
    ap.add_argument("--max-steps", type=int, default=150, help="learner steps before a run gives up")
    ap.add_argument("--eval-every", type=int, default=10, help="learner steps between evaluations")
    ap.add_argument("--eval-seeds", type=int, default=100, help="held-out seeds evaluated (one greedy episode each)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--arms", nargs="+", choices=("trl", "zoo"), default=["trl", "zoo"])
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--processes", type=int, default=1, help="runs at a time (the CPU clock is per run)")
    for k, v in SETTINGS.items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v, help=SETTING_HELP.get(k))
    ap.add_argument("--workdir", default=None, help="where the SFT stage, its folder and the runs are written")
    args = ap.parse_args()
    settings = {k: getattr(args, k) for k in SETTINGS}
    work = Path(args.workdir or tempfile.mkdtemp(prefix="agentic-race-"))
    work.mkdir(parents=True, exist_ok=True)
    race_process(args.threads)
    init = args.init or str(sft(work, args.sft_steps))
    model = export_start(init, work / "model", {})
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"== agentic race on {ENV_ID}: TRL GRPOTrainer vs zoo GRPOModule, from {init} ({model})")
    print(f"CPU: {cpu_model()}; {os.cpu_count()} CPUs; load average (1/5/15 min) at start: {load}")
    print(f"settings {json.dumps(settings)}; target {args.target}; clock {args.clock}")
    agreed = agreed_settings(str(model), settings, work)
    print(f"settings read back from both arms' configs, equal: {agreed}")
    eval_seeds = list(range(EVAL_SEED, EVAL_SEED + args.eval_seeds))
    jobs = []
    for i, seed in enumerate(args.seeds):  # alternating: ABBA over seeds
        arms = args.arms if i % 2 == 0 else args.arms[::-1]
        jobs += [
            dict(arm=arm, seed=seed, model=str(model), work=str(work), settings=settings, agreed=agreed,
                 eval_seeds=eval_seeds,
                 target=args.target, max_steps=args.max_steps, eval_every=args.eval_every, clock=args.clock,
                 threads=args.threads)
            for arm in arms
        ]  # fmt: skip
    results = list(race_runs(_one, jobs, args.processes))
    print(summary(results, args.target))
    print(f"load average at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
