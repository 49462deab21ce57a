"""Sessions: a second turn computes only what the cache lacks and equals a cold run of the history."""

import pytest

from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.model.checkpoint import random_model
from services.llm.model.config import tiny_config
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from services.llm.model.tokenizer import tiny_tokenizer

CFG = tiny_config()
GREEDY = SamplingSettings(temperature=0.0, repetition_penalty=1.0, max_new_tokens=20, min_new_tokens=0)


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, seed=4)


def make_engine(model, **kw):
    return LLMEngine(model, tiny_tokenizer(CFG), EngineConfig(**{"kv_cache_bytes": 1 << 22, **kw}))


def turn(engine, text, session="s", request_id=None, sampling=GREEDY):
    seq = engine.make_sequence(GenerationRequest(request_id or text, sampling, ChunkSettings(), text=text, session_id=session))
    engine.add(seq)
    while engine.has_work():
        engine.step()
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


def test_second_turn_prefills_only_its_new_tokens(model):
    engine = make_engine(model)
    first = turn(engine, "Hello, who are you?")
    session = engine.sessions.sessions["s"]
    history_len = len(session.text_ids)
    assert session.text_ids[-2:] == engine.turn_end[0] and session.num_cached == len(first) - 1
    assert engine.block_manager.num_used == len(session.block_table) > 0  # kept warm

    before = engine.counters.prefill_tokens
    second = turn(engine, "Tell me more.")
    computed = engine.counters.prefill_tokens - before
    new_tokens = second.num_prompt - session_history_cached(first)
    assert computed == new_tokens == second.num_prefilled
    alone = engine.make_sequence(GenerationRequest("x", GREEDY, ChunkSettings(), text="Tell me more."))
    turn_tokens = len(alone) - alone.turn_start  # "<|im_start|>user\n...<|im_start|>assistant\n<sosp>"
    closing = history_len - len(first)  # "<|im_end|>\n", after an eosp row if cut off mid-speech
    assert new_tokens == 1 + closing + turn_tokens  # the last sample fed back, the closing, the new turn
    assert computed * 4 < second.num_prompt  # the history was not recomputed
    assert second.text_ids[: len(first)] == first.text_ids and second.audio_ids[: len(first)] == first.audio_ids
    assert generated(second) == generated(cold(model, second))

    assert engine.close_session("s") and engine.block_manager.num_used == 0


def session_history_cached(first_turn_seq):
    # the last sampled token of a turn is appended but never fed back: one position short
    return len(first_turn_seq) - 1


def test_a_session_runs_one_turn_at_a_time(model):
    engine = make_engine(model)
    engine.add(engine.make_sequence(GenerationRequest("t1", GREEDY, ChunkSettings(), text="first", session_id="s")))
    second = engine.make_sequence(GenerationRequest("t2", GREEDY, ChunkSettings(), text="second", session_id="s"))
    with pytest.raises(FailedPrecondition, match="session_id"):
        engine.add(second)
    assert second.block_table == [] and second.seq_id not in engine.sequences
    while engine.has_work():
        engine.step()
    engine.add(second)  # fine once the first turn is over


def test_aborted_turn_frees_its_blocks_and_keeps_the_history(model):
    engine = make_engine(model)
    first = turn(engine, "Hello")
    history = list(engine.sessions.sessions["s"].text_ids)
    cached = engine.sessions.sessions["s"].num_cached
    kept = len(engine.sessions.sessions["s"].block_table)  # the history's blocks, the last one partly filled
    seq = engine.make_sequence(GenerationRequest("barge", GREEDY, ChunkSettings(), text="Interrupted", session_id="s"))
    engine.add(seq)
    engine.step()
    engine.step()
    assert engine.block_manager.num_used > kept > 0
    assert engine.abort(seq.seq_id)
    session = engine.sessions.sessions["s"]
    assert engine.block_manager.num_used == len(session.block_table) == kept  # the turn's own blocks are free
    assert session.num_cached == cached and cached % engine.block_manager.block_size  # (a partial block was kept)
    assert session.text_ids == history and not session.busy
    before = engine.counters.prefill_tokens
    third = turn(engine, "Where were we?")
    assert third.text_ids[: len(history)] == history
    assert engine.counters.prefill_tokens - before == third.num_prompt - cached
    assert generated(third) == generated(cold(model, third))
    del first


def test_idle_sessions_give_their_blocks_back_under_pressure(model):
    engine = make_engine(model, kv_cache_bytes=30 * 16 * CFG.kv_bytes_per_token)
    turn(engine, "Hello", session="a")
    assert engine.block_manager.num_used > 0
    big = engine.make_sequence(GenerationRequest("big", GREEDY, ChunkSettings(), text="z" * 260))
    assert engine.block_manager.blocks_needed(len(big)) > engine.block_manager.num_free  # more than is free
    engine.add(big)
    while engine.has_work():
        engine.step()
    assert big.finish_reason is not None and engine.scheduler.num_preemptions == 0
    assert engine.sessions.sessions["a"].block_table == []  # reclaimed
    again = turn(engine, "Still there?", session="a")
    assert generated(again) == generated(cold(model, again))


def test_history_longer_than_the_context_is_refused(model):
    engine = make_engine(model, max_model_len=260)
    turn(engine, "Hello")
    long_turn = engine.make_sequence(GenerationRequest("long", GREEDY, ChunkSettings(), text="w" * 110, session_id="s"))
    with pytest.raises(InvalidArgument, match="session history"):
        engine.add(long_turn)
    assert not engine.sessions.sessions["s"].busy and not engine.has_work()


def test_a_waiting_turn_holding_blocks_cannot_block_the_queue(model):
    """The head of the queue needs blocks that a session turn queued behind it holds: they are taken
    back (and recomputed later from the cache) instead of both waiting forever."""
    engine = make_engine(model, kv_cache_bytes=30 * 16 * CFG.kv_bytes_per_token)
    turn(engine, "Hello", session="s")
    big = engine.make_sequence(GenerationRequest("big", GREEDY, ChunkSettings(), text="q" * 280))
    engine.add(big)
    follow_up = engine.make_sequence(GenerationRequest("next", GREEDY, ChunkSettings(), text="And?", session_id="s"))
    engine.add(follow_up)
    assert follow_up.block_table and engine.block_manager.blocks_needed(len(big)) > engine.block_manager.num_free
    for _ in range(500):
        if not engine.has_work():
            break
        engine.step()
    assert big.finish_reason is not None and follow_up.finish_reason is not None
    assert generated(follow_up) == generated(cold(model, follow_up))


def test_a_turn_cut_off_mid_speech_closes_its_audio_segment(model):
    engine = make_engine(model)
    first = turn(engine, "Hello", sampling=SamplingSettings(temperature=0.0, max_new_tokens=8, min_new_tokens=8))
    history = engine.sessions.sessions["s"]
    assert first.mode.value == "audio"
    end_text, end_audio = engine.turn_end
    assert history.text_ids[len(first):] == [CFG.modality_pad_token_id, *end_text]
    assert history.audio_ids[len(first):] == [CFG.eosp_token_id, *end_audio]


@pytest.mark.parametrize("turn_ends", ["aborted", "finished"])
def test_a_session_closed_while_its_turn_runs_goes_when_the_turn_ends(model, turn_ends):
    engine = make_engine(model)
    turn(engine, "Hello")
    seq = engine.make_sequence(GenerationRequest("next", GREEDY, ChunkSettings(), text="And then?", session_id="s"))
    engine.add(seq)
    engine.step()
    assert engine.close_session("s") and "s" in engine.sessions.sessions  # the turn still holds it
    if turn_ends == "aborted":
        engine.abort(seq.seq_id)
    while engine.has_work():
        engine.step()
    assert "s" not in engine.sessions.sessions and engine.block_manager.num_used == 0
    assert not engine.close_session("s")  # gone
