"""ResNet-18/34/50 (He et al. 2016) built on torchvision's blocks, with a choice of stem.

The ImageNet stem (7x7 stride-2 conv + max-pool) shrinks a 32x32 image to 8x8 before the first
stage; the CIFAR stem (3x3 stride-1 conv, no pool, He et al. 2016 section 4.2) keeps small images
at full resolution, which is what makes ResNets work on CIFAR and MNIST.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn
from torchvision.models import resnet

from zoo.cnn.convnet import require_num_classes

_DEPTHS = {
    18: (resnet.BasicBlock, [2, 2, 2, 2]),
    34: (resnet.BasicBlock, [3, 4, 6, 3]),
    50: (resnet.Bottleneck, [3, 4, 6, 3]),
}


class ResNet(resnet.ResNet):
    """torchvision's ResNet with a configurable depth, input channels and stem."""

    def __init__(
        self,
        depth: Literal[18, 34, 50] = 18,
        num_classes: int | None = None,
        in_channels: int = 3,
        stem: Literal["cifar", "imagenet"] = "cifar",
        zero_init_residual: bool = True,
    ) -> None:
        """
        Args:
            depth: 18, 34 or 50 layers.
            num_classes: number of output classes; a config may leave it unset: ``cli.py`` takes the data's.
            in_channels: image channels.
            stem: "cifar" (3x3 conv, no pool) for images up to ~64px, "imagenet" (7x7/2 + pool).
            zero_init_residual: start each residual branch at zero (Goyal et al. 2017).
        """
        require_num_classes("ResNet", num_classes)
        block, layers = _DEPTHS[depth]
        super().__init__(block, layers, num_classes=num_classes, zero_init_residual=zero_init_residual)
        self.num_classes = num_classes
        if stem == "cifar":
            self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        elif in_channels != 3:
            self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")

    def io_layers(self) -> tuple[str, ...]:
        """The stem convolution and the classifier: Muon takes the hidden filters only."""
        return ("conv1", "fc")

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) -> (B, K)
        return super().forward(x)
