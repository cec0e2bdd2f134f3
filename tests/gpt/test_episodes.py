"""Multi-turn episodes (zoo.gpt.tune.episodes): one sequence per episode as the chat template renders it, only the
sampled tokens trained, the KV cache carried across turns equal to a forward from scratch, the bounds, and each
reward kept with its own episode of a group."""

from __future__ import annotations

from functools import partial

import gymnasium as gym
import pytest
import torch

from zoo.errors import InputError
from zoo.gpt import GPT
from zoo.gpt.attention import MHA
from zoo.gpt.tune import episodes as E
from zoo.gpt.tune.rollout import per_token_logps
from zoo.io.chat_template import chat_renderer
from zoo.io.tokenizers import ByteTokenizer

NET = dict(vocab_size=257, block_size=160, n_layer=1, n_embd=32, n_head=2)
ECHO = "zoo-test/Echo-v0"


class EchoEnv(gym.Env):
    """Two turns: say the number you were told, then the one after it (a "tool" turn tells it). Reward per turn:
    1 if the reply holds the number, plus a tenth of the reply's length (so every episode's reward is its own)."""

    def __init__(self, turns: int = 2, never_ends: bool = False) -> None:
        self.turns, self.never_ends, self.steps = turns, never_ends, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.n, self.t = int(self.np_random.integers(10, 99)), 0
        return [{"role": "user", "content": f"Say {self.n}."}], {}

    def step(self, action: str):
        self.steps += 1
        reward = float(str(self.n + self.t) in action) + len(action) / 10
        self.t += 1
        done = self.t >= self.turns and not self.never_ends
        info = {"tool_calls": self.t, "success": done and reward >= 1}  # calls so far: one a turn
        return [{"role": "tool", "content": f"now {self.n + self.t}"}], reward, done, False, info


if ECHO not in gym.registry:
    gym.register(ECHO, entry_point=EchoEnv)


def reward_of(reply: str, target: int) -> float:
    return float(str(target) in reply) + len(reply) / 10


def _replies(e: E.Episode, tok) -> tuple[int, list[str]]:
    """The number an episode's prompt asked for and its replies, read back from its tokens."""
    runs, run = [], []
    for t, p in zip(e.ids, e.policy):
        if p:
            run.append(t)
        elif run:
            runs, run = [*runs, run], []
    runs += [run] if run else []
    n = int(tok.decode(e.ids[: e.policy.index(True)]).split("Say ")[1].split(".")[0])
    return n, [tok.decode(r[:-1] if r[-1] in tok.stop_ids else r) for r in runs]


def _net(**kwargs) -> GPT:
    torch.manual_seed(0)
    return GPT(**(NET | kwargs)).eval()


def _play(net, env, seed=0, tokenizer=None, max_new_tokens=8, temperature=1.0, **bounds):
    scaffold = E.Scaffold(tokenizer or ByteTokenizer())
    return E.play(net, env, seed, scaffold, E.Episodes(**bounds), max_new_tokens, temperature, env_id=ECHO)


def _plain(tokenizer, text: str) -> list[int]:
    """``text``'s ids without the BOS a folder's post-processor adds."""
    hf = getattr(tokenizer, "hf", None)
    return hf.encode(text, add_special_tokens=False).ids if hf is not None else tokenizer.encode(text)


def _scripted(monkeypatch, tokenizer, replies: list[str]):
    """``draw`` replaced by a policy that says ``replies`` in turn, each ended by the first stop id (one episode)."""
    said = iter([t for r in replies for t in _plain(tokenizer, r) + [tokenizer.stop_ids[0]]])

    def draw(logits, *args, **kwargs):
        return [next(said)], [-0.5]

    monkeypatch.setattr(E, "draw", draw)


def _templated(folder, template: str, eos: str):
    import json

    from test_chat import write_tokenizer

    from zoo.io.hf_tokenizer import from_folder

    write_tokenizer(folder)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>", "eos_token": eos}
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": template}))
    return from_folder(folder)


@pytest.mark.parametrize("fmt", ["default", "chatml", "llama3"])
def test_an_episode_is_the_templates_rendering_with_the_sampled_tokens_alone_trained(fmt, monkeypatch, tmp_path):
    if fmt == "default":
        tok = ByteTokenizer()
    else:
        pytest.importorskip("transformers")
        from test_chat import CHATML, LLAMA3

        template, eos = (CHATML, "<|im_end|>") if fmt == "chatml" else (LLAMA3, "<|eot_id|>")
        tok = _templated(tmp_path, template, eos)
    replies = ["It is 42.", "43 then"]
    _scripted(monkeypatch, tok, replies)
    ep = _play(_net(vocab_size=max(257, tok.vocab_size)), EchoEnv(), tokenizer=tok, max_new_tokens=32)
    whole = chat_renderer(tok)(ep.messages[:-1], False)  # the conversation through the last reply
    rest = whole.ids[len(ep.ids) :]  # what the template writes after the last stop token (ChatML's newline)
    assert ep.ids == whole.ids[: len(ep.ids)] and tok.decode(rest).strip() == "" and len(rest) <= 1
    assert ep.turns == 2 and ep.tool_calls == 2 and ep.ended == "terminated"
    sampled = [t for t, p in zip(ep.ids, ep.policy) if p]
    assert sampled == [t for r in replies for t in _plain(tok, r) + [tok.stop_ids[0]]]  # the replies and their stops
    if fmt == "default":  # the template's own mask: the reply and its EOS, nothing else
        assert ep.policy == whole.mask
    assert [ep.ids[e] for e in ep.turn_ends] == [tok.stop_ids[0]] * 2


@pytest.mark.parametrize(
    "net, max_new_tokens",
    [({}, 12), ({"position": "rope", "attention": partial(MHA, n_kv_head=1)}, 3)],  # turns cut by the budget too
    ids=["mha-learned", "mqa-rope"],
)
def test_the_carried_cache_samples_what_a_forward_from_scratch_gives(net, max_new_tokens):
    torch.manual_seed(1)
    net, env = _net(**net), EchoEnv(turns=3)
    eps = [_play(net, env, seed, max_new_tokens=max_new_tokens, temperature=0.7) for seed in range(2)]
    assert all(e.turns == 3 for e in eps)  # several turns, each fed only its new tokens
    r = E.rollout_of(eps)
    with torch.no_grad():
        fresh = per_token_logps(net, r.ids, r.completion_mask, 0.7, r.pad)
    torch.testing.assert_close(fresh, r.logps, atol=2e-5, rtol=1e-4)
    greedy = [_play(net, env, 5, max_new_tokens=max_new_tokens, temperature=0)]
    for e in greedy:  # each greedy token is the argmax of a forward over the whole sequence before it
        with torch.no_grad():
            logits = net(torch.tensor([e.ids[:-1]]))[0]
        picked = logits.argmax(-1).tolist()
        assert all(e.ids[i + 1] == picked[i] for i, p in enumerate(e.policy[1:]) if p)


def test_the_rollout_masks_the_policys_tokens_only_with_their_logps():
    eps = [_play(_net(), EchoEnv(), s, max_new_tokens=6) for s in range(4)]
    r = E.rollout_of(eps)
    for k, e in enumerate(eps):
        n = len(e.ids)
        assert r.ids[k, :n].tolist() == e.ids[: r.ids.shape[1]] and r.ids[k, n:].eq(0).all()
        assert r.completion_mask[k, : n - 1].tolist() == [int(p) for p in e.policy[1:]]
        assert r.completion_mask[k, n - 1 :].eq(0).all() and r.logps[k][r.completion_mask[k] == 0].eq(0).all()
        assert (r.logps[k][r.completion_mask[k] == 1] < 0).all()
    assert r.completion_mask.shape[1] == max(max(i for i, p in enumerate(e.policy) if p) for e in eps)


def test_an_episode_stops_when_the_env_ends_it_or_at_its_bounds():
    env = EchoEnv(turns=1)
    ep = _play(_net(), env, max_new_tokens=6)
    assert env.steps == 1 and ep.turns == 1 and ep.ended == "terminated" and ep.policy[-1]  # nothing after its end
    env = EchoEnv(never_ends=True)
    ep = _play(_net(), env, max_new_tokens=4, max_turns=3)
    assert env.steps == 3 and ep.turns == 3 and ep.ended == "max_turns" and not ep.success
    env = EchoEnv(never_ends=True)
    ep = _play(_net(), env, max_new_tokens=8, max_turns=50, max_tokens=64)
    assert ep.ended == "max_tokens" and len(ep.ids) <= 64 and env.steps == ep.turns
    with pytest.raises(InputError, match="block_size"):
        _play(_net(), EchoEnv(), max_tokens=NET["block_size"] + 1)


def test_each_reward_stays_with_its_episode_and_each_group_with_its_seed():
    eps = E.play_groups(_net(), E.EnvRows(EchoEnv), [3, 5], 2, E.Scaffold(ByteTokenizer()), E.Episodes(), 4, 1.0)
    assert [e.seed for e in eps] == [3, 3, 5, 5]
    for e in eps:
        n = int(e.messages[0]["content"].split()[1].rstrip("."))
        replies = [m["content"] for m in e.messages if m["role"] == "assistant"]
        assert e.turn_rewards == [reward_of(y, n + t) for t, y in enumerate(replies)]
    values, mask = E.turn_steps(eps, E.rollout_of(eps).completion_mask.shape[1])
    for k, e in enumerate(eps):  # each turn's reward at its last sampled token (column end - 1 of the completion)
        assert [bool(mask[k, end - 1]) for end in e.turn_ends] == [True] * e.turns and mask[k].sum() == e.turns
        assert [float(values[k, end - 1]) for end in e.turn_ends] == pytest.approx(e.turn_rewards)


@pytest.mark.parametrize(
    "env_id, why", [("os:system", "module:Env"), ("zoo-test/Nope-v0", "not a registered"), ("CartPole-v1", "text env")]
)
def test_an_env_id_is_a_registered_text_env_or_one_line(env_id, why):
    with pytest.raises(InputError, match=why) as err:
        source = E.EnvSource(env_id)
        _play(_net(), source.make())
    assert "\n" not in str(err.value)


# -- GRPO on episodes ----------------------------------------------------------------------------------------------


def _module(**kwargs):
    from test_grpo import _module as grpo_module

    defaults = dict(group_size=2, max_new_tokens=4, episodes={"max_turns": 2, "max_tokens": 96}, rewards=[])
    module = grpo_module(**(defaults | kwargs))
    module.net = _net(block_size=96).train()
    return module


def _episode_data(**kwargs):
    from datamodules import EpisodeDataModule

    settings = dict(train_seeds=8, val_seeds=2, test_seeds=3, batch_size=2, val_batch_size=2)
    return EpisodeDataModule(ECHO, {"turns": 2}, **(settings | kwargs))


def _spied(monkeypatch, module) -> list[tuple]:
    """``(rollout, rewards, steps)`` of each update: the rewards and turn steps ``GRPOLoss.advantages`` was given."""
    from zoo.gpt.tune.losses import GRPOLoss

    seen, given = [], []
    advantages, update = GRPOLoss.advantages, module.update
    monkeypatch.setattr(
        GRPOLoss, "advantages", lambda self, r, g, steps=None: given.append((r, steps)) or advantages(self, r, g, steps)
    )
    module.update = lambda rollout, *a: seen.append((rollout, *given[-1])) or update(rollout, *a)
    return seen


def test_grpo_trains_on_episodes_and_logs_turns_and_tool_calls(tmp_path, monkeypatch):
    from test_grpo import _trainer

    module, dm = _module(), _episode_data()
    seen = _spied(monkeypatch, module)
    before = [p.detach().clone() for p in module.net.parameters()]
    trainer = _trainer(tmp_path, 2, limit_val_batches=1, val_check_interval=2)
    trainer.fit(module, dm)
    assert seen and any(not torch.equal(a, b) for a, b in zip(before, module.net.parameters()))
    for rollout, rewards, _ in seen:  # each row scored with its own episode's return
        assert rewards.tolist() == pytest.approx([sum(rewards_read_back(rollout, k)) for k in range(len(rewards))])
    metrics = trainer.callback_metrics
    assert float(metrics["train/turns"]) == 2 and float(metrics["train/tool_calls"]) == 2
    assert {"train/episode_length", "train/success", "train/reward", "val/success", "val/accuracy"} <= set(metrics)
    assert float(metrics["train/policy_tokens"]) <= 2 * 4  # two turns of at most max_new_tokens
    assert module.completion_samples and "conversation" in module.completion_samples[0]
    out = trainer.test(module, dm, verbose=False)[0]
    assert {"test/success", "test/turns", "test/tool_calls", "test/reward"} <= set(out)
    assert float(out["test/turns"]) == 2 and 0 <= float(out["test/success"]) <= 1


@pytest.mark.slow  # a fork server's start: ~25 s on a loaded 2-core machine (the single-turn pool's tests pay it too)
def test_actors_play_episodes_the_learner_reads_back_row_by_row():
    from zoo.gpt.tune.async_episodes import AsyncEpisodes, EpisodeSampling

    net, tok, settings = _net(block_size=96), ByteTokenizer(), E.Episodes(max_turns=2, max_tokens=96)
    source = E.EnvSource(ECHO, {"turns": 2})
    sampling = EpisodeSampling(list(range(6)), 2, 2, source, source.spec(), tok, settings, 96, 4, 1.0, None)
    pool = AsyncEpisodes(net, sampling, num_actors=1, num_slots=2, seed=0)
    try:
        episodes, version = pool.take()
    finally:
        pool.close()
    assert version == 0 and len(episodes) == 4 and [e.seed for e in episodes[::2]] == [e.seed for e in episodes[1::2]]
    for e in episodes:  # each row's rewards are its own replies'
        n, replies = _replies(e, tok)
        assert e.turns == 2 and e.turn_rewards == pytest.approx([reward_of(y, n + t) for t, y in enumerate(replies)])
    r = E.rollout_of(episodes)
    with torch.no_grad():
        fresh = per_token_logps(net, r.ids, r.completion_mask, 1.0, r.pad)
    torch.testing.assert_close(fresh, r.logps, atol=2e-5, rtol=1e-4)


@pytest.mark.slow  # cli.py fit then test into MLflow: ~20 s beyond the imports (the tiny fit above is the default's)
def test_the_env_config_fits_and_tests_through_the_cli(tmp_path):
    from conftest import CONFIGS, cli, fit_in_folder

    tiny = dict(n_layer=1, n_embd=32, n_head=2, block_size=96)
    fitted = fit_in_folder(
        tmp_path,
        "--config",
        str(CONFIGS / "gpt" / "grpo_guess_number.yaml"),
        f"--data.init_args.env_id={ECHO}",  # the test's own text env, by its registered id
        "--data.init_args.env_kwargs={}",  # the config's are the guessing game's (its comment says so)
        *(f"--model.init_args.net.init_args.{k}={v}" for k, v in tiny.items()),
        "--model.init_args.group_size=2",
        "--model.init_args.generation.max_new_tokens=4",
        "--model.init_args.episodes.max_turns=2",
        "--data.init_args.batch_size=1",
        "--data.init_args.val_seeds=2",
        "--data.init_args.test_seeds=2",
        "--trainer.max_steps=1",
        "--trainer.val_check_interval=1",
        "--trainer.limit_val_batches=1",
        "--trainer.log_every_n_steps=1",
    )
    assert {"train/turns", "train/tool_calls", "train/episode_length", "val/success"} <= set(
        fitted.trainer.callback_metrics
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        mp.setenv("MLFLOW_TRACKING_URI", fitted.tracking_uri)
        tested = cli("test", "--ckpt_path", str(fitted.last))
    metrics = tested.trainer.callback_metrics
    assert {"test/success", "test/turns", "test/tool_calls"} <= set(metrics) and float(metrics["test/turns"]) == 2


def rewards_read_back(rollout, k: int) -> list[float]:
    """Row ``k``'s turn rewards recomputed from its tokens alone (the prompt's number, the replies)."""
    n = len(rollout.ids[k]) - int((rollout.ids[k].flip(0).cumsum(0) == 0).sum())  # its tokens, unpadded
    policy = [False, *rollout.completion_mask[k].bool().tolist()][:n]
    number, replies = _replies(E.Episode(0, rollout.ids[k, :n].tolist(), policy, []), ByteTokenizer())
    return [reward_of(y, number + t) for t, y in enumerate(replies)]


def test_with_turn_credit_each_turns_reward_is_a_step_and_no_return_is_added(tmp_path, monkeypatch):
    from test_grpo import _trainer

    module = _module(episodes={"max_turns": 2, "max_tokens": 96, "turn_credit": True})
    seen = _spied(monkeypatch, module)
    _trainer(tmp_path, 1).fit(module, _episode_data())
    rollout, outcome, (values_given, mask_given) = seen[0]
    assert outcome.eq(0).all()  # credited through the turns alone
    sampled = torch.nn.functional.pad(rollout.completion_mask.bool(), (0, 1))  # (R, T + 1)
    mask = sampled[:, :-1] & ~sampled[:, 1:]  # each turn's last sampled token: the next one is not sampled
    values = torch.zeros(mask.shape)
    for k in range(len(outcome)):
        assert int(mask[k].sum()) == 2
        values[k, mask[k]] = torch.tensor(rewards_read_back(rollout, k))
    torch.testing.assert_close(mask_given, mask)
    torch.testing.assert_close(values_given, values)


@pytest.mark.slow  # the actor pool's fork server (~25 s on a loaded 2-core machine)
def test_async_episodes_are_corrected_for_their_staleness(tmp_path):
    from test_grpo import _trainer

    module, lags = _module(async_actors=1, async_slots=2), []
    weigh = module.importance_weights
    module.importance_weights = lambda b, v: (lambda out: lags.append(out[2]) or out)(weigh(b, v))
    try:
        _trainer(tmp_path, 3).fit(module, _episode_data())
    finally:
        module.stop_actors()
    staleness = [float(lag["staleness"]) for lag in lags]
    assert staleness[0] == 0 and max(staleness) >= 1  # the slot refilled while the learner updated is one behind
    stale = [lag for lag in lags if float(lag["staleness"]) > 0]
    assert all(float(lag["importance_weight/mean"]) != 1.0 for lag in stale)  # pi_old recomputed, not mu


def test_the_envs_tool_specs_reach_the_template(monkeypatch):
    seen, render = [], chat_renderer(ByteTokenizer())
    monkeypatch.setattr(E, "chat_renderer", lambda tok: lambda m, p=False, **kw: seen.append(kw) or render(m, p))
    env = EchoEnv()
    assert E.scaffold_for(ByteTokenizer(), env).prompt([{"role": "user", "content": "hi"}]) and seen[-1] == {}
    env.tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
    E.scaffold_for(ByteTokenizer(), gym.wrappers.OrderEnforcing(env)).prompt([{"role": "user", "content": "hi"}])
    assert seen[-1] == {"tools": env.tools}  # read through gymnasium's wrappers


def test_a_slot_row_reads_back_the_episode_written_into_it():
    """Each field of each row is that row's episode's (rows of a group differ: their rewards most of all)."""
    from zoo.gpt.tune.async_episodes import EpisodeSampling, read_row, write_row

    source = E.EnvSource(ECHO, {"turns": 2})
    sampling = EpisodeSampling([0], 1, 2, source, None, ByteTokenizer(), E.Episodes(max_turns=2), 12, 4, 1.0, None)
    slot = {name: torch.zeros((1, *shape), dtype=dtype) for name, (shape, dtype) in sampling.slot_spec().items()}
    rows = [
        E.Episode(7, [1, 2, 3, 4], [False, True, True, False], [0.0, -0.5, -0.25, 0.0], [2], [0.25], 0, False),
        E.Episode(7, [5, 6, 7, 8, 9], [False, True, False, True, True], [0.0, -1.0, 0.0, -2.0, -3.0], [1, 4],
                  [1.5, -0.75], 2, True),
    ]  # fmt: skip
    for r, e in enumerate(rows):
        write_row(slot, 0, r, e)
    for r, e in enumerate(rows):
        got = read_row({name: value[0] for name, value in slot.items()}, r)
        fields = ("seed", "ids", "policy", "logps", "turn_ends", "turn_rewards", "tool_calls", "success")
        assert [getattr(got, f) for f in fields] == [getattr(e, f) for f in fields]
