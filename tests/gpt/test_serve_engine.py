"""The batched decoding engine: requests that join and leave a running batch at token boundaries get the tokens
``generate`` decodes for each alone (greedy: identical; seeded sampling: the same draws), whatever runs beside them;
stop ids, cancellation, the queue bound and bad input."""

from __future__ import annotations

import threading
from functools import partial

import pytest
import torch

from zoo.errors import InputError
from zoo.gpt import GPT, MHA, MLA, MoE, RMSNorm, SwiGLU, generate
from zoo.gpt.attention import LongRoPE
from zoo.gpt.serve.engine import Engine, QueueFull, SamplingParams

V = 61
NETS = {
    "mha": dict(),  # learned positions
    "gqa": dict(attention=partial(MHA, n_kv_head=2), position="rope", norm=RMSNorm, mlp=SwiGLU, bias=False),
    "mla": dict(attention=partial(MLA, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)),
    "window": dict(position="rope", sliding_window=5, layer_types=["sliding_attention", "full_attention"]),
    "moe": dict(mlp=partial(MoE, n_routed_experts=4, num_experts_per_tok=2), position="rope", bias=False),
}
# Eight requests of unequal prompts and lengths; the last fills the 28-slot context before its max_new_tokens.
PROMPT_LENGTHS = [1, 7, 3, 12, 5, 9, 2, 20]
MAX_NEW = [6, 3, 8, 4, 7, 2, 5, 10]


def tiny(kind: str, block_size: int = 28) -> GPT:
    torch.manual_seed(0)
    net = GPT(vocab_size=V, block_size=block_size, n_layer=2, n_embd=32, n_head=4, **NETS[kind])
    with torch.no_grad():  # large random weights: varied continuations, far from ties
        for p in net.parameters():
            p.normal_(0, 0.4)
    return net.eval()


def prompts(lengths: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, V, (n,), generator=g).tolist() for n in lengths]


def alone(net: GPT, prompt: list[int], max_new: int, **kw) -> list[int]:
    return generate(net, [torch.tensor(prompt)], max_new, temperature=0, **kw)[0].tolist()


def drive(engine: Engine, jobs: list, joins: list[int]) -> list:
    """Submit ``joins[k]`` of the jobs before step k (the rest at once after), then step until every one finished."""
    todo, requests = list(jobs), []
    for k in range(500):
        for _ in range(joins[k] if k < len(joins) else len(todo)):
            requests.append(engine.submit(*todo.pop(0)))
        if not engine.step() and not todo:
            break
    assert all(r.done for r in requests) and engine.running == 0
    return requests


@pytest.mark.parametrize("kind", NETS)
def test_greedy_requests_joining_a_running_batch_decode_as_generate_alone(kind):
    net = tiny(kind)
    jobs = [(p, SamplingParams(m, temperature=0)) for p, m in zip(prompts(PROMPT_LENGTHS), MAX_NEW)]
    engine = Engine(net, max_batch=3)  # rows leave and are taken while others run
    requests = drive(engine, jobs, joins=[2, 0, 1, 0, 0, 3, 0, 1])
    for (prompt, params), r in zip(jobs, requests):
        want = alone(net, prompt, params.max_new_tokens)[: net.block_size - len(prompt)]
        assert r.tokens == want and list(r) == want, (prompt, r.tokens, want)
        assert r.finish_reason == "length"


def test_longer_prompts_joining_and_a_sequence_filling_the_context_decode_as_generate_alone():
    # Prompts join a batch at a lower slot (every row moves right: by one, then by eleven), a sequence fills the
    # context while others run, leavers' rows are taken by the last ones (every row then moves left).
    net = tiny("gqa", block_size=24)
    ps = prompts([2, 4, 16, 1, 6, 3])
    new = (21, 6, 8, 20, 5, 17)
    jobs = [(p, SamplingParams(n, temperature=0)) for p, n in zip(ps, new)]
    requests = drive(Engine(net, max_batch=4), jobs, joins=[1, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1])
    for (prompt, params), r in zip(jobs, requests):
        assert r.tokens == alone(net, prompt, params.max_new_tokens), prompt


def test_concurrent_clients_on_the_engine_thread_get_generates_tokens():
    net = tiny("mla")
    jobs = [(p, SamplingParams(m, temperature=0)) for p, m in zip(prompts(PROMPT_LENGTHS[:7]), MAX_NEW)]
    got: dict[int, list[int]] = {}

    def client(i: int) -> None:
        got[i] = list(engine.submit(*jobs[i]))

    with Engine(net, max_batch=4) as engine:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert got == {i: alone(net, p, s.max_new_tokens) for i, (p, s) in enumerate(jobs)}


def test_a_seeded_request_draws_the_same_tokens_whatever_runs_beside_it():
    net = tiny("gqa")
    ps = prompts([4, 9, 2, 6])
    params = SamplingParams(12, temperature=0.9, top_p=0.8, top_k=20, repetition_penalty=1.3, seed=7)
    (first,) = drive(Engine(net), [(ps[0], params)], joins=[1])
    others = [(p, SamplingParams(10, temperature=1.0, seed=i)) for i, p in enumerate(ps[1:])]
    crowded = drive(Engine(net, max_batch=4), [others[0], others[1], (ps[0], params), others[2]], [2, 0, 0, 2])
    want = generate(
        net,
        [torch.tensor(ps[0])],
        12,
        temperature=0.9,
        top_k=20,
        top_p=0.8,
        generator=torch.Generator().manual_seed(7),
        repetition_penalty=1.3,
    )[0].tolist()
    assert first.tokens == crowded[2].tokens == want
    assert len({tuple(r.tokens) for r in crowded}) == 4  # each row its own draws
    greedy = SamplingParams(12, temperature=0, repetition_penalty=1.3)
    (penalized,) = drive(Engine(net), [(ps[1], greedy)], joins=[1])
    assert penalized.tokens == alone(net, ps[1], 12, repetition_penalty=1.3) != alone(net, ps[1], 12)


def test_a_stop_id_ends_its_sequence_unyielded_and_its_row_goes_to_the_next_request():
    net = tiny("mha")
    ps = prompts([5, 3, 8])
    full = alone(net, ps[0], 12)
    stop, unused = full[4], next(i for i in range(V) if i not in full)
    jobs = [(ps[0], SamplingParams(12, temperature=0, stop_ids=(unused, stop)))]
    jobs += [(p, SamplingParams(9, temperature=0)) for p in ps[1:]]
    stopped, *rest = drive(Engine(net, max_batch=2), jobs, joins=[3])
    assert stopped.tokens == full[: full.index(stop)] and stopped.finish_reason == "stop"
    assert [r.tokens for r in rest] == [alone(net, p, 9) for p in ps[1:]]
    assert [r.finish_reason for r in rest] == ["length", "length"]


def test_a_cancelled_request_frees_its_row_at_the_next_token_boundary():
    net = tiny("mla")
    ps = prompts([6, 4, 3])
    engine = Engine(net, max_batch=1)
    a, b = (engine.submit(p, SamplingParams(20, temperature=0)) for p in ps[:2])
    queued = engine.submit(ps[2], SamplingParams(5, temperature=0))
    queued.cancel()
    engine.step()
    engine.step()
    assert len(a.tokens) == 3 and engine.running == 1 and not b.tokens  # joined (1 token), then 2 steps
    a.cancel()
    engine.step()
    assert a.finish_reason == "cancelled" and list(a) == a.tokens and len(a.tokens) == 3 and len(b.tokens) == 2
    assert list(a) == []  # read once: a second iteration ends at once
    while engine.step():
        pass
    assert b.tokens == alone(net, ps[1], 20) and queued.finish_reason == "cancelled" and not queued.tokens


def test_a_request_whose_draw_fails_ends_alone_with_an_error(monkeypatch):
    import zoo.gpt.serve.engine as engine_module

    net = tiny("mha")
    ps = prompts([4, 6, 3])
    broken = SamplingParams(5, temperature=1e-45)  # logits / temperature overflow: no distribution to draw from
    calls = []

    def fourth_draw_fails(*args, **kwargs):  # the sampled request's second token, drawn in a batched step
        calls.append(1)
        if len(calls) == 3:  # the broken join drew 1, its own join 2 (a greedy row takes the batch's argmax)
            raise RuntimeError("no distribution")
        return sample_next(*args, **kwargs)

    sample_next = engine_module.sample_next
    monkeypatch.setattr(engine_module, "sample_next", fourth_draw_fails)
    jobs = [(ps[0], broken), (ps[1], SamplingParams(5, temperature=0)), (ps[2], SamplingParams(5, seed=1))]
    at_join, good, mid_sequence = drive(Engine(net), jobs, joins=[3])
    assert at_join.finish_reason == mid_sequence.finish_reason == "error" and len(mid_sequence.tokens) == 1
    assert good.tokens == alone(net, ps[1], 5) and good.finish_reason == "length"
    with pytest.raises(RuntimeError, match="engine failed"):
        list(mid_sequence)


def test_a_prompt_whose_prefill_fails_ends_alone_and_the_others_joining_with_it_run():
    net = tiny("mha")
    forward = net.forward

    def fails_on_the_poisoned_prompt(idx, *args, **kwargs):
        if idx.shape[1] > 1 and bool((idx == V - 1).any()):
            raise RuntimeError("no prefill")
        return forward(idx, *args, **kwargs)

    net.forward = fails_on_the_poisoned_prompt
    jobs = [
        ([1, 2, 3], SamplingParams(4, temperature=0)),
        ([V - 1, 5], SamplingParams(4)),
        ([7, 8], SamplingParams(3, temperature=0)),
    ]
    good, poisoned, other = drive(Engine(net), jobs, joins=[3])  # the three join at one boundary
    assert poisoned.finish_reason == "error" and poisoned.tokens == []
    assert good.tokens == alone(net, [1, 2, 3], 4) and other.tokens == alone(net, [7, 8], 3)


def test_closing_ends_every_request_and_the_queue_is_bounded():
    net = tiny("mha")
    engine = Engine(net, max_batch=1, max_queue=2)
    running = engine.submit([1, 2], SamplingParams(25, temperature=0))
    engine.submit([3], SamplingParams(5))
    with pytest.raises(QueueFull, match="max_queue=2"):
        engine.submit([4], SamplingParams(5))
    engine.start()
    next(iter(running))
    engine.close()
    assert running.finish_reason in ("cancelled", "length") and running.done
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit([1], SamplingParams(1))


def test_closing_puts_back_each_modules_train_or_eval_mode():
    net = tiny("mha").train()
    net.blocks[0].eval()  # a mix: each module's own flag comes back
    modes = [m.training for m in net.modules()]
    with Engine(net) as engine:
        assert not any(m.training for m in net.modules())  # decoding: dropout off
        assert list(engine.submit([1, 2], SamplingParams(3, temperature=0))) == alone(net, [1, 2], 3)
    assert [m.training for m in net.modules()] == modes


def test_a_listener_gets_the_tokens_drawn_before_it_came_then_the_rest_then_none():
    net = tiny("gqa")
    engine = Engine(net)
    request = engine.submit([3, 4, 5], SamplingParams(4, temperature=0))
    engine.step()  # its first token, drawn before anyone listens
    got = []
    request.listen(got.append)
    while engine.step():
        pass
    assert got == [*alone(net, [3, 4, 5], 4), None] and request.finish_reason == "length"


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda e: e.submit([], SamplingParams(3)), "non-empty"),
        (lambda e: e.submit([V], SamplingParams(3)), r"in \[0, 61\)"),
        (lambda e: e.submit(list(range(27)) + [0], SamplingParams(3)), "shorten it to at most 27"),
        (lambda e: SamplingParams(0), "max_new_tokens=0"),
        (lambda e: SamplingParams(3, top_p=0.0), "top_p"),
        (lambda e: SamplingParams(3, temperature=-1), "temperature"),
        (lambda e: Engine(e.net, context=29), "context=29"),
        (lambda e: Engine(e.net, max_batch=0), "max_batch=0"),
        (lambda e: Engine(e.net, max_batch=10**9), "lower max_batch or context"),
    ],
)
def test_bad_requests_and_settings_are_refused_in_one_line(make, match):
    with pytest.raises(InputError, match=match):
        make(Engine(tiny("mha"), max_batch=1))


def test_a_longrope_net_is_refused():
    rope = LongRoPE(short_factor=[1.0] * 4, long_factor=[2.0] * 4, original_max_position_embeddings=8)
    net = GPT(vocab_size=V, block_size=16, n_layer=1, n_embd=32, n_head=4, position="rope", rope_scaling=rope)
    with pytest.raises(InputError, match="LongRoPE"):
        Engine(net)


def test_the_benchmarks_arms_decode_the_same_tokens():
    from bench.serve_engine import run_engine, run_sequential

    net, ps = tiny("gqa"), prompts([3, 8, 5])
    base, batched = run_sequential(net, ps, 4), run_engine(net, ps, 4, concurrency=2)
    assert batched.outputs == base.outputs and batched.tokens == base.tokens == 12 and all(batched.ttft)
