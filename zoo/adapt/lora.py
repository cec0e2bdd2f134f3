"""LoRA and freezing applied to a module, with PEFT's layers, and folded back into plain weights.

``adapt(module, settings)`` runs once per module, after its pretrained weights are loaded and before it is sharded or
compiled (each family calls it where its ``init_weights`` have just been read, and in ``on_load_checkpoint``, so a
checkpoint's adapter keys meet adapted layers). PEFT's ``inject_adapter_in_model`` wraps each targeted layer in place
(``qkv`` becomes ``qkv.base_layer`` + ``qkv.lora_A.default`` + ``qkv.lora_B.default``), so the optimizer, Muon's
matrices and the grad-norm callback, which all take ``requires_grad`` parameters only, see the adapters and what
``trainable`` names. ``merge(module)`` folds the adapters into the weights and puts the plain layers back: what a
registered model serves, so serving needs no PEFT.
"""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from zoo.adapt.settings import Adaptation, LoRA
from zoo.errors import InputError, import_extra

LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)  # the kinds targeted by default
NAMED_LAYERS = (*LAYERS, nn.Embedding)  # and the kinds a target glob may name too
ADAPTER_PREFIX = "lora_"  # PEFT's prefix of every adapter parameter (lora_A, lora_B, lora_magnitude_vector)


def adapt(module: nn.Module, settings: Adaptation | dict | None) -> None:
    """Apply ``settings`` (LoRA, then freezing) to ``module`` once; later calls do nothing."""
    settings = Adaptation.of(settings)
    if settings is None or module.__dict__.get("_zoo_adapted"):
        return
    if settings.lora is not None:
        _inject(module, settings.lora, target_layers(module, settings.lora.targets))
    if settings.lora is not None or settings.trainable is not None:
        freeze(module, settings.trainable or ())
    if settings.base_dtype != "float32":
        _hold_bases_in(module, getattr(torch, settings.base_dtype))
    module.__dict__["_zoo_adapted"] = True


def adapted(module: nn.Module) -> bool:
    return bool(module.__dict__.get("_zoo_adapted"))


def target_layers(module: nn.Module, globs: tuple[str, ...]) -> list[str]:
    """The names of the layers LoRA wraps: those ``globs`` match, or by default every linear and conv layer that
    trains, except the input and output layers its nets name (``io_layers()``)."""
    if not globs:
        io = _io_prefixes(module)
        names = [
            n
            for n, m in module.named_modules()
            if isinstance(m, LAYERS)
            and m.weight.requires_grad
            and not any(_under(n, p) for p in io)
            and not _peft_part(n)
        ]
        if not names:
            raise InputError("adapt.lora found no linear or conv layer to adapt: name some in adapt.lora.targets")
        return names
    layers = [n for n, m in module.named_modules() if isinstance(m, NAMED_LAYERS) and not _peft_part(n)]
    names = []
    for glob in globs:
        hits = [n for n in layers if fnmatch.fnmatchcase(n, glob)]
        if not hits:
            raise InputError(
                f"adapt.lora.targets: {glob!r} names no linear, conv or embedding layer of the module; its layers "
                f"are named like {', '.join(layers[:4])}"
            )
        names += [n for n in hits if n not in names]
    return names


def freeze(module: nn.Module, trainable: tuple[str, ...]) -> None:
    """Only the adapters and the parameters ``trainable`` globs name (names as before LoRA) keep training."""
    matched = dict.fromkeys(trainable, False)
    for name, p in module.named_parameters():
        plain = name.replace(".base_layer.", ".")
        hits = [g for g in trainable if fnmatch.fnmatchcase(plain, g)]
        for g in hits:
            matched[g] = True
        p.requires_grad_(ADAPTER_PREFIX in name or bool(hits))
    unmatched = [g for g, hit in matched.items() if not hit]
    if unmatched:
        names = [n for n, _ in module.named_parameters()][:4]
        raise InputError(
            f"adapt.trainable: {', '.join(map(repr, unmatched))} names no parameter; parameters are named like "
            f"{', '.join(names)}"
        )


def merge(module: nn.Module) -> nn.Module:
    """Fold every adapter into its layer's weight and put the plain layer back: the module's state dict then has the
    names and shapes it had before ``adapt``."""
    from peft.tuners.lora import LoraLayer

    for handle in module.__dict__.pop("_zoo_base_hooks", []):
        handle.remove()
    for name, layer in list(module.named_modules()):
        if isinstance(layer, LoraLayer):
            dtypes = [p.dtype for n, p in layer.named_parameters() if ADAPTER_PREFIX in n]
            if dtypes:  # a base held in bf16 (base_dtype) merges at the adapters' full precision
                layer.get_base_layer().to(dtypes[0])
            layer.merge(safe_merge=True)
            parent, _, child = name.rpartition(".")
            setattr(module.get_submodule(parent), child, layer.get_base_layer())
    module.__dict__.pop("_zoo_adapted", None)
    return module


def _hold_bases_in(module: nn.Module, dtype: torch.dtype) -> None:
    """The frozen layers under the adapters in ``dtype``: each casts its input to it and its output back."""
    from peft.tuners.lora import LoraLayer

    def cast_in(layer, args):
        return (args[0].to(dtype), *args[1:])

    def cast_out(layer, args, out):
        return out.to(layer.__dict__["_zoo_out_dtype"])

    def remember(layer, args):
        layer.__dict__["_zoo_out_dtype"] = args[0].dtype

    hooks = module.__dict__.setdefault("_zoo_base_hooks", [])
    for layer in module.modules():
        if isinstance(layer, LoraLayer):
            base = layer.get_base_layer().to(dtype)
            hooks += [base.register_forward_pre_hook(remember), base.register_forward_pre_hook(cast_in)]
            hooks.append(base.register_forward_hook(cast_out))


def _inject(module: nn.Module, lora: LoRA, names: list[str]) -> None:
    import_extra("peft", "adapt.lora (LoRA adapters)")  # or one line naming the extra
    from peft import LoraConfig, inject_adapter_in_model

    # Into each child that holds targets (the net), not the LightningModule: PEFT reads a module's _device_mesh as a
    # transformers model's tensor-parallel plan, and Lightning's FSDP2 strategy sets one on the LightningModule.
    by_child: dict[str, list[str]] = {}
    for name in names:
        child, _, rest = name.partition(".")
        by_child.setdefault(child if rest else "", []).append(rest or name)
    for child, rel in by_child.items():
        config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=_exactly(rel),
            use_rslora=lora.rslora,
            use_dora=lora.dora,
        )
        try:
            inject_adapter_in_model(config, module.get_submodule(child))
        except (ValueError, TypeError, NotImplementedError) as e:
            raise InputError(f"adapt.lora cannot wrap the layers it names ({names[:3]}...): {e}") from e


def _exactly(names: list[str]) -> str:
    # PEFT full-matches a string target against each module's name: exactly these layers, no suffix matches.
    import re

    return "|".join(f"(?:{re.escape(n)})" for n in names)


def _io_prefixes(module: nn.Module) -> list[str]:
    prefixes = []
    for name, child in module.named_modules():
        io_layers = getattr(child, "io_layers", None)
        if callable(io_layers):
            prefixes += [f"{name}.{p}" if name else p for p in io_layers()]
    return prefixes


def _peft_part(name: str) -> bool:
    # a layer inside an adapter already there (its frozen base_layer, its lora_A/lora_B): not a layer to adapt again
    return any(part == "base_layer" or part.startswith(ADAPTER_PREFIX) for part in name.split("."))


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")
