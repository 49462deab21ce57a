"""Sessions with an llm that keeps none: each turn brings the session's history (its finished turns' turn_tokens,
which each turn's final chunk carries) and runs as one request; the last turn's blocks, pinned for the next, serve
it through the prefix cache (full blocks shared, the partly filled last one copied), so a later turn computes only
its new tokens and speaks as a cold run of its whole prompt, on this engine or any other."""

import pytest
import torch
from sessions import Sessions

from forcing import GREEDY as FORCED
from forcing import make_engine as forcing_engine
from services.common.errors import InvalidArgument
from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from services.llm.model.checkpoint import random_model
from services.llm.model.config import tiny_config
from services.llm.model.tokenizer import tiny_tokenizer

CFG = tiny_config()
GREEDY = SamplingSettings(temperature=0.0, repetition_penalty=1.0, max_new_tokens=20, min_new_tokens=0)


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, seed=4)


def make_engine(model, **kw):
    return LLMEngine(model, tiny_tokenizer(CFG), EngineConfig(**{"kv_cache_bytes": 1 << 22, **kw}))


def turn(engine, sessions, text, session="s", sampling=GREEDY, request_id=None, **kw):
    """One turn of the session, with the history `sessions` kept, run to its end → its sequence."""
    seq = sessions.add(engine, sessions.request(request_id or text, sampling, session, text=text, **kw))
    sessions.run(engine)
    return seq


def cold(model, seq):
    """The same prompt, token for token, on a fresh engine with no session."""
    engine = make_engine(model)
    p = seq.num_prompt
    fresh = engine.make_sequence(GenerationRequest("cold", seq.sampling, ChunkSettings(),
                                                   text_ids=seq.text_ids[:p], audio_ids=seq.audio_ids[:p]))
    engine.add(fresh)
    while engine.has_work():
        engine.step()
    return fresh


def generated(seq):
    return seq.text_ids[seq.num_prompt :], seq.audio_ids[seq.num_prompt :]


def computed_by(engine, run):
    """run() → (its result, the prompt positions the engine computed meanwhile)."""
    before = engine.counters.prefill_tokens
    out = run()
    return out, engine.counters.prefill_tokens - before


def test_second_turn_prefills_only_its_new_tokens(model):
    engine, sessions = make_engine(model), Sessions()
    first = turn(engine, sessions, "Hello, who are you?")
    history = sessions.history["s"]
    assert history[0][-2:] == engine.turn_end[0] and len(history[0]) > len(first)  # closed
    pinned = engine.pins.tables["s"]
    assert engine.block_manager.num_used == len(pinned) > 0  # kept warm for the next turn
    assert (len(first) - 1) % engine.block_manager.block_size  # (its last block partly filled: copied, not shared)

    second, computed = computed_by(engine, lambda: turn(engine, sessions, "Tell me more."))
    new_tokens = second.num_prompt - (len(first) - 1)  # the last sample of a turn is never fed back
    assert computed == new_tokens == second.num_prefilled
    alone = engine.make_sequence(GenerationRequest("x", GREEDY, ChunkSettings(), text="Tell me more."))
    turn_tokens = len(alone) - engine.prompts.build("Tell me more.", True, "").turn_start
    closing = len(history[0]) - len(first)  # "<|im_end|>\n", after an eosp row if cut off mid-speech
    assert new_tokens == 1 + closing + turn_tokens  # the last sample fed back, the closing, the new turn
    assert computed * 4 < second.num_prompt  # the history was not recomputed
    assert second.text_ids[: len(first)] == first.text_ids and second.audio_ids[: len(first)] == first.audio_ids
    assert generated(second) == generated(cold(model, second))

    assert engine.release_session("s") and engine.block_manager.num_used == 0
    assert not engine.release_session("s")


def test_turns_of_a_session_are_independent_requests(model):
    """Nothing of a session lives in the engine between turns: two turns of one session at once both run (the
    caller sends one at a time; the engine need not know), each as a cold run of its prompt; the one that ends
    last is what stays pinned."""
    engine, sessions = make_engine(model), Sessions()
    turn(engine, sessions, "Hello")
    a = sessions.add(engine, sessions.request("a", GREEDY, "s", text="First question"))
    b = sessions.add(engine, sessions.request("b", GREEDY, "s", text="Another question, longer"))
    sessions.run(engine)
    for seq in (a, b):
        assert seq.finish_reason is not None and generated(seq) == generated(cold(model, seq))
    assert len(engine.pins) == 1 and engine.release_session("s") and engine.block_manager.num_used == 0


def test_an_aborted_turn_frees_its_blocks_and_the_pin_stays(model):
    engine, sessions = make_engine(model), Sessions()
    first = turn(engine, sessions, "Hello")
    pinned = list(engine.pins.tables["s"])  # the history's blocks, the last one partly filled
    cached = len(first) - 1
    seq = sessions.add(engine, sessions.request("barge", GREEDY, "s", text="Interrupted"))
    engine.step()
    engine.step()
    assert engine.block_manager.num_used > len(pinned) > 0
    assert engine.abort(seq.seq_id)
    assert engine.block_manager.num_used == len(pinned) and engine.pins.tables["s"] == pinned  # the turn's own are free
    third, computed = computed_by(engine, lambda: turn(engine, sessions, "Where were we?"))
    assert third.text_ids[: len(first)] == first.text_ids
    assert computed <= third.num_prompt - cached  # (less: the aborted turn's full blocks, freed, still hit)
    assert generated(third) == generated(cold(model, third))


def test_pins_give_their_blocks_back_under_pressure(model):
    engine, sessions = make_engine(model, kv_cache_bytes=30 * 16 * CFG.kv_bytes_per_token), Sessions()
    turn(engine, sessions, "Hello", session="a")
    assert engine.block_manager.num_used > 0
    big = engine.make_sequence(GenerationRequest("big", GREEDY, ChunkSettings(), text="z" * 260))
    assert engine.block_manager.blocks_needed(len(big)) > engine.block_manager.num_free  # more than is free
    engine.add(big)
    while engine.has_work():
        engine.step()
    assert big.finish_reason is not None and engine.scheduler.num_preemptions == 0
    assert "a" not in engine.pins.tables  # reclaimed
    again = turn(engine, sessions, "Still there?", session="a")
    assert generated(again) == generated(cold(model, again))


def test_history_longer_than_the_context_is_refused(model):
    engine, sessions = make_engine(model, max_model_len=260), Sessions()
    turn(engine, sessions, "Hello")
    with pytest.raises(InvalidArgument, match="session history"):
        engine.make_sequence(sessions.request("long", GREEDY, "s", text="w" * 110))
    assert not engine.has_work() and len(engine.pins) == 1


def test_a_turn_queued_behind_a_request_that_needs_the_pinned_blocks(model):
    """The head of the queue needs blocks that a session's pin holds, and the session's next turn waits behind it:
    the pin gives them back, both run, and the turn speaks as a cold run (its history recomputed, mostly from
    the cache)."""
    engine, sessions = make_engine(model, kv_cache_bytes=30 * 16 * CFG.kv_bytes_per_token), Sessions()
    turn(engine, sessions, "Hello", session="s")
    big = engine.make_sequence(GenerationRequest("big", GREEDY, ChunkSettings(), text="q" * 280))
    engine.add(big)
    follow_up = sessions.add(engine, sessions.request("next", GREEDY, "s", text="And?"))
    assert engine.block_manager.blocks_needed(len(big)) > engine.block_manager.num_free
    for _ in range(500):
        if not engine.has_work():
            break
        sessions.step(engine)
    assert big.finish_reason is not None and follow_up.finish_reason is not None
    assert generated(follow_up) == generated(cold(model, follow_up))


def test_a_turn_cut_off_mid_speech_closes_its_audio_segment(model):
    engine, sessions = make_engine(model), Sessions()
    first = turn(engine, sessions, "Hello", sampling=SamplingSettings(temperature=0.0, max_new_tokens=8, min_new_tokens=8))
    history = sessions.history["s"]
    assert first.mode.value == "audio"
    end_text, end_audio = engine.turn_end
    assert history[0][len(first):] == [CFG.modality_pad_token_id, *end_text]
    assert history[1][len(first):] == [CFG.eosp_token_id, *end_audio]


@pytest.mark.parametrize("turn_ends", ["aborted", "finished"])
def test_a_session_released_while_its_turn_runs_pins_nothing(model, turn_ends):
    """A release can reach the engine before the cancel of the session's running turn (they come by different
    calls): the last turn's pin goes at once, and the running turn pins nothing, whether it is aborted or ends."""
    engine, sessions = make_engine(model), Sessions()
    turn(engine, sessions, "Hello")
    seq = sessions.add(engine, sessions.request("next", GREEDY, "s", text="And then?"))
    engine.step()
    assert engine.release_session("s") and not engine.pins.tables
    if turn_ends == "aborted":
        engine.abort(seq.seq_id)
    sessions.run(engine)
    assert not engine.pins.tables and engine.block_manager.num_used == 0
    assert not engine.release_session("s")


# ---- histories ------------------------------------------------------------------------------------------------
def test_each_turn_reports_what_it_added_to_the_history(model):
    engine, sessions = make_engine(model), Sessions()
    first = turn(engine, sessions, "Hello, who are you?")
    after_first = sessions.history["s"]
    assert after_first[0][: first.num_prompt] == first.text_ids[: first.num_prompt]  # the first turn: system turn and all
    second = turn(engine, sessions, "Tell me more.")
    assert second.text_ids[: len(after_first[0])] == after_first[0]  # its prompt: the history, then the turn
    added = sessions.history["s"][0][len(after_first[0]) :]
    assert added[: len(second) - len(after_first[0])] == second.text_ids[len(after_first[0]) :]  # its prompt and reply
    assert added[-2:] == engine.turn_end[0]  # closed as the history keeps it
    plain = engine.make_sequence(GenerationRequest("x", GREEDY, ChunkSettings(), text="No session"))
    engine.add(plain)
    final = [c for c in Sessions().run(engine) if c.final]
    assert final and final[0].turn_tokens is None


def test_another_engine_given_the_history_speaks_as_the_session_would(model):
    """Failover: the replica that ran the session is gone; another one, given the history the caller kept, says
    exactly what the first would have (greedy), computing the history once."""
    engine, sessions = make_engine(model), Sessions()
    turn(engine, sessions, "Hello, who are you?")
    turn(engine, sessions, "Tell me more.")
    history = sessions.history["s"]
    expected = turn(engine, sessions, "And then?")

    other, elsewhere = make_engine(model), Sessions()
    elsewhere.history["s"] = history
    moved, computed = computed_by(other, lambda: turn(other, elsewhere, "And then?"))
    assert generated(moved) == generated(expected)
    assert moved.text_ids[: moved.num_prompt] == expected.text_ids[: expected.num_prompt]
    assert computed == moved.num_prompt  # nothing was cached there


def test_the_pinned_blocks_serve_the_next_turn(model):
    """The next turn shares the pin's full blocks and starts from a copy of its partly filled last block."""
    engine, sessions = make_engine(model), Sessions()
    first = turn(engine, sessions, "Hello")
    pinned = list(engine.pins.tables["s"])
    full, part = divmod(len(first) - 1, engine.block_manager.block_size)
    seq = sessions.add(engine, sessions.request("go on", GREEDY, "s", text="Go on."))
    engine.step()
    assert part and seq.block_table[:full] == pinned[:full] and seq.block_table[full] != pinned[full]
    kv = engine.runner.kv_cache  # [blocks, layers, 2, heads, block_size, head_dim]
    torch.testing.assert_close(kv[seq.block_table[full]][..., :part, :], kv[pinned[full]][..., :part, :])
    sessions.run(engine)
    assert seq.num_prefilled < seq.num_prompt // 2  # the cache served the rest
    assert generated(seq) == generated(cold(model, seq))


def test_a_history_that_differs_from_the_pinned_turn_is_the_callers(model):
    """The engine finished a turn its caller never saw end (the reply was cut off on the way): the caller's
    history, without that turn, is the prompt; the common prefix comes from the cache."""
    engine, sessions = make_engine(model), Sessions()
    turn(engine, sessions, "Hello")
    first = sessions.history["s"]
    turn(engine, sessions, "A turn the caller lost")
    sessions.history["s"] = first
    seq, computed = computed_by(engine, lambda: turn(engine, sessions, "Where were we?"))
    assert seq.text_ids[: len(first[0])] == first[0]
    assert seq.num_prompt < len(first[0]) + 40  # the lost turn is not in the prompt
    assert computed < seq.num_prompt  # the first turn's full blocks hit

    reference, kept = make_engine(model), Sessions()
    turn(reference, kept, "Hello")
    expected = turn(reference, kept, "Where were we?")
    assert generated(seq) == generated(expected)


def test_a_released_session_comes_back_from_the_history(model):
    engine, sessions = make_engine(model), Sessions()
    first = turn(engine, sessions, "Hello")
    assert engine.release_session("s") and engine.block_manager.num_used == 0
    seq = turn(engine, sessions, "Still there?")
    assert seq.text_ids[: len(first)] == first.text_ids
    assert seq.num_prefilled < seq.num_prompt  # freed blocks keep their contents: the prefix cache still had them


def test_a_history_is_checked_like_a_prompt(model):
    engine, sessions = make_engine(model, max_model_len=200), Sessions()
    turn(engine, sessions, "Hello")
    text, audio = sessions.history["s"]

    def request(**kw):
        base = dict(text="Next", session_id="s", history_text_ids=text, history_audio_ids=audio)
        return engine.make_sequence(GenerationRequest("r", GREEDY, ChunkSettings(), **{**base, **kw}))

    for kw, field in [({"history_text_ids": text[:-1]}, "history.audio"),
                      ({"history_text_ids": [CFG.vocab_size] + text[1:]}, "history.text"),
                      ({"history_audio_ids": [-1] + audio[1:]}, "history.audio"),
                      ({"history_text_ids": [], "history_audio_ids": audio}, "history.text"),
                      ({"session_id": ""}, "history"),
                      ({"history_text_ids": text * 4, "history_audio_ids": audio * 4}, "text")]:
        with pytest.raises(InvalidArgument) as info:
            request(**kw)
        assert info.value.field == field, (kw.keys(), info.value)
    seq = request()
    assert seq.history_len == len(text) and seq.text_ids[: len(text)] == text


# ---- the kernel runner: the text branch left out while speaking -----------------------------------------------
def test_a_turn_after_speech_reuses_the_blocks_whose_text_kv_are_not_in_yet():
    """A reply that ends in speech leaves its blocks' text-branch K/V out (the kernel runner skips the text branch
    while speaking). The next turn still hits those blocks, partial last one included, computes only its new tokens,
    fills the text K/V in from the kept trunk outputs when it samples text, and says what a cold run says."""
    model = random_model(CFG, dtype=torch.float32, seed=26)
    runs = {}
    for skip in (True, False):
        engine, sessions = forcing_engine(model, "kernels", text_skip=skip, overlap=False), Sessions()
        # "3.": an audio reply that speaks to its token limit; then "1.": a text reply (forcing.py)
        first = turn(engine, sessions, "Hello there", request_id="3.0", sampling=FORCED, audio_reply=True)
        bm = engine.block_manager
        if skip:  # its speech's text K/V are not in: the known blocks say so
            assert min(bm.blocks[b].text_upto for b in engine.pins.tables["s"] if bm.blocks[b].tokens) < bm.block_size
        second = sessions.add(engine, sessions.request("1.1", FORCED, "s", text="Go on", audio_reply=False))
        filled = engine.runner.runner.filled_positions
        _, computed = computed_by(engine, lambda: sessions.run(engine))
        assert computed == second.num_prompt - (len(first) - 1)  # only the new tokens, as with the text branch kept
        if skip:
            assert engine.runner.runner.filled_positions > filled  # the text K/V filled in from the cache's blocks
        runs[skip] = generated(second)
    assert runs[True] == runs[False]
