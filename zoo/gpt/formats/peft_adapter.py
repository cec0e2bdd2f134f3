"""LoRA adapters in and out of the zoo's GPT in PEFT's format: a folder of ``adapter_config.json`` and
``adapter_model.safetensors`` that ``peft.PeftModel.from_pretrained`` puts on the exported Hugging Face model (GPT-2,
Llama-family), and one that PEFT wrote, read into the zoo's net built from that model.

    save_adapter(module, "out/adapter", base="out")   # beside export_gpt2 / export_hf(module.net, "out")
    load_adapter(zoo.gpt.from_pretrained("llama"), "peft-adapter")

Names are the weight converters' own (``hf.zoo_to_hf``, ``llama.zoo_to_hf``), traced rather than restated: each
adapted layer's weight is replaced by its row numbers and converted, so an adapter's B rows (and DoRA's magnitude,
one norm per row) follow its weight's rows into q_proj, k_proj, v_proj (our fused ``qkv``, stacked by rows) or
gate_proj and up_proj (our SwiGLU ``fc`` = [gate | up]), GPT-2's fused c_attn taking them whole. Llama's q and k
need no RoPE permutation: both rotate halves (``llama.py``). A's and B's shapes are the same for Conv1D and Linear
layers (PEFT transposes the product, ``fan_in_fan_out``).

Out, a fused layer is exact as it is: W + s B A splits into one adapter per Hugging Face layer, each with the same A
and its rows of B. In, separate adapters of rank r on q, k, v (or gate, up) are one of rank 3r (2r) on the fused
layer: A stacked, B block-diagonal. The zoo's LoRA has one rank, so every layer takes the largest; a layer with fewer
parts is padded with zero rows of A and zero columns of B, which stay zero in training (each one's gradient is the
other's product). alpha grows with the rank, so that alpha'/r' = alpha/r (alpha'/sqrt(r') with rsLoRA): B stays as
PEFT trained it. What one rank and one alpha cannot hold, or the zoo has no layer for, is refused by name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from zoo.adapt import Adaptation, LoRA, adapt, adapted
from zoo.errors import InputError
from zoo.gpt.attention import MLA
from zoo.gpt.formats.hf import zoo_to_hf as gpt2_to_hf
from zoo.gpt.formats.llama import zoo_to_hf as llama_to_hf
from zoo.gpt.formats.phi3 import zoo_to_hf as phi3_to_hf
from zoo.gpt.gpt import GPT
from zoo.io import budget
from zoo.io.files import read_config, replacing
from zoo.io.weights import load_file

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
TO_HF = {"gpt2": gpt2_to_hf, "llama": llama_to_hf, "phi3": phi3_to_hf, "gemma": llama_to_hf}  # Gemma: Llama's names
# A PEFT file's key: its model's layer, then lora_A, lora_B or DoRA's magnitude (".weight" in older files).
KEY = re.compile(r"base_model\.model\.(.+)\.(lora_A|lora_B|lora_magnitude_vector)(?:\.weight)?")
ROW_BITS = 32  # a traced weight holds (layer << ROW_BITS) + row
HF_BLOCK = r"^(transformer\.h|model\.layers)\.\d+\."  # PEFT matches the rest of a name as a suffix


# -- the mapping ------------------------------------------------------------------------------------------------


def _net(module: nn.Module) -> tuple[GPT, str]:
    """The GPT and its name inside ``module`` (``net.`` in a CausalLMModule), where adapters' names start."""
    net = getattr(module, "net", module)
    if not isinstance(net, GPT):
        raise InputError(f"PEFT adapters go in and out of a zoo GPT or CausalLMModule, not a {type(module).__name__}")
    return net, "net." if net is not module else ""


def lora_layers(net: nn.Module) -> dict:
    """The PEFT LoRA layers of ``net`` by name (none, without importing PEFT, where PEFT was never imported)."""
    if "peft" not in sys.modules:
        return {}
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in net.named_modules() if isinstance(m, LoraLayer)}


@contextlib.contextmanager
def plain_layers(net: nn.Module) -> Iterator[None]:
    """``net`` with each LoRA layer's frozen base layer in its place (the adapters set aside, not merged), so its
    state dict and the exporters see the base model; put back after."""
    wrapped = lora_layers(net)
    for name, layer in wrapped.items():
        net.set_submodule(name, layer.get_base_layer())
    try:
        yield
    finally:
        for name, layer in wrapped.items():
            net.set_submodule(name, layer)


def hf_parts(net: GPT, layout: str) -> dict[str, list[tuple[str, Tensor]]]:
    """For each linear layer of ``net``, the Hugging Face layers it exports as, and for each the rows of ours it takes,
    in its order: the converter run on weights replaced by their row numbers."""
    with plain_layers(net):
        sd = dict(net.state_dict())
        names = [n for n, m in net.named_modules() if isinstance(m, nn.Linear)]
    for i, name in enumerate(names):
        sd[f"{name}.weight"] = (i << ROW_BITS) + torch.arange(sd[f"{name}.weight"].shape[0]).unsqueeze(1)  # (out, 1)
    parts: dict[str, list[tuple[str, Tensor]]] = {}
    for key, w in TO_HF[layout](sd, net).items():
        if w.dtype == torch.int64 and key.endswith(".weight") and w.numel():
            code = w.flatten()
            layer = int(code[0]) >> ROW_BITS
            if ((code >> ROW_BITS) != layer).any():  # not so in any converter: each writes a layer's rows or whole
                raise InputError(f"{key} joins several of the zoo's layers: no one LoRA A of ours is its")
            parts.setdefault(names[layer], []).append((key[: -len(".weight")], code & (2**ROW_BITS - 1)))
    return parts


def _layout(net: GPT, format: str | None) -> str:
    layout = net.norm_f.hf_layout  # as the norm's class states its Hugging Face form: "gpt2" or "llama"
    if format == "phi3" and layout == "llama":  # a Llama-shaped net with its projections fused (zoo.gpt.formats.phi3)
        return format
    if format not in (None, layout) and (layout, format) != ("gemma", "llama"):  # Gemma exports as --format llama
        raise InputError(f"A GPT with a {layout}-style norm exports its adapter as --format {layout}, not {format}")
    return layout


def _per_block(names: list[str], n_layer: int, block: str, every: str) -> list[str]:
    """``names``, those of a layer every block has written once: the block's part (``block``) replaced by ``every``."""
    kinds: dict[str, list[str]] = {}
    for name in names:
        kinds.setdefault(re.sub(block, every, name), []).append(name)
    return sorted(t for kind, group in kinds.items() for t in ([kind] if len(group) == n_layer else group))


# -- out ----------------------------------------------------------------------------------------------------------


def save_adapter(module: nn.Module, folder: str | Path, format: str | None = None, base: str | None = None) -> Path:
    """Write the LoRA adapters of ``module`` (a CausalLMModule or GPT) as a PEFT adapter folder for the model that
    ``export_gpt2`` (``format`` "gpt2") or ``export_hf`` ("llama") writes; ``base``: its folder, recorded as
    ``base_model_name_or_path`` (null when None)."""
    from safetensors.torch import save_file

    net, prefix = _net(module)
    layout = _layout(net, format)
    wrapped = lora_layers(net)
    if not wrapped:
        raise InputError("The module has no LoRA adapters to save (adapt.lora is unset): export the model alone")
    settings = {_settings(layer) for layer in wrapped.values()}
    if len(settings) != 1:  # adapt() gives every layer the same; PEFT's config has one
        raise InputError(f"The module's LoRA layers ({sorted(settings)}) are not one (r, alpha, rslora, dora, dropout)")
    tensors = _hf_tensors(net, prefix, layout, wrapped)
    r, alpha, rslora, dora, dropout = settings.pop()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / WEIGHTS, metadata={"format": "pt"})  # written beside and renamed over its name
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None if base is None else str(base),
        "r": r,
        "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha,
        "lora_dropout": dropout,
        "use_rslora": rslora,
        "use_dora": dora,
        "target_modules": _per_block(sorted({KEY.fullmatch(k)[1] for k in tensors}), net.n_layer, HF_BLOCK, ""),
        "fan_in_fan_out": layout == "gpt2",  # GPT-2's Conv1D stores (in, out)
        "bias": "none",
        "inference_mode": True,
    }
    with replacing(folder / CONFIG) as tmp:  # a link planted in the folder is replaced, not followed
        tmp.write_text(json.dumps(config, indent=2))
    return folder


def _hf_tensors(net: GPT, prefix: str, layout: str, wrapped: dict) -> dict[str, Tensor]:
    """The adapters of ``net``'s LoRA layers under PEFT's names for the Hugging Face layers they export as: each
    with the layer's A and its own rows of B (and of DoRA's magnitude)."""
    parts, tensors = hf_parts(net, layout), {}
    for name, layer in wrapped.items():
        if not name.startswith("blocks.") or name not in parts:
            raise InputError(
                f"LoRA on {prefix}{name} has no place in a PEFT adapter of the exported model: adapters export "
                f"from the linear layers of the decoder blocks (adapt.lora.targets)"
            )
        a, b = (getattr(layer, w)["default"].weight.detach().cpu() for w in ("lora_A", "lora_B"))
        magnitude = layer.lora_magnitude_vector["default"].weight.detach().cpu() if layer.use_dora["default"] else None
        for hf, rows in parts[name]:
            pre = f"base_model.model.{hf}."
            tensors |= {pre + "lora_A.weight": a.clone(), pre + "lora_B.weight": b[rows].contiguous()}  # unshared
            if magnitude is not None:
                tensors[pre + "lora_magnitude_vector"] = magnitude[rows].contiguous()
    return tensors


def _settings(layer) -> tuple:
    """(r, alpha, rslora, dora, dropout) of a PEFT LoRA layer's adapter."""
    a = "default"
    dropout = getattr(layer.lora_dropout[a], "p", 0.0)
    return layer.r[a], layer.lora_alpha[a], layer.use_rslora.get(a, False), layer.use_dora[a], dropout


# -- in -----------------------------------------------------------------------------------------------------------

READ = ("peft_type", "r", "lora_alpha", "lora_dropout", "use_rslora", "use_dora")
# Fields that say where an adapter came from, or which layers PEFT wraps (the file's names say that too), or that
# matter only with a field refused below: read by no one. Any other field must be off (None, false, empty, "none").
ABOUT = frozenset(
    {
        "base_model_name_or_path",
        "revision",
        "task_type",
        "peft_version",
        "auto_mapping",
        "inference_mode",
        "target_modules",
        "exclude_modules",
        "layers_to_transform",
        "layers_pattern",
        "fan_in_fan_out",
        "megatron_core",
        "qalora_group_size",
        "loftq_config",
        "eva_config",
        "corda_config",
        "lora_ga_config",
        "runtime_config",
        "ensure_weight_tying",
    }
)


def read_adapter_config(path: str | Path) -> dict:
    """LoRA's settings (r, alpha, dropout, rslora, dora) from a PEFT ``adapter_config.json``, read as data within
    bounds; a field that would change the function in a way one rank and one alpha cannot hold is refused by name."""
    config, where = read_config(path), repr(str(path))
    if config.get("peft_type") != "LORA":
        raise InputError(f"{where} has peft_type {config.get('peft_type')!r}: the zoo reads LoRA adapters (LORA)")
    on = [k for k, v in config.items() if k not in READ and k not in ABOUT and not _off(k, v)]
    if on:
        raise InputError(
            f"{where} sets {', '.join(f'{k}={config[k]!r}' for k in on)}, which the zoo's LoRA cannot hold (one rank "
            f"and one alpha for every layer, no bias or extra trained modules, LoRA's own initialisation): refused"
        )
    r, alpha, dropout = config.get("r", 8), config.get("lora_alpha", 8), config.get("lora_dropout", 0.0)  # PEFT's
    rslora, dora = config.get("use_rslora", False), config.get("use_dora", False)
    valid = _number(r) and isinstance(r, int) and r > 0 and _number(alpha) and _number(dropout) and 0 <= dropout < 1
    if not valid or not isinstance(rslora, bool) or not isinstance(dora, bool):
        raise InputError(
            f"{where}: r={r!r}, lora_alpha={alpha!r}, lora_dropout={dropout!r}, use_rslora={rslora!r} or "
            f"use_dora={dora!r} is not a LoRA setting"
        )
    budget.check_counts({"r": r}, where)  # a stored rank of 1e9 is refused before any factor is sized from it
    return dict(r=r, alpha=float(alpha), dropout=float(dropout), rslora=rslora, dora=dora)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _off(key: str, value) -> bool:
    if key == "init_lora_weights":  # LoRA's own starts, which loading overwrites (PiSSA, OLoRA... move W too)
        return isinstance(value, bool) or value == "gaussian"
    return value is None or value is False or value in ({}, [], "", "none")


def load_adapter(module: nn.Module, folder: str | Path) -> nn.Module:
    """Read a PEFT LoRA adapter folder into ``module`` (a CausalLMModule or GPT holding the model it was trained on,
    e.g. from ``zoo.gpt.from_pretrained``): adapted here with the LoRA the adapter needs (and ``adapt`` so records
    it, for its checkpoints) when it has none yet, else checked against it. Every tensor of the file is used and every
    adapter parameter set, or one error names what is left over."""
    folder = Path(folder)
    net, prefix = _net(module)
    if any(isinstance(block.attn, MLA) for block in net.blocks):
        raise InputError(
            "A PEFT adapter does not load into an MLA net: its RoPE rows follow the base folder's rope_interleave, "
            "which the net does not record"
        )
    if not (folder / CONFIG).is_file():
        raise InputError(f"No {CONFIG} in {str(folder)!r}: point at a PEFT adapter folder (save_pretrained's output)")
    config = read_adapter_config(folder / CONFIG)
    found = _by_layer(load_file(_weights_file(folder)), folder)
    parts = hf_parts(net, net.norm_f.hf_layout)
    placed = {hf for name, ps in parts.items() if name.startswith("blocks.") for hf, _ in ps}
    if unknown := sorted(set(found) - placed):
        raise InputError(
            f"PEFT adapter {str(folder)!r} adapts {', '.join(unknown[:4])}, which the zoo's net has no LoRA place for "
            f"(its adapters load into the linear layers of the decoder blocks)"
        )
    present = {name: [(hf, rows) for hf, rows in ps if hf in found] for name, ps in parts.items()}
    present = {name: ps for name, ps in present.items() if ps}
    lora, stacked = _lora_for(config, present, found, [prefix + n for n in present], net.n_layer)
    _adapt_for(module, net, lora, list(present), folder)
    wrapped = lora_layers(net)
    with torch.no_grad():
        for name, ps in present.items():
            _fill(wrapped[name], ps, found, config, folder, stacked[name])
    return module


def _lora_for(config: dict, present: dict, found: dict, names: list[str], n_layer: int) -> tuple[LoRA, dict]:
    """The zoo's LoRA that holds the adapter exactly, and for each layer of ours whether its parts' A are stacked:
    the parts of a layer the zoo wrote share one A (rank r, B's rows side by side), others take r each."""
    stacked = {
        n: any(not torch.equal(found[hf]["lora_A"], found[ps[0][0]]["lora_A"]) for hf, _ in ps)
        for n, ps in present.items()
    }
    k = max(len(present[n]) if stack else 1 for n, stack in stacked.items())  # the rank ours needs, over r
    lora = LoRA(
        r=config["r"] * k,
        alpha=config["alpha"] * (math.sqrt(k) if config["rslora"] else k),  # alpha'/r' = alpha/r: B as trained
        dropout=config["dropout"],
        targets=tuple(_per_block(names, n_layer, r"blocks\.\d+\.", "blocks.*.")),
        rslora=config["rslora"],
        dora=config["dora"],
    )
    return lora, stacked


def _weights_file(folder: Path) -> Path:
    for name in (WEIGHTS, "adapter_model.bin"):  # older PEFT wrote a torch file, read weights-only
        if (folder / name).is_file():
            return folder / name
    raise InputError(f"No {WEIGHTS} (or adapter_model.bin) in {str(folder)!r}: point at a PEFT adapter folder")


def _by_layer(tensors: dict[str, Tensor], folder: Path) -> dict[str, dict[str, Tensor]]:
    """A PEFT file's tensors by the Hugging Face layer they adapt: {layer: {lora_A, lora_B, [magnitude]}}."""
    found: dict[str, dict[str, Tensor]] = {}
    for key, tensor in tensors.items():
        match = KEY.fullmatch(key)
        if match is None:
            raise InputError(
                f"PEFT adapter {str(folder)!r} holds {key!r}, not a LoRA tensor of a linear layer (lora_A, lora_B, "
                f"DoRA's magnitude): embedding adapters and other trained modules do not load into the zoo"
            )
        found.setdefault(match[1], {})[match[2]] = tensor
    if halves := sorted(hf for hf, t in found.items() if not {"lora_A", "lora_B"} <= set(t)):
        raise InputError(f"PEFT adapter {str(folder)!r} holds only one of lora_A and lora_B for {', '.join(halves)}")
    if not found:
        raise InputError(f"PEFT adapter {str(folder)!r} holds no tensors")
    return found


def _adapt_for(module: nn.Module, net: GPT, lora: LoRA, names: list[str], folder: Path) -> None:
    """``module`` adapted with ``lora``: here, when it has no LoRA of its own yet (its ``adapt`` hyperparameter then
    records it), else its own, which must be ``lora`` on the layers ``names``."""
    hparams = getattr(module, "hparams", None)
    given = Adaptation.of(hparams.get("adapt")) if hparams is not None else None
    if not adapted(module) and (given is None or given.lora is None):
        settings = Adaptation(lora=lora, trainable=given.trainable if given else None)
        if hparams is not None:
            hparams["adapt"] = dataclasses.asdict(settings)  # so its checkpoints rebuild the adapted layers
        adapt(module, settings)
        return
    adapt(module, given)  # once: nothing when it already is
    scale = lora.alpha / (math.sqrt(lora.r) if lora.rslora else lora.r)
    wrapped = lora_layers(net)
    same = set(wrapped) == set(names) and all(
        m.r["default"] == lora.r and math.isclose(m.scaling["default"], scale) and m.use_dora["default"] == lora.dora
        for m in wrapped.values()
    )
    if not same:
        raise InputError(
            f"The module's LoRA does not fit PEFT adapter {str(folder)!r}, which needs adapt.lora: "
            f"{json.dumps(dataclasses.asdict(lora))} (PEFT's separate q, k, v or gate, up adapters in the zoo's "
            f"fused layers)"
        )


def _fill(layer, parts: list[tuple[str, Tensor]], found: dict, config: dict, folder: Path, stack: bool) -> None:
    """Set one fused layer's adapter from its Hugging Face layers' ones, B's rows at theirs: A stacked and B
    block-diagonal (``stack``), or their one shared A."""
    r, dora = config["r"], config["dora"]
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    new_a, new_b = torch.zeros_like(a), torch.zeros_like(b)  # rank left over: zero (PEFT's scale, B, unchanged)
    # DoRA's magnitude is a norm per output row: rows without an adapter keep their weight's own.
    magnitude = torch.linalg.norm(layer.get_base_layer().weight, dim=1) if dora else None
    for j, (hf, rows) in enumerate(parts):
        tensors = found[hf]
        want = {"lora_A": (r, a.shape[1]), "lora_B": (len(rows), r)} | (
            {"lora_magnitude_vector": (len(rows),)} if dora else {}
        )
        got = {k: tuple(v.shape) for k, v in tensors.items()}
        if got != want:
            raise InputError(
                f"PEFT adapter {str(folder)!r} holds {hf} as {got}; its config (r={r}, use_dora={dora}) and the "
                f"model the zoo's net holds need {want}"
            )
        cols = slice(j * r, (j + 1) * r) if stack else slice(0, r)
        new_a[cols] = tensors["lora_A"]
        new_b[rows, cols] = tensors["lora_B"].to(b.dtype)
        if dora:
            magnitude[rows] = tensors["lora_magnitude_vector"].to(magnitude.dtype)
    a.copy_(new_a)
    b.copy_(new_b)
    if dora:
        layer.lora_magnitude_vector["default"].weight.copy_(magnitude)
