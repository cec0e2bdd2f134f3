"""Every stage starts from a registered model (zoo.app.pretrained): ``init_weights: models:/<name>/<version>`` (or
``@alias``) builds the net that model stores, for SFT, DPO, GRPO and a LoRA fit of a GPT and for a CNN (an agent from a
cli.py checkpoint, the same rule), with configs that write no net settings: the built net's weights and outputs are
the registered model's, and ``--print_config`` prints that net. A net setting of the config's own that the registered
one contradicts is one ``error:`` line naming it."""

from __future__ import annotations

import functools

import pytest
import torch
import yaml
from conftest import CONFIGS, terminal

from zoo.tracking import load_model

# The SFT model's net: every setting here differs from GPT's defaults (4 x 256, block 256, learned positions,
# LayerNorm, tanh GeLU), so a net built from the defaults or the config would differ from it.
SFT_NET = {
    "vocab_size": 257,
    "block_size": 96,
    "n_layer": 1,
    "n_embd": 32,
    "n_head": 2,
    "position": "rope",
    "norm": {"class_path": "zoo.gpt.RMSNorm"},
    "mlp": {"class_path": "zoo.gpt.GeluMLP", "init_args": {"approximate": "exact"}},
    "dropout": 0.0,  # stored, as cli.py stores every setting: a fit from it may choose its own
}
TASK = [f"--data.init_args.generate.{k}={v}" for k, v in (("train", 16), ("pairs", 8), ("test", 4))]


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    """A CausalLMModule of ``SFT_NET`` registered as ``sft`` (version 1, alias ``champion``) in a store of its own:
    the store's URI."""
    from mlflow.tracking import MlflowClient

    from zoo.gpt import GPT, CausalLMModule, GeluMLP, RMSNorm
    from zoo.tracking import log_checkpoint_model

    folder = tmp_path_factory.mktemp("sft")
    uri = f"sqlite:///{folder / 'store.db'}"
    torch.manual_seed(0)
    kwargs = {**SFT_NET, "norm": RMSNorm, "mlp": functools.partial(GeluMLP, approximate="exact")}
    hparams = {"_class_path": "zoo.gpt.CausalLMModule", "net": {"class_path": "zoo.gpt.GPT", "init_args": SFT_NET}}
    ckpt = folder / "sft.ckpt"
    torch.save({"state_dict": CausalLMModule(GPT(**kwargs)).state_dict(), "hyper_parameters": hparams}, ckpt)
    client = MlflowClient(uri, registry_uri=uri)
    run_id = client.create_run(client.create_experiment("sft", (folder / "artifacts").as_uri())).info.run_id
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        log_checkpoint_model(ckpt, client, run_id, "sft")
    client.set_registered_model_alias("sft", "champion", "1")
    return uri


def without_net_settings(config: str, folder) -> str:
    """``config`` with its net's settings left out (the class alone), as a stage's config that starts from a model."""
    text = yaml.safe_load((CONFIGS / "gpt" / config).read_text())
    text["model"]["init_args"]["net"] = {"class_path": "zoo.gpt.GPT"}
    path = folder / config
    path.write_text(yaml.safe_dump(text))
    return str(path)


def built_from(*args: str):
    """The module ``cli.py fit <args>`` builds, its ``init_weights`` loaded as a fit's setup loads them."""
    from cli import main

    model = main(list(args), run=False).model
    model.setup("fit")
    return model


def assert_same_net(net, registered) -> None:
    theirs = registered.net.state_dict()
    assert net.state_dict().keys() == theirs.keys()
    for name, tensor in net.state_dict().items():
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=0, msg=name)
    ids = torch.randint(0, 257, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(net.eval()(ids), registered.net.eval()(ids), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("config", "extra"),
    [
        ("chat_arithmetic.yaml", []),  # SFT: a CausalLMModule
        ("dpo_tiny.yaml", []),
        ("grpo_arithmetic.yaml", []),
        ("dpo_tiny.yaml", ["--model.init_args.adapt={lora: {r: 4}}"]),  # a LoRA fit: adapters come after (setup)
    ],
    ids=["sft", "dpo", "grpo", "dpo-lora"],
)
def test_each_gpt_stage_builds_the_registered_models_net(sft, tmp_path, monkeypatch, config, extra):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sft)
    path = without_net_settings(config, tmp_path)
    model = built_from("--config", path, "--model.init_args.init_weights=models:/sft/1", *TASK, *extra)
    assert model.hparams.net["init_args"]["n_layer"] == 1  # what its checkpoints rebuild it from
    assert_same_net(model.net, load_model("models:/sft/1", sft))


def test_an_alias_names_the_model_and_print_config_shows_its_net(sft, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sft)
    dpo = str(CONFIGS / "gpt" / "dpo_tiny.yaml")
    status, out, err = terminal(
        monkeypatch,
        capsys,
        "fit",
        "--config",
        dpo,
        "--model.init_args.init_weights=models:/sft@champion",
        "--print_config",
    )
    assert status == 0, err
    net = yaml.safe_load(out)["model"]["init_args"]["net"]
    assert net["class_path"] == "zoo.gpt.GPT" and {k: net["init_args"][k] for k in ("n_layer", "position")} == {
        "n_layer": 1,
        "position": "rope",
    }
    assert net["init_args"]["mlp"] == SFT_NET["mlp"] and net["init_args"]["norm"]["class_path"] == "zoo.gpt.RMSNorm"
    assert yaml.safe_load(out)["model"]["init_args"]["init_weights"] == "models:/sft@champion"  # as typed


def test_a_net_setting_the_registered_model_contradicts_is_one_line_naming_it(sft, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sft)
    # chat_arithmetic.yaml states a net of width 128 with 4 layers and heads: stated, GPT's defaults (4) are the
    # config's own all the same (zoo.app.parser's stated_config), and contradict the model's
    sft_config = str(CONFIGS / "gpt" / "chat_arithmetic.yaml")
    flags = ["--model.init_args.init_weights=models:/sft/1", "--model.init_args.net.init_args.dropout=0.1", *TASK]
    status, out, err = terminal(monkeypatch, capsys, "fit", "--config", sft_config, *flags)
    line = err.strip().splitlines()[0]
    assert status != 0 and line.startswith("error: init_weights 'models:/sft/1' states the net"), err
    assert "net.init_args.n_embd=128 (the source's: 32)" in line and "n_layer=4 (the source's: 1)" in line, err
    assert "dropout" not in line  # the weights do not depend on it: the config's own
    assert "Leave these out of model.init_args.net" in line and "Traceback" not in err


def test_a_cnn_builds_the_registered_models_net_with_its_head_for_the_data(digits_fit, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", digits_fit.tracking_uri)
    config = yaml.safe_load((CONFIGS / "cnn" / "convnet_digits.yaml").read_text())
    config["model"]["init_args"]["net"] = {"class_path": "zoo.cnn.ConvNet"}  # width 32 by default; digits' is 8
    (tmp_path / "digits.yaml").write_text(yaml.safe_dump(config))
    model = built_from("--config", str(tmp_path / "digits.yaml"), "--model.init_args.init_weights=models:/digits/1")
    registered = load_model("models:/digits/1", digits_fit.tracking_uri)
    assert model.net.num_classes == 10  # the data's (a head is replaced for another number of classes)
    theirs = registered.net.state_dict()
    for name, tensor in model.net.state_dict().items():
        torch.testing.assert_close(tensor, theirs[name], rtol=0, atol=0, msg=name)
    images = torch.rand(3, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(model.net.eval()(images), registered.net.eval()(images), rtol=0, atol=0)
    # data of another number of classes: the registered body, a new head (the size stays the config's, not the model's)
    flags = ["--model.init_args.init_weights=models:/digits@champion", "--model.init_args.net.init_args.num_classes=5"]
    five = built_from("--config", str(tmp_path / "digits.yaml"), *flags).net
    assert five.num_classes == 5 and five.state_dict().keys() == theirs.keys()
    same = [k for k, v in five.state_dict().items() if v.shape == theirs[k].shape and torch.equal(v, theirs[k])]
    assert len(same) == len(theirs) - 2, sorted(set(theirs) - set(same))  # all but the head's weight and bias


def test_an_agent_builds_and_loads_a_zoo_checkpoints_net_and_statistics(ppo_fit, tmp_path):
    config = yaml.safe_load((CONFIGS / "rl" / "ppo_tiny.yaml").read_text())
    config["model"]["init_args"]["net"] = {"class_path": "zoo.rl.ActorCritic"}  # hidden (64, 64) by default; its 16s
    (tmp_path / "ppo.yaml").write_text(yaml.safe_dump(config))
    model = built_from("--config", str(tmp_path / "ppo.yaml"), f"--model.init_args.init_weights={ppo_fit.last}")
    trained = torch.load(ppo_fit.last, weights_only=True)["state_dict"]
    assert model.state_dict().keys() == trained.keys()  # the net and the observation statistics
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, trained[name], rtol=0, atol=0, msg=name)
    from zoo.rl import PPOModule

    obs, own = torch.rand(5, 4), PPOModule.load_from_checkpoint(ppo_fit.last).net.eval()
    with torch.no_grad():
        torch.testing.assert_close(model.net.eval().get_value(obs), own.get_value(obs), rtol=0, atol=0)


def test_multi_turn_grpo_on_a_text_env_builds_the_registered_models_net(sft, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sft)
    config = str(CONFIGS / "gpt" / "grpo_guess_number.yaml")  # the env is looked up at setup, not here
    model = built_from("--config", config, "--model.init_args.init_weights=models:/sft/1")
    assert_same_net(model.net, load_model("models:/sft/1", sft))
