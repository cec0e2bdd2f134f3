"""GradNormMonitor and PrecisionMonitor: every logged value against one computed here by hand."""

from __future__ import annotations

import copy
import math
import os
import socket

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.pytorch.callbacks import OnExceptionCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils.data import DataLoader, TensorDataset

from callbacks.monitors import (
    GradNormMonitor,
    NonFiniteLossError,
    PrecisionMonitor,
    ResumesItsOptimizer,
    grad_norms_per_tensor,
)
from zoo.train.gradnorm import clip_grad_norm, grad_norm
from zoo.train.logging import lightning_writes

LR, BATCH, STEPS = 0.1, 8, 4


class RecordingLogger(Logger):
    """Keeps every log_metrics / log_hyperparams call in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.hparams: dict[str, object] = {}

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics, step=None) -> None:
        self.metrics.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        self.hparams.update(params)

    def series(self, key: str) -> list[float]:
        return [m[key] for _, m in self.metrics if key in m]


class Tiny(pl.LightningModule):
    """Linear 4 -> 3 under an MSE loss; `poison` maps a step to a hook that corrupts its gradients."""

    def __init__(self, poison: dict | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 3)
        self.poison = poison or {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x).float(), y)

    def on_after_backward(self) -> None:
        if self.global_step in self.poison:
            self.poison[self.global_step](self.net)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


def data(n_batches: int = STEPS, nan_batch: int | None = None) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n_batches * BATCH, 4, generator=g), torch.randn(n_batches * BATCH, 3, generator=g)
    if nan_batch is not None:
        x[nan_batch * BATCH] = float("nan")
    return DataLoader(TensorDataset(x, y), batch_size=BATCH, shuffle=False)


def fit(module, callbacks, steps: int = STEPS, loader=None, **trainer_kwargs) -> RecordingLogger:
    logger = RecordingLogger()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        logger=logger,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        **{"enable_checkpointing": False, "log_every_n_steps": 1, **trainer_kwargs},
    )
    trainer.fit(module, loader if loader is not None else data(steps))
    return logger


def reference_grad_norms(steps: int = STEPS, clip: float | None = None) -> list[dict[str, float]]:
    """Plain-PyTorch replay of the same run: the norms of each step's gradients before clipping."""
    net = Tiny().net
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    out = []
    for x, y in data(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        layers = {
            f"grad/norm/net.{n}": math.sqrt(sum(v * v for v in p.grad.flatten().tolist()))
            for n, p in net.named_parameters()
        }
        total = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in net.parameters()))
        out.append({"grad/norm": total, **layers})
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
    return out


# --- GradNormMonitor ---------------------------------------------------------------------------------


def test_grad_norm_is_the_unclipped_global_norm_and_per_layer_norms_match():
    # Clipping at 0.01 changes the trajectory; the logged norm must still be the one before clipping.
    logger = fit(Tiny(), [GradNormMonitor(per_layer_every_n_steps=1)], gradient_clip_val=0.01)
    expected = reference_grad_norms(clip=0.01)
    assert min(e["grad/norm"] for e in expected) > 0.01  # clipping really happened every step
    for key in expected[0]:
        assert logger.series(key) == pytest.approx([e[key] for e in expected], rel=1e-5), key
    assert logger.series("grad/nonfinite") == [0.0] * STEPS


@pytest.mark.parametrize(("trainer_every", "monitor_every"), [(1, 2), (2, 1), (2, 2)])
def test_grad_norm_logs_every_nth_step_that_lightning_writes(trainer_every, monitor_every):
    monitor = GradNormMonitor(per_layer_every_n_steps=4, log_every_n_steps=monitor_every)
    logger = fit(Tiny(), [monitor], steps=8, log_every_n_steps=trainer_every)
    expected = reference_grad_norms(steps=8)
    # After the 2nd, 4th, ... step (the logger's step is 0-based). When Lightning writes in between, it
    # repeats the last value. The per-layer norms are written directly on their own period.
    fresh = {
        "grad/norm": [None, 1, 1, 3, 3, 5, 5, 7],
        "grad/norm/net.weight": [None, None, None, 3, None, None, None, 7],
    }
    for key, steps in fresh.items():
        logged = {s: m[key] for s, m in logger.metrics if key in m}
        if trainer_every == 2 and key == "grad/norm":  # Lightning writes after the 2nd, 4th, ... step only
            steps = [i if s % 2 else None for s, i in enumerate(steps)]
        # The steps written and their values are compared apart: pytest.approx holds numbers only.
        want = {s: expected[i][key] for s, i in enumerate(steps) if i is not None}
        assert sorted(logged) == sorted(want), key
        assert [logged[s] for s in sorted(want)] == pytest.approx([want[s] for s in sorted(want)], rel=1e-5), key


def test_grad_norm_counts_nonfinite_tensors():
    def poison(net):
        net.weight.grad[0, 0] = float("inf")
        net.bias.grad[1] = float("nan")

    logger = fit(Tiny(poison={1: poison}), [GradNormMonitor()], steps=2)
    assert logger.series("grad/nonfinite") == [0.0, 2.0]
    assert math.isfinite(logger.series("grad/norm")[0]) and math.isnan(logger.series("grad/norm")[1])

    logger = fit(Tiny(poison={0: lambda net: net.weight.grad.fill_(float("-inf"))}), [GradNormMonitor()], steps=1)
    assert logger.series("grad/nonfinite") == [1.0] and logger.series("grad/norm") == [math.inf]


def test_grad_norm_inf_norm_and_fp16_grads():
    g = [torch.tensor([3.0, -7.0]), torch.full((10,), 1e4, dtype=torch.float16)]  # fp16 norm overflows in fp16
    assert grad_norms_per_tensor(g, math.inf).tolist() == [7.0, 1e4]
    assert grad_norms_per_tensor(g).tolist() == pytest.approx([math.sqrt(58), math.sqrt(10) * 1e4], rel=1e-6)


class Manual(Tiny):
    """Tiny under manual optimisation; with `clip`, it clips and logs zoo.train.gradnorm's norms itself."""

    def __init__(self, clip: float | None = None):
        super().__init__()
        self.automatic_optimization = False
        self.clip = clip

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(super().training_step(batch, batch_idx))
        if self.clip is not None:
            grads = clip_grad_norm(self.parameters(), self.clip)
            if lightning_writes(self.trainer):
                self.log_dict(grads, on_step=True, on_epoch=False)
        opt.step()


def test_grad_norm_logs_nothing_under_manual_optimization():
    logger = fit(Manual(), [GradNormMonitor(per_layer_every_n_steps=1)])
    assert not [k for _, m in logger.metrics for k in m if k.startswith("grad/")]


# --- zoo.train.gradnorm: the same numbers, logged by manually optimised modules themselves ----------


def test_clip_grad_norm_returns_torchs_norm_and_clips_the_same():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    ref = copy.deepcopy(net)
    x = torch.randn(6, 4)
    for m in (net, ref):
        m(x).square().sum().backward()
    unclipped = torch.nn.utils.get_total_norm([p.grad for p in ref.parameters()])
    expected = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1)
    out = clip_grad_norm(net.parameters(), 0.1)
    assert set(out) == {"grad/norm", "grad/nonfinite"} and out["grad/nonfinite"].item() == 0
    assert out["grad/norm"].item() > 1.0  # the norm before clipping, far above the threshold
    torch.testing.assert_close(out["grad/norm"], unclipped)
    torch.testing.assert_close(out["grad/norm"], expected)
    for mine, theirs in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(mine.grad, theirs.grad)  # clipped by the same factor


def test_grad_norm_of_a_known_gradient_named_and_nonfinite():
    a, b, frozen = (torch.nn.Parameter(torch.zeros(n)) for n in (2, 1, 3))
    a.grad, b.grad = torch.tensor([3.0, 4.0]), torch.tensor([12.0])  # a global 2-norm of 13; `frozen` has none
    out = grad_norm([a, b, frozen], name="critic")
    assert {k: v.item() for k, v in out.items()} == {"grad/norm/critic": 13.0, "grad/nonfinite/critic": 0.0}
    assert grad_norm([a, b], math.inf)["grad/norm"].item() == 12.0
    assert grad_norm([frozen]) == {}
    b.grad = torch.tensor([float("nan")])
    out = grad_norm([a, b])
    assert out["grad/nonfinite"].item() == 1.0 and math.isnan(out["grad/norm"].item())


def test_a_manual_module_logs_what_grad_norm_monitor_logs_for_an_automatic_one():
    manual = fit(Manual(clip=0.01), [GradNormMonitor()], steps=4, log_every_n_steps=2)
    automatic = fit(Tiny(), [GradNormMonitor()], steps=4, log_every_n_steps=2, gradient_clip_val=0.01)
    expected = [e["grad/norm"] for e in reference_grad_norms(clip=0.01)]
    assert manual.series("grad/norm") == pytest.approx(expected[1::2], rel=1e-6)  # Lightning writes steps 2, 4
    assert manual.series("grad/norm") == pytest.approx(automatic.series("grad/norm"), rel=1e-6)
    assert manual.series("grad/nonfinite") == automatic.series("grad/nonfinite") == [0.0, 0.0]


def _fsdp2_worker(rank: int, world_size: int, port: int, results) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        # Odd sizes: the shards are uneven.
        ref = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
        net = copy.deepcopy(ref)
        mesh = init_device_mesh("cpu", (world_size,))
        fully_shard(net[0], mesh=mesh)
        fully_shard(net, mesh=mesh)
        x = torch.randn(6, 5)  # the same batch on every rank, so FSDP2's averaged grads equal ref's
        ref(x).square().sum().backward()
        net(x).square().sum().backward()
        grads = [p.grad for p in net.parameters()]
        grads[2] = grads[2].full_tensor()  # a plain tensor among the DTensors
        norms = grad_norms_per_tensor(grads).tolist()
        inf_norms = grad_norms_per_tensor(grads, math.inf).tolist()
        results[rank] = (
            norms,
            inf_norms,
            [p.grad.norm().item() for p in ref.parameters()],
            [p.grad.abs().max().item() for p in ref.parameters()],
            type(net[0].weight.grad).__name__,
        )
    finally:
        dist.destroy_process_group()


def test_grad_norms_of_fsdp2_dtensor_grads_are_full_norms():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")  # the children reuse this process's imports: seconds instead of tens
    results = ctx.Manager().dict()
    procs = [ctx.Process(target=_fsdp2_worker, args=(r, 2, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        if p.is_alive():  # a hung collective: fail instead of stalling the suite
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0, 0]
    for rank in range(2):
        norms, inf_norms, ref_norms, ref_inf, grad_type = results[rank]
        assert grad_type == "DTensor"
        assert norms == pytest.approx(ref_norms, rel=1e-5) and inf_norms == pytest.approx(ref_inf, rel=1e-6)


# --- PrecisionMonitor --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "autocast", "param_dtype"),
    [
        ("32-true", "none", "torch.float32"),
        ("bf16-mixed", "torch.bfloat16", "torch.float32"),
        ("bf16-true", "none", "torch.bfloat16"),
    ],
)
def test_precision_hyperparameters(precision, autocast, param_dtype):
    logger = fit(Tiny(), [PrecisionMonitor()], steps=1, precision=precision)
    assert {k: v for k, v in logger.hparams.items() if k.startswith("precision/")} == {
        "precision/precision": precision,
        "precision/autocast_dtype": autocast,
        "precision/param_dtypes": f"{param_dtype}:15",  # 4 * 3 weights + 3 biases
    }
    assert not logger.series("precision/grad_scale")  # no GradScaler, nothing per step


def fp16_plugin() -> MixedPrecision:
    # Lightning turns precision="16-mixed" on CPU into bf16; the plugin itself takes fp16 with a real
    # CPU GradScaler. growth_interval=2 makes the scale grow within a few steps.
    return MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2))


def inf_grad(net) -> None:
    net.weight.grad[0, 0] = float("inf")


def test_grad_scale_and_skipped_steps_under_fp16(tmp_path):
    poison = {2: inf_grad, 4: inf_grad}
    module = Tiny(poison=poison)
    weights = []
    snapshot = pl.callbacks.LambdaCallback(on_train_batch_end=lambda *_: weights.append(module.net.weight.clone()))
    logger = fit(module, [PrecisionMonitor(), GradNormMonitor(), snapshot], steps=6, plugins=[fp16_plugin()])
    # GradScaler by hand: grow x2 after 2 clean steps in a row, halve (and skip) on inf grads.
    assert logger.series("precision/grad_scale") == [1024.0, 2048.0, 1024.0, 1024.0, 512.0, 512.0]
    assert logger.series("precision/skipped_steps") == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    # The skipped steps really left the weights alone; the others moved them.
    moved = [not torch.equal(a, b) for a, b in zip(weights, weights[1:])]
    assert moved == [True, False, True, False, True]
    assert logger.series("grad/nonfinite") == [0.0, 0.0, 1.0, 0.0, 1.0, 0.0]  # unscaled grads: inf only where injected
    assert logger.hparams["precision/autocast_dtype"] == "torch.float16"

    # Resume: the counter comes back from the checkpoint and the restored scale is the new reference.
    ckpt = tmp_path / "six.ckpt"
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=[fp16_plugin()],
        callbacks=[PrecisionMonitor()],
    )
    trainer.fit(Tiny(poison=dict(poison)), data(6))
    trainer.save_checkpoint(ckpt)
    assert torch.load(ckpt, weights_only=False)["callbacks"]["PrecisionMonitor"] == {"skipped_steps": 2}
    logger = RecordingLogger()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=8,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        plugins=[fp16_plugin()],
        callbacks=[PrecisionMonitor()],
    )
    trainer.fit(Tiny(poison={7: inf_grad}), data(8), ckpt_path=ckpt)
    assert logger.series("precision/grad_scale") == [1024.0, 512.0]  # 512 after 1 clean step -> grows -> inf
    assert logger.series("precision/skipped_steps") == [2.0, 3.0]


def test_nonfinite_loss_stops_before_the_weights_change(tmp_path):
    module = Tiny()
    weights = []
    snapshot = pl.callbacks.LambdaCallback(
        on_train_batch_end=lambda *_: weights.append(copy.deepcopy(module.net.state_dict()))
    )
    on_exception = OnExceptionCheckpoint(dirpath=tmp_path, filename="on_exception")
    with pytest.raises(NonFiniteLossError) as err:
        fit(
            module, [PrecisionMonitor(), snapshot, on_exception], loader=data(4, nan_batch=2), enable_checkpointing=True
        )
    assert "global step 2, epoch 0, batch 2" in str(err.value) and "nan" in str(err.value)
    assert "bf16" in str(err.value) and "clip" in str(err.value)
    assert len(weights) == 2
    for name, value in module.net.state_dict().items():
        assert torch.equal(value, weights[-1][name])  # as left by the last good step
    saved = torch.load(tmp_path / "on_exception.ckpt", weights_only=False)["state_dict"]
    assert torch.equal(saved["net.weight"], weights[-1]["weight"])


def test_nonfinite_loss_check_can_be_disabled():
    module = Tiny()
    fit(module, [PrecisionMonitor(stop_on_nonfinite_loss=False)], steps=3, loader=data(3, nan_batch=1))
    assert torch.isnan(module.net.weight).all()


def test_precision_monitor_state_round_trip():
    monitor = PrecisionMonitor()
    monitor.load_state_dict({"skipped_steps": 5})
    assert monitor.state_dict() == {"skipped_steps": 5}


def test_a_resume_whose_optimizer_groups_differ_from_the_checkpoints_is_refused_before_torch_loads_it():
    from types import SimpleNamespace

    from zoo.errors import InputError

    net = torch.nn.Linear(3, 2)
    two = torch.optim.AdamW([{"params": [net.weight]}, {"params": [net.bias]}])
    one = torch.optim.AdamW(net.parameters())
    checkpoint = {"optimizer_states": [two.state_dict()]}

    def trainer(fn: str, optimizers: list) -> SimpleNamespace:
        return SimpleNamespace(state=SimpleNamespace(fn=fn), optimizers=optimizers, ckpt_path="last.ckpt")

    same = ResumesItsOptimizer()  # the optimizers are built after the checkpoint is read (most strategies)
    same.on_load_checkpoint(trainer("fit", []), None, checkpoint)
    same.on_fit_start(trainer("fit", [torch.optim.AdamW([{"params": [net.weight]}, {"params": [net.bias]}])]), None)
    other = ResumesItsOptimizer()
    other.on_load_checkpoint(trainer("fit", []), None, checkpoint)
    with pytest.raises(
        InputError,
        match=r"last.ckpt:.* groups the parameters as \[\[1, 1\]\], this run's optimizer as \[\[2\]\]",
    ):
        other.on_fit_start(trainer("fit", [one]), None)
    with pytest.raises(InputError, match="Resume with those settings"):  # strategies that restore after setup
        ResumesItsOptimizer().on_load_checkpoint(trainer("fit", [one]), None, checkpoint)
    for fn, ckpt in (("validate", checkpoint), ("fit", {"optimizer_states": [{"sharded": True}]}), ("fit", {})):
        skip = ResumesItsOptimizer()  # not a resumed fit, or a layout that is not torch's: the strategy's to check
        skip.on_load_checkpoint(trainer(fn, [one]), None, ckpt)
        skip.on_fit_start(trainer(fn, [one]), None)
