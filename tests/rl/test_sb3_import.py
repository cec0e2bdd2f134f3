"""Stable-Baselines3 zips in (``zoo.rl.from_pretrained``): SB3 models with random weights, saved by SB3 itself, act as
SB3's ``predict`` does once imported; every tensor of ``policy.pth`` reaches an output; a zip the zoo cannot hold
exactly, or one built to attack the reader, is refused in one line and runs nothing."""

from __future__ import annotations

import base64
import io
import json
import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer

from zoo.errors import InputError, UnsafeCheckpointError
from zoo.rl import from_pretrained
from zoo.rl.sb3 import MAX_DATA_BYTES

sb3 = pytest.importorskip("stable_baselines3")

# name -> (SB3 class, env, policy_kwargs): Discrete and Box actions, both activations, SAC with three critics.
AGENTS = {
    "ppo_cartpole": ("PPO", "CartPole-v1", {"net_arch": [8, 8]}),
    "ppo_pendulum_relu": ("PPO", "Pendulum-v1", {"net_arch": [8], "activation_fn": torch.nn.ReLU}),
    "a2c_cartpole": ("A2C", "CartPole-v1", {"net_arch": [8, 8]}),
    "a2c_pendulum": ("A2C", "Pendulum-v1", {"net_arch": [8, 8]}),
    "sac_pendulum": ("SAC", "Pendulum-v1", {"net_arch": [8, 8], "n_critics": 3}),
    "td3_pendulum": ("TD3", "Pendulum-v1", {"net_arch": [8, 8]}),
}


def sb3_zip(tmp_path: Path, name: str, seed: int = 0, **policy_kwargs) -> Path:
    """An SB3 model of ``AGENTS[name]`` whose every tensor is random (log-std and temperature too), saved by SB3."""
    algo, env, kwargs = AGENTS[name]
    torch.manual_seed(seed)
    model = getattr(sb3, algo)("MlpPolicy", env, policy_kwargs={**kwargs, **policy_kwargs}, device="cpu", seed=seed)
    with torch.no_grad():
        for p in model.policy.parameters():
            p.normal_(0.0, 0.3)
        if algo == "SAC":
            model.log_ent_coef.fill_(-0.7)
    path = tmp_path / f"{name}.zip"
    model.save(path)
    return path


def observations(model, n: int = 1000) -> np.ndarray:
    """Random observations around and past the space's usual range."""
    dim = model.observation_space.shape[0]
    return (np.random.default_rng(1).normal(size=(n, dim)) * 3).astype(np.float32)


def zoo_actions(module, obs: np.ndarray, space) -> np.ndarray:
    actions = module.act(torch.from_numpy(obs)).numpy()
    return np.clip(actions, space.low, space.high) if hasattr(space, "low") else actions  # as the collector clips


@pytest.mark.parametrize("name", AGENTS)
def test_an_imported_agent_acts_as_sb3s_predict_on_a_thousand_observations(tmp_path, name):
    path = sb3_zip(tmp_path, name)
    model = getattr(sb3, AGENTS[name][0]).load(path, device="cpu")
    module = from_pretrained(path)
    assert type(module).__name__ == f"{AGENTS[name][0]}Module"
    obs = observations(model)
    expected, _ = model.predict(obs, deterministic=True)
    got = zoo_actions(module, obs, model.action_space)
    if AGENTS[name][1] == "CartPole-v1":
        assert np.array_equal(got, expected)  # argmax: exact
        assert len(np.unique(expected)) == 2  # both actions chosen: a constant policy would pass too
    else:
        assert np.abs(got - expected).max() <= 1e-5
        assert expected.std() > 0.1


@pytest.mark.parametrize("name", ["ppo_pendulum_relu", "a2c_cartpole"])
def test_an_imported_critic_and_log_std_are_sb3s(tmp_path, name):
    path = sb3_zip(tmp_path, name)
    model = getattr(sb3, AGENTS[name][0]).load(path, device="cpu")
    module = from_pretrained(path)
    x = torch.from_numpy(observations(model))
    with torch.no_grad():
        torch.testing.assert_close(module.net.get_value(x), model.policy.predict_values(x).squeeze(-1))
        if module.net.continuous:
            torch.testing.assert_close(module.net.actor_logstd.squeeze(0), model.policy.log_std)


def test_imported_sac_and_td3_critics_targets_and_temperature_are_sb3s(tmp_path):
    for name in ("sac_pendulum", "td3_pendulum"):
        path = sb3_zip(tmp_path, name)
        model = getattr(sb3, AGENTS[name][0]).load(path, device="cpu")
        module = from_pretrained(path)
        x = torch.from_numpy(observations(model, 200))
        a = torch.rand(200, 1) * 4 - 2
        with torch.no_grad():
            torch.testing.assert_close(module.net.critic(x, a), torch.stack(model.critic(x, a)).squeeze(-1))
            torch.testing.assert_close(module.critic_target(x, a), torch.stack(model.critic_target(x, a)).squeeze(-1))
            if name == "sac_pendulum":
                assert module.net.critic.qs.__len__() == 3 and module.hparams.autotune
                torch.testing.assert_close(module.log_alpha, torch.tensor(-0.7))
            else:
                target = model.policy.unscale_action(model.actor_target(x).numpy())  # SB3's acts in [-1, 1]
                torch.testing.assert_close(module.actor_target(x), torch.from_numpy(target))


# -- every tensor counts: perturbation, extra and missing tensors -------------------------------------------------


def rewrite(path: Path, out: Path, policy=None, data=None, extra: dict[str, bytes] | None = None) -> Path:
    """``path``'s members into ``out``, ``policy.pth`` and ``data`` replaced by ``policy(state)`` and ``data(json)``."""
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            raw = src.read(info)
            if info.filename == "policy.pth" and policy is not None:
                buf = io.BytesIO()
                torch.save(policy(torch.load(io.BytesIO(raw), weights_only=True)), buf)
                raw = buf.getvalue()
            if info.filename == "data" and data is not None:
                d = json.loads(raw)
                data(d)
                raw = json.dumps(d).encode()
            dst.writestr(info.filename, raw)
        for name, raw in (extra or {}).items():
            dst.writestr(name, raw)
    return out


def outputs(module, x: torch.Tensor) -> list[torch.Tensor]:
    """Every output the imported tensors reach: actions, values, the stochastic policy's parameters, targets."""
    net, a = module.net, torch.linspace(-2, 2, len(x))[:, None]
    with torch.no_grad():
        if hasattr(net, "get_value"):
            return [net.actor(x), net.get_value(x), *([net.actor_logstd] if net.continuous else [])]
        if hasattr(module, "log_alpha"):  # SAC
            return [*net.actor(x), net.critic(x, a), module.critic_target(x, a), module.log_alpha]
        return [net.actor(x), module.actor_target(x), net.critic(x, a), module.critic_target(x, a)]


@pytest.mark.parametrize("name", ["ppo_pendulum_relu", "a2c_cartpole", "sac_pendulum", "td3_pendulum"])
def test_changing_any_one_tensor_of_policy_pth_changes_an_output(tmp_path, name):
    path = sb3_zip(tmp_path, name)
    x = torch.randn(64, 4 if "cartpole" in name else 3)
    before = outputs(from_pretrained(path), x)
    keys = list(torch.load(zipfile.ZipFile(path).open("policy.pth"), weights_only=True))
    for key in keys:
        bumped = rewrite(path, tmp_path / "bumped.zip", policy=lambda s, key=key: {**s, key: s[key] + 0.3})
        after = outputs(from_pretrained(bumped), x)
        assert any(not torch.equal(b, a) for b, a in zip(before, after)), f"{key} reaches no output"


def test_a_tensor_too_many_or_missing_is_refused_in_one_line_naming_it(tmp_path):
    path = sb3_zip(tmp_path, "ppo_cartpole")
    extra = rewrite(path, tmp_path / "extra.zip", policy=lambda s: {**s, "features_extractor.extra": torch.ones(3)})
    with pytest.raises(InputError, match=r"no place for: features_extractor\.extra\)") as err:
        from_pretrained(extra)
    assert "\n" not in str(err.value)
    missing = rewrite(
        path, tmp_path / "missing.zip", policy=lambda s: {k: v for k, v in s.items() if k != "value_net.bias"}
    )
    with pytest.raises(InputError, match=r"parameters unset: net\.critic\.4\.bias") as err:
        from_pretrained(missing)
    assert "\n" not in str(err.value)


def test_policy_and_value_nets_of_different_widths_are_refused_by_name(tmp_path):
    path = sb3_zip(tmp_path, "ppo_cartpole", net_arch={"pi": [8], "vf": [16]})
    with pytest.raises(InputError, match=r"hidden widths \[8\] differ from its value net's \[16\]"):
        from_pretrained(path)


def _set(key: str, **fields):
    return lambda d: d[key].update(fields)


@pytest.mark.parametrize(
    "edit, named",
    [
        (_set("policy_kwargs", features_extractor_class="<class 'mine.Extractor'>"), "features_extractor_class"),
        (lambda d: d.update(use_sde=True), r"gSDE \(use_sde=True\)"),
        (_set("policy_kwargs", activation_fn="<class 'torch.nn.modules.activation.ELU'>"), "activation_fn is ELU"),
        (_set("policy_class", __module__="sb3_contrib.ppo_recurrent.policies"), "sb3_contrib.ppo_recurrent"),
        (_set("action_space", **{":type:": "<class 'gymnasium.spaces.multi_binary.MultiBinary'>"}), "MultiBinary"),
        (_set("action_space", high="[0.41887903]"), "printed rounded"),
    ],
)
def test_a_feature_the_zoo_lacks_is_refused_by_name(tmp_path, edit, named):
    path = sb3_zip(tmp_path, "ppo_pendulum_relu")
    with pytest.raises(InputError, match=named) as err:
        from_pretrained(rewrite(path, tmp_path / "edited.zip", data=edit))
    assert "\n" not in str(err.value)


# -- attacks: nothing in the zip runs, nothing leaves it -----------------------------------------------------------


class _Marker:
    """Unpickles as ``open(marker, "w")``: the marker appears if the pickle is ever run."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_pickled_blob_in_data_is_never_unpickled_and_a_pickled_policy_is_refused(tmp_path):
    marker = tmp_path / "MARKER"
    path = sb3_zip(tmp_path, "sac_pendulum")
    blob = base64.b64encode(pickle.dumps(_Marker(marker))).decode()
    hostile = rewrite(path, tmp_path / "blob.zip", data=_set("policy_class", **{":serialized:": blob}))
    from_pretrained(hostile)  # imports: the blob is never read
    assert not marker.exists()
    with pytest.raises(UnsafeCheckpointError, match="would execute code"):
        from_pretrained(rewrite(path, tmp_path / "pth.zip", policy=lambda s: _Marker(marker)))
    assert not marker.exists()


@pytest.mark.parametrize(
    "member, raw, named",
    [
        ("../../escape.txt", b"out", "not a plain file name"),
        ("/tmp/abs.txt", b"out", "not a plain file name"),
        ("data", b"0" * (MAX_DATA_BYTES + 1), "'data' is larger than"),  # deflated to a few kB: a small zip bomb
    ],
)
def test_a_hostile_zip_is_refused_in_one_line(tmp_path, member, raw, named):
    path = sb3_zip(tmp_path, "ppo_cartpole")
    out = tmp_path / "hostile.zip"
    if member == "data":  # the huge data in place of the real one
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                dst.writestr(info.filename, raw if info.filename == "data" else src.read(info))
    else:
        rewrite(path, out, extra={member: raw})
    with pytest.raises(InputError, match=named) as err:
        from_pretrained(out)
    assert "\n" not in str(err.value) and not list(tmp_path.parent.rglob("escape.txt"))


def test_a_member_twice_is_refused(tmp_path):
    path = sb3_zip(tmp_path, "ppo_cartpole")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name it is asked to write
        twice = rewrite(path, tmp_path / "twice.zip", extra={"policy.pth": b"other"})
    with pytest.raises(InputError, match="'policy.pth' twice"):
        from_pretrained(twice)


def test_vec_normalize_statistics_are_a_pickle_and_refused_naming_why(tmp_path):
    marker = tmp_path / "MARKER"
    pkl = tmp_path / "vec_normalize.pkl"
    pkl.write_bytes(pickle.dumps(_Marker(marker)))
    with pytest.raises(InputError, match="it is a pickle .*VecNormalize.*vec_normalize="):
        from_pretrained(pkl)
    assert not marker.exists()


# -- and it trains on -------------------------------------------------------------------------------------------


def test_an_imported_ppo_agent_continues_training_in_the_zoo(tmp_path):
    from datamodules import GymDataModule

    module = from_pretrained(sb3_zip(tmp_path, "ppo_cartpole"), total_env_steps=256, num_steps=32)
    assert module.hparams.gamma == 0.99 and module.hparams.vf_coef == 1.0  # SB3's 0.5 on the plain MSE
    before = {k: v.clone() for k, v in module.net.state_dict().items()}
    trainer = Trainer(
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, GymDataModule("CartPole-v1", num_envs=4))
    assert int(module.env_steps) == 256
    assert all(not torch.equal(before[k], v) for k, v in module.net.state_dict().items())


def test_the_cli_continues_an_sb3_zip_with_no_net_block_on_the_env_of_its_spaces(tmp_path):
    """``init_weights: <zip>`` with ``net: zoo.rl.ActorCritic`` alone: the net is the zip's (``zoo.app.pretrained``),
    it acts as SB3's ``predict`` once set up and trains on; an env of other spaces is refused in one line naming the
    zip."""
    from conftest import cli

    path = sb3_zip(tmp_path, "ppo_cartpole")
    model = sb3.PPO.load(path, device="cpu")
    ppo = dict(total_env_steps=64, num_steps=16, num_minibatches=2, update_epochs=1)
    gym_data = dict(env_id="CartPole-v1", num_envs=2, max_episode_steps=20, eval_episodes=1, eval_envs=1)
    config = tmp_path / "continue.yaml"
    config.write_text(
        json.dumps(
            {
                "model": {
                    "class_path": "zoo.rl.PPOModule",
                    "init_args": {"net": {"class_path": "zoo.rl.ActorCritic"}, "init_weights": str(path), **ppo},
                },
                "data": {"class_path": "datamodules.GymDataModule", "init_args": gym_data},
                "trainer": {"logger": False, "enable_progress_bar": False, "max_epochs": -1, "num_sanity_val_steps": 0},
            }
        )
    )
    c = cli("validate", "--config", str(config))  # the zip's agent, evaluated in the zoo
    assert c.model.hparams["net"]["init_args"]["hidden_sizes"] == [8, 8]
    obs = observations(model)
    assert np.array_equal(zoo_actions(c.model, obs, model.action_space), model.predict(obs, deterministic=True)[0])
    c = cli("fit", "--config", str(config))
    assert int(c.model.env_steps) == 64
    assert not np.array_equal(zoo_actions(c.model, obs, model.action_space), model.predict(obs, deterministic=True)[0])
    with pytest.raises(InputError, match=r"ppo_cartpole\.zip is an agent for .*Acrobot-v1 observes") as err:
        cli("validate", "--config", str(config), "--data.init_args.env_id=Acrobot-v1")
    assert "\n" not in str(err.value)


class ActionsFrom1(gym.Wrapper):
    """CartPole acting in Discrete(2, start=1): SB3 learns and predicts indices from 0 all the same (it warns that it
    does not support such a space), and steps the env with them."""

    def __init__(self) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.action_space = gym.spaces.Discrete(2, start=1)


def test_an_sb3_agent_whose_discrete_actions_start_at_1_is_refused_in_one_line(tmp_path):
    from zoo.rl.sb3 import check_spaces, read_zip

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = sb3.PPO("MlpPolicy", ActionsFrom1(), policy_kwargs={"net_arch": [8]}, device="cpu", seed=0)
    model.save(tmp_path / "from1.zip")
    assert set(model.predict(observations(model, 200), deterministic=True)[0].tolist()) <= {0, 1}  # not the space's
    with pytest.raises(InputError, match=r"a Discrete n=2 start=1, not a Discrete starting at 0") as err:
        from_pretrained(tmp_path / "from1.zip")  # the zoo steps an env with index + start: not SB3's actions
    assert "\n" not in str(err.value)
    cartpole = sb3.PPO.load(sb3_zip(tmp_path, "ppo_cartpole"), device="cpu")
    z = read_zip(tmp_path / "ppo_cartpole.zip")
    check_spaces(z, "PPO", cartpole.observation_space, gym.spaces.Discrete(2), "CartPole-v1")
    with pytest.raises(InputError, match="is an agent for"):  # an agent of actions {0, 1} in an env of {1, 2}
        check_spaces(z, "PPO", cartpole.observation_space, gym.spaces.Discrete(2, start=1), "Offset-v0")


def test_init_weights_of_another_algorithm_or_net_is_refused_in_one_line(tmp_path):
    from zoo.rl import A2CModule, ActorCritic, PPOModule
    from zoo.rl.sb3 import load_init_weights, net_config

    path = sb3_zip(tmp_path, "ppo_cartpole")
    net = net_config(path)
    assert net == {
        "class_path": "zoo.rl.ActorCritic",
        "init_args": {"hidden_sizes": [8, 8], "obs_dim": 4, "action_dim": 2, "continuous": False, "activation": "tanh"},
    }
    with pytest.raises(InputError, match="it holds a PPO agent: continue it with zoo.rl.PPOModule, not A2CModule"):
        load_init_weights(A2CModule(ActorCritic(**net["init_args"])), path)
    with pytest.raises(InputError, match=r"not an exact PPOModule \(shapes: .*policy_net\.0\.weight \(8, 4\) for"):
        load_init_weights(PPOModule(ActorCritic(**net["init_args"] | {"hidden_sizes": [16, 16]})), path)


# -- VecNormalize: its statistics read as data, applied as the agent's observation normalisation --------------------


def vec_normalized(tmp_path: Path, algo: str = "PPO", norm_reward: bool = True) -> tuple[Path, Any, Any]:
    """An SB3 agent trained a few hundred steps under VecNormalize (its statistics moved far from the identity), saved
    as RL Zoo and the hub save it: the zip and ``vec_normalize.pkl`` beside it."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0), norm_reward=norm_reward, clip_obs=5.0)
    kwargs = {"n_steps": 64, "batch_size": 64, "n_epochs": 1} if algo == "PPO" else {}
    model = getattr(sb3, algo)("MlpPolicy", venv, seed=0, device="cpu", policy_kwargs={"net_arch": [8]}, **kwargs)
    if algo == "PPO":
        model.learn(256)
    else:  # the statistics of a few hundred steps, without SAC's seconds of updates
        venv.reset()
        for _ in range(128):
            venv.step(np.random.default_rng(0).uniform(-2, 2, (2, 1)).astype(np.float32))
    with torch.no_grad():
        for p in model.policy.parameters():  # large weights: the normalisation shows in the actions
            p.normal_(0.0, 0.5)
    model.save(tmp_path / "agent.zip")
    venv.save(tmp_path / "vec_normalize.pkl")
    return tmp_path / "agent.zip", model, venv


@pytest.mark.parametrize("algo", ["PPO", "SAC"])
def test_an_agent_trained_under_vec_normalize_acts_on_its_statistics_as_sb3_does(tmp_path, algo):
    path, model, venv = vec_normalized(tmp_path, algo, norm_reward=algo == "PPO")
    module = from_pretrained(path)  # vec_normalize.pkl beside it
    obs = observations(model, 200)
    expected, _ = model.predict(venv.normalize_obs(obs), deterministic=True)
    raw, _ = model.predict(obs, deterministic=True)
    assert np.abs(raw - expected).max() > 0.1  # the statistics matter to these actions
    assert np.abs(zoo_actions(module, obs, model.action_space) - expected).max() <= 1e-5
    policy = module.policy()  # what export traces and the registered model serves
    got = np.clip(policy(torch.from_numpy(obs)).numpy(), -2, 2)
    assert np.abs(got - expected).max() <= 1e-5
    if algo == "PPO":  # a fit goes on scaling rewards by the return's statistics
        assert module.hparams.norm_reward and module.return_rms.count.item() == venv.ret_rms.count


def test_vec_normalize_statistics_read_as_data_in_any_protocol(tmp_path):
    from zoo.rl.vec_normalize import read_vec_normalize

    _, _, venv = vec_normalized(tmp_path)
    want = read_vec_normalize(tmp_path / "vec_normalize.pkl")
    assert np.array_equal(want.obs_mean, venv.obs_rms.mean) and np.array_equal(want.obs_var, venv.obs_rms.var)
    assert (want.obs_count, want.clip_obs, want.norm_reward) == (venv.obs_rms.count, 5.0, True)
    trusted = pickle.loads((tmp_path / "vec_normalize.pkl").read_bytes())  # this test's own file
    for protocol in (3, 4, 5):  # 4: what SB3 writes on Python 3.8-3.13, 5 from 3.14
        (tmp_path / "again.pkl").write_bytes(repickled(trusted, protocol))
        got = read_vec_normalize(tmp_path / "again.pkl")
        assert np.array_equal(got.obs_mean, want.obs_mean) and np.array_equal(got.obs_var, want.obs_var)


def repickled(vec_normalize, protocol: int = pickle.DEFAULT_PROTOCOL) -> bytes:
    """An unpickled VecNormalize saved again (its save drops what loading it without an env does not restore)."""
    vec_normalize.venv, vec_normalize.class_attributes, vec_normalize.returns = None, {}, None
    return pickle.dumps(vec_normalize, protocol=protocol)


class _System:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("hostile", ["system", "extra_global", "unknown_field"])
def test_a_hostile_vec_normalize_pkl_is_refused_in_one_line_and_never_run(tmp_path, hostile):
    path, _, _ = vec_normalized(tmp_path)
    marker = tmp_path / "MARKER"
    trusted = pickle.loads((tmp_path / "vec_normalize.pkl").read_bytes())
    if hostile == "system":
        data, named = pickle.dumps(_System(marker)), "system"
    elif hostile == "extra_global":  # a plausible file with one more object inside
        trusted.obs_rms.extra = _Marker(marker)
        data, named = repickled(trusted), "io.open"
    else:
        trusted.obs_scale = 2.0
        data, named = repickled(trusted), "obs_scale"
    (tmp_path / "vec_normalize.pkl").write_bytes(data)
    with pytest.raises(InputError, match=named) as err:
        from_pretrained(path)
    assert "\n" not in str(err.value)
    assert not marker.exists()
    (tmp_path / "vec_normalize.pkl").unlink()
    from_pretrained(path)  # the zip alone loads as it is


def test_the_cli_applies_the_statistics_beside_init_weights_and_refuses_a_config_that_contradicts_them(tmp_path):
    """``init_weights: <zip>`` with ``vec_normalize.pkl`` beside it through ``cli.py``: norm_obs, clip_obs and the
    return's scaling are the statistics', the agent acts as SB3's ``predict`` on normalised observations, and a fit
    goes on updating them from their count (as SB3's VecNormalize with ``training=True``); a clip_obs of the config's
    own that differs is refused in one line. Built from Python without them, it is refused."""
    from conftest import cli

    from zoo.rl import PPOModule

    path, model, venv = vec_normalized(tmp_path)
    ppo = dict(total_env_steps=64, num_steps=16, num_minibatches=2, update_epochs=1)
    gym_data = dict(env_id="Pendulum-v1", num_envs=2, max_episode_steps=20, eval_episodes=1, eval_envs=1)
    model_cfg = {"net": {"class_path": "zoo.rl.ActorCritic"}, "init_weights": str(path), **ppo}
    config = tmp_path / "continue.yaml"
    config.write_text(
        json.dumps(
            {
                "model": {"class_path": "zoo.rl.PPOModule", "init_args": model_cfg},
                "data": {"class_path": "datamodules.GymDataModule", "init_args": gym_data},
                "trainer": {"logger": False, "enable_progress_bar": False, "max_epochs": -1, "num_sanity_val_steps": 0},
            }
        )
    )
    c = cli("validate", "--config", str(config))
    h = c.model.hparams
    assert (h.norm_obs, h.clip_obs, h.norm_reward) == (True, 5.0, True)
    obs = observations(model, 200)
    expected, _ = model.predict(venv.normalize_obs(obs), deterministic=True)
    assert np.abs(zoo_actions(c.model, obs, model.action_space) - expected).max() <= 1e-5
    assert c.model.return_rms.count.item() == venv.ret_rms.count
    c = cli("fit", "--config", str(config))
    assert c.model.obs_rms.count.item() == venv.obs_rms.count + 64
    with pytest.raises(InputError, match=r"norm_obs=False \(theirs: True\)") as err:
        PPOModule(net=c.model.net, init_weights=str(path)).setup("validate")
    assert "\n" not in str(err.value)
    with pytest.raises(InputError) as err:
        cli("validate", "--config", str(config), "--model.init_args.clip_obs=3")
    assert str(err.value) == (
        f"init_weights {str(path)!r} was trained under the VecNormalize statistics beside it, and the config "
        "contradicts them: model.init_args.clip_obs=3.0 (the source's: 5.0). Leave these out of model.init_args "
        "(the statistics set them), or move the statistics file away to start without them"
    )
