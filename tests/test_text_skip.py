"""The kernel runner leaves the text branch (4 layers) out of decode steps in which every sequence speaks,
keeps each position's shared-trunk output, and computes the skipped text K/V in one pass before a
sequence next samples text. Tokens — the speech and the text after it, in later turns too — are those of
always computing both branches (float32; mode switches forced as in forcing.py)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from forcing import CFG, converse, make_engine
from services.llm.model.checkpoint import random_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_skipping_the_text_branch_while_speaking_changes_no_token():
    model = random_model(CFG, device=DEVICE, dtype=torch.float32, seed=23)
    both = make_engine(model, "kernels", text_skip=False, echo=0.0)  # the model's own logits decide the text
    skipping = make_engine(model, "kernels", text_skip=True, echo=0.0)
    assert converse(skipping) == converse(both)
    runner = skipping.runner.runner  # inside the forcing wrapper
    assert runner.skipped_steps > 0 and runner.filled_positions > 0
    assert both.runner.runner.skipped_steps == 0
    # Speech blocks join the prefix cache once their text K/V are filled in: the same blocks are hashed,
    # less those of a session whose reply ended in speech (filled when it next samples text).
    hashed, all_hashed = set(skipping.block_manager.hash_to_block), set(both.block_manager.hash_to_block)
    bs = skipping.block_manager.block_size
    pending = sum(s.num_cached // bs - s.text_kv_upto // bs for s in skipping.sessions.sessions.values())
    assert hashed <= all_hashed and len(all_hashed) - len(hashed) <= pending
    for engine in (both, skipping):
        for session in list(engine.sessions.sessions):
            assert engine.close_session(session)
        assert engine.block_manager.num_used == 0


def test_a_fill_recomputes_exactly_the_skipped_text_kv():
    """After a speaking stretch and a fill, the text-branch K/V in the pool equal those of a run that
    computed both branches every step (same positions, same blocks)."""
    model = random_model(CFG, device=DEVICE, dtype=torch.float32, seed=24)
    text_layers = slice(CFG.num_shared_layers, CFG.num_shared_layers + CFG.num_modality_layers)
    pools = []
    for skip in (False, True):
        engine = make_engine(model, "kernels", text_skip=skip, overlap=False)
        converse(engine, [["Hello there, how are you?"]])  # session s0: text, speech, text, speech, text
        session = engine.sessions.sessions["s0"]
        assert session.text_kv_upto == session.num_cached
        pools.append(engine.runner.runner.kv_cache[session.block_table][:, text_layers])
    torch.testing.assert_close(pools[1], pools[0], rtol=1e-4, atol=1e-5)


def test_a_session_given_its_history_elsewhere_speaks_as_it_would_have():
    """The kernel runner, text branch skipped while speaking: a session's third turn on another engine given the
    history its caller kept (each turn's turn_tokens), or on its own engine after it let the session go (the
    prefix cache serving what it still holds), is the turn the session would have spoken."""
    from forcing import GREEDY
    from services.common.sampling import ChunkSettings
    from services.llm.engine.engine import GenerationRequest

    model = random_model(CFG, device=DEVICE, dtype=torch.float32, seed=25)
    texts = ["Hello there, how are you?", "Tell me more.", "And then?"]

    def turn(engine, t, history=None):
        seq = engine.make_sequence(GenerationRequest(
            f"0.{t}", GREEDY, ChunkSettings(), text=texts[t], session_id="s0",  # "0": forced text, speech, text, ...
            history_text_ids=history[0] if history else None, history_audio_ids=history[1] if history else None))
        engine.add(seq)
        final = None
        while engine.has_work():
            final = next((c for c in engine.step() if c.final and c.seq_id == seq.seq_id), final)
        return (seq.text_ids[seq.num_prompt:], seq.audio_ids[seq.num_prompt:]), final.turn_tokens

    whole = make_engine(model, "kernels", text_skip=True)
    kept = [turn(whole, 0)[1], turn(whole, 1)[1]]
    expected, _ = turn(whole, 2)
    assert whole.runner.runner.skipped_steps > 0  # the turns spoke, and the text branch was left out
    history = ([t for tt in kept for t in tt[0]], [a for tt in kept for a in tt[1]])

    moved = make_engine(model, "kernels", text_skip=True)
    assert turn(moved, 2, history)[0] == expected
    assert whole.close_session("s0")
    hits = whole.block_manager.hit_tokens
    assert turn(whole, 2, history)[0] == expected
    assert whole.block_manager.hit_tokens > hits  # the history's blocks came from the cache
