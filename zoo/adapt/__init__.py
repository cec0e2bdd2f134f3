"""Cheap adaptation of any family's module: LoRA (through PEFT), freezing by name, folding adapters back in."""

from zoo.adapt.lora import adapt, adapted, merge
from zoo.adapt.settings import Adaptation, LoRA

__all__ = ["Adaptation", "LoRA", "adapt", "adapted", "merge"]
