"""Files where a checkpoint or weights file belongs: pickles that call code, torch archives and safetensors headers
that lie about their tensors, archives whose members leave their folder or inflate without end, and stored configs
that name code or sizes no machine has. Each row is one payload, replayed through every loader it reaches
(``loaders.CHECKPOINT``, ``loaders.SAFETENSORS``); see ``harness`` for what must hold."""

from __future__ import annotations

import functools
import io
import json
import os
import pickle
import struct
import sys
import tarfile
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from builders import (
    GPT_HPARAMS,
    TINY_NET,
    Call,
    added_members,
    checkpoint,
    pickled,
    python,
    replace_member,
    shell,
    stack_global,
    torch_zip,
)
from harness import HANG, Payload, cases, replay, warm_up
from loaders import CHECKPOINT, command

FILES = ("load_file", "load_from_checkpoint", "trainer", "init_weights", "load_model")
FILES_CLI = (*FILES, "cli")  # cli.py in the child costs ~2 s: a few payloads of each kind go through it
HPARAMS = ("load_from_checkpoint", "stored_model", "init_weights_net", "load_model", "stored_config")


# -- pickles that call code --------------------------------------------------------------------------------------


def _write(folder: Path, name: str, data: bytes) -> Path:
    (folder / name).write_bytes(data)
    return folder / name


def reduce_in_zip(folder, outside):
    """torch.save's zip format, data.pkl a ``__reduce__`` to os.system."""
    return _write(folder, "model.ckpt", torch_zip({"state_dict": Call(os.system, shell(outside))}))


def reduce_in_legacy(folder, outside):
    """torch's legacy (pre-1.6, not a zip) format: the loader CVE-2025-32434's bypass went through."""
    buf = io.BytesIO()
    torch.save({"state_dict": Call(os.system, shell(outside))}, buf, _use_new_zipfile_serialization=False)
    return _write(folder, "model.pt", buf.getvalue())


def reduce_in_legacy_tar(folder, outside):
    """torch's oldest format, a tar of ``storages``, ``tensors`` and ``pickle``: the legacy path of CVE-2025-32434."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, raw in [
            ("storages", pickled(0)),
            ("tensors", pickled(0)),
            ("pickle", pickled(Call(exec, python(outside)))),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return _write(folder, "model.pth", out.getvalue())


def plain_pickle_exec(folder, outside):
    return _write(folder, "model.bin", pickled(Call(exec, python(outside))))


def stack_global_runpy(folder, outside):
    """runpy._run_code by STACK_GLOBAL: a callable the scanners' deny lists lacked (picklescan GHSA-655q-fx9r-782v
    class), in the opcode they did not look at."""
    return _write(folder, "model.pt", stack_global("runpy", "_run_code", python(outside), ""))


def getattr_chain(folder, outside):
    """builtins.getattr(__import__('os'), 'system'): the call built from allowed-looking names (modelscan and
    picklescan bypasses of 2024-2025)."""
    system = Call(getattr, Call(__import__, "os"), "system")
    return _write(folder, "model.ckpt", torch_zip({"state_dict": Call(system_call, system, shell(outside))}))


def system_call(fn, *args):  # stands for whatever the inner call returned, applied by REDUCE
    return fn(*args)


def torch_namespace_gadget(folder, outside):
    """A callable under ``torch.`` that executes source (torch.fx's _forward_from_src): a name a check by prefix
    admits, which weights_only's own list does not."""
    from torch.fx.graph_module import _forward_from_src

    return _write(folder, "model.ckpt", torch_zip({"state_dict": Call(_forward_from_src, python(outside), {})}))


def pickle_in_a_torch_name(folder, outside):
    """``__builtin__.eval``: Python 2's module name, which pickle maps to builtins (a deny list of 'builtins' misses
    it; picklescan CVE-2025-1945 class of name tricks)."""
    raw = b"\x80\x02c__builtin__\neval\nq\x00X" + struct.pack("<I", len(python(outside))) + python(outside).encode()
    return _write(folder, "model.pt", raw + b"\x85R.")


# -- torch archives that lie -------------------------------------------------------------------------------------


def storage_record_short(folder, outside):
    """A tensor's storage record cut to 4 bytes while data.pkl declares 4 KB (torch-storage lie)."""
    ckpt = torch_zip({"state_dict": {"w": torch.ones(1024)}})
    return _write(folder, "model.ckpt", replace_member(ckpt, "/data/0", b"\0" * 4))


def storage_numel_huge(folder, outside):
    """data.pkl declares a storage of 2**40 floats over a 16-byte record: a loader that allocates what it is told
    asks for 4 TB."""

    class Storage:
        pass

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, "0", "cpu", 2**40) if isinstance(obj, Storage) else None

    rebuild = Call(torch._utils._rebuild_tensor_v2, Storage(), 0, (2**40,), (1,), False, OrderedDict())
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump({"state_dict": {"w": rebuild}})
    ckpt = torch_zip({"state_dict": {"w": torch.ones(4)}})
    return _write(folder, "model.ckpt", replace_member(ckpt, "/data.pkl", buf.getvalue()))


def zip_bomb_record(folder, outside):
    """A checkpoint whose storage record is deflated: 16 MB of zeros in 16 kB (zip bomb)."""
    return _write(folder, "model.ckpt", _zip_bomb())


@functools.cache
def _zip_bomb() -> bytes:
    ckpt = torch_zip({"state_dict": {"w": torch.ones(4)}})
    return replace_member(ckpt, "/data/0", bytes(16 * 2**20), zipfile.ZIP_DEFLATED)


def zip_bomb_declared(folder, outside):
    """A deflated storage record of the size data.pkl declares (16 MB of zeros in 16 kB): torch would inflate it and
    load, the archive's sizes all agreeing (zip bomb)."""
    return _write(folder, "model.ckpt", _zip_bomb_declared())


@functools.cache
def _zip_bomb_declared() -> bytes:
    ckpt = torch_zip({"state_dict": {"w": torch.zeros(4 * 2**20)}})
    return replace_member(ckpt, "/data/0", bytes(16 * 2**20), zipfile.ZIP_DEFLATED)


def zip_slip_members(folder, outside):
    """A whole checkpoint with members named ``../../outside/slip`` and an absolute path beside its records (zip
    slip, Snyk 2018): read by name, never extracted, so nothing lands."""
    ckpt = checkpoint(folder / "whole.ckpt").read_bytes()
    slip = {f"archive/../../{outside.name}/slip.txt": b"out", str(outside / "abs.txt"): b"out"}
    return _write(folder, "model.ckpt", added_members(ckpt, slip))


def zip_two_data_pkl(folder, outside):
    """Two ``data.pkl`` records, the second a pickle that calls code: which one a reader takes is the reader's
    choice (zip parser differentials, picklescan CVE-2025-1944)."""
    ckpt = torch_zip({"state_dict": {"w": torch.ones(4)}})
    evil = torch_zip({"state_dict": Call(os.system, shell(outside))})
    with zipfile.ZipFile(io.BytesIO(evil)) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    name = next(n for n in zipfile.ZipFile(io.BytesIO(ckpt)).namelist() if n.endswith("data.pkl"))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name it is asked to write
        return _write(folder, "model.ckpt", added_members(ckpt, {name: pkl}))


def not_a_checkpoint_dev_zero(folder, outside):
    """A checkpoint name linked to /dev/zero: a file that never ends (symlinks in model folders)."""
    (folder / "model.ckpt").symlink_to("/dev/zero")
    return folder / "model.ckpt"


# -- stored configs that name code -------------------------------------------------------------------------------


def _hparams(**changes):
    def make(folder, outside):
        hp = json.loads(json.dumps(GPT_HPARAMS).replace("MARKER_CODE", python(outside)))
        for key, value in changes.items():
            hp[key] = json.loads(json.dumps(value).replace("MARKER_CODE", python(outside)))
        return checkpoint(folder / "model.ckpt", hp)

    return make


def _net_args(**changes):
    return _hparams(net={"class_path": "zoo.gpt.GPT", "init_args": {**TINY_NET, **changes}})


def data_hparams(data: dict, hparams: dict | None = None, state=None):
    def make(folder, outside):
        text = json.dumps(data).replace("OUTSIDE", str(outside))
        return checkpoint(folder / "model.ckpt", hparams, json.loads(text), STATES[state]() if state else None)

    return make


def deep_config(folder, outside):
    deep: dict = {}
    at = deep
    for _ in range(100):
        at["a"] = {}
        at = at["a"]
    return checkpoint(folder / "model.ckpt", {**GPT_HPARAMS, "generation": deep})


RL_NET = {"class_path": "zoo.rl.ActorCritic", "init_args": {"obs_dim": 4, "action_dim": 2, "hidden_sizes": [8]}}
RL_HPARAMS = {"_class_path": "zoo.rl.PPOModule", "net": RL_NET}
GYM = "datamodules.GymDataModule"


def rl_state():
    from zoo.rl import ActorCritic, PPOModule

    return PPOModule(ActorCritic(4, 2, hidden_sizes=(8,))).state_dict()


def cnn_state():
    from zoo.cnn import ClassifierModule, ConvNet

    return ClassifierModule(ConvNet(num_classes=10)).state_dict()


STATES = {"rl": rl_state, "cnn": cnn_state}


def bounded_data(key: str, bound: int):
    """``_stored_config``, and the built DataModule's ``key`` within ``bound`` (refused, or lowered: either fixes)."""

    def load(p):
        built = CHECKPOINT["stored_config"](p)
        value = getattr(built[-1], key)
        if value > bound:
            from harness import Accepted

            raise Accepted(f"the stored {key}={value:,} was built as it is, past any budget ({bound:,})")
        return value

    return load


def checkpoint_named_like_a_module(folder, outside):
    """A checkpoint in the run's folder named ``this.ckpt`` whose stored net names ``this.ckpt`` as its class: the
    file name the user typed is no class path they vouch for."""
    return checkpoint(folder.parent / "this.ckpt", {**GPT_HPARAMS, "net": {"class_path": "this.ckpt", "init_args": {}}})


def imports_no_file_name(p):
    """``cli.py validate --ckpt_path this.ckpt``, and the module ``this`` (its name's first word) never imported."""
    sys.modules.pop("this", None)
    try:
        command("validate", "--ckpt_path", p.name, "--trainer.logger=false")
    finally:
        if "this" in sys.modules:
            from harness import Accepted

            raise Accepted("the checkpoint's file name was imported as a module (this)")


LOADERS = {
    **CHECKPOINT,
    "cli_file_name": imports_no_file_name,
    "num_envs": bounded_data("num_envs", os.cpu_count() or 1),
    "eval_episodes": bounded_data("eval_episodes", 10**6),
    "predict_episodes": bounded_data("predict_episodes", 10**6),
    "num_workers": bounded_data("num_workers", os.cpu_count() or 1),
}

# fmt: off
CKPT_PAYLOADS = [
    Payload("pickle-reduce-zip", "CVE-2025-32434 (torch.load weights_only RCE): __reduce__", reduce_in_zip, (*FILES_CLI, "init_weights_net"), named=("would execute code",)),
    Payload("pickle-reduce-legacy", "CVE-2025-32434: the legacy non-zip format", reduce_in_legacy, FILES),
    Payload("pickle-reduce-legacy-tar", "CVE-2025-32434: the legacy tar format", reduce_in_legacy_tar, FILES),
    Payload("pickle-plain-exec", "CWE-502; a .bin that is a plain pickle (HF pickle-scanning docs)", plain_pickle_exec, FILES),
    Payload("pickle-stack-global-runpy", "picklescan deny-list bypasses (GHSA-655q-fx9r-782v class)", stack_global_runpy, FILES),
    Payload("pickle-getattr-chain", "modelscan/picklescan bypass by getattr+__import__", getattr_chain, FILES),
    Payload("pickle-torch-fx-gadget", "torch-namespace gadgets (torch.fx _forward_from_src)", torch_namespace_gadget, FILES_CLI),
    Payload("pickle-python2-builtin", "picklescan CVE-2025-1945 class: module-name tricks (__builtin__)", pickle_in_a_torch_name, FILES),
    Payload("storage-record-short", "torch-storage lie: a record shorter than data.pkl declares", storage_record_short, FILES_CLI),
    Payload("storage-numel-2e40", "torch-storage lie: numel 2**40 over 16 bytes", storage_numel_huge, FILES, isolate=True),
    Payload("zip-bomb-record", "zip bomb (Fifield, WOOT 2019) as a .ckpt record", zip_bomb_record, FILES),
    Payload("zip-bomb-declared", "zip bomb (Fifield, WOOT 2019): a deflated record of the declared size", zip_bomb_declared, FILES),
    Payload("zip-slip-ckpt", "zip slip (Snyk 2018) members in a .ckpt", zip_slip_members, FILES, refuse=False),
    Payload("zip-two-data-pkl", "picklescan CVE-2025-1944: zip parser differential", zip_two_data_pkl, FILES),
    Payload("ckpt-name-is-a-module", "issue 52: --ckpt_path this.ckpt imports this (a dotted word taken for a class)", checkpoint_named_like_a_module, ("cli_file_name",), refuse=False),
    Payload("ckpt-link-to-dev-zero", "symlinks in model folders: a file that never ends", not_a_checkpoint_dev_zero, FILES_CLI),
    # stored configs naming code (CVE-2026-58659 in Lightning: a checkpoint's hparams imported on load)
    Payload("hparams-class-os-system", "CVE-2026-58659 (Lightning imports a checkpoint's class_path)", _hparams(_class_path="os.system"), (*HPARAMS, "cli")),
    Payload("hparams-net-builtins-exec", "CVE-2026-58659; jsonargparse's import denylist", _hparams(net={"class_path": "builtins.exec", "init_args": {"source": "MARKER_CODE"}}), HPARAMS),
    Payload("hparams-instantiator", "Lightning's _instantiator, imported and called on load", _hparams(_instantiator="os.system"), HPARAMS, refuse=False),
    Payload("hparams-popen-optimizer", "a class_path in a Callable position (jsonargparse injection)", _hparams(optimizer={"class_path": "subprocess.Popen", "init_args": {"args": ["sh", "-c", "MARKER_CODE"]}}), HPARAMS),
    Payload("hparams-yaml-tag-string", "PyYAML !!python/object/apply (CVE-2017-18342) in a string", _net_args(norm="!!python/object/apply:os.system ['touch MARKER']"), HPARAMS),
    Payload("hparams-path-through-import", "a class reached through a module's imports", _net_args(mlp={"class_path": "zoo.gpt.gpt.torch.nn.Linear", "init_args": {}}), HPARAMS),
    Payload("hparams-nested-100", "recursion bombs (CWE-674) in a stored config", deep_config, HPARAMS),
    Payload("data-class-in-plain-data", "issue 37: jsonargparse builds a class_path at any depth of Any", data_hparams({"_class_path": GYM, "env_kwargs": {"x": {"class_path": "os.system", "init_args": {"command": "x"}}}}, RL_HPARAMS, "rl"), ("stored_config",)),
    Payload("data-wrapper-record-video", "gymnasium RecordVideo writes where it is told", data_hparams({"_class_path": GYM, "wrappers": [{"class_path": "gymnasium.wrappers.RecordVideo", "init_args": {"video_folder": "OUTSIDE"}}],}, RL_HPARAMS, "rl"), ("stored_config",)),
    Payload("data-env-id-module", "gymnasium.make('module:Env') imports module", data_hparams({"_class_path": GYM, "env_id": "os:system"}, RL_HPARAMS, "rl"), ("stored_config",)),
    Payload("data-root-outside", "a stored location: writes outside the run's folder", data_hparams({"_class_path": "datamodules.TextDataModule", "path": "OUTSIDE/x.txt", "root": "OUTSIDE", "download": True}), ("stored_config",), refuse=False),
    # stored-value bombs: sizes and counts no machine has, typed but unbounded
    Payload("bomb-vocab-1e9", "issue 52: stored sizes (vocab 1e9)", _net_args(vocab_size=10**9), ("load_from_checkpoint",), named=("vocab_size",), isolate=True),
    Payload("bomb-layers-1e5", "issue 52: stored sizes (layers 1e5)", _net_args(n_layer=10**5), ("load_from_checkpoint",), named=("n_layer",), deadline=HANG, isolate=True),
    Payload("bomb-num-envs-48-async", "issue 52: a stored config started 48 processes", data_hparams({"_class_path": GYM, "num_envs": 48, "vectorization_mode": "async"}, RL_HPARAMS, "rl"), ("num_envs",), refuse=False),
    Payload("bomb-eval-episodes-1e9", "issue 52: loop counts (eval_episodes 1e9)", data_hparams({"_class_path": GYM, "eval_episodes": 10**9}, RL_HPARAMS, "rl"), ("eval_episodes",), refuse=False),
    Payload("bomb-predict-episodes-1e9", "issue 52: loop counts (predict_episodes 1e9)", data_hparams({"_class_path": GYM, "predict_episodes": 10**9}, RL_HPARAMS, "rl"), ("predict_episodes",), refuse=False),
    Payload("bomb-num-workers-48", "issue 52: process counts (num_workers 48)", data_hparams({"_class_path": "datamodules.DigitsDataModule", "num_workers": 48}, {"_class_path": "zoo.cnn.ClassifierModule", "net": {"class_path": "zoo.cnn.ConvNet", "init_args": {"num_classes": 10}}}, "cnn"), ("num_workers",), refuse=False),
]
# fmt: on


@pytest.fixture(scope="module", autouse=True)
def _warm():
    warm_up()


@pytest.mark.parametrize(("payload", "loader"), cases(CKPT_PAYLOADS, LOADERS))
def test_a_checkpoint_payload_runs_nothing_and_is_refused_in_one_line(payload, loader, tmp_path):
    replay(payload, LOADERS[loader], tmp_path)
