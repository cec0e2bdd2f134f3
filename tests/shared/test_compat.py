"""One test per entry of zoo.compat: a Lightning or torch release that moves a private name fails here."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from conftest import CONFIGS
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel

from zoo import compat


def _trainer(**kw) -> Trainer:
    return Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False, **kw)


class Recorder(BoringModel):
    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.given = compat.given_hyperparameters()


def test_given_hyperparameters_are_the_cli_config_and_none_in_python():
    assert Recorder().given is None
    c = LightningCLI(Recorder, run=False, args=["--model.width=3", "--trainer.logger=false"])
    assert c.model.given["width"] == 3


class TwoStepsPerBatch(BoringModel):
    """Manual optimisation stepping twice per batch: global_step counts 2 per batch, the logger 1."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        for _ in range(2):
            opt.zero_grad()
            self.manual_backward(self.step(batch))
            opt.step()


def test_batches_that_stepped_counts_batches_not_optimizer_steps():
    trainer = _trainer(max_steps=-1, max_epochs=1, limit_train_batches=4, limit_val_batches=0)
    trainer.fit(TwoStepsPerBatch())
    assert trainer.global_step == 8 and compat.batches_that_stepped(trainer) == 4


class _InterruptInStep(BoringModel):
    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 3:
            raise KeyboardInterrupt  # inside the fourth batch's step: three batches are done, not four
        return super().training_step(batch, batch_idx)


def test_batches_trained_in_epoch_counts_batches_stepped_not_fetched():
    seen = []

    class Probe(Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            seen.append(compat.batches_trained_in_epoch(trainer))

        def on_exception(self, trainer, *args) -> None:
            seen.append(compat.batches_trained_in_epoch(trainer))

    def fit(model) -> None:
        _trainer(max_epochs=2, limit_train_batches=5, limit_val_batches=0, callbacks=[Probe()]).fit(model)

    with pytest.raises(SystemExit):  # Lightning's graceful shutdown on KeyboardInterrupt
        fit(_InterruptInStep())
    assert seen == [1, 2, 3, 3]  # the fourth batch was fetched, and interrupted before its step
    seen.clear()
    fit(BoringModel())
    assert seen == [1, 2, 3, 4, 5] * 2  # counted per epoch


def test_trainer_of_is_none_until_attached():
    model = BoringModel()
    assert compat.trainer_of(model) is None
    trainer = _trainer(max_steps=1, limit_val_batches=0)
    trainer.fit(model)
    assert compat.trainer_of(model) is trainer


class GetsWorse(BoringModel):
    def validation_step(self, batch, batch_idx):
        self.log("score", float(self.current_epoch))  # best at epoch 0 for mode "min"


class RefreshingCheckpoint(ModelCheckpoint):
    def on_train_epoch_end(self, trainer, pl_module):
        super().on_train_epoch_end(trainer, pl_module)
        compat.refresh_last_checkpoint(self, trainer, at_train_epoch_end=True)

    def on_validation_end(self, trainer, pl_module):
        super().on_validation_end(trainer, pl_module)
        compat.refresh_last_checkpoint(self, trainer, at_train_epoch_end=False)


@pytest.mark.parametrize("cls, fresh", [(ModelCheckpoint, False), (RefreshingCheckpoint, True)])
@pytest.mark.parametrize("at_train_epoch_end", [True, False])
def test_refresh_last_checkpoint_keeps_last_ckpt_current(tmp_path, cls, fresh, at_train_epoch_end):
    ckpt = cls(
        dirpath=tmp_path, monitor="score", mode="min", save_last=True, save_on_train_epoch_end=at_train_epoch_end
    )
    trainer = _trainer(max_epochs=3, limit_train_batches=2, limit_val_batches=1, callbacks=[ckpt])
    trainer.fit(GetsWorse())
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert ckpt.best_model_path.endswith("epoch=0-step=2.ckpt")
    # Lightning alone leaves last.ckpt at the best epoch's step: the gap this entry closes.
    assert (last["global_step"] == trainer.global_step) is fresh


def test_all_gather_with_grad_concatenates_ranks_and_passes_gradients(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        x = torch.randn(3, 2, requires_grad=True)
        out = compat.all_gather_with_grad(x)
        (out * 2).sum().backward()
        torch.testing.assert_close(out, x)
        torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    finally:
        dist.destroy_process_group()


def test_grad_scale_is_a_device_copy_of_the_scale():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    assert compat.grad_scale(scaler).item() == 8.0  # before the first scale(): the public fallback
    scaler.scale(torch.ones(()))
    scale = compat.grad_scale(scaler)
    scale.mul_(2)
    assert scaler.get_scale() == 8.0 and scale.item() == 16.0


def test_foreach_norm_equals_per_tensor_norms_in_float32():
    ts = [torch.randn(3, 4).bfloat16(), torch.randn(5).bfloat16()]
    want = torch.stack([torch.linalg.vector_norm(t.float()) for t in ts])
    got = compat.foreach_norm(ts, 2.0, dtype=torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)


def test_foreach_lerp_moves_targets_toward_sources():
    targets, sources = [torch.zeros(3), torch.ones(2)], [torch.ones(3), torch.full((2,), 3.0)]
    compat.foreach_lerp_(targets, sources, 0.25)
    torch.testing.assert_close(targets, [torch.full((3,), 0.25), torch.full((2,), 1.5)])


def _private_names_outside_compat() -> list[str]:
    """`_name`s read from torch, Lightning or any object whose class the project did not write, outside compat.

    A name the project defines somewhere (a method, an attribute it assigns, a parameter) is its own; any
    other single-underscore attribute, import or module path is a third party's private API.
    """
    import ast

    from conftest import ROOT

    files = [p for d in ("zoo", "callbacks", "datamodules") for p in (ROOT / d).rglob("*.py")] + [ROOT / "cli.py"]
    trees = {p: ast.parse(p.read_text()) for p in files}
    own = set()
    for tree in trees.values():
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(n.name)
            elif isinstance(n, ast.arg):
                own.add(n.arg)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                own.add(n.attr)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                own.add(n.id)

    def private(name: str) -> bool:
        # os._exit is the standard library's documented way to end a process without cleanup, not a private name
        return name.startswith("_") and not name.startswith("__") and name not in own and name != "_exit"

    found = []
    for path, tree in trees.items():
        if path == ROOT / "zoo" / "compat.py":
            continue
        for n in ast.walk(tree):
            names = []
            if isinstance(n, ast.Attribute):
                names = [n.attr]
            elif isinstance(n, ast.ImportFrom) and not (n.module or "").startswith(("zoo", "callbacks", "datamodules")):
                names = [a.name for a in n.names] + (n.module or "").split(".")
            elif isinstance(n, ast.Import):
                names = [part for a in n.names for part in a.name.split(".")]
            found += [f"{path.relative_to(ROOT)}:{n.lineno} {name}" for name in names if private(name)]
    return found


def test_no_private_torch_or_lightning_name_outside_compat():
    assert _private_names_outside_compat() == []


def test_load_sharded_equals_dcp_to_torch_save_and_reads_selected_keys(tmp_path):
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    state = {"m": {"w": torch.randn(3, 4)}, "opt": {"param_groups": [{"lr": 0.1, "betas": (0.9, 0.95)}]}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=tmp_path / "ckpt", no_dist=True)
        dcp_to_torch_save(tmp_path / "ckpt", tmp_path / "ref.pt")
        ref = torch.load(tmp_path / "ref.pt", weights_only=True)
        got = compat.load_sharded(FileSystemReader(tmp_path / "ckpt"))
        some = compat.load_sharded(FileSystemReader(tmp_path / "ckpt"), keys={"opt.param_groups.0.betas"})
    torch.testing.assert_close(got["m"]["w"], ref["m"]["w"], rtol=0, atol=0)
    assert got["opt"] == ref["opt"] and some == {"opt": {"param_groups": [{"betas": (0.9, 0.95)}]}}


def test_set_data_parallel_size_is_what_model_parallel_strategy_builds_its_mesh_from():
    import inspect

    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy(data_parallel_size="auto", tensor_parallel_size=1)
    compat.set_data_parallel_size(strategy, 6)
    assert strategy._data_parallel_size == 6
    assert "self._data_parallel_size" in inspect.getsource(ModelParallelStrategy.setup_environment)


class Wide(BoringModel):
    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()


class _Parsed(Exception):
    pass


class _StopBeforeInstantiating:
    def before_instantiate_classes(self) -> None:
        raise _Parsed(self.config.validate.model.width)


@pytest.mark.parametrize("mixin, width", [((), 3), ((compat.CheckpointHyperparametersLeftToCaller,), 5)])
def test_checkpoint_hyperparameters_left_to_caller_keeps_the_command_lines_values(tmp_path, mixin, width):
    import lightning

    torch.save(
        {
            "hyper_parameters": {"width": 3},
            "state_dict": Wide().state_dict(),
            "pytorch-lightning_version": lightning.__version__,
        },
        tmp_path / "wide.ckpt",
    )
    cls = type("CLI", (_StopBeforeInstantiating, *mixin, LightningCLI), {})
    with pytest.raises(_Parsed) as parsed:  # Lightning alone: the checkpoint's 3 silently beats the flag's 5
        cls(
            Wide,
            args=["validate", f"--ckpt_path={tmp_path / 'wide.ckpt'}", "--model.width=5", "--trainer.logger=false"],
        )
    assert parsed.value.args[0] == width


def test_migrate_checkpoint_upgrades_a_dict_already_read_as_load_from_checkpoint_does(tmp_path):
    trainer = _trainer(max_steps=1, limit_val_batches=0, default_root_dir=tmp_path)
    trainer.fit(Wide(width=4))
    trainer.save_checkpoint(tmp_path / "w.ckpt")
    ckpt = torch.load(tmp_path / "w.ckpt", weights_only=True)
    old = {k: v for k, v in ckpt.items() if k != "pytorch-lightning_version"}
    old["pytorch-lightning_version"] = "1.9.0"  # an older Lightning's checkpoint: the step the upgrade adds
    got = compat.migrate_checkpoint(old)
    assert got["pytorch-lightning_version"] == ckpt["pytorch-lightning_version"]
    torch.testing.assert_close(got["state_dict"], ckpt["state_dict"], rtol=0, atol=0)


def test_given_hyperparameters_context_is_what_save_hyperparameters_records():
    with compat.given_hyperparameters_context({"width": 9}, "some.instantiator"):
        module = Wide(width=4)
    assert dict(module.hparams) == {"width": 9, "_instantiator": "some.instantiator"}
    assert Wide(width=4).hparams.width == 4  # outside it, the frame's arguments


def test_jsonargparse_debug_follows_its_environment_variable(monkeypatch):
    monkeypatch.delenv("JSONARGPARSE_DEBUG", raising=False)
    assert compat.jsonargparse_debug() is False
    monkeypatch.setenv("JSONARGPARSE_DEBUG", "true")
    assert compat.jsonargparse_debug() is True


def test_print_config_skipped_lets_a_parse_with_print_config_finish():
    args = ["--model.width=3", "--print_config", "--trainer.logger=false"]
    with compat.print_config_skipped():
        c = LightningCLI(Recorder, run=False, args=args)
    assert c.model.given["width"] == 3
    with pytest.raises(SystemExit):  # outside it, jsonargparse prints and exits
        LightningCLI(Recorder, run=False, args=args)


class Rule:
    def __init__(self, pattern: str | None = None, count: int = 0, tags: dict[str, int] | None = None) -> None:
        pass


class Holder:
    def __init__(self, rule: Rule | None = None, until: list[str] | None = None) -> None:
        pass


def test_a_nested_flag_is_read_by_its_arguments_own_type():
    from jsonargparse import ArgumentParser

    compat.nested_flags_read_by_their_own_type()
    compat.nested_flags_read_by_their_own_type()  # once: a second call wraps nothing again
    parser = ArgumentParser(exit_on_error=False)
    parser.add_subclass_arguments(Holder, "holder")
    flags = [f"--holder.init_args.rule={__name__}.Rule", "--holder.init_args.until=['Q: a', b]"]
    flags += ["--holder.init_args.rule.init_args.pattern=Answer: (\\d+)", "--holder.init_args.rule.init_args.count=3"]
    flags += ["--holder.init_args.rule.init_args.tags={a: 1}"]
    got = parser.parse_args([f"--holder={__name__}.Holder", *flags]).holder.init_args
    assert got.until == ["Q: a", "b"] and got.rule.init_args.pattern == "Answer: (\\d+)"
    assert got.rule.init_args.count == 3 and got.rule.init_args.tags == {"a": 1}
    with pytest.raises(Exception, match="count"):
        parser.parse_args([f"--holder={__name__}.Holder", flags[0], "--holder.init_args.rule.init_args.count=x"])


def test_option_flags_lists_every_flag_a_parser_knows():
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("-c", "--config")
    parser.add_argument("--model.lr", type=float)
    assert set(compat.option_flags(parser)) == {"-h", "--help", "-c", "--config", "--model.lr"}


def test_weights_only_globals_are_what_torch_load_admits():
    import io
    import pickletools
    import zipfile

    names = compat.weights_only_globals()
    assert "torch.fx.graph_module._forward_from_src" not in names and "builtins.eval" not in names
    buf = io.BytesIO()  # every name torch.save writes for tensors, parameters and dtypes is admitted
    torch.save({"w": torch.ones(2), "p": torch.nn.Parameter(torch.ones(1)), "t": torch.bfloat16}, buf)
    with zipfile.ZipFile(buf) as z:
        ops = pickletools.genops(z.read("archive/data.pkl"))
        written = {arg.replace(" ", ".") for op, arg, _ in ops if op.name == "GLOBAL"}
    assert {"torch._utils._rebuild_tensor_v2", "torch.FloatStorage"} <= written <= names


def test_dcp_storage_info_type_is_what_the_filesystem_writer_stores(tmp_path):
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.randn(2, 3)}, checkpoint_id=tmp_path / "ckpt", no_dist=True)
    infos = list(FileSystemReader(tmp_path / "ckpt").read_metadata().storage_data.values())
    assert infos and all(type(i) is compat.dcp_storage_info_type() for i in infos)
    assert {"relative_path", "offset", "length"} <= set(vars(infos[0]))


def test_dump_config_again_makes_the_cli_dump_the_completed_config():
    # LightningCLI caches its dump at the first class it builds (the DataModule, which cli.py builds first); the
    # model's hyperparameters must show what the application completed afterwards (the net's sizes).
    from cli import main
    from zoo.compat import dump_config_again

    c = main(["--config", str(CONFIGS / "cnn" / "convnet_digits.yaml"), "--trainer.logger=false"], run=False)
    assert (
        c.model.hparams["net"]["init_args"]["num_classes"]
        == 10
        == c.config_dump["model"]["init_args"]["net"]["init_args"]["num_classes"]
    )
    c.config.model.init_args.net.init_args.num_classes = 3
    dump_config_again(c)
    c._dump_config()
    assert c.config_dump["model"]["init_args"]["net"]["init_args"]["num_classes"] == 3


def test_apply_keeping_float32_moves_but_never_casts_the_named_buffers():
    from torch import nn

    from zoo.compat import apply_keeping_float32

    class Held(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.register_buffer("kept", torch.tensor([0.1 + 1e-4]))
            self.register_buffer("other", torch.zeros(1))

        def _apply(self, fn, recurse=True):
            return apply_keeping_float32(self, fn, recurse, ("kept",))

    outer = nn.Sequential(Held())  # cast through a parent, as Lightning casts the whole module
    exact = outer[0].kept.clone()
    outer.to(torch.bfloat16)
    assert outer[0].lin.weight.dtype == outer[0].other.dtype == torch.bfloat16
    assert outer[0].kept.dtype == torch.float32 and torch.equal(outer[0].kept, exact)
    outer.to("meta")
    assert outer[0].kept.device.type == "meta" and outer[0].kept.dtype == torch.float32


def test_muon_is_torch_muons_update_of_a_matrix():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(6, 4))
    ref = torch.nn.Parameter(w.detach().clone())
    opt = torch.optim.Muon([ref], lr=0.1, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
    buf = torch.zeros_like(w)
    settings = {k: opt.param_groups[0][k] for k in ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients")}
    settings.update(eps=opt.param_groups[0]["eps"], ns_steps=5, adjust_lr_fn="match_rms_adamw")
    for _ in range(2):
        g = torch.randn(6, 4)
        ref.grad = g.clone()
        opt.step()
        with torch.no_grad():
            compat.muon_([w], [g], [buf], **settings)
    torch.testing.assert_close(w, ref, rtol=0, atol=0)
    torch.testing.assert_close(buf, opt.state[ref]["momentum_buffer"], rtol=0, atol=0)
