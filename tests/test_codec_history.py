"""A stream's solved frames kept through the flow (codec/history.py): calls that solve only a stream's new frames
give what solving its whole window gives, when the history holds all of it; streams batched are each alone; slots
are taken, freed at the end, on a cancel, and a stream that finds none is decoded over its window (tiny-codec
layout, float32, random weights)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lanes import run_streams

from services.vocoder.codec.checkpoint import random_codec
from services.vocoder.codec.config import tiny
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.flow_state import FlowState
from services.vocoder.codec.voice import random_voice
from services.vocoder.loader import FlowOptions, load_vocoder
from services.vocoder.streamer import MelStreamer
from services.vocoder.worker import Job, Lanes, VocoderWorker

CPU = torch.device("cpu")
# The gateway's default chunks and its earlier ones, one token at a time, whole blocks, and a whole stream in one chunk
# (more frames than one call solves: several calls, block by block).
SCHEDULES = {"gateway": [8, 5, 10] + [20] * 10, "8-8-16": [8, 8, 16] + [20] * 10, "one-token": [1] * 60,
             "blocks": [5] * 12, "at once": [60]}


def codes(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1024, n).tolist()


def snr(got: torch.Tensor, want: torch.Tensor) -> float:
    return float(10 * torch.log10(want.pow(2).sum() / (got - want).pow(2).sum().clamp(min=1e-30)))


def decoder(flow, voices, **options) -> FlowTokenDecoder:
    d = FlowTokenDecoder(flow, CPU, **options)
    d.set_voices(voices)
    return d


def stream(d: FlowTokenDecoder, voice, tokens: list[int], schedule: list[int]):
    """A stream's mel chunk by chunk, then its end → (mel [80, n], last state)."""
    state, pieces, at = d.start(voice), [], 0
    for n in schedule:
        if at >= len(tokens):
            break
        mel, state = d.decode_chunks([(tokens[at : at + n], state)])[0]
        pieces.append(mel)
        at += n
    mel, state = d.decode_chunks([(None, state)])[0]
    return torch.cat([*pieces, mel], 1), state


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_history_of_the_whole_stream_is_the_offline_decode(flow, voices, schedule):
    """Every frame kept and every token in the encoder's window: the offline decode in streaming mode, exactly."""
    kept = decoder(flow, voices, max_context_tokens=1000, history_streams=2, history_frames=1000)
    window = decoder(flow, voices, max_context_tokens=1000, history_streams=0)
    assert kept.history is not None and window.history is None
    tokens = codes(60, seed=3)
    for voice in voices:
        offline = offline_mel(window, voice, tokens)
        mel, state = stream(kept, voice, tokens, SCHEDULES[schedule])
        assert mel.shape == offline.shape == (80, 240)
        assert state.slot == 0 and kept.history.held == 0                  # its slot freed with its last block
        torch.testing.assert_close(mel, offline, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_with_the_encoders_state_kept_the_default_window_decodes_the_whole_stream(flow, voices, schedule):
    """The encoder's state kept (encoder_state.py) and every frame kept: calls that run the encoder over their new
    tokens only give the offline decode in streaming mode, exactly, with the default 40-token window of context (the
    encoder reads every earlier position through its state; without it this decode is not exact)."""
    kept = decoder(flow, voices, history_streams=2, history_frames=1000, encoder_window=100)
    window = decoder(flow, voices, max_context_tokens=1000, history_streams=0)
    assert kept.history.encoder is not None and kept.max_context == 40
    tokens = codes(60, seed=3)
    for voice in voices:
        offline = offline_mel(window, voice, tokens)
        mel, state = stream(kept, voice, tokens, SCHEDULES[schedule])
        assert mel.shape == offline.shape == (80, 240)
        assert state.slot == 0 and kept.history.held == 0
        torch.testing.assert_close(mel, offline, atol=2e-5, rtol=1e-5)


def offline_mel(d: FlowTokenDecoder, voice, tokens: list[int]) -> torch.Tensor:
    """The whole stream in one decode over every token (a state of no stream: no history)."""
    return d.decode_chunks([(None, FlowState(voice, tuple(tokens)))])[0][0]


def test_the_default_ring_stays_close_to_the_window_decode(flow, voices):
    """40 kept frames (the default): a stream's later blocks read two chunks of it directly, older ones through
    them; against the reference's window of 40 tokens, both against the offline decode."""
    kept, window = decoder(flow, voices), decoder(flow, voices, history_streams=0)
    tokens = codes(60, seed=4)
    offline = offline_mel(kept, voices[0], tokens)
    with_history, _ = stream(kept, voices[0], tokens, SCHEDULES["gateway"])
    over_windows, _ = stream(window, voices[0], tokens, SCHEDULES["gateway"])
    torch.testing.assert_close(with_history[:, :40], offline[:, :40], atol=2e-5, rtol=1e-5)  # while the ring holds all
    assert snr(with_history, offline) > 20 and snr(over_windows, offline) > 20


@pytest.mark.parametrize("encoder_window", [0, 100])
def test_batched_history_rows_are_each_alone(flow, voices, encoder_window):
    """Streams of two voices at different points (a first call, mid-stream, several calls' worth) in one call; with
    the encoder's state kept too."""
    d = decoder(flow, voices, encoder_window=encoder_window)
    inputs = [(voices[0], codes(33, seed=1), [8, 8, 17]), (voices[1], codes(45, seed=2), [20, 25]),
              (voices[0], codes(12, seed=3), [12])]
    alone = [stream(d, v, t, s)[0] for v, t, s in inputs]
    states = [d.start(v) for v, _, _ in inputs]
    pieces = [[] for _ in inputs]
    for r in range(4):
        chunks, who = [], []
        for i, (_, tokens, schedule) in enumerate(inputs):
            if r < len(schedule):
                at = sum(schedule[:r])
                chunks.append((tokens[at : at + schedule[r]], states[i]))
            elif r == len(schedule):
                chunks.append((None, states[i]))
            else:
                continue
            who.append(i)
        for i, (mel, state) in zip(who, d.decode_chunks(chunks)):
            pieces[i].append(mel)
            states[i] = state
    assert len({s.slot for s in states}) == 3 and d.history.held == 0
    for got, want in zip(pieces, alone):
        torch.testing.assert_close(torch.cat(got, 1), want, atol=2e-5, rtol=1e-5)


def test_slots_run_out_then_streams_decode_over_their_window(flow, voices):
    d = decoder(flow, voices, history_streams=1)
    window = decoder(flow, voices, history_streams=0)
    first, second = d.start(voices[0]), d.start(voices[0])
    tokens = codes(16, seed=5)
    (_, first), (mel, second) = d.decode_chunks([(tokens, first), (tokens, second)])
    assert first.slot == 0 and second.slot == -1 and d.history.held == 1
    want = window.decode_chunks([(tokens, window.start(voices[0]))])[0][0]
    torch.testing.assert_close(mel, want, atol=2e-5, rtol=1e-5)
    # The first stream is cancelled: its slot is freed, and a new stream takes it.
    d.release(first)
    third = d.decode_chunks([(tokens, d.start(voices[1]))])[0][1]
    assert third.slot == 0 and d.history.held == 1
    # A chunk of the cancelled stream that was already queued: decoded over its window, its old slot untouched.
    late_mel, late = d.decode_chunks([(codes(10, seed=6), first)])[0]
    assert late.slot == -1 and late_mel.shape[1] > 0 and d.history.held == 1


def test_a_slot_is_freed_only_once_no_call_writes_it(flow, voices):
    """Let go while a call of its stream is being queued on another thread, or while the device still runs one (its
    event not yet complete): the slot stays held until both are over."""
    history = decoder(flow, voices, history_streams=2).history

    class Event:
        complete = False

        def query(self):
            return self.complete

    assert history.acquire(7) == 0 and history.acquire(8) == 1
    history.begin([7, 8])
    history.release(7)
    assert history.held == 2                                   # its call is still being queued
    event = Event()
    history.end([7, 8], event)
    assert history.held == 2                                   # queued, not yet run
    event.complete = True
    assert history.held == 1 and history.acquire(9) == 0       # freed, and taken again
    history.release(8)
    history.release(8)                                         # twice (its end, then its servicer): once freed
    assert history.held == 1 and history.free == [1]


def test_a_voice_without_a_prefix_or_blocks_across_chunks_keep_no_history(flow, voices):
    short = random_voice(tiny().flow, "short", prompt_tokens=7)          # no whole chunk before its look-ahead
    assert decoder(flow, [short]).history is None
    assert decoder(flow, voices, block_tokens=3).history is None          # 12 frames: not whole 20-frame chunks
    with pytest.raises(ValueError, match="history_streams"):
        FlowTokenDecoder(flow, CPU, history_streams=-1)


def test_cancelled_streams_free_their_slots_through_the_worker():
    """Streams let go mid-way (the servicer closes its streamer in every case): their slots come back."""
    v = load_vocoder(None, "tiny-codec", flow=FlowOptions(history_streams=2))
    history = v.decoder.history
    worker = VocoderWorker(v, max_wait=0.01)
    try:
        for round_ in range(3):
            streams = [MelStreamer(v) for _ in range(2)]
            for s in streams:
                worker.submit(Job(s, codes(12, seed=round_), None, 0.0)).result(timeout=60)
            assert history.held == 2
            for s in streams:
                s.close()                                                   # cancelled: no end
            worker.submit(Job(MelStreamer(v), codes(3), None, 0.0)).result(timeout=60)  # the next call collects
            assert history.held == 0
    finally:
        worker.stop()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs of history calls: needs a GPU")
@pytest.mark.parametrize("encoder_window", [0, 100])
def test_history_graphs_on_cuda_are_the_eager_calls(flow, voices, encoder_window):
    """bf16 on CUDA, with the kernels: a stream through captured graphs is the same stream eagerly (with the
    encoder's state kept too)."""
    device = torch.device("cuda")
    graphs = FlowTokenDecoder(random_codec(tiny(), 0)[0].eval(), device, encoder_window=encoder_window)
    eager = FlowTokenDecoder(random_codec(tiny(), 0)[0].eval(), device, graphs=False, encoder_window=encoder_window)
    for d in (graphs, eager):
        d.set_voices(voices)
    graphs.warm_up(voices, 4)
    assert any(key[3] for key in graphs.graphs), "no history graph was captured"
    tokens = codes(60, seed=7)
    got, _ = stream(graphs, voices[1], tokens, SCHEDULES["gateway"])
    want, _ = stream(eager, voices[1], tokens, SCHEDULES["gateway"])
    assert got.shape == want.shape and snr(got.float().cpu(), want.float().cpu()) > 30


def test_first_chunks_on_their_own_lane_are_each_stream_alone():
    """Two worker threads (worker.Lanes): first chunks on the lane's (its own graphs; on CUDA its own stream), the
    rest on the other, streams interleaved: each stream's samples are its samples alone, its history carried from
    one lane to the other, and every slot comes back."""
    v = load_vocoder(None, "tiny-codec", flow=FlowOptions(history_streams=4))
    inputs = [(codes(n, seed=n), schedule) for n, schedule in ((33, [8, 8, 17]), (28, [8, 20]), (9, [9]))]

    def alone(tokens, schedule):
        s = MelStreamer(v)
        pieces, at = [], 0
        for n in schedule:
            pieces.append(s.push(tokens[at : at + n]))
            at += n
        return np.concatenate([*pieces, s.flush()])

    want = [alone(t, s) for t, s in inputs]
    calls = {"playing": 0, "first": 0}
    lanes = Lanes(VocoderWorker(v, max_wait=0.01, on_batch=lambda n, s: calls.__setitem__("playing", calls["playing"] + 1)),
                  VocoderWorker(v.lane(), 4, max_wait=0.01, first_chunk_budget=0, name="vocoder-first-chunks",
                                on_batch=lambda n, s: calls.__setitem__("first", calls["first"] + 1)))
    try:
        outs = run_streams(lanes, v, inputs)
    finally:
        lanes.stop()
    for got, expected in zip(outs, want):
        np.testing.assert_allclose(got, expected, atol=1e-5)
    assert calls["first"] >= 1 and calls["playing"] >= 2
    assert v.decoder.history.held == 0
