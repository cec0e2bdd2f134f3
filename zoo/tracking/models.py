"""Zoo modules as MLflow models: logged at the end of fit, registered by name, loaded back weights-only.

An MLflow model of a zoo module is a pyfunc logged as code (``zoo/tracking/pyfunc.py``) with two artifacts:
``weights.safetensors`` (the LightningModule's state dict: net, plus what the module keeps in buffers, such as
RL's observation normaliser) and ``module.json`` (its class path and ``save_hyperparameters`` arguments, with
the tokenizer and class names it carries). Safetensors and JSON rather than ``mlflow.pytorch``'s pickled
module: loading reads tensors and plain values and never runs code from the file; every class its config names
passes ``zoo.io.trust``'s allowlist before anything is imported. ``mlflow.pytorch``'s ``pt2`` format would also
be pickle-free, but needs an export per
family (GPT's generate, RL's act are not ``forward``) and loses ``load_from_checkpoint``-style rebuilding.

It answers raw inputs through its family's prediction interface (``zoo.tracking.serving``), whose signature (input
columns or tensor, params) and input example are logged with it. Its ``requirements.txt`` names every distribution the
logged code imports, with the extras the zoo declares, pinned at the installed versions, and the rest of the lock
(``constraints.txt``) as constraints: a fresh environment built from it alone (``mlflow models serve --env-manager
virtualenv``) loads and predicts (``tests/scripts/fresh_env_predict.py``).

``models:/<name>/<version>``, ``models:/<name>@<alias>`` and ``runs:/<id>/<path>`` are read by
``load_model`` (the module) and ``load`` (its prediction interface, as ``mlflow.pyfunc.load_model`` gives it, but
built from this zoo's code after the allowlist, never from the model's), and turned into a weights-only local
checkpoint by ``resolve_checkpoint`` (``--ckpt_path``), or into the local weights file a module starts from by
``local_weights`` (``init_weights``). Downloads are bounded and keep only the model's weights, spec and MLmodel
(``zoo.tracking.downloads``), once its folder matches the manifest of every file recorded when it was logged
(``zoo.tracking.manifest``).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.metadata
import json
import re
import shutil
import sys
import tempfile
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule

from zoo.errors import OPTIONAL_PACKAGES
from zoo.io.checkpoint import module_from
from zoo.io.files import read_json
from zoo.io.weights import extract_state_dict, load_file
from zoo.tracking.code import CODE_KEY, CODE_TAG, PYFUNC, bundle_code, code_sha256
from zoo.tracking.downloads import SPEC, WEIGHTS, cache_dir, download, logged_model_id, model_version
from zoo.tracking.manifest import MANIFEST_TAG, check_download, encode, folder_manifest
from zoo.tracking.runs import PARENT_TAG, STAGE_TAG
from zoo.tracking.store import process_tracking_uri, tracking_uri

URI_SCHEMES = ("models:/", "runs:/")
MODEL_PATH = "model"  # the model's folder in its run's artifacts
# What modules add to a checkpoint beyond weights and hparams that a trained model needs (GPT's and CLIP's
# tokenizer, what new images must look like and the class names: ``inputs``), as plain JSON; the rest (RNG
# states, replay buffers) is training state and stays in the .ckpt.
MODEL_STATE_KEYS = ("tokenizer", "inputs", "adapter_base")


def is_mlflow_uri(path: Any) -> bool:
    return isinstance(path, str) and path.startswith(URI_SCHEMES)


def module_spec(ckpt: dict, class_path: str | None = None) -> dict:
    """``module.json``: the class path, the hyperparameters that rebuild the module, and its model state."""
    hp = {k: v for k, v in dict(ckpt.get("hyper_parameters", {})).items() if k != "_instantiator"}
    class_path = hp.pop("_class_path", None) or class_path
    if not class_path:
        raise ValueError("the checkpoint names no module class (it was not built by cli.py): pass --class_path")
    extras = {k: ckpt[k] for k in MODEL_STATE_KEYS if k in ckpt}
    spec = {"class_path": class_path, "init_args": hp, "checkpoint": extras}
    data = {k: v for k, v in dict(ckpt.get("datamodule_hyper_parameters") or {}).items() if k != "_instantiator"}
    if "_class_path" in data:  # the training data's config, for validate/test without a config
        spec["data"] = {"class_path": data.pop("_class_path"), "init_args": data}
    return json.loads(json.dumps(spec, default=str))


def merged(state_dict: dict, spec: dict, init_weights: str | None = None) -> tuple[dict, dict]:
    """A model trained with LoRA registers merged: its adapters folded into the weights and its config without them,
    so serving needs neither PEFT nor the adapter's layers, and predicts at the speed of the plain net. A checkpoint
    that left its frozen base out reads it from ``init_weights`` (the run's own, never the checkpoint's)."""
    init_args = spec.get("init_args") or {}
    if not (init_args.get("adapt") or {}).get("lora"):
        return state_dict, spec
    from zoo.adapt import merge

    given = {"init_weights": init_weights} if init_weights else {}
    module = merge(module_from(spec, state_dict, given=given))
    extras = {k: v for k, v in spec.get("checkpoint", {}).items() if k != "adapter_base"}
    return dict(module.state_dict()), {**spec, "init_args": {**init_args, "adapt": None}, "checkpoint": extras}


def save_model(state_dict: dict, spec: dict, path: Path, mlflow_model=None, init_weights: str | None = None) -> Path:
    """Write the MLflow model folder (MLmodel with its signature, an input example, the pyfunc code, the zoo
    sources, pinned pip requirements and the lock as constraints); ``mlflow_model``: the ``mlflow.models.Model``
    its MLmodel starts from (the logged model's id and run)."""
    from safetensors.torch import save_file

    from zoo.tracking.serving import interface_for

    state_dict, spec = merged(state_dict, spec, init_weights)
    work = Path(tempfile.mkdtemp())
    # A tied pair (GPT's lm_head and tok_emb) is written twice: safetensors refuses shared storage, and
    # load_state_dict copies the same values into the one tied parameter.
    save_file({k: v.detach().clone().contiguous() for k, v in state_dict.items()}, str(work / WEIGHTS))
    (work / SPEC).write_text(json.dumps(spec, indent=1))
    try:
        interface = interface_for(module_from(spec, state_dict))
    except (ValueError, TypeError, argparse.ArgumentError) as err:  # a checkpoint saved by hand, without its config
        warnings.warn(f"logged without a signature: its hyperparameters build no module ({err})", stacklevel=2)
        interface = None
    zoo_dir = Path(__file__).resolve().parents[1]
    code = bundle_code(work / "code") / "zoo"
    # What serving it would run, for `python -m zoo.tracking verify` (zoo.tracking.code).
    digest = code_sha256(code.parent, Path(__file__).with_name(PYFUNC))
    requirements = model_requirements(code, zoo_dir.parent)
    requirements += [r for r in config_requirements(spec, zoo_dir.parent) if r not in requirements]
    lock = zoo_dir.parent / "constraints.txt"
    if lock.is_file():  # the lock's pins of what the requirements pull in, as constraints
        pulled = dependencies(requirements)
        kept = [line for line in lock.read_text().splitlines() if _lock_name(line) in pulled]
        (work / "constraints.txt").write_text("\n".join(kept) + "\n")
        requirements.append(f"-c {work / 'constraints.txt'}")
    import logging

    import mlflow

    # The signature is given: MLflow's note that it checks the example against it is nothing a user acts on.
    pyfunc_log = logging.getLogger("mlflow.pyfunc")
    level = pyfunc_log.level
    pyfunc_log.setLevel(logging.WARNING)
    try:
        mlflow.pyfunc.save_model(
            path=str(path),
            python_model=str(Path(__file__).with_name(PYFUNC)),
            artifacts={"weights": str(work / WEIGHTS), "module": str(work / SPEC)},
            code_paths=[str(code)],
            pip_requirements=requirements,
            signature=interface.signature() if interface else None,
            input_example=interface.example() if interface else None,
            mlflow_model=mlflow_model,
            metadata={CODE_KEY: digest},
        )
    finally:
        pyfunc_log.setLevel(level)
    shutil.rmtree(work, ignore_errors=True)
    return path


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).strip().lower()


def _lock_name(line: str) -> str | None:
    line = line.split("#")[0].strip()
    return canonical(re.split(r"[\[=<>!~; ]", line)[0]) if line and not line.startswith("-") else None


def dependencies(requirements: list[str]) -> set[str]:
    """The installed distributions ``requirements`` pull in, their extras' too, transitively (not themselves)."""
    from packaging.requirements import Requirement

    seen, todo = set(), [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        try:
            declared = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for dep in map(Requirement, declared):
            wanted = dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in [*req.extras, ""])
            if wanted and canonical(dep.name) not in seen:
                seen.add(canonical(dep.name))
                todo.append(dep)
    return seen - {canonical(Requirement(r).name) for r in requirements}


def imported_modules(code: Path) -> set[str]:
    """The top-level names every .py file under ``code`` imports (at module level or inside functions), less the
    standard library and the package's own."""
    names = set()
    for path in code.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != code.name}


def declared_extras(project: Path) -> dict[str, list[str]]:
    """The extras the zoo asks of each of its dependencies (``jsonargparse[signatures]``): from ``pyproject.toml``
    beside the code, else from the installed zoo's metadata."""
    from packaging.requirements import Requirement

    pyproject = project / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        declared = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    else:
        try:
            declared = [r for r in importlib.metadata.requires("zoo") or [] if "extra ==" not in r]
        except importlib.metadata.PackageNotFoundError:
            declared = []
    return {canonical(r.name): sorted(r.extras) for r in map(Requirement, declared) if r.extras}


def model_requirements(code: Path, project: Path) -> list[str]:
    """``name[extras]==version`` of every installed distribution the code under ``code`` imports; names the project
    holds itself (``callbacks``, ``datamodules``: the application, which the model never imports) are left out, and
    so are optional packages that are not installed (``zoo.errors.OPTIONAL_PACKAGES``: only the feature that needs
    one imports it, and a model trained without it does not use that feature)."""
    providers = importlib.metadata.packages_distributions()
    extras = declared_extras(project)
    requirements = {}
    for module in sorted(imported_modules(code)):
        if (project / module).is_dir() or (project / f"{module}.py").is_file():
            continue
        dists = providers.get(module)
        if not dists and module in OPTIONAL_PACKAGES:  # imported only by a feature this install cannot run
            continue
        if not dists:
            raise ModuleNotFoundError(f"the model's code imports {module!r}, which no installed distribution provides")
        # One of several (mlflow, mlflow-skinny): the one the zoo declares, else the first.
        dist = next((d for d in dists if canonical(d) in extras or canonical(d) == canonical(module)), dists[0])
        name = canonical(dist)
        wanted = f"[{','.join(extras[name])}]" if name in extras else ""
        requirements[name] = f"{name}{wanted}=={importlib.metadata.version(dist)}"
    return list(requirements.values())


def config_requirements(spec: dict, project: Path) -> list[str]:
    """``name==version`` of the installed distributions that provide the classes from outside the zoo which ``spec``
    names by class path (a latent diffusion model's ``diffusers.AutoencoderKL``, ``zoo.diffusion.latent.AUTOENCODERS``):
    the family builds them from that path, so no import in the logged code names their distribution."""
    paths: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("class_path"), str):
                paths.add(value["class_path"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(spec.get("init_args") or {})
    providers = importlib.metadata.packages_distributions()
    out = []
    for top in sorted({p.split(".")[0] for p in paths} - {"zoo"}):
        if (project / top).is_dir() or (project / f"{top}.py").is_file():
            continue
        if not providers.get(top):
            raise ModuleNotFoundError(f"the model's config names {top!r}, which no installed distribution provides")
        dist = providers[top][0]
        out.append(f"{canonical(dist)}=={importlib.metadata.version(dist)}")
    return out


def log_checkpoint_model(
    ckpt_path: str | Path,
    client,
    run_id: str,
    registered_model_name: str | None = None,
    class_path: str | None = None,
    monitor: str | None = None,
    init_weights: str | None = None,
) -> str:
    """Log a checkpoint's module as an MLflow logged model of run ``run_id`` (``runs:/<run_id>/model``, or
    ``model-<ckpt>-<hex>`` if the run has one: a registered version points at its model, which must not change),
    with the run's final evaluation metrics linked to it (``monitor`` first); register a version when
    ``registered_model_name`` is given. Returns ``runs:/...`` and ``= models:/<name>/<v>``. A sharded (FSDP2)
    checkpoint directory is consolidated first."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model

    ckpt = load_checkpoint(ckpt_path)
    spec = module_spec(ckpt, class_path)
    run = client.get_run(run_id)
    taken = {m.name for m in client.search_logged_models([run.info.experiment_id], f"source_run_id = '{run_id}'")}
    name = MODEL_PATH
    if MODEL_PATH in taken or client.list_artifacts(run_id, MODEL_PATH):
        name = f"{MODEL_PATH}-{Path(ckpt_path).stem}-{uuid.uuid4().hex[:6]}"
    tags = {"zoo.class_path": spec["class_path"], "zoo.checkpoint": Path(ckpt_path).name}
    model = client.create_logged_model(run.info.experiment_id, name, run_id, tags, model_type="zoo")
    try:
        mlmodel = Model(
            artifact_path=model.artifact_location, model_uuid=model.model_id, run_id=run_id, model_id=model.model_id
        )
        with tempfile.TemporaryDirectory() as tmp:
            folder = save_model(extract_state_dict(ckpt), spec, Path(tmp) / MODEL_PATH, mlmodel, init_weights)
            # In the tracking store, apart from the artifact store that holds the files (zoo.tracking.manifest).
            tags[MANIFEST_TAG] = encode(folder_manifest(folder))
            client.log_model_artifacts(model.model_id, str(folder))
            tags[CODE_TAG] = Model.load(str(folder)).metadata[CODE_KEY]
            client.set_logged_model_tags(model.model_id, {CODE_TAG: tags[CODE_TAG]})
            client.set_logged_model_tags(model.model_id, {MANIFEST_TAG: tags[MANIFEST_TAG]})
        # Linked by logging them again with the model's id (as mlflow.<flavor>.log_model does): the model's page,
        # its registered versions and the runs table show these, in this order.
        metrics = model_metrics(client, run, monitor, model.model_id)
        client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=max((m.step for m in metrics), default=0))])
        client.log_batch(run_id, metrics=metrics)
    except BaseException:
        client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
        raise
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    where = f"runs:/{run_id}/{name}"
    if not registered_model_name:
        return where
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(registered_model_name)
    except MlflowException:  # it exists: this is a new version of it
        pass
    # The source names the logged model (models:/<model_id>), which is how the registry and its UI link a version to
    # its model and metrics.
    # Its tags: the metrics as linked (readable through the registry API alone).
    tags = {**tags, **{m.key: str(m.value) for m in metrics}, **staged_tags(run)}
    with process_tracking_uri(client.tracking_uri):
        version = client.create_model_version(
            registered_model_name, f"models:/{model.model_id}", run_id, tags, model_id=model.model_id
        )
    link_version(client, model.model_id, registered_model_name, version.version)
    return f"{where} = models:/{registered_model_name}/{version.version}"


def link_version(client, model_id: str, name: str, version: str) -> None:
    """Record the version on its logged model as ``mlflow.register_model`` does (the ``mlflow.modelVersions`` tag,
    a JSON list of ``{name, version}``): the logged model's page reads it to show "Registered" and the version,
    where a version created alone leaves "Not registered" and a "Register model" button that invites a duplicate."""
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    linked = json.loads(client.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS) or "[]")
    entry = {"name": name, "version": int(version)}  # a number, as register_model writes it
    if entry not in linked:
        client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps([*linked, entry])})


def staged_tags(run) -> dict[str, str]:
    """The run's stage and parent model (``zoo.tracking.report``), which the versions it registers carry."""
    return {k: run.data.tags[k] for k in (STAGE_TAG, PARENT_TAG) if k in run.data.tags}


def ranked_metrics(keys, monitor: str | None = None) -> list[str]:
    """The metrics a run is judged by, in the order to show them: ``monitor``, the evaluation metrics (``val/``,
    ``test/``), then the training loss; not gradient norms, learning rates or counters."""
    chosen = [k for k in keys if k.startswith(("val/", "test/")) or k in ("train/loss", "loss")]
    return sorted(chosen, key=lambda k: (k != monitor, not k.startswith(("val/", "test/")), k))


def model_metrics(client, run, monitor: str | None = None, model_id: str | None = None) -> list:
    """The run's last values of ``ranked_metrics``, as MLflow metrics linked to ``model_id``."""
    from mlflow.entities import Metric

    out = []
    for key in ranked_metrics(run.data.metrics, monitor):
        last = max(client.get_metric_history(run.info.run_id, key), key=lambda m: (m.step, m.timestamp))
        out.append(Metric(key, last.value, last.timestamp, last.step, model_id=model_id, run_id=run.info.run_id))
    return out


def load_checkpoint(ckpt_path: str | Path) -> dict:
    """A checkpoint file, weights-only; a sharded checkpoint directory through its safe consolidation."""
    if not Path(ckpt_path).is_dir():
        return load_file(ckpt_path)
    from zoo.train.parallel import consolidate

    with tempfile.TemporaryDirectory() as tmp:
        return load_file(consolidate(ckpt_path, Path(tmp) / "consolidated.ckpt"))


def _download(uri: str, tracking_uri_: str | None) -> Path:
    """A local copy of what ``uri`` names, downloaded once and bounded (``zoo.tracking.downloads``)."""
    return download(uri, tracking_uri_ or tracking_uri(), check=check_download)


@contextlib.contextmanager
def _evicted_if_refused(local: Path):
    """A downloaded model that its loader refuses (an unsafe file, a class outside the allowlist) is removed from the
    cache: what is kept there is what loaded."""
    try:
        yield
    except Exception:
        entry = _cache_entry(local)
        if entry is not None:
            shutil.rmtree(entry, ignore_errors=True)
        raise


def _cache_entry(local: Path) -> Path | None:
    """The cache folder holding ``local``, if it lies in the cache."""
    root = cache_dir().resolve()
    local = local.resolve()
    return root / local.relative_to(root).parts[0] if local.is_relative_to(root) and local != root else None


def _read_model_dir(local: Path) -> tuple[dict, dict]:
    """The spec and state dict of a downloaded model folder: JSON and safetensors only, nothing else is read."""
    spec_file, weights = next(local.rglob(SPEC), None), next(local.rglob(WEIGHTS), None)
    if spec_file is None or weights is None:
        raise FileNotFoundError(
            f"{local} holds no zoo model ({SPEC} + {WEIGHTS}): log one with python -m zoo.tracking log-model"
        )
    return read_json(spec_file), load_file(weights)  # bounded: a link to /dev/zero is refused, not read forever


def load_model(uri: str, tracking_uri: str | None = None) -> LightningModule:
    """The module at ``models:/<name>/<version>``, ``models:/<name>@<alias>``, ``runs:/<id>/model`` or a local
    checkpoint, rebuilt from its own hyperparameters and loaded weights-only, in eval mode."""
    local = _download(uri, tracking_uri) if is_mlflow_uri(uri) else Path(uri)
    with _evicted_if_refused(local):
        if local.is_dir():
            spec, state_dict = _read_model_dir(local)
        else:
            ckpt = load_file(local)
            spec, state_dict = module_spec(ckpt), extract_state_dict(ckpt)
        return module_from(spec, state_dict, uri)


def load(uri: str, tracking_uri: str | None = None):
    """The model at ``uri`` as an ``mlflow.pyfunc.PyFuncModel``: ``load(uri).predict(model_input, params)`` answers
    as ``mlflow.pyfunc.load_model`` and ``mlflow models serve`` do (same interface, signature checks and casts), with
    the module rebuilt by this zoo's code after the allowlist check (the model's own code is never run). A local
    checkpoint takes the signature its family's interface states. A bare value or list fills a model's one input
    column of plain values, as the scoring server reads ``{"inputs": [...]}`` for a model of one column
    (``load(uri).predict(["a prompt", "another"])``: over HTTP a GPT's ``prompt`` is named, beside ``messages``)."""
    from mlflow.models import Model
    from mlflow.pyfunc import PyFuncModel

    from zoo.tracking.serving import ZooPyfunc, as_the_server_reads

    class ZooModel(PyFuncModel):
        def predict(self, data, params=None):
            return super().predict(as_the_server_reads(data, self.metadata.get_input_schema()), params)

    local = _download(uri, tracking_uri) if is_mlflow_uri(uri) else Path(uri)
    pyfunc = ZooPyfunc(load_model(str(local)))
    meta = Model.load(str(local)) if (local / "MLmodel").is_file() else Model(signature=pyfunc.interface.signature())
    return ZooModel(meta, _Predict(pyfunc))


class _Predict:
    """What ``PyFuncModel`` calls: ``predict(data, params)`` of the pyfunc."""

    def __init__(self, pyfunc) -> None:
        self.python_model = pyfunc

    def predict(self, data, params=None):
        return self.python_model.predict(None, data, params)


def resolve_checkpoint(uri: str, tracking_uri: str | None = None) -> str:
    """A local checkpoint for ``--ckpt_path``: a logged checkpoint file as it is, a model folder as a
    weights-only Lightning checkpoint (state dict and hyperparameters) written once beside its cached copy."""
    import lightning

    local = _download(uri, tracking_uri)
    if local.is_file():
        return str(local)
    dst = local / ".checkpoint" / "model.ckpt"  # inside this model's own cached folder (a logged model's is the entry)
    if dst.is_file():
        return str(dst)
    with _evicted_if_refused(local):
        spec, state_dict = _read_model_dir(local)
    ckpt = {
        "state_dict": state_dict,
        "pytorch-lightning_version": lightning.__version__,
        "hyper_parameters": {"_class_path": spec["class_path"], **spec["init_args"]},
        **spec.get("checkpoint", {}),
    }
    if "data" in spec:
        ckpt["datamodule_hyper_parameters"] = {"_class_path": spec["data"]["class_path"], **spec["data"]["init_args"]}
    dst.parent.mkdir(exist_ok=True)
    partial = dst.with_suffix(f".{uuid.uuid4().hex[:8]}.partial")
    torch.save(ckpt, partial)
    partial.replace(dst)
    return str(dst)


def training_run(uri: str, tracking_uri_: str | None = None) -> str | None:
    """The id of the run that trained the checkpoint or model ``uri``: a model version's run, ``runs:/<id>/``, or
    ``<id>`` in a local ``<root>/<experiment>/<id>/checkpoints/<file>``; None when it cannot tell."""
    if (model_id := logged_model_id(uri)) is not None:
        from mlflow.tracking import MlflowClient

        store = tracking_uri_ or tracking_uri()
        return MlflowClient(store, registry_uri=store).get_logged_model(model_id).source_run_id
    if uri.startswith("models:/"):
        return model_version(uri, tracking_uri_ or tracking_uri()).run_id
    if uri.startswith("runs:/"):
        return uri.removeprefix("runs:/").split("/", 1)[0]
    path = Path(uri).resolve()
    return path.parent.parent.name if path.parent.name == "checkpoints" else None


def local_weights(path: str) -> str:
    """``init_weights``: a registered model's ``weights.safetensors`` (the module's keys, ``net.`` first) for
    an MLflow URI, downloaded; any other path as it is."""
    if not is_mlflow_uri(path):
        return path
    local = _download(path, None)
    weights = local if local.is_file() else next(local.rglob(WEIGHTS), None)
    if weights is None:
        raise FileNotFoundError(f"{path} holds no {WEIGHTS}: log the model with zoo.tracking log-model")
    return str(weights)
