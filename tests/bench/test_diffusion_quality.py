"""bench/diffusion_quality.py's CPU-cheap parts: the rows it accepts, its refusals before any training, and the
table it builds from tiny untrained models (NFE counted at the net, the later seeds on the repeat rows only)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from conftest import ROOT

from zoo.diffusion import DiffusionModule, DiT, FlowMatching, GaussianDiffusion

spec = importlib.util.spec_from_file_location("diffusion_quality", ROOT / "bench" / "diffusion_quality.py")
dq = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclass looks itself up there
spec.loader.exec_module(dq)


def test_default_rows_are_the_issues_comparison():
    rows = dq.parse_rows(dq.DEFAULT_ROWS)
    assert [r.spec for r in rows] == [
        "eps:ddim:50",
        "eps:ddim:20",
        "eps:ddim:15",
        "eps:dpm:20",
        "eps:dpm:15",
        "eps:dpm:10",
        "flow:euler:32",
        "flow:euler:16",
        "flow:euler:8",
        "flow:heun:8",
    ]
    assert {r.spec for r in dq.parse_rows(dq.DEFAULT_REPEAT)} <= {r.spec for r in rows}
    assert rows[3].label == "eps DPM-Solver++(2M)-20"


@pytest.mark.parametrize(
    "text, says",
    [
        ("eps:ddim", "model:sampler:steps"),
        ("eps:plms:20", "model:sampler:steps"),
        ("eps:ddim:0", "model:sampler:steps"),
        ("flow:ddim:50", "ddim samples the eps model, not flow"),
        ("eps:euler:16", "euler samples the flow model, not eps"),
        (" , ", "names no row"),
    ],
)
def test_bad_rows_are_refused_in_one_line(text, says):
    with pytest.raises(SystemExit, match=says) as e:
        dq.parse_rows(text)
    assert str(e.value).startswith("error:") and "\n" not in str(e.value)


def test_bad_arguments_are_refused_before_any_training(monkeypatch):
    def no_training(*args):
        raise AssertionError("trained before checking its arguments")

    monkeypatch.setattr(dq, "train", no_training)
    with pytest.raises(SystemExit, match="exceeds the 512 validation images"):
        dq.main(["--num-samples", "600"])
    with pytest.raises(SystemExit, match="--sample-seeds"):
        dq.main(["--sample-seeds", "a,b"])
    with pytest.raises(SystemExit, match="--train-steps"):
        dq.main(["--train-steps", "0"])


def tiny(objective=None) -> DiffusionModule:
    """An untrained 4 px DiT: eps with learned variances (as dit_tiny_shapes16), or velocity under ``objective``."""
    torch.manual_seed(0)
    sizes = dict(image_size=4, in_channels=3, num_classes=6, depth=1, hidden_size=16, num_heads=2)
    net = DiT("S", 2, **sizes, learn_sigma=objective is None)
    sampler = dq.FlowEulerSampler if objective is not None else dq.DDIMSampler
    objective = objective or GaussianDiffusion()
    return DiffusionModule(net, objective=objective, sampler=sampler, guidance_scale=2.0).eval()


def test_table_counts_net_calls_and_repeats_only_the_repeat_rows():
    modules = {"eps": tiny(), "flow": tiny(FlowMatching())}
    calls = {name: 0 for name in modules}
    for name, m in modules.items():  # count the net's forwards: guidance must be one batched call per step
        m.net.register_forward_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    seen = []

    def frechet(images):  # a stand-in distance: the images' mean, so equal draws give equal figures
        seen.append(images)
        return float(images.mean())

    rows = dq.parse_rows("eps:ddim:5,eps:dpm:4,flow:euler:3,flow:heun:3")
    table = dq.measure(modules, rows, frechet, n=6, batch=6, seeds=[0, 1], repeat={"flow:heun:3"})
    assert [r[0] for r in table] == ["eps DDIM-5", "eps DPM-Solver++(2M)-4", "flow Euler-3", "flow Heun-3"]
    assert [r[1] for r in table] == [5, 4, 3, 5]  # NFE: Heun 2S - 1
    # one sampling per row at seed 0, and the Heun row's again at seed 1: NFE net calls each
    assert calls == {"eps": 5 + 4, "flow": 3 + 5 + 5}
    assert [r[3] for r in table] == ["", "", "", table[3][3]] and table[3][3] != ""
    assert all(x.shape == (6, 3, 4, 4) and x.abs().max() <= 1 for x in seen)
    # the same seed draws the same images again (the figures compare models on the same noise)
    again, _ = dq.sample(modules["flow"], rows[2], 6, 6, seed=0)
    torch.testing.assert_close(again, seen[2])
    assert not torch.equal(seen[3], seen[4])  # Heun at seeds 0 and 1
