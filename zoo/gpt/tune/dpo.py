"""Direct Preference Optimization: a language model tuned on (prompt, chosen, rejected) pairs against its own
starting weights, with no reward model and no sampling.

DPO (Rafailov et al. 2023, arXiv:2305.18290, eq. 7) fits the implicit reward r(x, y) = beta log pi(y|x)/pi_ref(y|x)
to the preferences by the Bradley-Terry likelihood:

    L = -log sigmoid(beta * ((log pi(y_w|x) - log pi_ref(y_w|x)) - (log pi(y_l|x) - log pi_ref(y_l|x))))

where log pi(y|x) sums the reply's token log-probabilities (``sequence_logps``) and pi_ref is the starting model.
Conservative DPO (Mitchell 2023, "A note on DPO with noisy preferences") assumes each label is flipped with
probability eps = ``label_smoothing``: L = (1 - eps) L(y_w, y_l) + eps L(y_l, y_w), as TRL's ``sigmoid`` loss had
it until TRL 1.x (its ``aot`` loss on one pair is the same formula). The logged names are TRL's: rewards/chosen,
rewards/rejected (beta times the log-ratios), rewards/accuracies, rewards/margins, logps/chosen, logps/rejected.

The reference is the starting weights, held once (``zoo.gpt.tune.reference``: the base with its LoRA adapters off, or a
frozen copy whose digest a resume checks).

Notation: B pairs, T tokens, V vocabulary.
"""

from __future__ import annotations

import contextlib

import torch
from lightning.pytorch.callbacks import ThroughputMonitor
from torch import Tensor, nn

from zoo.errors import InputError
from zoo.gpt.gpt import GPT
from zoo.gpt.module import CausalLMModule
from zoo.gpt.tune.losses import dpo_loss, sequence_logps
from zoo.gpt.tune.reference import Reference, refuse_adapter_start
from zoo.train.logging import lightning_writes


def _pairs(batch: dict) -> int:
    if "task" in batch:  # task records under test (datamodules.tasks)
        return len(batch["prompt_ids"])
    return len(batch["chosen_input_ids"])


def _tokens(batch: dict) -> int:
    if "task" in batch:
        return sum(p.numel() for p in batch["prompt_ids"])
    return batch["chosen_input_ids"].numel() + batch["rejected_input_ids"].numel()


class DPOModule(CausalLMModule):
    """Tunes a ``GPT`` on preference pairs (``datamodules.PreferenceDataModule``) by DPO against its starting
    weights; generation, adapters, tokenizer and checkpoints are ``CausalLMModule``'s."""

    def __init__(self, net: GPT, beta: float = 0.1, label_smoothing: float = 0.0, **kwargs) -> None:
        """
        Args:
            net: the decoder (``zoo.gpt.GPT``), ids (B, T) -> logits (B, T, V).
            beta: how far from the reference the policy may move (DPO's beta; TRL's default 0.1): the reward's
                scale, larger keeps the model closer to its starting weights.
            label_smoothing: eps, the assumed probability that a pair's preference is flipped (conservative DPO); 0:
                plain DPO. Below 0.5.
            **kwargs: ``CausalLMModule``'s (optimizer, init_weights, adapt, generation, compile); not adapter_weights.
        """
        if not 0.0 <= label_smoothing < 0.5:
            raise InputError(f"label_smoothing is a flip probability in [0, 0.5), not {label_smoothing}")
        refuse_adapter_start(kwargs.get("adapter_weights"), "DPO")
        super().__init__(net, **kwargs)
        self._reference = Reference("dpo_reference")  # pi_ref: the frozen copy is held there, not a submodule

    # -- the reference ---------------------------------------------------------------------------------------

    def configure_model(self) -> None:
        self._reference.build(self)  # the weights as setup left them, before adapters are added
        super().configure_model()

    def reference(self) -> contextlib.AbstractContextManager[nn.Module]:
        """pi_ref, in eval mode, for a forward under no_grad: the frozen copy, or this net with its adapters off."""
        return self._reference.forward_net(self)

    # -- steps -------------------------------------------------------------------------------------------------

    def configure_callbacks(self):
        if any(isinstance(c, ThroughputMonitor) for c in self.trainer.callbacks):
            return []
        return [ThroughputMonitor(batch_size_fn=_pairs, length_fn=_tokens)]

    def objective(self, batch: dict) -> dict[str, Tensor]:
        """The DPO loss and statistics of a batch: the policy and the reference on both sides, as one (2B, T)
        forward each."""
        ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])  # (2B, T)
        targets = torch.cat([batch["chosen_targets"], batch["rejected_targets"]])  # (2B, T)
        logits, aux = self(ids, aux=True)  # (2B, T, V)
        policy = sequence_logps(logits, targets).chunk(2)  # (B,), (B,)
        with torch.no_grad(), self.reference() as ref:
            reference = sequence_logps(ref(ids), targets).chunk(2)
        out = dpo_loss(*policy, *reference, self.hparams.beta, self.hparams.label_smoothing)
        if aux:  # a mixture of experts' balance terms, as in pretraining
            out["aux_loss"] = sum(aux)
            out["loss"] = out["loss"] + out["aux_loss"]
        return out

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        out = self.objective(batch)
        t = batch["chosen_input_ids"].shape[1]
        if t not in self._flops_per_token:
            self._flops_per_token[t] = self.net.flops_per_token(t)
        self._last_flops = self._flops_per_token[t] * _tokens(batch) * 4 // 3  # the reference's forward: a third
        if lightning_writes(self.trainer):
            self.log("train/loss", out["loss"], prog_bar=True)
            self.log_dict({f"train/{name}": v for name, v in out.items() if name != "loss"})
        return out["loss"]

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        out = self.objective(batch)  # means over the epoch, weighted by pairs, across ranks
        self.log_dict({f"val/{k}": v for k, v in out.items()}, batch_size=_pairs(batch), sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        for r in self.routers:
            r.reset_stats()

    def test_step(self, batch: dict, batch_idx: int) -> None:
        if "task" in batch:  # task records (datamodules.tasks): scored as any language model is
            return self.tasks.update(self.net, batch, self.tokenizer)
        out = self.objective(batch)
        self.log_dict({f"test/{k}": v for k, v in out.items()}, batch_size=_pairs(batch), sync_dist=True)

    def on_test_epoch_end(self) -> None:
        tasks = self.tasks.compute("test/")  # synced across ranks; empty after preference batches
        if tasks:
            self.log_dict(tasks)

    # -- checkpoints -------------------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        self._reference.save(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self._reference.check(checkpoint, "DPO")
