"""Behaviour that only shows through use: the EMA weights are the ones validation, sampling and checkpoints
use, and the raw weights the ones training steps update (``DiffusionModule`` with its own EMA callback, run
by a Trainer).

The EMA is recomputed here from the raw weights after every optimizer step, as DiT/Lightning define it: the
average starts as a copy of the weights at its first update, then ema <- d ema + (1 - d) w per step.
"""

from __future__ import annotations

from functools import partial

import lightning.pytorch as L
import torch
from lightning.pytorch import Callback
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DataLoader, TensorDataset

from zoo.diffusion import DiffusionModule, GaussianDiffusion, UNet
from zoo.diffusion.samplers import DDIMSampler
from zoo.train.optim import AdamWCosine

DECAY = 0.7  # far from 1, so the average is far from the weights after a few steps; not 0.5, where d = 1 - d


class Seen(Callback):
    """The net's weights as each hook sees them (the order of hooks: train start, step, end; validation)."""

    def __init__(self) -> None:
        self.train_start, self.after_step, self.val, self.val_end = [], [], [], []

    @staticmethod
    def vec(pl_module) -> torch.Tensor:
        return parameters_to_vector(pl_module.net.parameters()).detach().clone()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.train_start.append(self.vec(pl_module))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.after_step.append(self.vec(pl_module))  # raw weights, whichever callback runs first

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.val.append(self.vec(pl_module))

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.val_end.append(self.vec(pl_module))  # where LogImageSamples and the Fréchet callbacks sample


def loaders():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(8, 1, 8, 8, generator=g) * 2 - 1
    data = TensorDataset(x, torch.zeros(8, dtype=torch.long))
    return DataLoader(data, batch_size=4), DataLoader(data, batch_size=4)


def fit(tmp_path, seen: Seen, **module_args):
    torch.manual_seed(0)
    net = UNet(
        in_channels=1,
        image_size=8,
        base_channels=8,
        channel_mults=(1, 2),
        num_res_blocks=1,
        attention_resolutions=(4,),
        dropout=0.0,
        norm_groups=4,
    )
    few_steps = partial(DDIMSampler, steps=5)  # of T = 20: the module builds its sampler, and 50 steps would not fit
    module_args = {"sampler": few_steps, **module_args}
    module = DiffusionModule(net, GaussianDiffusion(20), optimizer=AdamWCosine(lr=3e-2, warmup_steps=0), **module_args)
    trainer = L.Trainer(
        max_steps=4,
        val_check_interval=2,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        logger=False,
        callbacks=[seen],
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    train, val = loaders()
    trainer.fit(module, train, val)
    return module, trainer


def ema_of(steps: list[torch.Tensor], start: int = 0) -> list[torch.Tensor | None]:
    """The EMA after each optimizer step (None before its first update at 0-based step ``start``)."""
    out, ema = [], None
    for i, w in enumerate(steps):
        if i >= start:
            ema = w.clone() if ema is None else DECAY * ema + (1 - DECAY) * w
        out.append(ema)
    return out


def test_validation_sampling_and_checkpoints_use_the_ema_and_training_the_raw_weights(tmp_path):
    seen = Seen()
    module, trainer = fit(tmp_path, seen, ema_decay=DECAY)
    raw = seen.after_step
    ema = ema_of(raw)
    assert len(raw) == 4 and len(seen.val) == 2  # validations after steps 2 and 4
    assert not torch.allclose(ema[1], raw[1], atol=1e-4)  # the test can tell them apart
    for got, want in zip(seen.val, (ema[1], ema[3])):
        torch.testing.assert_close(got, want)
    for got, want in zip(seen.val_end, (ema[1], ema[3])):  # still swapped in where callbacks sample
        torch.testing.assert_close(got, want)
    # Training goes on from the raw weights after a validation, not from the average.
    torch.testing.assert_close(seen.train_start[2], raw[1])
    # After fit the module holds the average: module.sample() and an in-process predict use it.
    torch.testing.assert_close(Seen.vec(module), ema[3])
    # val/loss is the loss of the EMA weights on validation's fixed draws (batch 0: generator seed 0).
    x0, y = next(iter(trainer.val_dataloaders))
    g = torch.Generator().manual_seed(0)
    t = torch.randint(0, 20, (x0.shape[0],), generator=g)
    noise = torch.randn(x0.shape, generator=g)
    with torch.no_grad():
        want = module.eval()._loss((x0, y), t=t, noise=noise)["loss"]
    torch.testing.assert_close(trainer.callback_metrics["val/loss"], want)
    # The checkpoint: state_dict = EMA (what load_from_checkpoint and predict --ckpt_path sample from),
    # current_model_state = raw (what a resumed fit trains on).
    ckpt = torch.load(
        trainer.checkpoint_callback.last_model_path or trainer.checkpoint_callback.best_model_path, weights_only=True
    )
    names = [n for n, _ in module.net.named_parameters()]
    saved = torch.cat([ckpt["state_dict"][f"net.{n}"].flatten() for n in names])
    current = torch.cat([ckpt["current_model_state"][f"net.{n}"].flatten() for n in names])
    torch.testing.assert_close(saved, ema[3])
    torch.testing.assert_close(current, raw[3])


def test_ema_starts_at_ema_start_step_and_none_means_raw_weights_everywhere(tmp_path):
    seen = Seen()
    fit(tmp_path / "late", seen, ema_decay=DECAY, ema_start_step=2)
    ema = ema_of(seen.after_step, start=2)
    assert ema[1] is None  # no EMA before step 2: validation after step 2 sees the trained weights, not the initial
    assert not torch.allclose(seen.after_step[1], seen.train_start[0], atol=1e-4)
    torch.testing.assert_close(seen.val[0], seen.after_step[1])
    torch.testing.assert_close(seen.val[1], ema[3])
    off = Seen()
    module, _ = fit(tmp_path / "off", off, ema_decay=None)
    torch.testing.assert_close(off.val[0], off.after_step[1])
    torch.testing.assert_close(Seen.vec(module), off.after_step[3])


class Spy(torch.nn.Module):
    """A denoiser that records what it is called with (labels, train mode) and predicts through a tiny UNet."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.unet = UNet(
            in_channels=1,
            image_size=8,
            base_channels=8,
            channel_mults=(1, 2),
            num_res_blocks=1,
            attention_resolutions=(4,),
            dropout=dropout,
            norm_groups=4,
            num_classes=3,
        )
        self.in_channels, self.image_size, self.num_classes = 1, 8, 3
        self.labels, self.modes = [], []

    @property
    def blocks(self) -> list[torch.nn.Module]:
        return self.unet.blocks

    def forward(self, x, t, y=None):
        self.labels.append(None if y is None else y.clone())
        self.modes.append(self.training)
        return self.unet(x, t, y)


def test_label_dropout_replaces_labels_by_the_null_class(tmp_path):
    """Classifier-free guidance's unconditional model is the null class K (here 3), never a real class."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (64,), generator=g)
    data = TensorDataset(torch.rand(64, 1, 8, 8, generator=g) * 2 - 1, y)
    for p, check in (
        (1.0, lambda seen: (seen == 3).all()),
        (0.5, lambda seen: ((seen == y) | (seen == 3)).all() and 16 < (seen == 3).sum() < 48),
        (0.0, lambda seen: torch.equal(seen, y)),
    ):
        net = Spy()
        module = DiffusionModule(
            net, GaussianDiffusion(20), label_dropout=p, ema_decay=None, sampler=partial(DDIMSampler, steps=5)
        )
        L.Trainer(
            max_steps=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        ).fit(module, DataLoader(data, batch_size=64))
        assert check(net.labels[0]), (p, net.labels[0])


def test_sampling_runs_the_net_in_eval_mode_and_restores_the_mode():
    """Dropout off while sampling (the same seed then gives the same images), and the module's mode kept."""
    torch.manual_seed(0)
    net = Spy(dropout=0.5)
    module = DiffusionModule(net, GaussianDiffusion(20), ema_decay=None, sampler=partial(DDIMSampler, steps=5)).train()
    with torch.no_grad():  # a non-zero output path, so that dropout would show
        for p in net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    first = module.sample(2, partial(DDIMSampler, steps=5), seed=3)
    assert net.modes and not any(net.modes)
    assert module.training and net.training
    torch.manual_seed(1)  # another global RNG state: dropout would draw other masks
    torch.testing.assert_close(module.sample(2, partial(DDIMSampler, steps=5), seed=3), first)


SMALL_UNET = dict(
    in_channels=3,
    image_size=8,
    base_channels=8,
    channel_mults=(1, 2),
    num_res_blocks=1,
    attention_resolutions=(4,),
    norm_groups=4,
    dropout=0.0,
    num_classes=2,
)


def test_channels_last_sampling_gives_the_default_layouts_images_and_training_keeps_weight_gradient_strides():
    torch.manual_seed(0)
    net, plain = UNet(**SMALL_UNET), UNet(**SMALL_UNET, channels_last=False)
    plain.load_state_dict(net.state_dict())
    torch.nn.init.normal_(net.conv_out.weight), plain.conv_out.weight.data.copy_(net.conv_out.weight)
    x, t, y = torch.randn(3, 3, 8, 8), torch.tensor([1, 500, 999]), torch.tensor([0, 1, 2])
    with torch.no_grad():
        fast, want = net(x, t, y), plain(x, t, y)
    assert fast.is_contiguous() and torch.allclose(fast, want, atol=1e-5), (fast - want).abs().max()
    layouts = []  # what the first convolution is given: channels-last only where no gradient is taken
    net.conv_in.register_forward_hook(lambda m, args, out: layouts.append(args[0].is_contiguous()))
    with torch.no_grad():
        net(x, t, y)
    net(x, t, y).square().mean().backward()  # training: every weight gradient has its weight's strides
    assert layouts == [False, True], layouts
    assert all(p.grad.stride() == p.stride() for p in net.parameters() if p.grad is not None)
