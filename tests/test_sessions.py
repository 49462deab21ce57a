"""Sessions: a second turn computes only what the cache lacks and equals a cold run of the history; the history a
caller keeps (each turn's final chunk carries what it added) starts the session again wherever the engine's own
copy is missing or differs (a restart, a session let go, another replica), speaking as the session would."""

import pytest

from services.common.errors import FailedPrecondition, InvalidArgument
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


# ---- a history kept by the caller ----------------------------------------------------------------------------
def turn_kept(engine, text, history=None, session="s"):
    """Run one turn to its end, given the history its caller kept → (its sequence, its final chunk)."""
    seq = engine.make_sequence(GenerationRequest(
        text, GREEDY, ChunkSettings(), text=text, session_id=session,
        history_text_ids=history[0] if history else None, history_audio_ids=history[1] if history else None))
    engine.add(seq)
    final = None
    while engine.has_work():
        final = next((c for c in engine.step() if c.final and c.seq_id == seq.seq_id), final)
    return seq, final



def join(*turn_tokens):
    return [t for tt in turn_tokens for t in tt[0]], [a for tt in turn_tokens for a in tt[1]]


def test_each_turn_reports_what_it_added_to_the_history(model):
    engine = make_engine(model)
    _, first = turn_kept(engine, "Hello, who are you?")
    session = engine.sessions.sessions["s"]
    assert (session.text_ids, session.audio_ids) == first.turn_tokens  # the first turn: system prompt and all
    _, second = turn_kept(engine, "Tell me more.")
    assert (session.text_ids, session.audio_ids) == join(first.turn_tokens, second.turn_tokens)
    assert second.turn_tokens[0][-2:] == engine.turn_end[0]  # closed as the history keeps it
    _, plain = turn_kept(engine, "No session", session="")
    assert plain.turn_tokens is None


def test_another_engine_given_the_history_speaks_as_the_session_would(model):
    """Failover: the replica that held the session is gone; another one, given the history the caller kept,
    says exactly what the first would have (greedy), computing the history once."""
    engine = make_engine(model)
    _, first = turn_kept(engine, "Hello, who are you?")
    _, second = turn_kept(engine, "Tell me more.")
    expected, _ = turn_kept(engine, "And then?")

    other = make_engine(model)
    before = other.counters.prefill_tokens
    moved, _ = turn_kept(other, "And then?", history=join(first.turn_tokens, second.turn_tokens))
    assert generated(moved) == generated(expected)
    assert moved.text_ids[:moved.num_prompt] == expected.text_ids[:expected.num_prompt]
    assert other.counters.prefill_tokens - before == moved.num_prompt  # nothing was cached there


def test_the_same_copy_is_continued_with_its_blocks(model):
    engine = make_engine(model)
    _, first = turn_kept(engine, "Hello")
    blocks = list(engine.sessions.sessions["s"].block_table)
    before = engine.counters.prefill_tokens
    seq, _ = turn_kept(engine, "Go on.", history=first.turn_tokens)
    assert seq.num_prefilled == engine.counters.prefill_tokens - before < seq.num_prompt // 2  # the cache served the rest
    assert engine.sessions.sessions["s"].block_table[:len(blocks) - 1] == blocks[:-1]


def test_a_copy_that_differs_starts_again_from_the_callers(model):
    """The engine finished a turn its caller never saw end (the reply was cut off on the way): the caller's
    history, without that turn, wins; the common prefix comes from the cache."""
    engine = make_engine(model)
    _, first = turn_kept(engine, "Hello")
    turn_kept(engine, "A turn the caller lost")
    before = engine.counters.prefill_tokens
    seq, _ = turn_kept(engine, "Where were we?", history=first.turn_tokens)
    assert seq.text_ids[:len(first.turn_tokens[0])] == first.turn_tokens[0]
    assert seq.num_prompt < len(first.turn_tokens[0]) + 40  # the lost turn is not in the prompt
    assert engine.counters.prefill_tokens - before < seq.num_prompt  # the first turn's full blocks hit

    reference = make_engine(model)
    turn_kept(reference, "Hello")
    expected, _ = turn_kept(reference, "Where were we?")
    assert generated(seq) == generated(expected)


def test_a_session_let_go_comes_back_from_the_history(model):
    engine = make_engine(model)
    _, first = turn_kept(engine, "Hello")
    assert engine.close_session("s") and engine.block_manager.num_used == 0
    seq, _ = turn_kept(engine, "Still there?", history=first.turn_tokens)
    assert seq.text_ids[:len(first.turn_tokens[0])] == first.turn_tokens[0]
    assert seq.num_prefilled < seq.num_prompt  # freed blocks keep their contents: the prefix cache still had them


def test_a_history_is_checked_like_a_prompt(model):
    engine = make_engine(model, max_model_len=200)
    _, first = turn_kept(engine, "Hello")
    text, audio = first.turn_tokens

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
    assert request().history == (text, audio)


def test_a_history_for_a_session_whose_turn_runs_waits_its_turn(model):
    engine = make_engine(model)
    _, first = turn_kept(engine, "Hello")
    running = engine.make_sequence(GenerationRequest("t2", GREEDY, ChunkSettings(), text="Go on", session_id="s"))
    engine.add(running)
    engine.step()
    other = engine.make_sequence(GenerationRequest("t3", GREEDY, ChunkSettings(), text="Other", session_id="s",
                                                   history_text_ids=first.turn_tokens[0],
                                                   history_audio_ids=first.turn_tokens[1]))
    with pytest.raises(FailedPrecondition, match="session_id"):
        engine.add(other)
    assert engine.sessions.sessions["s"].busy and other.seq_id not in engine.sequences
    while engine.has_work():
        engine.step()
    assert running.finish_reason is not None
