"""Causal language modelling: next-token cross-entropy, perplexity, throughput, generation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import ThroughputMonitor
from torch import Tensor
from torchmetrics import MeanMetric

from zoo.adapt import Adaptation
from zoo.adapt import adapt as adapt_module
from zoo.adapt.base import drop_base, restore_base
from zoo.compat import trainer_of
from zoo.errors import InputError
from zoo.gpt.generate import Generation, decoding, generate
from zoo.gpt.gpt import GPT
from zoo.gpt.losses import causal_lm_loss, causal_lm_objective, mtp_loss
from zoo.gpt.moe import routers
from zoo.gpt.speculative import MTPDraft, SpeculationStats, speculative_generate
from zoo.gpt.tasks import TaskMetrics
from zoo.io import dtypes
from zoo.io.chat_template import chat_renderer, checked_messages
from zoo.io.checkpoint import WeightsOnlyLoading
from zoo.io.dtypes import Dtype
from zoo.io.hparams import save_hparams
from zoo.io.tokenizers import prompt_ids, tokenizer_from_dict
from zoo.io.weights import check_compatible, extract_state_dict, readable
from zoo.train.logging import lightning_writes
from zoo.train.optim import AdamWCosine
from zoo.train.parallel import shard

if TYPE_CHECKING:
    from zoo.gpt.formats.folder import Folder


def _batch_size(batch: tuple[Tensor, Tensor] | dict) -> int:
    if isinstance(batch, dict):  # prompts (GRPO), or a text environment's seeds (multi-turn GRPO)
        return len(batch["prompt_ids"] if "prompt_ids" in batch else batch["env_seeds"])
    return batch[0].shape[0]


def _tokens(batch: tuple[Tensor, Tensor] | dict) -> int:
    if isinstance(batch, dict) and "env_seeds" in batch:  # no tokens before its episodes are played: one a seed
        return len(batch["env_seeds"])
    return sum(p.numel() for p in batch["prompt_ids"]) if isinstance(batch, dict) else batch[0].numel()


def vocab_size_for(given: int | None, n: int) -> int:
    """The net's ``vocab_size`` for a tokenizer of ``n`` ids: ``given``, unless None (then ``n``); a given size must
    agree, and a larger multiple of 64 is padding on purpose (nanoGPT's 50304 for GPT-2's 50257: faster matmuls)."""
    if given is None:
        return n
    if given != n and not (given > n and given % 64 == 0):
        raise InputError(
            f"The tokenizer has {n} ids but the net's vocab_size is {given}: leave vocab_size unset to take "
            f"the tokenizer's, or set --model.init_args.net.init_args.vocab_size={n} (or a larger multiple of 64)"
        )
    return given


class CausalLMModule(WeightsOnlyLoading, LightningModule):
    """Trains a ``GPT`` on (input ids, target ids) batches; ``generate`` continues text prompts; test and validation
    also score task records (dict batches with a ``"task"``: ``zoo.gpt.tasks``)."""

    def __init__(
        self,
        net: GPT,
        optimizer: AdamWCosine = AdamWCosine(
            lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95), warmup_steps=100, min_lr_ratio=0.1
        ),
        compile: bool = False,
        init_weights: str | None = None,
        generation: Generation = Generation(),
        mtp_weight: float = 0.3,
        adapt: Adaptation | None = None,
        adapter_weights: str | None = None,
        init_dtype: Dtype = "auto",
    ) -> None:
        """
        Args:
            net: the decoder (``zoo.gpt.GPT``), ids (B, T) -> logits (B, T, V).
            optimizer: AdamW with warmup and cosine decay (``zoo.train.optim.AdamWCosine``); GPT-2/3 use betas
                (0.9, 0.95) and weight decay 0.1.
            compile: run the net through ``torch.compile`` for training (weights and checkpoint keys unchanged).
            init_weights: weights to start from: a Hugging Face GPT-2, Llama or DeepSeek-V3 folder (config.json +
            weights,
                see zoo.gpt.formats.llama), a safetensors file of this net or a zoo MLflow model (models:/name/version,
                models:/name@alias, runs:/id/model); loaded weights-only, before any
                checkpoint given by --ckpt_path is restored over them.
            generation: how predict continues the prompts (``zoo.gpt.generate.Generation``: max_new_tokens,
                temperature, top_k, top_p, repetition_penalty, seed, past_block_size); not a weight, so ``predict
                --ckpt_path`` takes it from the command line (``--model.init_args.generation.temperature=0``) over the
                checkpoint's. With ``init_weights`` a Hugging Face folder, the fields left at their defaults are its
                ``generation_config.json``'s, as ``zoo.gpt.from_pretrained`` reads them.
            mtp_weight: lambda, the weight of the multi-token prediction loss when the net has ``mtp_depth`` D > 0: the
                training loss is the next-token loss + lambda / D * sum_k L_k (DeepSeek-V3: 0.3, then 0.1 for the last
                tokens of its run); unused without MTP.
            adapt: what a fine-tune trains (``zoo.adapt.Adaptation``): LoRA adapters on some layers
                (``lora: {r: 8, alpha: 16}``) and the parameters named by ``trainable`` globs; None: every weight.
            adapter_weights: a PEFT LoRA adapter folder to start from (``adapter_config.json`` +
                ``adapter_model.safetensors``, trained on the model ``init_weights`` names;
                ``zoo.gpt.formats.peft_adapter``): read when a fit starts (a resumed one too, before its checkpoint is
                restored over it), under ``adapt.lora`` (set from the adapter when unset); a location, so a stored
                config drops it and its checkpoints load without the folder.
            init_dtype: the dtype ``init_weights`` loads in, as ``zoo.gpt.from_pretrained``'s ``dtype`` (``auto``: the
                folder's ``dtype``/``torch_dtype``, else its weights'). Under a trainer it must be the dtype
                ``trainer.precision`` trains (``bf16-true``: bfloat16; ``32-true`` and the mixed ones: float32): with
                ``auto`` a folder in another is cast to it with one line, a dtype named here that differs is refused.
        """
        super().__init__()
        save_hparams(self, "net")
        self.net = net
        self.val_loss = MeanMetric()  # token-weighted over the whole validation set
        # Each MTP depth's loss, token-weighted like val_loss; val/loss itself stays the next-token loss alone.
        self.val_mtp_loss = torch.nn.ModuleList(MeanMetric() for _ in net.mtp)
        self.test_loss = MeanMetric()
        self.tasks = TaskMetrics()  # exact match, multiple choice, bits per byte of task batches (zoo.gpt.tasks)
        self._compiled = None  # set by configure_model; kept off the module tree (no "_orig_mod." keys)
        self._flops_per_token: dict[int, int] = {}
        self._init_loaded = False
        self._folder: Folder | None = None  # init_weights' folder as the application read it (use_folder)
        self._adapter_loaded = False
        self.tokenizer = None  # set from the datamodule or the checkpoint; needed to generate from text
        self.routers = routers(net)  # mixture-of-experts MLPs (zoo.gpt.moe), none in a dense net
        self._drafts: dict[str, GPT] = {}  # speculative decoding's drafts by path, loaded once (not submodules)
        self._speculation: SpeculationStats | None = None  # this predict's counts, when it decodes speculatively

    # -- setup -------------------------------------------------------------------------------------------

    def configure_model(self) -> None:
        adapt_module(self, self.hparams.adapt)  # after init_weights (setup), before sharding and compiling
        if self.hparams.adapter_weights and not self._adapter_loaded:  # a checkpoint restored later wins
            from zoo.gpt.formats.peft_adapter import load_adapter

            load_adapter(self, readable(self.hparams.adapter_weights, "adapter_weights"))
            self._adapter_loaded = True
        shard(self.net, self.device_mesh, blocks=self.net.all_blocks())  # FSDP2 units: one per block, MTP's too
        if self.hparams.compile and self._compiled is None:
            object.__setattr__(self, "_compiled", torch.compile(self.net))

    def configure_callbacks(self):
        # Unless the config lists its own: tokens/s (and FLOPs/s and MFU on GPUs with a known peak, from
        # `flops_per_batch` below).
        if any(isinstance(c, ThroughputMonitor) for c in self.trainer.callbacks):
            return []
        return [ThroughputMonitor(batch_size_fn=_batch_size, length_fn=_tokens)]

    def setup(self, stage: str) -> None:
        # Here rather than in __init__: a checkpoint restores over it, and load_from_checkpoint (which
        # does not call setup) never needs the original weights file to exist.
        if self.hparams.init_weights and not self._init_loaded:  # once: a later test() keeps trained weights
            self._load_base()
        dm = getattr(trainer_of(self), "datamodule", None)
        tok = getattr(dm, "tokenizer", None)
        if tok is None:
            return  # predict and test on a new file: the tokenizer comes with the checkpoint, restored after setup
        self.tokenizer = tok
        vocab_size_for(self.net.vocab_size, tok.vocab_size)  # sized by whoever built the net; checked here

    def use_folder(self, folder: Folder) -> None:
        """Load ``init_weights`` from ``folder``, that folder as the application already read it
        (``zoo.gpt.formats.folder``), instead of reading it again; a folder at another path is refused."""
        if not (isinstance(self.hparams.init_weights, str) and folder.is_at(self.hparams.init_weights)):
            raise ValueError(f"the folder {str(folder.path)!r} is not init_weights {self.hparams.init_weights!r}")
        self._folder = folder

    def _load_base(self) -> None:
        from zoo.gpt.formats.hf import load_pretrained

        path = readable(self.hparams.init_weights)
        folder = self._folder if self._folder is not None and self._folder.is_at(path) else None
        chosen, config = self.hparams.init_dtype, folder and folder.config
        held = dtypes.of_source(path, chosen, next(self.net.parameters()).dtype, config)
        trainer = trainer_of(self)
        self.net.to(dtypes.for_precision(chosen, held, trainer and trainer.precision, str(path)))
        load_pretrained(self.net, folder or path)
        self._init_loaded = True

    # -- steps -------------------------------------------------------------------------------------------

    def forward(self, idx: Tensor, mtp: bool = False, aux: bool = False) -> Tensor | tuple:
        net = self.net if self._compiled is None or not self.training else self._compiled
        return net(idx, mtp=mtp, aux=aux)  # (B, T, V) [and each MTP depth's logits] [and the MLPs' auxiliary terms]

    @property
    def flops_per_batch(self) -> int | None:
        """Training FLOPs of the last batch, read by ``ThroughputMonitor`` after each step."""
        return getattr(self, "_last_flops", None)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        logits, mtp_logits, aux = self(x, mtp=True, aux=True)
        out = causal_lm_objective(logits, y, mtp_logits if self.net.mtp else None, aux, self.hparams.mtp_weight)
        t = x.shape[1]
        if t not in self._flops_per_token:
            self._flops_per_token[t] = self.net.flops_per_token(t)
        self._last_flops = self._flops_per_token[t] * x.numel()
        if lightning_writes(self.trainer):  # values logged at other steps are dropped anyway
            self.log("train/loss", out["loss"], prog_bar=True)
            self.log_dict({f"train/{name}": v for name, v in out.items() if name != "loss"})
        return out["loss"]

    def on_before_optimizer_step(self, optimizer) -> None:
        # Once per optimizer step (not per accumulated micro-batch): DeepSeek-V3's bias update from the step's loads.
        for r in self.routers:
            r.update_bias()

    def on_validation_epoch_start(self) -> None:
        for r in self.routers:
            r.reset_stats()

    def validation_step(self, batch: tuple[Tensor, Tensor] | dict, batch_idx: int) -> None:
        if isinstance(batch, dict):  # task records (datamodules.tasks)
            return self.tasks.update(self.net, batch, self.tokenizer)
        x, y = batch
        if self.net.mtp:
            logits, mtp_logits = self(x, mtp=True)
            mtp = mtp_loss(mtp_logits, y)
            for k, metric in enumerate(self.val_mtp_loss[: len(mtp_logits)], 1):
                metric.update(mtp[f"loss_{k}"], weight=mtp[f"tokens_{k}"])
        else:
            logits = self(x)
        out = causal_lm_loss(logits, y)
        self.val_loss.update(out["loss"], weight=out["tokens"])

    def on_validation_epoch_end(self) -> None:
        tasks = self.tasks.compute("val/")  # synced across ranks
        if tasks:
            return self.log_dict(tasks, prog_bar=True)
        loss = self.val_loss.compute()  # synced across ranks
        self.val_loss.reset()
        self.log_dict({"val/loss": loss, "val/ppl": loss.exp()}, prog_bar=True)
        if self.val_mtp_loss:
            self.log_dict({f"val/mtp_loss_{k}": m.compute() for k, m in enumerate(self.val_mtp_loss, 1)})
            for m in self.val_mtp_loss:
                m.reset()
        if self.routers:  # the worst layer's load imbalance, the mean balance loss, the biases' range
            stats = [r.stats() for r in self.routers]
            moe = {
                "val/moe_load_max_over_mean": max(s["load_max_over_mean"] for s in stats),
                "val/moe_balance_loss": sum(s["balance_loss"] for s in stats) / len(stats),
            }
            if "bias_min" in stats[0]:
                moe["val/moe_bias_min"] = min(s["bias_min"] for s in stats)
                moe["val/moe_bias_max"] = max(s["bias_max"] for s in stats)
            self.log_dict(moe, sync_dist=True)
            for r in self.routers:
                r.reset_stats()  # the next training step's loads start from zero

    def test_step(self, batch: tuple[Tensor, Tensor] | dict, batch_idx: int) -> None:
        if isinstance(batch, dict):  # task records (datamodules.tasks)
            return self.tasks.update(self.net, batch, self.tokenizer)
        x, y = batch
        out = causal_lm_loss(self(x), y)
        self.test_loss.update(out["loss"], weight=out["tokens"])

    def on_test_epoch_end(self) -> None:
        # Token-weighted over the whole file (the datamodule's test_path, or its validation split); its exp is the
        # perplexity per token of the model's own tokenizer, so only models sharing a tokenizer compare by it.
        tasks = self.tasks.compute("test/")  # task batches' metrics instead, synced across ranks
        if tasks:
            return self.log_dict(tasks)
        loss = self.test_loss.compute()
        self.test_loss.reset()
        self.log_dict({"test/loss": loss, "test/ppl": loss.exp()})

    def configure_optimizers(self):
        return AdamWCosine.of(self.hparams.optimizer).configure(self.net, self.trainer)

    # -- generation --------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: list[str] | list[Tensor],
        max_new_tokens: int = 200,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        draft: str | GPT | CausalLMModule | None = None,
        num_draft_tokens: int = 4,
        repetition_penalty: float = 1.0,
    ) -> list[str] | list[Tensor]:
        """Continue each prompt (text, or 1-D id tensors); returns the continuations in the same form.

        ``draft`` (a checkpoint path, a ``CausalLMModule`` or a ``GPT`` sharing this model's tokenizer) decodes
        speculatively, ``num_draft_tokens`` proposed per forward (``zoo.gpt.speculative``): the same continuations
        greedily, the same distribution sampled; its counts (acceptance rate, tokens per forward) are then in
        ``last_speculation``.
        """
        as_text = bool(prompts) and isinstance(prompts[0], str)
        if as_text and self.tokenizer is None:
            raise RuntimeError("No tokenizer: fit or load from a checkpoint made with a text datamodule, or pass ids")
        ids = prompt_ids(self.tokenizer, prompts) if as_text else prompts
        gen = None
        if seed is not None:
            gen = torch.Generator(self.device).manual_seed(seed)
        stop = self.tokenizer.stop_ids if self.tokenizer is not None else ()
        if draft is None:
            args = (max_new_tokens, temperature, top_k, top_p)
            out = generate(self.net, ids, *args, stop_ids=stop, generator=gen, repetition_penalty=repetition_penalty)
        else:
            if repetition_penalty != 1:  # the draft's acceptance test compares unpenalized distributions
                raise InputError("repetition_penalty with a draft: speculative decoding does not apply it; pass one")
            out, stats = speculative_generate(
                self.net,
                self.draft_net(draft),
                ids,
                max_new_tokens,
                num_draft_tokens,
                temperature,
                top_k,
                top_p,
                stop_ids=stop,
                generator=gen,
            )
            self.last_speculation = stats
        return [self.tokenizer.decode(o.tolist()) for o in out] if as_text else out

    def chat_prompt(self, messages: list[dict]) -> Tensor:
        """The ids (1-D) a reply to ``messages`` (OpenAI's ``[{"role", "content"}, ...]``) continues: the tokenizer's
        chat template (``zoo.io.chat_template``: an imported folder's, else the zoo's default format) with the
        generation prompt, so what follows is the assistant's turn, as the model was fine-tuned to write it."""
        if self.tokenizer is None:
            raise RuntimeError("No tokenizer: fit or load from a checkpoint made with a text or chat datamodule")
        rendered = chat_renderer(self.tokenizer)(checked_messages(messages), True)
        return torch.tensor(rendered.ids, dtype=torch.long)

    def stream(
        self,
        request: str | list[dict],
        max_new_tokens: int = 200,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        repetition_penalty: float = 1.0,
    ) -> Iterator[str]:
        """The reply to ``request`` (a text to continue, or chat messages: the assistant's reply), yielded as text
        pieces as the tokens are drawn; joined, the pieces are ``generate``'s continuation for the same settings.

        A piece is held back while the text decoded so far ends inside a character (a byte-level token may carry
        part of one) or does not extend what was already sent (a decoder that rewrites earlier text as later tokens
        come, which byte-level ones never do)."""
        if self.tokenizer is None:
            raise RuntimeError("No tokenizer: fit or load from a checkpoint made with a text or chat datamodule")
        ids = self.chat_prompt(request) if isinstance(request, list) else prompt_ids(self.tokenizer, [request])[0]
        gen = torch.Generator(self.device).manual_seed(seed) if seed is not None else None
        stop, new, sent = set(self.tokenizer.stop_ids), [], ""
        steps = decoding(
            self.net,
            [ids.to(self.device)],
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            generator=gen,
            repetition_penalty=repetition_penalty,
        )
        for nxt in steps:
            if int(nxt[0]) in stop:
                break
            new.append(int(nxt[0]))
            text = self.tokenizer.decode(new)
            if text.startswith(sent) and not text.endswith("\ufffd") and len(text) > len(sent):
                yield text[len(sent) :]
                sent = text
        text = self.tokenizer.decode(new)
        if text.startswith(sent) and len(text) > len(sent):  # a last character left incomplete
            yield text[len(sent) :]

    def draft_net(self, draft: str | GPT | CausalLMModule) -> GPT | MTPDraft:
        """The draft's net: a checkpoint (read weights-only, once) or module whose tokenizer is this model's; "mtp":
        this net's own multi-token-prediction module (self-speculation)."""
        if isinstance(draft, GPT):
            return draft
        if draft == "mtp":
            return MTPDraft(self.net)
        if isinstance(draft, str):
            if draft not in self._drafts:
                module = CausalLMModule.load_from_checkpoint(readable(draft, "generation.draft"), self.device)
                self._check_draft_tokenizer(module, draft)
                self._drafts[draft] = module.net
            return self._drafts[draft]
        self._check_draft_tokenizer(draft, "the draft")
        return draft.net

    def _check_draft_tokenizer(self, draft: CausalLMModule, name: str) -> None:
        theirs, ours = draft.tokenizer, self.tokenizer
        if theirs is not None and ours is not None and theirs.to_dict() != ours.to_dict():
            raise InputError(
                f"generation.draft {name} has another tokenizer than the model's: a draft must propose the "
                f"model's own ids; pass a draft trained on the same tokenizer"
            )

    def on_predict_epoch_start(self) -> None:
        self._speculation = None

    def predict_step(self, batch: dict, batch_idx: int) -> dict[str, list[str]]:
        """Continue the batch's prompts as ``generation`` says (the batch's own, a served request's, else the
        model's); rows go to WritePredictions."""
        if self.tokenizer is None:  # predict without a checkpoint: the datamodule's (which encoded the prompts)
            self.tokenizer = getattr(self.trainer.datamodule, "tokenizer", None)
        g = Generation.of(batch.get("generation") or self.hparams.generation)  # hparams: a dict, as checkpoints have
        common = dict(
            temperature=g.temperature,
            top_k=g.top_k,
            top_p=g.top_p,
            stop_ids=self.tokenizer.stop_ids,
            generator=torch.Generator(self.device).manual_seed(g.seed + batch_idx),
            past_block_size=g.past_block_size,
        )
        if g.draft is None:
            penalty = g.repetition_penalty
            out = generate(self.net, batch["prompt_ids"], g.max_new_tokens, **common, repetition_penalty=penalty)
        else:
            draft = self.draft_net(g.draft)
            out, stats = speculative_generate(
                self.net, draft, batch["prompt_ids"], g.max_new_tokens, g.num_draft_tokens, **common
            )
            self._speculation = self._speculation or SpeculationStats()
            self._speculation.add(stats)
        return {"prompt": list(batch["text"]), "completion": [self.tokenizer.decode(o.tolist()) for o in out]}

    @property
    def predict_metrics(self) -> dict[str, float]:
        """What this predict measured beyond its outputs, for the application to log: speculative decoding's
        acceptance rate and tokens per target forward (none when it decoded plainly)."""
        s = self._speculation
        if s is None:
            return {}
        return {"predict/acceptance_rate": s.acceptance_rate, "predict/tokens_per_forward": s.tokens_per_forward}

    def on_predict_epoch_end(self) -> None:
        s = self._speculation
        if s is not None and self.trainer.is_global_zero:  # one line for the whole predict, not one per batch
            print(
                f"Speculative decoding: {s.accepted}/{s.proposed} draft tokens accepted "
                f"({s.acceptance_rate:.1%}), {s.tokens_per_forward:.2f} tokens per target forward"
            )

    # -- checkpoints -------------------------------------------------------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)  # the zoo version that wrote it (WeightsOnlyLoading)
        # The tokenizer travels with the weights, so load_from_checkpoint(path).generate("text") works alone.
        if self.tokenizer is not None:
            checkpoint["tokenizer"] = self.tokenizer.to_dict()
        drop_base(self, checkpoint)  # a LoRA fine-tune keeps its adapters; the base is init_weights'

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # The checkpoint's adapter keys meet adapted layers; a base left out is read again from init_weights.
        restore_base(self, checkpoint, self._load_base, lambda: adapt_module(self, self.hparams.adapt))
        if trainer_of(self) is None and "state_dict" in checkpoint:  # under a trainer, its precision decides
            dtype = dtypes.trained_dtype(self, checkpoint["state_dict"])
            if dtype is not None:  # trained under bf16-true: rebuilt in bf16 (load_state_dict would upcast it)
                self.to(dtype)
        if "state_dict" in checkpoint:  # absent in a sharded (FSDP2) resume: the shards load into the net directly
            check_compatible(self.net, extract_state_dict(checkpoint, "net."), "checkpoint")
        if "tokenizer" in checkpoint:
            self.tokenizer = tokenizer_from_dict(checkpoint["tokenizer"])
