"""A GRPO fit on 2 CPU processes (DDP, gloo), then what each rank sampled and how it scored each group.

Usage: python grpo_ranks.py (in the folder the ranks write to). Each rank writes ``rank<k>.pt``: per batch the
prompts, the rollout's rows (prompt then completion), the rewards and the advantages the objective was given at each
optimizer step (minibatches of one prompt's group, two passes), and at the end the net's weights. Launched by
tests/gpt/test_grpo_ddp.py: DDP re-runs this script for rank 1, which would re-run pytest if the fit happened inside
the pytest process. A deadlock ends the process with every thread's stack on stderr instead of hanging the test.
"""

import faulthandler
import json
import sys
from pathlib import Path

import torch
from lightning.pytorch import Trainer, seed_everything

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from datamodules import PromptDataModule
from zoo.gpt import GPT, GRPOModule
from zoo.gpt.generate import Generation
from zoo.gpt.tune.rewards import Reward
from zoo.train.optim import AdamWCosine

G, BATCHES, PROMPTS, ITERATIONS = 4, 3, 2, 2  # minibatches of one prompt: PROMPTS * ITERATIONS steps per batch
STEPS_SEEN: list[dict] = []


class CountX(Reward):
    """A reward that varies within a group: the share of "x" in the completion, plus its length."""

    def score_one(self, completion: str, answer: str) -> float:
        return completion.count("x") / max(len(completion), 1) + len(completion) / 10


class Recorded(GRPOModule):
    def score_rows(self, *args):
        scores = super().score_rows(*args)
        STEPS_SEEN.append({"rewards": scores.outcome.clone()})
        return scores

    def update(self, rollout, *args):
        STEPS_SEEN[-1].update(ids=rollout.ids.clone(), pad=rollout.pad.clone())
        return super().update(rollout, *args)

    def policy_loss(self, rollout, advantages, rows, *args):
        STEPS_SEEN[-1].setdefault("advantages", []).append(advantages[rows].detach().clone())
        return super().policy_loss(rollout, advantages, rows, *args)

    def training_step(self, batch, batch_idx):
        STEPS_SEEN.append({"prompts": [p.tolist() for p in batch["prompt_ids"]]})
        return super().training_step(batch, batch_idx)


if __name__ == "__main__":
    faulthandler.dump_traceback_later(240, exit=True)
    Path("prompts.jsonl").write_text("".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in "abcdefghijkl"))
    seed_everything(0)
    optimizer = AdamWCosine(lr=1e-2, weight_decay=0.0, warmup_steps=0, min_lr_ratio=1.0)
    net = GPT(vocab_size=257, block_size=32, n_layer=1, n_embd=32, n_head=2)
    module = Recorded(
        net, rewards=[CountX()], group_size=G, generation=Generation(max_new_tokens=6), optimizer=optimizer,
        num_iterations=ITERATIONS, minibatch_prompts=1,
    )  # fmt: skip
    dm = PromptDataModule("prompts.jsonl", val_fraction=0.0, tokenizer="bytes", batch_size=PROMPTS)
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=BATCHES * PROMPTS * ITERATIONS, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        num_sanity_val_steps=0,
    )  # fmt: skip
    trainer.fit(module, dm)
    state = {k: v.detach().clone() for k, v in module.net.state_dict().items()}
    torch.save({"steps": STEPS_SEEN, "state": state, "world": trainer.world_size}, f"rank{trainer.global_rank}.pt")
    torch.distributed.barrier()  # the process group shut down before exit: gloo's threads abort otherwise
