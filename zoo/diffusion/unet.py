"""UNet denoiser of DDPM (Ho et al. 2020, appendix B), with the class embedding of Dhariwal & Nichol 2021.

Residual blocks (GroupNorm, SiLU, 3x3 convs) take the step embedding as a per-channel bias; a
self-attention block follows the residual blocks at the resolutions in ``attention_resolutions``
(16x16 in DDPM's CIFAR-10 model); skips join the encoder and decoder at every block. The last conv
of every residual and attention branch, and the output conv, start at zero: each block starts as
the identity and the net as the zero predictor (Goyal et al. 2017's zero-init residuals).

The net only predicts: ``forward(x_t, t, y)`` returns a tensor shaped like x_t (eps, v or x0, as
the module trains it), or with ``learn_sigma`` twice as many channels, the second half the variance
interpolation v of Nichol & Dhariwal 2021 (whose UNet does the same). ``num_classes`` > 0 adds a
label embedding with a null class, ``num_classes``.

Two switches of Dhariwal & Nichol 2021's ADM UNet (guided-diffusion's names): ``use_scale_shift_norm`` gives the step
embedding to each residual block as a scale and shift after its second norm, and ``resblock_updown`` halves and
doubles the side with residual blocks (average pooling and nearest upsampling inside) in place of the strided and
upsampling convs. ``downsample_padding=0`` is the DDPM release's downsampling, as diffusers ports it: the conv pads
one row and column at the bottom and right only.

Notation: B batch, C channels, H/W height/width, E time-embedding width (4 x base channels).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zoo.diffusion.embeddings import LabelEmbedder, TimestepEmbedder
from zoo.nn.attention import SelfAttention


def group_norm(channels: int, groups: int = 32, eps: float = 1e-5) -> nn.GroupNorm:
    # The largest group count <= ``groups`` that divides ``channels`` (tiny test nets have few channels).
    return nn.GroupNorm(math.gcd(groups, channels), channels, eps=eps)


def zero(module: nn.Module) -> nn.Module:
    for p in module.parameters():
        nn.init.zeros_(p)
    return module


class ResBlock(nn.Module):
    """x + conv(drop(act(norm(conv(act(norm(x))) + W emb)))), with a 1x1 conv on the skip when C changes.

    ``scale_shift``: norm(h) * (1 + s) + b with (s, b) = W emb in place of the bias before the norm (ADM's
    use_scale_shift_norm). ``resample`` "down" / "up": both branches halved (2x2 average) or doubled (nearest) after the
    first norm, so the block changes the side (ADM's resblock_updown)."""

    def __init__(
        self,
        c_in: int,
        c_out: int,
        emb_dim: int,
        dropout: float,
        groups: int,
        eps: float = 1e-5,
        scale_shift: bool = False,
        resample: Literal["down", "up"] | None = None,
    ) -> None:
        super().__init__()
        self.scale_shift, self.resample = scale_shift, resample
        self.norm1, self.conv1 = group_norm(c_in, groups, eps), nn.Conv2d(c_in, c_out, 3, padding=1)
        self.emb = nn.Linear(emb_dim, 2 * c_out if scale_shift else c_out)
        self.norm2, self.drop = group_norm(c_out, groups, eps), nn.Dropout(dropout)
        self.conv2 = zero(nn.Conv2d(c_out, c_out, 3, padding=1))
        self.skip = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def _resampled(self, x: Tensor) -> Tensor:
        if self.resample == "down":
            return F.avg_pool2d(x, 2)  # (B, C, H/2, W/2)
        return F.interpolate(x, scale_factor=2.0, mode="nearest") if self.resample == "up" else x

    def forward(self, x: Tensor, emb: Tensor) -> Tensor:
        h = F.silu(self.norm1(x))
        x, h = self._resampled(x), self._resampled(h)
        h = self.conv1(h)  # (B, C_out, H', W')
        e = self.emb(F.silu(emb))[:, :, None, None]  # the step (and label)
        if self.scale_shift:
            scale, shift = e.chunk(2, dim=1)
            h = self.norm2(h) * (1 + scale) + shift
        else:
            h = self.norm2(h + e)  # a per-channel bias
        h = self.conv2(self.drop(F.silu(h)))
        return self.skip(x) + h


class AttentionBlock(nn.Module):
    """Multi-head self-attention over the H*W positions, residual (``norm=False``: of x unnormalised, as diffusers'
    middle attention with a scale-shift step embedding and no ``attn_norm_num_groups``)."""

    def __init__(self, channels: int, num_heads: int, groups: int, eps: float = 1e-5, norm: bool = True) -> None:
        super().__init__()
        self.norm = group_norm(channels, groups, eps) if norm else nn.Identity()
        self.attn = SelfAttention(channels, num_heads)  # a 1x1 conv is a linear map of each position's channels
        zero(self.attn.proj)

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        tokens = self.norm(x).flatten(2).transpose(1, 2)  # (B, HW, C)
        out = self.attn(tokens).transpose(1, 2).reshape(b, c, h, w)  # (B, C, H, W), channels-last strides
        # x's layout: channels-last strides would carry into the next conv, whose weight would then get a
        # gradient of other strides than the weight (which DDP's gradient buckets warn about) in training.
        layout = torch.contiguous_format if x.is_contiguous() else torch.channels_last
        return x + out.contiguous(memory_format=layout)


class Downsample(nn.Module):
    """A 3x3 conv of stride 2; ``padding=0``: padded by one at the bottom and right only (the DDPM release's, in
    diffusers' Downsample2D), which shifts the sampled grid by half a pixel against ``padding=1``."""

    def __init__(self, channels: int, padding: int = 1) -> None:
        super().__init__()
        if padding not in (0, 1):
            raise ValueError(f"downsample padding {padding}: 1 (both sides) or 0 (bottom and right)")
        self.padding = padding
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=padding)

    def forward(self, x: Tensor, emb: Tensor | None = None) -> Tensor:  # emb: a resampling ResBlock's argument
        if self.padding == 0:
            x = F.pad(x, (0, 1, 0, 1))
        return self.conv(x)  # (B, C, H/2, W/2)


class Upsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: Tensor, emb: Tensor | None = None) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))  # (B, C, 2H, 2W)


class Level(nn.Module):
    """The residual (+ attention) blocks of one resolution, on one side of the U."""

    def __init__(
        self,
        c_ins: list[int],
        c_out: int,
        emb_dim: int,
        dropout: float,
        attention: bool,
        num_heads: int,
        groups: int,
        eps: float = 1e-5,
        scale_shift: bool = False,
    ) -> None:
        super().__init__()
        self.res = nn.ModuleList(ResBlock(c, c_out, emb_dim, dropout, groups, eps, scale_shift) for c in c_ins)
        self.attn = nn.ModuleList(
            AttentionBlock(c_out, num_heads, groups, eps) if attention else nn.Identity() for _ in c_ins
        )


class UNet(nn.Module):
    """DDPM's UNet: (x_t (B, C, H, W), t (B,), y (B,) or None) -> (B, C, H, W) (2C with ``learn_sigma``)."""

    def __init__(
        self,
        in_channels: int = 3,
        image_size: int = 32,
        base_channels: int = 128,
        channel_mults: tuple[int, ...] = (1, 2, 2, 2),
        num_res_blocks: int = 2,
        attention_resolutions: tuple[int, ...] = (16,),
        num_heads: int = 1,
        dropout: float = 0.1,
        num_classes: int = 0,
        norm_groups: int = 32,
        learn_sigma: bool = False,
        channels_last: bool = True,
        time_freq_shift: float = 0.0,
        norm_eps: float = 1e-5,
        downsample_padding: int = 1,
        use_scale_shift_norm: bool = False,
        resblock_updown: bool = False,
        mid_attention_norm: bool = True,
    ) -> None:
        """
        Args:
            in_channels: image channels C (the output has as many).
            image_size: side of the square images it is trained on (sets where attention goes, and sampling).
            base_channels: channels of the first level; level i has base_channels * channel_mults[i].
            channel_mults: per-level channel multipliers; len - 1 downsamplings by 2.
            num_res_blocks: residual blocks per level in the encoder (the decoder has one more, for the skips).
            attention_resolutions: feature-map sides that get self-attention after each residual block.
            num_heads: attention heads.
            dropout: dropout inside residual blocks (0.1 in DDPM's CIFAR-10 model).
            num_classes: K > 0 adds a class embedding (K + 1 rows: label K is the null class); 0: unconditional.
            norm_groups: GroupNorm groups (32 in DDPM; fewer where channels are fewer).
            learn_sigma: also output C channels of variance interpolation (Nichol & Dhariwal 2021), trained by the
                module's hybrid loss and used by the samplers.
            channels_last: run the convolutions on channels-last activations when no gradient is taken (sampling,
                evaluation): oneDNN's and cuDNN's faster layout (8-13% less CPU time per forward here). Training
                keeps the default layout, so weight gradients have their weights' strides (DDP buckets, FSDP2).
            time_freq_shift: the step features' frequencies max_period^(-i / (half - shift)): 0 in DDPM and ADM, and
                diffusers' UNet2DModel's ``freq_shift`` (0 by default, 1 in some of its configs).
            norm_eps: eps of every GroupNorm (1e-5; 1e-6 in the DDPM release, diffusers' ``norm_eps``).
            downsample_padding: 1, or 0 for the DDPM release's downsampling conv (padded at the bottom and right).
            use_scale_shift_norm: the step embedding as a scale and shift after each residual block's second norm
                (ADM), in place of a bias before it.
            resblock_updown: downsample and upsample with residual blocks (ADM), in place of the resampling convs.
            mid_attention_norm: the middle attention normalises its input (False: diffusers' UNet2DModel with
                ``resnet_time_scale_shift: scale_shift`` and no ``attn_norm_num_groups``).
        """
        super().__init__()
        if image_size % 2 ** (len(channel_mults) - 1):
            raise ValueError(f"image_size {image_size} is not divisible by 2^{len(channel_mults) - 1} (channel_mults)")
        self.in_channels, self.image_size, self.num_classes = in_channels, image_size, num_classes
        self.channels_last = channels_last
        self.out_channels = in_channels * (2 if learn_sigma else 1)
        emb_dim = 4 * base_channels
        self.time_embed = TimestepEmbedder(emb_dim, frequency_dim=base_channels, freq_shift=time_freq_shift)
        self.label_embed = LabelEmbedder(num_classes, emb_dim) if num_classes > 0 else None
        self.conv_in = nn.Conv2d(in_channels, base_channels, 3, padding=1)
        block = dict(emb_dim=emb_dim, dropout=dropout, groups=norm_groups, eps=norm_eps)
        block["scale_shift"] = use_scale_shift_norm
        args = dict(block, num_heads=num_heads)

        widths = [base_channels * m for m in channel_mults]
        skips, c, side = [base_channels], base_channels, image_size  # channels of each skip, in order
        self.down, self.downsample = nn.ModuleList(), nn.ModuleList()
        for i, w in enumerate(widths):
            level = Level([c] + [w] * (num_res_blocks - 1), w, attention=side in attention_resolutions, **args)
            self.down.append(level)
            c = w
            skips += [w] * num_res_blocks
            last = i == len(widths) - 1
            if last:
                self.downsample.append(nn.Identity())
            else:
                resblock = ResBlock(c, c, **block, resample="down") if resblock_updown else None
                self.downsample.append(resblock or Downsample(c, downsample_padding))
                skips.append(c)
                side //= 2
        self.mid_res1 = ResBlock(c, c, **block)
        self.mid_attn = AttentionBlock(c, num_heads, norm_groups, norm_eps, norm=mid_attention_norm)
        self.mid_res2 = ResBlock(c, c, **block)
        self.up, self.upsample = nn.ModuleList(), nn.ModuleList()
        for i, w in reversed(list(enumerate(widths))):
            c_ins = []
            for _ in range(num_res_blocks + 1):
                c_ins.append(c + skips.pop())
                c = w
            self.up.append(Level(c_ins, w, attention=side in attention_resolutions, **args))
            if i == 0:
                self.upsample.append(nn.Identity())
            else:
                self.upsample.append(ResBlock(c, c, **block, resample="up") if resblock_updown else Upsample(c))
                side *= 2
        self.norm_out = group_norm(c, norm_groups, norm_eps)
        self.conv_out = zero(nn.Conv2d(c, self.out_channels, 3, padding=1))

    def io_layers(self) -> tuple[str, ...]:
        """The convolutions on the image in and out: Muon takes the hidden filters and matrices only."""
        return ("conv_in", "conv_out")

    @property
    def blocks(self) -> list[nn.Module]:
        """The residual and attention blocks in order: the units FSDP gathers one at a time."""
        return [m for m in self.modules() if isinstance(m, (ResBlock, AttentionBlock))]

    def forward(self, x: Tensor, t: Tensor, y: Tensor | None = None) -> Tensor:
        emb = self.time_embed(t)  # (B, E)
        if self.label_embed is not None:
            if y is None:  # unconditional use of a conditional net: the null class
                y = torch.full((x.shape[0],), self.num_classes, device=x.device, dtype=torch.long)
            emb = emb + self.label_embed(y)
        if self.channels_last and not torch.is_grad_enabled():
            x = x.contiguous(memory_format=torch.channels_last)  # every later activation keeps this layout
        h = self.conv_in(x)  # (B, base, H, W)
        skips = [h]
        for level, down in zip(self.down, self.downsample):
            for res, attn in zip(level.res, level.attn):
                h = attn(res(h, emb))
                skips.append(h)
            if not isinstance(down, nn.Identity):
                h = down(h, emb)
                skips.append(h)
        h = self.mid_res2(self.mid_attn(self.mid_res1(h, emb)), emb)  # (B, C_max, H / 2^(L-1), W / 2^(L-1))
        for level, up in zip(self.up, self.upsample):
            for res, attn in zip(level.res, level.attn):
                h = attn(res(torch.cat([h, skips.pop()], dim=1), emb))
            if not isinstance(up, nn.Identity):
                h = up(h, emb)
        return self.conv_out(F.silu(self.norm_out(h))).contiguous()  # (B, C_out, H, W)
