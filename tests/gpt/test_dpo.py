"""DPO: the loss equals TRL's on the same log-probabilities, pairs are learned on their replies only, a fit prefers
the chosen replies, the LoRA reference is the base with its adapters off (no second copy), and a resume is exact or
refused."""

from __future__ import annotations

import gc
import json
import types
from collections import defaultdict

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything

from datamodules import PreferenceDataModule
from zoo.errors import CheckpointError, InputError
from zoo.gpt import GPT, DPOModule
from zoo.gpt.losses import IGNORE_INDEX
from zoo.gpt.tune.losses import dpo_loss, sequence_logps
from zoo.io.tokenizers import ByteTokenizer
from zoo.train.optim import AdamWCosine

EOS = ByteTokenizer.eos_id
NET = dict(vocab_size=257, block_size=48, n_layer=1, n_embd=32, n_head=2)


def _trl(pc, pr, rc, rr, beta, label_smoothing, loss_type="sigmoid"):
    """TRL 1.16's ``DPOTrainer._compute_loss`` on these sequence log-probabilities (a stand-in model returns them as
    one token's log-prob per row, the reference's are given as precomputed) and its logged metrics."""
    trl = pytest.importorskip("trl")
    b = len(pc)
    log_probs = torch.zeros(2 * b, 3)
    log_probs[:, 1] = torch.cat([pc, pr])
    model = types.SimpleNamespace(training=True)
    zeros = torch.zeros(2 * b, 3)
    out = types.SimpleNamespace(log_probs=log_probs, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())
    stub = types.SimpleNamespace(
        model=model,
        accelerator=types.SimpleNamespace(device="cpu", gather=lambda t: t, gather_for_metrics=lambda t: t),
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=[loss_type],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=label_smoothing,
        use_weighting=False,
        _metrics={"train": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )
    inputs = {
        "input_ids": torch.ones(2 * b, 4, dtype=torch.long),
        "attention_mask": torch.ones(2 * b, 4, dtype=torch.long),
        "completion_mask": torch.tensor([[0, 0, 1, 0]] * (2 * b)),
        "ref_chosen_logps": rc,
        "ref_rejected_logps": rr,
    }
    loss = trl.DPOTrainer._compute_loss(stub, lambda **kwargs: out, inputs, False)
    return loss, {k: v[0] for k, v in stub._metrics["train"].items()}


LOGPS = torch.tensor([[-3.0, -7.5, -1.2, -20.0], [-4.0, -6.0, -1.2, -18.5], [-3.5, -7.0, -1.0, -19.0]])
LOGPS = (LOGPS[0], LOGPS[1], LOGPS[2], torch.tensor([-4.2, -5.0, -1.5, -21.0]))  # chosen, rejected, ref's two


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_the_loss_and_its_statistics_equal_trl_dpo(beta):
    ours = dpo_loss(*LOGPS, beta=beta)
    loss, metrics = _trl(*LOGPS, beta, 0.0)
    torch.testing.assert_close(ours["loss"], loss)
    for name in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen"):
        assert ours[name].item() == pytest.approx(metrics[name], rel=1e-6, abs=1e-7), name
    assert 0 < ours["rewards/accuracies"] < 1  # the fixed pairs include a preferred and a dispreferred one


def test_label_smoothing_is_conservative_dpo_as_trl_computes_it():
    # TRL 1.x's sigmoid loss dropped label smoothing; its "aot" loss on one pair (sorting one value is the identity)
    # is cDPO's -(1 - eps) log sigmoid(beta d) - eps log sigmoid(-beta d), the sigmoid loss of TRL 0.x.
    for i in range(4):
        pair = tuple(t[i : i + 1] for t in LOGPS)
        loss, _ = _trl(*pair, 0.2, 0.3, loss_type="aot")
        torch.testing.assert_close(dpo_loss(*pair, beta=0.2, label_smoothing=0.3)["loss"], loss)
    assert dpo_loss(*LOGPS, 0.2, 0.3)["loss"] != dpo_loss(*LOGPS, 0.2, 0.0)["loss"]


def test_equal_rewards_cost_log_2_and_the_reference_gets_no_gradient():
    same = torch.tensor([-2.0, -3.0])
    out = dpo_loss(same, same, same, same, beta=0.1, label_smoothing=0.2)
    assert out["loss"].item() == pytest.approx(torch.log(torch.tensor(2.0)).item())
    assert out["rewards/accuracies"] == 0 and out["rewards/margins"] == 0
    ref = torch.tensor([-1.0, -1.0], requires_grad=True)
    policy = torch.tensor([-1.5, -0.5], requires_grad=True)
    dpo_loss(policy, same, ref, same)["loss"].backward()
    assert ref.grad is None and policy.grad is not None


def test_sequence_logps_sum_the_targets_that_are_learned():
    logits = torch.randn(2, 5, 7)
    targets = torch.tensor([[IGNORE_INDEX, 3, 4, IGNORE_INDEX, IGNORE_INDEX], [1, 2, 3, 4, 5]])
    logp = logits.log_softmax(-1)
    expected = torch.stack([logp[0, 1, 3] + logp[0, 2, 4], sum(logp[1, t, t + 1] for t in range(5))])
    torch.testing.assert_close(sequence_logps(logits, targets), expected)


# -- data ----------------------------------------------------------------------------------------------------------


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def _dm(path, **kwargs) -> PreferenceDataModule:
    dm = PreferenceDataModule(path, tokenizer="bytes", **{"val_fraction": 0, "block_size": 47} | kwargs)
    dm.setup("fit")
    return dm


def _learned(ids) -> str:
    return bytes(int(i) for i in ids if i != IGNORE_INDEX and i != EOS).decode()


def test_each_side_learns_its_reply_only_right_padded(tmp_path):
    prompt = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},  # an earlier reply in the prompt is context
        {"role": "user", "content": "2+2?"},
    ]
    records = [
        {"prompt": "3+4?", "chosen": "7", "rejected": "eight"},
        {
            "prompt": prompt,
            "chosen": [{"role": "assistant", "content": "4"}],
            "rejected": [{"role": "assistant", "content": "5"}],
        },
        {
            "chosen": prompt + [{"role": "assistant", "content": "4"}],
            "rejected": prompt + [{"role": "assistant", "content": "5"}],
        },
    ]
    dm = _dm(_write(tmp_path / "p.jsonl", records), block_size=120)
    batch = dm.train_set.collate([dm.train_set[i] for i in range(3)])
    chosen, rejected = batch["chosen_targets"], batch["rejected_targets"]
    assert [_learned(r) for r in chosen] == ["7", "4", "4"] and [_learned(r) for r in rejected] == ["eight", "5", "5"]
    assert [(r == EOS).sum().item() for r in chosen] == [1, 1, 1]  # each reply's EOS is learned
    assert torch.equal(batch["chosen_input_ids"][1], batch["chosen_input_ids"][2])  # the implicit prompt is the same
    assert batch["chosen_input_ids"].shape == batch["rejected_input_ids"].shape
    short = batch["chosen_input_ids"][0]
    n = len("<|user|>\n3+4?\n<|assistant|>\n7")
    assert (short[n:] == EOS).all() and (chosen[0, n:] == IGNORE_INDEX).all()  # right padding, not learned
    learned = chosen != IGNORE_INDEX
    assert torch.equal(batch["chosen_input_ids"][:, 1:][learned[:, :-1]], chosen[:, :-1][learned[:, :-1]])


def test_a_pair_with_a_side_past_block_size_is_dropped_and_counted(tmp_path):
    records = [{"prompt": "q", "chosen": "a", "rejected": "b"}, {"prompt": "q", "chosen": "a", "rejected": "b" * 40}]
    dm = _dm(_write(tmp_path / "p.jsonl", records), block_size=30)
    assert len(dm.train_set) == 1 and dm.dropped == 1


def test_a_side_of_block_size_plus_one_tokens_is_kept_and_one_more_is_dropped(tmp_path):
    from zoo.io.chat_template import chat_renderer

    long = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b" * 10}]
    n = len(chat_renderer(ByteTokenizer())(long).ids)  # the longer side's tokens, its EOS included
    records = [{"prompt": "q", "chosen": "a", "rejected": "c"}, {"prompt": "q", "chosen": "a", "rejected": "b" * 10}]
    path = _write(tmp_path / "p.jsonl", records)
    kept = _dm(path, block_size=n - 1)
    assert len(kept.train_set) == 2 and kept.dropped == 0
    assert kept.train_set.collate([kept.train_set[1]])["rejected_input_ids"].shape[1] == n - 1  # T = block_size
    dropped = _dm(path, block_size=n - 2)
    assert len(dropped.train_set) == 1 and dropped.dropped == 1


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"prompt": "q", "chosen": "a", "rejected": "a"}, "chosen equal to its rejected"),
        (
            {
                "prompt": [{"role": "tool", "content": "q"}],
                "chosen": [{"role": "assistant", "content": "a"}],
                "rejected": [{"role": "assistant", "content": "b"}],
            },
            "role 'tool'",
        ),
        ({"prompt": "q", "chosen": [{"role": "assistant", "content": 1}], "rejected": []}, "not all strings"),
        ({"prompt": [], "chosen": [{"role": "assistant", "content": 1}], "rejected": []}, "int content"),
        ({"prompt": "q", "chosen": "a"}, "no 'rejected'"),
        ({"chosen": "a", "rejected": "b"}, "no 'prompt'"),
        (
            {
                "prompt": [],
                "chosen": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}],
                "rejected": [{"role": "assistant", "content": "b"}],
            },
            "not one or more assistant turns",
        ),
    ],
)
def test_a_malformed_pair_is_named_by_file_and_line_or_skipped_and_counted(tmp_path, record, why):
    good = {"prompt": "q", "chosen": "a", "rejected": "b"}
    path = _write(tmp_path / "p.jsonl", [good, record, good])
    with pytest.raises(InputError, match=f"p.jsonl:2 .*{why}.*skip_bad_records"):
        _dm(path)
    dm = _dm(path, skip_bad_records=True)
    assert dm.skipped == 1 and len(dm.train_set) == 2


# -- the module ----------------------------------------------------------------------------------------------------

PAIRS = [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a in range(3) for b in range(2)]


def _module(**kwargs) -> DPOModule:
    seed_everything(0)
    optimizer = AdamWCosine(lr=3e-3, weight_decay=0.0, warmup_steps=0, min_lr_ratio=1.0)
    return DPOModule(GPT(**NET), beta=0.5, optimizer=optimizer, **kwargs)


def _trainer(tmp_path, steps, **kwargs) -> Trainer:
    return Trainer(
        max_steps=steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        default_root_dir=tmp_path,
        **{"enable_checkpointing": False} | kwargs,
    )


def _pairs_dm(tmp_path) -> PreferenceDataModule:
    path = _write(tmp_path / "pairs.jsonl", PAIRS)
    return PreferenceDataModule(path, val_path=path, tokenizer="bytes", block_size=47, batch_size=6)


def test_a_fit_prefers_the_chosen_replies(tmp_path):
    module, dm = _module(), _pairs_dm(tmp_path)
    before = _trainer(tmp_path, 0).validate(module, dm, verbose=False)[0]
    assert before["val/loss"] == pytest.approx(0.6931, abs=1e-3)  # the policy is its reference
    trainer = _trainer(tmp_path, 8, limit_val_batches=0)
    trainer.fit(module, dm)
    assert {"train/loss", "train/rewards/chosen", "train/logps/rejected"} <= set(trainer.callback_metrics)
    after = _trainer(tmp_path, 0).validate(module, dm, verbose=False)[0]
    assert after["val/loss"] < before["val/loss"] - 0.1 and after["val/rewards/accuracies"] == 1.0
    assert after["val/rewards/margins"] > 0 and after["val/rewards/chosen"] > after["val/rewards/rejected"]
    assert all(k.startswith("net.") for k in module.state_dict())  # the reference is no submodule


def test_with_lora_the_reference_is_the_base_with_adapters_off_and_no_copy(tmp_path):
    pytest.importorskip("peft")
    module, dm = _module(adapt={"lora": {"r": 4}}), _pairs_dm(tmp_path)
    # type(o), not isinstance: isinstance reads a weakref.proxy's __class__, which raises once its object is gone
    # (a dead proxy that an earlier test in the same worker left among the objects failed this test).
    nets_before = {id(o) for o in gc.get_objects() if issubclass(type(o), GPT)}
    _trainer(tmp_path, 2, limit_val_batches=0).fit(module, dm)
    # every GPT built since, dropped ones too
    new_nets = [o for o in gc.get_objects() if issubclass(type(o), GPT) and id(o) not in nets_before]
    assert new_nets == [] and module._reference.copy is None  # no second net in memory
    base = GPT(**NET)
    missing = base.load_state_dict(
        {k.replace(".base_layer", ""): v for k, v in module.net.state_dict().items() if "lora_" not in k}
    )
    assert not missing.missing_keys and not missing.unexpected_keys
    batch = next(iter(dm.val_dataloader()))
    ids, targets = batch["chosen_input_ids"], batch["chosen_targets"]
    with torch.no_grad(), module.reference() as ref:
        ours = sequence_logps(ref(ids), targets)
    torch.testing.assert_close(ours, sequence_logps(base.eval()(ids), targets))
    policy = sequence_logps(module.net(ids), targets)
    assert not torch.allclose(policy, ours)  # the adapters trained, and are back on after the reference forward


def test_with_lora_and_trainable_parameters_the_reference_stays_the_starting_weights(tmp_path):
    pytest.importorskip("peft")
    module, dm = _module(adapt={"lora": {"r": 4}, "trainable": ["net.norm_f.*"]}), _pairs_dm(tmp_path)
    _trainer(tmp_path, 2, limit_val_batches=0).fit(module, dm)
    seed_everything(0)
    start = GPT(**NET).eval()  # _module's net before the fit
    assert not torch.equal(module.net.norm_f.weight, start.norm_f.weight)  # trained in full, beside the adapters
    batch = next(iter(dm.val_dataloader()))
    ids, targets = batch["chosen_input_ids"], batch["chosen_targets"]
    with torch.no_grad(), module.reference() as ref:
        ours = sequence_logps(ref(ids), targets)
    torch.testing.assert_close(ours, sequence_logps(start(ids), targets))


@pytest.mark.parametrize("adapt", [None, {"lora": {"r": 4}}], ids=["copy", "adapters_off"])
def test_a_reference_forward_has_no_dropout_and_leaves_the_nets_mode_as_it_was(adapt):
    if adapt:
        pytest.importorskip("peft")
    seed_everything(0)
    module = DPOModule(GPT(**NET, dropout=0.5), beta=0.5, adapt=adapt)
    module.configure_model()
    assert (module._reference.copy is None) == bool(adapt)  # adapters stand for the reference
    ids = torch.randint(0, 257, (2, 12))
    for training in (True, False):
        module.net.train(training)
        with torch.no_grad(), module.reference() as ref:
            assert torch.equal(ref(ids), ref(ids))  # the reference in eval mode: no dropout
        assert all(m.training == training for m in module.net.modules())
    module.net.train()
    with torch.no_grad():
        assert not torch.equal(module.net(ids), module.net(ids))  # the policy's dropout is back on


def test_a_resume_is_exact_and_refused_against_other_starting_weights(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    dm = _pairs_dm(tmp_path)
    straight = _module()
    every = ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1, filename="{step}")
    _trainer(tmp_path, 4, limit_val_batches=0, enable_checkpointing=True, callbacks=[every]).fit(straight, dm)
    ckpt = str(tmp_path / "ckpt" / "step=2.ckpt")
    resumed = _module()
    _trainer(tmp_path, 4, limit_val_batches=0).fit(resumed, dm, ckpt_path=ckpt)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)

    seed_everything(1)
    other = DPOModule(GPT(**NET))  # other starting weights: the reference would not be the one tuned against
    with pytest.raises(CheckpointError, match="other starting weights.*init_weights"):
        _trainer(tmp_path, 4, limit_val_batches=0).fit(other, dm, ckpt_path=ckpt)


@pytest.mark.slow  # ~10 s: cli.py's imports, a run into MLflow and its logged model
def test_the_tiny_dpo_config_fits_through_the_cli(tmp_path):
    from conftest import CONFIGS, fit_in_folder

    path = _write(tmp_path / "pairs.jsonl", PAIRS * 2)  # the last tenth validates
    fitted = fit_in_folder(
        tmp_path,
        "--config",
        str(CONFIGS / "gpt" / "dpo_tiny.yaml"),
        f"--data.init_args.path={path}",
        "--data.init_args.generate=null",  # your pairs instead of the generated task's
        "--trainer.max_steps=4",
        "--trainer.val_check_interval=4",
    )
    metrics = fitted.trainer.callback_metrics
    assert isinstance(fitted.model, DPOModule) and fitted.model.net.vocab_size == 257
    assert {"val/loss", "val/rewards/accuracies", "val/rewards/margins"} <= set(metrics)
    assert torch.isfinite(metrics["val/loss"])
    reloaded = DPOModule.load_from_checkpoint(fitted.trainer.checkpoint_callback.last_model_path)
    assert reloaded.generate(["1+1="], max_new_tokens=3, temperature=0) == fitted.model.eval().generate(
        ["1+1="], max_new_tokens=3, temperature=0
    )


def test_a_peft_adapter_to_start_from_is_refused_as_its_reference_would_be_the_base():
    with pytest.raises(InputError, match="adapter_weights.*merged"):
        DPOModule(GPT(**NET), adapter_weights="adapter_folder")


def test_a_dpo_model_scores_task_records_as_the_language_model_it_is(tmp_path):
    """``cli.py test --data datamodules.TaskDataModule`` on a DPO stage's model: the task's metrics, the same as
    CausalLMModule's on the same net (ThroughputMonitor counts task batches too)."""
    import lightning as L
    from lightning.pytorch.callbacks import ThroughputMonitor

    from datamodules.tasks import TaskDataModule
    from zoo.gpt import CausalLMModule
    from zoo.gpt.tune.dpo import _pairs, _tokens
    from zoo.io.tokenizers import ByteTokenizer

    records = [{"query": f"{a}+{a}=", "choices": [str(2 * a), str(2 * a + 1)], "label": 0} for a in range(6)]
    path = _write(tmp_path / "mc.jsonl", records)
    torch.manual_seed(0)
    dpo = DPOModule(GPT(**NET))
    lm = CausalLMModule(GPT(**NET))
    lm.net.load_state_dict(dpo.net.state_dict())
    got = []
    for module in (dpo, lm):
        module.tokenizer = ByteTokenizer()
        monitor = ThroughputMonitor(batch_size_fn=_pairs, length_fn=_tokens)
        trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[monitor])
        got.append(trainer.test(module, datamodule=TaskDataModule(path, batch_size=4), verbose=False)[0])
    assert set(got[0]) >= {"test/acc", "test/acc_norm"} and got[0] == got[1]
