"""Voices added to a serving vocoder (codec/prefix.py's places, decoder.add_voice, TokenVocoder.add_voice): a voice
added later speaks as one given at the start, its streams on the fast path (the prompt prefix and a stream history);
a stream already playing in another voice is left as it was; a voice that cannot take a place (none free, or a prompt
shorter than the prefix) is decoded whole over its window, as it would be without the places; bad voices are refused.
The tiny codec on a CPU, float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.vocoder.codec.config import tiny
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.flow_state import FlowState
from services.vocoder.codec.voice import Voice, VoiceError, random_voice, save_voice
from services.vocoder.streamer import MelStreamer
from services.vocoder.vocoder import FlowOptions, load_vocoder

CPU = torch.device("cpu")


def codes(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1024, n).tolist()


def test_a_voice_added_later_reads_its_prefix_as_one_given_at_the_start(flow, voices):
    """Streams of both voices in one call: the decoder that was given the second voice later computes the same mel."""
    at_start = FlowTokenDecoder(flow, CPU, prefix_min_rows=1)
    at_start.set_voices(voices)
    later = FlowTokenDecoder(flow, CPU, prefix_min_rows=1)
    later.set_voices(voices[:1], capacity=len(voices))
    assert later.prefix.frames == at_start.prefix.frames and not later.prefix.covers(voices[1:])
    assert later.add_voice(voices[1]) and later.prefix.covers(voices)
    assert later.add_voice(voices[1])                                  # (twice: the same place)
    streams = [FlowState(v, tuple(codes(23, seed=i)), 0, 15) for i, v in enumerate(voices)]
    want = at_start.decode_chunks([([], s) for s in streams])
    got = later.decode_chunks([([], s) for s in streams])
    for (w, _), (g, _) in zip(want, got):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


def test_without_a_place_or_with_a_short_prompt_a_voice_is_solved_whole(flow, voices):
    full = FlowTokenDecoder(flow, CPU, prefix_min_rows=1)
    full.set_voices(voices[:1])                                         # one place, taken
    assert not full.add_voice(voices[1]) and not full.prefix.covers(voices[1:])
    long_first = FlowTokenDecoder(flow, CPU, prefix_min_rows=1)
    long_first.set_voices(voices[1:], capacity=3)                       # a prefix of 40 frames
    assert not long_first.add_voice(voices[0])                          # 10 tokens reach 20 of them
    whole = FlowTokenDecoder(flow, CPU)                                 # no prefix at all
    stream = FlowState(voices[0], tuple(codes(23, seed=5)), 0, 15)
    (want, _), = whole.decode_chunks([([], stream)])
    (got, _), = long_first.decode_chunks([([], stream)])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def voices_dir(tmp_path, *voices: Voice):
    d = tmp_path / "_".join(v.name for v in voices)
    for v in voices:
        save_voice(v, d)
    return d


def play(vocoder, voice: str, tokens: list[int], schedule: list[int], between=lambda i: None) -> np.ndarray:
    s = MelStreamer(vocoder, voice=voice)
    pieces, at = [], 0
    for i, n in enumerate(schedule):
        pieces.append(s.push(tokens[at : at + n]))
        at += n
        between(i)
    pieces.append(s.flush())
    s.close()
    return np.concatenate(pieces)


def test_a_voice_added_while_a_stream_plays_leaves_it_as_it_was_and_speaks_as_one_given_at_the_start(tmp_path):
    """The vocoder as served: a stream in voice `a` takes a history slot and plays; `b` is added between its chunks;
    `a`'s samples are those of a vocoder that never added a voice, and `b`'s stream, on the fast path (its history
    slot taken), those of a vocoder given `b` at the start."""
    cfg = tiny().flow
    a, b = random_voice(cfg, "a", prompt_tokens=10, seed=1), random_voice(cfg, "b", prompt_tokens=12, seed=2)
    live = load_vocoder(None, "tiny-codec", voices_dir=voices_dir(tmp_path, a))
    alone = load_vocoder(None, "tiny-codec", voices_dir=voices_dir(tmp_path, a))
    both = load_vocoder(None, "tiny-codec", voices_dir=voices_dir(tmp_path, a, b))
    tokens, schedule = codes(40, seed=7), [8, 12, 20]
    added = []

    def add_b(i):
        if i == 0:
            assert live.decoder.history.held == 1                      # `a` plays from its history slot
            added.append(live.add_voice(b))

    got_a = play(live, "a", tokens, schedule, add_b)
    assert added == [True] and "b" in live.voice_names()
    # (to 1e-6: a voice's prefix or first-call lefts left unwritten moves these samples by ~5e-5 of ~0.09)
    np.testing.assert_allclose(got_a, play(alone, "a", tokens, schedule), atol=1e-6)
    slots = []
    got_b = play(live, "b", tokens, schedule, lambda i: slots.append(live.decoder.history.held))
    assert max(slots) == 1                                             # `b` on the fast path too (a slot once it
                                                                       # has a first block: 8 tokens and 3 ahead)
    np.testing.assert_allclose(got_b, play(both, "b", tokens, schedule), atol=1e-6)
    assert live.decoder.history.held == 0


def test_bad_voices_are_refused_and_the_places_are_sized_by_max_voices(tmp_path):
    cfg = tiny().flow
    a = random_voice(cfg, "a", prompt_tokens=10, seed=1)
    live = load_vocoder(None, "tiny-codec", voices_dir=voices_dir(tmp_path, a), flow=FlowOptions(max_voices=2))
    assert live.decoder.prefix.capacity == 2
    with pytest.raises(VoiceError, match="exists"):
        live.add_voice(random_voice(cfg, "a", prompt_tokens=10, seed=3))
    bad = Voice("c", torch.tensor([1, 2, 3]), torch.zeros(5, cfg.output_size), torch.zeros(cfg.spk_embed_dim))
    with pytest.raises(VoiceError, match="prompt_mel"):
        live.add_voice(bad)
    assert live.voice_names() == ["a"]
    assert live.add_voice(random_voice(cfg, "b", prompt_tokens=10, seed=4))
    assert not live.add_voice(random_voice(cfg, "c", prompt_tokens=10, seed=5))  # no place left: solved whole
    assert live.voice_names() == ["a", "b", "c"]
    assert load_vocoder(None, "tiny-codec", voices_dir=voices_dir(tmp_path, a)).decoder.prefix.capacity == 5
    with pytest.raises(VoiceError, match="no voice"):
        load_vocoder(None, "tiny").add_voice(a)
