"""Public formats from elsewhere: safetensors headers that lie about their tensors, Stable-Baselines3 zips whose members
leave their folder, inflate without end or carry pickles, and model folders that name their own code (``auto_map``,
``trust_remote_code``, PEFT's ``auto_mapping``). Each row is one payload, replayed through every loader it reaches;
``harness`` says what must hold."""

from __future__ import annotations

import base64
import functools
import io
import json
import os
import shutil
import warnings
import zipfile
from pathlib import Path

import pytest
from builders import TINY_NET, Call, pickled, safetensors_bytes, shell, tiny_gpt2_folder, torch_zip
from harness import Payload, cases, replay, warm_up
from loaders import SAFETENSORS

WEIGHTS = tuple(SAFETENSORS)
CODE = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\nprint('ZOO-ATTACK-MARKER')\nclass Evil: pass\n"


@pytest.fixture(scope="module", autouse=True)
def _warm():
    warm_up()


# -- safetensors headers that lie -------------------------------------------------------------------------------


def gpt2_folder(folder: Path) -> Path:
    out = folder / "gpt2"
    shutil.copytree(tiny_gpt2_folder("a b c d e", 260), out)
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return out


def weights(header, data: bytes = b"", length: int | None = None):
    """A GPT-2 folder whose model.safetensors is ``header`` (see ``safetensors_bytes``) and ``data``."""

    def make(folder, outside):
        path = gpt2_folder(folder) / "model.safetensors"
        path.write_bytes(safetensors_bytes(header, data, length))
        return path

    return make


def f32(begin: int, end: int, shape=(4,), dtype: str = "F32") -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}


def weights_link(target: str):
    def make(folder, outside):
        path = gpt2_folder(folder) / "model.safetensors"
        path.unlink()
        path.symlink_to(target.replace("OUTSIDE", str(outside)))
        return path

    return make


DEEP = ("[" * 100_000 + "]" * 100_000).encode()
TOB = "safetensors format: Trail of Bits' 2023 safetensors audit (header validation)"


# -- Stable-Baselines3 zips -------------------------------------------------------------------------------------


@functools.cache
def _sb3_zip() -> bytes:
    import stable_baselines3 as sb3

    model = sb3.PPO("MlpPolicy", "CartPole-v1", policy_kwargs={"net_arch": [8]}, device="cpu", seed=0)
    buf = io.BytesIO()
    model.save(buf)
    return buf.getvalue()


def sb3(members: dict | None = None, replace: dict | None = None, compress: int = zipfile.ZIP_STORED, infos=()):
    """The base SB3 zip with ``replace`` members' bytes swapped (a callable gets the old bytes and the marker
    folder), ``members`` added, ``infos`` (ZipInfo, bytes) added as they are."""

    def make(folder, outside):
        out = folder / "agent.zip"
        with zipfile.ZipFile(io.BytesIO(_sb3_zip())) as src, zipfile.ZipFile(out, "w", compress) as dst:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a duplicate name, asked for
                for info in src.infolist():
                    raw = src.read(info)
                    new = (replace or {}).get(info.filename)
                    dst.writestr(info.filename, new(raw, outside) if callable(new) else raw if new is None else new)
                for name, raw in (members or {}).items():
                    dst.writestr(name.replace("OUTSIDE", str(outside)), raw)
                for info, raw in infos:
                    dst.writestr(info, raw)
        return out

    return make


def serialized_blob(raw: bytes, outside: Path) -> bytes:
    """SB3's data JSON with its policy_class a cloudpickle blob that runs code (SB3's own loader unpickles it)."""
    data = json.loads(raw)
    blob = base64.b64encode(pickled(Call(os.system, shell(outside)))).decode()
    data["policy_class"] = {**data["policy_class"], ":serialized:": blob}
    return json.dumps(data).encode()


def symlink_member(name: str, target: str):
    info = zipfile.ZipInfo(name)
    info.external_attr = (0o120777 << 16) | 0x20  # a symlink, as Info-ZIP stores one
    return (info, target)


def vec_normalize(folder, outside):
    path = folder / "vec_normalize.pkl"
    path.write_bytes(pickled(Call(os.system, shell(outside))))
    return path


def _rl_from_pretrained(p):
    from zoo.rl import from_pretrained

    return from_pretrained(p)


def _sb3_net(p):
    from zoo.app.pretrained import sb3_zip

    return sb3_zip(Path(p))


def _read_zip(p):
    from zoo.rl.sb3 import read_zip

    return read_zip(p)


# -- model folders that name their own code ---------------------------------------------------------------------


def plant(folder: Path, outside: Path, config: str, **entries) -> None:
    """``entries`` into the folder's JSON ``config``, and the modules they name, each writing the marker."""
    path = folder / config
    data = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**data, **entries}))
    for name in ("modeling_evil.py", "configuration_evil.py", "tokenization_evil.py", "__init__.py"):
        (folder / name).write_text(CODE.format(marker=str(outside / "MARKER")))


AUTO_MAP = {
    "AutoConfig": "configuration_evil.Evil",
    "AutoModel": "modeling_evil.Evil",
    "AutoTokenizer": ["tokenization_evil.Evil", None],
}


def gpt2_code(config: str, **entries):
    def make(folder, outside):
        out = gpt2_folder(folder)
        plant(out, outside, config, **entries)
        return out

    return make


def clip_code(folder, outside):
    """A Hugging Face CLIP folder's config.json with auto_map (transformers imports modeling_evil.py)."""
    out = folder / "clip"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": "clip", "vision_config": {}, "text_config": {}}))
    plant(out, outside, "config.json", auto_map=AUTO_MAP)
    return out


def clip_lacking(folder, outside):
    """A Hugging Face CLIP folder's config.json whose vision tower states no hidden_size."""
    out = folder / "clip"
    out.mkdir()
    tower = {"num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 8}
    vision = {**tower, "image_size": 8, "patch_size": 4}
    text = {**tower, "hidden_size": 8, "vocab_size": 16}
    (out / "config.json").write_text(json.dumps({"model_type": "clip", "vision_config": vision, "text_config": text}))
    return out


def diffusers_code(folder, outside):
    """A diffusers folder whose _class_name names a module of its own (diffusers' remote-code classes)."""
    out = folder / "dit"
    out.mkdir()
    plant(
        out,
        outside,
        "config.json",
        _class_name=["modeling_evil", "Evil"],
        _diffusers_version="0.35.0",
        auto_map=AUTO_MAP,
    )
    return out


def peft_code(entries: dict):
    def make(folder, outside):
        out = folder / "adapter"
        out.mkdir()
        base = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["c_attn"]}
        plant(out, outside, "adapter_config.json", **{**base, **entries})
        return out

    return make


def _gpt_from_pretrained(p):
    from zoo.gpt import from_pretrained

    return from_pretrained(p)


def _gpt_folder_net(p):
    from zoo.app.pretrained import gpt_folder, gpt_open

    return gpt_folder(gpt_open(Path(p)))  # as the application reads init_weights: the folder once, then its net


def _hf_tokenizer(p):
    from zoo.io.hf_tokenizer import from_folder

    return from_folder(p)


def _clip_net(p):
    from zoo.clip.pretrained import net_config

    return net_config(p)


def _clip_weights(p):
    from zoo.clip.hf import load_hf_clip

    return load_hf_clip(p)


def _diffusers_net(p):
    from zoo.diffusion.pretrained import net_config

    return net_config(p)


def _diffusion_from_pretrained(p):
    from zoo.diffusion import from_pretrained

    return from_pretrained(p)


def _peft_config(p):
    from zoo.gpt.formats.peft_adapter import read_adapter_config

    return read_adapter_config(p / "adapter_config.json")


def _peft_load(p):
    from zoo.gpt import GPT, CausalLMModule
    from zoo.gpt.formats.peft_adapter import load_adapter

    return load_adapter(CausalLMModule(GPT(**TINY_NET)), p)


LOADERS = {
    **SAFETENSORS,
    "rl_from_pretrained": _rl_from_pretrained,
    "sb3_net": _sb3_net,
    "read_zip": _read_zip,
    "gpt_from_pretrained": _gpt_from_pretrained,
    "gpt_folder_net": _gpt_folder_net,
    "hf_tokenizer": _hf_tokenizer,
    "clip_net": _clip_net,
    "clip_weights": _clip_weights,
    "diffusers_net": _diffusers_net,
    "diffusion_from_pretrained": _diffusion_from_pretrained,
    "peft_config": _peft_config,
    "peft_load": _peft_load,
}
SB3 = ("rl_from_pretrained", "sb3_net", "read_zip")
GPT_FOLDER = ("gpt_from_pretrained", "gpt_folder_net")
ZIP_SLIP = "zip slip (Snyk 2018; CVE-2018-1002200 class)"

# fmt: off
PAYLOADS = [
    Payload("st-header-length-2e63", TOB + ": an 8-byte length of 2**63", weights({}, length=2**63), WEIGHTS),
    Payload("st-header-past-file", TOB + ": a header length past the file's end", weights({}, length=10_000), WEIGHTS),
    Payload("st-offsets-overlapping", TOB + ": two tensors over the same bytes", weights({"a": f32(0, 16), "b": f32(8, 24)}, bytes(24)), WEIGHTS),
    Payload("st-offsets-beyond-file", TOB + ": data_offsets past the end", weights({"a": f32(0, 1024, (256,))}, bytes(16)), WEIGHTS),
    Payload("st-dtype-mismatch", TOB + ": F32 x4 over 8 bytes", weights({"a": f32(0, 8)}, bytes(8)), WEIGHTS),
    Payload("st-offsets-negative", TOB + ": negative offsets", weights({"a": f32(-8, 8)}, bytes(16)), WEIGHTS),
    Payload("st-offsets-strings", TOB + ": offsets that are strings", weights({"a": {"dtype": "F32", "shape": [4], "data_offsets": ["0", "16"]}}, bytes(16)), WEIGHTS),
    Payload("st-shape-overflow", TOB + ": a shape whose product overflows 64 bits", weights({"a": f32(0, 16, (2**62, 2**62))}, bytes(16)), WEIGHTS),
    Payload("st-dtype-unknown", TOB + ": a dtype safetensors does not have", weights({"a": f32(0, 16, dtype="PICKLE")}, bytes(16)), WEIGHTS),
    Payload("st-header-not-json", TOB + ": a header that is not UTF-8 JSON", weights(b"\xff\xfe{not json", bytes(16)), WEIGHTS),
    Payload("st-header-deep-json", TOB + ": a header nested 100,000 deep (CWE-674)", weights(DEEP), WEIGHTS),
    Payload("st-duplicate-keys", TOB + ": one name twice (parser differential)", weights(b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"a":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}', bytes(24)), WEIGHTS),
    Payload("st-metadata-not-strings", TOB + ": __metadata__ values that are not strings", weights({"__metadata__": {"a": {"b": [1]}}, "x": f32(0, 16)}, bytes(16)), WEIGHTS),
    Payload("st-hole-between-tensors", TOB + ": bytes no tensor owns", weights({"a": f32(0, 16), "b": f32(32, 48)}, bytes(48)), WEIGHTS),
    Payload("st-link-dev-zero", "symlinks in model folders: weights linked to /dev/zero", weights_link("/dev/zero"), WEIGHTS),
    # Stable-Baselines3 zips: SB3's own load_from_zip_file unpickles data's ':serialized:' blobs with cloudpickle
    Payload("sb3-zip-slip", ZIP_SLIP, sb3({"../../OUTSIDE/slip.txt": b"out"}), SB3),
    Payload("sb3-absolute-member", ZIP_SLIP + ": an absolute member name", sb3({"OUTSIDE/abs.txt": b"out"}), SB3),
    Payload("sb3-symlink-member", ZIP_SLIP + ": a symlink member named data", sb3(replace={"data": b""}, infos=[symlink_member("data", "/etc/passwd")]), SB3),
    Payload("sb3-data-bomb", "zip bomb (Fifield, WOOT 2019): data inflating past its bound", sb3(replace={"data": b" " * (17 * 2**20)}, compress=zipfile.ZIP_DEFLATED), SB3),
    Payload("sb3-overlapping-members", "zip bomb (Fifield, WOOT 2019): many entries", sb3({f"m{i}": b"" for i in range(40)}), SB3),
    Payload("sb3-data-twice", "zip parser differential (picklescan CVE-2025-1944 class)", sb3({"data": b"{}"}), SB3),
    Payload("sb3-cloudpickle-blob", "SB3 load_from_zip_file: ':serialized:' cloudpickle in data", sb3(replace={"data": serialized_blob}), SB3, refuse=False),
    Payload("sb3-pickled-policy", "CVE-2025-32434 class: policy.pth a pickle that calls code", sb3(replace={"policy.pth": lambda raw, outside: torch_zip(Call(os.system, shell(outside)))}), SB3),
    Payload("sb3-data-deep-json", "recursion bombs (CWE-674) in data", sb3(replace={"data": DEEP}), SB3),
    Payload("sb3-vec-normalize-pkl", "SB3 VecNormalize.load unpickles vec_normalize.pkl", vec_normalize, ("rl_from_pretrained", "read_zip")),
    # model folders naming their own code: transformers' trust_remote_code imports what auto_map names
    Payload("auto-map-gpt2-generation-config", "transformers trust_remote_code / auto_map", gpt2_code("generation_config.json", auto_map=AUTO_MAP), ("gpt_from_pretrained",), named=("auto_map",)),
    Payload("auto-map-tokenizer-config", "transformers trust_remote_code / auto_map in tokenizer_config.json", gpt2_code("tokenizer_config.json", auto_map=AUTO_MAP, tokenizer_class="Evil"), ("hf_tokenizer", "gpt_from_pretrained"), named=("auto_map",)),
    Payload("trust-remote-code-config", "transformers trust_remote_code stated by the folder", gpt2_code("config.json", trust_remote_code=True), GPT_FOLDER, named=("trust_remote_code",)),
    Payload("custom-pipelines", "diffusers/transformers custom_pipelines", gpt2_code("config.json", custom_pipelines={"text-generation": {"impl": "modeling_evil.Evil"}}), GPT_FOLDER),
    Payload("auto-map-clip", "transformers trust_remote_code / auto_map in a CLIP folder", clip_code, ("clip_net", "clip_weights"), named=("auto_map",)),
    Payload("clip-config-lacks-a-size", "a CLIP config.json without a tower's size (a bare KeyError before)", clip_lacking, ("clip_net", "clip_weights"), named=("vision_config.hidden_size",)),
    Payload("diffusers-class-name-module", "diffusers remote code: _class_name naming [module, class]", diffusers_code, ("diffusers_net", "diffusion_from_pretrained")),
    Payload("peft-auto-mapping", "PEFT AutoPeftModel auto_mapping (imports parent_library)", peft_code({"auto_mapping": {"base_model_class": "Evil", "parent_library": "modeling_evil"}}), ("peft_config", "peft_load"), refuse=False),
    Payload("peft-auto-map", "transformers trust_remote_code / auto_map in adapter_config.json", peft_code({"auto_map": AUTO_MAP}), ("peft_config", "peft_load")),
    Payload("bomb-lora-r-1e9", "issue 52: stored sizes (adapter r 1e9)", peft_code({"r": 10**9}), ("peft_config",), named=("r",)),
]
# fmt: on


@pytest.mark.parametrize(("payload", "loader"), cases(PAYLOADS, LOADERS))
def test_a_public_format_payload_runs_nothing_and_is_refused_in_one_line(payload, loader, tmp_path):
    replay(payload, LOADERS[loader], tmp_path)
