"""Images and videos that ``predict_step`` returns, written as files beside the predictions (``WritePredictions``).

The modules under ``zoo/`` never write files themselves: a predict step puts its media in its output dict under
two keys, a protocol rather than an import (``zoo/`` does not import ``callbacks/``):
  - ``"images"``: a float tensor (B, C, H, W) in [0, 1], one image per row of the predictions. Each becomes a PNG,
    and all of them one grid; images smaller than ``MIN_SIDE`` pixels are enlarged by an integer factor with
    nearest-neighbour sampling, so a 16 px sample is readable and its pixels stay sharp. ``"images_dir"``
    (optional, a str) names their folder inside the run's folder.
  - ``"video"``: ``{"frames": [(H, W, 3) uint8 arrays], "fps": int, "name": str, "dir": str | None,
    "format": "gif" | "mp4"}``, one recorded episode. GIF needs only Pillow and MLflow shows it inline; MP4
    needs moviepy (what gymnasium's ``RecordVideo`` writes with).
Folders are names inside the run's folder (``zoo.tracking.in_run_dir``), and no file is written over: a taken
name becomes ``<stem>-1``, ``<stem>-2``, ... (``new_file``).
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image
from torch import Tensor

from zoo.io.new_inputs import to_uint8

IMAGES, IMAGES_DIR, VIDEO = "images", "images_dir", "video"
MIN_SIDE = 128  # pixels: smaller images are enlarged to at least this


def split_media(batches: list[dict]) -> tuple[list[dict], list[Tensor], str | None, list[dict]]:
    """(the batches without their media, the image tensors in batch order, their folder if named, the videos)."""
    rows, images, folder, videos = [], [], None, []
    for b in batches:
        if IMAGES in b:
            images.append(b[IMAGES])
        folder = folder or b.get(IMAGES_DIR)
        if VIDEO in b and b[VIDEO] is not None:
            videos.append(b[VIDEO])
        rows.append({k: v for k, v in b.items() if k not in (IMAGES, IMAGES_DIR, VIDEO)})
    return rows, images, folder, videos


def new_file(path: Path) -> tuple[BinaryIO, Path]:
    """``path`` created for writing (binary), or ``<stem>-1<suffix>``, ``-2``, ... when the name is taken: exclusive
    creation, so no output ever replaces a file, another run's or an earlier predict's in the same run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count():
        candidate = path if n == 0 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        try:
            return candidate.open("xb"), candidate
        except FileExistsError:
            continue


def _save_png(image: Image.Image, path: Path) -> Path:
    f, path = new_file(path)
    with f:
        image.save(f, format="PNG")
    return path


def to_pil(image: Tensor) -> Image.Image:
    """(C, H, W) in [0, 1] -> an 8-bit image, enlarged by an integer factor when smaller than ``MIN_SIDE``."""
    array = to_uint8(image).numpy()  # (H, W, C): the pixels an MLflow model's PNGs hold too
    pil = Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array)
    factor = math.ceil(MIN_SIDE / min(pil.size))
    return pil.resize((pil.width * factor, pil.height * factor), Image.NEAREST) if factor > 1 else pil


def write_images(images: Tensor, names: list[str], folder: Path, grid_name: str = "grid") -> tuple[list[Path], Path]:
    """One PNG per image (``<folder>/<name>.png``) and a grid of all (``<folder>/<grid_name>.png``)."""
    from torchvision.utils import make_grid

    paths = [_save_png(to_pil(image), folder / f"{name}.png") for image, name in zip(images, names)]
    nrow = math.ceil(math.sqrt(len(images)))
    grid = make_grid(images.detach().float().cpu(), nrow=nrow, padding=1, pad_value=1.0)  # (C, H', W')
    side = min(images.shape[-2:])  # enlarge by the single image's factor, so the grid's tiles match the PNGs
    factor = max(1, math.ceil(MIN_SIDE / side))
    grid = grid.repeat_interleave(factor, dim=1).repeat_interleave(factor, dim=2)
    return paths, _save_png(to_pil(grid), folder / f"{grid_name}.png")


def write_video(video: dict, folder: Path) -> Path:
    """The recorded frames as ``<folder>/<name>.gif`` (Pillow) or ``.mp4`` (moviepy), ``name`` made a plain file name
    (an env id such as ``ALE/Pong-v5`` names no subfolder)."""
    name = re.sub(r"[^\w.-]+", "_", str(video["name"])).lstrip(".") or "episode"
    frames, fps = [np.asarray(f, dtype=np.uint8) for f in video["frames"]], int(video.get("fps", 30))
    if video.get("format", "gif") == "mp4":
        try:
            from moviepy import ImageSequenceClip
        except ImportError as err:
            raise ImportError(
                "an MP4 video needs moviepy (pip install moviepy); video_format: gif needs only Pillow"
            ) from err
        f, path = new_file(folder / f"{name}.mp4")
        f.close()  # the name is taken for this run; moviepy writes the file by name
        ImageSequenceClip(frames, fps=fps).write_videofile(str(path), logger=None)
        return path
    f, path = new_file(folder / f"{name}.gif")
    images = [Image.fromarray(frame) for frame in frames]
    with f:
        images[0].save(f, format="GIF", save_all=True, append_images=images[1:], duration=round(1000 / fps), loop=0)
    return path
