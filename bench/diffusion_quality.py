"""Diffusion family: sample quality against sampler and step count, flow matching against eps, at equal training.

One command trains (or takes as checkpoints) three models and measures every row's classifier Fréchet distance:
  classifier  configs/cnn/convnet_shapes.yaml at image_size 16 (the 16 px shapes classifier whose last layer's
              input gives the features, as ``callbacks.FrechetDistance`` uses it).
  eps         configs/diffusion/dit_tiny_shapes16.yaml as it is: DiT's recipe, eps prediction with learned
              variances (hybrid loss), linear betas, T = 1000.
  flow        configs/diffusion/flow_dit_tiny_shapes16.yaml: the same DiT (depth 4, width 128, patch 2; 3 output
              channels instead of 6), velocity of the linear path, logit-normal times.
Both diffusion models train through cli.py's parser for --train-steps steps of batch --batch with the same seed
(so the same images in the same order, the same initial weights of the shared layers), the configs' optimizer,
EMA and label dropout; no validation, no sample grids. Each row then samples N = --num-samples images with the
module's guidance (2.0 in both configs, classifier-free, one batched call per step) and its clip_denoised (1.0),
classes in turn, seed s for every model (the same starting noise x_T for eps and flow), and compares them with
the first N validation images (the callback's reference set) in the classifier's features. The floor is the
distance between two real sets of N (validation vs test): no model can be told apart from the data below it.

NFE is net evaluations per image (Heun: 2 S - 1; guidance doubles the batch, not the calls); "s" is the wall
time of sampling the N images (the first seed), on --threads threads. A metric at N = 256 is noisy: the later
--sample-seeds repeat the --repeat rows with other noise, which shows how far apart two seeds put one row.

    python bench/diffusion_quality.py          # 800 steps, 1 thread: ~1 h on a busy 2-core CPU (24 min training)
    python bench/diffusion_quality.py --classifier c.ckpt --eps e.ckpt --flow f.ckpt   # given checkpoints
    python bench/diffusion_quality.py --train-steps 2 --num-samples 8 --rows eps:ddim:5,flow:euler:4   # a smoke run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # cli.py, callbacks/, datamodules/ live at the root

import torch

from bench._common import cpu_model, table
from zoo.diffusion import DDIMSampler, DiffusionModule, DPMSolverPlusPlus2M, FlowEulerSampler, FlowHeunSampler

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "classifier": "configs/cnn/convnet_shapes.yaml",
    "eps": "configs/diffusion/dit_tiny_shapes16.yaml",
    "flow": "configs/diffusion/flow_dit_tiny_shapes16.yaml",
}
SAMPLERS = {  # name in --rows: (model it samples, sampler class, name in the table)
    "ddim": ("eps", DDIMSampler, "DDIM"),
    "dpm": ("eps", DPMSolverPlusPlus2M, "DPM-Solver++(2M)"),
    "euler": ("flow", FlowEulerSampler, "Euler"),
    "heun": ("flow", FlowHeunSampler, "Heun"),
}
DEFAULT_ROWS = (
    "eps:ddim:50,eps:ddim:20,eps:ddim:15,eps:dpm:20,eps:dpm:15,eps:dpm:10,"
    "flow:euler:32,flow:euler:16,flow:euler:8,flow:heun:8"
)
DEFAULT_REPEAT = "eps:ddim:50,eps:dpm:15,flow:euler:16"  # the rows the goals compare
IMAGE_SIZE, NUM_VAL = 16, 512  # the configs' data: 16 px shapes, 512 validation images


@dataclass(frozen=True)
class Row:
    model: str  # "eps" or "flow"
    sampler: str  # a key of SAMPLERS
    steps: int

    @property
    def spec(self) -> str:
        return f"{self.model}:{self.sampler}:{self.steps}"

    @property
    def label(self) -> str:
        return f"{self.model} {SAMPLERS[self.sampler][2]}-{self.steps}"

    def sampler_class(self):
        return partial(SAMPLERS[self.sampler][1], steps=self.steps)


def parse_rows(text: str) -> list[Row]:
    """'model:sampler:steps,...' -> rows; a sampler of the other model's kind or a bad count is refused."""
    rows = []
    for spec in filter(None, (s.strip() for s in text.split(","))):
        parts = spec.split(":")
        if len(parts) != 3 or parts[1] not in SAMPLERS or not parts[2].isdigit() or int(parts[2]) < 1:
            raise SystemExit(
                f"error: row {spec!r} is not model:sampler:steps with sampler one of {', '.join(SAMPLERS)} and "
                "steps >= 1 (e.g. eps:ddim:50, flow:euler:16)"
            )
        model, sampler, steps = parts[0], parts[1], int(parts[2])
        if SAMPLERS[sampler][0] != model:
            raise SystemExit(f"error: row {spec!r}: {sampler} samples the {SAMPLERS[sampler][0]} model, not {model}")
        rows.append(Row(model, sampler, steps))
    if not rows:
        raise SystemExit("error: --rows names no row (e.g. --rows eps:ddim:50,flow:euler:16)")
    return rows


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        raise SystemExit(f"error: --sample-seeds {text!r} is not a comma-separated list of integers (e.g. 0,1)")
    return seeds


# -- training ----------------------------------------------------------------------------------------------


def train(name: str, steps: int, batch: int, seed: int, out: Path) -> tuple[Path, float]:
    """Fits ``name``'s config through cli.py's parser for ``steps`` optimizer steps (one epoch of steps x batch
    images, so the config's warmup and cosine run over them); returns the checkpoint (EMA weights) and seconds."""
    args = ["--config", str(ROOT / CONFIGS[name]), f"--seed_everything={seed}", "--trainer.max_epochs=1"]
    if name == "classifier":  # the config's own length (2 epochs of 10k), at 16 px
        args = args[:2] + [f"--seed_everything={seed}", f"--data.init_args.image_size={IMAGE_SIZE}"]
    else:
        data = "--data.init_args.images.init_args"
        args += [f"{data}.num_train={steps * batch}", f"{data}.batch_size={batch}"]
    return fit(args + ["--trainer.limit_val_batches=0"], out / f"{name}.ckpt")


def fit(args: list[str], path: Path) -> tuple[Path, float]:
    """cli.py's ``fit`` with ``args`` and nothing else (no logger, callbacks, checkpoints, bars), the model saved to
    ``path``; returns it and the seconds of fit."""
    from cli import main

    args = [
        *args,
        "--trainer.logger=false",
        "--trainer.callbacks=[]",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={path.parent}",
    ]
    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI would read this script's own arguments too
    try:
        cli = main(args, run=False)
    finally:
        sys.argv = argv
    t0 = time.perf_counter()
    cli.trainer.fit(cli.model, cli.datamodule)
    seconds = time.perf_counter() - t0
    cli.trainer.save_checkpoint(path)  # fit ended holding the EMA: the checkpoint's state_dict is the average
    return path, seconds


# -- measuring ---------------------------------------------------------------------------------------------


def real_sets(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n validation and test images of the configs' shapes data, in [-1, 1]."""
    from datamodules import ShapesDataModule

    dm = ShapesDataModule(image_size=IMAGE_SIZE, num_train=1, num_val=NUM_VAL, num_test=NUM_VAL, seed=seed)
    dm.setup()
    return tuple(dm.shapes[split].images[:n] * 2 - 1 for split in ("val", "test"))


class Frechet:
    """The classifier Fréchet distance of image sets to a fixed real set: torchmetrics' FID over the classifier's
    features, as ``callbacks.FrechetDistance`` computes it."""

    def __init__(self, classifier: str, real: torch.Tensor) -> None:
        from torchmetrics.image.fid import FrechetInceptionDistance

        from callbacks.frechet import classifier_net
        from zoo.diffusion.metrics import ClassifierFeatures

        features = ClassifierFeatures(classifier_net(classifier))
        self.metric = FrechetInceptionDistance(feature=features, reset_real_features=False)
        self.metric.update(real, real=True)

    def __call__(self, images: torch.Tensor) -> float:
        self.metric.update(images, real=False)
        value = self.metric.compute().item()
        self.metric.reset()  # the generated side only
        return value


def num_calls(module: DiffusionModule, row: Row) -> int:
    return module.objective.sampler(row.sampler_class(), module.hparams.clip_denoised).num_calls()


def sample(module: DiffusionModule, row: Row, n: int, batch: int, seed: int) -> tuple[torch.Tensor, float]:
    """n images as the Fréchet callback draws them (batch i: seed + i, classes in turn); (images, seconds)."""
    from callbacks.frechet import generated_images

    t0 = time.perf_counter()
    images = torch.cat(list(generated_images(module, n, batch, row.sampler_class(), None, seed)))
    return images, time.perf_counter() - t0


def measure(
    modules: dict, rows: list[Row], frechet: Frechet, n: int, batch: int, seeds: list[int], repeat: set[str]
) -> list[list]:
    """One table row per (model, sampler, steps): NFE, FD at each seed (later seeds on ``repeat`` rows), seconds."""
    table_rows = []
    for row in rows:
        module = modules[row.model]
        fds, seconds = [], None
        for k, seed in enumerate(seeds):
            if k and row.spec not in repeat:
                fds.append("")
                continue
            images, s = sample(module, row, n, batch, seed)
            seconds = s if seconds is None else seconds
            fds.append(f"{frechet(images):.1f}")
            print(f"  {row.label}, seed {seed}: FD {fds[-1]} ({s:.0f} s)", flush=True)
        table_rows.append([row.label, num_calls(module, row), *fds, f"{seconds:.1f}"])
    return table_rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-steps", type=int, default=800, help="optimizer steps of each diffusion model")
    ap.add_argument("--batch", type=int, default=32, help="training batch (the configs': 32)")
    ap.add_argument("--seed", type=int, default=0, help="training seed, the same for every model")
    ap.add_argument("--classifier", help="a ClassifierModule checkpoint on the 16 px shapes (else trained)")
    ap.add_argument("--eps", help="a DiffusionModule checkpoint of dit_tiny_shapes16 (else trained)")
    ap.add_argument("--flow", help="a DiffusionModule checkpoint of flow_dit_tiny_shapes16 (else trained)")
    ap.add_argument("--out", help="folder of the trained checkpoints (default: a temporary folder)")
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="model:sampler:steps,... (samplers: ddim, dpm, euler, heun)")
    ap.add_argument("--num-samples", type=int, default=256, help="N generated and real images per distance")
    ap.add_argument("--sample-batch", type=int, default=256, help="images per sample() call")
    ap.add_argument("--sample-seeds", default="0,1", help="sampling seeds: the first for every row")
    ap.add_argument("--repeat", default=DEFAULT_REPEAT, help="rows sampled at the later seeds too ('all': every row)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    rows, seeds = parse_rows(args.rows), parse_seeds(args.sample_seeds)
    repeat = {r.spec for r in rows} if args.repeat == "all" else {r.spec for r in parse_rows(args.repeat)}
    if args.train_steps < 1 or args.batch < 1 or args.num_samples < 2:
        raise SystemExit("error: --train-steps and --batch must be >= 1 and --num-samples >= 2")
    if args.num_samples > NUM_VAL:
        raise SystemExit(f"error: --num-samples {args.num_samples} exceeds the {NUM_VAL} validation images rendered")
    real, other = real_sets(args.num_samples)
    torch.set_num_threads(args.threads)
    print(f"== Diffusion sample quality at equal training steps ({args.train_steps} x batch {args.batch})")
    print(f"torch {torch.__version__}; CPU: {cpu_model()}; threads: {torch.get_num_threads()}")

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="diffusion_quality_"))
    out.mkdir(parents=True, exist_ok=True)
    ckpts = {"classifier": args.classifier, "eps": args.eps, "flow": args.flow}
    needed = ["classifier"] + sorted({r.model for r in rows})
    for name in needed:
        if ckpts[name] is None:
            ckpts[name], seconds = train(name, args.train_steps, args.batch, args.seed, out)
            print(f"trained {name}: {ckpts[name]} ({seconds / 60:.1f} min)", flush=True)
    modules = {
        name: DiffusionModule.load_from_checkpoint(ckpts[name], map_location="cpu", weights_only=True).eval()
        for name in needed[1:]
    }
    frechet = Frechet(str(ckpts["classifier"]), real)
    floor = frechet(other)
    print(f"real-vs-real floor (validation vs test, N = {args.num_samples}): {floor:.1f}", flush=True)
    results = measure(modules, rows, frechet, args.num_samples, args.sample_batch, seeds, repeat)
    headers = ["model, sampler-steps", "NFE", *[f"FD seed {s}" for s in seeds], "s"]
    print(f"\nclassifier FD at N = {args.num_samples}, guidance 2.0 (the configs'); floor {floor:.1f}")
    print(table(headers, results))


if __name__ == "__main__":
    main()
