"""Task metrics for a causal language model: exact match on generated answers, multiple choice by log-likelihood,
bits per byte, defined as lm-evaluation-harness defines them (``lm_eval/api/task.py``, ``lm_eval/api/model.py``).

- Log-likelihood of a continuation given a context: the context and the continuation are encoded as one text and
  split at the context's length (``TemplateLM._encode_pair``: trailing spaces of the context move to the
  continuation); a row keeps its last ``block_size + 1`` tokens, and the sum of log p over the continuation's tokens
  is its score, greedy when every one of them is the argmax.
- Multiple choice: ``acc`` is whether the argmax of the choices' scores is the label; ``acc_norm`` divides each score
  by the choice's length in characters (``len(choice)``, lm-eval 0.4's code, though its docs say bytes) and
  ``acc_bytes`` by its UTF-8 length in bytes; a tie goes to the first choice (``np.argmax``).
- Bits per byte: -sum log2 p of a text's tokens (after the BOS, or EOS, prefix) over its UTF-8 bytes, summed over a
  whole file before dividing; a text longer than the net is scored in disjoint windows
  (``get_rolling_token_windows``).
- Exact match: the greedy continuation, cut at the first ``until`` string, its answer read by the answer rule (a
  regex's one group at its first match, as lm-eval's "strict-match"; by default GSM8K's ``#### <number>``, and
  without it the last number in the text), compared with the reference read by the same rule, after lm-eval's GSM8K
  normalisation (strip; commas, ``$`` and a final ``.`` removed). GRPO's rewards and validation accuracy take this
  rule too (``correct``), so a model is scored in training as ``cli.py test`` scores it.

Notation: N scored rows (a choice each, or a window), T tokens, V vocabulary, R records, C most choices of a record.
"""

from __future__ import annotations

import math
import re
import signal
import threading
import time
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from zoo.errors import InputError
from zoo.gpt.generate import generate
from zoo.gpt.losses import IGNORE_INDEX

NUMBER = r"-?[$]?\d[\d,]*(?:\.\d+)?"
GSM8K_ANSWER = rf"####\s*({NUMBER})"  # lm-eval gsm8k's "strict-match" filter; else "flexible-extract"'s last number
KINDS = {"exact_match": ("exact_match",), "multiple_choice": ("acc", "acc_norm", "acc_bytes")}
KINDS["bits_per_byte"] = ("bits_per_byte",)
MAX_PATTERN = 1000  # characters of an answer rule (answer_pattern)
RULE_SECONDS = 2.0  # the most one reading of a text by an answer rule may take: a regex is code with a deadline


# -- encoding, as lm-eval's TemplateLM encodes -------------------------------------------------------------------


def prefix_id(tokenizer) -> int:
    """The token an empty context (and a rolling text) starts from: BOS where the tokenizer has one, else EOS."""
    bos = getattr(tokenizer, "bos_id", None)
    return tokenizer.eos_id if bos is None else bos


def encode_plain(tokenizer, text: str) -> list[int]:
    """``text``'s ids without the tokenizer's own BOS (``add_special_tokens=False``)."""
    hf = getattr(tokenizer, "hf", None)
    return hf.encode(text, add_special_tokens=False).ids if hf is not None else tokenizer.encode(text)


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-eval's ``TemplateLM.loglikelihood`` makes them."""
    if not context:
        ids = encode_plain(tokenizer, continuation)
        return ([prefix_id(tokenizer)], ids) if ids[:1] != [prefix_id(tokenizer)] else (ids[:1], ids[1:])
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, ctx = tokenizer.encode(context + continuation), tokenizer.encode(context)
    return ctx, whole[len(ctx) :]


def rolling_windows(ids: Sequence[int], prefix: int, width: int) -> list[tuple[list[int], list[int]]]:
    """Disjoint (context, continuation) windows that predict every token of ``ids`` once after ``prefix``, each
    at most ``width`` inputs: lm-eval's ``get_rolling_token_windows(context_len=1)`` + ``make_disjoint_window``."""
    seq, out = [prefix, *ids], []
    for start in range(1, len(seq), width):
        end = min(start + width, len(seq))
        out.append((seq[max(0, end - 1 - width) : start], seq[start:end]))
    return out


# -- scoring -----------------------------------------------------------------------------------------------------


def score_continuations(net: nn.Module, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> tuple[Tensor, Tensor]:
    """Sum of log p(continuation | context) (N,) and whether each continuation is the greedy one (N,), all rows in
    one right-padded forward (a causal net's earlier positions never see the padding)."""
    width, device = net.block_size, net.tok_emb.weight.device
    rows = [list(ctx) + list(cont) for ctx, cont in pairs]
    rows = [r[-(width + 1) :] for r in rows]  # lm-eval keeps the last max_length + 1 tokens
    t = max(len(r) for r in rows) - 1
    inputs = torch.zeros(len(rows), t, dtype=torch.long)  # (N, T)
    targets = torch.full((len(rows), t), IGNORE_INDEX, dtype=torch.long)  # (N, T): ignored outside the continuation
    for i, (row, (_, cont)) in enumerate(zip(rows, pairs, strict=True)):
        n = min(len(cont), len(row) - 1)
        inputs[i, : len(row) - 1] = torch.as_tensor(row[:-1])
        targets[i, len(row) - 1 - n : len(row) - 1] = torch.as_tensor(row[len(row) - n :])
    inputs, targets = inputs.to(device), targets.to(device)
    logits = net(inputs).float()  # (N, T, V)
    scored = targets != IGNORE_INDEX
    safe = targets.clamp(min=0)
    logp = logits.gather(-1, safe[..., None]).squeeze(-1) - logits.logsumexp(-1)  # (N, T)
    greedy = (logits.argmax(-1) == safe) | ~scored
    return (logp * scored).sum(1), greedy.all(1)


def multiple_choice(net: nn.Module, batch: dict) -> dict[str, Tensor]:
    """Per record (R,): whether the best choice by summed log-prob (acc), per character (acc_norm) and per byte
    (acc_bytes) is the label; all the batch's choices in one forward."""
    lls, _ = score_continuations(net, batch["pairs"])  # (N,)
    record, choice = batch["record"], batch["choice"]  # (N,) each: which record and which of its choices
    r, c = len(batch["labels"]), int(choice.max()) + 1
    grid = torch.full((r, c), float("-inf"), device=lls.device)  # (R, C): missing choices never win
    grid[record, choice] = lls
    chars = torch.ones(r, c, device=lls.device).index_put_((record, choice), batch["chars"].to(lls))
    nbytes = torch.ones(r, c, device=lls.device).index_put_((record, choice), batch["bytes"].to(lls))
    labels = batch["labels"].to(lls.device)
    return {
        "acc": (grid.argmax(1) == labels).float(),
        "acc_norm": ((grid / chars).argmax(1) == labels).float(),
        "acc_bytes": ((grid / nbytes).argmax(1) == labels).float(),
    }


def bits(net: nn.Module, batch: dict, tokenizer) -> tuple[Tensor, Tensor]:
    """Each text's -log2 likelihood and its UTF-8 bytes (R,), every window of the batch in one forward."""
    pairs, record = [], []
    for r, ids in enumerate(batch["prompt_ids"]):
        windows = rolling_windows(ids.tolist(), prefix_id(tokenizer), net.block_size)
        pairs += windows
        record += [r] * len(windows)
    lls, _ = score_continuations(net, pairs)  # (N,) nats
    record = torch.tensor(record, device=lls.device)
    total = torch.zeros(len(batch["bytes"]), device=lls.device).index_add_(0, record, lls)  # (R,)
    return -total / math.log(2), batch["bytes"].to(lls)


# -- exact match -------------------------------------------------------------------------------------------------


def normalise(answer: str) -> str:
    """lm-eval gsm8k's ``regexes_to_ignore`` (commas, ``$``, a final ``.``) after stripping."""
    return re.sub(r"\.$", "", re.sub(r"[,$]", "", answer.strip()))


class PastDeadline(Exception):
    """Raised inside ``timed``'s call when its time is up."""


def timed(fn, timeout: float | None, *args):
    """``fn(*args)``, interrupted by ``PastDeadline`` (SIGALRM) after ``timeout`` s: on the main thread, unless a
    sooner deadline already runs (that one bounds it); elsewhere unbounded. A later one (a test runner's, a caller's)
    is put back after, less the time spent. The regex engine checks for signals as it runs."""
    outer = signal.getitimer(signal.ITIMER_REAL)[0]
    if not timeout or threading.current_thread() is not threading.main_thread() or 0 < outer <= timeout:
        return fn(*args)

    def alarm(signum, frame):
        raise PastDeadline

    global _running
    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    _running += 1
    try:
        return fn(*args)
    finally:
        _running -= 1
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3))


_running = 0  # how many of ``timed``'s deadlines run now (another's timer, e.g. a test runner's, is not one)


def deadline_running() -> bool:
    """Whether the caller runs inside one of ``timed``'s deadlines (a reward's), which bounds it."""
    return _running > 0


def check_pattern(pattern: str | None, setting: str = "--data.init_args.answer_pattern") -> None:
    """Refuses, in one line naming ``setting``, an answer rule that is not a regex with exactly one group (of at most
    ``MAX_PATTERN`` characters)."""
    if pattern is None:
        return
    if len(pattern) > MAX_PATTERN:
        raise InputError(f"{setting} has {len(pattern)} characters, more than {MAX_PATTERN}: give a shorter regex")
    try:
        groups = re.compile(pattern).groups
    except re.error as err:
        raise InputError(
            f"{setting}={pattern!r} is not a regular expression ({err}): give one, e.g. 'Answer: (.+)'"
        ) from None
    if groups != 1:
        raise InputError(
            f"{setting}={pattern!r} has {groups} groups: give a regex with exactly one, the answer, e.g. 'Answer: (.+)'"
        )


def read_answer(text: str, pattern: str | None = None) -> str | None:
    """The answer rule: ``pattern``'s one group at its FIRST match in ``text``, normalised (lm-eval's regex filter
    with ``group_select: 0``, GSM8K's "strict-match"; "Answer: 12 then 34" reads 12); None when it does not match.
    ``pattern`` None: GSM8K's ``#### <number>``."""
    found = _search(GSM8K_ANSWER if pattern is None else pattern, text)
    return normalise(found.group(1)) if found else None


def _search(pattern: str, text: str) -> re.Match | None:
    """``re.search`` within ``RULE_SECONDS`` (a reward's own deadline, where one runs); past it, one line."""
    if deadline_running():
        return re.search(pattern, text)
    try:
        return timed(re.search, RULE_SECONDS, pattern, text)
    except PastDeadline:
        raise InputError(
            f"the answer rule {pattern!r} ran past {RULE_SECONDS} s on a text of {len(text)} characters "
            "(a regex that backtracks without end): give a simpler answer_pattern"
        ) from None


def extract_answer(text: str, pattern: str | None = None) -> str | None:
    """A generated text's answer by the rule (``read_answer``); None when a given ``pattern`` reads none (never
    right, lm-eval's "[invalid]"). Without a pattern, where no ``#### <number>`` is, the last number in the text
    (lm-eval gsm8k's "flexible-extract"), else the text itself."""
    found = read_answer(text, pattern)
    if found is not None or pattern is not None:
        return found
    numbers = re.findall(NUMBER, text)
    return normalise(numbers[-1]) if numbers else normalise(text)


def reference(answer: str, pattern: str | None = None) -> str | None:
    """A record's answer by the same rule: what the rule reads in it (a worked solution ending ``#### 6``, a reply
    ending ``Answer: 6``), else the whole string as the answer itself (``"6"``, ``"Paris"``); None when that is
    empty. A reply, which is never the answer itself, must be read by the rule (``datamodules.PromptDataModule``
    refuses one that is not)."""
    found = read_answer(answer, pattern)
    return found if found is not None else (normalise(answer) or None)


def correct(completion: str, answer: str, pattern: str | None = None) -> bool:
    """Whether a generated text's answer equals its record's, both read by the rule of ``pattern`` (exact match)."""
    found = extract_answer(completion, pattern)
    return found is not None and found == reference(answer, pattern)


def cut(text: str, until: Sequence[str]) -> str:
    """``text`` up to the first of the ``until`` strings (lm-eval's ``generate_until``)."""
    for stop in until:
        if stop:
            text = text.split(stop, 1)[0]
    return text


def exact_match(net: nn.Module, batch: dict, tokenizer) -> Tensor:
    """Per record (R,): whether the greedy continuation's extracted answer equals the reference."""
    room = net.block_size - 1  # a prompt leaves room for one new token
    prompts = [p[-room:].to(net.tok_emb.weight.device) for p in batch["prompt_ids"]]
    out = generate(net, prompts, batch["max_new_tokens"], temperature=0, stop_ids=tokenizer.stop_ids)
    texts = [cut(tokenizer.decode(o.tolist()), batch["until"]) for o in out]
    hits = [correct(t, a, batch["answer_pattern"]) for t, a in zip(texts, batch["answers"])]
    return torch.tensor(hits, dtype=torch.float32, device=net.tok_emb.weight.device)


def first_of_each(index: Tensor) -> Tensor:
    """The positions of each distinct value's first occurrence in ``index`` (N,), in order of position."""
    order = torch.arange(len(index), device=index.device)
    distinct, which = torch.unique(index, return_inverse=True)
    first = torch.full((len(distinct),), len(index), device=index.device)
    return first.scatter_reduce(0, which, order, "amin").sort().values


class RecordMean(Metric):
    """A weighted mean over records, each counted once across ranks. A ``DistributedSampler`` evens out the ranks by
    repeating records (as Lightning's test and validation loaders do, so every rank runs as many batches, which a
    sharded model's collectives need): the states keep each value with its record's index, gathered whole across
    ranks, and the mean takes each index's first value."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        for name in ("index", "value", "weight"):
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, index: Tensor, value: Tensor, weight: Tensor | None = None) -> None:
        self.index.append(index.to(self.device))
        self.value.append(value.float().to(self.device))
        self.weight.append(torch.ones_like(self.value[-1]) if weight is None else weight.float().to(self.device))

    def compute(self) -> Tensor:
        index, value, weight = (dim_zero_cat(s) for s in (self.index, self.value, self.weight))
        once = first_of_each(index)
        return (value[once] * weight[once]).sum() / weight[once].sum()


class TaskMetrics(nn.Module):
    """The test metrics of task batches: a mean per record, each record once however the ranks shared them
    (``RecordMean``); bits per byte weighted by bytes, so it is the file's total bits over its total bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.means = nn.ModuleDict({name: RecordMean() for names in KINDS.values() for name in names})
        self.kind: str | None = None

    def update(self, net: nn.Module, batch: dict, tokenizer) -> None:
        self.kind, index = batch["task"], batch["index"]
        if self.kind == "multiple_choice":
            for name, hits in multiple_choice(net, batch).items():
                self.means[name].update(index, hits)
        elif self.kind == "exact_match":
            self.means["exact_match"].update(index, exact_match(net, batch, tokenizer))
        elif self.kind == "bits_per_byte":
            total_bits, nbytes = bits(net, batch, tokenizer)
            self.means["bits_per_byte"].update(index, total_bits / nbytes, weight=nbytes)
        else:
            raise ValueError(f"unknown task kind {self.kind!r}, not one of {', '.join(KINDS)}")

    def compute(self, prefix: str = "test/") -> dict[str, Tensor]:
        """This epoch's metrics (none without task batches), reset for the next."""
        if self.kind is None:
            return {}
        out = {f"{prefix}{name}": self.means[name].compute() for name in KINDS[self.kind]}
        for metric in self.means.values():
            metric.reset()
        self.kind = None
        return out
