"""The reference policy pi_ref a tuned language model is held near (DPO's implicit reward, GRPO's KL term): its
starting weights, held once.

With LoRA adapters as the only trained parameters, the reference is the same net with its adapters switched off
(PEFT's ``enable_adapters(False)``, as TRL's ``use_adapter`` does): no second copy in memory. Otherwise a frozen copy
of the net, taken when the model is configured (after ``init_weights`` is read, before a checkpoint is restored),
kept off the state dict. A checkpoint records the copy's SHA-256, and a resume whose starting weights
(``init_weights``, or the seeded initialisation) differ from the ones it was tuned against is refused. Under DDP each
rank runs its own reference forward on its own rows.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

from torch import nn

from zoo.adapt import Adaptation
from zoo.adapt.base import digest
from zoo.compat import trainer_of
from zoo.errors import CheckpointError, InputError
from zoo.train.parallel import shard


def refuse_adapter_start(adapter_weights: str | None, who: str) -> None:
    """A PEFT adapter to start from: with it switched off, the net would be the base, not the start."""
    if adapter_weights:
        raise InputError(
            f"{who}'s reference is its starting weights, and adapter_weights' start is the base with that adapter: "
            "give weights with it merged in as init_weights (a LoRA fit's registered model is merged)"
        )


def _lora_layers(net: nn.Module) -> list[nn.Module]:
    from peft.tuners.lora import LoraLayer

    return [m for m in net.modules() if isinstance(m, LoraLayer)]


class Reference:
    """pi_ref of a ``CausalLMModule``: built by ``build`` in ``configure_model``, used by ``forward_net``, checked
    against a resumed checkpoint under ``key``."""

    def __init__(self, key: str) -> None:
        self.key = key  # in the checkpoint: {"sha256": hex} of the frozen copy tuned against
        self.copy: nn.Module | None = None  # the frozen copy, when adapters cannot stand for it
        self.sha: str | None = None

    @staticmethod
    def adapters_stand_for_it(module) -> bool:
        """Whether the adapters are all that trains, so the net with them off is the starting weights."""
        settings = Adaptation.of(module.hparams.get("adapt"))
        return settings is not None and settings.lora is not None and not settings.trainable

    def build(self, module) -> None:
        """The frozen copy of ``module.net`` as setup left it, unless adapters stand for it; before adapting."""
        predicting = getattr(trainer_of(module), "predicting", False)  # generation needs no reference
        if self.copy is not None or predicting or self.adapters_stand_for_it(module):
            return
        ref = copy.deepcopy(module.net).requires_grad_(False).eval()
        state = ref.state_dict()
        self.sha = digest(state, sorted(state))
        self.copy = shard(ref, module.device_mesh, blocks=ref.all_blocks())

    @contextlib.contextmanager
    def forward_net(self, module) -> Iterator[nn.Module]:
        """pi_ref, in eval mode, for a forward under no_grad: the frozen copy, or the net with its adapters off."""
        if self.copy is not None:
            if next(self.copy.parameters()).device != module.device:
                self.copy.to(module.device)  # not a submodule: Lightning does not move it
            yield self.copy
            return
        net = module.net
        layers, training = _lora_layers(net), net.training
        net.eval()
        for layer in layers:
            layer.enable_adapters(False)
        try:
            yield net
        finally:
            for layer in layers:
                layer.enable_adapters(True)
            net.train(training)

    def save(self, checkpoint: dict) -> None:
        if self.sha is not None:
            checkpoint[self.key] = {"sha256": self.sha}

    def check(self, checkpoint: dict, who: str) -> None:
        """Refuse a checkpoint tuned against other starting weights than this copy's."""
        info = checkpoint.get(self.key)
        if info is None or self.sha is None:  # adapters as reference, or a load outside a fit
            return
        if info["sha256"] != self.sha:
            raise CheckpointError(
                f"this {who} checkpoint was tuned against other starting weights (sha256 {info['sha256'][:12]}...) "
                f"than the ones given now ({self.sha[:12]}...): give the init_weights it started from "
                "(--model.init_args.init_weights), so the reference is the same"
            )
