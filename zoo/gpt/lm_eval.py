"""A zoo GPT as an lm-evaluation-harness model (``lm_eval.api.model.TemplateLM``), registered as ``"zoo"``.

Any lm-eval task runs on a ``CausalLMModule`` (a Lightning checkpoint, or a module in Python): its log-likelihoods
come from ``zoo.gpt.tasks.score_continuations`` (the same scoring as ``cli.py test`` with ``TaskDataModule``, so the
two agree on the same data), batched ``batch_size`` rows per forward; generation is ``zoo.gpt.generate``'s, greedy
unless a task asks to sample. With lm-eval's ``apply_chat_template``, prompts are the model's own chat rendering
(``zoo.io.chat_template``): lm-eval hands a prompt back as text, so the ids each rendered text stands for are kept.
lm-eval is an optional extra (``eval``): nothing else imports this file, and without lm-eval importing it is one line
naming the extra.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import torch

from zoo.errors import InputError, missing_extra
from zoo.gpt.generate import generate
from zoo.gpt.module import CausalLMModule
from zoo.gpt.tasks import cut, encode_plain, prefix_id, rolling_windows, score_continuations
from zoo.io.chat_template import chat_renderer, checked_messages
from zoo.io.weights import REGISTRY_URIS, readable

try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ModuleNotFoundError as err:
    raise missing_extra("lm_eval", "lm-eval tasks (zoo.gpt.lm_eval, python -m zoo.gpt lm-eval)") from err

DEFAULT_FORMAT = "zoo default chat format: <|role|>\\n + content (+ \\n after system and user turns; EOS ends a reply)"


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
        init_weights: str | None = None,
    ) -> None:
        """``init_weights``: the base a LoRA checkpoint was trained on (it leaves its frozen base out)."""
        super().__init__()
        if isinstance(pretrained, str):
            if pretrained.startswith(REGISTRY_URIS):  # the registry is the application's (zoo.tracking) to read
                raise InputError(
                    f"pretrained={pretrained!r} is an MLflow URI, which the GPT family does not resolve: run "
                    f"python -m zoo.tracking lm-eval {pretrained} ..., or from Python pass "
                    f"ZooLM(zoo.tracking.load_model({pretrained!r}))"
                )
            path = readable(pretrained, "pretrained")
            given = {"init_weights": init_weights} if init_weights else {}
            pretrained = CausalLMModule.load_from_checkpoint(
                path, map_location=device or "cpu", weights_only=True, **given
            )
        elif device is not None:
            pretrained = pretrained.to(device)
        if pretrained.tokenizer is None:
            raise InputError("the model has no tokenizer: evaluate a checkpoint trained on text (it carries one)")
        self.module, self.net, self.tok = pretrained, pretrained.net.eval(), pretrained.tokenizer
        # lm-eval's CLI passes "auto" (a batch size search): here a fixed one, max_batch_size when given
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else (max_batch_size or 16)
        self.max_gen_toks = max_gen_toks
        self._prompts: dict[str, tuple[list[int], str]] = {}  # a chat prompt's text -> (rendered ids, text after)

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
        if string in self._prompts:  # a chat prompt: the ids the zoo rendered it as
            ids, tail = self._prompts[string]
            return ids + encode_plain(self.tok, tail) if tail else list(ids)
        return encode_plain(self.tok, string) if add_special_tokens is False else self.tok.encode(string)

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """As lm-eval's, except after a chat prompt: the rendered prompt stays whole (lm-eval would move its trailing
        whitespace, part of the template's generation prompt, into the continuation), and the continuation is the
        reply, as ``TaskDataModule`` with ``chat: true`` scores it."""
        if context not in self._prompts:
            return super()._encode_pair(context, continuation)
        ids, tail = self._prompts[context]
        if not tail:
            return list(ids), encode_plain(self.tok, continuation)
        spaces = len(tail) - len(tail.rstrip())  # a continued final message is plain text: lm-eval's rule there
        tail, continuation = tail[: len(tail) - spaces], tail[len(tail) - spaces :] + continuation
        head = encode_plain(self.tok, tail)
        return ids + head, encode_plain(self.tok, tail + continuation)[len(head) :]

    # -- chat: lm-eval's --apply_chat_template and --fewshot_as_multiturn ----------------------------------------

    @property
    def tokenizer_name(self) -> str:
        """The tokenizer and its chat template, fingerprinted (lm-eval keys its request cache by it)."""
        spec = self.tok.to_dict()
        digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
        return f"zoo-{spec.get('kind', 'tokenizer')}-{digest[:16]}"

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The template prompts are rendered with: an imported tokenizer's Jinja source, else the zoo's default
        format (``zoo.io.chat_template``); a model has one, so a template named by lm-eval is refused."""
        if chat_template is False or chat_template is None:
            return None
        if isinstance(chat_template, str):
            raise InputError(
                f"the chat template {chat_template!r} is named: a zoo model has one, its tokenizer's; "
                "apply it without a name"
            )
        return getattr(self.tok, "chat_template", None) or DEFAULT_FORMAT

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation rendered by the model's own chat template (``zoo.io.chat_template``), as its text; the
        ids it renders to are kept for the text, which is how lm-eval hands the prompt back. Without the generation
        prompt (a task's ``gen_prefix``) the final assistant message is continued, as lm-eval's HF model does with
        transformers' ``continue_final_message``: the prompt before it, then its text."""
        messages = checked_messages([dict(m) for m in chat_history])
        render, tail = chat_renderer(self.tok), ""
        if not add_generation_prompt and messages[-1]["role"] == "assistant":
            tail, messages = messages[-1]["content"], messages[:-1]
            add_generation_prompt = True
        rendered = render(messages, add_generation_prompt)
        text = rendered.text + tail
        if self._prompts.setdefault(text, (rendered.ids, tail)) != (rendered.ids, tail):
            raise InputError(f"two conversations render to the same text with different ids: {text[:200]!r}")
        return text

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
