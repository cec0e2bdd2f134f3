"""Fit an agent through ``cli.py`` (under DDP, on 2 processes), then save what each rank collected and counted.

Usage: python rl_ranks.py <cli.py fit arguments>. Each rank writes ``rank<k>.pt``: the first training step's data
(a rollout's raw observations, the replay rows, or IMPALA's first unrolls), the env-step counter and the logged
``train/env_steps``.
Launched as a subprocess by tests/rl/test_rl_ddp.py: DDP re-runs this script for rank 1, which would re-run pytest
if the fit happened inside the pytest process. A deadlock (a collective only one rank calls) ends the process
with every thread's stack on stderr instead of hanging the test.
"""

import faulthandler
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cli import main


class RecordRanks(Callback):
    """The data of this rank's first training step, then at the end what it counted and logged."""

    first: torch.Tensor | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        pool = pl_module.lifecycle.collector
        if batch_idx == 0 and hasattr(pool, "take"):  # IMPALA: the observations of the first unrolls the learner takes
            take = pool.take

            def recorded(*args, **kwargs):
                traj = take(*args, **kwargs)
                if RecordRanks.first is None:
                    RecordRanks.first = traj.obs.clone()
                return traj

            pool.take = recorded

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx == 0 and RecordRanks.first is None:
            collector = pl_module.lifecycle.collector
            if hasattr(collector, "raw_obs"):  # on-policy: the rollout's observations (T, N, O)
                RecordRanks.first = collector.raw_obs.clone()
            else:  # off-policy: the replay rows written so far
                RecordRanks.first = pl_module.lifecycle.buffer.storage[: len(pl_module.lifecycle.buffer)].clone()

    def on_train_end(self, trainer, pl_module) -> None:
        torch.save(
            {
                "first": RecordRanks.first,
                "env_steps": int(pl_module.env_steps),
                "logged": float(trainer.logged_metrics["train/env_steps"]),
                "val_return": float(trainer.callback_metrics["val/return"]),
                "val_env_steps": float(trainer.callback_metrics["val/env_steps"]),
                "obs_mean": pl_module.obs_rms.mean.clone() if hasattr(pl_module, "obs_rms") else None,
                "world_size": trainer.world_size,
                "global_step": trainer.global_step,
            },
            f"rank{trainer.global_rank}.pt",
        )


if __name__ == "__main__":
    faulthandler.dump_traceback_later(240, exit=True)
    c = main([*sys.argv[1:], "--trainer.callbacks+=rl_ranks.RecordRanks"])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()  # before exit: gloo's threads can abort a good run otherwise
