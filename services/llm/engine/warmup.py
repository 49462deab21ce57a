"""Synthetic turns through the engine before it serves.

Graph capture covers the forward passes, but not the first use of everything around them: a kernel
specialisation Triton compiles on first call, a cuBLAS kernel loaded lazily for a new shape, the first
prefill that hits the prefix cache, the first step mixing several prefills with decodes. Each cost the
first real requests to meet it 200-300 ms on an H200 (docs/benchmarks.md, the capacity sweeps: a burst of
streams all late together). These turns meet them first: batches of 1, 2, 4, 16 and 33 streams (sizes
Triton specialises on: 1, not a multiple of 16, a multiple of 16), prefix hits from the second round on, a
text reply beside the audio ones, each sequence a few decode steps long.
"""

from __future__ import annotations

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import EngineCounters, GenerationRequest, LLMEngine

ROUNDS = (1, 2, 4, 16, 33)
USER_TURN = "Warm-up: say a short sentence about the weather, please."


def warm_up(engine: LLMEngine, rounds=ROUNDS, new_tokens: int = 6) -> int:
    """Run the rounds to completion (each capped to the engine's max_num_seqs) → sequences run. Leaves no
    sequence, KV block in use or counter behind: only cached prompt blocks, which are evictable."""
    sampling = SamplingSettings(max_new_tokens=new_tokens, min_new_tokens=new_tokens, seed=0)
    ran = 0
    for size in rounds:
        size = min(size, engine.config.max_num_seqs)
        seqs = [engine.make_sequence(GenerationRequest(f"warm-up-{ran + i}", sampling, ChunkSettings(), text=USER_TURN,
                                                       audio_reply=i != 1))
                for i in range(size)]
        for seq in seqs:
            engine.add(seq)
        while engine.has_work():
            engine.step()
        ran += size
    engine.counters = EngineCounters()
    return ran
