"""What a fine-tune trains, as every module's ``adapt`` setting: LoRA on some layers, and the parameters that train.

    model:
      init_args:
        adapt:
          lora: {r: 8, alpha: 16}           # LoRA on every linear/conv layer but the net's input and output layers
          trainable: ["net.lm_head.*"]      # and these parameters train in full (a new head, say)

Names are the module's own parameter and layer names (``net.blocks.0.attn.qkv``, as the checkpoint's keys), matched
by ``fnmatch`` globs (``*`` matches dots too). Without LoRA, ``trainable`` alone freezes the rest: a linear probe
(``["net.fc.*"]``), a locked image tower (LiT: ``["net.text.*", "net.logit_scale"]``), a partial fine-tune.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class LoRA:
    """Low-rank adapters (Hu et al. 2021, "LoRA"): each targeted layer's weight W becomes W + (alpha / r) B A, with
    A (r, in) random, B (out, r) zero at the start, so training starts from the pretrained function exactly.

    Args:
        r: the rank of each adapter.
        alpha: the scale's numerator: the update is scaled by alpha / r (by alpha / sqrt(r) with ``rslora``).
        dropout: dropout on the adapter's input (not on the frozen layer's).
        targets: globs of the layer names that get an adapter (``["net.blocks.*.attn.*"]``); empty: every linear
            and conv layer of the module except those its nets name as input and output layers (``io_layers()``:
            embeddings, the LM head, a classifier's head).
        rslora: rank-stabilised scaling alpha / sqrt(r) (Kalajdzievski 2023), so a larger r still learns.
        dora: weight-decomposed LoRA (Liu et al. 2024, "DoRA"): a trained magnitude per output beside the direction.
    """

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ()
    rslora: bool = False
    dora: bool = False

    # Imported before a stored config that holds LoRA settings is built under zoo.io.tripwire, which refuses imports
    # (transformers, which PEFT imports, probes optional packages such as torch_xla).
    preloads = ("peft",)

    @classmethod
    def of(cls, value):
        return value if isinstance(value, cls) or value is None else cls(**value)


@dataclass(frozen=True)
class Adaptation:
    """What trains in a fine-tune.

    Args:
        lora: low-rank adapters (``LoRA``); None: none.
        trainable: globs of the parameter names that train besides the adapters; None: with LoRA, the adapters
            alone; without LoRA, every parameter (a full fine-tune). Names are as before LoRA was applied.
        base_dtype: the dtype the frozen layers under the adapters are held in: ``bfloat16`` halves their memory
            (they compute in bf16, as ``bf16-mixed`` autocast would have them; the adapters stay float32).
    """

    lora: LoRA | None = None
    trainable: tuple[str, ...] | None = None
    base_dtype: Literal["float32", "bfloat16"] = "float32"

    @classmethod
    def of(cls, value):
        """From itself or from its fields as a dict (how checkpoints' hyperparameters carry it); None stays None."""
        if value is None or isinstance(value, cls):
            return value
        return cls(**{**value, "lora": LoRA.of(value.get("lora"))})
