"""Synthetic turns through the engine before it serves.

Graph capture covers the forward passes, but not the first use of everything around them (kernels compiled
or loaded on first call for a new shape or specialisation, the first prefill that hits the prefix cache, the
first step mixing several prefills with decodes). In the H200 capacity sweeps the first requests to prefill
together paid 314-328 ms once; these turns removed that (docs/benchmarks.md). They run batches of 1, 2, 4, 16
and 33 streams (one, a few, a multiple of 16 and not), with prefix hits from the second turn on and a text
reply beside the audio ones, each a few decode steps long. Then streams join a batch that is already
decoding, 1, 3 and 13 at a time (STAGGERED): steps that mix prefills with decodes. The rounds above never
mix them, and in the H200 sweeps the first such step in service (13 prefills and 1 decode) took 265 ms.
"""

from __future__ import annotations

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import GenerationRequest, LLMEngine
from services.llm.engine.stats import EngineCounters

ROUNDS = (1, 2, 4, 16, 33)
STAGGERED = (1, 3, 13)
USER_TURN = "Warm-up: say a short sentence about the weather, please."


def warm_up(engine: LLMEngine, rounds=ROUNDS, staggered=STAGGERED, new_tokens: int = 6) -> int:
    """Run the rounds to completion (each capped to the engine's max_num_seqs), then the staggered joins
    → sequences run. Leaves no sequence, KV block in use or counter behind: only cached prompt blocks,
    which are evictable."""
    sampling = SamplingSettings(max_new_tokens=new_tokens, min_new_tokens=new_tokens, seed=0)
    ran = 0

    def add(size: int) -> None:
        nonlocal ran
        for i in range(min(size, engine.config.max_num_seqs - len(engine.sequences))):
            engine.add(engine.make_sequence(GenerationRequest(f"warm-up-{ran}", sampling, ChunkSettings(), text=USER_TURN,
                                                              audio_reply=i != 1)))
            ran += 1

    for size in rounds:
        add(size)
        while engine.has_work():
            engine.step()
    long = SamplingSettings(max_new_tokens=new_tokens * 4, min_new_tokens=new_tokens * 4, seed=0)
    engine.add(engine.make_sequence(GenerationRequest(f"warm-up-{ran}", long, ChunkSettings(), text=USER_TURN)))
    ran += 1
    for size in staggered:  # each group joins while the ones before it decode
        engine.step()
        engine.step()
        add(size)
    while engine.has_work():
        engine.step()
    if engine.share is not None:  # (its rounds of 4 and more ran on the share: the engine's thread starts whole)
        engine.share.home()
    engine.counters = EngineCounters()
    return ran
