"""Run ``cli.py fit`` with the given arguments, then save what each rank ended with.

Launched as a subprocess by the strategy tests: Lightning's DDP launcher re-runs this script once
per extra rank, which would re-run pytest if the fit happened inside the pytest process.
Every rank (each runs this script) dumps the stack of all its threads and exits after ``FIT_DEADLINE_S``
seconds (default 240): a deadlock between ranks is a failure that shows where each rank waits.
"""

import faulthandler
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cli import main


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


if __name__ == "__main__":
    faulthandler.dump_traceback_later(float(os.environ.get("FIT_DEADLINE_S", 240)), exit=True)
    c = main(sys.argv[1:])
    rank = c.trainer.global_rank
    model = c.model.eval()
    state = {k: _full(v).detach().cpu() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    if hasattr(c.datamodule, "image_shape"):
        x = torch.randn(8, *c.datamodule.image_shape)
    else:  # token ids for a language model
        x = torch.randint(0, model.net.vocab_size, (4, 16))
    with torch.no_grad():  # FSDP2 gathers the shards for the forward on every rank
        if hasattr(model, "denoise"):  # a diffusion module: the prediction at a fixed step and label
            y = torch.zeros(len(x), dtype=torch.long) if model.num_classes else None
            out = model.denoise(x, torch.full((len(x),), 10), y).cpu()
        elif hasattr(model, "embed_images"):  # a contrastive module: the image embeddings
            out = model.embed_images(x).cpu()
        else:
            out = model(x).cpu()
    ckpt = c.trainer.checkpoint_callback
    mesh = getattr(c.trainer.strategy, "device_mesh", None)  # FSDP2: (data parallel, tensor parallel) sizes
    torch.save(
        {
            "state": state,
            "x": x,
            "out": out,
            "last": str(ckpt.last_model_path),
            "best": str(ckpt.best_model_path),
            "mesh": tuple(mesh.shape) if mesh is not None else None,
            "num_nodes": c.trainer.num_nodes,
        },
        f"rank{rank}.pt",
    )
    # Shut the process group down before the interpreter exits: left to exit-time destructors, gloo's
    # threads can abort the process ("terminate called without an active exception") after a good run.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
