"""The model: configuration and token ids, the PyTorch modules, checkpoints, tokenizer, prompts."""
