"""FSDP2 for every family: the strategy, sharding a net once in ``configure_model``, reading sharded checkpoints
safely and consolidating them.

Lightning's ``fsdp`` strategy wraps FSDP1 and refuses a CPU; ``ModelParallelStrategy`` (here ``FSDP2Strategy``)
gives the module a device mesh and leaves the wrapping to ``configure_model``, where ``fully_shard`` (FSDP2)
runs on GPUs (NCCL) and CPUs (gloo) alike.

Consolidate a sharded checkpoint directory into one file that ``load_from_checkpoint`` reads:
    python -m zoo.train.parallel <checkpoint_dir> <output.ckpt>
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

from zoo import compat
from zoo.io.files import replacing
from zoo.io.weights import load_file, read_sharded_metadata

LIGHTNING_META = "meta.pt"  # Lightning's non-tensor part of a sharded checkpoint (lightning.fabric.utilities.load)


def num_nodes_from_env(env: Mapping[str, str] | None = None) -> int | None:
    """The node count a launcher put in the environment, for ``trainer.num_nodes``'s default; None: no launcher.

    torchrun sets WORLD_SIZE (every process) and LOCAL_WORLD_SIZE (this node's), so nodes = their ratio; a SLURM
    job step (``srun``) sets SLURM_NNODES. A SLURM allocation's interactive shell (job name bash or interactive,
    as Lightning's ``SLURMEnvironment`` tells it) launches nothing itself: no count from it.
    """
    env = os.environ if env is None else env
    if "WORLD_SIZE" in env and "LOCAL_WORLD_SIZE" in env:
        return max(int(env["WORLD_SIZE"]) // int(env["LOCAL_WORLD_SIZE"]), 1)
    if "SLURM_NNODES" in env and "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return int(env["SLURM_NNODES"])
    return None


def shard(net: nn.Module, device_mesh, blocks: Iterable[nn.Module] | None = None) -> nn.Module:
    """Apply ``fully_shard`` to each block and then the whole net, once; no-op without a mesh.

    ``blocks`` are the units that gather their parameters together (transformer blocks, ResNet
    stages); by default the net's direct children that hold parameters. On CUDA, parameters are
    computed in bf16 and gradients reduced in fp32 (the FSDP2 mixed-precision policy).
    """
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if device_mesh is None or isinstance(net, FSDPModule):
        return net
    mesh = device_mesh["data_parallel"] if device_mesh.mesh_dim_names else device_mesh
    on_cuda = mesh.device_type == "cuda"
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if on_cuda
        else MixedPrecisionPolicy()
    )
    if blocks is None:
        blocks = [m for m in net.children() if any(True for _ in m.parameters())]
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(net, mesh=mesh, mp_policy=mp)
    return net


class SafeFileSystemReader(FileSystemReader):
    """torch.distributed.checkpoint's reader with the ``.metadata`` pickle read by ``read_sharded_metadata``: only
    the metadata classes are admitted, so a crafted folder is refused before anything in it executes."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        metadata = read_sharded_metadata(Path(self.path))
        if metadata.storage_meta is None:  # as FileSystemReader.read_metadata does
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def check_sharded_checkpoint(checkpoint_dir: str | Path) -> None:
    """Refuse a sharded checkpoint folder whose metadata or non-tensor entries would run code when read.

    Lightning resumes (``fit``/``validate``/``test``/``predict --ckpt_path <dir>``) through torch's own reader,
    which unpickles both without restriction and takes no other reader; this reads them the safe way first
    (only the metadata and the small non-tensor entries, never the weights).
    """
    metadata = read_sharded_metadata(checkpoint_dir)
    objects = {k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)}
    if objects:
        compat.load_sharded(SafeFileSystemReader(checkpoint_dir), keys=objects)


class FSDP2Strategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` for the zoo's FSDP2: every process holds one shard, on 1 x N or M x N processes.

    Lightning's own ``data_parallel_size: auto`` is the number of nodes (it expects tensor parallelism within a
    node), so on one machine with N devices it asks for a 1 x 1 mesh of N processes and fails; a fixed number
    would tie the config to one cluster. Here the mesh is (every process) x 1, and resuming from a sharded
    folder first reads its pickled parts the safe way (``check_sharded_checkpoint``).
    """

    def __init__(self, save_distributed_checkpoint: bool = True, process_group_backend: str | None = None) -> None:
        """
        Args:
            save_distributed_checkpoint: each rank saves its shard into a checkpoint folder; False gathers one
                file on rank 0 (the whole model and optimizer state in its memory).
            process_group_backend: None: NCCL on GPUs, gloo on CPUs.
        """
        super().__init__("auto", 1, save_distributed_checkpoint, process_group_backend)

    def mesh_shape(self) -> tuple[int, int]:
        """(data parallel, tensor parallel) sizes: every process of every node shards the same model."""
        return self.num_nodes * self.num_processes, 1

    def setup_environment(self) -> None:
        compat.set_data_parallel_size(self, self.mesh_shape()[0])
        super().setup_environment()

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict:
        if Path(checkpoint_path).is_dir():
            check_sharded_checkpoint(checkpoint_path)
        return super().load_checkpoint(checkpoint_path, weights_only=weights_only)


def consolidate(checkpoint_dir: str | Path, output_file: str | Path) -> Path:
    """Merge a ModelParallelStrategy (FSDP2) checkpoint directory into one Lightning checkpoint file.

    The shards (weights, optimizer states) are torch.distributed.checkpoint's format; Lightning keeps the
    rest of the checkpoint (loops, hyperparameters, callbacks) beside them in ``meta.pt``.
    """
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise NotADirectoryError(f"{str(checkpoint_dir)!r} is not a sharded checkpoint directory")
    read_sharded_metadata(checkpoint_dir)  # refuses a crafted folder in one clear error (torch would wrap it)
    output_file = Path(output_file)
    output_file.parent.mkdir(parents=True, exist_ok=True)
    ckpt = compat.load_sharded(SafeFileSystemReader(checkpoint_dir))  # dcp_to_torch_save, with the safe reader
    meta = checkpoint_dir / LIGHTNING_META
    ckpt.update(load_file(meta) if meta.is_file() else {})
    opt_keys = sorted((k for k in ckpt if re.fullmatch(r"optimizer_\d+", k)), key=lambda k: int(k.split("_")[1]))
    ckpt["optimizer_states"] = [ckpt.pop(k) for k in opt_keys]
    with replacing(output_file) as tmp:  # a link planted at the output's name is replaced, not written through
        torch.save(ckpt, tmp)
    return output_file


def _main() -> None:
    parser = argparse.ArgumentParser(description="Consolidate a sharded FSDP2 checkpoint directory into one file.")
    parser.add_argument("checkpoint_dir")
    parser.add_argument("output_file")
    args = parser.parse_args()
    print(f"Wrote {consolidate(args.checkpoint_dir, args.output_file)}")


if __name__ == "__main__":
    _main()
