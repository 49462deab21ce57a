"""Pacing in the llm engine (EngineConfig.max_audio_lead): steps are held while every stream has enough
audio sent ahead of its listener, the tokens are those of an unpaced run, and a new request ends a hold
at once. The first-audio hold (first_audio_window, first_audio_hold) likewise, for a while after a stream's first
window is sent. Bounds are one-sided where time is involved: a slow machine only makes the lead smaller."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.common.sampling import ChunkSettings, SamplingSettings
from services.llm.async_engine import AsyncEngine
from services.llm.engine.engine import EngineConfig, GenerationRequest, LLMEngine
from services.llm.engine.pacing import hold_for
from services.llm.model.checkpoint import random_model
from services.llm.model.config import tiny_config
from services.llm.model.tokenizer import tiny_tokenizer
from services.llm.sequence import Mode

CFG = tiny_config()
TOKENS = 40
SPEECH = SamplingSettings(temperature=0.0, repetition_penalty=1.0, max_new_tokens=TOKENS, min_new_tokens=TOKENS)
CHUNKS = ChunkSettings(first_chunk_tokens=2, chunk_tokens=5)
HOLD = 5.0  # first_audio_hold, seconds: the first-audio hold test


@pytest.fixture(scope="module")
def model():
    return random_model(CFG, seed=3)


def make_engine(model, **kw) -> LLMEngine:
    return LLMEngine(model, tiny_tokenizer(CFG), EngineConfig(kv_cache_bytes=1 << 22, block_size=16, **kw))


def request(name: str, text: str = "Say something long.") -> GenerationRequest:
    return GenerationRequest(name, SPEECH, CHUNKS, text=text)


def test_audio_lead_counts_audio_sent_in_chunks_from_the_first_audio_token(model):
    engine = make_engine(model)
    seq = engine.make_sequence(request("a"))
    assert seq.mode is Mode.AUDIO and seq.audio_lead(0.0, 0.08) is None  # speaking, but nothing yet
    for token in (5, 6, 7):
        seq.append_sampled(token, CFG, now=10.0)
    assert seq.audio_lead(10.0, 0.08) == pytest.approx(0.0)  # three tokens made, none sent yet
    seq.take_chunk()  # the first chunk: 2 tokens... of the 3 pending, all go
    assert seq.audio_lead(10.1, 0.08) == pytest.approx(3 * 0.08 - 0.1)
    seq.append_sampled(CFG.eosp_token_id, CFG, now=10.2)  # the end of speech: no longer speaking
    assert seq.audio_lead(10.2, 0.08) is None


def test_a_listener_who_plays_faster_has_less_lead(model):
    """ChunkPolicy.playback_speed (HTTP's `speed`): a token lasts 80 ms / speed for the listener."""
    engine = make_engine(model)
    seq = engine.make_sequence(GenerationRequest("a", SPEECH, ChunkSettings(first_chunk_tokens=2, playback_speed=2.0),
                                                 text="Say something long."))
    for token in (5, 6, 7, 8):
        seq.append_sampled(token, CFG, now=10.0)
    seq.take_chunk()
    assert seq.audio_lead(10.1, 0.08) == pytest.approx(4 * 0.08 / 2 - 0.1)


def paced_run(engine: LLMEngine, seq, on_step=lambda: None) -> float:
    """Drive the engine as async_engine.py does, sleeping through holds → seconds held in all."""
    engine.add(seq)
    held = 0.0
    while engine.has_work():
        if (hold := engine.hold_seconds()) > 0:
            time.sleep(hold)
            held += hold
            continue
        engine.step()
        on_step()
    return held


def test_a_paced_stream_keeps_its_lead_near_the_bound_and_its_tokens(model):
    token_seconds, bound = 0.02, 0.1  # 40 tokens: 0.8 s of audio
    unpaced = make_engine(model)
    reference = unpaced.make_sequence(request("ref"))
    paced_run(unpaced, reference)
    assert unpaced.hold_seconds() == 0.0

    engine = make_engine(model, max_audio_lead=bound, audio_token_seconds=token_seconds)
    seq = engine.make_sequence(request("paced"))
    leads = []
    start = time.perf_counter()
    held = paced_run(engine, seq, lambda: leads.append(seq.audio_lead(time.perf_counter(), token_seconds)))
    stepping = time.perf_counter() - start - held
    assert seq.audio_ids == reference.audio_ids  # pacing changes when, never what
    # It held for what the steps did not take of the audio, less what may run ahead (one-sided: a loaded
    # machine steps slower and holds less; unloaded, ~0.5 s of the 0.8 s are held).
    slack = bound + 2 * CHUNKS.chunk_tokens * token_seconds
    assert held >= TOKENS * token_seconds - slack - stepping - 0.05, (held, stepping)
    assert held > 0 or stepping > TOKENS * token_seconds - slack
    # From the first audio token to the last, at least the audio less what may run ahead (the bound, a chunk).
    assert seq.last_token - seq.first_audio >= TOKENS * token_seconds - bound - 2 * CHUNKS.chunk_tokens * token_seconds
    # Never more ahead than the bound plus what one step can add: a chunk, and a step launched ahead.
    assert max(lead for lead in leads if lead is not None) <= bound + 2 * CHUNKS.chunk_tokens * token_seconds
    assert engine.block_manager.num_used == 0


def test_no_hold_while_a_request_waits_or_a_stream_is_not_speaking(model):
    engine = make_engine(model, max_audio_lead=0.01, audio_token_seconds=10.0)  # any audio sent is far ahead
    seq = engine.make_sequence(request("speaking"))
    engine.add(seq)
    while seq.chunks_sent == 0:
        engine.step()
    while engine.inflight is not None:  # the step launched ahead lands (a hold never leaves one in flight)
        engine.step()
    assert engine.hold_seconds() > 1.0
    text = engine.make_sequence(GenerationRequest("text", SPEECH, CHUNKS, text="hi", audio_reply=False))
    engine.add(text)
    assert engine.hold_seconds() == 0.0  # waiting for admission
    engine.step()
    assert text.mode is Mode.TEXT and engine.hold_seconds() == 0.0  # running, not speaking
    engine.abort(text.seq_id)
    engine.abort(seq.seq_id)
    assert engine.block_manager.num_used == 0


def test_a_new_request_ends_a_hold_at_once(model):
    """The first stream is held for seconds; a request sent meanwhile gets its first chunk well before."""
    engine = make_engine(model, max_audio_lead=0.05, audio_token_seconds=2.0)  # a 2-token chunk: 4 s ahead
    held = []
    driver = AsyncEngine(engine, on_hold=held.append)
    driver.start()

    async def scenario() -> float:
        first = driver.generate(engine.make_sequence(request("held")))
        await first.__anext__()  # its first chunk: from here on the engine holds for ~4 s
        await asyncio.sleep(0.2)
        sent = time.perf_counter()
        second = driver.generate(engine.make_sequence(request("new", text="Another one.")))
        await second.__anext__()
        latency = time.perf_counter() - sent
        await first.aclose()
        await second.aclose()
        return latency

    try:
        latency = asyncio.run(asyncio.wait_for(scenario(), 30))
        assert latency < 2.0  # not the ~4 s hold
        assert held and sum(held) > 0.1
        deadline = time.monotonic() + 5
        while engine.block_manager.num_used and time.monotonic() < deadline:  # the aborts reach the engine thread
            time.sleep(0.01)
        assert engine.block_manager.num_used == 0
    finally:
        driver.stop()


def test_a_stream_whose_first_audio_window_is_out_holds_steps_for_the_first_audio_hold(model):
    """first_audio_window 4 (two 2-token chunks), hold 5 s (long beside the steps it spans, on a loaded machine
    too), no pacing: no hold before the window is out, at most 5 s once it is, none after; a second stream that has
    not sent its window yet ends the hold; the tokens are an unheld run's."""
    unheld = make_engine(model)
    reference = unheld.make_sequence(request("ref"))
    paced_run(unheld, reference)

    engine = make_engine(model, first_audio_window=4, first_audio_hold=HOLD)
    seq = engine.make_sequence(request("held"))
    engine.add(seq)
    while seq.audio_sent < 4:
        assert engine.hold_seconds() == 0.0
        engine.step()
    while engine.inflight is not None:  # the step launched ahead lands (a hold never leaves one in flight)
        engine.step()
    assert seq.window_sent is not None and 0.0 < engine.hold_seconds() <= HOLD
    other = engine.make_sequence(request("other", text="Another one."))
    engine.add(other)
    assert engine.hold_seconds() == 0.0  # waiting for admission
    engine.step()
    assert other.window_sent is None  # running, its own first window not out yet: it cannot wait
    assert hold_for(engine.scheduler.running, time.perf_counter(), 0.0, 0.08, HOLD) == 0.0
    assert hold_for([seq], time.perf_counter(), 0.0, 0.08, HOLD) > 0.0
    engine.abort(other.seq_id)
    while engine.inflight is not None:
        engine.step()
    assert engine.hold_seconds() == pytest.approx(seq.window_sent + HOLD - time.perf_counter(), abs=0.05)
    assert engine.hold_seconds(now=seq.window_sent + HOLD + 0.01) == 0.0  # the hold is over
    while not seq.finished:
        engine.step()
    while engine.inflight is not None:
        engine.step()
    assert seq.audio_ids == reference.audio_ids  # a hold changes when, never what
    assert engine.block_manager.num_used == 0
