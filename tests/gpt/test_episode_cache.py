"""Episodes played together (zoo.gpt.tune.episode_cache): each the episode a tiny reference loop plays alone with
its own cache (greedy: token for token; sampled: the same draws from its own seed), for several envs and attention
layouts; each forward advances only the rows still sampling their turn."""

from __future__ import annotations

import random
from functools import partial

import pytest
import torch
from torch import Tensor

from zoo.errors import InputError
from zoo.gpt import GPT, MHA, MLA, MoE, RMSNorm, SwiGLU
from zoo.gpt.attention import LongRoPE
from zoo.gpt.generate import make_cache
from zoo.gpt.tune import episodes as E
from zoo.gpt.tune.episode_cache import EpisodeCache
from zoo.gpt.tune.rollout import per_token_logps
from zoo.io.tokenizers import ByteTokenizer

NETS = {
    "mha": dict(),  # learned positions
    "gqa": dict(attention=partial(MHA, n_kv_head=1), position="rope", norm=RMSNorm, mlp=SwiGLU, bias=False),
    "mla": dict(attention=partial(MLA, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)),
    "window": dict(position="rope", sliding_window=24, layer_types=["sliding_attention", "full_attention"]),
    "moe": dict(mlp=partial(MoE, n_routed_experts=4, num_experts_per_tok=2), position="rope", bias=False),
}
GUESS, CALC, LAKE = "zoo/GuessNumber-v0", "zoo/Calculator-v0", "zoo/FrozenLakeText-v0"


def tiny(kind: str, block_size: int = 300) -> GPT:
    torch.manual_seed(0)
    net = GPT(vocab_size=257, block_size=block_size, n_layer=2, n_embd=32, n_head=4, **NETS[kind])
    with torch.no_grad():  # large random weights: varied continuations, far from ties
        for p in net.parameters():
            p.normal_(0, 0.4)
    return net.eval()


def alone(net, env, seed, scaffold, episodes, max_new, temperature, generator) -> E.Episode:
    """The reference: one episode with its own cache, fed only the tokens it has not seen, turn after turn."""
    bound, stops = episodes.bound(net), scaffold.tokenizer.stop_ids
    obs, _ = env.reset(seed=seed)
    ep, messages = E.Episode(seed, [], [], [], messages=obs), obs
    ep.add(scaffold.prompt(obs), False)
    cache, fed = make_cache(net, 1, bound), 0
    while not ep.ended:
        reply, logps, budget = [], [], min(max_new, bound - len(ep.ids))
        while not reply or (reply[-1] not in stops and len(reply) < budget):
            ids = ep.ids + reply
            logits = net(torch.tensor([ids[fed:]]), cache, fed)[:, -1]  # (1, V)
            fed = len(ids)
            (token,), (logp,) = E.draw(logits, temperature, None, [generator])
            reply, logps = [*reply, token], [*logps, logp]
        text, stop = E.reply_taken(ep, reply, logps, scaffold)
        info = E.turn_taken(ep, messages, text, stop, env.step(text), scaffold, episodes, bound, "")
        messages = ep.messages
    ep.success = bool(info.get("success", False))
    return ep


def recorded(monkeypatch, scripts: dict[int, list], seen: dict[int, list]) -> None:
    """``draw`` keeps each row's logits in ``seen[id(generator)]`` and says ``scripts[id(generator)]`` first (None: the
    net's own token), then its own: turns of unequal lengths, a tool call a random net would not make."""
    real = getattr(E.draw, "real", E.draw)  # not an earlier call's recorder

    def draw(logits, temperature, top_p, generators):
        tokens, logps = real(logits, temperature, top_p, generators)
        for i, g in enumerate(generators):
            seen.setdefault(id(g), []).append(logits[i].clone())
            said = scripts[id(g)].pop(0) if scripts.get(id(g)) else None
            if said is not None:
                tokens[i] = said
                logps[i] = float((logits[i] / temperature).log_softmax(-1)[said]) if temperature > 0 else 0.0
        return tokens, logps

    draw.real = real
    monkeypatch.setattr(E, "draw", draw)


def stops(k: int) -> list:
    """Row k's turns: 0 to 9 of the net's own tokens then a stop (the budget may come first), drawn from k: rows end
    their turns in a different order each turn."""
    rng = random.Random(k)
    return [x for _ in range(12) for x in [None] * rng.randrange(10) + [256]]


def tool_call(k: int) -> list[int]:
    expression = "+".join(["7"] * (k + 1))  # results of unequal lengths
    call = f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'
    return [*call.encode(), 256]


def both(monkeypatch, net, env_id, seeds, episodes, max_new, temperature=0.0, script=stops):
    """The episodes played together, and each alone, from the same sampling seeds; each row's logits at every draw,
    together and alone."""
    source = E.EnvSource(env_id, {"max_turns": 10} if env_id != LAKE else {})
    scaffold = E.scaffold_for(ByteTokenizer(), source.make())
    together = [torch.Generator().manual_seed(100 + k) for k in range(len(seeds))]
    apart = [torch.Generator().manual_seed(100 + k) for k in range(len(seeds))]
    seen: dict[int, list] = {}
    recorded(monkeypatch, {id(g): script(k) for gs in (together, apart) for k, g in enumerate(gs)}, seen)
    envs = E.EnvRows(source.make).rows(len(seeds))
    args = (scaffold, episodes, max_new, temperature)
    got = E.play_all(net, envs, seeds, *args, generators=together)
    with torch.inference_mode():
        want = [alone(net, source.make(), s, *args, g) for s, g in zip(seeds, apart)]
    for a, b in zip(together, apart):
        torch.testing.assert_close(torch.stack(seen[id(a)]), torch.stack(seen[id(b)]), atol=1e-4, rtol=1e-4)
    same(got, want)
    return got


def same(got: list[E.Episode], want: list[E.Episode]) -> None:
    for a, b in zip(got, want, strict=True):
        assert (a.seed, a.ids, a.policy, a.turn_ends) == (b.seed, b.ids, b.policy, b.turn_ends)
        assert (a.turn_rewards, a.tool_calls, a.success, a.ended, a.messages) == (
            b.turn_rewards,
            b.tool_calls,
            b.success,
            b.ended,
            b.messages,
        )
        assert a.logps == pytest.approx(b.logps, abs=1e-4)


KINDS = [*NETS][:-1] + [pytest.param("moe", marks=pytest.mark.slow)]  # MoE: 5 s; the engine's tests batch it


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_episodes_played_together_are_those_played_alone(kind, monkeypatch):
    got = both(monkeypatch, tiny(kind), GUESS, [0, 0, 1, 2], E.Episodes(max_turns=3), 8)
    assert len({tuple(len(t) for t in turns(e)) for e in got}) == 4 and {e.ended for e in got} == {"max_turns"}


def turns(e: E.Episode) -> list[list[int]]:
    """Each turn's sampled tokens."""
    out, run = [], []
    for t, p in zip(e.ids, e.policy):
        if p:
            run.append(t)
        elif run:
            out, run = [*out, run], []
    return out + ([run] if run else [])


def test_calculator_tool_calls_and_the_lake_play_together_as_alone(monkeypatch):
    net = tiny("gqa")
    got = both(monkeypatch, net, CALC, [0, 1, 2, 3], E.Episodes(max_turns=3), 80, script=tool_call)
    assert [e.tool_calls for e in got] == [1, 1, 1, 1] and all(e.turns >= 2 for e in got)
    assert len({len(e.ids) for e in got}) == 4  # tool results of unequal lengths
    both(monkeypatch, net, LAKE, [0, 1, 2], E.Episodes(max_turns=5, max_tokens=260), 10)


def test_the_bounds_truncate_rows_at_different_turns_as_alone_each_forward_advancing_the_rows_sampling(monkeypatch):
    fed, step, feed = [], EpisodeCache.step, EpisodeCache.feed
    monkeypatch.setattr(EpisodeCache, "step", lambda self, tokens: fed.append(len(tokens)) or step(self, tokens))
    live = []
    monkeypatch.setattr(EpisodeCache, "feed", lambda self, eps, seqs: live.append(len(eps)) or feed(self, eps, seqs))
    got = both(monkeypatch, tiny("mha"), GUESS, [0, 1, 2, 3], E.Episodes(max_turns=8, max_tokens=200), 24)
    assert {e.ended for e in got} == {"max_tokens"} and [e.turns for e in got] == [2, 2, 3, 2]
    assert all(len(e.ids) <= 200 for e in got)
    assert sum(fed) == sum(len(t) - 1 for e in got for t in turns(e))  # a turn's last token is never fed in it
    assert live == [1, 4, 1]  # the first prompt (one for all: the game's is the same), each later turn's to those left


def test_sampled_episodes_draw_from_their_own_seeds_and_score_as_a_fresh_forward(monkeypatch):
    net = tiny("gqa")
    got = both(monkeypatch, net, GUESS, [0, 0, 0, 1], E.Episodes(max_turns=3), 10, temperature=0.8)
    assert len({tuple(e.ids) for e in got[:3]}) == 3  # one seed, three episodes
    r = E.rollout_of(got)
    with torch.no_grad():
        fresh = per_token_logps(net, r.ids, r.completion_mask, 0.8, r.pad)
    torch.testing.assert_close(fresh, r.logps, atol=2e-5, rtol=1e-4)
    monkeypatch.undo()
    played = []
    for _ in range(2):  # seeded from torch's global generator: a seeded run repeats its episodes
        torch.manual_seed(3)
        envs = E.EnvRows(E.EnvSource(GUESS).make)
        played.append(E.play_groups(net, envs, [0], 3, E.Scaffold(ByteTokenizer()), E.Episodes(3), 10, 0.8))
    assert [e.ids for e in played[0]] == [e.ids for e in played[1]]


def test_rows_that_wait_move_and_step_past_the_last_slot_see_what_a_forward_from_scratch_sees():
    net, g = tiny("gqa", block_size=48), torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 257, (n,), generator=g).tolist() for n in (40, 12, 25, 30)]

    def fresh(e: int) -> Tensor:
        return net(torch.tensor([seqs[e]]))[0, -1]

    with torch.inference_mode():
        cache = EpisodeCache(net, 4, 48)
        logits = cache.feed([0, 1, 2, 3], seqs)  # every row ends at slot 40
        for i, e in enumerate(cache.who):
            torch.testing.assert_close(logits[i], fresh(e), atol=1e-4, rtol=1e-4)
        cache.swap(cache.row[0], 3)  # the longest waits; row 3 sits out too
        cache.swap(cache.row[3], 2)
        for _ in range(9):  # past slot 48: the two rows move left by their smallest padding
            stepping = cache.who[:2]
            token = [int(x) for x in torch.randint(0, 257, (2,), generator=g)]
            for e, t in zip(stepping, token):
                seqs[e].append(t)
            logits = cache.step(token)
            for i, e in enumerate(stepping):
                torch.testing.assert_close(logits[i], fresh(e), atol=1e-4, rtol=1e-4)
        assert cache.s < 40  # the waiting row's sequence now ends after theirs
        for e, n in ((0, 5), (3, 2), (1, 1)):  # scaffolding of unequal lengths; episode 2 ended
            seqs[e] += torch.randint(0, 257, (n,), generator=g).tolist()
        logits = cache.feed([3, 0, 1], [seqs[3], seqs[0], seqs[1]])
        assert sorted(cache.who[:3]) == [0, 1, 3]
        for i, e in enumerate(cache.who[:3]):
            torch.testing.assert_close(logits[i], fresh(e), atol=1e-4, rtol=1e-4)


def test_a_first_prompt_computed_once_serves_its_twins_rows():
    net, g = tiny("gqa", block_size=48), torch.Generator().manual_seed(0)
    a, b, c = (torch.randint(0, 257, (n,), generator=g).tolist() for n in (5, 9, 7))
    seqs = [list(x) for x in (a, b, a, b, c)]
    with torch.inference_mode():
        cache = EpisodeCache(net, 5, 48)
        logits = cache.start(seqs)
        for _ in range(3):  # then each row its own tokens, its twin's prompt in its cache
            for i, e in enumerate(cache.who):
                torch.testing.assert_close(logits[i], net(torch.tensor([seqs[e]]))[0, -1], atol=1e-4, rtol=1e-4)
            token = [int(x) for x in torch.randint(0, 257, (5,), generator=g)]
            for e, t in zip(cache.who, token):
                seqs[e].append(t)
            logits = cache.step(token)


def test_a_longrope_net_plays_together_only_within_its_original_context():
    rope = LongRoPE(short_factor=[1.0] * 4, long_factor=[2.0] * 4, original_max_position_embeddings=8)
    net = GPT(vocab_size=257, block_size=16, n_layer=1, n_embd=32, n_head=4, position="rope", rope_scaling=rope)
    with pytest.raises(InputError, match="max_tokens at most 8") as err:
        EpisodeCache(net, 2, 16)
    assert "\n" not in str(err.value)
    seqs = [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10]]
    with torch.inference_mode():
        logits = EpisodeCache(net, 2, 8).feed([0, 1], seqs)
        torch.testing.assert_close(logits, torch.stack([net(torch.tensor([s]))[0, -1] for s in seqs]))


def test_greedy_episodes_leave_the_global_generator_as_it_was():
    net, envs, scaffold = tiny("mha"), E.EnvRows(E.EnvSource(GUESS).make), E.Scaffold(ByteTokenizer())
    before = torch.random.get_rng_state()
    E.play_groups(net, envs, [0, 1], 1, scaffold, E.Episodes(2), 4, 0.0)
    assert torch.equal(torch.random.get_rng_state(), before)  # validation between steps changes no training draw
