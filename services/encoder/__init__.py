"""The encoder stage: user speech → the audio codes the llm reads (the GLM-4-Voice tokenizer's Whisper-VQ encoder)."""
