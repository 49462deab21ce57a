"""What the bench sends: prompts (built in, or a file of lines) and when (fixed concurrency or Poisson)."""

from __future__ import annotations

import random
from pathlib import Path

# Built-in prompts: a voice assistant's typical turns, 100-250 tokens of prompt each once the gateway has wrapped
# them in the chat template (205-227 with the random-weight preset's byte-level tokenizer; a trained BPE
# tokenizer makes them shorter).
PROMPTS = (
    "I'm planning a day trip to the coast on Saturday. Suggest a relaxed schedule with a cliff walk and a sunset.",
    "Explain how a heat pump warms a house when the air outside is colder than inside, in a way I can say aloud.",
    "I just adopted a nervous rescue dog. What are three gentle things I can do in the first week to help her?",
    "Tell me a short, calm bedtime story about a lighthouse keeper and a lost seagull who becomes her friend.",
    "My team keeps missing deadlines. How do I run a fifteen-minute Monday meeting that makes every task clear?",
    "What's the difference between weather and climate? Answer as if talking to a curious ten-year-old.",
    "Walk me through a simple tomato soup for four people, and one way to make it feel special.",
    "I have a librarian job interview tomorrow. Help me answer why I want to work with the public, in four sentences.",
)


def load_prompts(path: str | None) -> list[str]:
    """The built-in prompts, or one prompt per non-empty line of a UTF-8 file."""
    if path is None:
        return list(PROMPTS)
    lines = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    prompts = [line for line in lines if line]
    if not prompts:
        raise ValueError(f"{path}: no prompts (one per non-empty line)")
    return prompts


def poisson_arrivals(rate: float, count: int, seed: int = 0) -> list[float]:
    """`count` arrival offsets (seconds from the start) of a Poisson process of `rate` requests per second."""
    if rate <= 0:
        raise ValueError(f"arrival rate must be > 0 requests/s, got {rate}")
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        out.append(t)
    return out
