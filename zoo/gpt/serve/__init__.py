"""Serving the GPT: the batched decoding engine (``engine.py``) that an HTTP layer drives."""
