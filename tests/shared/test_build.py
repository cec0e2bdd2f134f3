"""The stored-config builder's rules (``zoo.io.build``), one at a time: every key a parameter, every value converted by
its annotation, classes only from the allowlist and only where the annotation is a class, data never built."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from zoo.errors import InputError
from zoo.io import build, trust
from zoo.io.trust import UntrustedConfigError

CNN = {
    "_class_path": "zoo.cnn.ClassifierModule",
    "net": {"class_path": "zoo.cnn.ConvNet", "init_args": {"num_classes": 10, "in_channels": 1}},
}


@pytest.fixture(scope="module")
def allow():
    from zoo.app.stored_config import stored_config_allowlist

    return stored_config_allowlist()


def refused(stored: dict, allow, match: str) -> None:
    with pytest.raises(UntrustedConfigError, match=match):
        build.resolve_model(stored, "x.ckpt", allow)


def test_a_stored_module_builds_as_the_cli_builds_it_and_records_the_same_config(allow):
    part = build.resolve_model({**CNN, "label_smoothing": 1, "optimizer": {"lr": 0.5}}, "x.ckpt", allow)
    module = build.build(part, record=True)
    assert type(module.net).__name__ == "ConvNet" and module.net.num_classes == 10
    assert module.hparams.label_smoothing == 1.0 and isinstance(module.hparams.label_smoothing, float)
    assert module.hparams.net == {"class_path": "zoo.cnn.ConvNet", "init_args": {"num_classes": 10, "in_channels": 1}}
    assert module.hparams.optimizer["lr"] == 0.5 and module.hparams._instantiator == trust.LIGHTNING_INSTANTIATOR
    assert module.hparams.freeze_backbone is False  # defaults recorded, as LightningCLI's dump has them


def test_an_unknown_key_is_refused_at_every_depth_not_skipped(allow):
    refused({**CNN, "evil": 1}, allow, r"model\.init_args\.evil is 1, which is not a parameter of")
    net = {"class_path": "zoo.cnn.ConvNet", "init_args": {"num_classes": 10, "x": {"class_path": "os.system"}}}
    refused({**CNN, "net": net}, allow, r"model\.init_args\.net\.init_args\.x ")
    refused({**CNN, "net": {**CNN["net"], "dict_kwargs": {}}}, allow, r"model\.init_args\.net is ")
    refused({**CNN, "optimizer": {"lr": 1.0, "fn": "os.system"}}, allow, r"optimizer\.fn .*a field of AdamWCosine")


def test_values_are_converted_by_their_annotation(allow):
    refused({**CNN, "label_smoothing": "0.1"}, allow, r"label_smoothing is '0.1', which is not a number")
    refused({**CNN, "channels_last": 1}, allow, r"channels_last is 1, which is not true or false")
    refused({**CNN, "net": {**CNN["net"], "init_args": {"num_classes": True}}}, allow, r"num_classes is True")
    refused({**CNN, "optimizer": {"betas": [0.9]}}, allow, r"optimizer\.betas is \[0.9\], which is not 2 items")
    gpt = {"_class_path": "zoo.gpt.CausalLMModule", "net": {"class_path": "zoo.gpt.GPT", "init_args": {}}}
    refused(
        {**gpt, "net": {"class_path": "zoo.gpt.GPT", "init_args": {"position": "alibi"}}}, allow, r"one of \['learned'"
    )


def test_a_class_only_where_the_annotation_is_one_and_only_from_the_allowlist(allow):
    refused({**CNN, "net": {"class_path": "torch.nn.Linear"}}, allow, r"net\.class_path is 'torch\.nn\.Linear'")
    refused({**CNN, "net": {"class_path": "zoo.diffusion.DDIMSampler"}}, allow, r"net\.class_path .*a Module")
    refused({**CNN, "net": "subprocess.Popen"}, allow, r"net\.class_path is 'subprocess\.Popen'")
    refused({**CNN, "label_smoothing": {"class_path": "zoo.cnn.ConvNet"}}, allow, r"label_smoothing is \{")
    refused({**CNN, "_class_path": "zoo.cnn.ConvNet"}, allow, r"model class_path is 'zoo\.cnn\.ConvNet'")


def test_a_callable_position_is_built_as_a_partial_of_an_allowed_class(allow):
    attention = {"class_path": "zoo.gpt.MHA", "init_args": {"n_kv_head": 1}}
    net = {"class_path": "zoo.gpt.GPT", "init_args": {"vocab_size": 11, "n_layer": 1, "n_head": 2, "n_embd": 8}}
    net["init_args"]["attention"] = attention
    part = build.resolve_model({"_class_path": "zoo.gpt.CausalLMModule", "net": net}, "x.ckpt", allow)
    assert part.args["net"].args["attention"].kind == "callable"
    built = build.instantiate(part.args["net"].args["attention"])
    assert isinstance(built, functools.partial) and built.keywords == {"n_kv_head": 1}
    net["init_args"]["attention"] = {"class_path": "zoo.gpt.SwiGLU"}  # a zoo class, of another return type
    refused(
        {"_class_path": "zoo.gpt.CausalLMModule", "net": net}, allow, r"attention\.class_path is 'zoo\.gpt\.SwiGLU'"
    )


def test_data_positions_hold_plain_data_never_built_never_parsed(allow):
    yaml_text = "class_path: subprocess.Popen\ninit_args: {args: touch x, shell: true}"
    env = {"env_id": "CartPole-v1", "env_kwargs": {"render_mode": yaml_text, "nested": [{"a": [1, 2.5, None]}]}}
    part = build.resolve_data("datamodules.GymDataModule", env, "x.ckpt", allow)
    assert part.args["env_kwargs"] == env["env_kwargs"]  # copied as it is: the string stays a string
    decoy = {**env, "env_kwargs": {"k": {"class_path": "gymnasium.wrappers.ClipAction", "init_args": {}}}}
    with pytest.raises(UntrustedConfigError, match=r"env_kwargs\.k\.class_path is 'gymnasium"):
        build.resolve_data("datamodules.GymDataModule", decoy, "x.ckpt", allow)
    with pytest.raises(UntrustedConfigError, match=r"env_kwargs is 'class_path"):
        build.resolve_data("datamodules.GymDataModule", {**env, "env_kwargs": yaml_text}, "x.ckpt", allow)
    with pytest.raises(UntrustedConfigError, match=r"env_kwargs\.t is .*plain data"):
        build.resolve_data("datamodules.GymDataModule", {**env, "env_kwargs": {"t": torch.zeros(1)}}, "x", allow)


def test_wrappers_are_reviewed_classes_with_plain_arguments_and_no_extra_keys(allow):
    ok = {"class_path": "gymnasium.wrappers.ClipAction", "init_args": {}}
    part = build.resolve_data(
        "datamodules.GymDataModule", {"wrappers": [ok, "gymnasium.wrappers.ClipReward"]}, "x", allow
    )
    assert part.args["wrappers"][1] == "gymnasium.wrappers.ClipReward"
    extra = {**ok, "evil": {"class_path": "subprocess.Popen"}}
    nested = {"class_path": "gymnasium.wrappers.FrameStackObservation", "init_args": {"stack_size": {"a": 1}}}
    for wrappers, match in (
        ([extra], r"wrappers\[0\] is .*\{class_path, init_args\} of a reviewed wrapper"),
        ([nested], r"wrappers\[0\]\.init_args is .*plain values"),
        (["gymnasium.wrappers.TransformObservation"], r"wrappers\[0\] is 'gymnasium\.wrappers\.Transform"),
        ("gymnasium.wrappers.ClipAction", r"wrappers is .*a list"),
    ):
        with pytest.raises(UntrustedConfigError, match=match):
            build.resolve_data("datamodules.GymDataModule", {"wrappers": wrappers}, "x.ckpt", allow)


def test_a_recursion_bomb_is_refused_in_one_line(allow):
    deep: Any = 1
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(UntrustedConfigError, match="at most 32 levels"):
        build.resolve_data("datamodules.GymDataModule", {"env_kwargs": {"x": deep}}, "x.ckpt", allow)
    cycle: dict = {}
    cycle["self"] = cycle  # a weights-only unpickler's memo can make one
    with pytest.raises(UntrustedConfigError, match="at most 32 levels"):
        build.resolve_data("datamodules.GymDataModule", {"env_kwargs": cycle}, "x.ckpt", allow)


def test_a_required_location_left_out_asks_the_user_for_it(allow):
    images = {"class_path": "datamodules.ImageFolderDataModule", "init_args": {"root": "/secret"}}
    part = build.resolve_data("datamodules.DiffusionDataModule", {"images": images}, "x.ckpt", allow, complete=False)
    assert part.all_missing() == ["data.init_args.images.init_args.root"]
    with pytest.raises(InputError, match=r"pass --data\.init_args\.images\.init_args\.root=<\.\.\.>"):
        build.resolve_data("datamodules.DiffusionDataModule", {"images": images}, "x.ckpt", allow)


def test_the_users_own_class_is_theirs_to_vouch_for(allow):
    user = allow.with_trusted({"torch.nn.Identity"})
    net = {"class_path": "torch.nn.Identity"}
    refused({**CNN, "net": net}, allow, "torch.nn.Identity")
    part = build.resolve_model({**CNN, "net": net}, "x.ckpt", user)
    assert part.args["net"].cls is torch.nn.Identity
