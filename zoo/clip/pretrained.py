"""What imported CLIP weights bring besides their tensors: how new images must look, the prompts, the tokenizer.

Weights trained by others expect images read as their training images were. The source says how:
  * a Hugging Face folder: ``preprocessor_config.json`` (``CLIPImageProcessor``: the shorter side to
    ``size.shortest_edge``, ``resample`` 3 = bicubic, a centre crop of ``crop_size``, ``image_mean``/``image_std``),
    OpenAI's recipe where the file is absent; read as transformers reads it (``ResizeCrop``'s ``transformers``);
  * an open_clip folder: ``open_clip_config.json``'s ``preprocess_cfg`` over open_clip's defaults (``PreprocessCfg``:
    bicubic, shortest-side resize, OpenAI's mean/std), the side from ``model_cfg.vision_cfg.image_size``;
  * an OpenAI/open_clip state dict file alone: OpenAI's recipe (Radford et al. 2021, ``clip.load``'s ``_transform``);
  * a SigLIP folder: ``SiglipImageProcessor``'s (both sides resized to ``size``, no crop, mean and std 0.5), whose
    tokenizer is its ``spiece.model`` run as ``SiglipTokenizer`` runs it (``zoo.io.siglip_tokenizer``).
A setting the zoo does not reproduce (a non-square crop, no crop, another filter or resize mode) is refused by name.
The zero-shot prompts default to OpenAI's 80 ImageNet templates (``zoo.clip.templates``); the tokenizer is the
folder's ``tokenizer.json`` when there is one, else for OpenAI-layout weights open_clip's ``SimpleTokenizer``
(``zoo.io.tokenizers.OpenCLIPTokenizer``).

Notation: S the tower's image side.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from zoo.clip.clip import CLIP
from zoo.clip.hf import clip_net, hf_clip_kwargs
from zoo.clip.open_clip_config import open_clip_kwargs
from zoo.clip.siglip import siglip_kwargs, siglip_net
from zoo.clip.templates import OPENAI_IMAGENET_TEMPLATES
from zoo.errors import InputError
from zoo.io.files import read_config, read_json
from zoo.io.tokenizers import BPETokenizer, OpenCLIPTokenizer, Tokenizer

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP's pixel statistics (clip.load's Normalize)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
OPEN_CLIP_CONFIG = "open_clip_config.json"
BPE_MERGES = "bpe_simple_vocab_16e6.txt.gz"  # OpenAI CLIP's merges, as open_clip and OpenAI's clip ship them
_RESAMPLE = {2: "bilinear", 3: "bicubic"}  # PIL's filter numbers, as preprocessor_config.json stores them


def _inputs(side: int, resize_side: int, mean, std, interpolation: str, like: str, crop: bool = True) -> dict:
    return {
        "image_shape": [3, side, side],
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
        "interpolation": interpolation,
        "resize_side": int(resize_side),
        "resize_like": like,
        "templates": list(OPENAI_IMAGENET_TEMPLATES),
        **({} if crop else {"crop": False}),
    }


def _refuse(where: Path, what: str) -> InputError:
    return InputError(f"{str(where)!r}: {what}, which the zoo does not reproduce: edit the file or preprocess yourself")


def _side(value, key: str, where: Path) -> int:
    """A square side from an int, ``{"shortest_edge": n}`` or ``{"height": n, "width": n}``."""
    if isinstance(value, int):
        return value
    if isinstance(value, dict) and isinstance(value.get("shortest_edge"), int):
        return value["shortest_edge"]
    if isinstance(value, dict) and isinstance(value.get("height"), int) and value.get("height") == value.get("width"):
        return value["height"]
    raise _refuse(where, f"{key}={value!r} is not a square side or a shortest edge")


def hf_inputs(folder: Path, side: int) -> dict:
    """The ``inputs`` of a Hugging Face CLIP folder whose vision tower reads S x S images."""
    path = folder / "preprocessor_config.json"
    cfg = read_json(path) if path.is_file() else {}
    if not isinstance(cfg, dict):
        raise _refuse(path, "not a JSON object")
    for flag in ("do_resize", "do_center_crop", "do_rescale", "do_normalize"):
        if cfg.get(flag, True) is not True:
            raise _refuse(path, f"{flag}={cfg[flag]!r}")
    if abs(float(cfg.get("rescale_factor", 1 / 255)) - 1 / 255) > 1e-12:
        raise _refuse(path, f"rescale_factor={cfg['rescale_factor']!r} (not 1/255)")
    interpolation = _RESAMPLE.get(cfg.get("resample", 3))
    if interpolation is None:
        raise _refuse(path, f"resample={cfg['resample']!r} (2 bilinear and 3 bicubic are)")
    crop = _side(cfg.get("crop_size", side), "crop_size", path)
    if crop != side:
        raise _refuse(path, f"crop_size {crop} for a vision tower of image_size {side}")
    resize = _side(cfg.get("size", side), "size", path)
    mean, std = cfg.get("image_mean", OPENAI_MEAN), cfg.get("image_std", OPENAI_STD)
    return _inputs(side, resize, mean, std, interpolation, "transformers")


# SiglipImageProcessor's settings the zoo reads, at its defaults, and those that change no pixel.
SIGLIP_PROCESSOR = {
    "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
    "rescale_factor": 1 / 255, "size": {"height": 224, "width": 224}, "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
}  # fmt: skip
SIGLIP_PROCESSOR_INERT = {"image_processor_type", "processor_class"}


def siglip_inputs(folder: Path, side: int) -> dict:
    """The ``inputs`` of a SigLIP folder (``SiglipImageProcessor``): both sides resized to S (no crop, the aspect ratio
    not kept), rescaled, normalised with its mean and std (0.5)."""
    path = folder / "preprocessor_config.json"
    cfg = read_json(path) if path.is_file() else {}
    if not isinstance(cfg, dict):
        raise _refuse(path, "not a JSON object")
    if unknown := sorted(set(cfg) - set(SIGLIP_PROCESSOR) - SIGLIP_PROCESSOR_INERT):
        raise _refuse(path, f"{', '.join(unknown)} (a SiglipImageProcessor setting the zoo does not read)")
    cfg = SIGLIP_PROCESSOR | cfg
    for flag in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
        if cfg[flag] is not True:
            raise _refuse(path, f"{flag}={cfg[flag]!r}")
    if abs(float(cfg["rescale_factor"]) - 1 / 255) > 1e-12:
        raise _refuse(path, f"rescale_factor={cfg['rescale_factor']!r} (not 1/255)")
    interpolation = _RESAMPLE.get(cfg["resample"])
    if interpolation is None:
        raise _refuse(path, f"resample={cfg['resample']!r} (2 bilinear and 3 bicubic are)")
    size = cfg["size"]
    if not (isinstance(size, dict) and set(size) == {"height", "width"} and size["height"] == size["width"] == side):
        raise _refuse(path, f"size={size!r} for a vision tower of image_size {side} (height and width {side} are)")
    return _inputs(side, side, cfg["image_mean"], cfg["image_std"], interpolation, "transformers", crop=False)


def open_clip_inputs(folder: Path, side: int) -> dict:
    """The ``inputs`` of an open_clip folder (``open_clip_config.json``) whose vision tower reads S x S images."""
    path = folder / OPEN_CLIP_CONFIG
    cfg = read_json(path)
    pre = cfg.get("preprocess_cfg", {}) if isinstance(cfg, dict) else None
    model = cfg.get("model_cfg") if isinstance(cfg, dict) else None
    vision = model.get("vision_cfg", {}) if isinstance(model, dict) else None
    if not isinstance(pre, dict) or not isinstance(vision, dict):
        raise _refuse(path, "no model_cfg/preprocess_cfg objects")
    size = pre.get("size", vision.get("image_size", side))  # open_clip sets it to the tower's image_size
    if size not in (side, [side, side]):
        raise _refuse(path, f"image size {size!r} for a vision tower of image_size {side}")
    if pre.get("resize_mode", "shortest") != "shortest":
        raise _refuse(path, f"resize_mode={pre['resize_mode']!r} (shortest is)")
    interpolation = pre.get("interpolation", "bicubic")
    if interpolation not in ("bicubic", "bilinear"):
        raise _refuse(path, f"interpolation={interpolation!r} (bicubic and bilinear are)")
    mean, std = pre.get("mean", OPENAI_MEAN), pre.get("std", OPENAI_STD)
    return _inputs(side, side, mean, std, interpolation, "torchvision")


def source_inputs(path: str | Path, net: CLIP) -> dict:
    """How new images must be read for the weights at ``path`` (a Hugging Face or open_clip folder, or an
    OpenAI/open_clip state dict file), with OpenAI's ImageNet templates as the zero-shot prompts."""
    path, side = Path(path), getattr(net.image_encoder, "image_size", None)
    if side is None:
        raise InputError("imported CLIP weights need a zoo.clip.VisionTransformer image tower (it states image_size)")
    if path.is_dir() and (path / OPEN_CLIP_CONFIG).is_file():
        return open_clip_inputs(path, side)
    if path.is_dir() and _model_type(path) == "siglip":
        return siglip_inputs(path, side)
    if path.is_dir():
        return hf_inputs(path, side)
    return _inputs(side, side, OPENAI_MEAN, OPENAI_STD, "bicubic", "torchvision")  # clip.load's _transform


def net_config(path: str | Path) -> dict | None:
    """The ``CLIP`` an open_clip folder's ``model_cfg`` or a Hugging Face CLIP folder's ``config.json`` states, as
    ``{class_path, init_args}`` (what ``cli.py`` builds the net from for ``init_weights: <folder>``); None where
    ``path`` is not such a folder (a state dict file, a zoo checkpoint: their nets are the config's)."""
    path = Path(path)
    if path.is_dir() and (path / OPEN_CLIP_CONFIG).is_file():
        cfg = read_json(path / OPEN_CLIP_CONFIG)
        model_cfg = cfg.get("model_cfg") if isinstance(cfg, dict) else None
        return clip_net(open_clip_kwargs(model_cfg, path / OPEN_CLIP_CONFIG))
    if not (path.is_dir() and (path / "config.json").is_file()):
        return None
    where = repr(str(path / "config.json"))
    config = read_config(path / "config.json")  # the GPT folders' rule: no code named, each field of its type
    model_type = config.get("model_type", "clip")
    if model_type == "siglip":
        return siglip_net(siglip_kwargs(config, path / "config.json"))
    if model_type == "siglip2":
        raise InputError(
            f"{where} is a SigLIP 2 model (model_type 'siglip2'), whose NaFlex patches and resized positions the zoo "
            "does not compute: use a SigLIP (model_type 'siglip') or CLIP folder"
        )
    if model_type != "clip":
        raise InputError(
            f"{where} states model_type {model_type!r}: the CLIP family loads Hugging Face CLIP ('clip') and SigLIP "
            "('siglip') folders, and open_clip folders (open_clip_config.json)"
        )
    if not {"vision_config", "text_config"} <= config.keys():
        raise InputError(f"{where} is a CLIP config without vision_config and text_config: not one CLIPModel wrote")
    try:
        return clip_net(hf_clip_kwargs(config, path / "config.json"))
    except InputError:
        raise
    except (KeyError, TypeError, ValueError) as err:
        raise InputError(f"{where}: {err}, which the zoo's CLIP does not read") from None


def _model_type(folder: Path) -> Any:
    config = read_config(folder / "config.json") if (folder / "config.json").is_file() else {}
    return config.get("model_type")


def check_reads_as_source(data: dict | None, source: dict) -> None:
    """An ``InputError`` naming the setting when a DataModule's image format (``image_inputs``) is not the imported
    weights': the side, mean and std the weights were trained with. None (no image format stated) passes."""
    for key, setting in (("image_shape", "image_size"), ("mean", "mean"), ("std", "std")):
        ours, theirs = (data or {}).get(key), source[key]
        if ours is not None and [round(v, 6) for v in ours] != [round(v, 6) for v in theirs]:
            value = theirs[-1] if key == "image_shape" else theirs
            raise InputError(
                f"the data reads images with {key} {ours} but the imported weights were trained with {theirs}: pass "
                f"--data.init_args.{setting}={json.dumps(value)}"
            )


def source_tokenizer(path: str | Path, layout: str = "hf") -> Tokenizer | None:
    """The tokenizer the weights at ``path`` were trained with, or None.

    OpenAI-layout weights (open_clip's, OpenAI's) take open_clip's ``SimpleTokenizer``, built from
    ``bpe_simple_vocab_16e6.txt.gz`` (in the folder, or the one open_clip installs), even where the folder also holds
    transformers' files (hub snapshots of open_clip models do): their ``tokenizer.json`` skips ftfy's cleaning. An
    open_clip config naming a Hugging Face tokenizer, and any Hugging Face folder, take the folder's ``tokenizer.json``.
    """
    path = Path(path)
    folder = path if path.is_dir() else None
    if layout == "siglip" and folder is not None:
        from zoo.io.siglip_tokenizer import SiglipTokenizer

        return SiglipTokenizer.from_folder(folder)
    hf_json = folder / "tokenizer.json" if folder is not None else None
    hf_json = hf_json if hf_json is not None and hf_json.is_file() else None
    config = folder / OPEN_CLIP_CONFIG if folder is not None else None
    config = config if config is not None and config.is_file() else None
    if layout == "openai" and (config is not None or hf_json is None):
        if config is None or _simple_tokenizer(config, hf_json is not None):
            return OpenCLIPTokenizer.from_merges_file(_merges_file(folder))
    return BPETokenizer.load(hf_json) if hf_json is not None else None


def _simple_tokenizer(config: Path, has_tokenizer_json: bool) -> bool:
    """Whether an open_clip config asks for its ``SimpleTokenizer`` (False: a Hugging Face one the folder holds)."""
    cfg = read_json(config)
    model = cfg.get("model_cfg") if isinstance(cfg, dict) else None
    text = model.get("text_cfg", {}) if isinstance(model, dict) else None
    if not isinstance(text, dict):
        raise _refuse(config, "model_cfg.text_cfg is not an object")
    if text.get("hf_tokenizer_name"):
        if has_tokenizer_json:
            return False
        raise InputError(
            f"{str(config)!r} names the Hugging Face tokenizer {text['hf_tokenizer_name']!r}: put its tokenizer.json "
            "in the folder (nothing is downloaded)"
        )
    kwargs = text.get("tokenizer_kwargs") or {}
    if not isinstance(kwargs, dict) or set(kwargs) - {"clean"} or kwargs.get("clean", "lower") != "lower":
        raise _refuse(config, f"tokenizer_kwargs={kwargs!r} (open_clip's default clean='lower' is reproduced)")
    return True


def _merges_file(folder: Path | None) -> Path:
    if folder is not None and (folder / BPE_MERGES).is_file():
        return folder / BPE_MERGES
    spec = importlib.util.find_spec("open_clip")  # located, not imported: nothing of it runs
    for root in (spec.submodule_search_locations or []) if spec else []:
        if (Path(root) / BPE_MERGES).is_file():
            return Path(root) / BPE_MERGES
    raise InputError(
        f"open_clip weights tokenize with OpenAI's BPE, {BPE_MERGES}: put it in the weights' folder or pip install "
        "open_clip_torch, which ships it"
    )
