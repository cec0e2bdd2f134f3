"""What comes from outside and goes back out: weights and checkpoints read weights-only, stored configs checked
against the allowlist, hyperparameters that rebuild a module, tokenizers, new inputs for a trained model."""
