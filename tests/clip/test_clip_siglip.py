"""Hugging Face SigLIP folders load exactly into the zoo's ``CLIP`` (``zoo.clip.siglip``) with their preprocessing and
tokenizer (``zoo.io.siglip_tokenizer``), or are refused in one line.

References: tiny random ``transformers.SiglipModel`` folders written by ``save_pretrained`` beside a ``SiglipTokenizer``
(a Unigram ``spiece.model`` trained here by sentencepiece) and a ``SiglipImageProcessor``; embeddings, the sigmoid loss
and zero-shot probabilities compared with the model's own, ids with ``AutoTokenizer``'s.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import CONFIGS, cli, output

from zoo.clip.hf import load_hf_clip, load_source_into
from zoo.clip.losses import siglip_loss
from zoo.clip.pretrained import net_config, source_inputs, source_tokenizer
from zoo.clip.templates import OPENAI_IMAGENET_TEMPLATES
from zoo.errors import InputError
from zoo.io.new_inputs import image_transform
from zoo.io.siglip_tokenizer import SiglipTokenizer
from zoo.io.tokenizers import tokenize, tokenizer_from_dict

transformers = pytest.importorskip("transformers")
WORDS = "a photo of the cat dog car red blue green big small picture image hello world this is bad good".split()
# (vision: image, patch (18 = 4 x 4 + 2, as so400m's 384 = 27 x 14 + 6), layers, heads; text: width, layers; hidden_act,
# context; logit scale: 4.8 is above CLIP's clamp at ln 100, as trained SigLIPs' are)
SETTINGS = [
    dict(image=16, patch=8, v_layers=1, heads=2, t_width=32, t_layers=1, act="gelu_pytorch_tanh", ctx=16, scale=2.5),
    dict(image=18, patch=4, v_layers=2, heads=4, t_width=32, t_layers=1, act="gelu", ctx=12, scale=1.0),
    dict(image=16, patch=4, v_layers=1, heads=2, t_width=16, t_layers=2, act="quick_gelu", ctx=20, scale=4.8),
]
HARD = [
    "a photo of a cat.",
    "  Hello\t\n  WORLD  ",
    "naïve café — “quoted” ﬁne &amp; Ａｂｃ",
    "日本語 🙂",
    "x</s>y this </s> is<unk>x",
    "▁a▁b",
    "",
    "DOG!!!,,, cat...",
    "word " * 40,  # past the context: cut, end-of-text kept
    "</s>",
    "a\u3000b\u00a0c İstanbul ΣΑΣ",
    "a </s>b cat <unk> dog cat<unk>dog x</s>  y",  # the added tokens' flags at work
]
# Added tokens' flags (tokenizer_config.json's added_tokens_decoder), which transformers applies to their neighbours.
FLAGGED = {"1": {"rstrip": True}, "2": {"lstrip": True, "single_word": True}}


@pytest.fixture(scope="module")
def spiece(tmp_path_factory) -> Path:
    import sentencepiece as spm

    prefix = tmp_path_factory.mktemp("sp") / "sp"
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 20
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_prefix=str(prefix), vocab_size=40, model_type="unigram", pad_id=0,
        eos_id=1, unk_id=2, bos_id=-1, normalization_rule_name="nmt_nfkc", minloglevel=2,
    )  # fmt: skip
    return prefix.with_suffix(".model")


def siglip_folder(folder: Path, spiece: Path, s: dict, tokenizer: dict | None = None) -> Path:
    """A tiny random ``SiglipModel`` (norms, scale and bias moved off their initial values) with its tokenizer and
    image processor, as ``save_pretrained`` writes them."""
    width = 32
    vision = dict(image_size=s["image"], patch_size=s["patch"], hidden_size=width, intermediate_size=48)
    vision |= dict(num_hidden_layers=s["v_layers"], num_attention_heads=s["heads"], hidden_act=s["act"])
    text = dict(vocab_size=40, hidden_size=s["t_width"], intermediate_size=2 * s["t_width"], projection_size=width)
    text |= dict(num_hidden_layers=s["t_layers"], num_attention_heads=2, hidden_act=s["act"])
    text |= dict(max_position_embeddings=s["ctx"], bos_token_id=None, eos_token_id=1, pad_token_id=1)
    torch.manual_seed(0)
    model = transformers.SiglipModel(transformers.SiglipConfig(text_config=text, vision_config=vision))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(0.3 * torch.randn_like(p))
        model.logit_scale.fill_(s["scale"])
        model.logit_bias.fill_(-3.0)
    model.save_pretrained(folder)
    kwargs = {"model_max_length": s["ctx"]} | (tokenizer or {})
    transformers.SiglipTokenizer(str(spiece), **kwargs).save_pretrained(folder)
    size = {"height": s["image"], "width": s["image"]}
    transformers.SiglipImageProcessor(size=size, image_mean=[0.5, 0.4, 0.3], image_std=[0.2, 0.5, 0.7]).save_pretrained(
        folder
    )
    return folder


def pil_images() -> list:
    from PIL import Image

    rng = np.random.default_rng(0)
    sizes = [(20, 27), (37, 90), (16, 16), (45, 33)]
    return [Image.fromarray(rng.integers(0, 256, (*hw, 3), dtype=np.uint8)) for hw in sizes]


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: f"{s['image']}-{s['patch']}-{s['act']}")
def test_siglip_embeddings_loss_and_probabilities_equal_transformers(tmp_path, spiece, s):
    folder = siglip_folder(tmp_path, spiece, s)
    net = load_hf_clip(folder).eval()
    model = transformers.SiglipModel.from_pretrained(folder).eval()
    processor = transformers.SiglipImageProcessor.from_pretrained(folder)
    pixels = processor(images=pil_images(), return_tensors="pt")["pixel_values"]
    ours_pixels = torch.stack([image_transform(source_inputs(folder, net))[1](im) for im in pil_images()])
    torch.testing.assert_close(ours_pixels, pixels, rtol=0, atol=1e-5)
    texts = ["a photo of a cat", "a big red car!", "Hello world", "dog " * 30]
    ids = tokenize(source_tokenizer(folder, "siglip"), texts, s["ctx"])
    theirs_ids = transformers.AutoTokenizer.from_pretrained(folder)(
        texts, padding="max_length", max_length=s["ctx"], truncation=True, return_tensors="pt"
    )["input_ids"]
    assert torch.equal(ids, theirs_ids)
    with torch.no_grad():
        out = model(input_ids=ids, pixel_values=pixels, return_loss=True)
        img, txt = net.encode_image(pixels), net.encode_text(ids)
        ref_img = F.normalize(model.get_image_features(pixel_values=pixels).pooler_output, dim=-1)
        ref_txt = F.normalize(model.get_text_features(input_ids=ids).pooler_output, dim=-1)
        torch.testing.assert_close(img, ref_img, rtol=0, atol=1e-5)
        torch.testing.assert_close(txt, ref_txt, rtol=0, atol=1e-5)
        logits = net.scale() * img @ txt.T + net.logit_bias
        torch.testing.assert_close(logits, out.logits_per_image, rtol=0, atol=2e-5)
        ours = net(pixels, ids)
        loss = siglip_loss(ours["image_features"], ours["text_features"], ours["logit_scale"], ours["logit_bias"])
        torch.testing.assert_close(loss["loss"], out.loss, rtol=0, atol=1e-5)


def test_siglip_tokenizer_ids_equal_auto_tokenizers_on_hard_strings(tmp_path, spiece):
    for i, settings in enumerate([{}, {"legacy": False}, {"do_lower_case": False}, FLAGGED]):
        folder = tmp_path / str(i)
        kwargs = {} if settings is FLAGGED else settings
        transformers.SiglipTokenizer(str(spiece), model_max_length=16, **kwargs).save_pretrained(folder)
        if settings is FLAGGED:
            _edit(
                folder / "tokenizer_config.json",
                lambda c: [c["added_tokens_decoder"][i].update(f) for i, f in FLAGGED.items()],
            )
        theirs = transformers.AutoTokenizer.from_pretrained(folder)
        ours = SiglipTokenizer.from_folder(folder)
        expected = theirs(HARD, padding="max_length", max_length=16, truncation=True)["input_ids"]
        assert tokenize(ours, HARD, 16).tolist() == expected, settings
        back = tokenizer_from_dict(json.loads(json.dumps(ours.to_dict())))  # as a checkpoint carries it
        assert tokenize(back, HARD, 16).tolist() == expected


def test_a_siglip_folder_zero_shots_through_the_cli_with_sigmoid_probabilities(tmp_path, spiece):
    """docs/clip.md's zero-shot command on a SigLIP folder: each class's probability is transformers' sigmoid of its
    biased logit (the class the mean of its 80 prompts' normalised embeddings), not a softmax."""
    s = SETTINGS[0]
    folder = siglip_folder(tmp_path / "sg", spiece, s)
    images = tmp_path / "images"
    images.mkdir()
    for i, image in enumerate(pil_images()):
        image.save(images / f"{i}.png")
    names = ["cat", "dog", "car"]
    c = cli(
        "predict",
        "--config",
        str(CONFIGS / "clip" / "zeroshot_folder.yaml"),
        f"--model.init_args.init_weights={folder}",
        f"--data.init_args.paths={images}",
        "--data.init_args.class_names=[cat, dog, car]",
        "--trainer.enable_progress_bar=false",
    )
    assert c.model.hparams.loss == "siglip"
    with open(output("predictions.csv")) as f:
        rows = list(csv.DictReader(f))
    model = transformers.SiglipModel.from_pretrained(folder).eval()
    processor = transformers.SiglipImageProcessor.from_pretrained(folder)
    from PIL import Image

    paths = sorted(images.glob("*.png"))
    pixels = processor(images=[Image.open(p).convert("RGB") for p in paths], return_tensors="pt")["pixel_values"]
    prompts = [t.format(c) for c in names for t in OPENAI_IMAGENET_TEMPLATES]
    ids = transformers.AutoTokenizer.from_pretrained(folder)(
        prompts, padding="max_length", max_length=s["ctx"], truncation=True, return_tensors="pt"
    )["input_ids"]
    with torch.no_grad():
        img = F.normalize(model.get_image_features(pixel_values=pixels).pooler_output, dim=-1)
        txt = F.normalize(model.get_text_features(input_ids=ids).pooler_output, dim=-1)
        classes = F.normalize(txt.view(len(names), len(OPENAI_IMAGENET_TEMPLATES), -1).mean(1), dim=-1)
        probs = torch.sigmoid(model.logit_scale.exp() * img @ classes.T + model.logit_bias)
    assert [Path(r["path"]).name for r in rows] == [p.name for p in paths]
    for row, p in zip(rows, probs):
        assert row["class"] == names[int(p.argmax())]
        assert float(row["confidence"]) == pytest.approx(float(p.max()), abs=1e-5)
    assert abs(float(probs.sum(-1)[0]) - 1) > 1e-3  # sigmoids: a softmax would sum to one


@pytest.mark.slow  # a fit through the CLI: the predict test above walks the same load in the suite
def test_the_finetune_preset_trains_a_siglip_folder_with_its_tokenizer_and_sigmoid_loss(tmp_path, spiece):
    """docs/clip.md's fine-tune command on a SigLIP folder: its weights and tokenizer, the sigmoid loss under its own
    bias, texts padded to the tower's context (a shorter one refused)."""
    from PIL import Image

    s = SETTINGS[0]
    folder = siglip_folder(tmp_path / "sg", spiece, s)
    rows = ["image,caption"]
    for i in range(8):
        Image.new("RGB", (24, 20), (30 * i, 100, 255 - 30 * i)).save(tmp_path / f"{i}.png")
        rows.append(f"{i}.png,a {('red', 'blue')[i % 2]} {('cat', 'dog')[i // 4]} on a dark background")
    (tmp_path / "pairs.csv").write_text("\n".join(rows) + "\n")
    args = [
        "--config",
        str(CONFIGS / "clip" / "finetune_csv.yaml"),
        f"--model.init_args.init_weights={folder}",
        f"--data.init_args.pretrained_tokenizer={folder}",
        f"--data.init_args.path={tmp_path / 'pairs.csv'}",
        f"--data.init_args.image_size={s['image']}",
        "--data.init_args.mean=[0.5, 0.4, 0.3]",
        "--data.init_args.std=[0.2, 0.5, 0.7]",
        "--data.init_args.val_fraction=0.5",
        "--data.init_args.batch_size=4",
        "--data.init_args.num_workers=0",
        "--trainer.precision=32-true",
        "--trainer.enable_progress_bar=false",
    ]
    with pytest.raises(ValueError, match=f"context_length={s['ctx']}"):
        cli("validate", *args, "--data.init_args.context_length=8")
    c = cli("fit", *args, f"--data.init_args.context_length={s['ctx']}", "--trainer.fast_dev_run=2")
    assert c.model.hparams.loss == "siglip" and isinstance(c.model.tokenizer, SiglipTokenizer)
    assert torch.isfinite(c.trainer.callback_metrics["val/loss"])
    assert float(c.model.net.logit_bias) == pytest.approx(-3.0, abs=1e-3)  # the folder's bias, two small steps on


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "file, change, named",
    [
        ("config.json", lambda c: c.update(model_type="siglip2"), r"SigLIP 2 .*siglip2"),
        ("config.json", lambda c: c.update(model_type="blip"), r"model_type 'blip'.*'clip'.*'siglip'"),
        ("config.json", lambda c: c["vision_config"].update(vision_use_head=False), r"vision_use_head=False"),
        ("config.json", lambda c: c["text_config"].update(hidden_act="relu"), r"hidden_act='relu'"),
        ("config.json", lambda c: c["vision_config"].update(some_new_field=1), r"vision_config sets some_new_field"),
        ("config.json", lambda c: c["text_config"].update(projection_size=16), r"projection_size 16"),
    ],
)
def test_a_siglip_config_the_zoo_does_not_compute_is_refused_in_one_line(tmp_path, spiece, file, change, named):
    folder = siglip_folder(tmp_path, spiece, SETTINGS[0])
    assert net_config(folder)["init_args"]["text_encoder"]["init_args"]["pool"] == "last"
    _edit(folder / file, change)
    with pytest.raises(InputError, match=named) as err:
        net_config(folder)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "file, change, named",
    [
        ("preprocessor_config.json", lambda c: c.update(do_center_crop=True), r"do_center_crop"),
        ("preprocessor_config.json", lambda c: c.update(resample=0), r"resample=0"),
        ("preprocessor_config.json", lambda c: c.update(size={"shortest_edge": 16}), r"size="),
        ("tokenizer_config.json", lambda c: c.update(pad_token="<unk>"), r"pad_token '<unk>'"),
        ("tokenizer_config.json", lambda c: c.update(padding_side="left"), r"padding_side='left'"),
        ("tokenizer_config.json", lambda c: c.update(tokenizer_class="T5Tokenizer"), r"tokenizer_class='T5Token"),
        ("spiece.model", None, r"without spiece\.model.*copy spiece\.model"),
    ],
)
def test_siglip_preprocessing_or_tokenizer_the_zoo_does_not_reproduce_is_refused(tmp_path, spiece, file, change, named):
    folder = siglip_folder(tmp_path, spiece, SETTINGS[0])
    net = load_hf_clip(folder)
    if change is None:
        (folder / file).unlink()
    else:
        _edit(folder / file, change)
    with pytest.raises(InputError, match=named) as err:
        source_inputs(folder, net) if file.startswith("pre") else source_tokenizer(folder, "siglip")
    assert "\n" not in str(err.value)


def test_a_siglip_tensor_the_towers_have_no_place_for_is_refused_by_name(tmp_path, spiece):
    from safetensors.torch import load_file, save_file

    folder = siglip_folder(tmp_path, spiece, SETTINGS[0])
    net = load_hf_clip(folder)
    sd = load_file(folder / "model.safetensors")
    save_file(sd | {"vision_model.head.extra.weight": torch.zeros(2)}, folder / "model.safetensors")
    with pytest.raises(InputError, match=r"no place for: vision_model\.head\.extra\.weight"):
        load_source_into(net, folder)
