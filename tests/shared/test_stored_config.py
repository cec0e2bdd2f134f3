"""A file is data, never code (issue 24): whatever a checkpoint, a registered model or a URL says is checked against
the allowlist (``zoo.io.trust``) before anything it names is imported, called or written to.

The attacks are plain-data files: no pickled objects, tensors only, which pass ``torch.load(weights_only=True)``;
their stored config names a module of the attacker's that writes a marker file when it is imported and when any of
its callables runs. Each test tampers several keys, at several depths, with several callables, through every way a
stored config comes in, and checks that the marker never appears and that the refusal names the key.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import sys
import uuid
from pathlib import Path

import pytest
import torch
import yaml
from conftest import CONFIGS, cli

from zoo.io import build, trust
from zoo.io.trust import UntrustedConfigError

CNN = str(CONFIGS / "cnn" / "convnet_digits.yaml")
PPO = str(CONFIGS / "rl" / "ppo_tiny.yaml")
FAST = (
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--trainer.logger=false",
)

EVIL = """
import pathlib
MARK = pathlib.Path({marker!r})
MARK.with_name(MARK.name + ".imported").touch()  # its top-level code ran

import gymnasium as gym
import torch
from lightning.pytorch import LightningDataModule, LightningModule


def evil(*args, **kwargs):
    MARK.touch()


class EvilNet(torch.nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        MARK.touch()


class EvilModule(LightningModule):
    def __init__(self, *args, **kwargs):
        super().__init__()
        MARK.touch()


class EvilData(LightningDataModule):
    def __init__(self, *args, **kwargs):
        super().__init__()
        MARK.touch()


class EvilWrapper(gym.Wrapper):
    def __init__(self, env, *args, **kwargs):
        super().__init__(env)
        MARK.touch()


class EvilEnv(gym.Env):
    def __init__(self, *args, **kwargs):
        MARK.touch()
"""


class Attacker:
    """A module of the attacker's, importable (on sys.path), and the marker its code would leave."""

    def __init__(self, root: Path, monkeypatch) -> None:
        self.name = f"evil_{uuid.uuid4().hex[:8]}"
        self.marker = root / f"{self.name}.marker"
        (root / f"{self.name}.py").write_text(EVIL.format(marker=str(self.marker)))
        monkeypatch.syspath_prepend(str(root))

    def ran(self) -> bool:
        return (
            self.marker.exists()
            or self.marker.with_name(self.marker.name + ".imported").exists()
            or self.name in sys.modules
        )


@pytest.fixture
def attacker(tmp_path, monkeypatch) -> Attacker:
    folder = tmp_path / "attacker"
    folder.mkdir()
    return Attacker(folder, monkeypatch)


@pytest.fixture
def checkpoints(digits_fit, ppo_fit) -> dict[str, Path]:
    """Real checkpoints of two families, trained through cli.py and shared by the suite (conftest): the last of a
    classifier and of a PPO agent."""
    return {"cnn": digits_fit.last, "ppo": ppo_fit.last}


# Where a tampered config puts the attacker's name: (checkpoint, section, dotted key, value with {m} for the module).
# Every one is something a consumer would import or call: jsonargparse (class paths, strings for class- and
# callable-typed arguments, any {class_path} dict), Lightning (_instantiator), GymDataModule (wrappers) and
# gymnasium (module:Env).
TAMPERED = [
    ("cnn", "hyper_parameters", "_class_path", "{m}.EvilModule"),
    ("cnn", "hyper_parameters", "_class_path", "zoo.cnn.ConvNet"),  # the zoo's, but a net is not a module class
    ("cnn", "hyper_parameters", "_instantiator", "{m}.evil"),
    ("cnn", "hyper_parameters", "net.class_path", "{m}.EvilNet"),
    ("cnn", "hyper_parameters", "net", "{m}.EvilNet"),
    ("cnn", "hyper_parameters", "net.init_args.extra", {"deep": [{"class_path": "{m}.EvilNet"}]}),
    ("cnn", "hyper_parameters", "optimizer", {"class_path": "{m}.evil", "init_args": {"lr": 1.0}}),
    ("cnn", "datamodule_hyper_parameters", "_class_path", "{m}.EvilData"),
    ("cnn", "datamodule_hyper_parameters", "batch_size", {"class_path": "{m}.EvilNet"}),
    ("cnn", "hyper_parameters", "net.init_args.channels", '{"class_path": "{m}.EvilNet"}'),  # YAML in a string
    ("ppo", "datamodule_hyper_parameters", "wrappers", ["{m}.EvilWrapper"]),
    ("ppo", "datamodule_hyper_parameters", "wrappers", ["gymnasium.wrappers.ClipAction", {"class_path": "{m}.evil"}]),
    (
        "ppo",
        "datamodule_hyper_parameters",
        "wrappers",
        [{"class_path": "gymnasium.wrappers.TransformObservation", "init_args": {"func": "{m}.evil"}}],
    ),
    (
        "ppo",
        "datamodule_hyper_parameters",
        "wrappers",
        [
            {
                "class_path": "gymnasium.wrappers.FrameStackObservation",
                "init_args": {"stack_size": {"class_path": "{m}.evil"}},
            }
        ],
    ),
    ("ppo", "datamodule_hyper_parameters", "env_id", "{m}:EvilEnv"),
    ("ppo", "hyper_parameters", "net.class_path", "os.system"),
    # Issue 37's bypasses of the allowlist walk, which jsonargparse then read its own way: an allowed wrapper with an
    # extra key, a decoy class path or YAML text in env_kwargs (a dict[str, Any]).
    (
        "ppo",
        "datamodule_hyper_parameters",
        "wrappers",
        [{"class_path": "gymnasium.wrappers.ClipAction", "x": {"class_path": "subprocess.Popen"}}],
    ),
    ("ppo", "datamodule_hyper_parameters", "env_kwargs", {"k": {"class_path": "{m}.evil", "init_args": {}}}),
    ("ppo", "datamodule_hyper_parameters", "env_kwargs", "class_path: {m}.evil\ninit_args: {}"),
    ("ppo", "datamodule_hyper_parameters", "env_kwargs", {"class_path": "gymnasium.wrappers.ClipAction"}),
]
IDS = [
    f"{ckpt}-{'data' if section.startswith('data') else 'model'}.{key}-{i}"
    for i, (ckpt, section, key, _) in enumerate(TAMPERED)
]


def _fill(value, module: str):
    if isinstance(value, str):
        return value.replace("{m}", module)
    if isinstance(value, list):
        return [_fill(v, module) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, module) for k, v in value.items()}
    return value


def _set(d: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        d = d[p] if isinstance(d.get(p), dict) else d.setdefault(p, {})
    d[last] = value


def tamper(src: Path, dst: Path, section: str, key: str, value) -> Path:
    """``src`` with one stored setting replaced: still tensors and plain values only (weights-only loadable)."""
    ckpt = torch.load(src, weights_only=True)
    _set(ckpt[section], key, value)
    torch.save(ckpt, dst)
    torch.load(dst, weights_only=True)  # the attack passes the unpickler: only the config is hostile
    return dst


def shown_key(section: str, key: str) -> str:
    """How the refusal names the key: model/data, then init_args for everything but the class path itself."""
    where = "data" if section.startswith("data") else "model"
    first = key.split(".")[0]
    if first in ("_class_path",):
        return f"{where} class_path"
    if first == "_instantiator":
        return "_instantiator"
    return f"{where}.init_args.{first}"


@pytest.mark.parametrize(("ckpt", "section", "key", "value"), TAMPERED, ids=IDS)
@pytest.mark.parametrize("subcommand", ["validate", "predict"])
def test_a_tampered_checkpoint_is_refused_through_ckpt_path(
    checkpoints, attacker, tmp_path, subcommand, ckpt, section, key, value
):
    if subcommand == "predict" and section.startswith("data") and ckpt == "cnn":
        pytest.skip("predict takes the module's own DataModule for new inputs, not the stored training data")
    path = tamper(checkpoints[ckpt], tmp_path / "evil.ckpt", section, key, _fill(value, attacker.name))
    if key == "_instantiator":  # cli.py builds the stored module itself: the instantiator is never read
        with contextlib.suppress(FileNotFoundError):  # predict, once built, asks for new images
            cli(subcommand, f"--ckpt_path={path}", "--trainer.logger=false", "--trainer.limit_val_batches=1")
        assert not attacker.ran()
        return
    with pytest.raises(UntrustedConfigError) as err:
        cli(subcommand, f"--ckpt_path={path}", "--trainer.logger=false")
    assert shown_key(section, key) in str(err.value) and str(path) in str(err.value), err.value
    assert not attacker.ran()


def test_the_refusal_is_one_line_and_the_users_own_config_replaces_the_stored_part_whole(
    checkpoints, attacker, tmp_path, monkeypatch, capsys
):
    """Without a config the stored data is built, and refused in one line; with the user's own --config (which has a
    data section) the stored data is not read at all."""
    from cli import run

    path = tamper(
        checkpoints["ppo"],
        tmp_path / "evil.ckpt",
        "datamodule_hyper_parameters",
        "wrappers",
        [f"{attacker.name}.EvilWrapper"],
    )
    monkeypatch.setattr(sys, "argv", ["cli.py", "validate", f"--ckpt_path={path}", "--trainer.logger=false"])
    with pytest.raises(SystemExit) as exit_info:
        run()
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert exit_info.value.code == 1 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert f"data.init_args.wrappers[0] is '{attacker.name}.EvilWrapper'" in errors[0], errors[0]
    c = cli("validate", "--config", PPO, f"--ckpt_path={path}", "--trainer.logger=false")
    assert c.datamodule.hparams.get("wrappers") is None
    assert not attacker.ran()


def test_a_tampered_checkpoint_at_a_url_is_refused(checkpoints, attacker, tmp_path, served):
    tamper(checkpoints["cnn"], tmp_path / "evil.ckpt", "hyper_parameters", "net.class_path", f"{attacker.name}.EvilNet")
    with pytest.raises(UntrustedConfigError, match=r"model\.init_args\.net\.class_path"):
        cli("predict", f"--ckpt_path={served}/evil.ckpt", "--trainer.logger=false")
    from zoo.cnn import ClassifierModule

    with pytest.raises(UntrustedConfigError, match=r"model\.init_args\.net\.class_path"):
        ClassifierModule.load_from_checkpoint(f"{served}/evil.ckpt")
    assert not attacker.ran()


@pytest.mark.parametrize(
    ("ckpt", "section", "key", "value"),
    [t for t in TAMPERED if t[1] == "hyper_parameters"],
    ids=[i for i, t in zip(IDS, TAMPERED) if t[1] == "hyper_parameters"],
)
def test_load_from_checkpoint_and_load_model_refuse_a_tampered_model(
    checkpoints, attacker, tmp_path, ckpt, section, key, value
):
    from zoo.cnn import ClassifierModule
    from zoo.rl import PPOModule
    from zoo.tracking import load_model

    path = tamper(checkpoints[ckpt], tmp_path / "evil.ckpt", section, key, _fill(value, attacker.name))
    cls = {"cnn": ClassifierModule, "ppo": PPOModule}[ckpt]
    for load in (cls.load_from_checkpoint, load_model):
        if key == "_instantiator" and load is load_model:
            load(str(path))  # load_model builds the module itself: a stored instantiator is never read
            continue
        with pytest.raises(UntrustedConfigError) as err:
            load(str(path))
        assert shown_key(section, key) in str(err.value), err.value
    assert not attacker.ran()


def test_a_stored_data_config_is_never_used_by_load_from_checkpoint(checkpoints, attacker, tmp_path):
    from zoo.rl import PPOModule

    path = tamper(
        checkpoints["ppo"], tmp_path / "evil.ckpt", "datamodule_hyper_parameters", "env_id", f"{attacker.name}:EvilEnv"
    )
    PPOModule.load_from_checkpoint(path)
    assert not attacker.ran()


def test_init_weights_builds_a_checkpoints_net_by_the_same_rules_and_refuses_a_tampered_one(
    checkpoints, attacker, tmp_path
):
    # init_weights builds the net the checkpoint stores (zoo.app.pretrained): read as data, by these rules
    path = tamper(
        checkpoints["cnn"], tmp_path / "evil.ckpt", "hyper_parameters", "net.class_path", f"{attacker.name}.EvilNet"
    )
    with pytest.raises(UntrustedConfigError, match=f"net.class_path is '{attacker.name}.EvilNet'"):
        cli("validate", "--config", CNN, f"--model.init_args.init_weights={path}", *FAST)
    assert not attacker.ran()
    c = cli("validate", "--config", CNN, f"--model.init_args.init_weights={checkpoints['cnn']}", *FAST)
    trained = torch.load(checkpoints["cnn"], weights_only=True)["state_dict"]
    for k, v in c.model.state_dict().items():
        torch.testing.assert_close(v, trained[k])


@pytest.fixture
def registered_tampered(checkpoints, tmp_path):
    """Register the classifier as an MLflow model, then let ``edit`` change its module.json in the store, as anyone
    with write access to a shared tracking server could; returns a function giving the models:/ and runs:/ URIs."""
    from mlflow.tracking import MlflowClient

    from zoo.io.weights import extract_state_dict
    from zoo.tracking.models import SPEC, load_checkpoint, module_spec, save_model, tracking_uri

    client = MlflowClient(tracking_uri(), registry_uri=tracking_uri())

    def register(edit) -> tuple[str, str]:
        ckpt = load_checkpoint(checkpoints["cnn"])
        folder = save_model(extract_state_dict(ckpt), module_spec(ckpt), tmp_path / f"model-{uuid.uuid4().hex[:6]}")
        spec = json.loads((folder / "artifacts" / SPEC).read_text())
        edit(spec)
        (folder / "artifacts" / SPEC).write_text(json.dumps(spec))
        exp = client.get_experiment_by_name("Default").experiment_id
        run = client.create_run(exp).info.run_id
        client.log_artifacts(run, str(folder), "model")
        name = f"tampered-{uuid.uuid4().hex[:6]}"
        client.create_registered_model(name)
        v = client.create_model_version(name, f"{client.get_run(run).info.artifact_uri}/model", run)
        return f"models:/{name}/{v.version}", f"runs:/{run}/model"

    return register


@pytest.mark.parametrize(
    "where",
    [
        ("class_path",),
        ("init_args", "net", "class_path"),
        ("init_args", "net", "init_args", "nested"),
        ("data", "class_path"),
        ("data", "init_args", "root"),
    ],
)
def test_a_tampered_registered_model_is_refused(registered_tampered, attacker, where):
    from zoo.tracking import load_model

    def edit(spec):
        at = spec
        for k in where[:-1]:
            at = at.setdefault(k, {})
        value = f"{attacker.name}.EvilNet"
        at[where[-1]] = value if where[-1] == "class_path" else {"class_path": value}

    models_uri, runs_uri = registered_tampered(edit)
    for uri in (models_uri, runs_uri):
        with pytest.raises(UntrustedConfigError, match=f"{attacker.name}.EvilNet"):
            cli("validate", f"--ckpt_path={uri}", "--trainer.logger=false")
        if where[0] != "data":  # the model alone: load_model builds no DataModule, nor init_weights' read of its net
            with pytest.raises(UntrustedConfigError, match=f"{attacker.name}.EvilNet"):
                load_model(uri)
            with pytest.raises(UntrustedConfigError, match=f"{attacker.name}.EvilNet"):
                cli("fit", "--config", CNN, f"--model.init_args.init_weights={uri}", "--trainer.logger=false")
    assert not attacker.ran()


# -- what is allowed -----------------------------------------------------------------------------------------


def _sections(config: dict) -> list[tuple[str, dict]]:
    return [(k, config[k]) for k in ("model", "data") if k in config]


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_config_builds_as_a_stored_config(path):
    """Every config the zoo ships resolves by the builder's rules (a kind of annotation it cannot read would fail
    here), and its plain form resolves to the same again."""
    from zoo.app.stored_config import stored_config_allowlist

    allow = stored_config_allowlist()
    for section, cfg in _sections(yaml.safe_load(path.read_text())):
        args = cfg.get("init_args") or {}
        if section == "model":
            part = build.resolve_model(
                {"_class_path": cfg["class_path"], **args}, str(path), allow, keep_locations=True
            )
            stored = {"_class_path": cfg["class_path"], **part.plain()["init_args"]}
            again = build.resolve_model(stored, "x", allow, keep_locations=True)
        else:
            part = build.resolve_data(cfg["class_path"], args, str(path), allow, keep_locations=True)
            again = build.resolve_data(cfg["class_path"], part.plain()["init_args"], "x", allow, keep_locations=True)
        assert build.plain(again.args) == build.plain(part.args)


def test_a_class_or_env_the_users_own_config_names_is_theirs_to_vouch_for(attacker):
    from zoo.app.stored_config import stored_config_allowlist

    allow = stored_config_allowlist()
    stored = {"_class_path": "zoo.cnn.ClassifierModule", "net": {"class_path": "zoo.cnn.ConvNet"}}
    stored["net"]["init_args"] = {"extra": {"class_path": f"{attacker.name}.EvilNet"}}
    with pytest.raises(UntrustedConfigError):
        build.resolve_model(stored, "x.ckpt", allow)
    data = {"env_id": f"{attacker.name}:EvilEnv", "wrappers": [f"{attacker.name}.EvilWrapper"]}
    with pytest.raises(UntrustedConfigError):
        build.resolve_data("datamodules.GymDataModule", data, "x.ckpt", allow)
    assert not attacker.ran()
    vouched = allow.with_trusted(trust.trusted_class_paths({"data": copy.deepcopy(data)}))
    part = build.resolve_data("datamodules.GymDataModule", data, "x.ckpt", vouched)
    assert part.args == data  # the user named them: theirs (the builder imports nothing until it builds)


def test_a_stored_location_is_dropped_at_every_depth():
    from zoo.app.stored_config import stored_config_allowlist

    allow = stored_config_allowlist()
    part = build.resolve_data(
        "datamodules.GymDataModule", {"env_id": "CartPole-v1", "video_dir": "/etc"}, "x.ckpt", allow
    )
    assert part.args == {"env_id": "CartPole-v1"} and part.all_dropped() == ["data.init_args.video_dir"]
    images = {"class_path": "datamodules.TorchvisionDataModule", "init_args": {"root": "/secret", "batch_size": 8}}
    stored = {"images": images, "output_dir": "/home", "num_samples": 4}
    part = build.resolve_data("datamodules.DiffusionDataModule", stored, "x.ckpt", allow)
    assert part.plain()["init_args"] == {
        "images": {"class_path": "datamodules.TorchvisionDataModule", "init_args": {"batch_size": 8}},
        "num_samples": 4,
    }
    assert sorted(part.all_dropped()) == ["data.init_args.images.init_args.root", "data.init_args.output_dir"]
    text = {"path": "/etc/passwd", "root": "/tmp/x", "test_path": "a.txt", "gpt2_dir": "d", "prompts_file": "p"}
    assert build.resolve_data("datamodules.TextDataModule", text, "x.ckpt", allow).args == {}
    assert build.resolve_data("datamodules.TorchvisionDataModule", {"download": True}, "x", allow).args == {}


def test_every_allowed_class_has_resolvable_annotations():
    """An annotation that did not resolve would be read as ``Any`` (plain data), refusing nets given there."""
    import typing

    from zoo.app.stored_config import stored_config_allowlist

    allow = stored_config_allowlist()
    for cls in {**allow.modules, **allow.data, **allow.parts}.values():
        for base in cls.__mro__:
            init = vars(base).get("__init__")
            if init is not None and base.__module__.split(".")[0] in ("zoo", "datamodules"):
                typing.get_type_hints(init)  # raises, naming the annotation, if it cannot be resolved


# -- fuzz: random stored configs through every way in ------------------------------------------------------------

# A payload, in every shape a reader might take for code: a class path as a string, a mapping (with extra keys beside
# it), YAML (block and flow) and JSON text, in lists, tuples and dicts, a process to start, a module to import.
PAYLOADS = [
    "{m}.EvilNet",
    "{m}.evil",
    "{m}:EvilEnv",
    {"class_path": "{m}.EvilNet"},
    {"class_path": "{m}.evil", "init_args": {"x": 1}},
    {"class_path": "subprocess.Popen", "init_args": {"args": "touch {marker}", "shell": True}},
    {"class_path": "os.system", "init_args": {"command": "touch {marker}"}},
    {"class_path": "zoo.cnn.ConvNet", "init_args": {}, "extra": {"class_path": "{m}.EvilNet"}},
    {"class_path": "gymnasium.wrappers.ClipAction", "dict_kwargs": {"f": {"class_path": "{m}.evil"}}},
    "class_path: {m}.EvilNet\ninit_args: {{}}",
    "{{class_path: {m}.EvilNet}}",
    '{{"class_path": "subprocess.Popen", "init_args": {{"args": "touch {marker}", "shell": true}}}}',
    "- &a {{class_path: {m}.evil}}\n- *a",
    ["{m}.EvilNet", {"class_path": "{m}.EvilNet"}],
    ("{m}.evil",),
    {"k": {"class_path": "{m}.EvilNet"}, "j": "{m}.evil"},
]


def _fill_payload(value, module: str, marker: Path):
    if isinstance(value, str):
        return value.replace("{m}", module).replace("{marker}", str(marker)).replace("{{", "{").replace("}}", "}")
    if isinstance(value, (list, tuple)):
        return type(value)(_fill_payload(v, module, marker) for v in value)
    if isinstance(value, dict):
        return {k: _fill_payload(v, module, marker) for k, v in value.items()}
    return value


def _positions(config, prefix=()) -> list[tuple]:
    """Every key path of a stored config, at every depth (lists by index)."""
    out = []
    items = config.items() if isinstance(config, dict) else enumerate(config) if isinstance(config, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out += _positions(v, (*prefix, k))
    return out


def fuzzed(ckpt: dict, rng, module: str, marker: Path) -> dict:
    """``ckpt`` with 1-3 payloads put at random places of its stored configs: replacing a value at any depth, or
    beside one under a new key."""
    ckpt = copy.deepcopy(ckpt)
    for _ in range(rng.randint(1, 3)):
        section = rng.choice([s for s in ("hyper_parameters", "datamodule_hyper_parameters") if ckpt.get(s)])
        at = ckpt[section] = dict(ckpt[section])
        path = list(rng.choice(_positions(at)))
        for k in path[:-1]:
            at = at[k]
        payload = _fill_payload(copy.deepcopy(rng.choice(PAYLOADS)), module, marker)
        if rng.random() < 0.25 and isinstance(at.get(path[-1]) if isinstance(at, dict) else None, dict):
            at[path[-1]][f"extra_{rng.randint(0, 9)}"] = payload  # a new key beside the ones it has
        else:
            at[path[-1]] = payload
    return ckpt


def _harmless(load, *args) -> str:
    """Runs a load; any refusal is fine here (the one-line tests are above): only code running is not."""
    try:
        load(*args)
    except SystemExit as err:
        return f"exit {err.code}"
    except Exception as err:
        return type(err).__name__
    return "loaded"


@pytest.mark.parametrize("family", ["cnn", "ppo"])
def test_fuzzed_stored_configs_never_run_code_in_process(checkpoints, attacker, tmp_path, family):
    """Many random tamperings through the builder, load_from_checkpoint and load_model; the attacker's marker (its
    module imported, a class built, a process run) never appears."""
    import random

    from zoo.cnn import ClassifierModule
    from zoo.io.checkpoint import build_stored
    from zoo.rl import PPOModule
    from zoo.tracking import load_model

    cls = {"cnn": ClassifierModule, "ppo": PPOModule}[family]
    clean = torch.load(checkpoints[family], weights_only=True)
    outcomes = collections.Counter()
    rng = random.Random(f"fuzz-{family}")
    for i in range(60):
        ckpt = fuzzed(clean, rng, attacker.name, attacker.marker)
        outcomes[_harmless(build_stored, cls, ckpt, "fuzzed", {})] += 1
        if i % 6 == 0:  # the file ways in, on every sixth
            path = tmp_path / f"fuzz{i}.ckpt"
            torch.save(ckpt, path)
            for load in (cls.load_from_checkpoint, load_model):
                outcomes[_harmless(load, str(path))] += 1
        assert not attacker.ran(), (i, outcomes)
    assert outcomes["UntrustedConfigError"] > 40, outcomes  # the payloads are refused, not merely survived


def test_fuzzed_stored_configs_never_run_code_through_the_command_line(checkpoints, attacker, tmp_path, served):
    """The same through ``cli.py validate|predict --ckpt_path``: a local file and a URL."""
    import random

    rng = random.Random("fuzz-cli")
    for i in range(8):
        family = rng.choice(["cnn", "ppo"])
        path = tmp_path / f"fuzz{i}.ckpt"
        torch.save(
            fuzzed(torch.load(checkpoints[family], weights_only=True), rng, attacker.name, attacker.marker), path
        )
        where = str(path) if i % 2 else f"{served}/{path.name}"
        for sub in ("validate", "predict"):
            _harmless(cli, sub, f"--ckpt_path={where}", "--trainer.logger=false", "--trainer.limit_val_batches=1")
        assert not attacker.ran(), i


def test_fuzzed_registered_models_never_run_code(registered_tampered, attacker, tmp_path):
    """A registered model's module.json tampered at random, through models:/ and runs:/ on the command line,
    zoo.tracking.load and load_model, and MLflow's own pyfunc loader (which runs the model's bundled zoo code: that
    code's builder refuses the same)."""
    import random

    import mlflow

    from zoo.tracking import load, load_model

    rng = random.Random("fuzz-registry")
    outcomes = collections.Counter()
    for i in range(3):

        def edit(spec, rng=rng):
            hparams = {"hyper_parameters": spec["init_args"], "datamodule_hyper_parameters": spec["data"]["init_args"]}
            tampered = fuzzed(hparams, rng, attacker.name, attacker.marker)
            spec["init_args"], spec["data"]["init_args"] = (
                tampered["hyper_parameters"],
                tampered["datamodule_hyper_parameters"],
            )

        models_uri, runs_uri = registered_tampered(edit)
        for uri in (models_uri, runs_uri):
            args = (f"--ckpt_path={uri}", "--trainer.logger=false", "--trainer.limit_val_batches=1")
            outcomes[_harmless(cli, "validate", *args)] += 1
            outcomes[_harmless(load_model, uri)] += 1
            outcomes[_harmless(load, uri)] += 1
        outcomes[_harmless(mlflow.pyfunc.load_model, models_uri)] += 1
        assert not attacker.ran(), i
    assert outcomes["UntrustedConfigError"] >= 9, outcomes


def test_a_stored_location_is_dropped_through_the_command_line_and_the_run_says_so(checkpoints, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere" / "videos"
    path = tamper(
        checkpoints["ppo"], tmp_path / "moved.ckpt", "datamodule_hyper_parameters", "video_dir", str(elsewhere)
    )
    c = cli("validate", f"--ckpt_path={path}", "--trainer.logger=false", "--data.init_args.eval_episodes=1")
    assert c.datamodule.hparams.video_dir is None and not elsewhere.parent.exists()
    assert "replace its data.init_args.video_dir" in capsys.readouterr().err
    # the user's own flag is theirs
    c = cli("validate", f"--ckpt_path={path}", "--trainer.logger=false", "--data.init_args.video_dir=mine")
    assert c.datamodule.hparams.video_dir == "mine"


def test_a_stored_model_location_is_dropped_through_the_command_line(checkpoints, tmp_path, capsys):
    """The model's own locations too: a stored init_weights names a file the run would otherwise be said to start
    from (and a fine-tune would read)."""
    elsewhere = tmp_path / "not-yours.ckpt"
    path = tamper(checkpoints["cnn"], tmp_path / "moved.ckpt", "hyper_parameters", "init_weights", str(elsewhere))
    c = cli("validate", f"--ckpt_path={path}", "--trainer.logger=false", "--trainer.limit_val_batches=1")
    assert c.model.hparams.init_weights is None
    assert "replace its model.init_args.init_weights" in capsys.readouterr().err
