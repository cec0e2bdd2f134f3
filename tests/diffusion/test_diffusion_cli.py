"""The diffusion family through cli.py: fit, EMA in validation and checkpoints, resume, predict grids."""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CONFIGS, cli, output
from lightning.pytorch import Callback
from mlflow.tracking import MlflowClient
from PIL import Image
from torch import nn

from callbacks.media import to_pil
from zoo.diffusion import DDIMSampler, DiffusionModule
from zoo.errors import InputError
from zoo.tracking import run_dir

TINY = str(CONFIGS / "diffusion" / "tiny.yaml")
DIT16 = str(CONFIGS / "diffusion" / "dit_tiny_shapes16.yaml")


pytestmark = pytest.mark.usefixtures("one_thread")


def _ckpt(path: str) -> dict:
    return torch.load(path, weights_only=True)


def test_tiny_fits_validates_on_ema_and_predicts_from_its_checkpoint():
    c = cli("fit", "--config", TINY)
    val_loss = c.trainer.callback_metrics["val/loss"].item()
    last = c.trainer.checkpoint_callback.last_model_path

    # The checkpoint holds the EMA weights as its state_dict and the training weights beside them.
    ckpt = _ckpt(last)
    assert ckpt["averaging_state"]["n_averaged"].item() == c.trainer.global_step
    ema, current = ckpt["state_dict"], ckpt["current_model_state"]
    assert ema.keys() == current.keys()
    assert not torch.equal(ema["net.conv_out.weight"], current["net.conv_out.weight"])

    # Validation during fit ran on the EMA weights: validating the checkpoint alone gives the same loss.
    v = cli("validate", "--config", TINY, f"--ckpt_path={last}")
    assert v.trainer.callback_metrics["val/loss"].item() == pytest.approx(val_loss, rel=1e-5)

    run = c.trainer.logger.run_id
    client = MlflowClient(c.trainer.logger.tracking_uri)
    grids = [a.path for a in client.list_artifacts(run, "samples")]
    # the untrained model's at step 0 (where MLflow's image card opens), then one per validation epoch
    assert grids == ["samples/step_0000000.png", "samples/step_0000010.png", "samples/step_0000020.png"]
    assert client.get_run(run).data.tags["zoo.family"] == "diffusion"

    p = cli(
        "predict",
        "--config",
        TINY,
        f"--ckpt_path={last}",
        "--model.init_args.guidance_scale=3",
        "--model.init_args.sampler.init_args.steps=4",
        "--data.init_args.seed=5",
        "--data.init_args.labels=[2, 4]",
    )
    rows = [json.loads(line) for line in output("predictions.jsonl").read_text().splitlines()]
    assert [r["label"] for r in rows] == [2, 4] * 4 and [r["seed"] for r in rows] == [5] * 4 + [6] * 4
    assert all(Path(r["image"]).parent == run_dir(p.trainer) / "images" for r in rows)
    assert not Path("samples").exists()  # nothing in the working directory

    # The same images from the checkpoint alone, through the module's public sample().
    module = DiffusionModule.load_from_checkpoint(last).eval()
    torch.testing.assert_close(module.net.conv_out.weight, ema["net.conv_out.weight"])
    images = module.sample(4, partial(DDIMSampler, steps=4), guidance_scale=3.0, seed=5, labels=[2, 4, 2, 4])
    for image, row in zip(images, rows):
        assert np.array_equal(np.asarray(to_pil(image * 0.5 + 0.5)), np.asarray(Image.open(row["image"])))


@pytest.mark.slow  # the default suite's 10 minutes; CI's slow suite runs it
def test_resume_restores_training_weights_and_ema():
    straight = cli("fit", "--config", TINY, "--trainer.default_root_dir=straight")
    first = cli(
        "fit", "--config", TINY, "--trainer.callbacks+=conftest.StopAfterEpochs", "--trainer.default_root_dir=first"
    )
    assert first.trainer.global_step * 2 == straight.trainer.global_step
    resumed = cli(
        "fit",
        "--config",
        TINY,
        "--trainer.default_root_dir=resumed",
        f"--ckpt_path={first.trainer.checkpoint_callback.last_model_path}",
    )
    a = _ckpt(straight.trainer.checkpoint_callback.last_model_path)
    b = _ckpt(resumed.trainer.checkpoint_callback.last_model_path)
    assert a["averaging_state"]["n_averaged"] == b["averaging_state"]["n_averaged"] == straight.trainer.global_step
    for key in ("state_dict", "current_model_state"):  # EMA weights, training weights
        for k in a[key]:
            torch.testing.assert_close(a[key][k], b[key][k], rtol=0, atol=0, msg=f"{key}: {k}")


@pytest.mark.parametrize(
    "name",
    # dit_tiny_shapes16 runs the same DiT path in the default suite
    ["ddpm_unet_shapes.yaml", pytest.param("dit_s_shapes.yaml", marks=pytest.mark.slow), "dit_tiny_shapes16.yaml"],
)
def test_shapes_configs_run_a_few_steps(name):
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "diffusion" / name),
        "--trainer.fast_dev_run=2",
        "--trainer.enable_progress_bar=false",
        "--trainer.precision=32-true",
        "--data.init_args.images.init_args.batch_size=4",
        "--data.init_args.images.init_args.num_train=16",
        "--data.init_args.images.init_args.num_val=8",
        "--data.init_args.images.init_args.num_test=8",
    )
    assert torch.isfinite(c.trainer.callback_metrics["val/loss"])


@pytest.mark.slow
def test_a_short_fit_lowers_the_frechet_distance_of_its_samples():
    # The metric's feature space: a ConvNet the zoo trains on the same 8x8 shapes in a few seconds.
    clf = cli(
        "fit",
        "--config",
        str(CONFIGS / "cnn" / "convnet_shapes.yaml"),
        "--data.init_args.image_size=8",
        "--data.init_args.num_train=2000",
        "--data.init_args.num_val=256",
        "--data.init_args.num_test=64",
        "--model.init_args.net.init_args.depth=2",
        "--model.init_args.optimizer.warmup_steps=5",
        "--trainer.max_epochs=1",
        "--test_after_fit=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.default_root_dir=classifier",
    )
    fd = [
        "--trainer.callbacks+=callbacks.FrechetDistance",
        f"--trainer.callbacks.classifier={clf.trainer.checkpoint_callback.best_model_path}",
        "--trainer.callbacks.num_samples=256",
        "--trainer.callbacks.sampler=zoo.diffusion.DDIMSampler",
        "--trainer.callbacks.sampler.init_args.steps=10",
        "--data.init_args.images.init_args.num_val=256",
    ]
    untrained = cli("validate", "--config", TINY, *fd).trainer.callback_metrics["val/fd_classifier"].item()
    trained = cli("fit", "--config", TINY, *fd, "--trainer.max_epochs=10").trainer.callback_metrics["val/fd_classifier"]
    print(
        f"Frechet distance in the classifier's features: untrained {untrained:.1f}, "
        f"after 100 steps {trained.item():.1f}"
    )
    assert trained < 0.3 * untrained  # measured here: 80 -> 15


def test_a_missing_frechet_classifier_is_named_on_every_rank_at_construction():
    # Not at setup, where rank 0 alone loads it while the other ranks wait for it in a collective.
    from callbacks import FrechetDistance

    with pytest.raises(FileNotFoundError, match="classifier checkpoint 'no/such.ckpt' does not exist"):
        FrechetDistance("no/such.ckpt")


# -- init_weights: DiT weights from diffusers through the CLI --------------------------------------------

SMALL_DATA = [
    "--data.init_args.images.init_args.batch_size=4",
    "--data.init_args.images.init_args.num_train=16",
    "--data.init_args.images.init_args.num_val=8",
    "--data.init_args.images.init_args.num_test=8",
    "--trainer.enable_progress_bar=false",
]


def _tiny_dit(depth: int = 2, heads: int = 2) -> list[str]:
    # dit_tiny_shapes16.yaml's DiT made tiny; time_freq_shift=1 computes the step features as diffusers does.
    return [
        f"--model.init_args.net.init_args.depth={depth}",
        "--model.init_args.net.init_args.hidden_size=32",
        f"--model.init_args.net.init_args.num_heads={heads}",
        "--model.init_args.net.init_args.time_freq_shift=1",
    ]


def _diffusers_dit(folder: Path):
    """A random class-conditional DiTTransformer2DModel shaped like ``_tiny_dit()``, saved with ``save_pretrained``."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    ref = diffusers.DiTTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=3,
        out_channels=6,
        num_layers=2,
        sample_size=16,
        patch_size=2,
        num_embeds_ada_norm=6,
        norm_eps=1e-6,
    ).eval()
    with torch.no_grad():
        for p in ref.parameters():  # diffusers zero-inits the adaLN and output layers: make every path count
            p.add_(0.02 * torch.randn_like(p))
        first = ref.transformer_blocks[0].norm1.emb  # as in a converted checkpoint: one embedder, copied per block
        for block in ref.transformer_blocks[1:]:
            block.norm1.emb.load_state_dict(first.state_dict())
    ref.save_pretrained(folder)
    return ref


class RecordDenoiserOutput(Callback):
    """The module's denoiser output on fixed inputs when training starts: after init_weights, before any step."""

    def on_train_start(self, trainer, pl_module) -> None:
        g = torch.Generator().manual_seed(0)
        c, s, _ = pl_module.image_shape
        self.inputs = (torch.randn(3, c, s, s, generator=g), torch.tensor([0, 250, 999]), torch.tensor([1, 4, 6]))
        with torch.no_grad():
            self.output = pl_module.denoise(*self.inputs)


def test_init_weights_start_fit_from_a_diffusers_dit_folder(tmp_path):
    ref = _diffusers_dit(tmp_path / "dit")
    c = cli(
        "fit",
        "--config",
        DIT16,
        *_tiny_dit(),
        *SMALL_DATA,
        f"--model.init_args.init_weights={tmp_path / 'dit'}",
        "--trainer.fast_dev_run=2",
        "--trainer.callbacks+=test_diffusion_cli.RecordDenoiserOutput",
    )
    rec = next(cb for cb in c.trainer.callbacks if type(cb).__name__ == "RecordDenoiserOutput")
    x, t, y = rec.inputs
    with torch.no_grad():
        want = ref(x, timestep=t, class_labels=y).sample  # (3, 6, 16, 16): eps and the variance channels
    torch.testing.assert_close(rec.output, want, atol=1e-5, rtol=1e-5)
    assert c.trainer.global_step == 2 and torch.isfinite(c.trainer.callback_metrics["val/vlb"])


def test_init_weights_that_do_not_fit_say_what_to_do(tmp_path):
    fit = ["fit", "--config", DIT16, *SMALL_DATA, "--trainer.fast_dev_run=1"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cli(*fit, *_tiny_dit(), f"--model.init_args.init_weights={tmp_path / 'missing.pt'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="diffusion_pytorch_model.safetensors"):
        cli(*fit, *_tiny_dit(), f"--model.init_args.init_weights={tmp_path / 'empty'}")
    ref = _diffusers_dit(tmp_path / "dit")
    # A net block that the folder's config.json contradicts: each value named (zoo.app.pretrained).
    with pytest.raises(ValueError, match=r"net\.init_args\.num_heads=4 \(the source's: 2\)"):
        cli(*fit, *_tiny_dit(heads=4), f"--model.init_args.init_weights={tmp_path / 'dit'}")
    with pytest.raises(ValueError, match=r"net\.init_args\.depth=3 \(the source's: 2\)"):
        cli(*fit, *_tiny_dit(depth=3), f"--model.init_args.init_weights={tmp_path / 'dit'}")
    # Weights alone (no config.json): the config's net, and one block too many is named, with what the weights need.
    from safetensors.torch import save_file

    from zoo.diffusion.convert import from_diffusers

    save_file({f"net.{k}": v for k, v in from_diffusers(ref.state_dict()).items()}, tmp_path / "dit.safetensors")
    with pytest.raises(ValueError, match=r"(?s)blocks\.2\.attn\.qkv\.weight: missing.*init_args\.depth=2 "):
        cli(*fit, *_tiny_dit(depth=3), f"--model.init_args.init_weights={tmp_path / 'dit.safetensors'}")


# -- FID with local Inception weights --------------------------------------------------------------------


@pytest.fixture
def inception_weights(tmp_path) -> Path:
    """torch-fidelity's FID Inception-v3 with random weights, saved as its weights file would be (no download)."""
    pytest.importorskip("torch_fidelity")
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    class RandomInception(FeatureExtractorInceptionV3):
        def load_state_dict(self, state_dict, strict=True, assign=False):  # keep the random init
            return None

    torch.save({}, tmp_path / "empty.pt")
    torch.manual_seed(0)
    net = RandomInception("inception-v3-compat", ["2048"], feature_extractor_weights_path=str(tmp_path / "empty.pt"))
    for m in net.modules():  # variance-preserving convs, so the random features are not all ~0
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    path = tmp_path / "pt_inception-2015-12-05-6726825d.pth"
    torch.save(nn.Module.state_dict(net), path)
    return path


@pytest.mark.slow  # ~18 s: a fit with the FID callback end to end (CI's slow pass)
def test_fid_is_logged_from_local_inception_weights(inception_weights):
    from callbacks.fid import FrechetInceptionDistance, to_uint8_rgb

    fid = [
        "--trainer.callbacks+=callbacks.FrechetInceptionDistance",
        f"--trainer.callbacks.weights={inception_weights}",
        "--trainer.callbacks.num_samples=4",
        "--trainer.callbacks.batch_size=4",
        "--trainer.callbacks.sampler=zoo.diffusion.DDIMSampler",
        "--trainer.callbacks.sampler.init_args.steps=2",
    ]
    c = cli("fit", "--config", TINY, *fid, "--trainer.max_epochs=1")
    assert torch.isfinite(c.trainer.callback_metrics["val/fid"])  # meaningless with random weights, but computed
    # The same images on both sides are at distance ~0; other images are not.
    metric = FrechetInceptionDistance.build_metric(str(inception_weights))
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(4, 3, 8, 8, generator=g) * 2 - 1, torch.rand(4, 1, 8, 8, generator=g) - 1  # b: grey, darker
    metric.update(to_uint8_rgb(a), real=True)
    metric.update(to_uint8_rgb(a), real=False)
    same = metric.compute().item()
    metric.reset()  # the generated side only
    metric.update(to_uint8_rgb(b), real=False)
    other = metric.compute().item()
    assert abs(same) < 1e-3 * other, (same, other)


def test_fid_fails_fast_without_weights_or_torch_fidelity(tmp_path, monkeypatch):
    from callbacks import FrechetInceptionDistance
    from zoo.io.weights import UnsafeCheckpointError

    with pytest.raises(FileNotFoundError, match="never downloads"):
        FrechetInceptionDistance(str(tmp_path / "missing.pth"))
    torch.save({"not weights": Path(".")}, tmp_path / "pickled.pth")  # would run code under weights_only=False
    with pytest.raises(UnsafeCheckpointError):
        FrechetInceptionDistance.build_metric(str(tmp_path / "pickled.pth"))
    monkeypatch.setitem(sys.modules, "torch_fidelity", None)  # as if not installed
    with pytest.raises(
        InputError, match=r'needs torch-fidelity, which is not installed: pip install -c constraints.txt -e "\.\[fid\]"'
    ):
        FrechetInceptionDistance(str(tmp_path / "pickled.pth"))


def test_log_image_samples_takes_a_new_sampler_class_and_its_options_from_the_command_line():
    from test_diffusion import OneStepSampler

    from callbacks import LogImageSamples

    OneStepSampler.calls = 0
    c = cli(
        "fit",
        "--config",
        TINY,
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=2",
        "--trainer.callbacks.sampler=test_diffusion.OneStepSampler",
        "--trainer.callbacks.guidance_scale=2.5",
    )
    (cb,) = [cb for cb in c.trainer.callbacks if isinstance(cb, LogImageSamples)]
    assert cb.guidance_scale == 2.5 and isinstance(c.model.objective.sampler(cb.sampler, None), OneStepSampler)
    assert OneStepSampler.calls == 2  # one step each: the untrained grid at step 0, then one validation
    client = MlflowClient(c.trainer.logger._tracking_uri)
    grids = [a.path for a in client.list_artifacts(c.trainer.logger.run_id, "samples")]
    assert grids == ["samples/step_0000000.png", "samples/step_0000002.png"]
