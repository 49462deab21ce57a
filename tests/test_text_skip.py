"""The kernel runner leaves the text branch (4 layers) out of decode steps in which every sequence speaks,
keeps each position's shared-trunk output, and computes the skipped text K/V in one pass before a
sequence next samples text. Tokens — the speech and the text after it, in later turns too — are those of
always computing both branches (float32; mode switches forced as in forcing.py)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from sessions import Sessions

from forcing import CFG, converse, make_engine
from services.common.sampling import ChunkSettings
from services.llm.engine.engine import GenerationRequest
from services.llm.model.checkpoint import random_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def ended_speaking(text_ids: list[int], audio_ids: list[int], reason) -> bool:
    """A reply (as converse gives it) whose last position was computed in audio mode: its sosp or a speech token."""
    return bool(text_ids) and (text_ids[-1] == CFG.sosp_token_id or audio_ids[-1] != CFG.audio_pad_token_id)


def test_skipping_the_text_branch_while_speaking_changes_no_token():
    model = random_model(CFG, device=DEVICE, dtype=torch.float32, seed=23)
    both = make_engine(model, "kernels", text_skip=False, echo=0.0)  # the model's own logits decide the text
    skipping = make_engine(model, "kernels", text_skip=True, echo=0.0)
    kept = {engine: Sessions() for engine in (both, skipping)}
    spoken = converse(skipping, sessions=kept[skipping])
    assert spoken == converse(both, sessions=kept[both])
    runner = skipping.runner.runner  # inside the forcing wrapper
    assert runner.skipped_steps > 0 and runner.filled_positions > 0
    assert both.runner.runner.skipped_steps == 0
    # Computed blocks are known to the prefix cache whether or not their text K/V are in (the same blocks), each
    # with how far they are in (text_upto). Never more than is in: those positions' text K/V equal the run that
    # computed both branches. Less only in a session one of whose replies ended speaking (by END_OF_SPEECH or
    # length: its last stretch was never filled in, nor by a next turn that began speaking); the others are complete.
    bm, bs = skipping.block_manager, skipping.block_manager.block_size
    assert set(bm.hash_to_block) == set(both.block_manager.hash_to_block)
    assert all(both.block_manager.blocks[b].text_upto == bs for b in both.block_manager.hash_to_block.values())
    text_layers = slice(CFG.num_shared_layers, CFG.num_shared_layers + CFG.num_modality_layers)
    pools = [engine.runner.runner.kv_cache[:, text_layers] for engine in (both, skipping)]
    for h, b in bm.hash_to_block.items():
        n = bm.blocks[b].text_upto
        torch.testing.assert_close(pools[1][b, ..., :n, :], pools[0][both.block_manager.hash_to_block[h], ..., :n, :],
                                   rtol=1e-4, atol=1e-5)
    for i, replies in enumerate(spoken):
        table = skipping.pins.tables[f"s{i}"]
        complete = [bm.blocks[b].text_upto == bs for b in table if bm.blocks[b].hash in bm.hash_to_block]
        if not any(ended_speaking(*reply) for reply in replies):
            assert all(complete), f"session s{i}"
        assert complete == sorted(complete, reverse=True), f"session s{i}: a gap, then complete blocks again"
    for engine in (both, skipping):
        kept[engine].release_all(engine)
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
        bm, table = engine.block_manager, engine.pins.tables["s0"]  # the turn's blocks, pinned for the next
        known = [bm.blocks[b] for b in table if bm.blocks[b].tokens is not None]
        assert len(known) >= len(table) - 1 and all(b.text_upto == len(b.tokens[0]) for b in known)  # all filled in
        pools.append(engine.runner.runner.kv_cache[table][:, text_layers])
    torch.testing.assert_close(pools[1], pools[0], rtol=1e-4, atol=1e-5)


def test_a_session_given_its_history_elsewhere_speaks_as_it_would_have():
    """The kernel runner, text branch skipped while speaking: a session's third turn on another engine given the
    history its caller kept (each turn's turn_tokens), or on its own engine after it released the session (the
    prefix cache serving what it still holds), is the turn the session would have spoken."""
    from forcing import GREEDY

    model = random_model(CFG, device=DEVICE, dtype=torch.float32, seed=25)
    texts = ["Hello there, how are you?", "Tell me more.", "And then?"]

    def turn(engine, t, sessions):
        # "0": forced text, speech, text, ...
        seq = sessions.add(engine, sessions.request(f"0.{t}", GREEDY, "s0", text=texts[t]))
        sessions.run(engine)
        return seq.text_ids[seq.num_prompt:], seq.audio_ids[seq.num_prompt:]

    whole, kept = make_engine(model, "kernels", text_skip=True), Sessions()
    turn(whole, 0, kept)
    turn(whole, 1, kept)
    history = kept.history["s0"]
    expected = turn(whole, 2, kept)
    assert whole.runner.runner.skipped_steps > 0  # the turns spoke, and the text branch was left out

    moved, elsewhere = make_engine(model, "kernels", text_skip=True), Sessions()
    elsewhere.history["s0"] = history
    assert turn(moved, 2, elsewhere) == expected
    assert whole.release_session("s0")
    hits = whole.block_manager.hit_tokens
    again = Sessions()
    again.history["s0"] = history
    assert turn(whole, 2, again) == expected
    assert whole.block_manager.hit_tokens > hits  # the history's blocks came from the cache


def test_a_spoken_turns_prefill_leaves_the_text_branch_out_and_says_the_same():
    """A spoken reply's prompt ends with sosp, so its first step samples audio: that step (a mixed step beside a
    speaking sequence, here) runs without the text branch, and no position of the prompt has its text K/V. A text
    turn after it in the session fills them in and says what a run that always computed both branches says."""
    from forcing import GREEDY

    model = random_model(CFG, device=DEVICE, dtype=torch.float32, seed=27)
    replies = {}
    for skip in (True, False):
        engine, sessions = make_engine(model, "kernels", text_skip=skip, overlap=False), Sessions()
        runner = engine.runner.runner
        other = engine.make_sequence(GenerationRequest("3.x", GREEDY, ChunkSettings(), text="already speaking"))
        engine.add(other)
        while other.num_steps < 2:
            engine.step()
        skipped = runner.skipped_steps
        spoken = sessions.add(engine, sessions.request("3.0", GREEDY, "s", text="Hello there"))
        engine.step()  # the spoken turn's prompt and the other sequence's next position in one packed step
        assert engine.last_step.prefill_tokens > 0 and spoken.num_steps == 1
        if skip:
            assert runner.skipped_steps == skipped + 1 and spoken.text_kv_upto == 0
        sessions.run(engine)
        filled = runner.filled_positions
        written = sessions.add(engine, sessions.request("1.1", GREEDY, "s", text="Go on", audio_reply=False))
        sessions.run(engine)
        if skip:
            assert runner.filled_positions >= filled + spoken.num_prompt  # the first turn's prompt among them
        replies[skip] = [(s.text_ids[s.num_prompt:], s.audio_ids[s.num_prompt:]) for s in (spoken, written)]
    assert replies[True] == replies[False]
