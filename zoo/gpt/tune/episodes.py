"""Multi-turn episodes of a GPT with a text environment: one token sequence per episode, the policy's tokens masked in.

A text environment is a ``gymnasium.Env`` whose observations are chat messages to append (a list of
``{"role": "user" | "tool" | "system", "content": str}``) and whose action is the assistant's reply as text: it runs
its tools itself and says, in ``info``, how many ``tool_calls`` it made so far and at the end whether it was a
``success`` (``zoo.gpt.tune.envs.base`` states the contract). An episode, as TRL's multi-turn GRPO and verl's agent
loop run one:

  1. reset(seed): the first messages, rendered with the model's chat template and its generation prompt;
  2. sample the assistant's turn until a stop id (the template's end of turn, EOS) or the turn's token budget;
  3. step the env with the decoded reply; its reward is the turn's;
  4. unless it terminated or truncated, append the template's scaffolding (the end of turn the policy did not
     sample, the observation's messages, the next generation prompt) and go to 2, up to ``max_turns`` turns and
     ``max_tokens`` tokens in all (an observation that does not fit ends the episode, truncated).

The KV cache is carried across turns: each forward feeds only the tokens the cache has not seen (the last sampled
token and the scaffolding), so an episode costs one pass over its tokens, and its log-probabilities are those of a
forward over the whole sequence from scratch (tested). The episode is ONE sequence: the sampled tokens exactly as
sampled (never the re-encoding of their decoded text, which a BPE or an invalid UTF-8 byte would change), the rest
as the template renders it; only the sampled tokens are trained on (``policy``). The scaffolding is what the
template renders after the reply: ``render(..., reply, observation, generation prompt)`` less
``render(..., reply)``, plus the reply's end of turn (the template's rendering of an empty reply less its prompt),
less the stop token the policy sampled. A template that renders earlier turns otherwise once later ones follow
(Qwen3's reasoning) has no such one sequence and is refused.

A step's R episodes are played together (``play_all``; ``zoo.gpt.tune.episode_cache`` keeps their caches as rows
of the serving engine's slot caches, each row its own positions): one forward per sampled token over the rows
still sampling their turn, a row whose turn ended waiting while the others finish theirs; then their envs step at
once (one env per episode, ``EnvRows``, on ``Episodes.env_threads`` threads: ``zoo.gpt.tune.env_steps``) and each
row's scaffolding is fed in one forward, until every episode has ended.
Greedy episodes are token for token those played alone; each episode samples with its own generator, so a seeded
step repeats its episodes and an episode's draws do not depend on what is played beside it.

``rollout_of`` lays the episodes out as GRPO's ``Rollout``: each row the whole sequence from column 0, padded on
the right (nothing attends to later padding), its first token the one no position predicts; ``completion_mask``
and ``logps`` cover columns 1.. with 1 and the sampling log-probability on the policy's tokens alone.

Notation: R episodes (B env seeds times G), L tokens of the longest episode, M turns.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from zoo.errors import InputError
from zoo.gpt.generate import evaluating, filter_logits
from zoo.gpt.gpt import GPT
from zoo.gpt.tune.env_steps import EnvSteps
from zoo.gpt.tune.episode_cache import EpisodeCache
from zoo.gpt.tune.rollout import Rollout
from zoo.io.chat_template import chat_renderer
from zoo.io.tokenizers import EOS_TOKEN

OBSERVATION_ROLES = ("system", "user", "tool")
CHARS_PER_TOKEN = 16  # an observation of more characters than this times the episode's room cannot fit: not rendered


@dataclass(frozen=True)
class Episodes:
    """How long an episode may run (``GRPOModule(episodes=...)``); the env comes from the data.

    Args:
        max_turns: assistant turns at most; an episode still running then is truncated.
        max_tokens: tokens of the whole episode at most (prompt, replies, observations); None: the net's
            block_size, which it must fit, as the update's forward pass cannot slide.
        turn_credit: credit each turn with the group-normalised rewards of the turns from it on (process
            supervision's "later" credit, each env step's reward a step) instead of every token with its episode's
            group-relative return.
        env_threads: threads that step the envs of the episodes whose turn ended together, so envs that wait (a
            tool's round trip) wait at once (``zoo.gpt.tune.env_steps``; the same episodes either way); 1: one after
            another on the calling thread, for tools that share state no two threads may touch at once.
    """

    max_turns: int = 8
    max_tokens: int | None = None
    turn_credit: bool = False
    env_threads: int = 32

    def __post_init__(self) -> None:
        if self.max_turns < 1 or (self.max_tokens is not None and self.max_tokens < 2):
            raise InputError(
                f"episodes.max_turns is 1 or more and episodes.max_tokens 2 or more (or null): got "
                f"{self.max_turns}, {self.max_tokens}"
            )
        if isinstance(self.env_threads, bool) or not isinstance(self.env_threads, int) or self.env_threads < 1:
            raise InputError(
                f"episodes.env_threads is a whole number, 1 or more (1: no threads): got {self.env_threads!r}"
            )

    @classmethod
    def of(cls, value: Episodes | dict) -> Episodes:
        return value if isinstance(value, cls) else cls(**value)

    def bound(self, net: GPT) -> int:
        if self.max_tokens is not None and self.max_tokens > net.block_size:
            raise InputError(
                f"episodes.max_tokens={self.max_tokens} exceeds the net's block_size {net.block_size}: an episode "
                f"is trained as one sequence, so give at most {net.block_size}"
            )
        return self.max_tokens or net.block_size


# -- the environment: a registered id only -------------------------------------------------------------------------


@dataclass  # not frozen: Lightning's batch transfer rebuilds the dataclasses a batch holds
class EnvSource:
    """A text environment named by its registered gymnasium id, with keyword arguments for ``gymnasium.make``.

    The id is looked up in gymnasium's registry, never imported: ``module:Env-v0`` (which gymnasium would import) is
    refused, so a config or a stored checkpoint names no code. The zoo's own text envs register on import of
    ``zoo.gpt.tune.envs``. ``tools`` (the user's functions, ``zoo.gpt.tune.envs.tools``) come from their own config
    only: a stored config's are dropped (``zoo.io.build.USER_CODE_NAMES``).
    """

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    tools: list[str] | None = None  # the user's functions it runs too, by dotted path (zoo.gpt.tune.envs.tools)

    def __post_init__(self) -> None:
        if not isinstance(self.env_id, str) or ":" in self.env_id:
            raise InputError(
                f"env_id {self.env_id!r} must be a registered gymnasium id (as zoo/GuessNumber-v0), not module:Env: "
                "an id never imports code; register your env with gymnasium.register in your own code"
            )

    def spec(self):
        """The registered ``EnvSpec`` (picklable: an actor process makes its env from it); one line if unknown."""
        import gymnasium as gym

        with contextlib.suppress(ModuleNotFoundError):
            importlib.import_module("zoo.gpt.tune.envs")  # the zoo's text envs, where they are installed
        if self.env_id not in gym.registry:
            known = sorted(k for k in gym.registry if k.startswith("zoo/"))
            raise InputError(
                f"env_id {self.env_id!r} is not a registered gymnasium id: use one of {', '.join(known) or 'none'} "
                "or register yours with gymnasium.register"
            )
        return gym.spec(self.env_id)

    def make(self, spec=None):
        import gymnasium as gym

        # Text observations are no gymnasium space, so its passive checker has nothing to check.
        env = gym.make(spec or self.spec(), disable_env_checker=True, **self.kwargs)
        if self.tools:
            from zoo.gpt.tune.envs.tools import with_tools

            env = with_tools(env, self.tools)
        return env


def observation_messages(obs: object, env_id: str) -> list[dict]:
    """``obs`` when it is a list of messages an environment may add; else one line naming the env."""
    ok = isinstance(obs, list) and all(
        isinstance(m, dict) and m.get("role") in OBSERVATION_ROLES and isinstance(m.get("content"), str) for m in obs
    )
    if not ok:
        raise InputError(
            f"env {env_id!r} is not a text env: its observation {str(obs)[:80]!r} is not a list of messages "
            f"{{'role': one of {', '.join(OBSERVATION_ROLES)}, 'content': str}}"
        )
    return obs


# -- the chat template's scaffolding around the sampled replies -------------------------------------------------


class Scaffold:
    """The token ids a chat template puts around the policy's replies: the first prompt, and what follows a reply;
    ``tools``: the env's JSON tool specs (``env.unwrapped.tools``); ``tool_syntax``: how the template writes a call,
    which every env it plays reads its calls in (``zoo.io.chat_template.tool_call_syntax``)."""

    def __init__(self, tokenizer, tools: list[dict] | None = None, tool_syntax: str = "hermes") -> None:
        self.tokenizer, self.renderer, self.tool_syntax = tokenizer, chat_renderer(tokenizer), tool_syntax
        self.templated = getattr(tokenizer, "chat_template", None) is not None
        self.tools = {"tools": tools} if tools else {}  # the env's tool specs, rendered as the template renders them

    def render(self, messages: list[dict], prompt: bool):
        return self.renderer(messages, prompt, **self.tools)

    def prompt(self, messages: list[dict]) -> list[int]:
        return self.render(messages, True).ids

    def encode(self, text: str) -> list[int]:
        """Template text as ids: an imported tokenizer reads its special tokens in it; the default format's EOS is
        the EOS id, which has no text."""
        if self.templated:
            return self.tokenizer.hf.encode(text, add_special_tokens=False).ids
        out: list[int] = []
        for k, piece in enumerate(text.split(EOS_TOKEN)):
            out += ([self.tokenizer.eos_id] if k else []) + (self.tokenizer.encode(piece) if piece else [])
        return out

    def after(self, messages: list[dict], reply: str, observation: list[dict], stop: int | None) -> list[int]:
        """The ids after a reply to ``messages`` (its text ``reply``, ended by the sampled stop id ``stop`` or by the
        budget) up to the next generation prompt with ``observation`` in between."""
        before = self.render(messages, True).text
        replied = [*messages, {"role": "assistant", "content": reply}]
        through = self.render(replied, False).text
        after = self.render([*replied, *observation], True).text
        end = self.render([*messages, {"role": "assistant", "content": ""}], False).text
        if not (through.startswith(before) and end.startswith(before) and through.endswith(end[len(before) :])):
            raise InputError(
                "the chat_template's rendering of a reply does not begin with its generation prompt and end with its "
                "end of turn, so an episode's sampled tokens have no place in it: use a template whose replies "
                "continue its prompt"
            )
        if not after.startswith(through):
            raise InputError(
                "the chat_template renders earlier turns otherwise once later ones follow (it rewrites them), so an "
                "episode is not one sequence: use a template that renders each turn as the whole (TRL's training "
                "template for it)"
            )
        ids = self.encode(end[len(before) :] + after[len(through) :])
        return ids[1:] if stop is not None and ids and ids[0] == stop else ids


# -- one episode -------------------------------------------------------------------------------------------------


@dataclass
class Episode:
    """One episode's sequence and bookkeeping. ``ids`` the whole conversation as tokens, ``policy`` which ones the
    policy sampled, ``logps`` their log-probabilities when sampled (0 elsewhere), ``turn_ends`` the index of each
    turn's last sampled token, ``turn_rewards`` each turn's env reward, ``messages`` the conversation as text."""

    seed: int
    ids: list[int]
    policy: list[bool]
    logps: list[float]
    turn_ends: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    tool_calls: int = 0
    success: bool = False
    ended: str = ""  # terminated, truncated (by the env), max_turns, max_tokens
    messages: list[dict] = field(default_factory=list)

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards))

    @property
    def turns(self) -> int:
        return len(self.turn_ends)

    def add(self, ids: Sequence[int], policy: bool, logps: Sequence[float] | None = None) -> None:
        self.ids += ids
        self.policy += [policy] * len(ids)
        self.logps += list(logps) if logps is not None else [0.0] * len(ids)


class EnvRows:
    """One env per episode played together, made by ``make`` as a step needs more, kept across steps (each episode
    resets its own with its seed); ``first`` reads the env's tools."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make, self.made = make, []

    def rows(self, n: int) -> list:
        while len(self.made) < n:
            self.made.append(self.make())
        return self.made[:n]

    @property
    def first(self):
        return self.rows(1)[0]

    def close(self) -> None:
        for env in self.made:
            env.close()
        self.made = []


def draw(
    logits: Tensor, temperature: float, top_p: float | None, generators: Sequence[torch.Generator]
) -> tuple[list[int], list[float]]:
    """The next token of each row from its logits (n, V) and its sampling log-probability: the argmax and 0 when
    greedy (``temperature`` 0); else drawn with the row's own generator, as ``sample_next_logp`` draws one row."""
    if temperature <= 0:
        return logits.argmax(dim=-1).tolist(), [0.0] * len(logits)
    filtered = filter_logits(logits.float() / temperature, None, top_p)  # (n, V)
    probs, logps = filtered.softmax(dim=-1), filtered.log_softmax(dim=-1)
    tokens = [int(torch.multinomial(probs[i : i + 1], 1, generator=g)) for i, g in enumerate(generators)]
    return tokens, logps.gather(-1, torch.tensor(tokens, device=logps.device)[:, None])[:, 0].tolist()


def sampling_generators(n: int, device: torch.device, generator: torch.Generator | None = None) -> list:
    """One generator per episode, seeded from ``generator`` (None: torch's global one): a seeded run repeats its
    episodes, each one whatever is played beside it."""
    seeds = torch.randint(2**62, (n,), generator=generator).tolist()
    return [torch.Generator(device).manual_seed(s) for s in seeds]


@torch.inference_mode()
def play_all(
    net: GPT,
    envs: Sequence,
    seeds: Sequence[int],
    scaffold: Scaffold,
    episodes: Episodes,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float | None = None,
    generators: Sequence[torch.Generator] | None = None,
    env_id: str = "",
) -> list[Episode]:
    """Episode k of ``envs[k]`` from ``seeds[k]``, all played together (module docstring; ``episode_cache``): one
    forward per sampled token over the episodes still sampling their turn, the net in eval mode. ``generators``:
    each episode's sampler (None: ``sampling_generators`` where ``temperature`` > 0)."""
    bound, stop_ids, r = episodes.bound(net), tuple(scaffold.tokenizer.stop_ids), len(seeds)
    eps, talks, infos = [], [], [{} for _ in range(r)]
    for env, seed in zip(envs, seeds, strict=True):
        if hasattr(env.unwrapped, "tool_syntax"):  # each row's env, not only the one the scaffold was read from
            env.unwrapped.tool_syntax = scaffold.tool_syntax
        obs, _ = env.reset(seed=seed)
        messages = list(observation_messages(obs, env_id))
        first = scaffold.prompt(messages)
        if len(first) >= bound:
            raise InputError(
                f"env {env_id!r}'s first prompt (seed {seed}) has {len(first)} tokens, leaving no room in "
                f"episodes.max_tokens / block_size {bound}: give a larger bound"
            )
        eps.append(Episode(seed, [], [], [], messages=messages))
        eps[-1].add(first, False)
        talks.append(messages)  # the conversation the next scaffolding follows
    with evaluating(net), EnvSteps(episodes.env_threads) as steps:
        cache = EpisodeCache(net, r, bound)
        if generators is None:  # greedy episodes draw nothing, so the global generator is left as it was
            generators = sampling_generators(r, cache.device) if temperature > 0 else [None] * r
        live, logits = list(range(r)), cache.start([ep.ids for ep in eps])  # (R, V), rows in cache.who's order
        while live:
            replies = {e: ([], []) for e in live}
            budget = {e: min(max_new_tokens, bound - len(eps[e].ids)) for e in live}
            n = len(live)
            while n:
                rows = cache.who[:n]
                tokens, logps = draw(logits, temperature, top_p, [generators[e] for e in rows])
                for e, token, logp in zip(rows, tokens, logps):
                    replies[e][0].append(token)
                    replies[e][1].append(logp)
                for i in reversed(range(n)):  # a row whose turn ended leaves rows 0..n-1 for the last one's place
                    out = replies[rows[i]][0]
                    if out[-1] in stop_ids or len(out) == budget[rows[i]]:
                        n -= 1
                        cache.swap(i, n)
                if n:
                    logits = cache.step([replies[e][0][-1] for e in cache.who[:n]])
            texts = [reply_taken(eps[e], *replies[e], scaffold) for e in live]  # (text, stop) of each reply
            answers = steps.step([envs[e] for e in live], [text for text, _ in texts])  # the envs at once
            for e, (text, stop), answer in zip(live, texts, answers):
                infos[e] = turn_taken(eps[e], talks[e], text, stop, answer, scaffold, episodes, bound, env_id)
                talks[e] = eps[e].messages
            live = [e for e in live if not eps[e].ended]
            if live:  # the scaffolding to every next turn, in one forward: (n, V)
                logits = cache.feed(live, [eps[e].ids for e in live])
    for ep, info in zip(eps, infos):
        ep.success = bool(info.get("success", False))
    return eps


def reply_taken(ep: Episode, reply: list[int], logps: list[float], scaffold: Scaffold) -> tuple[str, int | None]:
    """The sampled ``reply`` added to ``ep``: its text for the env, and the stop id that ended it (None: the
    budget did)."""
    ep.add(reply, True, logps)
    ep.turn_ends.append(len(ep.ids) - 1)
    stop = reply[-1] if reply[-1] in scaffold.tokenizer.stop_ids else None
    return scaffold.tokenizer.decode(reply[:-1] if stop is not None else reply), stop


def turn_taken(
    ep: Episode,
    messages: list[dict],
    text: str,
    stop: int | None,
    answer: tuple,
    scaffold: Scaffold,
    episodes: Episodes,
    bound: int,
    env_id: str,
) -> dict:
    """The env's ``answer`` (``step``'s five values) to the reply ``text`` to ``messages`` taken into ``ep``, and
    the scaffolding to the next turn added unless the episode ends here; the env's info."""
    before = messages + [{"role": "assistant", "content": text}]
    obs, reward, terminated, truncated, info = answer
    ep.turn_rewards.append(float(reward))
    ep.tool_calls = int(info.get("tool_calls", 0) or 0)  # the calls so far (the text envs' contract)
    obs = observation_messages(obs, env_id)
    ep.messages = before + obs
    if terminated or truncated:
        ep.ended = "terminated" if terminated else "truncated"
        if info.get("failure"):  # a tool that failed ended it: the reason, for the sample table
            ep.ended += f": {str(info['failure'])[:200]}"
        return info
    if ep.turns == episodes.max_turns:
        ep.ended = "max_turns"
        return info
    room = bound - len(ep.ids)
    if sum(len(m["content"]) for m in obs) > CHARS_PER_TOKEN * room:
        ep.ended = "max_tokens"
        return info
    after = scaffold.after(messages, text, obs, stop)
    if len(after) >= room:  # the next turn needs one token of room at least
        ep.ended = "max_tokens"
        return info
    ep.add(after, False)
    return info


def play(
    net: GPT,
    env,
    seed: int,
    scaffold: Scaffold,
    episodes: Episodes,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    env_id: str = "",
) -> Episode:
    """One episode of ``env`` from ``seed``, sampled with ``generator`` (None: torch's global one)."""
    generators = None if generator is None else [generator]
    args = (max_new_tokens, temperature, top_p, generators, env_id)
    return play_all(net, [env], [seed], scaffold, episodes, *args)[0]


def play_groups(
    net: GPT,
    envs: EnvRows,
    seeds: Sequence[int],
    group_size: int,
    scaffold: Scaffold,
    episodes: Episodes,
    max_new_tokens: int,
    temperature: float,
    top_p: float | None = None,
    env_id: str = "",
) -> list[Episode]:
    """``group_size`` episodes of each seed played together, rows grouped by seed (row r plays seed r // G), as
    ``sample_groups``."""
    rows = [seed for seed in seeds for _ in range(group_size)]
    args = (max_new_tokens, temperature, top_p, None, env_id)
    return play_all(net, envs.rows(len(rows)), rows, scaffold, episodes, *args)


# -- episodes as GRPO's batch ------------------------------------------------------------------------------------


def rollout_of(episodes: Sequence[Episode], device: torch.device | str = "cpu") -> Rollout:
    """The episodes as one ``Rollout`` (module docstring): ids (R, L) from column 0, right-padded with 0, no left
    padding; ``completion_mask`` and ``logps`` (R, L - 1) over columns 1.., cut after the last policy token."""
    width = max(max(i for i, p in enumerate(e.policy) if p) for e in episodes) + 1  # L
    r = len(episodes)
    ids = torch.zeros(r, width, dtype=torch.long)
    mask, logps = torch.zeros(r, width - 1, dtype=torch.long), torch.zeros(r, width - 1)
    for k, e in enumerate(episodes):
        n = min(len(e.ids), width)
        ids[k, :n] = torch.tensor(e.ids[:n])
        mask[k, : n - 1] = torch.tensor(e.policy[1:n], dtype=torch.long)
        logps[k, : n - 1] = torch.tensor(e.logps[1:n]) * mask[k, : n - 1]
    out = (ids, torch.zeros(r, dtype=torch.long), mask, logps)
    return Rollout(*(x.to(device) for x in out))


def turn_steps(episodes: Sequence[Episode], length: int) -> tuple[Tensor, Tensor]:
    """Each turn's reward (R, L - 1) at its last sampled token's column of the completion, and a mask (R, L - 1) of
    those columns: process supervision's steps (``process_advantages``), one per turn."""
    values, mask = torch.zeros(len(episodes), length), torch.zeros(len(episodes), length, dtype=torch.bool)
    for k, e in enumerate(episodes):
        for end, reward in zip(e.turn_ends, e.turn_rewards):
            values[k, end - 1] += reward
            mask[k, end - 1] = True
    return values, mask


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Means over the episodes: reward (their return), success, turns, tool calls, tokens and the policy's share."""
    n = len(episodes)
    mean = lambda f: sum(map(f, episodes)) / n  # noqa: E731
    return {
        "reward": mean(lambda e: e.reward),
        "success": mean(lambda e: float(e.success)),
        "turns": mean(lambda e: e.turns),
        "tool_calls": mean(lambda e: e.tool_calls),
        "episode_length": mean(lambda e: len(e.ids)),
        "policy_tokens": mean(lambda e: sum(e.policy)),
        "truncated": mean(lambda e: float(e.ended not in ("terminated",))),
    }


def transcript(episode: Episode) -> str:
    """The conversation as lines ``role: content``, for a sample table."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in episode.messages)


SampleRow = Callable[[Episode], dict]


def sample_row(episode: Episode) -> dict:
    """One row of the sample-episode table (``callbacks.LogCompletions``)."""
    return {
        "seed": episode.seed,
        "conversation": transcript(episode),
        "turns": episode.turns,
        "tool_calls": episode.tool_calls,
        "reward": episode.reward,
        "success": episode.success,
        "ended": episode.ended,
    }


def scaffold_for(tokenizer, env) -> Scaffold:
    """The scaffolding of ``env``'s conversations: the tokenizer's template with the env's tools, if it has any; the
    envs it plays read the calls in the syntax the template writes them (``tool_call_syntax``: Llama 3's bare
    JSON)."""
    syntax = "hermes"
    if hasattr(env.unwrapped, "tool_syntax"):
        from zoo.io.chat_template import tool_call_syntax

        syntax = env.unwrapped.tool_syntax = tool_call_syntax(tokenizer)
    return Scaffold(tokenizer, getattr(env.unwrapped, "tools", None), syntax)
