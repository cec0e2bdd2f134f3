"""The application's table of the families (zoo.tracking.families): a row for every module the families export, and
every class path in it names the application's own class of the right kind."""

from __future__ import annotations

import importlib
import inspect

import pytest
from lightning.pytorch import Callback, LightningDataModule, LightningModule

from zoo.tracking.families import FAMILIES, UNLISTED, family_of

PACKAGES = ("zoo.gpt", "zoo.clip", "zoo.cnn", "zoo.diffusion", "zoo.rl")


def exported_modules() -> list[type]:
    classes = (v for p in PACKAGES for v in vars(importlib.import_module(p)).values())
    return [
        c
        for c in classes
        if inspect.isclass(c)
        and issubclass(c, LightningModule)
        and not inspect.isabstract(c)
        and c.__name__ != "AgentModule"
    ]  # the RL agents' base class trains nothing itself


@pytest.mark.parametrize("cls", exported_modules(), ids=lambda c: c.__name__)
def test_every_module_a_family_exports_has_a_row(cls):
    row = family_of(cls)
    assert row is not UNLISTED, f"add {cls.__module__}.{cls.__name__} to zoo.tracking.families.FAMILIES"
    assert row.monitor and row.monitor.startswith("val/") and row.monitor_mode in ("min", "max")


@pytest.mark.parametrize("path", sorted(FAMILIES))
def test_the_tables_class_paths_are_the_applications_own_classes(path):
    row = FAMILIES[path]
    module, _, name = path.rpartition(".")
    assert issubclass(getattr(importlib.import_module(module), name), LightningModule)
    for callback in row.callbacks:
        assert callback.startswith("callbacks.")
        assert issubclass(getattr(importlib.import_module("callbacks"), callback.split(".", 1)[1]), Callback)
    if row.predict_data:
        assert row.predict_data.startswith("datamodules.")
        assert issubclass(
            getattr(importlib.import_module("datamodules"), row.predict_data.split(".", 1)[1]), LightningDataModule
        )


def test_a_subclass_takes_its_familys_row_and_an_unknown_module_the_plain_defaults():
    from zoo.cnn import ClassifierModule

    class Mine(ClassifierModule):
        pass

    assert family_of(Mine) is FAMILIES["zoo.cnn.ClassifierModule"]
    from zoo.gpt import GRPOModule  # in zoo.gpt.tune.grpo, two levels below the package that exports it

    assert family_of(GRPOModule) is FAMILIES["zoo.gpt.GRPOModule"]
    assert family_of(LightningModule) is UNLISTED and UNLISTED.monitor is None and UNLISTED.callbacks == ()
