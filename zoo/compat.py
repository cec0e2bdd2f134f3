"""Every private Lightning/torch name the zoo relies on, in one place, each with a test (tests/shared/test_compat.py).

Each entry says why no public API serves. A Lightning or torch upgrade that breaks one breaks its test here,
not a training run. Entries whose public replacement appears should move to it and leave this file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor


def given_hyperparameters() -> dict[str, Any] | None:
    """The config LightningCLI is instantiating the module from (nets as ``{class_path, init_args}``), else None.

    Lightning passes it to ``save_hyperparameters`` through a context variable with no public accessor;
    ``zoo.io.hparams`` needs it to tell an injected net (keep its config) from a Python object (drop it).
    """
    from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters

    return _given_hyperparameters.get()


@contextlib.contextmanager
def given_hyperparameters_context(hparams: dict[str, Any], instantiator: str) -> Iterator[None]:
    """Construct a module as LightningCLI does: ``save_hyperparameters`` records ``hparams`` (the config, nets as
    ``{class_path, init_args}``) and ``instantiator``, not the objects the constructor receives. ``zoo.io.build``
    builds stored configs itself, and its modules must record the same hyperparameters as a CLI-built one."""
    from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters_context

    with _given_hyperparameters_context(dict(hparams), instantiator):
        yield


def batches_that_stepped(trainer: pl.Trainer) -> int:
    """Batches that stepped the optimizer so far: the step Lightning's logger connector writes metrics at.

    ``trainer.global_step`` counts every ``optimizer.step()`` (several per batch under manual optimisation),
    so it is not the step logged values land on; Lightning keeps this counter on its epoch loop only.
    """
    return trainer.fit_loop.epoch_loop._batches_that_stepped


def batches_trained_in_epoch(trainer: pl.Trainer) -> int:
    """Training batches of the current epoch whose step has run, not counting one only fetched or in progress.

    A resumable DataLoader saves this as its position (``datamodules.base.ResumableLoader``). Lightning restarts
    its own count from the same tracker of its epoch loop, which it keeps internal; ``global_step`` counts
    optimizer steps across epochs (several per batch under manual optimisation, one per several batches
    under gradient accumulation), and the loader's own count of batches handed out includes one interrupted
    inside its training step.
    """
    return trainer.fit_loop.epoch_loop.batch_progress.current.processed


def trainer_of(module: pl.LightningModule) -> pl.Trainer | None:
    """The module's trainer, or None when it is not attached (the public property raises instead)."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def refresh_last_checkpoint(callback: ModelCheckpoint, trainer: pl.Trainer, at_train_epoch_end: bool) -> None:
    """Write ``last.ckpt`` now, unless this step is already saved or the callback saves at the other hook.

    Lightning 2.6 refreshes ``last.ckpt`` only in a step that also saved a top-k checkpoint, and offers no
    public call to save the last one; these are ``ModelCheckpoint``'s own protected helpers.
    """
    if not callback.save_last or callback._should_save_on_train_epoch_end(trainer) != at_train_epoch_end:
        return
    if not callback._should_skip_saving_checkpoint(trainer):  # skipped when this step is saved already
        callback._save_last_checkpoint(trainer, callback._monitor_candidates(trainer))


def all_gather_with_grad(x: Tensor, group=None) -> Tensor:
    """Every rank's rows of ``x`` concatenated along dim 0, differentiable (backward is a reduce-scatter).

    torch's functional collectives are the supported autograd-aware gather, still under a private module;
    ``torch.distributed.nn.functional.all_gather`` is deprecated in their favour.
    """
    import torch.distributed as dist
    from torch.distributed._functional_collectives import all_gather_single

    return all_gather_single(x.contiguous(), 0, group if group is not None else dist.group.WORLD)


def grad_scale(scaler: torch.amp.GradScaler) -> Tensor:
    """The loss scale as a device tensor (a copy), without the host sync of the public ``get_scale()``."""
    scale = scaler._get_scale_async()
    return torch.tensor(scaler.get_scale()) if scale is None else scale.detach().clone()


def foreach_norm(tensors: list[Tensor], norm_type: float = 2.0, dtype: torch.dtype | None = None) -> Tensor:
    """(P,) norm of each tensor in one fused kernel per device and dtype (``torch._foreach_norm``, a beta
    API; ``torch.nn.utils.get_total_norm`` only gives the norm of all of them together)."""
    return torch.stack(torch._foreach_norm(tensors, norm_type, dtype=dtype))


def foreach_lerp_(targets: list[Tensor], sources: list[Tensor], weight: float) -> None:
    """``t += weight * (s - t)`` for every pair in one fused op (``torch._foreach_lerp_``, a beta API)."""
    torch._foreach_lerp_(targets, sources, weight)


def set_data_parallel_size(strategy, size: int) -> None:
    """The data-parallel size ``ModelParallelStrategy`` builds its device mesh with at ``setup_environment``.

    Its public argument is fixed at construction, before the device and node counts are known, and its "auto"
    means the number of nodes; the attribute it reads is private.
    """
    strategy._data_parallel_size = size


def load_sharded(storage_reader, keys: set[str] | None = None) -> dict[str, Any]:
    """Everything in a torch.distributed.checkpoint folder (or only ``keys``) as one nested state dict, in this
    process alone, with every non-tensor entry read weights-only.

    This is ``dcp_to_torch_save`` without the file and with the caller's reader (it builds an unrestricted one).
    The planner that fills an empty state dict from the checkpoint's metadata is private, as is the loader that
    fills the caller's dict (the public ``load`` fills a copy of it); the planner's ``load_bytes``
    unpickles entries with ``weights_only=False``: each is first read weights-only, which refuses one that would
    run code (raising ``UnsafeCheckpointError`` naming it), so the full read after it runs nothing.
    """
    import io
    import pickle

    from torch.distributed.checkpoint import CheckpointException
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from zoo.errors import UnsafeCheckpointError

    class WeightsOnlyPlanner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            try:
                torch.load(value, weights_only=True)
            except pickle.UnpicklingError as err:
                raise UnsafeCheckpointError(
                    f"refused entry {read_item.storage_index.fqn!r} of a sharded checkpoint: it carries pickled "
                    f"objects that are not weights (loading it would execute code). Detail: {str(err).splitlines()[0]}"
                ) from err
            value.seek(0)
            super().load_bytes(read_item, value)

    state: dict[str, Any] = {}
    try:
        _load_state_dict(state, storage_reader=storage_reader, planner=WeightsOnlyPlanner(keys=keys), no_dist=True)
    except CheckpointException as err:  # torch wraps each rank's error; the refusal is what the user must see
        refused = [exc for exc, _ in err.failures.values() if isinstance(exc, UnsafeCheckpointError)]
        if refused:
            raise refused[0] from None
        raise
    return state


def migrate_checkpoint(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint already read (weights-only, by ``zoo.io.weights.load_file``) upgraded as Lightning's
    ``load_from_checkpoint`` upgrades one from an older Lightning (a checkpoint another zoo version wrote is refused
    by ``zoo.io.build``, never upgraded). The public method reads the file itself (forcing
    ``weights_only=False`` for a remote path) and rebuilds the module with the instantiator the file names; the
    upgrade step alone is private."""
    from lightning.pytorch.utilities.migration.utils import _pl_migrate_checkpoint

    return _pl_migrate_checkpoint(checkpoint)


class CheckpointHyperparametersLeftToCaller:
    """A LightningCLI mixin switching off its merge of a ``--ckpt_path``'s hyperparameters into the config.

    LightningCLI's private ``_parse_ckpt_path`` step reads the checkpoint a second time with an unnamed ``torch.load``
    and makes every stored hyperparameter win over the config and command line, silently (a width override is
    ignored, another family's checkpoint swaps the model class); it has no public switch. ``cli.py`` merges them
    itself (``zoo.io.checkpoint.reconcile``): the user's values win, and a shape change is refused.
    """

    def _parse_ckpt_path(self) -> None:
        return None


def dump_config_again(cli) -> None:
    """Makes a LightningCLI dump its config again before the next class it instantiates.

    LightningCLI hands each module the config dumped at its first instantiation as its hyperparameters, and caches
    that dump in ``config_dump`` (its private ``_dump_config`` makes it only when the attribute is missing). The zoo
    builds the DataModule first and then completes the model's config with the net's sizes (``zoo.app.sizes``): the
    model's hyperparameters must be the completed config, so the cached dump is dropped.
    """
    cli.__dict__.pop("config_dump", None)


def pending_print_config(parser) -> dict | None:
    """jsonargparse's ``--print_config`` request, taken off ``parser``; None when there is none or jsonargparse is
    parsing defaults (it skips printing then).

    jsonargparse prints inside its private ``_parse_common``, before any hook of LightningCLI runs, when its action
    has left the request as a private attribute of the parser; the zoo takes it, completes the net from
    ``init_weights`` (``zoo.app.pretrained``) and prints with ``print_config``, so the printed net is the one built.
    """
    from jsonargparse._actions import print_config_skip

    return None if print_config_skip.get() else parser.__dict__.pop("print_config", None)


def print_config_skipped():
    """A context in which jsonargparse's ``--print_config`` neither prints nor exits (as while it parses defaults):
    a second parse of the same arguments (``zoo.app.parser``'s ``stated_config``) leaves the printing to the first.
    Its switch is a private context variable."""
    from jsonargparse._actions import _ActionPrintConfig

    return _ActionPrintConfig.skip_print_config()


def print_config(parser, request: dict, cfg) -> None:
    """Prints ``cfg`` as jsonargparse's ``--print_config`` does for ``request`` (``pending_print_config``), and exits
    (its printer is a private action's method)."""
    from jsonargparse._actions import _ActionPrintConfig

    parser.print_config = request
    _ActionPrintConfig.print_config_if_requested(parser, cfg)


def jsonargparse_debug() -> bool:
    """Whether jsonargparse's debug mode (``JSONARGPARSE_DEBUG``) is on, read the way jsonargparse reads it (its
    boolean parsing of the variable); the reader is not exported. The zoo then leaves errors to jsonargparse."""
    from jsonargparse._common import debug_mode_active

    return debug_mode_active()


def nested_flags_read_by_their_own_type() -> None:
    """Makes a flag into a class's arguments (``--data.init_args.answer_pattern='Answer: (\\d+)'``) reach that
    argument as typed, to be read by the argument's own type.

    jsonargparse reads such a value as YAML at the outer, class-typed option (``_typehints.ActionTypeHint``, through
    the ``parse_value_or_config`` it imports), before it knows which argument the value is for, then hands the
    argument the result: a ``str`` argument given a regex with ``": "`` receives a mapping and is refused
    ("Expected a <class 'str'>"); its retry with the text as given skips values of nested flags. Left as text
    (``NestedArg``), the class's own parser reads ``--answer_pattern=<text>`` as it reads a top-level flag: a
    string stays a string, a number, list or mapping is read as YAML by its own type, and a deeper flag
    (``--model.init_args.net.init_args.n_layer``) repeats this one level down. ``dict_kwargs`` keep jsonargparse's
    reading (they have no type). No public setting changes it; once a process, as jsonargparse's loaders are global.
    """
    from jsonargparse import _typehints
    from jsonargparse._util import NestedArg

    read = _typehints.parse_value_or_config
    if getattr(read, "zoo_keeps_nested_text", False):
        return

    def parse_value_or_config(value, enable_path=True, simple_types=False):
        if isinstance(value, NestedArg) and isinstance(value.val, str) and not value.key.startswith("dict_kwargs."):
            return value, None
        return read(value, enable_path, simple_types)

    parse_value_or_config.zoo_keeps_nested_text = True
    _typehints.parse_value_or_config = parse_value_or_config


def option_flags(parser) -> list[str]:
    """Every flag an argparse parser knows (``--model.lr``, ``-c``): argparse keeps them in a private dict and has
    no public listing; the zoo suggests the closest one for a misspelt flag."""
    return list(parser._option_string_actions)


def weights_only_globals() -> set[str]:
    """The ``module.name`` globals ``torch.load(weights_only=True)`` admits: its built-in list (private to
    ``torch._weights_only_unpickler``) and those added with ``torch.serialization.add_safe_globals``. The zoo's
    diagnosis of a refused pickle names everything else as code it would run."""
    from torch._weights_only_unpickler import _get_allowed_globals

    added = set()
    for entry in torch.serialization.get_safe_globals():  # an object, or (object, the name it is pickled under)
        obj, name = entry if isinstance(entry, tuple) else (entry, None)
        added.add(name or f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}")
    return set(_get_allowed_globals()) | added


def dcp_storage_info_type() -> type:
    """The class torch.distributed.checkpoint's FileSystemWriter stores per entry (file, offset, length): the zoo
    checks each before a read, and the class is private to the filesystem module."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    return _StorageInfo


def apply_keeping_float32(module: torch.nn.Module, fn, recurse: bool, names: tuple[str, ...]) -> torch.nn.Module:
    """``nn.Module._apply`` (what ``.to``, ``.half``, ``.cuda`` and Lightning's ``*-true`` precisions go through),
    except that the named float32 buffers of ``module`` follow the device but keep float32 and their exact values.
    For a module to call from its own ``_apply``: no public hook pins a buffer's dtype (torchmetrics' ``Metric``
    overrides ``_apply`` for the same reason)."""
    kept = {name: getattr(module, name) for name in names}
    torch.nn.Module._apply(module, fn, recurse)
    for name, old in kept.items():
        new = getattr(module, name)
        if new.dtype != old.dtype:
            setattr(module, name, old.to(new.device))  # the float32 original, never the rounded cast
    return module


def muon_(params: list[Tensor], grads: list[Tensor], momentum_buffers: list[Tensor], **group: Any) -> None:
    """``torch.optim.Muon``'s update of 2-D tensors in place, through its functional form (``torch.optim._muon``).

    ``torch.optim.Muon`` refuses any parameter that is not 2-D at construction, so it cannot take a conv filter
    bank or a stack of MoE expert matrices; ``zoo.train.optim.MuonAdamW`` hands this function 2-D views of them
    (``group``: Muon's param-group settings, lr to adjust_lr_fn).
    """
    from torch.optim._muon import muon

    muon(params, grads, momentum_buffers, has_complex=False, **group)
