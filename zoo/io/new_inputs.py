"""What a trained image model needs to be used on new files, and how its predictions on them read.

A net trained on normalised images predicts well on a new file only if the file is read as the training data was:
the same channels and side, the same per-channel mean and std. The module records these, with the class names (and
CLIP's prompt templates), from its DataModule at fit (``image_inputs``) and keeps them in its checkpoint and MLflow
model as ``inputs``, so ``datamodules.ImageFilesDataModule`` can read new files without the training config.
Imported CLIP weights record their source's reading instead (``interpolation``, ``resize_side``, ``resize_like``:
``zoo.clip.pretrained``). ``image_transform`` and ``read_image`` are that reading, for the CLI's files and for the
bytes an MLflow model is sent alike; ``to_uint8`` is how generated images become 8-bit pixels.

Notation: B batch, C channels, H/W height/width, K classes.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from zoo.errors import InputError

# CLIP's zero-shot prompts when neither the request nor the training data gives any.
DEFAULT_TEMPLATES = ("a photo of a {}.", "a picture of a {}.", "{}")


def prompt(template: str, name: str) -> str:
    """A zero-shot prompt: ``template`` with each ``{}`` (or ``{0}``) the class ``name``. A template is stored data
    (a checkpoint's inputs, a request's param), and ``str.format`` would read attributes (``{0.__class__}``) or pad
    to any width (``{0:>999999999}``, gigabytes): any field but a bare one is refused in one line."""
    import string

    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
    except ValueError as err:  # an unmatched brace
        raise InputError(f"the zero-shot template {template[:80]!r} is not a prompt with {{}} fields ({err})") from None
    bad = [f"{{{f}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}" for f, spec, conv in fields]
    bad = [b for b, (f, spec, conv) in zip(bad, fields, strict=True) if f not in ("", "0") or spec or conv]
    if bad:
        raise InputError(
            f"the zero-shot template {template[:80]!r} has the field {bad[0][:40]}: a template marks the class name "
            "with {} alone (no index, attribute, conversion or format spec)"
        )
    try:
        return template.format(*[name] * len(fields))
    except ValueError as err:  # {} and {0} in one template
        raise InputError(f"the zero-shot template {template[:80]!r} mixes {{}} and {{0}} ({err})") from None


def image_inputs(datamodule: Any) -> dict | None:
    """``{"image_shape", "mean", "std", "interpolation", "class_names", "templates"}`` from an image DataModule's
    protocol attributes (``image_shape``, ``normalization``, ``interpolation``, ``class_names``, ``templates``), or
    None without them."""
    shape = getattr(datamodule, "image_shape", None)
    if shape is None:
        return None
    spec: dict[str, Any] = {"image_shape": [int(s) for s in shape]}
    normalization = getattr(datamodule, "normalization", None)
    if normalization is not None:
        spec["mean"], spec["std"] = ([float(v) for v in part] for part in normalization)
    if getattr(datamodule, "interpolation", None):
        spec["interpolation"] = str(datamodule.interpolation)
    for key in ("class_names", "templates"):
        values = getattr(datamodule, key, None)
        if values:
            spec[key] = [str(v) for v in values]
    return spec


def top_k_columns(probs: Tensor, class_names: list[str] | None, k: int = 5) -> dict[str, Any]:
    """Prediction columns from (B, K) class probabilities: ``pred`` (index), ``class`` (name) and ``confidence``
    of the best class, then ``class_<i>`` and ``confidence_<i>`` of the i-th best, for i up to min(k, K)."""
    conf, idx = probs.float().topk(min(k, probs.shape[-1]), dim=-1)  # (B, k) each, best first
    names = class_names or [str(i) for i in range(probs.shape[-1])]
    out: dict[str, Any] = {"pred": idx[:, 0]}
    for i in range(idx.shape[1]):
        suffix = "" if i == 0 else f"_{i + 1}"
        out[f"class{suffix}"] = [names[j] for j in idx[:, i].tolist()]
        out[f"confidence{suffix}"] = conf[:, i]
    return out


def image_transform(
    inputs: dict | None,
    image_size: int | None = None,
    channels: int | None = None,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
) -> tuple[str, Callable]:
    """The PIL mode and transform (resize the shorter side, centre-crop, to a tensor, normalise) that read a new
    image as the training data was: the settings given, else the model's ``inputs``."""
    from torchvision import transforms as T

    spec = inputs or {}
    shape = spec.get("image_shape")
    side, channels = image_size or (shape and shape[-1]), channels or (shape and shape[0])
    mean, std = mean or spec.get("mean"), std or spec.get("std")
    if not side or not channels or mean is None or std is None:
        raise ValueError(
            "the model records no input format (a checkpoint from before the zoo recorded one, or "
            "a model built in Python): pass --data.init_args.image_size, channels, mean and std"
        )
    mode = "L" if channels == 1 else "RGB"
    resize = spec.get("resize_side") if not image_size else image_size
    crop = ResizeCrop(
        side,
        resize or side,
        spec.get("interpolation", "bilinear"),
        spec.get("resize_like", "torchvision"),
        spec.get("crop", True),
    )
    return mode, T.Compose([crop, T.ConvertImageDtype(torch.float32), T.Normalize(mean, std)])


class ResizeCrop:
    """A PIL image -> (C, side, side) uint8: its shorter side resized to ``resize_side``, then a centred square cut.

    Done as the library the weights come from does it, since the two ways differ by up to one pixel level and the
    crop by one pixel: ``torchvision`` (OpenAI's ``clip``, open_clip, the zoo's own data) resizes the PIL image
    with PIL's filter and rounds the crop offset; ``transformers`` (``CLIPImageProcessor``, v5) resizes a uint8
    tensor with torchvision's antialiased kernel and floors the offset. Module-level, so DataLoader workers pickle it.
    """

    def __init__(
        self, side: int, resize_side: int, interpolation: str = "bilinear", like: str = "torchvision", crop: bool = True
    ) -> None:
        if interpolation not in ("bilinear", "bicubic") or like not in ("torchvision", "transformers"):
            raise InputError(
                f"unknown image resizing {interpolation!r} like {like!r}: bilinear or bicubic, like "
                "torchvision or transformers"
            )
        if resize_side < side:
            raise InputError(f"images resized to {resize_side} cannot be cropped to {side}")
        if not crop and like != "transformers":
            raise InputError("images resized without a crop are read like transformers (SiglipImageProcessor) only")
        self.side, self.resize_side, self.interpolation, self.like = side, resize_side, interpolation, like
        self.crop = crop  # False: both sides to ``side``, the aspect ratio not kept (SiglipImageProcessor)

    def __call__(self, image) -> Tensor:
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms.v2 import functional as F

        mode, s = InterpolationMode(self.interpolation), self.side
        if self.like == "torchvision":
            image = F.center_crop(F.resize(image, [self.resize_side], interpolation=mode), [s, s])
            return F.pil_to_tensor(image)
        if not self.crop:
            return F.resize(F.pil_to_tensor(image), [s, s], interpolation=mode, antialias=True)  # (C, S, S)
        x = F.resize(F.pil_to_tensor(image), [self.resize_side], interpolation=mode, antialias=True)  # (C, H, W)
        top, left = (x.shape[-2] - s) // 2, (x.shape[-1] - s) // 2
        return x[:, top : top + s, left : left + s]


def read_image(image: bytes | np.ndarray, mode: str, transform: Callable, name: str = "image") -> Tensor:
    """(C, H, W) ``transform`` of one image: encoded bytes (PNG, JPEG, ... or base64 text of them, as JSON
    carries bytes) or a uint8 array (H, W) or (H, W, C)."""
    from PIL import Image

    if isinstance(image, np.ndarray) and image.dtype != object:
        if image.dtype != np.uint8 or image.ndim not in (2, 3):
            raise InputError(f"{name}: an image array is uint8 (H, W) or (H, W, C), not {image.dtype} {image.shape}")
        pil = Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image)
        return transform(pil.convert(mode))
    if isinstance(image, str):
        image = image.encode()
    if not isinstance(image, (bytes, bytearray)):
        raise InputError(f"{name}: expected the bytes of an image file (base64 in JSON), got {type(image).__name__}")
    raw = bytes(image)
    try:
        return _open(raw, mode, transform)
    except InputError:
        pass
    try:  # not an image as it is: base64 text of one (MLflow's "inputs" and "instances" pass that on as it came)
        return _open(base64.b64decode(b"".join(raw.split()), validate=True), mode, transform)
    except (binascii.Error, InputError) as err:
        raise InputError(f"{name} is not an image PIL can read: send PNG, JPEG, ... bytes (base64 in JSON)") from err


def _open(data: bytes, mode: str, transform: Callable) -> Tensor:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            return transform(im.convert(mode))
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise InputError(str(err)) from err


def to_uint8(images: Tensor) -> Tensor:
    """(B, C, H, W) or (C, H, W) in [0, 1] -> uint8 channels-last: the 8-bit pixels a PNG of them holds."""
    return (images.detach().float().cpu().clamp(0, 1) * 255).round().to(torch.uint8).movedim(-3, -1)


def png_bytes(pixels: Tensor | np.ndarray) -> bytes:
    """A PNG of (H, W, C) uint8 pixels (C 1 or 3)."""
    from PIL import Image

    array = np.asarray(pixels)
    buf = io.BytesIO()
    Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array).save(buf, format="PNG")
    return buf.getvalue()
