"""CLIP family units: towers, losses (one process and two), logit-scale clamp, metrics, caption data, weights."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT

from datamodules.captions import CaptionDataModule, read_pairs
from zoo.clip import CLIP, ContrastiveModule, TextTransformer, VisionTransformer
from zoo.clip.losses import infonce_loss, siglip_loss
from zoo.clip.metrics import recall_at_k, retrieval_recall, zeroshot_accuracy, zeroshot_weights
from zoo.cnn import ConvNet
from zoo.errors import InputError
from zoo.io.tokenizers import ByteTokenizer, tokenize
from zoo.train.optim import AdamWCosine, param_groups

E = 16


pytestmark = pytest.mark.usefixtures("one_thread")


def _text(**kw) -> TextTransformer:
    return TextTransformer(
        **{"vocab_size": 257, "context_length": 12, "width": 16, "layers": 1, "heads": 2, "embed_dim": E, **kw}
    )


IMAGE_TOWERS = {
    "vit-cls": lambda: VisionTransformer(image_size=16, patch_size=4, width=16, layers=2, heads=2, embed_dim=E),
    "vit-attention-pool": lambda: VisionTransformer(
        image_size=16, patch_size=8, width=16, layers=1, heads=2, embed_dim=E, pool="attention", act="quick_gelu"
    ),
    "convnet": lambda: ConvNet(num_classes=E, in_channels=3, width=8, depth=2),
}


def _clip(tower: str = "vit-cls", **kw) -> CLIP:
    torch.manual_seed(0)
    return CLIP(IMAGE_TOWERS[tower](), _text(), **kw)


def _ids(b: int, t: int = 12, eot: int = 256) -> torch.Tensor:
    ids = torch.randint(0, 256, (b, t))
    ids[:, t // 2] = eot
    return ids


@pytest.mark.parametrize("tower", IMAGE_TOWERS)
def test_every_tower_pair_embeds_normalised_and_backpropagates(tower):
    net = _clip(tower, init_logit_bias=-10.0)
    out = net(torch.randn(4, 3, 16, 16), _ids(4))
    for key in ("image_features", "text_features"):
        assert out[key].shape == (4, E)
        torch.testing.assert_close(out[key].norm(dim=-1), torch.ones(4))
    loss = infonce_loss(out["image_features"], out["text_features"], out["logit_scale"])["loss"]
    loss = (
        loss + siglip_loss(out["image_features"], out["text_features"], out["logit_scale"], out["logit_bias"])["loss"]
    )
    loss.backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_mismatched_embedding_dims_are_named():
    with pytest.raises(ValueError, match="embed_dim"):
        CLIP(IMAGE_TOWERS["vit-cls"](), _text(embed_dim=E + 1))


def test_text_feature_is_read_at_the_first_end_of_text_and_ignores_what_follows():
    tower = _text().eval()
    ids = _ids(3)
    changed = ids.clone()
    changed[:, 6 + 1 :] = torch.randint(0, 257, (3, 12 - 7))  # after the EOT at position 6: padding, a second EOT
    with torch.no_grad():
        torch.testing.assert_close(tower(changed), tower(ids))
        before = ids.clone()
        before[:, 2] = (ids[:, 2] + 1) % 256
        assert not torch.allclose(tower(before), tower(ids))
    assert tower.eot_positions(torch.tensor([[1, 2, 3, 4]])).item() == 3  # no EOT: the last position


def test_parameter_groups_cover_every_parameter_once_and_spare_embeddings_and_scale():
    net = _clip("vit-attention-pool", init_logit_bias=-10.0)
    groups = param_groups(net, 0.2)
    ids = [id(p) for g in groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in net.parameters()) and len(ids) == len(set(ids))
    no_decay = {id(p) for p in groups[1]["params"]}
    names = dict(net.named_parameters())
    for name in (
        "logit_scale",
        "logit_bias",
        "image_encoder.positional_embedding",
        "image_encoder.attn_pool.query",
        "text_encoder.positional_embedding",
        "text_encoder.token_embedding.weight",
    ):
        assert id(names[name]) in no_decay, name
    assert id(names["image_encoder.conv1.weight"]) not in no_decay


def test_infonce_is_symmetric_in_its_two_directions():
    g = torch.Generator().manual_seed(0)
    img, txt = (F.normalize(torch.randn(6, E, generator=g), dim=-1) for _ in range(2))
    scale = torch.tensor(10.0)
    a, b = infonce_loss(img, txt, scale), infonce_loss(txt, img, scale)
    torch.testing.assert_close(a["loss"], b["loss"])
    torch.testing.assert_close(a["loss_i2t"], b["loss_t2i"])
    torch.testing.assert_close(a["loss_t2i"], b["loss_i2t"])
    # The batch order does not matter, only the pairing.
    perm = torch.randperm(6, generator=g)
    torch.testing.assert_close(infonce_loss(img[perm], txt[perm], scale)["loss"], a["loss"])


def test_losses_go_to_zero_for_matched_orthogonal_pairs_at_a_large_scale():
    feats = torch.eye(8, E)  # 8 orthonormal pairs: cosine 1 with the partner, 0 with everything else
    small, large = torch.tensor(1.0), torch.tensor(100.0)
    assert infonce_loss(feats, feats, large)["loss"] < 1e-6 < infonce_loss(feats, feats, small)["loss"]
    # Sigmoid: the bias puts the decision boundary half-way between cosine 0 and 1.
    assert siglip_loss(feats, feats, large, -large / 2)["loss"] < 1e-6
    assert siglip_loss(feats, feats, small, -small / 2)["loss"] > 1.0
    swapped = feats[torch.roll(torch.arange(8), 1)]  # every image paired with the wrong caption
    assert infonce_loss(feats, swapped, large)["loss"] > 50


def test_logit_scale_never_exceeds_its_clamp():
    net = _clip()
    assert net.scale().item() == pytest.approx(1 / 0.07, rel=1e-5)
    module = ContrastiveModule(net, optimizer=AdamWCosine(lr=1.0))
    opt = torch.optim.SGD([net.logit_scale], lr=5.0)
    x, ids = torch.randn(6, 3, 16, 16), _ids(6)
    for _ in range(10):
        out = net(x, ids)
        assert out["logit_scale"].item() <= 100.0 + 1e-4
        opt.zero_grad()
        (-out["logit_scale"]).backward()  # a push upwards that one step carries far past the clamp
        opt.step()
        module.on_train_batch_end(None, None, 0)  # the module clamps after every optimizer step
        assert net.logit_scale.item() <= math.log(100) + 1e-6
    assert net.logit_scale.item() == pytest.approx(math.log(100))


def test_the_forward_clamps_a_logit_scale_past_its_clamp_and_passes_it_no_gradient():
    # The module clamps the parameter after every step, which hides the forward's own clamp: set it past, as a
    # checkpoint or a step between the optimizer and the module's hook could leave it.
    net = _clip()
    with torch.no_grad():
        net.logit_scale.fill_(math.log(1000.0))
    out = net(torch.randn(6, 3, 16, 16), _ids(6))
    assert out["logit_scale"].item() == pytest.approx(100.0)
    out["logit_scale"].sum().backward()
    assert net.logit_scale.grad.abs().max().item() == 0.0


def test_two_processes_give_the_full_batch_loss_and_gradients(tmp_path):
    out = tmp_path / "ranks.pt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "scripts" / "clip_loss_ranks.py"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = torch.load(out)
    for kind in ("infonce", "siglip"):
        ranks, single = result["ranks"][kind], result["single"][kind]
        torch.testing.assert_close(ranks["loss"], single["loss"], rtol=1e-10, atol=1e-10)
        assert single["grads"].keys() == ranks["grads"].keys()
        for name, g in single["grads"].items():
            if g.abs().max() > 0:  # every parameter the loss reaches: both towers and the scale
                torch.testing.assert_close(ranks["grads"][name], g, rtol=1e-9, atol=1e-10, msg=f"{kind}: {name}")
        # Local losses alone (no gather) would see 3 negatives instead of 7: a different loss.
        assert ranks["grads"]["image_encoder.conv1.weight"].abs().max() > 0


def test_recall_counts_any_item_with_the_query_caption():
    sim = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.0], [0.0, 0.2, 0.3]])
    groups = torch.tensor([0, 1, 1])  # items 1 and 2 share a caption
    r = recall_at_k(sim, groups, groups, ks=(1, 2))
    assert r[1].item() == pytest.approx(1 / 3)  # query 2 finds item 2 (its own); 0 and 1 miss at k=1
    assert r[2].item() == pytest.approx(1.0)
    # Query 0 picks item 1 first, which carries another caption; with group 1 it would count.
    assert recall_at_k(sim, torch.tensor([1, 1, 1]), groups, ks=(1,))[1].item() == pytest.approx(2 / 3)


# Image x caption similarities, 3 images with 2 captions each (columns 0-1, 2-3, 4-5); no ties in a row or
# column. Rank of the first hit, image -> text: image 0 at 2 (c2 first), image 1 at 1, image 2 at 5.
# Text -> image, by column: c0 2, c1 2, c2 3, c3 1, c4 2, c5 1.
SIM = torch.tensor(
    [[0.80, 0.60, 0.90, 0.70, 0.50, 0.40], [0.10, 0.20, 0.30, 0.95, 0.05, 0.15], [0.85, 0.75, 0.65, 0.55, 0.35, 0.45]]
)
IMAGE_OF = torch.tensor([0, 0, 1, 1, 2, 2])


def _rows(sim: torch.Tensor, image_of: torch.Tensor, order: torch.Tensor):
    """Per-row (image, text) features whose (unique image x caption) similarity is ``sim``, rows in ``order``."""
    images = torch.eye(sim.shape[0])[image_of]  # one-hot: image i's features pick row i of sim
    return images[order], sim.T[order], image_of[order]


def test_recall_on_a_hand_built_matrix_counts_any_hit_in_the_top_k_both_ways():
    order = torch.tensor([3, 0, 5, 1, 4, 2])  # rows arrive in any order
    images, texts, image_ids = _rows(SIM, IMAGE_OF, order)
    r = retrieval_recall(images, texts, image_ids + 10, torch.arange(6)[order], ks=(1, 2, 3, 5))
    got = {k: round(v.item(), 4) for k, v in r.items()}
    assert got == {
        "i2t_recall_1": round(1 / 3, 4),
        "i2t_recall_2": round(2 / 3, 4),
        "i2t_recall_3": round(2 / 3, 4),
        "i2t_recall_5": 1.0,
        "t2i_recall_1": round(2 / 6, 4),
        "t2i_recall_2": round(5 / 6, 4),
        "t2i_recall_3": 1.0,
        "t2i_recall_5": 1.0,
        "recall_1": round(1 / 3, 4),
    }


def test_near_perfect_model_with_five_captions_per_image_recalls_everything():
    torch.manual_seed(0)
    n_images, per_image = 8, 5
    image_feats = F.normalize(torch.randn(n_images, E), dim=-1)
    image_of = torch.arange(n_images).repeat_interleave(per_image)  # COCO's layout: 5 caption rows per image
    texts = F.normalize(image_feats[image_of] + 0.05 * torch.randn(len(image_of), E), dim=-1)
    order = torch.randperm(len(image_of))
    r = retrieval_recall(image_feats[image_of][order], texts[order], image_of[order], torch.arange(len(image_of)))
    assert all(v.item() == 1.0 for v in r.values()), r  # one row per caption would score i2t recall@1 ~ 1/5


def test_captions_of_the_same_text_count_for_every_image_that_carries_it():
    # Rows 0 and 1 (images 0 and 1) are both "a red circle" (caption id 7); the shapes captions repeat so.
    sim = torch.tensor([[0.2, 0.1, 0.9], [0.9, 0.8, 0.1], [0.1, 0.3, 0.0]])  # (images 0-2) x (rows 0-2)
    images, texts, image_ids = _rows(sim, torch.tensor([0, 1, 2]), torch.arange(3))
    r = retrieval_recall(images, texts, image_ids, torch.tensor([7, 7, 3]), ks=(1,))
    # Row 0 finds image 1, which carries its text: a hit, as is row 1; row 2 finds image 0: a miss.
    assert r["t2i_recall_1"].item() == pytest.approx(2 / 3)
    # Image 1 finds row 0, its own text on another image: a hit; images 0 and 2 find the other text: misses.
    assert r["i2t_recall_1"].item() == pytest.approx(1 / 3)


def test_zeroshot_classes_are_renormalised_after_averaging_their_prompts():
    # Class 0's two prompts disagree (their mean is short), class 1's agree: without the second
    # normalisation the image, nearer class 0 in angle, would go to class 1 on length alone.
    table = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.6, 0.8], [0.0, 0.6, 0.8]])

    class Prompts:
        def encode_text(self, ids):
            return table[ids[:, 0]]

    weights = zeroshot_weights(Prompts(), torch.arange(4)[:, None], num_classes=2)  # class-major prompts
    torch.testing.assert_close(weights.norm(dim=-1), torch.ones(2))
    image = F.normalize(torch.tensor([[0.6, 0.75, 0.55]]), dim=-1)
    assert zeroshot_accuracy(image, torch.tensor([0]), weights)["zeroshot_acc"].item() == 1.0


def test_top5_accuracy_only_with_more_than_five_classes():
    five = zeroshot_accuracy(torch.eye(5)[[0, 1, 2]], torch.tensor([0, 1, 4]), torch.eye(5))
    assert set(five) == {"zeroshot_acc"} and five["zeroshot_acc"].item() == pytest.approx(2 / 3)
    # Class c scores 1 for image c and -0.01 c otherwise: image 2 ranks class 5 last and class 0 second.
    weights = torch.eye(6) - 0.01 * torch.arange(6.0)[:, None]
    six = zeroshot_accuracy(torch.eye(6)[[0, 1, 2, 2]], torch.tensor([0, 1, 5, 0]), weights)
    assert six["zeroshot_acc"].item() == 0.5 and six["zeroshot_acc_top5"].item() == 0.75


def test_tokenize_ends_with_end_of_text_and_pads_with_it():
    ids = tokenize(ByteTokenizer(), ["ab", "x" * 20], context_length=6)
    assert ids[0].tolist() == [97, 98, 256, 256, 256, 256]
    assert ids[1].tolist() == [120] * 5 + [256]  # cut to T - 1, then end-of-text


def test_shapes_captions_data_has_prompts_labels_and_a_held_out_split():
    dm = CaptionDataModule(image_size=16, context_length=48, num_train=64, num_val=32, batch_size=16)
    assert dm.class_names[:2] == ["circle", "square"]
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["image"].shape == (16, 3, 16, 16) and batch["text"].shape == (16, 48)
    assert (batch["text"] == 256).any(dim=1).all()  # every caption fits, with its end-of-text
    names, prompts = dm.zeroshot_prompts()
    assert prompts.shape == (6 * len(dm.templates), 48)
    assert ByteTokenizer().decode(prompts[0].tolist()) == dm.templates[0].format("circle")
    assert len(dm.val_set) == 32 and dm.val_set.captions[0] not in ("",)
    assert set(dm.val_set.labels.tolist()) <= set(range(6))


def _write_images(folder, n: int):
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.new("RGB", (20, 24), (40 * i, 0, 255 - 40 * i)).save(folder / f"{i}.png")


def test_csv_jsonl_and_folder_sources_read_the_same_pairs(tmp_path):
    _write_images(tmp_path / "img", 5)
    captions = [f"picture number {i}" for i in range(5)]
    labels = ["red" if i % 2 else "blue" for i in range(5)]
    rows = [{"filepath": f"img/{i}.png", "text": c, "label": lab} for i, (c, lab) in enumerate(zip(captions, labels))]
    (tmp_path / "pairs.csv").write_text("filepath,text,label\n" + "".join(",".join(r.values()) + "\n" for r in rows))
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for i, c in enumerate(captions):
        (tmp_path / "img" / f"{i}.txt").write_text(c + "\n")
    a = read_pairs(tmp_path / "pairs.csv", "filepath", "text", "label")
    b = read_pairs(tmp_path / "pairs.jsonl", "filepath", "text", "label")
    c = read_pairs(tmp_path / "img", "image", "caption", None)
    assert a == b and a["captions"] == c["captions"] == captions and a["images"] == c["images"]
    with pytest.raises(InputError, match="caption_column"):
        read_pairs(tmp_path / "pairs.csv", "filepath", "caption", None)

    dm = CaptionDataModule(
        path=str(tmp_path / "pairs.csv"),
        image_column="filepath",
        caption_column="text",
        label_column="label",
        image_size=16,
        context_length=24,
        val_fraction=0.4,
        batch_size=2,
    )
    dm.setup()
    assert dm.class_names == ["blue", "red"] and len(dm.train_set) == 3 and len(dm.val_set) == 2
    batch = next(iter(dm.val_dataloader()))
    label_of = {str(tmp_path / "img" / f"{i}.png"): dm.class_names.index(lab) for i, lab in enumerate(labels)}
    assert batch["image"].shape == (2, 3, 16, 16) and batch["label"].tolist() == [label_of[p] for p in batch["path"]]
    assert len(next(iter(dm.train_dataloader()))["text"]) == 2  # 3 training pairs, the last partial batch dropped


def test_five_captions_per_image_share_an_image_id_and_a_split(tmp_path):
    _write_images(tmp_path / "img", 6)
    rows = "".join(f"img/{i}.png,caption {c} of image {i}\n" for c in range(5) for i in range(6))  # images interleaved
    (tmp_path / "coco.csv").write_text("image,caption\n" + rows)
    dm = CaptionDataModule(
        path=str(tmp_path / "coco.csv"), image_size=16, context_length=24, val_fraction=0.34, batch_size=30
    )
    dm.setup()
    train, val = (set(map(str, d.images)) for d in (dm.train_set, dm.val_set))
    assert len(val) == 2 and len(train) == 4 and not train & val  # whole images held out ...
    assert len(dm.val_set) == 10 and len(dm.train_set) == 20  # ... with all five captions each
    batch = next(iter(dm.val_dataloader()))
    image_of = dict(zip(batch["path"], batch["image_id"].tolist()))
    assert len(set(image_of.values())) == 2 and all((batch["image_id"] == image_of[p]).sum() == 5 for p in image_of)
    assert len(set(batch["caption_id"].tolist())) == 10


def test_missing_caption_file_fails_at_setup_naming_the_flag():
    dm = CaptionDataModule(path="nowhere.csv")  # instantiates (configs are checked without the user's data)
    with pytest.raises(FileNotFoundError, match=r"data\.init_args\.path"):
        dm.setup()


def test_hf_clip_weights_reproduce_transformers_embeddings(tmp_path):
    transformers = pytest.importorskip("transformers")
    from zoo.clip.hf import load_hf_clip, openai_to_zoo, zoo_to_openai

    torch.manual_seed(0)
    config = transformers.CLIPConfig(
        text_config=dict(
            vocab_size=99,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=16,
            eos_token_id=98,
            bos_token_id=97,
            pad_token_id=1,
        ),
        vision_config=dict(
            image_size=16,
            patch_size=4,
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
        ),
        projection_dim=24,
    )
    reference = transformers.CLIPModel(config).eval()
    reference.save_pretrained(tmp_path / "hf")
    net = load_hf_clip(tmp_path / "hf").eval()
    images = torch.randn(3, 3, 16, 16)
    ids = torch.randint(0, 98, (3, 16))
    ids[0, 5], ids[1, 15], ids[2, 9], ids[2, 12] = 98, 98, 98, 98  # the first EOT counts
    with torch.no_grad():
        ref_img = reference.get_image_features(pixel_values=images)
        ref_txt = reference.get_text_features(input_ids=ids)
        ref_img, ref_txt = (getattr(r, "pooler_output", r) for r in (ref_img, ref_txt))  # a tensor in transformers 4
        torch.testing.assert_close(net.encode_image(images), F.normalize(ref_img, dim=-1), rtol=0, atol=1e-4)
        torch.testing.assert_close(net.encode_text(ids), F.normalize(ref_txt, dim=-1), rtol=0, atol=1e-4)
    torch.testing.assert_close(net.logit_scale, reference.logit_scale.reshape(1))
    # OpenAI/open_clip layout: a round trip through its names is the identity.
    sd = net.state_dict()
    assert {k: v for k, v in openai_to_zoo(zoo_to_openai(sd)).items()}.keys() == sd.keys()
    for k, v in openai_to_zoo(zoo_to_openai(sd)).items():
        assert torch.equal(v, sd[k]), k


def test_bpe_tokenizer_is_trained_on_the_training_captions():
    dm = CaptionDataModule(
        image_size=16, context_length=24, num_train=200, num_val=20, tokenizer="bpe", bpe_vocab_size=300
    )
    dm.setup()
    tok = dm.tokenizer
    assert 256 < tok.vocab_size <= 300
    ids = dm.train_set.text
    assert (ids == tok.eos_id).any(dim=1).all() and (ids[:, :-1] != tok.eos_id).sum(
        1
    ).float().mean() < 16  # merges shorten
    assert tok.decode(ids[0].tolist()) == dm.train_set.captions[0]
