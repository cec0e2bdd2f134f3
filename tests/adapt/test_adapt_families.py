"""``adapt`` (zoo.adapt) wired into every family besides GPT's (tests/adapt/test_adapt.py): a tiny module of each fits
a few steps with LoRA (or with ``trainable`` freezing), its frozen weights stay as they were and its adapters move,
its checkpoint reloads with equal outputs, and merging keeps them; the refusals name what they refuse; one cli.py fit
registers a merged MLflow model that predicts through ``zoo.tracking.load``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import numpy as np
import pytest
import torch
from conftest import CONFIGS, cli
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from zoo.adapt import Adaptation, LoRA, merge
from zoo.diffusion import DiT
from zoo.errors import InputError

pytest.importorskip("peft")
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny nets: a second thread only waits

LORA = Adaptation(lora=LoRA(r=4, alpha=8.0))


def trainer(tmp_path, **kwargs) -> Trainer:
    return Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing="callbacks" in kwargs,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        **kwargs,
    )


def plain(name: str) -> str:
    return name.replace(".base_layer.", ".")


def check_adapted(module, start: dict, trains: Callable[[str], bool], wrapped: bool = True, follows=()) -> None:
    """Every parameter but the adapters, those ``trains`` names (by its name before LoRA) and those under ``follows``
    (target nets, moved by averaging) is frozen and as it was in ``start``, and those moved; the adapters' B, zero
    at the start, moved too."""
    training = {n for n, p in module.named_parameters() if p.requires_grad}
    assert training == {n for n, _ in module.named_parameters() if "lora_" in n or trains(plain(n))}
    assert any("lora_" in n for n in training) == wrapped
    for name, p in module.named_parameters():
        if "lora_B" in name:
            assert p.abs().sum() > 0, f"{name} did not train"
        elif "lora_" not in name:
            moves = trains(plain(name)) or plain(name).startswith(follows)
            same = torch.equal(p, start[plain(name)])
            assert same != moves, f"{name} {'did not move' if same else 'moved, frozen'}"


def check_reload_and_merge(module, trainer_, tmp_path, rebuild, outputs) -> None:
    """The fitted module's checkpoint rebuilds it (``rebuild(path)``) with equal ``outputs(module)``, and merging its
    adapters gives the plain names and the same outputs."""
    trainer_.save_checkpoint(tmp_path / "adapted.ckpt")
    again = rebuild(tmp_path / "adapted.ckpt")
    module.eval(), again.eval()
    with torch.no_grad():
        for a, b in zip(outputs(again), outputs(module)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        merged = merge(copy.deepcopy(module))
        assert not any("lora_" in k or ".base_layer." in k for k in merged.state_dict())
        for a, b in zip(outputs(merged), outputs(module)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# -- CNN ---------------------------------------------------------------------------------------------------------


def convnet():
    from zoo.cnn import ConvNet

    torch.manual_seed(0)
    return ConvNet(num_classes=5, in_channels=3, width=8, depth=2)


def images(n: int = 24):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 5, (n,), generator=g)


@pytest.mark.parametrize("freeze_backbone", [False, True])
def test_a_classifier_fits_its_adapters_and_with_freeze_backbone_its_head(tmp_path, freeze_backbone):
    """LoRA wraps the hidden convolutions, never the stem or the head (``io_layers``); ``freeze_backbone`` adds the
    head to what trains and keeps the frozen layers' batch-norm statistics."""
    from zoo.cnn import ClassifierModule

    module = ClassifierModule(convnet(), freeze_backbone=freeze_backbone, adapt=LORA)
    start = copy.deepcopy(module.state_dict())
    x, y = images()
    t = trainer(tmp_path, max_steps=3)
    t.fit(module, DataLoader(TensorDataset(x, y), batch_size=8))
    wrapped = {n.split(".lora_A")[0] for n, _ in module.named_parameters() if ".lora_A." in n}
    assert wrapped == {"net.features.0.3", "net.features.1.0", "net.features.1.3"}  # not features.0.0, not head
    check_adapted(module, start, lambda n: freeze_backbone and n.startswith("net.head."))
    statistics = [k for k in start if "running_" in k]
    assert all(torch.equal(module.state_dict()[k], start[k]) for k in statistics) == freeze_backbone
    check_reload_and_merge(
        module, t, tmp_path, lambda p: ClassifierModule.load_from_checkpoint(p, net=convnet()), lambda m: [m(x)]
    )


def test_a_classifier_lora_checkpoint_leaves_its_base_to_init_weights(tmp_path):
    """The frozen net stays out of the checkpoint (the batch-norm statistics, buffers, stay in); a load takes it from
    the init_weights given, as GPT's does (tests/adapt/test_adapt.py)."""
    from safetensors.torch import save_file

    from zoo.cnn import ClassifierModule

    save_file(convnet().state_dict(), str(tmp_path / "base.safetensors"))
    base = str(tmp_path / "base.safetensors")
    module = ClassifierModule(convnet(), init_weights=base, adapt=LORA)
    x, y = images()
    t = trainer(tmp_path, max_steps=2)
    t.fit(module, DataLoader(TensorDataset(x, y), batch_size=8))
    t.save_checkpoint(tmp_path / "adapted.ckpt")
    stored = torch.load(tmp_path / "adapted.ckpt", weights_only=True)["state_dict"]
    frozen = [k for k in stored if "lora_" not in k and k.endswith(("weight", "bias"))]
    assert not [k for k in frozen if not k.startswith("net.head.") and "features" in k and ".1." not in k[-12:]]
    again = ClassifierModule.load_from_checkpoint(tmp_path / "adapted.ckpt", net=convnet(), init_weights=base)
    module.eval(), again.eval()
    with torch.no_grad():
        torch.testing.assert_close(again(x), module(x), rtol=0, atol=0)


def test_a_classifier_probed_by_trainable_alone_trains_what_it_names(tmp_path):
    from zoo.cnn import ClassifierModule

    module = ClassifierModule(convnet(), adapt=Adaptation(trainable=("net.head.*", "net.features.1.4.*")))
    start = copy.deepcopy(module.state_dict())
    x, y = images()
    trainer(tmp_path, max_steps=2).fit(module, DataLoader(TensorDataset(x, y), batch_size=8))
    check_adapted(module, start, lambda n: n.startswith(("net.head.", "net.features.1.4.")), wrapped=False)


# -- CLIP ------------------------------------------------------------------------------------------------------------


def tiny_clip():
    from zoo.clip import CLIP, TextTransformer, VisionTransformer

    torch.manual_seed(0)
    return CLIP(
        VisionTransformer(image_size=8, patch_size=4, width=16, layers=1, heads=2, embed_dim=16),
        TextTransformer(vocab_size=257, context_length=8, width=16, layers=1, heads=2, embed_dim=16),
    )


def pairs(n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (n, 8), generator=g)
    ids[:, -1] = 256  # end of text
    return torch.randn(n, 3, 8, 8, generator=g), ids


def clip_batches(n: int = 16):
    img, ids = pairs(n)
    return DataLoader([{"image": a, "text": b} for a, b in zip(img, ids)], batch_size=8)


@pytest.mark.parametrize(
    "adaptation, trains",
    [
        (LORA, lambda n: False),
        # LiT (Zhai et al. 2022) by name: the image tower locked, the text tower and the temperature trained.
        (Adaptation(trainable=("net.text_encoder.*", "net.logit_scale")), lambda n: not n.startswith("net.image_")),
    ],
    ids=["lora", "lit"],
)
def test_clip_fits_lora_on_its_towers_or_a_locked_image_tower(tmp_path, adaptation, trains):
    from zoo.clip import ContrastiveModule

    module = ContrastiveModule(tiny_clip(), adapt=adaptation)
    start = copy.deepcopy(module.state_dict())
    t = trainer(tmp_path, max_steps=2)
    t.fit(module, clip_batches())
    check_adapted(module, start, trains, wrapped=adaptation.lora is not None)
    if adaptation.lora is not None:  # the blocks' layers, not the patch and token embeddings nor the projections
        wrapped = {n.split(".lora_A")[0].removeprefix("net.") for n, _ in module.named_parameters() if ".lora_A." in n}
        assert wrapped == {f"{t}.blocks.0.{p}" for t in ("image_encoder", "text_encoder") for p in BLOCK}
    img, ids = pairs(4)
    check_reload_and_merge(
        module,
        t,
        tmp_path,
        lambda p: ContrastiveModule.load_from_checkpoint(p, net=tiny_clip()),
        lambda m: [m.net.encode_image(img), m.net.encode_text(ids)],
    )


BLOCK = ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")


def test_clip_puts_no_adapter_in_a_locked_tower_and_refuses_one_named_there():
    from zoo.clip import ContrastiveModule

    module = ContrastiveModule(tiny_clip(), lock_image=True, adapt=LORA)  # LiT, the text tower adapted
    module.setup("fit")
    training = [n for n, p in module.named_parameters() if p.requires_grad]
    assert training and all(n.startswith("net.text_encoder.blocks.0.") and "lora_" in n for n in training)
    assert not any("lora_" in n for n, _ in module.net.image_encoder.named_parameters())
    adaptation = Adaptation(lora=LoRA(r=2, targets=("net.image_encoder.blocks.0.mlp.fc",)))
    module = ContrastiveModule(tiny_clip(), lock_image=True, adapt=adaptation)
    with pytest.raises(InputError, match=r"adapt\.lora\.targets name layers of a locked tower"):
        module.setup("fit")


# -- diffusion ------------------------------------------------------------------------------------------------------


def tiny_dit():
    torch.manual_seed(0)
    net = DiT(in_channels=3, image_size=8, patch_size=4, hidden_size=16, depth=1, num_heads=2, num_classes=2)
    with torch.no_grad():  # "pretrained": a fresh DiT's zero output layer and adaLN would pass adapters no gradient
        for p in net.parameters():
            p.normal_(0, 0.1)
    return net


def test_diffusion_fits_lora_averages_the_adapters_and_samples_with_them(tmp_path):
    """The EMA starts from the adapted net and averages what trains (the adapters), not the frozen base; the
    checkpoint holds the average beside the training weights, and sampling uses the adapters."""
    from zoo.diffusion import DDIMSampler, DiffusionModule

    ddim = partial(DDIMSampler, steps=3)
    module = DiffusionModule(tiny_dit(), ema_decay=0.5, sampler=ddim, adapt=LORA)
    base = copy.deepcopy(module)
    start = copy.deepcopy(module.state_dict())
    x = torch.randn(16, 3, 8, 8, generator=torch.Generator().manual_seed(0)).clamp(-1, 1)
    saved = ModelCheckpoint(tmp_path, "{step}", every_n_train_steps=3, save_top_k=-1)  # while training
    t = trainer(tmp_path, max_steps=3, callbacks=[saved])
    t.fit(module, DataLoader(TensorDataset(x, torch.arange(16) % 2), batch_size=8))
    check_adapted(module, start, lambda n: False)
    ckpt = torch.load(tmp_path / "step=3.ckpt", weights_only=True)
    average, current = ckpt["state_dict"], ckpt["current_model_state"]
    for k, v in average.items():  # the base as it was in both; the adapters averaged (d = 0.5: not the weights)
        assert torch.equal(v, current[k]) == ("lora_" not in k), k
    assert not torch.equal(module.sample(2, ddim), base.sample(2, ddim))  # the adapters sample
    check_reload_and_merge(
        module,
        t,
        tmp_path,
        lambda p: DiffusionModule.load_from_checkpoint(p, net=tiny_dit()),
        lambda m: [m.sample(2, ddim)],
    )


def test_latent_diffusion_adapts_the_net_and_never_the_autoencoder():
    diffusers = pytest.importorskip("diffusers")
    from zoo.diffusion import DiffusionModule

    torch.manual_seed(0)
    vae = diffusers.AutoencoderKL(
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        block_out_channels=[8, 8],
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
    )
    net = DiT(in_channels=4, image_size=4, patch_size=2, hidden_size=16, depth=1, num_heads=2, num_classes=0)
    module = DiffusionModule(net, autoencoder=vae, clip_denoised=None, adapt=LORA)
    module.configure_model()
    assert any("lora_" in n for n, _ in module.net.named_parameters())
    assert not any("lora_" in n or p.requires_grad for n, p in module.autoencoder.named_parameters())
    named = Adaptation(lora=LoRA(targets=("net.blocks.*", "autoencoder.decoder.conv_out")))
    net = DiT(in_channels=4, image_size=4, patch_size=2, hidden_size=16, depth=1, num_heads=2, num_classes=0)
    module = DiffusionModule(net, autoencoder=vae, clip_denoised=None, adapt=named)
    with pytest.raises(InputError, match="adapt names the frozen autoencoder's decoder.conv_out"):
        module.configure_model()


# -- RL --------------------------------------------------------------------------------------------------------------


def actor_critic():
    from zoo.rl import ActorCritic

    torch.manual_seed(0)
    return ActorCritic(obs_dim=4, action_dim=2, continuous=False, hidden_sizes=(16, 16))


@pytest.mark.parametrize("agent", ["PPOModule", "A2CModule"])
def test_an_on_policy_agent_fits_lora_on_its_hidden_layers(tmp_path, agent):
    import zoo.rl
    from datamodules import GymDataModule

    cls = getattr(zoo.rl, agent)
    steps = {"PPOModule": {"num_steps": 16, "update_epochs": 1, "num_minibatches": 2}}.get(agent, {})
    module = cls(actor_critic(), total_env_steps=128, adapt=LORA, **steps)
    start = copy.deepcopy(module.state_dict())
    t = trainer(tmp_path, max_epochs=-1)
    t.fit(module, GymDataModule("CartPole-v1", num_envs=4, max_episode_steps=50))
    wrapped = {n.split(".lora_A")[0] for n, _ in module.named_parameters() if ".lora_A." in n}
    assert wrapped == {"net.actor.2", "net.critic.2"}  # not the observation's readers (.0) nor the heads (.4)
    check_adapted(module, start, lambda n: False)
    optimized = [p for group in t.optimizers[0].param_groups for p in group["params"]]
    assert {id(p) for p in optimized} == {id(p) for n, p in module.named_parameters() if "lora_" in n}
    obs = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    check_reload_and_merge(
        module,
        t,
        tmp_path,
        lambda p: cls.load_from_checkpoint(p, net=actor_critic()),
        lambda m: [m.net.actor(obs), m.net.get_value(obs)],
    )


def test_sac_freezes_by_name_its_temperature_and_targets_follow_and_lora_is_refused(tmp_path):
    """The temperature, beside the net, still learns; the target critics follow the critics by Polyak averaging, so
    a frozen critic's target stays as it was; an optimizer left with nothing to step, and LoRA, are refused by name."""
    from datamodules import GymDataModule
    from zoo.rl import SACModule, SoftActorCritic

    def sac(adaptation: Adaptation) -> SACModule:
        torch.manual_seed(0)
        net = SoftActorCritic(obs_dim=3, action_dim=1, action_low=-2.0, action_high=2.0, hidden_sizes=(8, 8))
        args = dict(total_env_steps=80, steps_per_batch=20, learning_starts=20, batch_size=8, buffer_size=100)
        return SACModule(net, adapt=adaptation, **args)

    module = sac(Adaptation(trainable=("net.actor.head.*", "net.critic.qs.0.*")))
    start = copy.deepcopy(module.state_dict())
    trainer(tmp_path, max_epochs=-1).fit(module, GymDataModule("Pendulum-v1", num_envs=1, max_episode_steps=40))
    trains = ("net.actor.head.", "net.critic.qs.0.", "log_alpha")
    check_adapted(module, start, lambda n: n.startswith(trains), wrapped=False, follows=("critic_target.qs.0.",))
    with pytest.raises(InputError, match=r"adapt leaves no parameter of net\.critic training"):
        module = sac(Adaptation(trainable=("net.actor.*",)))
        module.setup("fit")
        module.configure_optimizers()
    with pytest.raises(InputError, match=r"adapt\.lora is not wired for SACModule: its critic_target follow"):
        sac(LORA).setup("fit")


@pytest.mark.parametrize("agent", ["TD3Module", "IMPALAModule"])
def test_td3_refuses_lora_and_impala_adapts_its_net_at_set_up(agent):
    import zoo.rl

    cls = getattr(zoo.rl, agent)
    if agent == "TD3Module":
        net = zoo.rl.DeterministicActorCritic(obs_dim=3, action_dim=1, action_low=-1.0, action_high=1.0)
        with pytest.raises(InputError, match="its actor_target and critic_target follow the nets by Polyak"):
            cls(net, adapt=LORA).setup("fit")
        return
    module = cls(actor_critic(), adapt=LORA)
    module.setup("fit")  # the actors copy the adapted net at train start: the published state dicts line up
    (optimizer,) = module.configure_optimizers()["optimizer"].param_groups
    assert [id(p) for p in optimizer["params"]] == [id(p) for n, p in module.named_parameters() if "lora_" in n]


# -- one family end to end: cli.py fit, the registered model merged, served -------------------------------------------


@pytest.mark.slow  # a cli.py fit into MLflow (~15 s): the default suite keeps under 10 minutes
def test_a_lora_fit_through_the_cli_registers_a_merged_model_that_predicts_as_its_checkpoint():
    from zoo.tracking import load, load_model
    from zoo.tracking.serving import ZooPyfunc

    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "cnn" / "convnet_digits.yaml"),
        "--model.init_args.adapt.lora.r=4",
        "--trainer.max_steps=2",
        "--trainer.limit_val_batches=1",
        "--trainer.logger.init_args.registered_model_name=digits-lora",
    )
    trained = c.model.eval()
    assert any("lora_" in n for n, _ in trained.named_parameters())
    uri, tracking = "models:/digits-lora/1", c.trainer.logger.tracking_uri
    served = load_model(uri, tracking)
    assert served.hparams.adapt is None and not any("lora_" in k for k in served.state_dict())
    x = torch.rand(3, 1, 8, 8)
    torch.testing.assert_close(served(x), trained(x), rtol=1e-5, atol=1e-5)
    images = {"image": list((torch.rand(3, 8, 8) * 255).byte().numpy())}  # new files' pixels, as served
    answers = load(uri, tracking).predict(images)
    expected = ZooPyfunc(trained).predict(None, images)  # the unmerged module through the same interface
    assert list(answers["class"]) == list(expected["class"])
    np.testing.assert_allclose(answers["confidence"], expected["confidence"], rtol=1e-5)
