"""The tiny model's engine, for test_engine.py and test_generation_rules.py: its config, greedy settings, an engine
over a small KV pool, and a run of requests to their end."""

from services.common.sampling import SamplingSettings
from services.llm.engine.engine import EngineConfig, LLMEngine
from services.llm.model.checkpoint import random_model
from services.llm.model.config import tiny_config
from services.llm.model.tokenizer import tiny_tokenizer

CFG = tiny_config()
GREEDY = SamplingSettings(temperature=0.0, repetition_penalty=1.0, max_new_tokens=40, min_new_tokens=0)


def tiny_model():
    """The tiny model with random weights (seed 3): each test file's module-scoped `model` fixture."""
    return random_model(CFG, seed=3)


def make_engine(model, **kw) -> LLMEngine:
    return LLMEngine(model, tiny_tokenizer(CFG), EngineConfig(**{"kv_cache_bytes": 1 << 22, "block_size": 16, **kw}))


def run(engine, requests):
    seqs = [engine.make_sequence(r) for r in requests]
    for s in seqs:
        engine.add(s)
    chunks = []
    while engine.has_work():
        chunks += engine.step()
    return seqs, chunks
