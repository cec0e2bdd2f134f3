"""``compile: true`` from YAML trains the GPT, the UNet and the DiT through cli.py on a CPU (inductor + gcc).

A few optimizer steps of each tiny config with the module's ``compile`` switch on: the compiled net is the
one that trained (it exists, off the module tree) and computes what the eager net computes. Marked slow:
inductor builds C++ kernels for each net, about a minute each on a loaded 2-core machine. Skipped where
inductor cannot build (no C++ compiler).
"""

from __future__ import annotations

import pytest
import torch
from conftest import CONFIGS, cli

pytestmark = pytest.mark.slow

SMALL_DIT = [
    "--model.init_args.net.init_args.depth=1",
    "--model.init_args.net.init_args.hidden_size=32",
    "--model.init_args.net.init_args.image_size=8",
    "--data.init_args.images.init_args.image_size=8",
    "--data.init_args.images.init_args.num_train=64",
    "--data.init_args.images.init_args.batch_size=8",
]
CASES = {
    "gpt/gpt_tiny.yaml": [],
    "diffusion/tiny.yaml": [],
    "diffusion/dit_tiny_shapes16.yaml": SMALL_DIT,
}


@pytest.fixture(scope="module", autouse=True)
def _inductor_builds():
    try:
        torch.compile(lambda x: x * 2 + 1)(torch.ones(3))
    except Exception as e:
        pytest.skip(f"torch.compile cannot build kernels on this machine: {e}")


def net_input(net) -> tuple:
    torch.manual_seed(0)
    if hasattr(net, "vocab_size"):  # GPT
        return (torch.randint(0, net.vocab_size, (2, 16)),)
    s, c = net.image_size, net.in_channels
    return torch.randn(2, c, s, s), torch.tensor([3, 70]), torch.tensor([0, 1]) if net.num_classes else None


@pytest.mark.parametrize("config", CASES)
def test_compiled_net_trains_from_yaml_and_matches_eager(config):
    c = cli(
        "fit",
        "--config",
        str(CONFIGS / config),
        "--model.init_args.compile=true",
        "--trainer.max_steps=2",
        "--trainer.max_epochs=1",
        "--trainer.limit_val_batches=0",
        "--trainer.logger=false",
        *CASES[config],
    )
    module = c.model
    assert c.trainer.global_step == 2
    assert module._compiled is not None  # the training steps ran through torch.compile
    assert not any("_orig_mod" in k for k in module.state_dict())  # checkpoint keys unchanged
    module.net.train()
    args = net_input(module.net)
    with torch.no_grad():
        torch.testing.assert_close(module._compiled(*args), module.net(*args), atol=1e-4, rtol=1e-4)
