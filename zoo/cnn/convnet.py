"""A small ConvNet: conv-BN-ReLU stages with max-pooling, global average pool, linear head.

Notation: B batch, C channels, H/W height/width, K classes.
"""

from __future__ import annotations

from torch import Tensor, nn


def require_num_classes(net: str, num_classes: int | None) -> None:
    """A classifier is built with its number of classes: a config that leaves it unset gets the data's from
    ``cli.py`` (``zoo.app.sizes``) before the net is built; in Python it is given."""
    if num_classes is None:
        raise ValueError(f"{net} needs num_classes: the data's number of classes (cli.py takes it from the data)")


def _stage(c_in: int, c_out: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
        nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Dropout2d(dropout) if dropout > 0 else nn.Identity(),
    )


class ConvNet(nn.Module):
    """Stages of two 3x3 convolutions each, halving H/W per stage, doubling C."""

    def __init__(
        self,
        num_classes: int | None = None,
        in_channels: int = 1,
        width: int = 32,
        depth: int = 2,
        dropout: float = 0.0,
    ) -> None:
        """
        Args:
            num_classes: number of output classes K; a config may leave it unset: ``cli.py`` takes the data's.
            in_channels: image channels (1 for MNIST, 3 for RGB).
            width: channels of the first stage; each further stage doubles it.
            depth: number of stages (each halves the resolution).
            dropout: channel dropout after each stage (0 disables it).
        """
        require_num_classes("ConvNet", num_classes)
        super().__init__()
        self.num_classes = num_classes
        chans = [in_channels] + [width * 2**i for i in range(depth)]
        self.features = nn.Sequential(*(_stage(a, b, dropout) for a, b in zip(chans[:-1], chans[1:])))
        self.head = nn.Linear(chans[-1], num_classes)

    def io_layers(self) -> tuple[str, ...]:
        """The first convolution, on the pixels, and the classifier: Muon takes the hidden filters only."""
        return ("features.0.0", "head")

    def forward(self, x: Tensor) -> Tensor:
        x = self.features(x)  # (B, C, H / 2^depth, W / 2^depth)
        return self.head(x.mean(dim=(2, 3)))  # (B, K)
