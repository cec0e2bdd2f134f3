"""Pretrained diffusers models arrive whole and exact, or are refused in one line naming why.

Tiny random-weight ``DiTTransformer2DModel``s and ``UNet2DModel``s are written with diffusers' own ``save_pretrained``
and read by the zoo (``zoo.diffusion.from_pretrained``, ``init_weights``): the zoo's outputs equal diffusers' within
1e-5; changing any one source tensor moves the zoo's output exactly as it moves diffusers' (nothing dropped or
shared); a tensor left over or missing, a config value the zoo does not implement, or a net built otherwise than the
config says is an ``InputError`` naming it.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch

from zoo.diffusion import DDIMSampler, DiffusionModule, DiT, UNet, from_pretrained
from zoo.diffusion.convert import Pretrained, load_pretrained, load_state, net_state
from zoo.diffusion.diffusers_config import read_config
from zoo.diffusion.pretrained import net_config
from zoo.errors import InputError, one_line

diffusers = pytest.importorskip("diffusers")

NUM_CLASSES = 5
pytestmark = pytest.mark.usefixtures("one_thread")  # hundreds of forwards of tiny nets: threads would only wait


def randomized(ref: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight moved (diffusers zero-inits the adaLN and output layers: a missing branch would not show)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return ref.eval()


def diffusers_dit(**overrides) -> torch.nn.Module:
    """A DiT trained in diffusers: every block's step and label embedders its own (randomized apart)."""
    torch.manual_seed(0)
    config = dict(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=3, sample_size=8,
        patch_size=2, num_embeds_ada_norm=NUM_CLASSES,
    )  # fmt: skip
    return randomized(diffusers.DiTTransformer2DModel(**(config | overrides)), 1)


UNET_CONFIGS = {  # several UNet2DModels: heads > 1, heads = 1, classes, learned variance, sin-first, freq_shift 1
    "heads4-classes": dict(attention_head_dim=8, num_class_embeds=NUM_CLASSES + 1),
    "heads8-sigma-sinfirst": dict(attention_head_dim=4, out_channels=6, flip_sin_to_cos=False, layers_per_block=1),
    "heads2-classes-sinfirst": dict(
        attention_head_dim=16, num_class_embeds=NUM_CLASSES + 1, flip_sin_to_cos=False, layers_per_block=1
    ),
    "one-head-shift1": dict(attention_head_dim=None, freq_shift=1, norm_num_groups=4),
    "three-levels": dict(
        block_out_channels=(8, 16, 16),
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=8,
        norm_num_groups=4,
    ),
    # google/ddpm-cifar10-32's switches (DDPM's release: bottom-right padded downsampling, eps 1e-6, sin-first, shift 1)
    "ddpm-release": dict(
        block_out_channels=(8, 16, 16),
        down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
        downsample_padding=0,
        norm_eps=1e-6,
        flip_sin_to_cos=False,
        freq_shift=1,
        attention_head_dim=None,
        norm_num_groups=4,
    ),  # fmt: skip
    "pad0-eps1e-2-classes": dict(downsample_padding=0, norm_eps=1e-2, num_class_embeds=NUM_CLASSES + 1),
    # the step as a scale and shift after the norm; the middle attention then has no GroupNorm (attn groups unset)
    "scale-shift": dict(resnet_time_scale_shift="scale_shift", num_class_embeds=NUM_CLASSES + 1, norm_eps=1e-3),
    # ADM as consistency models' UNet2DModel: residual-block resampling, scale-shift, the middle attention's groups
    "adm-resnet-updown": dict(
        down_block_types=("ResnetDownsampleBlock2D", "AttnDownBlock2D"),
        up_block_types=("AttnUpBlock2D", "ResnetUpsampleBlock2D"),
        downsample_type="resnet",
        upsample_type="resnet",
        resnet_time_scale_shift="scale_shift",
        attn_norm_num_groups=8,
        num_class_embeds=NUM_CLASSES + 1,
        layers_per_block=1,
        flip_sin_to_cos=False,
    ),  # fmt: skip
    "resnet-updown-three-levels": dict(
        block_out_channels=(8, 16, 16),
        down_block_types=("ResnetDownsampleBlock2D", "AttnDownBlock2D", "ResnetDownsampleBlock2D"),
        up_block_types=("ResnetUpsampleBlock2D", "AttnUpBlock2D", "ResnetUpsampleBlock2D"),
        downsample_type="resnet",
        upsample_type="resnet",
        norm_num_groups=4,
        out_channels=6,
        norm_eps=1e-2,
    ),  # fmt: skip
}


def diffusers_unet(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = dict(
        sample_size=8, in_channels=3, out_channels=3, block_out_channels=(16, 32), layers_per_block=2,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8,
    )  # fmt: skip
    return randomized(diffusers.UNet2DModel(**(config | UNET_CONFIGS[name])), 2)


def diffusers_transformer_2d(**overrides) -> torch.nn.Module:
    """A DiT as current diffusers saves a ``Transformer2DModel`` (every field written, ``use_additional_conditions``
    null), each block's embedders its own."""
    torch.manual_seed(0)
    config = dict(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=3, sample_size=8,
        patch_size=2, num_embeds_ada_norm=NUM_CLASSES, norm_type="ada_norm_zero", norm_elementwise_affine=False,
        activation_fn="gelu-approximate", attention_bias=True,
    )  # fmt: skip
    return randomized(diffusers.Transformer2DModel(**(config | overrides)), 1)


def inputs(ref: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(3)
    c, s = ref.config.in_channels, ref.config.sample_size
    x, t = torch.randn(3, c, s, s, generator=g), torch.tensor([0, 377, 999])
    classes = getattr(ref.config, "num_embeds_ada_norm", None) or getattr(ref.config, "num_class_embeds", None)
    y = torch.tensor([0, 2, NUM_CLASSES]) if classes else None  # the null class too
    return x, t, y


def reference(ref: torch.nn.Module, x, t, y) -> torch.Tensor:
    with torch.no_grad():
        if isinstance(ref, (diffusers.DiTTransformer2DModel, diffusers.Transformer2DModel)):
            return ref(x, timestep=t, class_labels=y).sample
        return ref(x, t, class_labels=y).sample


def zoo_output(net: torch.nn.Module, x, t, y) -> torch.Tensor:
    with torch.no_grad():
        return net.eval()(x, t, y)


# -- parity ------------------------------------------------------------------------------------------------


def test_a_dit_trained_in_diffusers_loads_with_each_block_s_own_embedders(tmp_path):
    ref = diffusers_dit()
    ref.save_pretrained(tmp_path / "dit")
    module = from_pretrained(tmp_path / "dit")
    net = module.net
    assert isinstance(net, DiT) and net.blocks[1].t_embedder is not None  # chosen: the source's blocks differ
    x, t, y = inputs(ref)
    want, got = reference(ref, x, t, y), zoo_output(net, x, t, y)
    assert want.abs().mean() > 0.1
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # Block 0's embedders everywhere (what a sharing DiT would hold) computes something else: the silent load of old.
    shared = DiT(**module.hparams["net"]["init_args"] | {"block_embedders": False})
    with pytest.raises(InputError, match=r"transformer_blocks\.1\.norm1\.emb\..* differs .*block_embedders=true"):
        load_pretrained(shared, tmp_path / "dit")


def test_a_dit_whose_blocks_share_one_embedder_loads_into_a_sharing_dit(tmp_path):
    """diffusers' conversion of a published DiT copies one embedder into every block: equal copies, one pair."""
    ref = diffusers_dit()
    with torch.no_grad():
        for block in ref.transformer_blocks[1:]:
            block.norm1.emb.load_state_dict(ref.transformer_blocks[0].norm1.emb.state_dict())
    ref.save_pretrained(tmp_path / "pipeline" / "transformer")  # a pipeline folder's transformer/
    net = from_pretrained(tmp_path / "pipeline").net
    assert net.blocks[1].t_embedder is None
    x, t, y = inputs(ref)
    torch.testing.assert_close(zoo_output(net, x, t, y), reference(ref, x, t, y), atol=1e-5, rtol=1e-5)


def test_an_old_pipeline_s_transformer2dmodel_config_is_read_as_the_dit_it_describes(tmp_path):
    """diffusers' DiT pipelines before 0.28 saved the transformer as a Transformer2DModel, with its other fields."""
    ref = diffusers_dit()
    ref.save_pretrained(tmp_path / "dit")
    config = json.loads((tmp_path / "dit" / "config.json").read_text())
    old = {"_class_name": "Transformer2DModel", "cross_attention_dim": None, "use_linear_projection": False}
    (tmp_path / "dit" / "config.json").write_text(json.dumps(config | old))
    x, t, y = inputs(ref)
    got = zoo_output(from_pretrained(tmp_path / "dit").net, x, t, y)
    torch.testing.assert_close(got, reference(ref, x, t, y), atol=1e-5, rtol=1e-5)
    (tmp_path / "dit" / "config.json").write_text(json.dumps(config | old | {"cross_attention_dim": 16}))
    with pytest.raises(InputError, match="cross_attention_dim=16"):
        from_pretrained(tmp_path / "dit")


def test_a_dit_saved_as_transformer2dmodel_by_current_diffusers_loads_over_that_class_s_defaults(tmp_path):
    """diffusers 0.42 writes every Transformer2DModel field (``use_additional_conditions: null``, ``caption_channels``,
    ``interpolation_scale``, ...); a field left out is Transformer2DModel's default, not DiTTransformer2DModel's."""
    ref = diffusers_transformer_2d()
    ref.save_pretrained(tmp_path / "dit")
    config = json.loads((tmp_path / "dit" / "config.json").read_text())
    assert config["_class_name"] == "Transformer2DModel" and config["use_additional_conditions"] is None
    x, t, y = inputs(ref)
    want = reference(ref, x, t, y)
    assert want.abs().mean() > 0.1
    torch.testing.assert_close(zoo_output(from_pretrained(tmp_path / "dit").net, x, t, y), want, atol=1e-5, rtol=1e-5)
    config.pop("activation_fn")  # Transformer2DModel's default: geglu, another MLP
    (tmp_path / "dit" / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match="activation_fn='geglu'"):
        from_pretrained(tmp_path / "dit")


def test_a_field_left_out_is_read_at_the_default_of_diffusers_own_class():
    """The tables the zoo fills a config.json in from are the classes' own signatures (a wrong default is a silent
    difference for every folder that leaves the field out)."""
    import inspect

    from zoo.diffusion.diffusers_config import CLASSES

    for name, (_, fields) in CLASSES.items():
        params = inspect.signature(getattr(diffusers, name).__init__).parameters
        theirs = {k: list(v.default) if isinstance(v.default, tuple) else v.default for k, v in params.items()}
        assert fields == {k: v for k, v in theirs.items() if k != "self"}, name


@pytest.mark.parametrize("name", UNET_CONFIGS)
def test_a_unet2d_loads_with_the_settings_of_its_config(tmp_path, name):
    ref = diffusers_unet(name)
    ref.save_pretrained(tmp_path / "unet")
    module = from_pretrained(tmp_path / "unet")
    x, t, y = inputs(ref)
    want = reference(ref, x, t, y)
    assert want.abs().mean() > 0.1
    torch.testing.assert_close(zoo_output(module.net, x, t, y), want, atol=1e-5, rtol=1e-5)
    heads = {m.attn.num_heads for m in module.net.blocks if hasattr(m, "attn")}
    last = ref.config.block_out_channels[-1]
    assert heads == {last // (ref.config.attention_head_dim or last)}


def test_init_weights_takes_a_unet2d_folder_and_refuses_a_net_built_otherwise(tmp_path):
    ref = diffusers_unet("heads4-classes")
    ref.save_pretrained(tmp_path / "unet")
    settings = from_pretrained(tmp_path / "unet").hparams["net"]["init_args"]
    m = DiffusionModule(UNet(**settings), init_weights=str(tmp_path / "unet"))
    m.configure_model()  # no trainer: loads the weights, as fit's first hook does
    x, t, y = inputs(ref)
    torch.testing.assert_close(zoo_output(m.net, x, t, y), reference(ref, x, t, y), atol=1e-5, rtol=1e-5)
    wrong = {  # shapes alike, function not
        "num_heads": (1, r"attn\.num_heads 4 \(net: 1\)"),
        "norm_groups": (16, r"num_groups 8 \(net: 16\)"),
        "time_freq_shift": (1.0, r"freq_shift 0\.0 \(net: 1\.0\)"),
        "norm_eps": (1e-6, r"eps 1e-05 \(net: 1e-06\)"),
        "downsample_padding": (0, r"padding 1 \(net: 0\)"),
    }
    for key, (value, why) in wrong.items():
        with pytest.raises(InputError, match=why) as err:
            load_pretrained(UNet(**settings | {key: value}), tmp_path / "unet")
        assert "\n" not in str(err.value)


def test_from_pretrained_gives_a_module_that_samples_and_rebuilds_from_its_checkpoint(tmp_path):
    diffusers_dit().save_pretrained(tmp_path / "dit")
    module = from_pretrained(tmp_path / "dit", clip_denoised=None, ema_decay=None)
    assert module.hparams["net"]["class_path"] == "zoo.diffusion.DiT" and module.hparams["clip_denoised"] is None
    images = module.sample(2, partial(DDIMSampler, steps=3))
    assert images.shape == (2, 4, 8, 8) and torch.isfinite(images).all()
    # Its checkpoint rebuilds it, net included, by the config it recorded (nothing pickled).
    from lightning.pytorch import Trainer

    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp_path / "dit.ckpt")
    again = DiffusionModule.load_from_checkpoint(tmp_path / "dit.ckpt").eval()
    torch.testing.assert_close(again.sample(2, partial(DDIMSampler, steps=3)), images, atol=0, rtol=0)


# -- nothing dropped: each source tensor reaches the output ----------------------------------------------------


def _perturbation_check(ref: torch.nn.Module, net: torch.nn.Module, config: Path, only: str = "") -> None:
    """Change each source tensor in turn (a small random change; ``only``: those whose names contain it): the zoo's
    output equals diffusers' again, and moves wherever diffusers' does. Only attention's key biases move nothing, in
    both: softmax ignores a shift common to a query's logits."""
    x, t, y = inputs(ref)
    base, state, g = reference(ref, x, t, y), ref.state_dict(), torch.Generator().manual_seed(4)
    inert = []
    for name, value in [(k, v) for k, v in state.items() if only in k]:
        changed = value + 0.05 * torch.randn(value.shape, generator=g)
        with torch.no_grad():
            ref.load_state_dict({**state, name: changed})
            pre = Pretrained({**state, name: changed}, "perturbed", read_config(config))
            load_state(net, net_state(net, pre), "perturbed")
        want, got = reference(ref, x, t, y), zoo_output(net, x, t, y)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=name)
        if (want - base).abs().max() < 1e-4:
            inert.append(name)
        else:
            assert (got - base).abs().max() > 1e-4, name
    ref.load_state_dict(state)
    assert all(n.endswith(("to_k.bias",)) for n in inert), inert


def test_every_tensor_of_a_diffusers_dit_reaches_the_output(tmp_path):
    ref = diffusers_dit()
    ref.save_pretrained(tmp_path / "dit")
    _perturbation_check(ref, from_pretrained(tmp_path / "dit").net, tmp_path / "dit" / "config.json")


def test_every_tensor_of_a_unet2d_reaches_the_output(tmp_path):
    ref = diffusers_unet("heads2-classes-sinfirst")  # one residual block per level: the same kinds, fewer tensors
    ref.save_pretrained(tmp_path / "unet")
    _perturbation_check(ref, from_pretrained(tmp_path / "unet").net, tmp_path / "unet" / "config.json")


def test_every_tensor_of_resnet_resampling_and_scale_shift_reaches_the_output(tmp_path):
    """The residual blocks that down- and upsample, their scale-shift step projections, the norm-free middle block."""
    ref = diffusers_unet("adm-resnet-updown")
    ref.save_pretrained(tmp_path / "unet")
    net = from_pretrained(tmp_path / "unet").net
    for part in ("samplers.0.", "mid_block."):
        _perturbation_check(ref, net, tmp_path / "unet" / "config.json", only=part)


# -- refused in one line ---------------------------------------------------------------------------------------


def _edit_weights(folder: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    path = folder / "diffusion_pytorch_model.safetensors"
    state = load_file(path)
    edit(state)
    save_file(state, path)


@pytest.mark.parametrize("kind", ["dit", "unet"])
@pytest.mark.parametrize("change", ["extra", "missing"])
def test_a_folder_with_a_tensor_left_over_or_missing_is_refused_naming_it(tmp_path, kind, change):
    ref = diffusers_dit() if kind == "dit" else diffusers_unet("heads4-classes")
    ref.save_pretrained(tmp_path / kind)
    name = "transformer_blocks.1.norm3.weight" if kind == "dit" else "mid_block.attentions.0.extra.weight"
    gone = "transformer_blocks.2.ff.net.2.bias" if kind == "dit" else "up_blocks.0.resnets.1.conv1.bias"
    if change == "extra":
        _edit_weights(tmp_path / kind, lambda s: s.update({name: torch.ones(3)}))
    else:
        _edit_weights(tmp_path / kind, lambda s: s.pop(gone))
    with pytest.raises(InputError) as err:
        from_pretrained(tmp_path / kind)
    line = one_line(err.value)
    assert "\n" not in line
    assert (name if change == "extra" else gone.replace("up_blocks.0.resnets", "up.0.res")) in line or gone in line


UNSUPPORTED = [
    ("unet", "resnet_time_scale_shift", "ada_group"),
    ("unet", "class_embed_type", "timestep"),
    ("unet", "norm_eps", 0),
    ("unet", "downsample_padding", 2),
    ("unet", "downsample_type", "fir"),
    ("unet", "time_embedding_type", "fourier"),
    ("unet", "down_block_types", ["SkipDownBlock2D", "AttnDownBlock2D"]),
    ("unet", "up_block_types", ["UpBlock2D", "AttnUpBlock2D"]),
    ("unet", "down_block_types", ["ResnetDownsampleBlock2D", "AttnDownBlock2D"]),  # conv resampling up, resnet down
    ("unet", "mid_block_type", None),
    ("unet", "mid_block_scale_factor", 2),
    ("unet", "act_fn", "mish"),
    ("unet", "attention_head_dim", 5),
    ("unet", "center_input_sample", True),
    ("unet", "add_attention", False),
    ("unet", "a_field_from_the_future", 1),
    ("dit", "norm_type", "ada_norm_single"),
    ("dit", "activation_fn", "geglu"),
    ("dit", "norm_elementwise_affine", True),
    ("dit", "out_channels", 5),
    ("dit", "_class_name", "UNet2DConditionModel"),
    ("dit", "auto_map", {"AutoModel": "evil.Model"}),
    ("t2d", "caption_channels", 16),
    ("t2d", "attention_type", "gated"),
    ("t2d", "double_self_attention", True),
    ("t2d", "norm_type", "ada_norm_single"),
    ("t2d", "interpolation_scale", 2),
    ("t2d", "attention_bias", False),
    ("t2d", "patch_size", None),
]


@pytest.mark.parametrize("kind,field,value", UNSUPPORTED, ids=[f"{k}-{f}" for k, f, _ in UNSUPPORTED])
def test_a_config_value_the_zoo_does_not_implement_is_refused_by_name(tmp_path, kind, field, value):
    makers = {"dit": diffusers_dit, "t2d": diffusers_transformer_2d, "unet": partial(diffusers_unet, "heads4-classes")}
    ref = makers[kind]()
    ref.save_pretrained(tmp_path / kind)
    config = json.loads((tmp_path / kind / "config.json").read_text())
    (tmp_path / kind / "config.json").write_text(json.dumps(config | {field: value}))
    with pytest.raises(InputError, match=field) as err:
        from_pretrained(tmp_path / kind)
    assert "\n" not in str(err.value)


def test_diffusers_weights_without_their_config_are_refused(tmp_path):
    diffusers_unet("heads4-classes").save_pretrained(tmp_path / "unet")
    (tmp_path / "unet" / "config.json").unlink()
    with pytest.raises(InputError, match="without the config.json"):
        load_pretrained(UNet(), tmp_path / "unet" / "diffusion_pytorch_model.safetensors")


def test_a_published_dit_s_position_table_is_checked_not_dropped(tmp_path):
    net = DiT("S", 2, image_size=8, in_channels=4, num_classes=NUM_CLASSES, depth=1, hidden_size=16, num_heads=2)
    torch.save({**net.state_dict(), "pos_embed": net.pos_embed}, tmp_path / "ok.pt")
    load_pretrained(net, tmp_path / "ok.pt")
    torch.save({**net.state_dict(), "pos_embed": net.pos_embed + 0.01}, tmp_path / "learned.pt")
    with pytest.raises(InputError, match="pos_embed"):
        load_pretrained(net, tmp_path / "learned.pt")


# -- the autoencoder of latent diffusion (diffusers' own AutoencoderKL, built from the run's config) ---------------

AE = {
    "down_block_types": ["DownEncoderBlock2D"] * 2,
    "up_block_types": ["UpDecoderBlock2D"] * 2,
    "block_out_channels": [8, 16],
    "layers_per_block": 1,
    "latent_channels": 4,
    "norm_num_groups": 8,
}


def test_an_autoencoder_folder_loads_exactly_or_is_refused_naming_the_fields_that_differ(tmp_path):
    from zoo.diffusion.latent import load_autoencoder

    ref = randomized(diffusers.AutoencoderKL(**AE, scaling_factor=0.5), 5)
    ref.save_pretrained(tmp_path / "pipeline" / "vae")
    vae = diffusers.AutoencoderKL(**AE, scaling_factor=0.5).eval()
    load_autoencoder(vae, tmp_path / "pipeline")
    z = torch.randn(2, 4, 4, 4, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(vae.decode(z).sample, ref.decode(z).sample, atol=0, rtol=0)
    # Same shapes, another function (the groups), or other latents (the scale): refused, the field named.
    for other, why in (({"norm_num_groups": 4}, "norm_num_groups=8 .built: 4."), ({}, "scaling_factor=0.5")):
        with pytest.raises(InputError, match=why):
            load_autoencoder(diffusers.AutoencoderKL(**AE | other), tmp_path / "pipeline")


def test_a_latent_pipeline_arrives_with_its_autoencoder_and_samples_decoded_images(tmp_path):
    diffusers_dit().save_pretrained(tmp_path / "pipeline" / "transformer")  # 4 latent channels, 8x8 latents
    vae = randomized(diffusers.AutoencoderKL(**AE, scaling_factor=0.5), 5)
    vae.save_pretrained(tmp_path / "pipeline" / "vae")
    module = from_pretrained(tmp_path / "pipeline", ema_decay=None)
    assert module.latent_scale.item() == 0.5 and module.hparams["clip_denoised"] is None
    for k, v in vae.state_dict().items():
        assert torch.equal(module.autoencoder.state_dict()[k], v), k
    assert module.sample(2, partial(DDIMSampler, steps=2)).shape == (2, 3, 16, 16)  # images, f = 2


# -- the command line: the net from the folder, no net block -------------------------------------------------


def folder_config(tmp_path: Path, folder: Path, net: dict, objective: dict | None = None) -> Path:
    """A fit of 2 steps on 8x8 shapes, starting from ``folder``, whose net block is ``net`` (``objective``: the
    noise schedule's settings, T = 100 by default)."""
    images = dict(image_size=8, batch_size=4, num_train=8, num_val=4, num_test=4)
    config = {
        "model": {
            "class_path": "zoo.diffusion.DiffusionModule",
            "init_args": {
                "net": net,
                "init_weights": str(folder),
                "objective": {
                    "class_path": "zoo.diffusion.GaussianDiffusion",
                    "init_args": objective or {"num_timesteps": 100},
                },
                "sampler": {"class_path": "zoo.diffusion.DDIMSampler", "init_args": {"steps": 2}},
                "ema_decay": None,
            },
        },
        "data": {
            "class_path": "datamodules.DiffusionDataModule",
            "init_args": {
                "images": {"class_path": "datamodules.ShapesDataModule", "init_args": images},
                "num_samples": 2,
                "batch_size": 2,
            },
        },
        "trainer": {"max_steps": 2, "limit_val_batches": 1, "logger": False, "enable_progress_bar": False},
    }
    path = tmp_path / "finetune.yaml"
    path.write_text(json.dumps(config))
    return path


def test_the_cli_fine_tunes_a_dit_folder_with_no_net_block_and_refuses_a_net_block_that_contradicts_it(tmp_path):
    """``init_weights: <folder>`` with ``net: zoo.diffusion.DiT`` alone: the net is the folder's config.json's
    (``zoo.app.pretrained``, per-block embedders included), exact; a value or class of the config's that the folder
    contradicts is one line naming it."""
    from conftest import cli

    from cli import main

    ref = diffusers_dit(in_channels=3, out_channels=6, num_embeds_ada_norm=6)  # the shapes' 3 channels, 6 classes
    ref.save_pretrained(tmp_path / "dit")
    config = folder_config(tmp_path, tmp_path / "dit", {"class_path": "zoo.diffusion.DiT"})
    c = main(["--config", str(config)], run=False)  # built, not run: its weights load at configure_model
    ours, theirs = c.model.hparams["net"]["init_args"], net_config(tmp_path / "dit")["init_args"]
    assert {k: ours[k] for k in theirs} == theirs and ours["block_embedders"]  # recorded: checkpoints rebuild
    c.model.configure_model()
    x, t, y = inputs(ref)
    torch.testing.assert_close(zoo_output(c.model.net, x, t, y), reference(ref, x, t, y), atol=1e-5, rtol=1e-5)
    assert cli("fit", "--config", str(config)).trainer.global_step == 2  # and it trains
    with pytest.raises(InputError, match=r"net\.init_args\.num_heads=4 \(the source's: 2\)") as err:
        cli("fit", "--config", str(config), "--model.init_args.net.init_args.num_heads=4")
    assert "\n" not in str(err.value)


def test_a_ddpm_pipeline_with_the_ddpm_release_s_unet_loads_in_python_and_through_the_cli(tmp_path):
    """google/ddpm-style: a DDPMPipeline whose UNet2DModel pads its downsampling at the bottom and right only and
    normalises with eps 1e-6; ``from_pretrained`` and ``init_weights: <pipeline>`` with ``net: zoo.diffusion.UNet``."""
    from cli import main
    from zoo.diffusion import DDPMSampler

    ref = diffusers_unet("ddpm-release")
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=100, beta_schedule="squaredcos_cap_v2")
    diffusers.DDPMPipeline(unet=ref, scheduler=scheduler).save_pretrained(tmp_path / "pipe")
    x, t, y = inputs(ref)
    want = reference(ref, x, t, y)
    module = from_pretrained(tmp_path / "pipe")
    assert isinstance(module.default_sampler, DDPMSampler)
    torch.testing.assert_close(zoo_output(module.net, x, t, y), want, atol=1e-5, rtol=1e-5)
    objective = {"num_timesteps": 100, "beta_schedule": "cosine"}  # the pipeline's scheduler
    config = folder_config(tmp_path, tmp_path / "pipe", {"class_path": "zoo.diffusion.UNet"}, objective)
    c = main(["--config", str(config)], run=False)  # built, not run: its weights load at configure_model
    recorded = c.model.hparams["net"]["init_args"]
    assert recorded["downsample_padding"] == 0 and recorded["norm_eps"] == 1e-6  # its checkpoints rebuild it
    c.model.configure_model()
    torch.testing.assert_close(zoo_output(c.model.net, x, t, y), want, atol=1e-5, rtol=1e-5)
