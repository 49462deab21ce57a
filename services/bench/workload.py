"""What the bench sends: prompts (built in, or a file of lines) and when (fixed concurrency or Poisson)."""

from __future__ import annotations

import random
from pathlib import Path

# Built-in prompts: a voice assistant's typical turns, about 100-250 tokens of prompt each once the gateway
# has wrapped them in the chat template.
PROMPTS = (
    "Good morning! I'm planning a day trip to the coast this Saturday with two friends. Could you suggest a "
    "relaxed schedule that includes a walk along the cliffs, a seafood lunch somewhere with a view, and a quiet "
    "place to watch the sunset before we drive home?",
    "Explain in a friendly way how a heat pump can warm a house in winter when the air outside is colder than "
    "the air inside. Use an everyday comparison, keep it short enough to say out loud, and end with one tip on "
    "running it efficiently.",
    "I just adopted a rescue dog who is nervous around strangers and loud noises. What are three gentle things "
    "I can do during the first week to help her feel safe at home, and what should I avoid doing even if it "
    "seems kind?",
    "Tell me a short bedtime story about a lighthouse keeper and a lost seagull who becomes her friend. It "
    "should be calm, a little funny, and end with both of them watching the ships come home in the evening.",
    "My team keeps missing deadlines because tasks are unclear. Give me a simple way to run a fifteen-minute "
    "Monday meeting that makes every task, owner and due date clear, and say what I should write down at the end.",
    "What's the difference between weather and climate? Answer as if you were talking to a curious ten-year-old "
    "on a rainy afternoon, and give one example of each that they could notice from their own window.",
    "Walk me through making a simple tomato soup from scratch for four people. Mention what to buy, how long each "
    "step takes, and one way to make it feel special without much extra effort.",
    "I'm nervous about a job interview tomorrow for a librarian position. Can you help me prepare a warm, honest "
    "answer to the question about why I want to work with the public, in about four sentences?",
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
