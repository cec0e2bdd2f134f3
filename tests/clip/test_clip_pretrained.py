"""Imported CLIP weights arrive with their preprocessing, prompts and tokenizer (``zoo.clip.pretrained``).

References: ``transformers.CLIPImageProcessor`` for a Hugging Face folder and open_clip's own transform
(``create_model_and_transforms(...)[2]``) for an open_clip folder, on PIL images of odd sizes (the centre crop's
offset rounds one way in transformers and the other in torchvision); and a zero-shot prediction through ``cli.py``
recomputed with ``transformers.CLIPModel``, OpenAI's 80 templates and the folder's tokenizer.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import CONFIGS, cli, output

from zoo.clip import CLIP, TextTransformer, VisionTransformer
from zoo.clip.hf import load_source_into, zoo_yaml
from zoo.clip.pretrained import OPENAI_MEAN, OPENAI_STD, source_inputs, source_tokenizer
from zoo.clip.templates import OPENAI_IMAGENET_TEMPLATES
from zoo.errors import InputError
from zoo.io.new_inputs import image_transform
from zoo.io.tokenizers import BPETokenizer, tokenize

transformers = pytest.importorskip("transformers")
ZEROSHOT = str(CONFIGS / "clip" / "zeroshot_folder.yaml")
# Sides whose margin over the crop is odd, even, 3 mod 4 (the rounding cases), and a grey image.
SIZES = [(20, 27), (37, 90), (64, 64), (23, 16), (45, 33)]


def pil_images(mode: str = "RGB") -> list:
    from PIL import Image

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (*hw, 3), dtype=np.uint8)) for hw in SIZES]
    return images + [Image.fromarray(rng.integers(0, 256, (30, 41), dtype=np.uint8)).convert(mode)]


def hf_folder(folder: Path, processor: dict | None = None) -> Path:
    """A tiny random ``CLIPModel`` saved with a BPE tokenizer (and a ``CLIPImageProcessor`` when given)."""
    captions = [f"a {c} {s}" for c in ("red", "blue", "green") for s in ("cat", "dog", "car")]
    tok = BPETokenizer.train(captions * 5, vocab_size=300)
    tok.save(folder)
    torch.manual_seed(0)
    eos = tok.eos_id
    text = dict(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    text |= dict(num_attention_heads=2, max_position_embeddings=24, eos_token_id=eos, bos_token_id=eos)
    vision = dict(image_size=16, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    config = transformers.CLIPConfig(
        text_config=text | {"pad_token_id": eos}, vision_config=vision | {"num_attention_heads": 2}, projection_dim=16
    )
    transformers.CLIPModel(config).save_pretrained(folder)
    if processor is not None:
        transformers.CLIPImageProcessor(**processor).save_pretrained(folder)
    return folder


def zoo_net(folder: Path) -> CLIP:
    block = yaml.safe_load(zoo_yaml(folder))["net"]["init_args"]
    towers = (
        VisionTransformer(**block["image_encoder"]["init_args"]),
        TextTransformer(**block["text_encoder"]["init_args"]),
    )
    return CLIP(*towers, init_logit_scale=block["init_logit_scale"])


@pytest.mark.parametrize("resize", [16, 20])
def test_hf_folder_reads_images_as_clip_image_processor_does(tmp_path, resize):
    settings = dict(size={"shortest_edge": resize}, crop_size={"height": 16, "width": 16}, image_mean=[0.5, 0.4, 0.3])
    folder = hf_folder(tmp_path, settings)
    inputs = source_inputs(folder, zoo_net(folder))
    assert inputs["interpolation"] == "bicubic" and inputs["mean"] == [0.5, 0.4, 0.3]
    mode, transform = image_transform(inputs)
    processor = transformers.CLIPImageProcessor.from_pretrained(folder)
    for image in pil_images():
        theirs = processor(images=image, return_tensors="pt")["pixel_values"][0]
        torch.testing.assert_close(transform(image.convert(mode)), theirs, rtol=0, atol=1e-5)


def test_an_hf_folder_without_a_processor_file_takes_openais_recipe_and_odd_settings_are_refused(tmp_path):
    folder = hf_folder(tmp_path)
    net = zoo_net(folder)
    inputs = source_inputs(folder, net)
    assert (inputs["mean"], inputs["std"]) == (list(OPENAI_MEAN), list(OPENAI_STD))
    assert inputs["image_shape"] == [3, 16, 16] and inputs["interpolation"] == "bicubic"
    assert inputs["templates"] == list(OPENAI_IMAGENET_TEMPLATES)
    for bad in ({"do_center_crop": False}, {"resample": 0}, {"crop_size": {"height": 16, "width": 12}}):
        (folder / "preprocessor_config.json").write_text(json.dumps({"crop_size": 16} | bad))
        with pytest.raises(InputError, match=next(iter(bad))):
            source_inputs(folder, net)


def open_clip_folder(folder: Path):
    """A tiny open_clip model saved as the hub lays it out (``open_clip_config.json`` + weights); returns it too."""
    open_clip = pytest.importorskip("open_clip")
    model_cfg = {
        "embed_dim": 16,
        "quick_gelu": True,
        "vision_cfg": {"image_size": 16, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    pre = {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.5, 0.75], "interpolation": "bicubic", "resize_mode": "shortest"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": pre}))
    torch.manual_seed(0)
    model, _, transform = open_clip.create_model_and_transforms(f"local-dir:{folder}")
    torch.save(model.state_dict(), folder / "open_clip_pytorch_model.bin")
    return model.eval(), transform


def test_open_clip_folder_reads_images_and_weights_as_open_clip_does(tmp_path):
    model, transform = open_clip_folder(tmp_path / "oc")
    net = CLIP(
        VisionTransformer(image_size=16, patch_size=8, width=32, layers=1, heads=2, embed_dim=16, act="quick_gelu"),
        TextTransformer(
            vocab_size=49408,
            context_length=16,
            width=32,
            layers=1,
            heads=2,
            embed_dim=16,
            eot_id=49407,
            act="quick_gelu",
        ),
    ).eval()
    assert load_source_into(net, tmp_path / "oc") == "openai"
    inputs = source_inputs(tmp_path / "oc", net)
    assert inputs["std"] == [0.25, 0.5, 0.75]
    mode, ours = image_transform(inputs)
    images = pil_images()
    for image in images:
        torch.testing.assert_close(ours(image.convert(mode)), transform(image), rtol=0, atol=1e-5)
    pixels = torch.stack([transform(im) for im in images])
    ids = torch.randint(0, 49406, (2, 16))
    ids[:, 0], ids[0, 5], ids[1, 15] = 49406, 49407, 49407
    with torch.no_grad():
        torch.testing.assert_close(
            net.encode_image(pixels), model.encode_image(pixels, normalize=True), atol=1e-5, rtol=0
        )
        torch.testing.assert_close(net.encode_text(ids), model.encode_text(ids, normalize=True), atol=1e-5, rtol=0)


def zeroshot_args(folder: Path, images: Path, *extra: str, net: dict | None = None) -> list[str]:
    """The zero-shot preset on ``folder``: its net from the folder's config (``zoo.app.pretrained``), or ``net``."""
    return [
        "--config",
        ZEROSHOT,
        *([f"--model.init_args.net={json.dumps(net)}"] if net else []),
        f"--model.init_args.init_weights={folder}",
        f"--data.init_args.paths={images}",
        "--data.init_args.class_names=[cat, dog, car]",
        "--trainer.enable_progress_bar=false",
        *extra,
    ]


@pytest.fixture
def image_folder(tmp_path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(pil_images()):
        image.save(folder / f"{i}.png")
    return folder


def test_zeroshot_preset_predicts_a_folder_as_transformers_would_with_openais_templates(tmp_path, image_folder):
    """docs/clip.md's zero-shot command: the probabilities equal ``CLIPModel``'s on ``CLIPImageProcessor``'s pixels,
    each class the mean of its 80 prompts' normalised embeddings."""
    folder = hf_folder(tmp_path / "hf", dict(size={"shortest_edge": 20}, crop_size=16))
    cli("predict", *zeroshot_args(folder, image_folder))
    with open(output("predictions.csv")) as f:
        rows = list(csv.DictReader(f))
    names = ["cat", "dog", "car"]
    model = transformers.CLIPModel.from_pretrained(folder).eval()
    processor = transformers.CLIPImageProcessor.from_pretrained(folder)
    paths = sorted(image_folder.glob("*.png"))
    assert [Path(r["path"]).name for r in rows] == [p.name for p in paths]
    from PIL import Image

    pixels = processor(images=[Image.open(p).convert("RGB") for p in paths], return_tensors="pt")["pixel_values"]
    tok = source_tokenizer(folder)
    ids = tokenize(tok, [t.format(c) for c in names for t in OPENAI_IMAGENET_TEMPLATES], 24)
    with torch.no_grad():
        img = F.normalize(model.get_image_features(pixel_values=pixels).pooler_output, dim=-1)
        txt = F.normalize(model.get_text_features(input_ids=ids).pooler_output, dim=-1)
        classes = F.normalize(txt.view(len(names), len(OPENAI_IMAGENET_TEMPLATES), -1).mean(1), dim=-1)
        probs = (model.logit_scale.exp() * img @ classes.T).softmax(-1)
    for row, p in zip(rows, probs):
        assert row["class"] == names[int(p.argmax())]
        assert float(row["confidence"]) == pytest.approx(float(p.max()), abs=1e-5)


def test_given_templates_replace_openais_and_the_folders_tokenizer_comes_along(tmp_path, image_folder):
    folder = hf_folder(tmp_path / "hf")
    c = cli("predict", *zeroshot_args(folder, image_folder, '--data.init_args.templates=["a photo of a {}."]'))
    assert c.datamodule._zeroshot_settings()["templates"] == ["a photo of a {}."]
    c = cli("predict", *zeroshot_args(folder, image_folder))
    assert c.datamodule._zeroshot_settings()["templates"] == list(OPENAI_IMAGENET_TEMPLATES)
    assert c.model.tokenizer.to_dict() == source_tokenizer(folder).to_dict()


HARD_STRINGS = [
    "a photo of a cat.",
    "  Hello\t\n  WORLD  ",  # whitespace runs, upper case
    "naïve café — “quoted” ﬁne &amp;amp; Ａｂｃ",  # ftfy's fixes: quotes, ligatures, full width; HTML twice
    "日本語のテキスト 🙂🙂",
    "mojibake: cafÃ©",
    "<b>fish &amp;amp; chips</b>",  # markup: ftfy leaves the entities, open_clip unescapes them twice itself
    "it's they're we'll I'd 123456 don't!!! ??? ...",
    "x<end_of_text>y",
    "ĀāĂ ñ Ω ≈ \u200b zero\u00a0width",
    "",
    "supercalifragilisticexpialidocious" * 5,  # a long word
    "word " * 100,  # past the context length: cut, end-of-text kept
]


@pytest.mark.parametrize("context_length", [77, 8])
def test_open_clip_tokenizer_ids_equal_open_clips_on_hard_strings(context_length):
    open_clip = pytest.importorskip("open_clip")
    from zoo.clip.pretrained import source_tokenizer
    from zoo.io.tokenizers import tokenizer_from_dict

    ours = tokenizer_from_dict(source_tokenizer(Path("weights.bin"), "openai").to_dict())  # as a checkpoint holds it
    theirs = open_clip.get_tokenizer("ViT-B-32")(HARD_STRINGS, context_length=context_length)
    for text, want, got in zip(HARD_STRINGS, theirs, tokenize(ours, HARD_STRINGS, context_length)):
        n = int(want.nonzero()[-1]) + 1  # open_clip pads with 0, the zoo with end-of-text
        assert got[:n].tolist() == want[:n].tolist(), text
        assert (got[n:] == ours.eos_id).all()


def test_an_open_clip_folder_zero_shots_through_the_cli_with_its_tokenizer_and_preprocessing(tmp_path, image_folder):
    """With no net block: the towers are the folder's ``model_cfg``'s (``zoo.clip.open_clip_config``)."""
    model, transform = open_clip_folder(tmp_path / "oc")
    import open_clip

    c = cli("predict", *zeroshot_args(tmp_path / "oc", image_folder))
    vision = c.model.hparams["net"]["init_args"]["image_encoder"]["init_args"]
    assert (vision["heads"], vision["act"], c.model.net.text_encoder.eot_id) == (2, "quick_gelu", 49407)
    with open(output("predictions.csv")) as f:
        rows = list(csv.DictReader(f))
    from PIL import Image

    names = ["cat", "dog", "car"]
    pixels = torch.stack([transform(Image.open(p)) for p in sorted(image_folder.glob("*.png"))])
    prompts = [t.format(c) for c in names for t in OPENAI_IMAGENET_TEMPLATES]
    with torch.no_grad():
        img = model.encode_image(pixels, normalize=True)
        txt = model.encode_text(open_clip.get_tokenizer("ViT-B-32")(prompts, context_length=16), normalize=True)
        classes = F.normalize(txt.view(len(names), len(OPENAI_IMAGENET_TEMPLATES), -1).mean(1), dim=-1)
        probs = (model.logit_scale.exp() * img @ classes.T).softmax(-1)
    assert len(rows) == len(probs)
    for row, p in zip(rows, probs):
        assert row["class"] == names[int(p.argmax())]
        assert float(row["confidence"]) == pytest.approx(float(p.max()), abs=1e-5)


def test_data_that_reads_images_otherwise_than_the_imported_weights_is_refused_naming_the_setting(tmp_path):
    from zoo.clip.pretrained import check_reads_as_source

    folder = hf_folder(tmp_path, dict(size={"shortest_edge": 16}, crop_size=16, image_std=[0.5, 0.5, 0.5]))
    source = source_inputs(folder, zoo_net(folder))
    same = {"image_shape": [3, 16, 16], "mean": list(OPENAI_MEAN), "std": [0.5, 0.5, 0.5], "templates": ["{}"]}
    check_reads_as_source(same, source)
    check_reads_as_source(
        None, source
    )  # a DataModule that states no image format (ZeroShotDataModule) reads the model's
    with pytest.raises(InputError, match=r"--data.init_args.std=\[0.5, 0.5, 0.5\]"):
        check_reads_as_source(same | {"std": list(OPENAI_STD)}, source)
    with pytest.raises(InputError, match="--data.init_args.image_size=16"):
        check_reads_as_source(same | {"image_shape": [3, 24, 24]}, source)


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_models_trained_in_the_zoo_still_read_new_files_bilinear_bit_for_bit(mode):
    """An ``inputs`` without a resize recipe (every zoo-trained model's) reads as torchvision's Resize + CenterCrop
    always did: the recipe for imported weights changes nothing for them."""
    from torchvision import transforms as T

    c = 1 if mode == "L" else 3
    inputs = {"image_shape": [c, 24, 24], "mean": [0.5] * c, "std": [0.25] * c}
    before = T.Compose([T.Resize(24), T.CenterCrop(24), T.ToTensor(), T.Normalize(inputs["mean"], inputs["std"])])
    _, now = image_transform(inputs)
    for image in pil_images():
        assert torch.equal(now(image.convert(mode)), before(image.convert(mode)))


def test_an_open_clip_folder_with_transformers_files_too_keeps_open_clips_tokenizer_unless_it_names_another(tmp_path):
    """Hub snapshots of open_clip models hold transformers' tokenizer.json beside open_clip's files; open_clip itself
    tokenizes with its SimpleTokenizer (ftfy's cleaning included) unless its config names a Hugging Face tokenizer."""
    pytest.importorskip("open_clip")
    folder = tmp_path / "oc"
    folder.mkdir()
    text_cfg = {"context_length": 16, "vocab_size": 49408}

    def write(text: dict) -> None:
        (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": {"text_cfg": text}}))

    write(text_cfg)
    assert source_tokenizer(folder, "openai").to_dict()["kind"] == "open_clip"
    write(text_cfg | {"hf_tokenizer_name": "org/some-tokenizer"})
    with pytest.raises(InputError, match="org/some-tokenizer"):
        source_tokenizer(folder, "openai")
    BPETokenizer.train(["a red cat", "a blue dog"] * 5, vocab_size=270).save(folder)
    assert source_tokenizer(folder, "openai").to_dict()["kind"] == "bpe"
    write(text_cfg)
    assert source_tokenizer(folder, "openai").to_dict()["kind"] == "open_clip"
    write(text_cfg | {"tokenizer_kwargs": {"clean": "canonicalize"}})
    with pytest.raises(InputError, match="canonicalize"):
        source_tokenizer(folder, "openai")


OPEN_CLIP_MODEL = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 16, "layers": 1, "width": 32, "patch_size": 8, "head_width": 16},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


@pytest.mark.parametrize(
    "edit, named",
    [
        ({"vision_cfg": {"attentional_pool": True}}, r"vision_cfg has attentional_pool=True"),
        ({"vision_cfg": {"layers": [3, 4, 6, 3]}}, r"layers=\[3, 4, 6, 3\].*ResNet"),
        ({"vision_cfg": {"head_width": 12}}, r"head_width=12"),
        ({"text_cfg": {"pool_type": "last"}}, r"text_cfg has pool_type='last'"),
        ({"text_cfg": {"proj_bias": True}}, r"proj_bias=True"),
        ({"text_cfg": {"some_new_field": 1}}, r"text_cfg sets some_new_field"),
        ({"init_logit_bias": -10.0}, r"init_logit_bias=-10\.0"),
        ({"multimodal_cfg": {}}, r"model_cfg sets multimodal_cfg"),
    ],
)
def test_an_open_clip_config_the_zoo_does_not_compute_is_refused_by_name(tmp_path, edit, named):
    """The net from an open_clip folder's model_cfg (``zoo.clip.open_clip_config``): every field that changes the
    function is read or refused, a field it does not know refused too."""
    from zoo.clip.pretrained import net_config

    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": OPEN_CLIP_MODEL}))
    towers = net_config(tmp_path)["init_args"]
    assert towers["image_encoder"]["init_args"]["heads"] == 2 and towers["text_encoder"]["init_args"]["eot_id"] == 49407
    model_cfg = {k: v | edit.get(k, {}) if isinstance(v, dict) else v for k, v in OPEN_CLIP_MODEL.items()}
    model_cfg |= {k: v for k, v in edit.items() if k not in OPEN_CLIP_MODEL}
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg}))
    with pytest.raises(InputError, match=named) as err:
        net_config(tmp_path)
    assert "\n" not in str(err.value)
