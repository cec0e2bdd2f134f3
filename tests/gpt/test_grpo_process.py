"""Process supervision in GRPO: step rewards (WorkedLines), their guard, where a step's score lands among the tokens,
and the per-token advantages (DeepSeekMath section 4.1.3) against a loop written from the paper's words."""

from __future__ import annotations

import random

import pytest
import torch

from zoo.errors import InputError
from zoo.gpt import GPT, GRPOModule
from zoo.gpt.generate import Generation
from zoo.gpt.tune.losses import GRPOLoss
from zoo.gpt.tune.rewards import ExactMatch, StepReward, WorkedLines, score_steps
from zoo.gpt.tune.rollout import Rollout, place_steps
from zoo.io.tokenizers import ByteTokenizer
from zoo.train.optim import AdamWCosine
from zoo.train.policy_gradient import clipped_surrogate, group_advantages, process_advantages

REFERENCE = "6-4 = 2\n2+6 = 8\n8*3-7 = 17\n#### 17"  # a worked reply: the answer the prompts carry


@pytest.mark.parametrize(
    "text, scores",
    [
        ("6-4 = 2\n2+6 = 8\n8*3-7 = 17\n#### 17", [1, 1, 1]),
        ("6-4 = 3\n3+6 = 9\n9*3-7 = 20\n#### 20", [0, 1, 1]),  # a slip, then its result carried right
        ("6-4 = 2\n2+6 = 9\n9*3-7 = 21\n#### 21", [1, 0, 0]),  # the last line: wrong arithmetic
        ("1+1 = 2\n2+2 = 4\n4*4-4 = 12\n#### 12", [0, 0, 0]),  # true, of the wrong numbers: the hack
        ("6-4 = 2\n\nso 8\n2+6 = 8\n#### 8\n1+1 = 2", [1, 0, 0]),  # prose a wrong step, nothing after ####
        ("6-4 = 2\n2+6 = 8\n8*3-7 = 17\n17+1 = 18\n#### 18", [1, 1, 1, 0]),  # a line the reference lacks
        ("6-4 = 2\n2-6 = -4\n8*3-7 = 17\n#### 17", [1, 0, 1]),
    ],
)
def test_worked_lines_score_each_line_by_its_arithmetic_on_the_references_numbers(text, scores):
    steps = WorkedLines().steps(text, REFERENCE)
    assert [v for _, v in steps] == scores
    lines = [line for line in text.split("\n####")[0].split("\n") if line]
    assert [text[:end].splitlines()[-1] for end, _ in steps] == lines
    assert WorkedLines().score_one(text, REFERENCE) == pytest.approx(sum(scores) / len(scores))
    assert all(v == 0 for _, v in WorkedLines().steps(text, "17"))  # no worked reference: no step is right


def test_worked_lines_read_a_negative_first_operand():
    reference = "-4+2 = -2\n-2*3+10 = 4\n#### 4"  # a result below zero, carried as the next line's first operand
    assert [v for _, v in WorkedLines().steps(reference, reference)] == [1, 1]
    assert [v for _, v in WorkedLines().steps("4+2 = 6\n6*3+10 = 28\n#### 28", reference)] == [0, 1]  # sign lost
    assert [v for _, v in WorkedLines().steps("-4+2 = 2\n2*3+10 = 16\n#### 16", reference)] == [0, 1]  # -4+2 is -2


def test_worked_lines_read_any_text_as_data_and_never_fail():
    rng = random.Random(0)
    alphabet = "0123456789+-*= \n#x()._'\"" + "9" * 10
    hostile = ["__import__('os').system('x') = 0", "9" * 5000 + "+1 = 1", "1+" * 500 + "1 = 501", "=\n=\n", "1e9+1 = 1"]
    texts = hostile + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(2000)]
    for text in texts:
        for answer in (REFERENCE, text):
            steps = WorkedLines().steps(text, answer)
            ends = [end for end, _ in steps]
            assert ends == sorted(set(ends)) and all(0 < e <= len(text) for e in ends), text
            assert all(v in (0.0, 1.0) for _, v in steps)
    long = "1+" * 500 + "1 = 501\n"
    assert [v for _, v in WorkedLines().steps(long, long)] == [1.0]


class Bad(StepReward):
    def __init__(self, out) -> None:
        super().__init__()
        self.out = out

    def steps(self, completion: str, answer: str):
        if isinstance(self.out, Exception):
            raise self.out
        return self.out


@pytest.mark.parametrize(
    "out, why",
    [
        (KeyError("boom"), "raised KeyError"),
        ([(3, float("nan"))], "not (end, finite score)"),
        ([(3, 1.0), (2, 1.0)], "rising ends"),
        ([(99, 1.0)], "inside the completion"),
        ([(0, 1.0)], "inside the completion"),
        ([("x", 1.0)], "raised ValueError"),
    ],
)
def test_a_failing_step_reward_stops_with_one_line_or_scores_no_steps(out, why):
    with pytest.raises(InputError) as err:
        score_steps([Bad(out)], ["1+1 = 2\n"], ["1+1 = 2\n#### 2"])
    assert "\n" not in str(err.value) and "Bad" in str(err.value) and why in str(err.value)
    texts, answers = ["1+1 = 2\n"] * 2, ["1+1 = 2\n#### 2"] * 2
    steps, means, errors = score_steps([Bad(out), WorkedLines(weight=2.0)], texts, answers, None, "zero")
    assert steps == [[(8, 2.0)]] * 2 and means == {"Bad": [0.0, 0.0], "WorkedLines": [1.0, 1.0]} and errors == 2


def test_a_steps_score_lands_on_the_token_that_completes_its_text():
    tok = ByteTokenizer()
    text = "1+1 = 2\n2+5 = 8\n#### 8"
    ids = tok.encode(text)
    values, mask = place_steps([ids], [WorkedLines().steps(text, "1+1 = 2\n2+6 = 8\n#### 8")], tok.decode, 30)
    assert mask[0].nonzero().flatten().tolist() == [7, 15]  # the two newlines
    assert values[0, 7] == 1.0 and values[0, 15] == 0.0 and values.sum() == 1.0
    pieces = {0: "1+", 1: "1 = ", 2: "2\n2", 3: "+5 = 8\n#### 8"}  # a BPE-like token spans each line's end
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    values, mask = place_steps([[0, 1, 2, 3]], [[(8, 0.5), (16, 1.0)]], decode, 6)
    assert mask[0].tolist() == [False, False, True, True, False, False] and values[0, :4].tolist() == [0, 0, 0.5, 1.0]


def paper(step_rewards: list[list[dict]], t: int, scale: bool = True, credit: str = "later") -> torch.Tensor:
    """DeepSeekMath 4.1.3 as a loop: normalise every step reward of the group by the group's steps' mean and std,
    then each token's advantage is the sum of the normalised rewards of the steps ending at or after it ("own":
    the first of those alone)."""
    flat = torch.tensor([s["r"] for row in step_rewards for s in row], dtype=torch.float64)
    mean, std = flat.mean(), (flat.std() if len(flat) > 1 else torch.tensor(0.0))
    out = torch.zeros(len(step_rewards), t, dtype=torch.float64)
    for i, row in enumerate(step_rewards):
        for tok in range(t):
            later = [((s["r"] - mean) / (std + 1e-4) if scale else s["r"] - mean) for s in row if s["end"] >= tok]
            out[i, tok] = sum(later) if credit == "later" else (later[0] if later else 0.0)
    return out


@pytest.mark.parametrize("scale, credit", [(True, "later"), (False, "later"), (True, "own"), (False, "own")])
def test_process_advantages_equal_the_papers_loop_per_group(scale, credit):
    rng = random.Random(1)
    t, g = 7, 3
    groups = [[[{"end": e, "r": rng.choice([0.0, 0.5, 1.0])} for e in sorted(rng.sample(range(t), rng.randint(0, 3)))]
               for _ in range(g)] for _ in range(4)]  # fmt: skip
    groups[0] = [[{"end": 2, "r": 1.0}], [], []]  # one step in the group: nothing to compare it with, 0
    rewards, mask = torch.zeros(4 * g, t, dtype=torch.float64), torch.zeros(4 * g, t, dtype=torch.bool)
    for i, row in enumerate(r for grp in groups for r in grp):
        for s in row:
            rewards[i, s["end"]], mask[i, s["end"]] = s["r"], True
    got = process_advantages(rewards, mask, g, scale, credit=credit)
    want = torch.cat([paper(grp, t, scale, credit) if sum(map(len, grp)) > 1 else torch.zeros(g, t) for grp in groups])
    torch.testing.assert_close(got, want.to(got.dtype))
    assert torch.equal(got[:g], torch.zeros(g, t))


def test_one_step_per_completion_at_its_end_is_grpos_outcome_advantage():
    g, t, lengths = 4, 6, torch.tensor([6, 2, 4, 1, 3, 3, 5, 6])
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 2.0, 1.0, 1.0, 0.0])
    step, mask = torch.zeros(8, t), torch.zeros(8, t, dtype=torch.bool)
    step[torch.arange(8), lengths - 1], mask[torch.arange(8), lengths - 1] = rewards, True
    completion = torch.arange(t)[None] < lengths[:, None]
    got = process_advantages(step, mask, g)
    want = group_advantages(rewards, g)[:, None].expand(8, t)
    torch.testing.assert_close(got[completion], want[completion])
    torch.testing.assert_close(process_advantages(step, mask, g, credit="own")[completion], want[completion])
    logp, old = -torch.rand(8, t), -torch.rand(8, t)
    loss = GRPOLoss("dapo")
    process = loss.objective(logp, old, loss.advantages(torch.zeros(8), g, (step, mask)), completion.long())
    outcome = clipped_surrogate(logp, old, want, 0.2, 0.2, completion.long(), "dapo")
    torch.testing.assert_close(process["loss"], outcome["loss"])
    both = loss.objective(logp, old, loss.advantages(rewards, g, (step, mask)), completion.long())  # the two add
    summed = clipped_surrogate(logp, old, want + got, 0.2, 0.2, completion.long(), "dapo")
    torch.testing.assert_close(both["loss"], summed["loss"])


def test_grpo_with_a_step_reward_updates_on_per_token_advantages_and_logs_the_total():
    torch.manual_seed(0)
    optimizer = AdamWCosine(lr=1e-3, weight_decay=0.0, warmup_steps=0, min_lr_ratio=1.0)
    net = GPT(vocab_size=257, block_size=32, n_layer=1, n_embd=32, n_head=2)
    module = GRPOModule(net, [ExactMatch(), WorkedLines(weight=0.5)], group_size=2,
                        generation=Generation(max_new_tokens=8), optimizer=optimizer)  # fmt: skip
    module.tokenizer = ByteTokenizer()
    assert GRPOModule(net, [ExactMatch()], optimizer=optimizer).step_scores(None, None) is None
    texts = ["1+1 = 2\n#### 2", "1+1 = 3\n#### 3"]
    scores = module.score_rows(texts, ["1+1 = 2\n#### 2"])
    assert scores.outcome.tolist() == [1.0, 0.0] and scores.total.tolist() == [1.5, 0.0]
    assert scores.steps == [[(8, 0.5)], [(8, 0.0)]] and scores.metrics["rewards/WorkedLines/mean"] == 0.5
    ids = torch.tensor([ByteTokenizer().encode(t) + [256] + [0] * (15 - len(t)) for t in texts])
    mask = (torch.arange(16)[None] <= torch.tensor([14, 14])[:, None]).long()

    rollout = Rollout(torch.cat([torch.full((2, 2), 65), ids], 1), torch.zeros(2, dtype=torch.long), mask,
                      torch.zeros(2, 16))  # fmt: skip
    adv = module.loss.process(*module.step_scores(rollout, scores), 2)
    assert adv[0, :8].tolist() == pytest.approx([1 / (2**0.5 + 1e-4 * 2)] * 8, rel=1e-3) and adv[0, 8:].abs().sum() == 0
    assert torch.allclose(adv[1], -adv[0])
    texts = ["1+1 = 2\n2+2 = 4\n#### 4", "1+1 = 3\n3+2 = 5\n#### 5"]  # a slip, then its result carried right
    ids = torch.tensor([ByteTokenizer().encode(t) + [256] for t in texts])
    rollout = Rollout(ids, torch.zeros(2, dtype=torch.long), torch.ones(2, 23, dtype=torch.long), torch.zeros(2, 23))
    steps = module.step_scores(rollout, module.score_rows(texts, ["1+1 = 2\n2+2 = 4\n#### 4"]))
    own = GRPOLoss(step_credit="own").process(*steps, 2)
    assert own[1, :8].max() < 0 and torch.equal(own[1, 8:16], own[0, 8:16]) and own[0, 8] > 0  # line 2: both right
    later = GRPOLoss(step_credit="later").process(*steps, 2)
    assert torch.allclose(later[:, :8], own[:, :8] + own[:, 8:9]) and torch.equal(later[:, 8:], own[:, 8:])
    with pytest.raises(InputError, match="step_credit"):
        GRPOModule(net, [WorkedLines()], optimizer=optimizer, loss={"step_credit": "all"})


@pytest.mark.parametrize("scale, credit", [(True, "later"), (False, "own")])
def test_the_losss_advantages_are_the_outcomes_plus_the_steps_each_by_its_settings(scale, credit):
    g = torch.Generator().manual_seed(0)
    rewards, mask = torch.rand(8, generator=g), torch.rand(8, 5, generator=g) < 0.4
    step = torch.rand(8, 5, generator=g) * mask
    got = GRPOLoss(scale_std=scale, step_credit=credit).advantages(rewards, 4, (step, mask))
    want = group_advantages(rewards, 4, scale)[:, None] + process_advantages(step, mask, 4, scale, credit=credit)
    torch.testing.assert_close(got, want)
