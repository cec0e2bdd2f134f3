"""ClassifierModule through a Trainer on in-memory images, checked against computations done here by hand.

The logged loss is the label-smoothed cross-entropy of the net's logits; val/test accuracy, top-5 accuracy and
loss are the plain counts over the split; the confusion matrix counts (true, predicted) pairs, rows true;
predictions are the softmax's best classes; num_classes comes from the data; freeze_backbone trains the head
only and leaves every other weight and batch-norm statistic as it was; init_weights loads a zoo checkpoint.

Notation: B batch, C channels, H/W height/width, K classes.
"""

from __future__ import annotations

import copy

import pytest
import torch
from lightning.pytorch import LightningDataModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from zoo.cnn import ClassifierModule, ConvNet
from zoo.train.optim import AdamWCosine

pytestmark = pytest.mark.usefixtures("one_thread")  # a tiny net: a second thread only waits
K = 7


class TinyImages(LightningDataModule):
    """48 random 3x8x8 images with K labels, the same 48 for every split, in fixed order."""

    def __init__(self, n: int = 48, batch_size: int = 16, k: int = K) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 8, 8, generator=g)
        self.y = torch.randint(0, k, (n,), generator=g)
        self.batch_size = batch_size
        self.num_classes, self.class_names, self.image_shape = k, [f"c{c}" for c in range(k)], (3, 8, 8)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size)

    val_dataloader = test_dataloader = predict_dataloader = train_dataloader


def trainer(**kwargs) -> Trainer:
    """Fits (``max_steps``) skip validation; validate, test and predict go through their whole split."""
    return Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        limit_val_batches=0 if "max_steps" in kwargs else 1.0,
        **kwargs,
    )


def module(num_classes: int | None = K, **kwargs) -> ClassifierModule:
    torch.manual_seed(0)
    net = ConvNet(num_classes=num_classes, in_channels=3, width=4, depth=2)
    return ClassifierModule(net, optimizer=AdamWCosine(lr=0.05, weight_decay=0.0, warmup_steps=0), **kwargs)


def smoothed_ce(logits: torch.Tensor, y: torch.Tensor, eps: float) -> torch.Tensor:
    """-sum_k q(k) log p(k), q = (1 - eps) one-hot + eps / K (Szegedy et al. 2016)."""
    logp = logits.log_softmax(-1)
    return -((1 - eps) * logp.gather(-1, y[:, None])[:, 0] + eps * logp.mean(-1)).mean()


def test_the_logged_train_loss_is_the_smoothed_cross_entropy_of_the_nets_logits():
    dm, m = TinyImages(), module(label_smoothing=0.2)
    start = copy.deepcopy(m.net).train()  # the weights the first step's loss is computed with
    t = trainer(max_steps=1)
    t.fit(m, datamodule=dm)
    with torch.no_grad():
        logits = start(dm.x[:16])  # (B, K), batch-norm on the batch's statistics, as in training
    want = smoothed_ce(logits, dm.y[:16], 0.2)
    assert float(t.callback_metrics["train/loss"]) == pytest.approx(float(want), rel=1e-5)
    assert abs(float(want) - float(smoothed_ce(logits, dm.y[:16], 0.0))) > 1e-3  # the smoothing matters here


def test_num_classes_comes_from_the_data():
    # cli.py's rule (zoo.app.sizes), before the net is built: a net without num_classes is never built
    from zoo.app.sizes import classes

    with pytest.raises(ValueError, match="ConvNet needs num_classes"):
        module(num_classes=None)
    m = module(num_classes=classes(TinyImages(), {"num_classes": None}, False)["num_classes"])
    trainer(max_steps=1).fit(m, datamodule=TinyImages())
    assert m.net.head.out_features == K and m.net.num_classes == K
    assert m.val_metrics["acc"].num_classes == K and m.test_confusion.num_classes == K
    assert m.inputs["class_names"] == [f"c{k}" for k in range(K)] and m.inputs["image_shape"] == [3, 8, 8]


@pytest.mark.parametrize("k", [5, 6])
def test_top5_accuracy_is_logged_only_when_it_can_miss(k):
    # With 5 classes or fewer every label is among the top 5: a constant 1.0 on the dashboard, never logged.
    m = module(num_classes=k)
    got = trainer().validate(m, datamodule=TinyImages(k=k), verbose=False)[0]
    assert "val/acc" in got and ("val/acc_top5" in got) == (k > 5), got


def reference_metrics(net: torch.nn.Module, dm: TinyImages, eps: float) -> dict[str, float]:
    with torch.no_grad():
        logits = net.eval()(dm.x)  # (B, K)
    top5 = logits.topk(5, dim=-1).indices
    return {
        "acc": (logits.argmax(-1) == dm.y).float().mean().item(),
        "acc_top5": (top5 == dm.y[:, None]).any(-1).float().mean().item(),
        "loss": smoothed_ce(logits, dm.y, eps).item(),
    }


def test_validation_and_test_metrics_and_confusion_matrix_are_the_counts(monkeypatch):
    dm, m = TinyImages(), module(label_smoothing=0.1)
    trainer(max_steps=3).fit(m, datamodule=dm)
    want = reference_metrics(copy.deepcopy(m.net), dm, 0.1)
    assert 0 < want["acc"] < want["acc_top5"] < 1  # neither trivially 0 nor 1: a wrong count shows
    got = trainer().validate(m, datamodule=dm, verbose=False)[0]
    for key, value in want.items():
        assert got[f"val/{key}"] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    from callbacks import LogConfusionMatrix

    logged = {}
    monkeypatch.setattr("callbacks.confusion.log_json_artifact", lambda trainer, obj, name: logged.update({name: obj}))
    got = trainer(callbacks=[LogConfusionMatrix()]).test(m, datamodule=dm, verbose=False)[0]
    for key, value in want.items():
        assert got[f"test/{key}"] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    with torch.no_grad():
        pred = m.net.eval()(dm.x).argmax(-1)
    counts = torch.zeros(K, K, dtype=torch.long)
    counts.index_put_((dm.y, pred), torch.ones_like(dm.y), accumulate=True)  # rows true, columns predicted
    saved = logged["test/confusion_matrix.json"]
    assert saved["confusion_matrix"] == counts.tolist() and saved["class_names"] == dm.class_names
    assert not torch.equal(counts, counts.T)


def test_predictions_are_the_softmax_best_classes():
    dm, m = TinyImages(), module()
    trainer(max_steps=2).fit(m, datamodule=dm)
    with torch.no_grad():
        probs = m.net.eval()(dm.x).softmax(-1)  # (B, K)
    rows = trainer().predict(m, dataloaders=DataLoader(TensorDataset(dm.x, dm.y), batch_size=16))
    torch.testing.assert_close(torch.cat([r["confidence"] for r in rows]), probs.max(-1).values)
    assert torch.equal(torch.cat([r["pred"] for r in rows]), probs.argmax(-1))
    assert torch.equal(torch.cat([r["target"] for r in rows]), dm.y)
    files = [{"image": x, "path": f"{i}.png"} for i, x in enumerate(dm.x)]  # new files: names and the top 5
    rows = trainer().predict(m, dataloaders=DataLoader(files, batch_size=16))
    conf, idx = probs.topk(5, dim=-1)
    assert [p for r in rows for p in r["path"]] == [f"{i}.png" for i in range(len(files))]
    assert [c for r in rows for c in r["class_3"]] == [f"c{k}" for k in idx[:, 2].tolist()]
    torch.testing.assert_close(torch.cat([r["confidence_5"] for r in rows]), conf[:, 4])
    torch.testing.assert_close(torch.cat([r["confidence"] for r in rows]), conf[:, 0])


@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_backbone_trains_the_head_only_and_keeps_batch_norm_statistics(freeze):
    dm, m = TinyImages(), module(freeze_backbone=freeze)
    before = copy.deepcopy(m.net.state_dict())
    trainer(max_steps=3).fit(m, datamodule=dm)
    after = m.net.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert {"head.weight", "head.bias"} <= changed
    if freeze:
        assert changed == {"head.weight", "head.bias"}
        assert [n for n, p in m.net.named_parameters() if p.requires_grad] == ["head.weight", "head.bias"]
    else:  # the control: an unfrozen fit moves the backbone and its running statistics
        assert {"features.0.0.weight", "features.1.4.running_mean", "features.0.1.running_var"} <= changed


def test_init_weights_from_a_zoo_checkpoint_start_from_its_net(tmp_path):
    dm, trained = TinyImages(), module()
    trainer(max_steps=2).fit(trained, datamodule=dm)
    torch.save({"state_dict": trained.state_dict(), "hyper_parameters": {}}, tmp_path / "trained.ckpt")
    fresh = module(init_weights=str(tmp_path / "trained.ckpt"))
    got = trainer().validate(fresh, datamodule=dm, verbose=False)[0]
    for key, value in trained.net.state_dict().items():
        torch.testing.assert_close(fresh.net.state_dict()[key], value, rtol=0, atol=0, msg=key)
    assert got["val/acc"] == pytest.approx(reference_metrics(trained.net, dm, 0.0)["acc"])
    trainer(max_steps=2).fit(fresh, datamodule=dm)
    tuned = copy.deepcopy(fresh.net.state_dict())
    assert not torch.equal(tuned["head.weight"], trained.net.state_dict()["head.weight"])
    trainer().validate(fresh, datamodule=dm, verbose=False)  # set up again: the init weights load only once
    for key, value in tuned.items():
        assert torch.equal(fresh.net.state_dict()[key], value), key
