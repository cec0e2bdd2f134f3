"""Training parts shared by the families: the AdamW + warmup-cosine optimizer, gradient norms, FSDP2, logging steps."""
