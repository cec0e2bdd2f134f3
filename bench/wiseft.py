"""WiSE-FT on CLIP: how much of the source task's zero-shot accuracy the chosen alpha keeps, and how much of full
fine-tuning's target accuracy it reaches (issue 40's figure: >= 90% and >= 95%).

Offline, on the generated shapes, in two ``cli.py fit`` runs in this process:
  1. pretraining (the source task): ``configs/clip/convnet_shapes.yaml`` on the shapes captions, ``--pretrain-steps``;
     its zero-shot shape accuracy on the held-out shapes is what fine-tuning can lose;
  2. fine-tuning (the target task) from its last checkpoint on the same kind of shapes shifted (``--shift``: grey
     images by default), with ``callbacks.WiseFT`` sweeping alpha over [0, 1] on the shifted shapes' zero-shot
     accuracy (target) and the plain shapes' (source: the pretraining's held-out split), choosing the best target
     accuracy among the points keeping ``--keep`` of the start's source accuracy.
Full fine-tuning is the sweep's alpha = 1 (the weights the fit ended with, as the zoo registers them without WiSE-FT);
the start is alpha = 0. Zero-shot accuracy is over the six shape names (chance 1/6), on ``--num-val`` images each.

    python bench/wiseft.py                                # ~15-25 min on 2 CPU cores (12 min of it pretraining)
    python bench/wiseft.py --start <a pretrained ckpt>    # the fine-tune and the sweep alone
    python bench/wiseft.py --shift negative               # another target task
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch import Tensor

from bench._common import print_header, resolve_device, set_threads, table
from datamodules.captions import CaptionDataModule

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "clip" / "convnet_shapes.yaml")
SHAPES = {"image_size": 32, "context_length": 48}  # the config's data settings, for both tasks


class GreyShapes(CaptionDataModule):
    """The generated shapes with their captions, each image in grey (the mean of its channels)."""

    def _normalise(self, images: Tensor) -> Tensor:
        return super()._normalise(images.mean(1, keepdim=True).expand_as(images))


class NegativeShapes(CaptionDataModule):
    """The generated shapes with their captions, each image its photo negative (1 - x)."""

    def _normalise(self, images: Tensor) -> Tensor:
        return super()._normalise(1.0 - images)


SYNONYMS = dict(circle="disc", square="box", triangle="wedge", cross="plus", diamond="rhombus", ring="hoop")


class SynonymShapes(CaptionDataModule):
    """The generated shapes, their captions and class names saying each shape with another word ("a red disc")."""

    def encode(self, texts):
        return super().encode([" ".join(SYNONYMS.get(w, w) for w in t.split(" ")) for t in texts])


SHIFTS = {"grey": GreyShapes, "negative": NegativeShapes, "synonyms": SynonymShapes}


def fit(args: list[str]):
    from cli import main

    sys.argv = sys.argv[:1]  # the benchmark's own flags are not the CLI's
    base = ["--config", CONFIG, "--trainer.enable_progress_bar=false", "--trainer.accelerator=cpu"]
    return main(["fit", *base, "--trainer.max_epochs=-1", *args])


def wise_callback(alphas: list[float], keep: float, num_val: int) -> str:
    shapes = {**SHAPES, "num_train": 1, "num_val": num_val}  # only the held-out split is read
    source = {"class_path": "datamodules.CaptionDataModule", "init_args": shapes}
    init = {"alphas": alphas, "metric": "val/zeroshot_acc", "keep_source": keep, "source": source}
    return json.dumps({"class_path": "callbacks.WiseFT", "init_args": init})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pretrain-steps", type=int, default=900)
    ap.add_argument("--finetune-steps", type=int, default=150)
    ap.add_argument("--finetune-lr", type=float, default=3e-4)
    ap.add_argument("--shift", choices=sorted(SHIFTS), default="grey", help="the target task's shapes")
    ap.add_argument("--num-val", type=int, default=1000, help="held-out images of each task")
    ap.add_argument("--alphas", type=int, default=21, help="points of the alpha grid over [0, 1]")
    ap.add_argument("--keep", type=float, default=0.9, help="the share of the start's source accuracy to keep")
    ap.add_argument("--start", help="a pretrained checkpoint to fine-tune (skips the pretraining)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    set_threads(args.threads)
    print_header(f"WiSE-FT on CLIP: shapes (source) -> {args.shift} shapes (target)", resolve_device("cpu"))
    alphas = [round(i / (args.alphas - 1), 4) for i in range(args.alphas)]
    val = f"--data.init_args.num_val={args.num_val}"
    start = str(Path(args.start).resolve()) if args.start else None
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        t0 = time.perf_counter()
        if start is None:
            start = fit([f"--trainer.max_steps={args.pretrain_steps}", val]).trainer.checkpoint_callback.last_model_path
        t1 = time.perf_counter()
        tuned = fit(
            [
                f"--trainer.max_steps={args.finetune_steps}",
                f"--model.init_args.init_weights={start}",
                f"--model.init_args.optimizer.lr={args.finetune_lr}",
                f"--model.init_args.optimizer.warmup_steps={args.finetune_steps // 10}",
                f"--data=bench.wiseft.{SHIFTS[args.shift].__name__}",
                *[f"--data.init_args.{k}={v}" for k, v in SHAPES.items()],
                val,
                f"--trainer.callbacks+={wise_callback(alphas, args.keep, args.num_val)}",
            ]
        )
        t2 = time.perf_counter()
    report(tuned.trainer, alphas, args, t1 - t0, t2 - t1)


def report(trainer, alphas: list[float], args, pretrain_s: float, finetune_s: float) -> None:
    from callbacks import WiseFT

    wise = next(cb for cb in trainer.callbacks if isinstance(cb, WiseFT))
    target, source = wise.table["val/zeroshot_acc"], wise.table["val/source/zeroshot_acc"]
    pretrain = f"pretraining {args.pretrain_steps} steps: {pretrain_s:.0f} s" if not args.start else "pretrained"
    sweep = f"fine-tuning {args.finetune_steps} steps and the sweep of {len(alphas)} points: {finetune_s:.0f} s"
    print(f"\n{pretrain}; {sweep}")
    rows = [
        [f"{a:g}" + (" <- chosen" if a == wise.chosen_alpha else ""), f"{t:.3f}", f"{s:.3f}"]
        for a, t, s in zip(alphas, target, source)
    ]
    print(table(["alpha", f"target acc ({args.shift})", "source acc (shapes)"], rows))
    k = alphas.index(wise.chosen_alpha)
    rows = [
        ["start (alpha 0)", f"{target[0]:.3f}", f"{source[0]:.3f}"],
        ["full fine-tuning (alpha 1)", f"{target[-1]:.3f}", f"{source[-1]:.3f}"],
        [f"WiSE-FT (alpha {wise.chosen_alpha:g})", f"{target[k]:.3f}", f"{source[k]:.3f}"],
    ]
    print("\n" + table(["model", "target acc", "source acc"], rows))
    kept, reached = source[k] / source[0], target[k] / target[-1]
    verdict = "met" if kept >= 0.9 and reached >= 0.95 else "NOT met"
    print(
        f"\nWiSE-FT keeps {kept:.1%} of the start's source accuracy (goal >= 90%) and reaches {reached:.1%} of full "
        f"fine-tuning's target accuracy (goal >= 95%): {verdict}"
    )


if __name__ == "__main__":
    main()
