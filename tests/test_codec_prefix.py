"""The voices' prompt prefix solved once (codec/prefix.py): calls that skip it give the mel of calls that solve it
(float32, tiny-codec layout), for several voices of different prompt lengths batched together."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from services.vocoder.codec.checkpoint import random_codec
from services.vocoder.codec.config import tiny
from services.vocoder.codec.decoder import FlowTokenDecoder
from services.vocoder.codec.flow_state import FlowState
from services.vocoder.codec.prefix import PromptPrefix, prefix_frames
from services.vocoder.codec.voice import random_voice

CPU = torch.device("cpu")


def codes(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1024, n).tolist()


def decoders(flow, voices):
    """The same flow twice: solving every prompt frame, and skipping the voices' common prefix."""
    whole, skipping = FlowTokenDecoder(flow, CPU), FlowTokenDecoder(flow, CPU, prefix_min_rows=1)
    skipping.set_voices(voices)
    return whole, skipping


def test_prefix_is_the_prompts_chunks_that_no_later_token_reaches(flow, voices):
    # tiny: attention chunks of 20 frames (5 tokens), the encoder's of 5 tokens, 3 tokens of look-ahead
    assert prefix_frames(flow, voices) == 20                      # the shortest prompt: 10 tokens, (10 - 3) // 5 * 5
    assert prefix_frames(flow, voices[1:]) == 40                  # 17 tokens: two whole chunks before the last 3
    short = random_voice(tiny().flow, "short", prompt_tokens=7)
    assert prefix_frames(flow, [short]) == 0 and not PromptPrefix(flow, [short])
    two_levels = dataclasses.replace(tiny(), flow=dataclasses.replace(
        tiny().flow, estimator=dataclasses.replace(tiny().flow.estimator, channels=(32, 32))))
    with pytest.raises(ValueError, match=r"channels \[32, 32\]: one U-Net level"):  # a strided level reads ahead
        random_codec(two_levels, 0)


def test_a_free_place_is_run_through_once_at_the_start_and_a_voice_added_there_is_its_own(flow, voices):
    """With room for voices added while serving, the first free place has the flow run over a stand-in of an odd
    prompt length at the start (the kernels' shapes for such a length made then, not while calls wait on the voice's
    recording); it stays free, and a voice added there records exactly what it records at the start."""
    prefix = PromptPrefix(flow, voices[:1], capacity=3)
    assert prefix.voices == voices[:1] and len(prefix.index) == 1
    assert prefix.keys[0][:, 2:4].abs().sum() > 0 and prefix.keys[0][:, 4:].abs().sum() == 0  # (place 1 run, 2 not)
    assert prefix.add(flow, voices[1])
    alone = PromptPrefix(flow, voices[:2])
    for got, want in zip(prefix.keys + prefix.values + prefix.lefts, alone.keys + alone.values + alone.lefts):
        torch.testing.assert_close(got[:, :4], want, atol=0, rtol=0)


@pytest.mark.parametrize("window", [11, 23, 40])
def test_skipping_the_prefix_gives_the_same_mel(flow, voices, window):
    """Streams of both voices in one call, at their first block, mid-stream and with a full window."""
    whole, skipping = decoders(flow, voices)
    assert skipping.prefix is not None and skipping.prefix.frames == 20
    streams = [FlowState(v, tuple(codes(window, seed=i)), 0, 0 if window == 11 else window - 8)
               for i, v in enumerate(voices)]
    want = whole.decode_chunks([([], s) for s in streams])
    got = skipping.decode_chunks([([], s) for s in streams])
    for (w, ws), (g, gs) in zip(want, got):
        assert g.shape == w.shape and w.shape[1] > 0
        assert gs == ws
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


def test_a_whole_stream_with_the_prefix_is_the_stream_without(flow, voices):
    whole, skipping = decoders(flow, voices)
    tokens = codes(60, seed=9)
    outs = []
    for decoder in (whole, skipping):
        state, pieces = FlowState(voices[1]), []
        for at in range(0, 60, 7):
            mel, state = decoder.decode_chunks([(tokens[at : at + 7], state)])[0]
            pieces.append(mel)
        pieces.append(decoder.decode_chunks([(None, state)])[0][0])
        outs.append(torch.cat(pieces, 1))
    assert outs[0].shape == (80, 240)
    torch.testing.assert_close(outs[1], outs[0], atol=2e-5, rtol=1e-5)


def test_a_voice_outside_the_prefix_is_solved_whole(flow, voices):
    """A call with a voice the prefix was not made for (not set_voices') solves every frame, and is right."""
    whole, skipping = decoders(flow, voices[:1])
    streams = [FlowState(v, tuple(codes(13, seed=3)), 0, 0) for v in voices]
    assert not skipping.prefix.covers(s.voice for s in streams)
    for (w, _), (g, _) in zip(whole.decode_chunks([([], s) for s in streams]),
                              skipping.decode_chunks([([], s) for s in streams])):
        torch.testing.assert_close(g, w, atol=2e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs of the flow: needs a GPU")
def test_prefix_in_cuda_graphs_is_the_eager_whole_call(flow, voices):
    """bf16 graphs reading the prefix's tensors give the eager call that solves every frame (to bf16 rounding)."""
    device = torch.device("cuda")
    whole = FlowTokenDecoder(random_codec(tiny(), 0)[0].eval(), device, graphs=False)
    # the prefix from 4 rows on; no stream history (its graphs would be captured instead: test_codec_history.py)
    graphs = FlowTokenDecoder(random_codec(tiny(), 0)[0].eval(), device, history_streams=0)
    graphs.set_voices(voices)
    graphs.warm_up(voices, 4)
    assert {B for B, _, prefixed, _ in graphs.graphs if prefixed} == {4}
    assert {B for B, _, prefixed, _ in graphs.graphs if not prefixed} == {1, 2, 3}
    streams = [FlowState(v, tuple(codes(23, seed=i)), 0, 15) for i, v in enumerate(voices + voices)]  # 4 rows
    for (w, _), (g, _) in zip(whole.decode_chunks([([], s) for s in streams]),
                              graphs.decode_chunks([([], s) for s in streams])):
        assert g.shape == w.shape and w.shape[1] > 0
        err = (g - w).float().pow(2).sum() / w.float().pow(2).sum()
        assert err < 1e-3, f"relative error {float(err):.2e}"


def test_small_calls_solve_every_frame(flow, voices):
    """Under prefix_min_rows rows a call does not read the prefix (it would take more launches than it saves)."""
    decoder = FlowTokenDecoder(flow, CPU, prefix_min_rows=3)
    decoder.set_voices(voices)
    assert not decoder._prefixed(2, voices) and decoder._prefixed(3, voices)
    assert not decoder._prefixed(3, [random_voice(tiny().flow, "other", prompt_tokens=10)])
