"""Latent diffusion: the autoencoder stage against diffusers called directly, its loss by hand, frozen weights, the
scale estimate, weights from folders and files, checkpoints that carry both, and the configs through cli.py."""

from __future__ import annotations

import json
import pickle
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, cli, output
from lightning.pytorch import Callback, Trainer
from torch.utils.data import DataLoader, TensorDataset

from zoo.diffusion import AutoencoderModule, DiffusionModule, DiT, FlowEulerSampler, FlowMatching
from zoo.diffusion.latent import AUTOENCODERS, load_autoencoder
from zoo.errors import InputError
from zoo.io import trust
from zoo.io.weights import UnsafeCheckpointError
from zoo.train.optim import AdamWCosine

diffusers = pytest.importorskip("diffusers")

LATENT = str(CONFIGS / "diffusion" / "latent_flow_dit_shapes.yaml")
TRAIN_AE = str(CONFIGS / "diffusion" / "autoencoder_shapes.yaml")
TINY = str(CONFIGS / "diffusion" / "latent_tiny.yaml")
AE = {
    "down_block_types": ["DownEncoderBlock2D"] * 2,
    "up_block_types": ["UpDecoderBlock2D"] * 2,
    "block_out_channels": [8, 16],
    "layers_per_block": 1,
    "latent_channels": 4,
    "norm_num_groups": 8,
}
AE_CONFIG = {"class_path": "diffusers.AutoencoderKL", "init_args": AE}
# The config's 32-pixel images to 8x8 latents (f = 4), as its own autoencoder, with the fewest channels.
TINY_F4 = {
    **AE_CONFIG,
    "init_args": {
        **AE,
        "block_out_channels": [8, 8, 8],
        **{k: [v[0]] * 3 for k, v in AE.items() if k.endswith("block_types")},
    },
}

pytestmark = pytest.mark.usefixtures("one_thread")


def _vae(seed: int = 0, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    return diffusers.AutoencoderKL(**{**AE, **kw}).eval()


def _net(in_channels: int = 4, num_classes: int = 0) -> DiT:
    return DiT(
        patch_size=2, image_size=8, in_channels=in_channels, num_classes=num_classes, depth=1, hidden_size=32,
        num_heads=2, learn_sigma=False,
    )  # fmt: skip


def _module(vae=None, **kw) -> DiffusionModule:
    args = dict(objective=FlowMatching(), sampler=partial(FlowEulerSampler, steps=3), clip_denoised=None)
    args["ema_decay"] = None
    return DiffusionModule(_net(), autoencoder=vae if vae is not None else _vae(), **{**args, **kw})


def _images(n: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed)) * 2 - 1


# -- the autoencoder stage against diffusers ------------------------------------------------------------------


def test_encode_and_decode_equal_diffusers_called_directly_with_the_scale_and_shift():
    vae = _vae(scaling_factor=0.7, shift_factor=0.2)
    m = _module(_vae(scaling_factor=0.7, shift_factor=0.2))
    assert m.latent_scale.item() == pytest.approx(0.7)  # the autoencoder's own config by default
    x = _images()
    with torch.no_grad():
        want = (vae.encode(x).latent_dist.sample(generator=torch.Generator().manual_seed(3)) - 0.2) * 0.7
        z = torch.randn(4, 4, 8, 8)
        decoded = vae.decode(z / 0.7 + 0.2).sample
    torch.testing.assert_close(m.encode(x, torch.Generator().manual_seed(3)), want)
    torch.testing.assert_close(m.decode(z), decoded)
    assert m.latent_shape == (4, 8, 8) and m.image_shape == (3, 16, 16)


def test_the_validation_loss_is_the_objective_on_scaled_posterior_samples_by_hand():
    m = _module(latent_scale=0.5)
    x, y = _images(), torch.zeros(4, dtype=torch.long)
    trainer = Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    got = trainer.validate(m, DataLoader(TensorDataset(x, y), batch_size=4), verbose=False)[0]["val/loss"]
    g = torch.Generator().manual_seed(0)  # validation's fixed draws for batch 0: posterior, times, noise
    with torch.no_grad():
        latents = 0.5 * m.autoencoder.encode(x).latent_dist.sample(generator=g)
        t = FlowMatching().sample_time(4, g)
        noise = torch.randn(latents.shape, generator=g)
        xt = (1 - t.view(-1, 1, 1, 1)) * latents + t.view(-1, 1, 1, 1) * noise
        want = (m.net(xt, 1000 * t, None) - (noise - latents)).pow(2).mean()
    assert got == pytest.approx(want.item(), rel=1e-5)


class _Losses(Callback):
    def __init__(self):
        self.losses, self.batches, self.modes = [], [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())
        self.batches.append(batch[0])
        self.modes.append((pl_module.net.training, pl_module.autoencoder.training))


def test_training_estimates_the_scale_on_the_first_batch_and_leaves_the_autoencoder_untouched():
    vae = _vae()
    before = {k: v.clone() for k, v in vae.state_dict().items()}
    m = _module(vae, latent_scale="estimate", optimizer=AdamWCosine(lr=1e-2, warmup_steps=0), ema_decay=0.5)
    assert torch.isnan(m.latent_scale)
    with pytest.raises(InputError, match="estimated on the first batch of fit"):
        m.sample(1)
    seen = _Losses()
    data = TensorDataset(_images(8), torch.zeros(8, dtype=torch.long))
    trainer = Trainer(
        max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False, callbacks=[seen],
        num_sanity_val_steps=0, limit_val_batches=0, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(m, DataLoader(data, batch_size=4))
    # LDM's scale_by_std: 1 / std of the first training batch's posterior samples, drawn with the step's generator.
    key = hash((torch.initial_seed(), 0, 0, 0)) % 2**63
    with torch.no_grad():
        z = vae.encode(seen.batches[0]).latent_dist.sample(generator=torch.Generator().manual_seed(key))
    assert m.latent_scale.item() == pytest.approx(1 / z.std().item(), rel=1e-5)
    # Frozen: no gradient, eval mode through fit, not in the optimizer, weights unchanged, not averaged by the EMA.
    assert not any(p.requires_grad for p in m.autoencoder.parameters())
    assert seen.modes == [(True, False)] * 2  # while training: the net in train mode, the autoencoder in eval
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert optimized == {id(p) for p in m.net.parameters()}
    for k, v in m.autoencoder.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0, msg=k)
    ema = next(c for c in trainer.callbacks if type(c).__name__ == "EMA")
    assert len(ema._average) == len(list(m.net.parameters())) + len(list(m.buffers()))


def test_samples_are_decoded_images_in_range():
    m = _module(latent_scale=0.5)
    images = m.sample(3, seed=4)
    assert images.shape == (3, 3, 16, 16) and images.min() >= -1 and images.max() <= 1
    gen = torch.Generator().manual_seed(4)
    noise = torch.randn((3, 4, 8, 8), generator=gen)
    with torch.no_grad():
        latents = FlowEulerSampler(FlowMatching(), steps=3).sample(m.denoise, noise, None, gen)
        want = m.autoencoder.decode(latents / 0.5).sample.clamp(-1, 1)
    torch.testing.assert_close(images, want)


def test_loaded_weights_bring_their_scale_whether_known_or_still_to_estimate():
    # The module keeps on the host whether the scale is known (no device read per step); a load must re-read it.
    known = _module(latent_scale=0.5)
    untrained = _module(latent_scale="estimate")
    target = _module(latent_scale=0.25)
    target.load_state_dict(untrained.state_dict())
    with pytest.raises(InputError, match="estimated on the first batch of fit"):
        target.sample(1)
    target.load_state_dict(known.state_dict())
    torch.testing.assert_close(target.sample(2, seed=3), known.sample(2, seed=3))
    untrained.load_state_dict(known.state_dict())
    assert untrained.encode(_images(2)).isfinite().all()  # a known scale: no estimate asked of a test's own loop


def test_a_unet_trains_on_latents_and_samples_decoded_images():
    from zoo.diffusion import UNet

    net = UNet(in_channels=4, image_size=8, base_channels=16, channel_mults=(1, 2), num_res_blocks=1,
               attention_resolutions=(), norm_groups=8, dropout=0.0)  # fmt: skip
    args = dict(objective=FlowMatching(), sampler=partial(FlowEulerSampler, steps=2), clip_denoised=None)
    m = DiffusionModule(
        net,
        autoencoder=_vae(),
        latent_scale=0.5,
        ema_decay=None,
        optimizer=AdamWCosine(lr=1e-2, warmup_steps=0),
        **args,
    )
    vae_before = {k: v.clone() for k, v in m.autoencoder.state_dict().items()}
    net_before = {k: v.clone() for k, v in net.state_dict().items()}
    trainer = Trainer(
        max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False, num_sanity_val_steps=0,
        limit_val_batches=0, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(m, DataLoader(TensorDataset(_images(8), torch.zeros(8, dtype=torch.long)), batch_size=4))
    assert all(torch.equal(v, m.autoencoder.state_dict()[k]) for k, v in vae_before.items())  # frozen
    assert not all(torch.equal(v, net.state_dict()[k]) for k, v in net_before.items())  # the UNet learned
    images = m.sample(2, seed=3)
    assert images.shape == (2, 3, 16, 16) and images.min() >= -1 and images.max() <= 1
    with torch.no_grad():
        gen = torch.Generator().manual_seed(3)
        noise = torch.randn((2, 4, 8, 8), generator=gen)
        latents = FlowEulerSampler(FlowMatching(), steps=2).sample(m.denoise, noise, None, gen)
        torch.testing.assert_close(images, m.autoencoder.decode(latents / 0.5).sample.clamp(-1, 1))


# -- configuration errors -------------------------------------------------------------------------------------


def test_mismatched_sizes_and_settings_get_one_line_each():
    with pytest.raises(InputError, match="net takes 3 input channels but the autoencoder's latents have 4"):
        DiffusionModule(_net(in_channels=3), autoencoder=_vae(), clip_denoised=None)
    with pytest.raises(InputError, match="clip_denoised=1.0 clamps"):
        DiffusionModule(_net(), autoencoder=_vae())
    with pytest.raises(InputError, match="give model.init_args.autoencoder"):
        DiffusionModule(_net(), latent_scale="estimate")
    with pytest.raises(InputError, match=r"set net.init_args.image_size to the images' side / 2 \(16\)"):
        _module().encode(torch.zeros(1, 3, 32, 32))
    with pytest.raises(InputError, match="not one this module builds"):
        _module({"class_path": "diffusers.UNet2DModel", "init_args": {}})


def test_a_missing_diffusers_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers raises ImportError
    with pytest.raises(
        InputError, match=r'needs diffusers, which is not installed: pip install -c constraints.txt -e "\.\[latent\]"'
    ):
        _module(AE_CONFIG)


def test_a_stored_autoencoder_is_plain_data_the_module_builds_from_its_own_list():
    """``autoencoder`` is a ``dict[str, Any]``: the stored-config builder copies it as data (never builds what it
    names); the module builds only the classes of ``AUTOENCODERS``."""
    from zoo.io import build

    assert trust.EXTERNAL_PARTS == set(AUTOENCODERS)
    allow = trust.zoo_allowlist()
    stored = {"_class_path": "zoo.diffusion.DiffusionModule", "net": {"class_path": "zoo.diffusion.DiT"}}
    for path in AUTOENCODERS:
        part = build.resolve_model({**stored, "autoencoder": {**AE_CONFIG, "class_path": path}}, "x.ckpt", allow)
        assert part.args["autoencoder"]["class_path"] == path
    for path in ("diffusers.UNet2DModel", "diffusers.models.AutoencoderTiny", "os.system"):
        with pytest.raises(InputError, match="not one this module builds"):
            _module({"class_path": path})
        with pytest.raises(trust.UntrustedConfigError, match=r"autoencoder\.class_path"):
            build.resolve_model({**stored, "autoencoder": {"class_path": path}}, "x.ckpt", allow)
    with pytest.raises(trust.UntrustedConfigError, match=r"autoencoder\.init_args\.x"):
        ae = {"class_path": "diffusers.AutoencoderKL", "init_args": {"x": object()}}
        build.resolve_model({**stored, "autoencoder": ae}, "x", allow)


# -- weights ----------------------------------------------------------------------------------------------------


def test_weights_load_from_a_diffusers_folder_a_pipeline_a_file_and_a_zoo_checkpoint(tmp_path):
    trained = _vae(seed=7)
    trained.save_pretrained(tmp_path / "folder")
    trained.save_pretrained(tmp_path / "pipeline" / "vae")
    torch.save(trained.state_dict(), tmp_path / "vae.pt")
    torch.save({"state_dict": {f"autoencoder.{k}": v for k, v in trained.state_dict().items()}}, tmp_path / "z.ckpt")
    x = _images(2)
    for path in ("folder", "pipeline", "folder/diffusion_pytorch_model.safetensors", "vae.pt", "z.ckpt"):
        m = _module(_vae(seed=1), autoencoder_weights=str(tmp_path / path))
        g = torch.Generator().manual_seed(0)  # read at the first encode from Python (at set-up in a Trainer)
        with torch.no_grad():
            want = trained.encode(x).latent_dist.sample(generator=torch.Generator().manual_seed(0)) * 0.18215
        torch.testing.assert_close(m.encode(x, g), want, msg=path)
    with pytest.raises(InputError, match=r"autoencoder_weights '.*missing' does not exist"):
        _module(autoencoder_weights=str(tmp_path / "missing")).encode(x)
    with pytest.raises(InputError, match="holds no diffusers weights"):
        load_autoencoder(_vae(), tmp_path)  # a folder without them (nor a vae/ with them)


class _Marker:
    def __reduce__(self):
        return (Path.touch, (Path(__file__).with_name("latent_pwned"),))


def test_autoencoder_weights_are_read_weights_only(tmp_path):
    bad = tmp_path / "vae.pt"
    with bad.open("wb") as f:
        pickle.dump({"encoder.conv_in.weight": _Marker()}, f)
    with pytest.raises(UnsafeCheckpointError):
        _module(autoencoder_weights=str(bad)).encode(_images(1))
    assert not Path(__file__).with_name("latent_pwned").exists()


# -- through cli.py -----------------------------------------------------------------------------------------------


def test_the_autoencoders_loss_is_reconstruction_plus_weighted_kl_and_training_lowers_it():
    m = AutoencoderModule(_vae(), kl_weight=0.1, reconstruction="l2")
    x = _images(4)
    out = m._loss(x, torch.Generator().manual_seed(2))
    with torch.no_grad():
        posterior = m.autoencoder.encode(x).latent_dist
        recon = m.autoencoder.decode(posterior.sample(generator=torch.Generator().manual_seed(2))).sample
        kl = posterior.kl().mean() / (4 * 8 * 8)  # diffusers' KL: summed over each image's latent elements
    torch.testing.assert_close(out["rec"], (recon - x).pow(2).mean())
    torch.testing.assert_close(out["kl"], kl)
    torch.testing.assert_close(out["loss"], out["rec"] + 0.1 * kl)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(15):
        opt.zero_grad()
        m._loss(x, torch.Generator().manual_seed(2))["loss"].backward()
        opt.step()
    assert m._loss(x, torch.Generator().manual_seed(2))["loss"] < 0.5 * out["loss"]


def test_the_latent_config_fits_on_a_trained_autoencoder_predicts_and_reloads_from_its_checkpoint(tmp_path):
    """autoencoder_shapes.yaml then latent_flow_dit_shapes.yaml reading its checkpoint, a few steps each: the
    autoencoder's weights and the estimated scale travel in the checkpoint, so predict and load_from_checkpoint
    decode as the trained module does; a tampered class is refused."""
    tiny_ae = f"--model.init_args.autoencoder={json.dumps(TINY_F4)}"
    data = ["--data.init_args.images.init_args.num_train=32", "--data.init_args.images.init_args.num_val=16"]
    a = cli("fit", "--config", TRAIN_AE, tiny_ae, *data, "--trainer.max_steps=2", "--trainer.logger=false")
    trained = a.model.autoencoder.state_dict()
    small = [
        "--trainer.max_steps=2", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
        "--model.init_args.net.init_args.depth=1", "--model.init_args.net.init_args.hidden_size=32",
        "--model.init_args.net.init_args.num_heads=2", "--data.init_args.images.init_args.num_train=32",
        "--data.init_args.images.init_args.num_val=16", "--data.init_args.images.init_args.batch_size=16",
        "--trainer.callbacks.num_samples=2", "--model.init_args.sampler.init_args.steps=2", "--trainer.logger=false",
        tiny_ae, f"--model.init_args.autoencoder_weights={a.trainer.checkpoint_callback.last_model_path}",
    ]  # fmt: skip
    c = cli("fit", "--config", LATENT, *small)
    last = c.trainer.checkpoint_callback.last_model_path
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["hyper_parameters"]["autoencoder"]["class_path"] == "diffusers.AutoencoderKL"
    scale = ckpt["state_dict"]["latent_scale"]
    assert torch.isfinite(scale) and scale.item() == pytest.approx(c.model.latent_scale.item())
    for k, v in trained.items():  # the trained autoencoder, unchanged by fit, in the checkpoint
        torch.testing.assert_close(ckpt["state_dict"][f"autoencoder.{k}"], v, rtol=0, atol=0, msg=k)

    cli("predict", f"--ckpt_path={last}", "--trainer.logger=false", "--data.init_args.num_samples=2")
    rows = [json.loads(line) for line in output("predictions.jsonl").read_text().splitlines()]
    from PIL import Image

    assert len(rows) == 2 and Image.open(rows[0]["image"]).size[0] % 32 == 0  # 32-pixel images (maybe enlarged)

    module = DiffusionModule.load_from_checkpoint(last).eval()
    assert module.latent_scale.item() == scale.item()
    torch.testing.assert_close(module.sample(2, seed=1), c.model.eval().sample(2, seed=1))

    tampered = tmp_path / "tampered.ckpt"
    ckpt["hyper_parameters"]["autoencoder"]["class_path"] = "diffusers.UNet2DModel"
    torch.save(ckpt, tampered)
    with pytest.raises(trust.UntrustedConfigError, match="autoencoder.class_path is 'diffusers.UNet2DModel'"):
        DiffusionModule.load_from_checkpoint(tampered)


def test_the_tiny_latent_config_trains_on_weights_from_a_path_given_on_the_command_line(tmp_path):
    trained = _vae(seed=5)
    trained.save_pretrained(tmp_path / "vae")
    fit = ["fit", "--config", TINY, "--trainer.max_steps=1", "--trainer.limit_val_batches=1", "--trainer.logger=false"]
    c = cli(*fit, f"--model.init_args.autoencoder_weights={tmp_path}/vae")
    for k, v in trained.state_dict().items():
        torch.testing.assert_close(c.model.autoencoder.state_dict()[k], v, rtol=0, atol=0, msg=k)
    with pytest.raises(InputError, match="does not exist"):  # one error line (cli.py prints it so)
        cli(*fit, f"--model.init_args.autoencoder_weights={tmp_path}/no")
