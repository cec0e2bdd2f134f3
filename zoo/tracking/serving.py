"""What a logged zoo model answers: one prediction interface per family, raw inputs in, answers out.

  - CNN: images (encoded bytes: PNG, JPEG, ...; base64 in JSON; or uint8 arrays in Python) -> ``pred``, ``class``,
    ``confidence`` and the next best ``class_<i>``/``confidence_<i>`` up to ``top_k`` (a param);
  - GPT: prompts -> completions, with ``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``,
    ``repetition_penalty`` and ``seed`` params;
    or chat ``messages`` (OpenAI's ``[{"role", "content"}, ...]`` per row; MLflow's unified chat request
    ``{"messages": [...]}`` is one) -> the assistant's reply, after the model's chat template with
    its generation prompt (the ``prompt`` column then shows that rendered text);
  - diffusion: rows of ``label`` and ``seed`` -> PNG images (bytes; base64 in JSON), with ``guidance_scale`` and the
    sampler's own settings (DDIM's ``steps``, ``eta``, ...) as params; rows sharing a seed are drawn together as one
    batch of the CLI's predict is, so ``seed`` s answers what the CLI's batch of seed s draws;
  - CLIP: ``image`` and/or ``text`` -> normalised ``image_embedding``/``text_embedding``, and zero-shot ``class``,
    ``confidence`` and the top ``top_k`` of each image among the ``labels`` param (prompts from ``templates``);
  - RL: observations (B, *obs_shape) -> the agent's deterministic actions, its observation normaliser applied.

Each answers through the module's own ``predict_step`` (RL: ``act``, what predict's episodes play) on a batch built
as the CLI's predict DataModule builds it (images read by ``zoo.io.new_inputs.read_image`` with the model's
``image_transform``, prompts by ``zoo.io.tokenizers.prompt_ids``), so a request and the CLI's predict on the same
inputs give the same answers. The same object serves the MLflow pyfunc (``zoo/tracking/pyfunc.py``: what
``mlflow.pyfunc.load_model`` and ``mlflow models serve`` run) and Python (``zoo.tracking.load``), and states the
signature (input columns or tensor, ``ParamSchema``) and input example logged with the model: the scoring server
validates and casts requests by it (JSON floats to float32, base64 to bytes) and answers a bad one with a 400 that
names the expected input.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import pandas as pd
import torch
from lightning.pytorch import LightningModule
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.protos.databricks_pb2 import BAD_REQUEST
from mlflow.pyfunc import PythonModel
from mlflow.types import ColSpec, DataType, ParamSchema, ParamSpec, Schema, TensorSpec
from mlflow.types.schema import Array, Object, Property

from zoo.errors import InputError
from zoo.io import budget
from zoo.io.checkpoint import read_module
from zoo.io.new_inputs import DEFAULT_TEMPLATES, image_transform, png_bytes, prompt, read_image, to_uint8
from zoo.io.tokenizers import prompt_ids
from zoo.tracking.families import FAMILIES, family_of

SEQUENCES = (list, tuple, np.ndarray, pd.Series)
TOP_K = 5  # classes answered per image unless the request's top_k says otherwise (as the CLI's CSV)


def as_the_server_reads(data: Any, schema: Schema | None) -> Any:
    """``data`` as MLflow's scoring server reads ``{"inputs": data}`` for a model of one named input column of plain
    values (a GPT's ``prompt``; its ``messages``, lists of objects, are no bare value): a bare value or a list of
    values is that column (a Python ``predict(["a", "b"])`` as HTTP's), the rest unchanged."""
    if schema is None or schema.is_tensor_spec():
        return data
    plain = [c.name for c in schema.inputs if not isinstance(c.type, Array)]
    if len(plain) != 1:
        return data
    if isinstance(data, (str, bytes)):
        data = [data]
    if isinstance(data, (list, tuple)) and not any(isinstance(v, dict) for v in data):
        return pd.DataFrame({plain[0]: list(data)})
    return data


def _one_row_of_lists(frame: pd.DataFrame) -> bool:
    """MLflow's own cast of a dict of lists of strings (``predict({"prompt": ["a", "b"]})``): one row whose every
    cell is the list."""
    cells = frame.iloc[0].tolist() if len(frame) == 1 else []  # the server's {"inputs": {"prompt": [...]}}: arrays
    return bool(cells) and all(isinstance(v, (list, np.ndarray)) and all(isinstance(x, str) for x in v) for v in cells)


def columns(model_input: Any, names: tuple[str, ...]) -> dict[str, list]:
    """``model_input`` (a DataFrame, a dict of columns, a list of rows or of values of the first column) as
    ``{name: values}`` for the ``names`` it has; missing values (NaN, None) stay None."""
    if isinstance(model_input, pd.DataFrame) and _one_row_of_lists(model_input):
        data = {c: model_input[c].iloc[0] for c in model_input.columns}
    elif isinstance(model_input, pd.DataFrame):
        data = {c: model_input[c].tolist() for c in model_input.columns}
    elif isinstance(model_input, dict):
        data = {c: list(v) if isinstance(v, SEQUENCES) else [v] for c, v in model_input.items()}
    elif isinstance(model_input, SEQUENCES):
        rows = list(model_input)
        data = pd.DataFrame(rows).to_dict("list") if rows and isinstance(rows[0], dict) else {names[0]: rows}
    else:
        data = {names[0]: [model_input]}
    unknown = set(data) - set(names)
    if unknown:
        raise InputError(f"unknown input column(s) {sorted(unknown)}: this model takes {', '.join(names)}")
    if not set(data) & set(names):  # MLflow's server drops the columns its signature does not name
        raise InputError(f"no input column this model takes: it takes {', '.join(names)}")
    return {c: [None if _missing(v) else v for v in data[c]] for c in names if c in data}


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def frame(rows: dict[str, Any]) -> pd.DataFrame:
    """``predict_step``'s output dict as a DataFrame: tensors to numbers, a (B, E) tensor to a list per row."""
    out = {}
    for key, value in rows.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().float().cpu().numpy() if value.is_floating_point() else value.cpu().numpy()
            value = list(value) if value.ndim > 1 else value
        out[key] = value
    return pd.DataFrame(out)


def _param_type(value: Any) -> str | None:
    """MLflow's param type of a plain value, or None for values a param cannot carry."""
    for kind, name in ((bool, "boolean"), (int, "long"), (float, "double"), (str, "string")):
        if isinstance(value, kind):
            return name
    return None


class Interface:
    """A family's prediction interface around a built, loaded module in eval mode."""

    inputs: tuple[str, ...] = ()  # the input columns, the first one what a bare list of values fills

    def __init__(self, module: LightningModule) -> None:
        self.module = module

    def input_schema(self) -> Schema:
        raise NotImplementedError

    def output_schema(self) -> Schema | None:
        return None

    def params(self) -> list[ParamSpec]:
        return []

    def example(self) -> Any:
        raise NotImplementedError

    def answer(self, model_input: Any, params: dict) -> Any:
        raise NotImplementedError

    def signature(self) -> ModelSignature:
        params = self.params()
        return ModelSignature(self.input_schema(), self.output_schema(), ParamSchema(params) if params else None)

    def predict(self, model_input: Any, params: dict | None = None) -> Any:
        """The answers to ``model_input`` with ``params`` (missing ones take their logged defaults)."""
        given = {k: v for k, v in (params or {}).items() if v is not None}
        unknown = set(given) - {p.name for p in self.params()}
        if unknown:
            raise InputError(f"unknown param(s) {sorted(unknown)}: this model takes {[p.name for p in self.params()]}")
        full = {p.name: p.default for p in self.params()} | given
        budget.check(full, "the request's params")  # max_new_tokens=10**9 is a hang, not a request
        with torch.inference_mode():
            return self.answer(model_input, full)


class _Images(Interface):
    """Reads image columns as the model's training data was read (``inputs``: side, channels, mean, std)."""

    def _read(self, images: list) -> torch.Tensor:
        mode, transform = image_transform(getattr(self.module, "inputs", None))
        return torch.stack([read_image(im, mode, transform, f"image {i}") for i, im in enumerate(images)])

    def _example_png(self) -> bytes:
        c, h, w = (self.module.inputs or {}).get("image_shape", (3, 32, 32))
        pixels = torch.arange(h * w * c, dtype=torch.float32).reshape(h, w, c) % 256  # a gradient: not blank
        return png_bytes(pixels.to(torch.uint8))

    def _class_columns(self, k: int) -> list[ColSpec]:
        specs = [ColSpec(DataType.long, "pred"), ColSpec(DataType.string, "class")]
        specs.append(ColSpec(DataType.double, "confidence"))
        for i in range(2, k + 1):
            specs += [ColSpec(DataType.string, f"class_{i}"), ColSpec(DataType.double, f"confidence_{i}")]
        return specs


class ImageClassifier(_Images):
    """CNN: images -> the class, its confidence and the next best up to ``top_k``."""

    inputs = ("image",)

    def input_schema(self) -> Schema:
        return Schema([ColSpec(DataType.binary, "image")])

    def output_schema(self) -> Schema:
        return Schema(self._class_columns(min(TOP_K, self.module.net.num_classes)))

    def params(self) -> list[ParamSpec]:
        return [ParamSpec("top_k", DataType.long, TOP_K)]

    def example(self) -> pd.DataFrame:
        return pd.DataFrame({"image": [self._example_png()]})

    def answer(self, model_input: Any, params: dict) -> pd.DataFrame:
        images = columns(model_input, self.inputs)["image"]
        batch = {"image": self._read(images).to(self.module.device), "path": [""] * len(images)}
        rows = self.module.predict_step(batch | {"top_k": _at_least_1(params, "top_k")}, 0)
        return frame({k: v for k, v in rows.items() if k != "path"})


class TextGenerator(Interface):
    """GPT: prompts or chat messages -> completions (the assistant's replies), sampled as the ``generation`` params
    say (the model's by default)."""

    inputs = ("prompt", "messages")
    SETTINGS = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed")
    # Optional to MLflow, so that a message without one reaches the zoo's check (zoo.io.chat_template.checked_messages),
    # which names the row, the message and the field; MLflow's own says "Missing required properties" of no message.
    MESSAGE = Object([Property(k, DataType.string, required=False) for k in ("role", "content")])

    def input_schema(self) -> Schema:
        return Schema([ColSpec(DataType.string, "prompt", False), ColSpec(Array(self.MESSAGE), "messages", False)])

    def output_schema(self) -> Schema:
        return Schema([ColSpec(DataType.string, "prompt"), ColSpec(DataType.string, "completion")])

    def _generation(self):
        from zoo.gpt.generate import Generation

        return Generation.of(self.module.hparams.generation)

    def params(self) -> list[ParamSpec]:
        g = self._generation()
        kinds = {"max_new_tokens": DataType.long, "top_k": DataType.long, "seed": DataType.long}
        return [ParamSpec(n, kinds.get(n, DataType.double), getattr(g, n)) for n in self.SETTINGS]

    def example(self) -> pd.DataFrame:
        return pd.DataFrame({"prompt": [""]})  # every tokenizer encodes it: a new document

    def answer(self, model_input: Any, params: dict) -> pd.DataFrame:
        data = columns(model_input, self.inputs)
        if "messages" in data:
            ids, prompts = self._chats(data)
        else:
            prompts = [p if p is not None else "" for p in data["prompt"]]
            if any(not isinstance(p, str) for p in prompts):
                raise InputError("prompt: send strings (text to continue)")
            try:
                ids = prompt_ids(self.module.tokenizer, prompts)
            except ValueError as err:  # a character the model's tokenizer does not have
                raise InputError(f"prompt: {err}") from err
        generation = dataclasses.asdict(dataclasses.replace(self._generation(), **params))
        rows = self.module.predict_step({"prompt_ids": ids, "text": prompts, "generation": generation}, 0)
        return frame(rows)

    def _chats(self, data: dict[str, list]) -> tuple[list[torch.Tensor], list[str]]:
        """Each row's conversation as the ids its reply continues, and their text; a row has messages or a prompt,
        not both."""
        chats = data["messages"]  # MLflow's unified {"messages": [...]} is one row by now
        if any(p is not None for p in data.get("prompt", [])):
            raise InputError("send either prompt (text to continue) or messages (a chat to reply to), not both")
        ids = []
        for k, chat in enumerate(chats):
            chat = list(chat) if isinstance(chat, SEQUENCES) else chat
            try:
                ids.append(self.module.chat_prompt([dict(m) if isinstance(m, dict) else m for m in chat or []]))
            except ValueError as err:  # a bad message, or a template refusing the chat
                raise InputError(f"messages of row {k}: {err}") from err
        return ids, [self.module.tokenizer.decode(i.tolist()) for i in ids]


class ImageGenerator(Interface):
    """Diffusion: (label, seed) rows -> PNG images, drawn with the sampler and guidance the params say."""

    inputs = ("label", "seed")

    def input_schema(self) -> Schema:
        return Schema([ColSpec(DataType.long, "label", required=False), ColSpec(DataType.long, "seed", required=False)])

    def output_schema(self) -> Schema:
        return Schema([ColSpec(DataType.long, n) for n in self.inputs] + [ColSpec(DataType.binary, "image")])

    def _sampler_settings(self) -> dict[str, Any]:
        """The module's sampler's own settings (DDIM's steps, eta, spacing, ...) with their values, as the sampler
        states them (``Sampler.settings``)."""
        settings = self.module.default_sampler.settings()
        return {k: v for k, v in settings.items() if _param_type(v)}

    def params(self) -> list[ParamSpec]:
        settings = {"guidance_scale": float(self.module.guidance_scale), **self._sampler_settings()}
        return [ParamSpec(k, _param_type(v), v) for k, v in settings.items()]

    def example(self) -> pd.DataFrame:
        return pd.DataFrame({"label": [0, min(1, max(self.module.num_classes - 1, 0))], "seed": [0, 0]})

    def answer(self, model_input: Any, params: dict) -> pd.DataFrame:
        cols = columns(model_input, self.inputs)
        n = len(next(iter(cols.values())))
        k = max(self.module.num_classes, 1)
        labels = [i % k if v is None else int(v) for i, v in enumerate(cols.get("label", [None] * n))]
        seeds = [0 if v is None else int(v) for v in cols.get("seed", [None] * n)]
        if any(not 0 <= y < k for y in labels):
            raise InputError(f"label: this model draws classes 0 to {k - 1}")
        settings = {k: v for k, v in params.items() if k != "guidance_scale"}
        sampler = functools.partial(self.module.sampler, **settings)
        images: list[bytes | None] = [None] * n
        for seed in dict.fromkeys(seeds):  # rows sharing a seed are one batch, as one batch of the CLI's predict
            rows = [i for i in range(n) if seeds[i] == seed]
            batch = {"index": torch.tensor(rows), "labels": torch.tensor([labels[i] for i in rows]), "seed": seed}
            out = self.module.predict_step(batch | {"sampler": sampler, "guidance_scale": params["guidance_scale"]}, 0)
            for i, pixels in zip(rows, to_uint8(out["images"])):
                images[i] = png_bytes(pixels)
        label = labels if self.module.num_classes else [-1] * n
        return pd.DataFrame({"label": label, "seed": seeds, "image": images})


class Embedder(_Images):
    """CLIP: images and/or texts -> normalised embeddings; images also -> zero-shot classes among ``labels``."""

    inputs = ("image", "text")

    def input_schema(self) -> Schema:
        return Schema([ColSpec(DataType.binary, "image", required=False), ColSpec(DataType.string, "text", False)])

    def _inputs(self) -> dict:
        return dict(getattr(self.module, "inputs", None) or {})

    def params(self) -> list[ParamSpec]:
        spec = self._inputs()
        return [
            ParamSpec("labels", DataType.string, list(spec.get("class_names") or []), (-1,)),
            ParamSpec("templates", DataType.string, list(spec.get("templates") or DEFAULT_TEMPLATES), (-1,)),
            ParamSpec("top_k", DataType.long, TOP_K),
        ]

    def example(self) -> pd.DataFrame:
        spec = self._inputs()
        names, templates = spec.get("class_names") or [""], spec.get("templates") or ["{}"]
        return pd.DataFrame({"image": [self._example_png()], "text": [prompt(templates[0], names[0])]})

    def answer(self, model_input: Any, params: dict) -> pd.DataFrame:
        cols = columns(model_input, self.inputs)
        n = len(next(iter(cols.values())))
        images, texts = cols.get("image", [None] * n), cols.get("text", [None] * n)
        out = pd.DataFrame(index=range(n))
        at = [i for i in range(n) if images[i] is not None]
        if at:
            batch = {"image": self._read([images[i] for i in at]).to(self.module.device), "index": torch.tensor(at)}
            rows = frame(self.module.predict_step(batch | {"mode": "image_embeddings"}, 0))
            out.loc[at, "image_embedding"] = pd.Series(list(rows["embedding"]), index=at, dtype=object)
            if params["labels"]:
                zeroshot = {"mode": "zeroshot", "class_names": list(params["labels"]), "templates": params["templates"]}
                rows = frame(self.module.predict_step(batch | zeroshot | {"top_k": _at_least_1(params, "top_k")}, 0))
                for key in rows.columns.drop("index"):
                    out.loc[at, key] = pd.Series(list(rows[key]), index=at, dtype=object)
        at = [i for i in range(n) if texts[i] is not None]
        if at:
            try:
                batch = {"mode": "text_embeddings", "caption": [texts[i] for i in at]}
                rows = frame(self.module.predict_step(batch, 0))
            except ValueError as err:  # a character the model's tokenizer does not have
                raise InputError(f"text: {err}") from err
            out.loc[at, "text_embedding"] = pd.Series(list(rows["embedding"]), index=at, dtype=object)
        return out.astype(object).where(out.notna(), None)


class Policy(Interface):
    """RL: observations -> the agent's deterministic actions (its normaliser applied), as predict's episodes act."""

    def _obs_shape(self) -> tuple[int, ...]:
        return tuple(self.module.policy().obs_shape)

    def input_schema(self) -> Schema:
        return Schema([TensorSpec(np.dtype(np.float32), (-1, *self._obs_shape()))])

    def output_schema(self) -> Schema:
        net = self.module.net
        shape = (-1, int(net.action_dim)) if getattr(net, "continuous", True) else (-1,)
        dtype = np.float32 if getattr(net, "continuous", True) else np.int64
        return Schema([TensorSpec(np.dtype(dtype), shape)])

    def example(self) -> np.ndarray:
        return np.zeros((1, *self._obs_shape()), dtype=np.float32)

    def answer(self, model_input: Any, params: dict) -> np.ndarray:
        obs = np.asarray(model_input.to_numpy() if isinstance(model_input, pd.DataFrame) else model_input, np.float32)
        shape = self._obs_shape()
        if obs.shape[1:] != shape:
            raise InputError(f"observations: expected (B, {', '.join(map(str, shape))}), got {tuple(obs.shape)}")
        return self.module.act(torch.as_tensor(obs), deterministic=True).cpu().numpy()


def _at_least_1(params: dict, name: str) -> int:
    if int(params[name]) < 1:
        raise InputError(f"param {name}={params[name]} must be 1 or more")
    return int(params[name])


INTERFACES: dict[str, type[Interface]] = {
    c.__name__: c for c in (ImageClassifier, TextGenerator, ImageGenerator, Embedder, Policy)
}


def interface_for(module: LightningModule) -> Interface:
    """The prediction interface its row of the families table (``zoo.tracking.families``) names for ``module``."""
    row = family_of(module)
    if row.interface not in INTERFACES:
        served = sorted(f.name for f in FAMILIES.values() if f.interface)
        raise ValueError(f"{type(module).__name__} is in no family with a prediction interface ({served})")
    return INTERFACES[row.interface](module)


class ZooPyfunc(PythonModel):
    """The MLflow pyfunc of a zoo model: its module rebuilt from ``module.json`` (after the allowlist check) with
    ``weights.safetensors`` loaded, answering through its family's ``Interface``; bad input is MLflow's 400."""

    def __init__(self, module: LightningModule | None = None) -> None:
        self.interface = interface_for(module) if module is not None else None

    def load_context(self, context) -> None:
        self.interface = interface_for(read_module(context.artifacts["module"], context.artifacts["weights"]))

    # The hint is one MLflow infers no schema from (the logged signature is the schema, so no hint-based
    # check and no "add type hints" warning at every import); the agents' tensor schema gives an ndarray.
    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None):
        try:
            return self.interface.predict(model_input, params)
        except InputError as err:
            raise MlflowException(str(err), error_code=BAD_REQUEST) from err
