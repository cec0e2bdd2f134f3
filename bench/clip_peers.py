"""CLIP against open_clip, in one process, arms alternating.

One optimizer step of a small CLIP (ViT: 32 px images, 4 px patches, width 128, 2 layers, 4 heads;
text: byte vocabulary 257, context 32, width 128, 2 layers, 4 heads; embedding 128): forward of both towers,
the symmetric InfoNCE loss (the same function on both arms' features, ``zoo.clip.losses.infonce_loss``),
backward, AdamW (the zoo's fused AdamWCosine; open_clip's torch.optim.AdamW defaults). The zoo's
``CLIP(VisionTransformer, TextTransformer)`` against ``open_clip.CLIP`` of the same shape; fp32 and bf16
autocast. Ratio zoo / open_clip, below 1 the zoo is faster; issue 16's target 0.9.
open_clip missing: `pip install -e ".[bench]"`.

    python bench/clip_peers.py            # ~1 min on a 2-core CPU, 1 thread
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench._common import RATIO_HEADERS, add_clock_arg, alternate, missing, peer_header, ratio_row, table
from zoo.clip import CLIP, TextTransformer, VisionTransformer
from zoo.clip.losses import infonce_loss
from zoo.train.optim import AdamWCosine

try:
    import open_clip
except ImportError:
    open_clip = None

S, P, W, L, HEADS, V, CTX, E = 32, 4, 128, 2, 4, 257, 32, 128


def zoo_clip() -> CLIP:
    return CLIP(
        VisionTransformer(image_size=S, patch_size=P, width=W, layers=L, heads=HEADS, embed_dim=E),
        TextTransformer(vocab_size=V, context_length=CTX, width=W, layers=L, heads=HEADS, embed_dim=E),
    )


def peer_clip():
    vision = open_clip.CLIPVisionCfg(layers=L, width=W, head_width=W // HEADS, patch_size=P, image_size=S)
    text = open_clip.CLIPTextCfg(context_length=CTX, vocab_size=V, width=W, heads=HEADS, layers=L)
    return open_clip.CLIP(E, vision, text)


def step_fn(net, opt, images, ids, bf16: bool, zoo: bool):
    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            if zoo:
                out = net(images, ids)
                img, txt, scale = out["image_features"], out["text_features"], out["logit_scale"]
            else:
                img, txt, scale = net(images, ids)[:3]
        loss = infonce_loss(img.float(), txt.float(), scale, gather=False)["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    add_clock_arg(ap)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    peer_header("CLIP: zoo vs open_clip", args.threads, args.clock)
    if open_clip is None:
        missing("open_clip", 'pip install -e ".[bench]"')
        return
    torch.manual_seed(0)
    zoo, peer = zoo_clip(), peer_clip()
    counts = [sum(p.numel() for p in m.parameters()) for m in (zoo, peer)]
    print(f"parameters: zoo {counts[0]:,}, open_clip {counts[1]:,}")
    images, ids = torch.randn(args.batch, 3, S, S), torch.randint(0, V - 1, (args.batch, CTX))
    ids[:, -1] = V - 1  # an end-of-text token in every caption (the zoo reads features there, open_clip at argmax)
    rows = []
    for bf16 in (False, True):
        arms = {
            "zoo": step_fn(zoo, AdamWCosine(lr=1e-4).configure(zoo, None)["optimizer"], images, ids, bf16, True),
            "open_clip": step_fn(peer, torch.optim.AdamW(peer.parameters(), lr=1e-4), images, ids, bf16, False),
        }
        tag = f"CLIP ViT 32px/4 + text, width {W}, 2+2 layers, B{args.batch} {'bf16 autocast' if bf16 else 'fp32'}"
        rows.append(ratio_row(tag, alternate(arms, args.rounds), "zoo", "open_clip", 0.9))
    print(table(RATIO_HEADERS, rows))


if __name__ == "__main__":
    main()
