"""Speculative decoding is exact: greedy output is plain greedy output token for token, sampled output keeps the
target's filtered distribution (computed here with transformers' own logits warpers), and the caches roll back to
what a plain decode of the kept tokens holds."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from zoo.errors import InputError
from zoo.gpt import GPT, MLA, RMSNorm, generate
from zoo.gpt.generate import LayerCache, make_cache, window_pad
from zoo.gpt.speculative import (
    GPTDraft,
    MTPDraft,
    Picker,
    Speculation,
    accepted_sampled,
    speculative_generate,
)

V = 97
TARGETS = {"mha": dict(), "mla": dict(attention=partial(MLA, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                                                          v_head_dim=8), position="rope", norm=RMSNorm)}  # fmt: skip


def net(seed: int, vocab: int = V, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(**{**dict(vocab_size=vocab, block_size=48, n_layer=2, n_embd=32, n_head=4), **kw}).double().eval()


def prompts_of(*lengths: int, vocab: int = V) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab, (n,), generator=g) for n in lengths]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("draft", ["unrelated", "itself"])
def test_greedy_output_is_plain_greedy_output_token_for_token(target, draft):
    t = net(0, **TARGETS[target])
    d = t if draft == "itself" else net(1, n_layer=1, n_embd=16, n_head=2)
    prompts = prompts_of(3, 9, 5)  # left-padded in one batch
    plain = generate(t, prompts, 25, temperature=0)
    out, stats = speculative_generate(t, d, prompts, 25, 4, temperature=0)
    assert [o.tolist() for o in out] == [p.tolist() for p in plain]
    if draft == "itself":  # every proposal accepted: k + 1 tokens per target forward
        assert stats.acceptance_rate == 1.0 and stats.tokens_per_forward == 5.0 and stats.forwards == 5
    else:
        assert stats.acceptance_rate < 0.5 and stats.proposed > 0  # an unrelated draft is mostly rejected
    # EOS: a token the second row emits stops it there, as in generate; the other rows go on
    eos = int(plain[1][6])
    plain = generate(t, prompts, 24, temperature=0, stop_ids=(eos,))
    out, _ = speculative_generate(t, d, prompts, 24, 4, temperature=0, stop_ids=(eos,))
    assert [o.tolist() for o in out] == [p.tolist() for p in plain] and len(out[1]) <= 6
    # any of several stop ids ends a row (Llama 3 lists three): the third row's 3rd token too
    stops = (eos, int(plain[2][2]))
    out, _ = speculative_generate(t, d, prompts, 24, 4, temperature=0, stop_ids=stops)
    assert [o.tolist() for o in out] == [p.tolist() for p in generate(t, prompts, 24, temperature=0, stop_ids=stops)]
    assert len(out[2]) <= 2


@pytest.mark.parametrize("target", TARGETS)
def test_greedy_near_and_past_block_size_is_plain_greedy(target):
    t = net(0, block_size=16, **TARGETS[target])
    d = net(1, block_size=12, n_layer=1, n_embd=16, n_head=2)  # a draft with less room than the target
    prompts = prompts_of(3, 11)
    plain = generate(t, prompts, 30, temperature=0)
    for draft in (d, t):
        out, stats = speculative_generate(t, draft, prompts, 30, 3, temperature=0)
        assert [o.tolist() for o in out] == [p.tolist() for p in plain]
        assert stats.tokens == 30


def test_the_caches_after_each_round_equal_a_plain_decode_of_the_kept_tokens():
    t, d = net(0, **TARGETS["mla"]), net(1)
    draft = GPTDraft(d)
    run = Speculation(t, draft, prompts_of(4, 7), 20, 4, Picker(0.0, None, None, None))
    rejected = 0
    while not run.finished:
        run.step()
        rejected += run.stats.proposed > run.stats.accepted
        for model, cache, filled in ((t, run.cache, run.filled), (d, draft.cache, draft.filled)):
            assert filled == run.pos - 1 or model is d  # the target's cache holds all but the last committed token
            fresh = make_cache(model, 2, cache[0].a.shape[2], torch.float64)
            model(run.tokens[:, :filled], fresh, 0, run.pad)
            for layer, plain in zip(cache, fresh):
                torch.testing.assert_close(layer.a, plain.a, rtol=0, atol=1e-10)  # zero past `filled` in both
    assert rejected, "the test needs rejected proposals"


def varied(seed: int, **kw) -> GPT:
    """A target whose greedy continuation changes token to token: an untied head, so the last token's own embedding
    does not win the argmax (a tied random net repeats one token for long runs, which hides an off-by-one)."""
    return net(seed, tie_embeddings=False, **kw)


@pytest.mark.parametrize("target", TARGETS)
def test_greedy_output_is_plain_greedy_output_when_it_varies_and_the_draft_disagrees_sometimes(target):
    t = varied(0, **TARGETS[target])
    d = copy.deepcopy(t)
    torch.manual_seed(3)
    with torch.no_grad():  # the target nudged: it proposes the target's token often, not always
        for p in d.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    prompts = prompts_of(3, 9, 5)
    plain = generate(t, prompts, 25, temperature=0)
    assert all(sum(a != b for a, b in zip(p[:-1], p[1:])) >= 12 for p in plain), "the fixture must vary"
    for k in (1, 2, 3, 5):
        out, stats = speculative_generate(t, d, prompts, 25, k, temperature=0)
        assert [o.tolist() for o in out] == [p.tolist() for p in plain], f"num_draft_tokens={k}"
        assert 0 < stats.accepted < stats.proposed, f"num_draft_tokens={k}: the draft must disagree sometimes"


def test_a_draft_of_another_vocabulary_is_refused_in_one_line():
    with pytest.raises(InputError, match="vocab_size 50 differs from the target's 97"):
        speculative_generate(net(0), net(1, vocab=50), prompts_of(3), 4, temperature=0)


# -- sampling ------------------------------------------------------------------------------------------------------

SMALL_V, N = 8, 10000
FILTERS = dict(temperature=0.8, top_k=6, top_p=0.95)


def spread(seed: int, scale: float, **kw) -> GPT:
    t = net(seed, vocab=SMALL_V, **kw).float()
    with torch.no_grad():  # a spread-out next-token distribution, so the filters and the draft matter
        t.lm_head.weight.mul_(scale)
    return t


def transformers_probs(logits: torch.Tensor) -> torch.Tensor:
    """The target's filtered distribution as transformers' generate computes it (its warpers, in its order)."""
    scores = logits.double()[None]
    for warp in (TemperatureLogitsWarper(0.8), TopKLogitsWarper(6), TopPLogitsWarper(0.95)):
        scores = warp(None, scores)
    return scores.softmax(-1)[0]


def exact_pairs(t: GPT, prompt: torch.Tensor) -> torch.Tensor:
    """P(first two tokens = (i, j)) under the target, (V, V)."""
    with torch.no_grad():
        first = transformers_probs(t(prompt[None])[0, -1])
        seqs = torch.cat((prompt.expand(SMALL_V, -1), torch.arange(SMALL_V)[:, None]), 1)
        second = torch.stack([transformers_probs(row) for row in t(seqs)[:, -1]])
    return first[:, None] * second


@pytest.mark.parametrize("draft", ["unrelated", "itself"])
def test_sampled_pairs_follow_the_target_distribution(draft):
    t = spread(0, 2.0)
    d = t if draft == "itself" else spread(5, 2.0, n_layer=1)
    prompt = torch.tensor([3, 1, 4, 1, 5])
    exact = exact_pairs(t, prompt).flatten()
    g = torch.Generator().manual_seed(0)
    # k = 2 proposes one token in the first round (two are asked) and one more when it is accepted: every path
    # (rejection, a row emitting its own accepted draft past the batch's least, the bonus token) is taken.
    out, stats = speculative_generate(t, d, [prompt] * N, 2, 2, **FILTERS, generator=g)
    pairs = torch.stack(out)
    freq = torch.bincount(pairs[:, 0] * SMALL_V + pairs[:, 1], minlength=SMALL_V**2).double() / N
    bound = 5 * (exact * (1 - exact) / N).sqrt() + 1e-3
    assert ((freq - exact).abs() <= bound).all(), f"worst cell off by {(freq - exact).abs().max():.4f}"
    assert (freq[exact == 0] == 0).all()
    tv = 0.5 * (freq - exact).abs().sum()
    assert tv < 0.05
    if draft == "unrelated":
        with torch.no_grad():  # the draft alone would be far off: the test sees a draft whose tokens are kept
            q = transformers_probs(d(prompt[None])[0, -1])
        assert 0.5 * (q - exact.view(SMALL_V, SMALL_V).sum(1)).abs().sum() > 0.2
        # Among 10000 rows one always rejects: the batch keeps no draft token; rows that accepted theirs emit it.
        assert stats.accepted == 0 < stats.proposed
    else:
        assert stats.acceptance_rate == 1.0


def test_each_row_emits_the_target_distribution_position_by_position():
    """accepted_sampled alone, on fixed distributions p and q over many independent rows: the first token a row
    emits is distributed as p_1, the second (where the round reaches it) as p_2, and so on to the bonus token."""
    torch.manual_seed(0)
    b, k, v = 200000, 3, 5
    p = torch.softmax(torch.randn(k + 1, v) * 2, -1).double()
    q = torch.softmax(torch.randn(k, v) * 2, -1).double()
    pick = Picker(1.0, None, None, torch.Generator().manual_seed(1))
    drafts = torch.multinomial(q, b, replacement=True, generator=pick.generator).T  # (B, k)
    n, nxt = accepted_sampled(drafts, p.expand(b, -1, -1), q.expand(b, -1, -1), pick)
    emitted = torch.cat((drafts, torch.zeros(b, 1, dtype=torch.long)), 1)
    emitted[torch.arange(b), n] = nxt  # row r emits drafts[:n], then nxt
    for i in range(k + 1):
        reached = n >= i  # position i is emitted by this round
        freq = torch.bincount(emitted[reached, i], minlength=v).double() / reached.sum()
        bound = 5 * (p[i] * (1 - p[i]) / reached.sum()).sqrt() + 1e-3
        assert ((freq - p[i]).abs() <= bound).all(), f"position {i}: {freq.tolist()} vs {p[i].tolist()}"
    assert 0 < (n == k).sum() < b and (n == 0).sum() > 0  # both rejections and full acceptance happened


def test_a_draft_module_with_another_tokenizer_is_refused_in_one_line(tmp_path):
    from zoo.gpt import CausalLMModule
    from zoo.io.tokenizers import ByteTokenizer, CharTokenizer

    target, draft = CausalLMModule(net(0, vocab=257)), CausalLMModule(net(1, vocab=257))
    target.tokenizer, draft.tokenizer = ByteTokenizer(), CharTokenizer([chr(i) for i in range(256)])
    with pytest.raises(InputError, match="another tokenizer than the model's"):
        target.generate(["ab"], 3, temperature=0, draft=draft)
    draft.tokenizer = ByteTokenizer()
    assert target.generate(["ab"], 5, temperature=0, draft=draft) == target.generate(["ab"], 5, temperature=0)
    assert target.last_speculation.proposed > 0


# -- the target's own multi-token-prediction module as the draft ---------------------------------------------------


def mtp_target(kind: str, **kw) -> GPT:
    t = net(0, mtp_depth=1, **{**TARGETS[kind], **kw})
    with torch.no_grad():  # the module's block is initialised near the identity: spread it, so its guesses vary
        for p in t.mtp.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return t


@pytest.mark.parametrize("target", TARGETS)
def test_mtp_self_speculation_is_plain_greedy_and_drafts_what_the_module_predicts(target):
    t = mtp_target(target)
    prompts = prompts_of(3, 9, 5)
    plain = generate(t, prompts, 25, temperature=0)
    draft = MTPDraft(t)
    proposals = []
    propose = draft.propose

    def recorded(tokens, pos, k, pick):
        # The proposals as the module makes them from scratch, no caches: d_1 from the target's h^0 over every
        # verified slot; then its own output state standing in for the target's at the next slot, and so on.
        pad = window_pad(run.pad, 0)
        with torch.no_grad():
            _, hs = t(tokens[:, : pos - 1], pad=pad, return_hidden=True)
            ids, expected = tokens[:, 1:pos], []
            for _ in range(k):
                logits, h = t.mtp_forward(hs, ids, 1, pad=pad)
                expected.append(logits[:, -1].argmax(-1))
                hs, ids = torch.cat((hs, h[:, -1:]), 1), torch.cat((ids, expected[-1][:, None]), 1)
        out = propose(tokens, pos, k, pick)
        proposals.append((out[0], torch.stack(expected, 1)))
        return out

    draft.propose = recorded
    run = Speculation(t, draft, prompts, 25, 4, Picker(0.0, None, None, None))
    while not run.finished:
        run.step()
        if run.pos <= t.block_size:  # the module's cache holds the true entries of the verified slots
            fresh = LayerCache(3, draft.cache.a.shape[2], t.mtp[0].block.attn.cache_layout(), "cpu", torch.float64)
            with torch.no_grad():
                _, h = t(run.tokens[:, : draft.filled], pad=window_pad(run.pad, 0), return_hidden=True)
                t.mtp_forward(h, run.tokens[:, 1 : draft.filled + 1], 1, fresh, 0, window_pad(run.pad, 0))
            torch.testing.assert_close(draft.cache.a[:, :, : draft.filled], fresh.a[:, :, : draft.filled])
    assert [o.tolist() for o in run.outputs()] == [p.tolist() for p in plain]
    assert len(proposals) > 3 and all(torch.equal(a, b) for a, b in proposals)
    assert run.stats.proposed > 0
    out, stats = speculative_generate(t, MTPDraft(t), prompts_of(4, 11), 40, 3, temperature=0)  # past block_size
    assert [o.tolist() for o in out] == [p.tolist() for p in generate(t, prompts_of(4, 11), 40, temperature=0)]


def test_a_module_that_guesses_right_gets_every_proposal_accepted():
    # Blocks whose residual branches write nothing: the target predicts from the last token alone, norm(emb(t)), and
    # a module that passes the next token's embedding through (eh_proj = [I | 0]) predicts the same from it.
    t = net(0, mtp_depth=1, position="rope", norm=RMSNorm)
    with torch.no_grad():
        for block in t.all_blocks():
            for p in (block.attn.proj.weight, *block.mlp.residual_projections()):
                p.zero_()
        d = t.n_embd
        t.mtp[0].eh_proj.weight.copy_(torch.cat((torch.eye(d), torch.zeros(d, d)), 1))
    prompts = prompts_of(3, 9, 5)
    out, stats = speculative_generate(t, MTPDraft(t), prompts, 25, 4, temperature=0)
    assert [o.tolist() for o in out] == [p.tolist() for p in generate(t, prompts, 25, temperature=0)]
    # the prefill proposes nothing; then the module's recursion (its own state for the target's) is right k times
    assert stats.acceptance_rate == 1.0 and stats.forwards == 1 + 24 // 5 + 1 and stats.proposed > 0


def test_mtp_self_speculation_sampled_pairs_follow_the_target_distribution():
    t = spread(0, 2.0, mtp_depth=1)
    prompt = torch.tensor([3, 1, 4, 1, 5])
    exact = exact_pairs(t, prompt).flatten()
    g = torch.Generator().manual_seed(0)
    # 3 new tokens: the first round is the prefill (nothing to draft from yet), the second drafts with the module.
    out, stats = speculative_generate(t, MTPDraft(t), [prompt] * 4000, 3, 2, **FILTERS, generator=g)
    pairs = torch.stack(out)[:, :2]
    freq = torch.bincount(pairs[:, 0] * SMALL_V + pairs[:, 1], minlength=SMALL_V**2).double() / 4000
    bound = 5 * (exact * (1 - exact) / 4000).sqrt() + 2e-3
    assert ((freq - exact).abs() <= bound).all(), f"worst cell off by {(freq - exact).abs().max():.4f}"
    assert stats.proposed > 0


def test_mtp_draft_needs_mtp_modules():
    with pytest.raises(InputError, match="mtp_depth"):
        MTPDraft(net(0))
