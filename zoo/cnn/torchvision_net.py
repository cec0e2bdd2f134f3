"""Any torchvision classification model by name, with weights from a local file.

torchvision's own ``weights=`` downloads from a hub; here weights come only from a path, loaded
weights-only (see ``zoo.io.weights``).
"""

from __future__ import annotations

from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchvision import models

from zoo.cnn.convnet import require_num_classes
from zoo.io.weights import extract_state_dict, load_file, load_with_new_head

_NO_DECAY = {"class_token", "pos_embedding", "cls_token", "relative_position_bias_table", "position_embedding"}


class TorchvisionNet(nn.Module):
    """Wraps ``torchvision.models.get_model(name)``; ``self.model`` keeps torchvision's key layout."""

    def __init__(self, name: str = "resnet18", num_classes: int | None = None, weights_path: str | None = None) -> None:
        """
        Args:
            name: a torchvision classification model name, e.g. "resnet50", "convnext_tiny", "vit_b_16".
            num_classes: number of output classes (a config may leave it unset: ``cli.py`` takes the data's). A
                weights file with another number keeps its backbone and gets a new head (fine-tuning).
            weights_path: a local ``.pth``/``.safetensors`` file of torchvision weights, or None.
        """
        require_num_classes("TorchvisionNet", num_classes)
        super().__init__()
        available = models.list_models(module=models)
        if name not in available:
            raise ValueError(f"unknown torchvision model {name!r}; choose one of: {', '.join(available)}")
        self.model = models.get_model(name, weights=None, num_classes=num_classes)
        self.num_classes = num_classes
        if weights_path:
            state_dict = extract_state_dict(load_file(weights_path))
            for line in load_with_new_head(self.model, state_dict, f"weights file {weights_path!r}"):
                rank_zero_info(f"weights_path: replaced the classifier head, {line}")

    def no_weight_decay(self) -> list[str]:
        """Position embeddings, class tokens and relative-position tables (ViT, Swin) do not decay."""
        return [n for n, _ in self.named_parameters() if n.rsplit(".", 1)[-1] in _NO_DECAY]

    def io_layers(self) -> tuple[str, ...]:
        """The first and the last convolution or linear layer in torchvision's registration order (the stem and
        the classifier of its ResNets, ConvNeXts, EfficientNets, ViTs): Muon takes the layers between."""
        layers = [n for n, m in self.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        return (layers[0], layers[-1]) if layers else ()

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, K)
        return self.model(x)
