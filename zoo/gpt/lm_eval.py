"""A zoo GPT as an lm-evaluation-harness model (``lm_eval.api.model.TemplateLM``), registered as ``"zoo"``.

Any lm-eval task runs on a ``CausalLMModule`` (a Lightning checkpoint, or a module in Python): its log-likelihoods
come from ``zoo.gpt.tasks.score_continuations`` (the same scoring as ``cli.py test`` with ``TaskDataModule``, so the
two agree on the same data), batched ``batch_size`` rows per forward; generation is ``zoo.gpt.generate``'s, greedy
unless a task asks to sample. lm-eval is an optional extra (``pip install .[eval]``): nothing else imports this file.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from zoo.errors import InputError
from zoo.gpt.generate import generate
from zoo.gpt.module import CausalLMModule
from zoo.gpt.tasks import cut, encode_plain, prefix_id, rolling_windows, score_continuations
from zoo.io.weights import readable


@register_model("zoo")
class ZooLM(TemplateLM):
    """lm-eval's ``--model zoo --model_args pretrained=<checkpoint.ckpt>``, or ``ZooLM(module)`` in Python."""

    def __init__(
        self,
        pretrained: str | CausalLMModule,
        batch_size: int | str = 16,
        device: str | None = None,
        max_gen_toks: int = 256,
        max_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(pretrained, str):
            path = readable(pretrained, "pretrained")
            pretrained = CausalLMModule.load_from_checkpoint(path, map_location=device or "cpu", weights_only=True)
        elif device is not None:
            pretrained = pretrained.to(device)
        if pretrained.tokenizer is None:
            raise InputError("the model has no tokenizer: evaluate a checkpoint trained on text (it carries one)")
        self.module, self.net, self.tok = pretrained, pretrained.net.eval(), pretrained.tokenizer
        # lm-eval's CLI passes "auto" (a batch size search): here a fixed one, max_batch_size when given
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else (max_batch_size or 16)
        self.max_gen_toks = max_gen_toks

    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def prefix_token_id(self) -> int:
        return prefix_id(self.tok)

    @property
    def max_length(self) -> int:
        return self.net.block_size

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return encode_plain(self.tok, string) if add_special_tokens is False else self.tok.encode(string)

    def tok_decode(self, tokens: Sequence[int], **kwargs) -> str:
        return self.tok.decode(list(tokens))

    @torch.no_grad()
    def _scores(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        out = []
        for i in range(0, len(pairs), self.batch_size):
            lls, greedy = score_continuations(self.net, pairs[i : i + self.batch_size])
            out += list(zip(lls.tolist(), greedy.tolist(), strict=True))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        out = self._scores([(ctx, cont) for _, ctx, cont in requests])
        for (key, _, _), result in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood", key, result)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood after the prefix token, in disjoint windows of ``block_size`` inputs."""
        windows, owner = [], []
        for k, (text, *_) in enumerate(req.args for req in requests):
            mine = rolling_windows(self.tok_encode(text), self.prefix_token_id, self.max_length)
            windows += mine
            owner += [k] * len(mine)
        totals = [0.0] * len(requests)
        for k, (ll, _) in zip(owner, self._scores(windows), strict=True):
            totals[k] += ll
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
        return totals

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations (sampled at ``temperature`` when a task sets ``do_sample``), cut at ``until``."""
        out: list[str] = []
        for i in range(0, len(requests), self.batch_size):
            chunk = [req.args for req in requests[i : i + self.batch_size]]
            groups: dict[str, list[int]] = {}  # requests sharing their generation settings decode together
            for k, (_, kwargs) in enumerate(chunk):
                groups.setdefault(repr(sorted(kwargs.items())), []).append(k)
            texts = [""] * len(chunk)
            for members in groups.values():
                for k, text in zip(members, self._generate([chunk[k][0] for k in members], chunk[members[0]][1])):
                    texts[k] = text
            out += texts
        return out

    def _generate(self, contexts: list[str], kwargs: dict) -> list[str]:
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        temperature = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0
        room, device = self.max_length - 1, self.net.tok_emb.weight.device  # a prompt leaves room for one token
        prompts = [torch.tensor(self.tok_encode(c)[-room:] or [self.prefix_token_id], device=device) for c in contexts]
        steps = int(kwargs.get("max_gen_toks", self.max_gen_toks))
        new = generate(self.net, prompts, steps, temperature, stop_ids=self.tok.stop_ids)
        return [cut(self.tok.decode(ids.tolist()), until) for ids in new]
