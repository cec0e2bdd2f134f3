"""CLIP's evaluation: cross-modal retrieval recall@k and zero-shot classification (Radford et al. 2021).

Retrieval follows the COCO / Flickr30k protocol (Karpathy & Fei-Fei 2015; Radford et al. 2021, Table 13):
the gallery holds each **unique image once** and every caption row. image -> text: an image is retrieved
at k when any of its own captions is among its k most similar captions; text -> image: a caption is
retrieved at k when its image is among its k most similar images. recall@k is the share of queries with
a hit anywhere in the top k (not at rank k exactly). Captions with identical text embed identically, so
a caption is also counted as a hit for every image that carries the same text (the generated shapes
repeat captions); with distinct caption texts this is exactly the standard protocol.

Zero-shot (sec. 3.1.4, prompt ensembling): a class's prompt embeddings are normalised, averaged and
normalised again, so that every class row has unit norm and no class wins by the length of its mean.

Notation: I unique images, C caption rows, Q queries, K classes, P prompts per class, E embedding dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

RECALL_AT = (1, 5, 10)


def recall_at_k(
    similarity: Tensor,
    query_groups: Tensor,
    item_groups: Tensor,
    relevant: Tensor | None = None,
    ks=RECALL_AT,
    chunk: int = 1024,
) -> dict[int, Tensor]:
    """Share of queries (rows of the (Q, N) similarity) with a relevant item among their k most similar.

    A query of group q and an item of group g are relevant to each other when (q, g) is a row of the
    (R, 2) ``relevant`` pairs, or, without them, when q == g.
    """
    k_max = min(max(ks), similarity.shape[1])
    n_items = int(item_groups.max()) + 1 if len(item_groups) else 1
    keys = None if relevant is None else torch.unique(relevant[:, 0] * n_items + relevant[:, 1])
    hits = {k: 0 for k in ks}
    for a in range(0, similarity.shape[0], chunk):
        top = similarity[a : a + chunk].topk(k_max, dim=1).indices  # (chunk, k_max), best first
        q = query_groups[a : a + chunk, None]
        match = item_groups[top] == q if keys is None else torch.isin(q * n_items + item_groups[top], keys)
        for k in ks:
            hits[k] += int(match[:, :k].any(dim=1).sum())  # any hit within the first k
    return {k: torch.tensor(h / similarity.shape[0]) for k, h in hits.items()}


def first_rows(ids: Tensor) -> tuple[Tensor, Tensor]:
    """For (N,) ids: the row of each unique id's first occurrence (U,) and each row's unique index (N,)."""
    _, inverse = torch.unique(ids, return_inverse=True)
    rows = torch.arange(len(ids), device=ids.device)
    first = torch.full((int(inverse.max()) + 1 if len(ids) else 0,), len(ids), dtype=torch.long, device=ids.device)
    return first.scatter_reduce(0, inverse, rows, reduce="amin"), inverse


def retrieval_recall(
    images: Tensor, texts: Tensor, image_ids: Tensor, caption_ids: Tensor, ks=RECALL_AT
) -> dict[str, Tensor]:
    """i2t and t2i recall@k over unique images, and their mean recall@1 (``recall_1``).

    Args:
        images: (C, E) normalised image features, one row per caption row (an image repeats for each caption).
        texts: (C, E) normalised caption features.
        image_ids: (C,) equal for the rows of one image (file).
        caption_ids: (C,) equal for equal caption texts.
    """
    first, image_of = first_rows(image_ids)  # (I,) a row per unique image; (C,) each caption's image
    sim = images[first].float() @ texts.float().T  # (I, C)
    pairs = torch.stack([image_of, caption_ids], dim=1)  # (C, 2): (image, caption text) pairs of the data
    images_i = torch.arange(len(first), device=sim.device)
    i2t = recall_at_k(sim, images_i, caption_ids, pairs, ks)
    t2i = recall_at_k(sim.T, caption_ids, images_i, pairs.flip(1), ks)
    out = {f"i2t_recall_{k}": v for k, v in i2t.items()} | {f"t2i_recall_{k}": v for k, v in t2i.items()}
    out["recall_1"] = (i2t[ks[0]] + t2i[ks[0]]) / 2
    return out


def zeroshot_weights(model, prompt_ids: Tensor, num_classes: int, chunk: int = 1024) -> Tensor:
    """(K, E) classifier of a ``CLIP``: per class, the normalised mean of its P normalised prompt embeddings.

    ``prompt_ids`` (K x P, T) are class-major.
    """
    emb = torch.cat([model.encode_text(prompt_ids[a : a + chunk]) for a in range(0, len(prompt_ids), chunk)])
    return F.normalize(emb.view(num_classes, -1, emb.shape[-1]).mean(dim=1), dim=-1)


def zeroshot_accuracy(images: Tensor, labels: Tensor, weights: Tensor) -> dict[str, Tensor]:
    """Top-1 accuracy of (N, E) image features against the (K, E) classifier, and top-5 when K > 5.

    With five classes or fewer every image is in its top 5: the number would say nothing, so it is left out.
    """
    logits = images.float() @ weights.float().T  # (N, K)
    out = {"zeroshot_acc": (logits.argmax(-1) == labels).float().mean()}
    if weights.shape[0] > 5:
        out["zeroshot_acc_top5"] = (logits.topk(5, dim=-1).indices == labels[:, None]).any(-1).float().mean()
    return out
