"""bench/race_gpt.py's cheap parts: the peer's schedule, optimizer groups, init and batches against nanoGPT's
train.py and model.py by hand, the evaluation against a closed form, the token grid, and both arms wired end to
end for a step or two on a tiny corpus."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import ROOT

spec = importlib.util.spec_from_file_location("race_gpt", ROOT / "bench" / "race_gpt.py")
race_gpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(race_gpt)


def test_peer_lr_is_train_pys_get_lr_at_hand_computed_iterations():
    # train.py: warmup learning_rate * (it + 1) / (warmup_iters + 1); cosine from it = 100 to 2000; min_lr after
    lr, min_lr = 1e-3, 1e-4
    expected = {
        0: lr * 1 / 101,
        99: lr * 100 / 101,
        100: lr,  # decay_ratio 0: the peak
        1050: min_lr + 0.5 * (lr - min_lr),  # decay_ratio 1/2: cos(pi/2) = 0
        1525: min_lr + 0.5 * (1 + math.cos(math.pi * 0.75)) * (lr - min_lr),
        1999: min_lr + 0.5 * (1 + math.cos(math.pi * 1899 / 1900)) * (lr - min_lr),  # not yet the floor
        2000: min_lr,
        2001: min_lr,
    }
    for it, want in expected.items():
        assert race_gpt.get_lr(it) == pytest.approx(want, rel=1e-12), it


def test_peer_model_has_nanogpts_size_and_init():
    torch.manual_seed(0)
    net = race_gpt.peer_model(65)  # tinyshakespeare's 65 characters: train.py prints "number of parameters: 0.80M"
    per_layer = 128 * 384 + 128 * 128 + 128 * 512 + 512 * 128 + 2 * 128  # no biases (bias=False): LayerNorm weights
    assert sum(p.numel() for p in net.parameters()) == 4 * per_layer + 65 * 128 + 64 * 128 + 128
    non_embedding = sum(p.numel() for p in net.parameters()) - net.transformer.wpe.weight.numel()
    assert f"{non_embedding / 1e6:.2f}M" == "0.80M"
    assert all(not n.endswith("bias") for n, _ in net.named_parameters())
    assert net.lm_head.weight is net.transformer.wte.weight  # tied
    scaled = 0.02 / math.sqrt(2 * 4)  # c_proj: std 0.02 / sqrt(2 n_layer)
    for name, p in net.named_parameters():
        if p.dim() == 2:
            want = scaled if name.endswith("c_proj.weight") else 0.02
            assert p.std().item() == pytest.approx(want, rel=0.1), name
        else:
            assert torch.equal(p, torch.ones_like(p)), name


def test_peer_optimizer_decays_exactly_the_matrices_with_the_configs_betas():
    net = race_gpt.peer_model(85)
    opt = race_gpt.peer_optimizer(net)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    # the tied table once, positions, and 4 matrices per block; the 9 LayerNorm weights do not decay
    assert len(decay["params"]) == 2 + 4 * 4 and all(p.dim() == 2 for p in decay["params"])
    assert len(no_decay["params"]) == 2 * 4 + 1 and all(p.dim() == 1 for p in no_decay["params"])
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in net.parameters()) and len(set(ids)) == len(ids)
    assert opt.defaults["betas"] == (0.9, 0.99) and opt.defaults["lr"] == 1e-3 and opt.defaults["eps"] == 1e-8
    assert not opt.defaults["fused"]  # train.py fuses on CUDA only


def test_get_batch_draws_windows_at_random_offsets_with_targets_shifted_by_one():
    data = np.arange(1000, dtype=np.uint16)
    torch.manual_seed(3)
    x, y = race_gpt.get_batch(data, 64, 12)
    assert x.shape == y.shape == (12, 64) and x.dtype == torch.int64
    assert torch.equal(y, x + 1) and torch.equal(x[:, 1:], x[:, :-1] + 1)  # consecutive tokens
    torch.manual_seed(3)
    starts = torch.randint(1000 - 64, (12,))  # train.py: torch.randint(len(data) - block_size, (batch_size,))
    assert torch.equal(x[:, 0], starts)


def test_eval_windows_are_fixed_by_their_seed_and_shifted_by_one():
    val = np.arange(5000, dtype=np.uint16)
    x, y = race_gpt.eval_windows(val, n=16, block=64, seed=7)
    x2, _ = race_gpt.eval_windows(val, n=16, block=64, seed=7)
    assert x.shape == (16, 64) and torch.equal(x, x2) and torch.equal(y, x + 1)
    assert not torch.equal(x, race_gpt.eval_windows(val, n=16, block=64, seed=8)[0])
    assert int(y.max()) < 5000


def test_val_loss_is_the_mean_cross_entropy_over_every_position_by_hand():
    v, a = 5, 2.0
    x = torch.tensor([[0, 1, 2], [3, 4, 0], [1, 1, 1]] * 3)  # 9 windows: batches of 4, 4, 1
    y = torch.tensor([[1, 2, 3], [4, 0, 0], [2, 2, 2]] * 3)  # (x + 1) % 5 but at 1 of every 9 positions

    def forward(ids):  # logit a on (id + 1) % v, 0 elsewhere
        return a * F.one_hot((ids + 1) % v, v).float()

    right = -math.log(math.exp(a) / (math.exp(a) + v - 1))
    wrong = -math.log(1 / (math.exp(a) + v - 1))
    want = (8 * right + 1 * wrong) / 9
    assert race_gpt.val_loss(forward, x, y, batch=4) == pytest.approx(want, rel=1e-6)
    assert race_gpt.val_loss(lambda ids: torch.zeros(*ids.shape, v), x, y) == pytest.approx(math.log(v))


def test_grid_in_tokens_scores_arms_of_different_batches_at_comparable_points():
    def points(tokens_per_step: int, steps: int) -> list[int]:
        grid, seen, due = race_gpt.Grid(16_384), 0, []
        for _ in range(steps):
            seen += tokens_per_step
            if grid.due(seen):
                due.append(seen)
        return due

    assert points(768, 64) == [16_896, 33_024, 49_152]  # the peer: 12 x 64 tokens a step
    assert points(2048, 24) == [16_384, 32_768, 49_152]  # 32 x 64
    grid = race_gpt.Grid(100)
    assert grid.due(250) and not grid.due(299) and grid.due(300)  # a step past two points evaluates once


def test_race_hits_at_exactly_the_target_and_only_on_the_grid():
    v = 4
    x, y = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long)
    net = torch.nn.Module()
    net.forward = lambda ids: torch.zeros(*ids.shape, v)  # loss log 4 on every position
    loss = race_gpt.val_loss(net, x, y)  # log 4 in float32
    race = race_gpt.Race((x, y), every=100, target=loss)
    race.clock.start()
    assert not race.step(64, net) and race.evals == []  # 64 seen: not yet on the grid
    assert race.step(64, net) and race.hit["tokens"] == 128 and race.evals == [(128, loss)]
    assert loss == pytest.approx(math.log(v))


@pytest.fixture
def tiny_corpus(tmp_path):
    """A 20k-character corpus in the zoo's Shakespeare folder layout, so TextDataModule reads it offline."""
    rng = np.random.default_rng(0)
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "ROMEO:", "\n"]
    text = " ".join(rng.choice(words, 4000))
    folder = tmp_path / "shakespeare"
    folder.mkdir()
    (folder / "tiny_gut.txt").write_text(text)
    return str(tmp_path)


TINY = {**race_gpt.PEER, "n_layer": 1, "n_head": 2, "n_embd": 16, "batch_size": 4, "max_iters": 5}


def test_peer_arm_stops_at_the_first_evaluation_at_the_target(tiny_corpus):
    torch.set_num_threads(1)
    r = race_gpt.peer_run(0, tiny_corpus, every=500, target=100.0, cfg=TINY)
    hit = r["hit"]
    assert hit["tokens"] == r["evals"][0][0] == 4 * 64 * 2  # the first step past 500 tokens: 2 steps of 256
    assert hit["cpu_s"] > 0 and 0 < hit["loss"] < math.log(100) and len(r["evals"]) == 1
    assert r["flops"] > 0


def test_peer_arm_runs_max_iters_plus_one_steps_when_the_target_is_never_hit(tiny_corpus):
    r = race_gpt.peer_run(0, tiny_corpus, every=256, target=0.0, cfg=TINY)
    assert r["hit"] is None and [n for n, _ in r["evals"]] == [256 * k for k in range(1, 7)]  # it = 0 .. 5


def test_zoo_arm_runs_the_race_preset_through_cli_and_stops_at_the_target(tiny_corpus):
    torch.set_num_threads(1)
    tiny = (
        "--model.init_args.net.init_args.n_layer=1",
        "--model.init_args.net.init_args.n_embd=16",
        "--model.init_args.net.init_args.n_head=2",
        "--data.init_args.batch_size=4",
        "--trainer.max_steps=5",
    )
    r = race_gpt.zoo_run(0, tiny_corpus, every=500, target=100.0, extra=tiny)
    hit = r["hit"]
    t = yaml.safe_load((ROOT / race_gpt.ZOO_CONFIG).read_text())["model"]["init_args"]["net"]["init_args"]["block_size"]
    assert hit["tokens"] == r["evals"][0][0] == 4 * t * -(-500 // (4 * t))  # the first step past 500 tokens
    assert hit["cpu_s"] > 0 and len(r["evals"]) == 1
    assert r["what"].startswith("gpt_char_shakespeare_race.yaml") and r["flops"] > 0
