"""Any timm model by name, built by timm itself, with weights from a local file.

timm's ``pretrained=True`` downloads from a hub; here the architecture comes from timm's own registry by name
(``timm.create_model(name, pretrained=False)``) and the weights only from a path, loaded weights-only
(``zoo.io.weights``), exactly or with a new classifier head (timm's ``pretrained_cfg["classifier"]`` names it). Names
are timm's registered architectures, with an optional pretrained tag (``resnet50.a1_in1k``); an ``hf-hub:`` or
``local-dir:`` name, which makes timm read a config from the hub or a folder, is refused. timm is optional (the
``timm`` extra): without it, TimmNet says what to install.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from zoo.cnn.convnet import require_num_classes
from zoo.errors import InputError, import_extra
from zoo.io.weights import extract_state_dict, load_file, load_with_new_head


def _timm():
    import_extra("timm", "zoo.cnn.TimmNet")  # or one line naming the extra
    import timm  # an import statement: a logged model's requirements are read from these

    return timm


class TimmNet(nn.Module):
    """Wraps ``timm.create_model(name)``; ``self.model`` keeps timm's key layout, so timm's weights files load."""

    def __init__(
        self,
        name: str = "resnet18",
        num_classes: int | None = None,
        weights_path: str | None = None,
        img_size: int | None = None,
        in_chans: int = 3,
    ) -> None:
        """
        Args:
            name: a timm architecture, optionally with its pretrained tag: "resnet50", "vit_tiny_patch16_224",
                "convnext_tiny.fb_in22k".
            num_classes: number of output classes (a config may leave it unset: ``cli.py`` takes the data's). A
                weights file with another number keeps its backbone and gets a new head (fine-tuning).
            weights_path: a local ``.pth``/``.bin``/``.safetensors`` file of timm weights, or None.
            img_size: the input size of models built for one (ViTs and their position embeddings); None: the
                model's default. Models without one (ResNets) refuse it.
            in_chans: input channels.
        """
        require_num_classes("TimmNet", num_classes)
        super().__init__()
        timm = _timm()
        if ":" in name or name.split(".")[0] not in timm.list_models():
            raise InputError(f"TimmNet: {name!r} is not an architecture timm registers (timm.list_models() lists them)")
        sized = {} if img_size is None else {"img_size": img_size}
        self.model = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_chans, **sized)
        self.num_classes, self.img_size = num_classes, img_size
        if weights_path:
            state_dict = extract_state_dict(load_file(weights_path))
            for line in load_with_new_head(self.model, state_dict, f"weights file {weights_path!r}", self.heads()):
                rank_zero_info(f"weights_path: replaced the classifier head, {line}")

    def heads(self) -> list[str]:
        """The classifier's module names as timm states them (``fc``, ``head``, ``head.fc``; two for distilled ViTs)."""
        named = self.model.pretrained_cfg.get("classifier") or ()
        return [named] if isinstance(named, str) else list(named)

    def preprocessing(self) -> dict[str, Any]:
        """timm's pretrained preprocessing for this model: input_size, interpolation, mean, std, crop_pct, crop_mode
        (``timm.data.resolve_data_config``), for the data side to apply as the weights were trained with. A model built
        at another ``img_size`` takes that size: timm's pretrained config still states the size it was published at."""
        config = _timm().data.resolve_data_config({}, model=self.model)
        if self.img_size is not None:
            config["input_size"] = (config["input_size"][0], self.img_size, self.img_size)
        return config

    def no_weight_decay(self) -> list[str]:
        """What timm says does not decay (position embeddings, class tokens), under ``model.``."""
        skip = getattr(self.model, "no_weight_decay", lambda: ())()
        return [f"model.{name}" for name in skip]

    def io_layers(self) -> tuple[str, ...]:
        """The first convolution or linear layer (the stem or patch embedding) and the classifier head: Muon takes the
        layers between."""
        layers = [n for n, m in self.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        return (layers[0], *(f"model.{h}" for h in self.heads())) if layers else ()

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, K)
        return self.model(x)
