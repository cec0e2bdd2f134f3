"""The net's sizes that the data states, set by the application before the net is built (zoo.app.sizes): each
family's rule fills an unset size from the data (a tokenizer's ids, a dataset's classes, an env's spaces) and refuses
a given one that disagrees in one line naming both; a checkpoint's stored sizes fill what a config leaves unset; and
no module writes its own hyperparameters."""

from __future__ import annotations

import ast
import contextlib
import os
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import CONFIGS, ROOT, cli

from zoo.app import sizes
from zoo.errors import InputError


class Text:
    """A DataModule's face as the GPT rule reads it: ``vocab_size`` a property (the tokenizer's ids)."""

    def __init__(self, n: int) -> None:
        self.n, self.read = n, 0

    @property
    def vocab_size(self) -> int:
        self.read += 1
        return self.n


def test_gpt_vocab_size_is_the_tokenizers_unless_given_and_a_given_one_must_agree():
    from zoo.gpt.module import vocab_size_for

    assert sizes.vocabulary(Text(65), {"vocab_size": None}, False) == {"vocab_size": 65}
    data = Text(65)  # a given size is not read from the data here: the module checks it at setup, by this rule
    assert sizes.vocabulary(data, {"vocab_size": 100}, False) == {} and data.read == 0
    assert vocab_size_for(None, 65) == 65 and vocab_size_for(65, 65) == 65
    assert vocab_size_for(50304, 50257) == 50304  # padding to a multiple of 64
    with pytest.raises(InputError, match=r"tokenizer has 65 ids but the net's vocab_size is 100"):
        vocab_size_for(100, 65)
    with pytest.raises(InputError, match=r"vocab_size is 64"):  # a multiple of 64, but smaller than the tokenizer's
        vocab_size_for(64, 100)


def test_an_evaluated_checkpoint_keeps_its_vocabulary_and_never_asks_the_data():
    data = Text(65)
    assert sizes.vocabulary(data, {"vocab_size": 257}, True) == {} and data.read == 0  # its own tokenizer encodes
    with pytest.raises(InputError, match="vocab_size is not set"):
        sizes.vocabulary(data, {"vocab_size": None}, True)


def test_a_fits_windows_longer_than_the_nets_context_name_both_block_sizes():
    """The data's block_size raised alone (a conversation did not fit) failed mid-fit in the forward pass, naming only
    the net's block_size, which the user never set: refused before anything is built, naming both."""
    data = type("Conversations", (), {"block_size": 160, "vocab_size": 257})()
    with pytest.raises(InputError, match=r"data.init_args.block_size=160 .*net.init_args.block_size=96: pass --"):
        sizes.vocabulary(data, {"vocab_size": None, "block_size": 96}, False)
    assert sizes.vocabulary(data, {"vocab_size": None, "block_size": 160}, False) == {"vocab_size": 257}
    assert sizes.vocabulary(data, {"vocab_size": 257, "block_size": 96}, True) == {}  # a checkpoint's own windows
    sizes.check_context(96, 96)  # windows of T tokens (T + 1 read, for the shifted targets) fit a context of T
    with pytest.raises(InputError, match="block_size=97 is longer"):
        sizes.check_context(97, 96)


def test_a_gpts_windows_left_unset_are_the_nets_context_stated_once():
    """block_size is stated once, in the net: the data's windows left unset take it before the DataModule is built;
    given shorter they stay; with neither, one line asks for it; data without windows is left alone."""
    from jsonargparse import dict_to_namespace

    def config(data: dict, net: dict) -> Any:
        model = {"class_path": "zoo.gpt.CausalLMModule", "init_args": {"net": {"class_path": "zoo.gpt.GPT"}}}
        model["init_args"]["net"]["init_args"] = net
        data = {"class_path": "datamodules.TextDataModule", "init_args": data}
        return dict_to_namespace({"model": model, "data": data})

    for given, want in ((None, 64), (16, 16), (128, 128)):  # a longer one is check_context's to refuse, naming both
        cfg = config({"block_size": given}, {"block_size": 64})
        sizes.windows_from_context(cfg)
        assert cfg.data.init_args.block_size == want
    cfg = config({"prompts": 3}, {"block_size": 64})
    sizes.windows_from_context(cfg)
    assert "block_size" not in cfg.data.init_args
    with pytest.raises(InputError, match=r"data.init_args.block_size is not set and the net states no block_size"):
        sizes.windows_from_context(config({"block_size": None}, {"block_size": None}))
    from cli import main
    from datamodules import TextDataModule

    c = main(["--config", str(CONFIGS / "gpt" / "gpt_tiny.yaml"), "--trainer.logger=false"], run=False)
    assert c.datamodule.block_size == c.model.net.block_size == 64  # the config states it once, in the net
    assert c.config.data.init_args.block_size == 64  # and the config logged and stored says so
    assert TextDataModule(root="data", block_size=16).block_size == 16 and TextDataModule(root="data").block_size == 256
    import yaml

    def both(path) -> tuple:
        cfg = yaml.safe_load(path.read_text())
        net = (((cfg.get("model") or {}).get("init_args") or {}).get("net") or {}).get("init_args") or {}
        return net.get("block_size"), ((cfg.get("data") or {}).get("init_args") or {}).get("block_size")

    twice = [
        p.name
        for p in sorted((CONFIGS / "gpt").glob("*.yaml"))
        if None not in (pair := both(p)) and len(set(pair)) == 1
    ]
    assert twice == [], "these configs state block_size in the net and again in the data: drop the data's"


def test_num_classes_is_the_datas_unless_given_and_a_given_one_must_agree():
    data = SimpleNamespace(num_classes=3, class_names=["cat", "dog", "eel"])
    assert sizes.classes(data, {"num_classes": None}, False) == {"num_classes": 3}
    assert sizes.classes(data, {"num_classes": 5}, False) == {}  # checked at setup, by num_classes_for
    from zoo.cnn.module import num_classes_for

    with pytest.raises(InputError, match=r"num_classes=5 but the data has 3 classes \(cat, dog, eel\)"):
        num_classes_for(5, 3, data.class_names)
    assert sizes.classes(SimpleNamespace(), {"num_classes": 4}, True) == {}  # new files: no labels
    with pytest.raises(InputError, match="num_classes is not set and the data does not say"):
        sizes.classes(SimpleNamespace(), {"num_classes": None}, False)


def env(obs: gym.Space, action: gym.Space) -> SimpleNamespace:
    return SimpleNamespace(spaces=(obs, action), env_id="Test-v0")


ACTOR_CRITIC = {"obs_dim": None, "action_dim": None, "continuous": None, "action_nvec": None, "encoder": "flat"}
ACTOR_CRITIC |= {"obs_shape": None}
BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


def test_rl_sizes_are_the_envs_spaces():
    discrete = env(BOX, gym.spaces.Discrete(2))
    got = sizes.spaces(discrete, ACTOR_CRITIC, False)
    assert got == {"obs_dim": 3, "action_dim": 2, "continuous": False}  # a flat encoder takes no obs_shape
    multi = sizes.spaces(env(BOX, gym.spaces.MultiDiscrete([3, 2])), ACTOR_CRITIC, False)
    assert multi == {"obs_dim": 3, "action_dim": 5, "continuous": False, "action_nvec": [3, 2]}
    image = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    cnn = sizes.spaces(env(image, gym.spaces.Discrete(6)), {**ACTOR_CRITIC, "encoder": "nature_cnn"}, False)
    assert cnn["obs_shape"] == [4, 84, 84] and cnn["obs_dim"] == 4 * 84 * 84
    torque = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))
    sac = {"obs_dim": None, "action_dim": None, "action_low": None, "action_high": None}
    assert sizes.spaces(env(BOX, torque), sac, False) == {
        "obs_dim": 3,
        "action_dim": 2,
        "action_low": [-2.0, 0.0],
        "action_high": [2.0, 1.0],
    }


def test_an_rl_size_that_disagrees_with_the_env_names_both():
    sized = {**ACTOR_CRITIC, "obs_dim": 5, "action_dim": 2, "continuous": False}
    assert sizes.spaces(SimpleNamespace(), sized, False) == {}  # sized by hand: no env made (checked at setup)
    with pytest.raises(InputError, match=r"Test-v0 needs a net with .*'action_dim': 2.*this one has .*'action_dim': 4"):
        sizes.spaces(env(BOX, gym.spaces.Discrete(2)), {**ACTOR_CRITIC, "action_dim": 4}, False)
    with pytest.raises(InputError, match=r"'continuous': True.*'continuous': False"):
        sizes.spaces(env(BOX, BOX), {**ACTOR_CRITIC, "continuous": False}, False)


def test_nets_are_built_sized_or_not_at_all():
    from zoo.cnn import ConvNet, ResNet, TorchvisionNet
    from zoo.gpt import GPT
    from zoo.rl import ActorCritic, DeterministicActorCritic, SoftActorCritic

    for build in (GPT, ConvNet, ResNet, TorchvisionNet, ActorCritic, SoftActorCritic, DeterministicActorCritic):
        with pytest.raises(ValueError, match="needs"):
            build()


@pytest.mark.parametrize(
    "config, want",
    [
        ("cnn/convnet_digits.yaml", {"num_classes": 10}),
        ("gpt/gpt_tiny.yaml", {"vocab_size": 257}),
        ("rl/ppo_tiny.yaml", {"obs_dim": 4, "action_dim": 2, "continuous": False}),
        ("rl/td3_tiny.yaml", {"obs_dim": 3, "action_dim": 1, "action_low": [-2.0], "action_high": [2.0]}),
    ],
)
def test_the_cli_passes_the_datas_sizes_into_the_nets_config_and_hyperparameters(config, want):
    from cli import main

    c = main(["--config", str(CONFIGS / config), "--trainer.logger=false"], run=False)
    given = c.model.hparams["net"]["init_args"]
    assert {k: given[k] for k in want} == want
    assert {k: c.config.model.init_args.net.init_args[k] for k in want} == want  # the config logged to MLflow
    assert all(getattr(c.model.net, k, 0) is not None for k in want)


def test_a_checkpoints_stored_size_fills_what_the_config_leaves_unset(tmp_path, monkeypatch):
    from jsonargparse import dict_to_namespace

    digits = str(CONFIGS / "cnn" / "convnet_digits.yaml")
    fit = cli("fit", "--config", digits, "--trainer.max_steps=1", "--trainer.logger=false")
    last = fit.trainer.checkpoint_callback.last_model_path
    model = torch.load(last, weights_only=True)["hyper_parameters"]
    cfg_model = {"class_path": model["_class_path"], "init_args": {"net": {**model["net"]}}}
    cfg_model["init_args"]["net"]["init_args"] = {**model["net"]["init_args"], "num_classes": None}
    assert sizes.checkpoint_sizes(last, cfg_model)["num_classes"] == 10
    # and is bounded as every stored net is (zoo.io.budget): a head of 10**9 classes is refused before it is built
    ckpt = torch.load(last, weights_only=True)
    ckpt["hyper_parameters"]["net"]["init_args"]["num_classes"] = 10**9
    torch.save(ckpt, tmp_path / "bomb.ckpt")
    monkeypatch.setenv("ZOO_MEMORY_GIB", "8")
    cfg = dict_to_namespace({"model": cfg_model, "ckpt_path": str(tmp_path / "bomb.ckpt")})
    with pytest.raises(InputError, match=r"bomb.ckpt: the net it describes \(num_classes=1,000,000,000"):
        sizes.size_the_net(cfg, SimpleNamespace(), "validate", sizes.classes)


def test_a_disagreeing_size_is_one_error_line_naming_both(capsys):
    from cli import main
    from zoo.app import terminal

    args = ["fit", "--config", str(CONFIGS / "cnn" / "convnet_digits.yaml"), "--trainer.logger=false"]
    with pytest.raises(SystemExit) as exited:  # as at a terminal (cli.run), in this process
        terminal.run(lambda: main([*args, "--model.init_args.net.init_args.num_classes=6"]))
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert exited.value.code == 1 and "Traceback" not in err, err
    assert len(errors) == 1 and "num_classes=6" in errors[0] and "10 classes" in errors[0], err


def _writes_to_hparams(tree: ast.AST) -> list[int]:
    """Lines that assign into ``...hparams...`` (an item, an attribute, ``update``/``setdefault``/``pop`` on it)."""

    def through_hparams(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Attribute) and n.attr == "hparams" for n in ast.walk(node))

    lines = []
    for n in ast.walk(tree):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AugAssign) else []
        if any(isinstance(t, (ast.Subscript, ast.Attribute)) and through_hparams(t.value) for t in targets):
            lines.append(n.lineno)
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in ("update", "setdefault", "pop", "__setitem__")
            and through_hparams(n.func.value)
        ):
            lines.append(n.lineno)
    return lines


def test_no_family_module_writes_its_own_hyperparameters():
    found = {
        str(p.relative_to(ROOT)): lines
        for family in ("gpt", "cnn", "clip", "diffusion", "rl")
        for p in sorted((ROOT / "zoo" / family).rglob("*.py"))
        if (lines := _writes_to_hparams(ast.parse(p.read_text())))
    }
    assert found == {}
    # the check itself sees the write the modules used to make
    assert _writes_to_hparams(ast.parse('self.hparams["net"]["init_args"]["num_classes"] = k')) == [1]
    assert _writes_to_hparams(ast.parse("self.hparams.get('net')['init_args'].update(x)")) == [1]


# -- stored values bounded before use (zoo.io.budget) -----------------------------------------------------------------


def stored_part(config: str, key: str, at: dict[str, Any]):
    """The ``key`` part (model or data) of a repo config as a stored config states it, with ``at``'s dotted
    settings (under init_args) replaced: what a checkpoint or registered model would carry."""
    import yaml

    from zoo.app.stored_config import stored_config_allowlist
    from zoo.io import build

    section = yaml.safe_load((CONFIGS / config).read_text())[key]
    for dotted, value in at.items():
        here = section["init_args"]
        *path, last = dotted.split(".")
        for k in path:
            here = here.setdefault(k, {})
            here = here.setdefault("init_args", {}) if "class_path" in here else here
        here[last] = value
    allow = stored_config_allowlist()
    if key == "model":
        stored = {"_class_path": section["class_path"], **section["init_args"]}
        return build.resolve_model(stored, "stored.ckpt", allow, complete=False)
    return build.resolve_data(section["class_path"], section["init_args"], "stored.ckpt", allow, complete=False)


BOMBS = [  # (config, part, setting, value): each a stored value the outside probe ran out of memory or time with
    ("gpt/gpt_tiny.yaml", "model", "net.vocab_size", 10**9),
    ("gpt/gpt_tiny.yaml", "model", "net.n_layer", 10**5),
    ("diffusion/tiny.yaml", "model", "net.image_size", 10**6),
    ("cnn/convnet_digits.yaml", "model", "adapt.lora.r", 10**7),
    ("diffusion/tiny.yaml", "model", "objective.num_timesteps", 10**9),
    ("rl/ppo_tiny.yaml", "data", "eval_episodes", 10**9),
    ("rl/ppo_tiny.yaml", "data", "num_envs", 10**4),
]


@contextlib.contextmanager
def address_space(extra: int):
    """This process may map at most ``extra`` more bytes inside the block: a bound that fails then fails this test
    with an allocation error, instead of the machine's memory running out (Linux's RLIMIT_AS)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + extra, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("config, key, setting, value", BOMBS, ids=[b[2] for b in BOMBS])
def test_a_stored_size_or_count_past_its_bound_is_one_line_before_anything_is_built(
    config, key, setting, value, monkeypatch
):
    import time

    import psutil

    from zoo.io import build

    monkeypatch.setenv("ZOO_MEMORY_GIB", "8")  # every machine's bound alike (a test's nets are far below it)
    monkeypatch.delenv("ZOO_BUDGET", raising=False)
    fixed = {"net.num_classes": 10} if config.startswith("cnn") else {"net.vocab_size": 65} if "gpt" in config else {}
    part = stored_part(config, key, {**fixed, setting: value})
    build.nets(part)  # the imports it makes (Lightning's) are not the check's time
    rss, start = psutil.Process().memory_info().rss, time.perf_counter()
    with pytest.raises(InputError) as refused, address_space(2**30):
        build.build(part)
    assert time.perf_counter() - start < 3 and psutil.Process().memory_info().rss - rss < 2**28  # < 256 MiB
    line = str(refused.value)
    assert "\n" not in line and line.startswith("stored.ckpt: ") and "ZOO_BUDGET=off" in line
    assert f"{setting.rsplit('.', 1)[-1]}={value:,}" in line  # names the value


def test_the_memory_estimate_counts_the_nets_shapes_adapters_and_one_batch(monkeypatch):
    from zoo.io import budget, build

    monkeypatch.setenv("ZOO_MEMORY_GIB", "1")
    gpt = {"vocab_size": 65, "block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32}
    build.check_net({"class_path": "zoo.gpt.GPT", "init_args": gpt}, "x")  # ~60k parameters
    size, net = budget.meta_bytes(lambda: torch.nn.Linear(1000, 1000), 2**40)
    assert size == (1000 * 1000 + 1000) * 4 and net.weight.is_meta
    assert budget.meta_bytes(lambda: torch.nn.Linear(1000, 1000), 1000)[0] > 1000  # stopped past the bound
    assert budget.lora_bytes([net], {"adapt.lora.r": 8}) == 8 * (1000 + 1000) * 4
    assert budget.batch_bytes({"data.batch_size": 4, "net.image_size": 32}) == 4 * 3 * 32 * 32 * 4
    with pytest.raises(InputError, match=r"x: the net it describes \(vocab_size=10,000,000.*over the bound of 1.0 GiB"):
        build.check_net({"class_path": "zoo.gpt.GPT", "init_args": {**gpt, "vocab_size": 10**7}}, "x")
    monkeypatch.delenv("ZOO_MEMORY_GIB")
    assert budget.memory_bound() == budget.host_memory()


def test_zoo_budget_off_lets_a_trusted_files_counts_through(monkeypatch):
    from zoo.io import build

    part = stored_part("rl/ppo_tiny.yaml", "data", {"eval_episodes": 20_000})
    with pytest.raises(InputError, match=r"eval_episodes=20,000 is over the bound of 10,000"):
        build.build(part)
    monkeypatch.setenv("ZOO_BUDGET", "off")
    assert build.build(part).eval_episodes == 20_000
    monkeypatch.setenv("ZOO_BUDGET", "on")
    monkeypatch.setenv("ZOO_MEMORY_GIB", "0.0001")
    with pytest.raises(InputError, match="over the bound of 0.0 GiB"):
        build.check_net({"class_path": "zoo.gpt.GPT", "init_args": {"vocab_size": 65, "block_size": 8}}, "x")
    monkeypatch.setenv("ZOO_MEMORY_GIB", "1")  # raised: the same net loads
    build.check_net({"class_path": "zoo.gpt.GPT", "init_args": {"vocab_size": 65, "block_size": 8}}, "x")


def test_a_stored_worker_count_is_lowered_to_the_cpus_with_a_line(capsys, monkeypatch):
    from zoo.io import budget, build

    monkeypatch.delenv("ZOO_BUDGET", raising=False)
    part = stored_part("diffusion/tiny.yaml", "data", {"images.num_workers": 48})
    data = build.build(part)
    assert data.images.num_workers == budget.cpus() < 48
    assert "lowered images.num_workers=48 to" in capsys.readouterr().err
    for given, used in ((budget.cpus() + 1, budget.cpus()), (1, 1)):  # one past the CPUs is lowered; fewer kept
        data = build.build(stored_part("diffusion/tiny.yaml", "data", {"images.num_workers": given}))
        assert data.images.num_workers == used


def test_a_pyfunc_request_for_10_9_new_tokens_is_one_line():
    from zoo.tracking.serving import TextGenerator

    model = TextGenerator(SimpleNamespace(hparams=SimpleNamespace(generation={})))
    with pytest.raises(InputError, match=r"the request's params: max_new_tokens=1,000,000,000 is over the bound"):
        model.predict({"prompt": ["a"]}, {"max_new_tokens": 10**9})


def test_a_checkpoints_stored_episode_count_is_one_error_line_and_the_users_own_flag_is_theirs(
    ppo_fit, tmp_path, monkeypatch, capsys
):
    """Through ``cli.py validate --ckpt_path``: a stored ``eval_episodes`` of 10**9 (days of episodes) stops the run
    in one line before any env is made; the same setting given as the user's own flag is theirs, unbounded."""
    from conftest import terminal

    from zoo.app.stored_config import from_checkpoint

    ckpt = torch.load(ppo_fit.last, weights_only=True)
    ckpt["datamodule_hyper_parameters"]["eval_episodes"] = 10**9
    torch.save(ckpt, tmp_path / "bomb.ckpt")
    monkeypatch.delenv("ZOO_BUDGET", raising=False)
    argv = ["validate", f"--ckpt_path={tmp_path / 'bomb.ckpt'}", "--trainer.logger=false"]
    code, _, err = terminal(monkeypatch, capsys, *argv)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert "bomb.ckpt: eval_episodes=1,000,000,000 is over the bound of 10,000: set ZOO_BUDGET=off" in errors[0]
    assert from_checkpoint([*argv, "--data.init_args.eval_episodes=20000"]).data().eval_episodes == 20_000


def test_a_folders_config_json_past_the_memory_bound_is_one_line_by_every_way_in(tmp_path, monkeypatch):
    """A GPT-2 folder whose config.json says vocab_size=10**9: refused by its reader (``load_gpt2``) and as
    ``init_weights`` through ``cli.py`` (the net it states, ``zoo.app.pretrained``), before any weights are read."""
    import json

    from cli import main
    from zoo.gpt.formats.hf import load_gpt2

    monkeypatch.setenv("ZOO_MEMORY_GIB", "8")
    monkeypatch.delenv("ZOO_BUDGET", raising=False)
    config = {"model_type": "gpt2", "vocab_size": 10**9, "n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 32}
    (tmp_path / "config.json").write_text(json.dumps(config))  # no weights: the refusal comes first
    with pytest.raises(InputError, match=r"the net it describes \(vocab_size=1,000,000,000.*ZOO_MEMORY_GIB"):
        load_gpt2(tmp_path)
    gpt = str(CONFIGS / "gpt" / "gpt_tiny.yaml")
    with pytest.raises(InputError, match=rf"{tmp_path}: the net it describes \(vocab_size=1,000,000,000"):
        main(["--config", gpt, f"--model.init_args.init_weights={tmp_path}", "--trainer.logger=false"], run=False)
