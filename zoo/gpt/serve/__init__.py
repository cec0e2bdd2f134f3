"""Serving a language model the way its users call it: an OpenAI-compatible HTTP server (``app``) over an engine that
decodes concurrent requests together (``engine``), requests checked field by field (``api``), chat prompts through
the model's template and tool calls out of its replies (``chat``), text streamed with stop sequences cut (``text``).

``python -m zoo.gpt serve <checkpoint | folder>``; ``python -m zoo.tracking serve models:/<name>/<version>``.
FastAPI and uvicorn (MLflow's own dependencies) are imported here only, when a server is built.
"""

from __future__ import annotations

from zoo.errors import InputError


def server_for(module, name: str, settings) -> tuple:
    """The FastAPI app serving ``module`` as ``name`` and its ``Limits``, from the command's ``settings`` (max_batch,
    max_queue, max_tokens_cap, max_prompt_tokens, max_n, timeout); a setting out of range is one InputError."""
    from zoo.gpt.serve.api import Limits
    from zoo.gpt.serve.app import Engine, make_app, served

    context = module.net.block_size
    caps = {"max_tokens_cap": context, "max_prompt_tokens": context - 1}
    for flag, most in caps.items():
        given = getattr(settings, flag)
        if given is not None and not 1 <= given <= most:
            raise InputError(f"--{flag.replace('_', '-')}={given} must be in 1..{most} (the model's context)")
    for flag in ("max_batch", "max_queue", "max_n"):
        if getattr(settings, flag) < 1:
            raise InputError(f"--{flag.replace('_', '-')}={getattr(settings, flag)} must be 1 or more")
    if not settings.timeout > 0:
        raise InputError(f"--timeout={settings.timeout} must be more than 0 seconds")
    limits = Limits(
        max_tokens=settings.max_tokens_cap or context,
        max_prompt=settings.max_prompt_tokens or context - 1,
        context=context,
        max_n=settings.max_n,
        timeout=settings.timeout,
    )
    engine = Engine(module.eval(), max_batch=settings.max_batch, max_queue=settings.max_queue, context=context)
    threads = settings.max_batch + settings.max_queue + 8
    return make_app(engine, served(module, name), limits, threads), limits
