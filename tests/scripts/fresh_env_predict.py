"""Does a logged model load and predict in a fresh environment built from its own requirements.txt alone?

What ``mlflow models serve --env-manager virtualenv`` does, by hand: for each family, a tiny fit logs its MLflow model
(this checkout, this venv); its folder is downloaded; a new venv gets ``pip install -r requirements.txt`` (the
model's pins and its ``-c constraints.txt``, nothing else); there, outside this checkout and with no PYTHONPATH,
``mlflow.pyfunc.load_model`` loads the folder and predicts on its own input example. One venv serves every family
whose requirements are the same file. Not in the test suite: installing torch takes minutes and gigabytes.

    python tests/scripts/fresh_env_predict.py [--families cnn gpt ...] [--keep DIR] -- <pip args>

Pip args after ``--`` go to ``pip install`` (an offline machine: ``--no-index --find-links <wheel folder> ...``).
Prints one line per family (OK with the answer's shape and first row, or FAIL with the error) and exits 1 on a FAIL.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {
    "cnn": "cnn/convnet_digits.yaml",
    "gpt": "gpt/gpt_tiny.yaml",
    "diffusion": "diffusion/tiny.yaml",
    "clip": "clip/tiny.yaml",
    "rl": "rl/ppo_tiny.yaml",
}
PREDICT = """
import sys, mlflow
model = mlflow.pyfunc.load_model(sys.argv[1])
out = model.predict(model.input_example)
import zoo
assert zoo.__file__.startswith(sys.argv[1]), zoo.__file__  # the model's own copy of the code, not a checkout
print(type(out).__name__, getattr(out, "shape", None), repr(out[:1] if hasattr(out, "shape") else out)[:300])
"""


def log_model(family: str, work: Path) -> Path:
    """A tiny fit of ``family`` in ``work``; returns its downloaded MLflow model folder."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"}
    args = [sys.executable, str(ROOT / "cli.py"), "fit", "--config", str(ROOT / "configs" / CONFIGS[family])]
    args += ["--trainer.max_steps=2", "--trainer.limit_val_batches=1"]
    proc = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    found = re.search(r"MLflow model: (runs:/\S+)", proc.stdout)
    if proc.returncode or not found:
        raise RuntimeError(f"fit failed:\n{proc.stderr[-2000:]}")
    import mlflow

    dst = work / f"{family}-model"
    # A run's logged model is found through the process-wide store (MLflow's ModelsArtifactRepository).
    os.environ["MLFLOW_TRACKING_URI"] = env["MLFLOW_TRACKING_URI"]
    mlflow.artifacts.download_artifacts(found.group(1), tracking_uri=env["MLFLOW_TRACKING_URI"], dst_path=str(dst))
    return next(p for p in dst.iterdir() if (p / "MLmodel").is_file()) if not (dst / "MLmodel").is_file() else dst


def fresh_env(model: Path, envs: Path, pip_args: list[str]) -> Path:
    """A venv with the model's requirements.txt installed, shared by models whose requirements are identical."""
    text = (model / "requirements.txt").read_text() + (model / "constraints.txt").read_text()
    where = envs / hashlib.sha256(text.encode()).hexdigest()[:12]
    python = where / "bin" / "python"
    if not python.exists():
        venv.create(where, with_pip=True)
        cmd = [str(python), "-m", "pip", "install", "-q", "-r", str(model / "requirements.txt"), *pip_args]
        proc = subprocess.run(cmd, cwd=model, capture_output=True, text=True, timeout=3600)
        if proc.returncode:
            shutil.rmtree(where, ignore_errors=True)
            raise RuntimeError(f"pip install -r requirements.txt failed:\n{proc.stdout[-1500:]}{proc.stderr[-2500:]}")
    return python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--keep", type=Path, help="folder for the models and venvs (kept); default: a temporary one")
    argv = sys.argv[1:]
    pip_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    opts = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    work = opts.keep or Path(tempfile.mkdtemp(prefix="fresh-env-"))
    work.mkdir(parents=True, exist_ok=True)
    failed = False
    for family in opts.families:
        try:
            model = log_model(family, work)
            python = fresh_env(model, work / "venvs", pip_args)
            clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
            proc = subprocess.run(
                [str(python), "-c", PREDICT, str(model)], cwd=work, env=clean, capture_output=True, text=True
            )
            if proc.returncode:
                raise RuntimeError(proc.stderr[-2500:])
            print(f"{family}: OK  {proc.stdout.strip()}", flush=True)
        except Exception as err:  # every family is tried and reported
            failed = True
            print(f"{family}: FAIL  {err}", flush=True)
    if not opts.keep:
        shutil.rmtree(work, ignore_errors=True)
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
