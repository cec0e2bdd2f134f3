"""CNN classifiers: a small ConvNet, ResNets, and any torchvision or timm model by name."""

from zoo.cnn.convnet import ConvNet
from zoo.cnn.module import ClassifierModule
from zoo.cnn.resnet import ResNet
from zoo.cnn.timm_net import TimmNet
from zoo.cnn.torchvision_net import TorchvisionNet

__all__ = ["ClassifierModule", "ConvNet", "ResNet", "TimmNet", "TorchvisionNet"]
