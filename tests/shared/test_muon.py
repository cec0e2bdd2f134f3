"""Muon in the shared optimizer: the hidden matrices of every family's nets go to Muon and the rest to AdamW, each
parameter once; each half steps as torch's own optimizer does, one schedule scales both, and state round-trips."""

from __future__ import annotations

import copy
import functools
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import CONFIGS, cli
from torch import nn

from zoo.errors import InputError
from zoo.train.optim import AdamOrRMSprop, AdamWCosine, MuonAdamW, MuonSettings


def _module(config: str, *args: str):
    from cli import main

    argv = ["--config", str(CONFIGS / config), "--trainer.logger=false", "--model.init_args.optimizer.muon={}", *args]
    return main(argv, run=False).model


def _gqa_gpt() -> nn.Module:
    from zoo.gpt import GPT, MHA

    attention = functools.partial(MHA, n_kv_head=2)
    return GPT(50, 16, n_layer=1, n_embd=16, n_head=4, attention=attention, tie_embeddings=False, mtp_depth=1)


def _resnet() -> nn.Module:
    from zoo.cnn.torchvision_net import TorchvisionNet

    return TorchvisionNet("resnet18", num_classes=3)


# The >=2-D parameters each net keeps with AdamW, written out by hand: embeddings, and the layers that read the
# input and write the output. Everything else of two or more dimensions is a hidden matrix and goes to Muon.
NOT_HIDDEN = {
    "gpt/gpt_tiny.yaml": {"tok_emb.weight", "pos_emb.weight"},  # the head is tied to tok_emb
    "gpt/moe_tiny.yaml": {"tok_emb.weight"},  # MLA, experts stacked (E, out, in)
    "gpt/deepseek_tiny.yaml": {"tok_emb.weight"},  # MLA, MoE, a multi-token-prediction module
    "gqa": {"tok_emb.weight", "pos_emb.weight", "lm_head.weight"},  # untied head
    "clip/tiny.yaml": {
        "image_encoder.conv1.weight",
        "image_encoder.positional_embedding",
        "image_encoder.proj.weight",
        "text_encoder.token_embedding.weight",
        "text_encoder.positional_embedding",
        "text_encoder.proj.weight",
    },
    "diffusion/tiny.yaml": {"conv_in.weight", "conv_out.weight", "label_embed.embedding_table.weight"},
    "diffusion/dit_tiny_shapes16.yaml": {
        "x_embedder.proj.weight",
        "final_layer.linear.weight",
        "y_embedder.embedding_table.weight",
    },
    "cnn/convnet_digits.yaml": {"features.0.0.weight", "head.weight"},
    "torchvision-resnet18": {"model.conv1.weight", "model.fc.weight"},
}


@pytest.mark.parametrize("source", list(NOT_HIDDEN))
def test_every_familys_net_gives_muon_its_hidden_matrices_and_adamw_the_rest_each_once(source):
    if source.endswith(".yaml"):
        module = _module(source, "--model.init_args.optimizer.weight_decay=0.3")
        net, settings = module.net, AdamWCosine.of(module.hparams.optimizer)
    else:
        net = _gqa_gpt() if source == "gqa" else _resnet()
        net.get_submodule("model.layer1.0.conv2" if source != "gqa" else "blocks.0.attn.proj").weight.requires_grad_(
            False
        )
        settings = AdamWCosine(weight_decay=0.3, muon=MuonSettings())
    opt = settings.configure(net, SimpleNamespace(estimated_stepping_batches=10))["optimizer"]
    assert isinstance(opt, MuonAdamW)
    names = {id(p): n for n, p in net.named_parameters()}
    seen = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(seen) == len(set(seen)) and set(seen) == {id(p) for p in net.parameters() if p.requires_grad}
    muon = {names[id(p)]: g["flatten"] for g in opt.param_groups if g["muon"] for p in g["params"]}
    adamw = {names[id(p)] for g in opt.param_groups if not g["muon"] for p in g["params"]}
    params = dict(net.named_parameters())
    assert {n for n in adamw if params[n].ndim >= 2} == NOT_HIDDEN[source]
    assert muon and all(params[n].ndim >= 2 for n in muon)
    convs = {f"{m}.weight" for m, mod in net.named_modules() if isinstance(mod, nn.Conv2d)}
    assert {n for n, flat in muon.items() if flat} == convs & muon.keys()  # filters flattened, all else per matrix
    layers = {f"{m}.weight" for m, mod in net.named_modules() if isinstance(mod, (nn.Conv2d, nn.Linear))}
    decayed = {
        names[id(p)] for g in opt.param_groups if not g["muon"] and g["weight_decay"] == 0.3 for p in g["params"]
    }
    assert decayed == NOT_HIDDEN[source] & layers  # the input and output layers decay, embeddings do not
    for g in opt.param_groups:
        if g["muon"]:
            assert (g["weight_decay"], g["momentum"], g["initial_lr"]) == (0.0, 0.95, 0.02)


class Mixed(nn.Module):
    """One of each kind: an embedding, a hidden 2-D matrix (rectangular), a stack of expert matrices, a conv filter
    bank, a norm, biases and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.hidden = nn.Linear(8, 24)
        self.norm = nn.LayerNorm(24)
        self.experts = nn.Parameter(torch.randn(3, 24, 24) / 5)
        self.conv = nn.Conv2d(6, 12, 2)
        self.head = nn.Linear(12, 5)

    def io_layers(self) -> tuple[str, ...]:
        return ("emb", "head")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.hidden(self.emb(ids).mean(1)))  # (B, 24)
        h = torch.einsum("bi,eoi->bo", h, self.experts)  # (B, 24)
        return self.head(self.conv(h.view(-1, 6, 2, 2)).flatten(1))  # (B, 5)


def _loss(net: nn.Module, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids, y = torch.randint(0, 11, (16, 4), generator=g), torch.randint(0, 5, (16,), generator=g)
    return nn.functional.cross_entropy(net(ids), y)


@pytest.mark.parametrize(("nesterov", "adjust_lr_fn"), [(True, "original"), (False, "match_rms_adamw")])
def test_muon_steps_as_torch_muon_and_adamw_as_torch_adamw_both_under_the_one_schedule(nesterov, adjust_lr_fn):
    torch.manual_seed(0)
    net = Mixed()
    ref = copy.deepcopy(net)
    muon = MuonSettings(
        lr=0.05, momentum=0.9, nesterov=nesterov, weight_decay=0.1, adjust_lr_fn=adjust_lr_fn, ns_dtype="bfloat16"
    )
    settings = AdamWCosine(lr=0.01, weight_decay=0.2, betas=(0.8, 0.95), warmup_steps=2, min_lr_ratio=0.1, muon=muon)
    out = settings.configure(net, SimpleNamespace(estimated_stepping_batches=4))
    opt, sched = out["optimizer"], out["lr_scheduler"]["scheduler"]

    # The reference: torch.optim.Muon on 2-D copies (the conv filters flattened, each expert its own matrix) and
    # torch.optim.AdamW on the rest, their learning rates set by hand from the warmup-cosine's closed form.
    mats = {
        "hidden": [ref.hidden.weight],
        "experts": [nn.Parameter(e.clone()) for e in ref.experts.detach()],
        "conv": [nn.Parameter(ref.conv.weight.detach().reshape(12, -1).clone())],
    }
    ref_muon = torch.optim.Muon(
        [p for ps in mats.values() for p in ps],
        lr=0.05,
        weight_decay=0.1,
        momentum=0.9,
        nesterov=nesterov,
        adjust_lr_fn=adjust_lr_fn,
    )
    no_decay = [ref.emb.weight, ref.hidden.bias, ref.norm.weight, ref.norm.bias, ref.conv.bias, ref.head.bias]
    ref_adamw = torch.optim.AdamW(
        [{"params": [ref.head.weight], "weight_decay": 0.2}, {"params": no_decay, "weight_decay": 0.0}],
        lr=0.01,
        betas=(0.8, 0.95),
        fused=True,
    )
    factors = [0.5, 1.0, 1.0, 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5))]  # warmup 2 of 4 steps, floor 0.1
    for step, factor in enumerate(factors):
        opt.zero_grad()
        _loss(net, step).backward()
        opt.step()
        sched.step()

        ref.zero_grad()
        ref_muon.param_groups[0]["lr"] = 0.05 * factor
        for g in ref_adamw.param_groups:
            g["lr"] = 0.01 * factor
        _loss(ref, step).backward()
        for m, e in zip(mats["experts"], ref.experts.grad):
            m.grad = e.clone()
        mats["conv"][0].grad = ref.conv.weight.grad.reshape(12, -1).clone()
        ref_muon.step()
        ref_adamw.step()
        with torch.no_grad():
            ref.experts.copy_(torch.stack(mats["experts"]))
            ref.conv.weight.copy_(mats["conv"][0].view_as(ref.conv.weight))
        for (name, p), r in zip(net.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p, r, rtol=0, atol=0, msg=f"{name} after step {step}")


@pytest.mark.parametrize("adjust_lr_fn", ["original", "match_rms_adamw"])
def test_on_a_cpu_muon_orthogonalises_in_float32_and_steps_as_torch_muon_up_to_its_bfloat16(adjust_lr_fn):
    torch.manual_seed(0)
    layer = nn.Linear(8, 24, bias=False)  # tall: the shape scaling matters
    layer.io_layers = tuple
    ref = nn.Parameter(layer.weight.detach().clone())
    muon = MuonSettings(lr=0.05, weight_decay=0.1, adjust_lr_fn=adjust_lr_fn)  # ns_dtype auto: float32 here
    opt = AdamWCosine(muon=muon).configure(layer, None)["optimizer"]
    ref_opt = torch.optim.Muon([ref], lr=0.05, weight_decay=0.1, adjust_lr_fn=adjust_lr_fn)
    start = ref.detach().clone()
    for _ in range(3):
        grad = torch.randn(24, 8)
        layer.weight.grad, ref.grad = grad.clone(), grad.clone()
        opt.step()
        ref_opt.step()
    moved, ref_moved = layer.weight - start, ref - start
    assert 0 < (moved - ref_moved).norm() < 0.02 * ref_moved.norm()  # not bfloat16's steps, within its precision

    from zoo.train.optim import newton_schulz

    g = torch.randn(24, 8)
    u, _, vh = torch.linalg.svd(g.double(), full_matrices=False)
    o = newton_schulz(g, (3.4445, -4.775, 2.0315), 5, 1e-7)
    assert o.dtype == torch.float32 and o.shape == g.shape
    d = u.T @ o.double() @ vh.T  # (8, 8): g's singular vectors diagonalise O = U p(S) V^T
    torch.testing.assert_close(d - torch.diag(d.diagonal()), torch.zeros_like(d), atol=1e-5, rtol=0)
    assert 0.6 < d.diagonal().min() and d.diagonal().max() < 1.25  # Jordan's coefficients: near 1, not exactly


def test_the_schedule_moves_the_muon_and_the_adamw_learning_rates_together():
    net = Mixed()
    settings = AdamWCosine(lr=0.01, warmup_steps=3, min_lr_ratio=0.0, muon=MuonSettings(lr=0.05))
    out = settings.configure(net, SimpleNamespace(estimated_stepping_batches=7))
    opt, sched = out["optimizer"], out["lr_scheduler"]["scheduler"]
    assert [g["muon"] for g in opt.param_groups] == [True, True, False, False]
    for step in range(7):
        factor = (step + 1) / 3 if step < 3 else 0.5 * (1 + math.cos(math.pi * (step - 3) / 4))
        lrs = [g["lr"] for g in opt.param_groups]
        assert lrs == pytest.approx([0.05 * factor] * 2 + [0.01 * factor] * 2, abs=1e-12), step
        opt.zero_grad()
        _loss(net, step).backward()
        opt.step()
        sched.step()


def test_a_saved_state_resumes_to_the_same_steps():
    torch.manual_seed(0)
    net = Mixed()
    settings = AdamWCosine(lr=0.01, warmup_steps=2, muon=MuonSettings())

    def run(net, opt, sched, steps):
        for step in steps:
            opt.zero_grad()
            _loss(net, step).backward()
            opt.step()
            sched.step()

    out = settings.configure(net, SimpleNamespace(estimated_stepping_batches=6))
    run(net, out["optimizer"], out["lr_scheduler"]["scheduler"], range(3))
    saved = copy.deepcopy(
        (net.state_dict(), out["optimizer"].state_dict(), out["lr_scheduler"]["scheduler"].state_dict())
    )
    run(net, out["optimizer"], out["lr_scheduler"]["scheduler"], range(3, 6))

    resumed = Mixed()
    resumed.load_state_dict(saved[0])
    again = settings.configure(resumed, SimpleNamespace(estimated_stepping_batches=6))
    again["optimizer"].load_state_dict(saved[1])
    again["lr_scheduler"]["scheduler"].load_state_dict(saved[2])
    run(resumed, again["optimizer"], again["lr_scheduler"]["scheduler"], range(3, 6))
    for (name, p), r in zip(net.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(r, p, rtol=0, atol=0, msg=name)


def test_channels_last_filters_step_as_contiguous_ones():
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 2, 1))
    conv.io_layers = lambda: ("0", "2")
    start = conv[1].weight.detach().clone()
    last = copy.deepcopy(conv).to(memory_format=torch.channels_last)
    settings = AdamWCosine(muon=MuonSettings())
    x = torch.randn(2, 3, 9, 9)
    for net in (conv, last):
        opt = settings.configure(net, None)["optimizer"]
        for _ in range(2):
            opt.zero_grad()
            net(x.contiguous(memory_format=torch.channels_last) if net is last else x).square().mean().backward()
            opt.step()
    assert last[1].weight.is_contiguous(memory_format=torch.channels_last)
    moved = (conv[1].weight - start).norm()
    assert moved > 0.01  # two Muon steps of lr 0.02, written back to the channels-last weights as well:
    assert (last[1].weight - conv[1].weight).norm() < 0.01 * moved  # the same steps, up to the kernels' rounding


def test_bad_settings_and_nets_that_name_no_io_layers_are_refused_with_the_key_to_fix():
    with pytest.raises(InputError, match=r"momentum=1.5 must be in \[0, 1\): set model.init_args.optimizer.muon"):
        MuonSettings(momentum=1.5)
    assert AdamWCosine.of({"lr": 0.1, "muon": {"lr": 0.03}}).muon == MuonSettings(lr=0.03)  # from hyperparameters
    with pytest.raises(InputError, match="Sequential has no io_layers"):
        AdamWCosine(muon=MuonSettings()).configure(nn.Sequential(nn.Linear(2, 2)), None)


def test_fsdp_sharded_parameters_are_refused(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        net = fully_shard(Mixed(), mesh=init_device_mesh("cpu", (1,)))
        with pytest.raises(InputError, match="cannot step FSDP-sharded parameters"):
            AdamWCosine(muon=MuonSettings()).configure(net, None)
    finally:
        dist.destroy_process_group()


def test_a_tiny_gpt_fits_with_muon_from_the_command_line_and_its_checkpoint_keeps_the_setting():
    # bf16 autocast, accumulation and clipping go through Lightning's usual paths: MuonAdamW is one optimizer.
    from zoo.gpt import CausalLMModule

    c = cli(
        "fit",
        "--config",
        str(CONFIGS / "gpt" / "gpt_tiny.yaml"),
        "--model.init_args.optimizer.muon.lr=0.03",
        "--data.init_args.samples_per_epoch=64",  # 8 batches, 4 steps: accumulation, clipping and autocast too
        "--trainer.accumulate_grad_batches=2",
        "--trainer.gradient_clip_val=0.5",
        "--trainer.precision=bf16-mixed",
        "--trainer.limit_val_batches=1",
        "--trainer.log_every_n_steps=1",
        "--trainer.logger=false",
    )
    (opt,) = c.trainer.optimizers
    assert isinstance(opt, MuonAdamW) and opt.param_groups[0]["muon"] and opt.param_groups[0]["initial_lr"] == 0.03
    assert all(s["momentum_buffer"].abs().sum() > 0 for s in opt.state.values() if "momentum_buffer" in s)
    assert c.trainer.global_step == 4 and c.trainer.callback_metrics["val/loss"] < math.log(257)
    loaded = CausalLMModule.load_from_checkpoint(c.trainer.checkpoint_callback.last_model_path)
    assert AdamWCosine.of(loaded.hparams.optimizer).muon == MuonSettings(lr=0.03)


# The actor-critic's >=2-D parameters kept with Adam, by hand: the layers that read the observation, both heads and
# the Gaussian log-std. The MLPs are Linear, Tanh, Linear, Tanh, Linear: 0 reads, 2 is hidden, 4 writes.
ACTOR_CRITIC_NOT_HIDDEN = {
    "flat": {"actor.0.weight", "critic.0.weight", "actor.4.weight", "critic.4.weight", "actor_logstd"},
    "nature_cnn": {"encoder.convs.0.weight", "actor.4.weight", "critic.4.weight"},  # the MLPs read CNN features
}


@pytest.mark.parametrize("encoder", list(ACTOR_CRITIC_NOT_HIDDEN))
def test_ppo_gives_muon_the_actor_critics_hidden_matrices_and_adam_the_rest_under_one_annealing(encoder):
    from zoo.rl import ActorCritic, PPOModule

    cnn = encoder == "nature_cnn"
    net = ActorCritic(3, 2, continuous=not cnn, encoder=encoder, obs_shape=[4, 36, 36] if cnn else None)
    optimizer = AdamOrRMSprop(lr=3e-4, eps=1e-5, weight_decay=0.1, muon=MuonSettings(lr=0.01))
    module = PPOModule(net, total_env_steps=1000, optimizer=optimizer)
    out = module.configure_optimizers()
    opt, sched = out["optimizer"], out["lr_scheduler"]["scheduler"]
    assert isinstance(opt, MuonAdamW) and module.hparams.optimizer["muon"] == vars(MuonSettings(lr=0.01))
    names = {id(p): n for n, p in net.named_parameters()}
    seen = [id(p) for g in opt.param_groups for p in g["params"]]
    assert len(seen) == len(set(seen)) and set(seen) == set(names)
    params = dict(net.named_parameters())
    muon = {names[id(p)]: g["flatten"] for g in opt.param_groups if g["muon"] for p in g["params"]}
    adamw = {names[id(p)] for g in opt.param_groups if not g["muon"] for p in g["params"]}
    assert {n for n in adamw if params[n].ndim >= 2} == ACTOR_CRITIC_NOT_HIDDEN[encoder]
    assert {"actor.2.weight", "critic.2.weight"} <= muon.keys() and all(params[n].ndim >= 2 for n in muon)
    assert {n for n, flat in muon.items() if flat} == (
        {"encoder.convs.2.weight", "encoder.convs.4.weight"} if cnn else set()
    )
    for g in opt.param_groups:
        assert g["initial_lr"] == (0.01 if g["muon"] else 3e-4)
        if not g["muon"]:
            assert g["eps"] == 1e-5  # PPO's Adam epsilon (Baselines'), not torch's 1e-8
    module.env_steps.fill_(250)  # a quarter of the budget: both rates annealed to 3/4
    opt.step()  # no gradients, nothing moves; a scheduler stepped before its optimizer warns
    sched.step()
    assert [g["lr"] / g["initial_lr"] for g in opt.param_groups] == pytest.approx([0.75] * len(opt.param_groups))
    with pytest.raises(InputError, match="momentum=1.0"):  # a checkpoint's settings are checked as the config's
        PPOModule(net, optimizer={"muon": {"momentum": 1.0}})
