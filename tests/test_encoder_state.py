"""The flow's conformer encoder over a stream's new tokens only, its earlier positions' state kept
(codec/encoder_state.py): call after call, the frames each call makes final are the offline encoder's over the whole
stream in streaming mode, in float32 (the tiny codec's layout, random weights); streams batched in fixed shapes are
each alone; a ring as small as a window and a call's positions gives what a larger one gives."""

from __future__ import annotations

import pytest
import torch

from services.vocoder.codec.checkpoint import random_codec
from services.vocoder.codec.config import tiny
from services.vocoder.codec.encoder_state import EncoderStore, extend_rows

LOOKAHEAD, STRIDE = 3, 4


@pytest.fixture(scope="module")
def flow():
    return random_codec(tiny(), 3)[0].eval()


def streams_of(flow, schedules: list[list[int]], seed: int) -> list[torch.Tensor]:
    """Each stream's token embeddings [positions, input_size] for its calls' final positions."""
    out = []
    for i, calls in enumerate(schedules):
        tokens = torch.randint(0, flow.cfg.vocab_size, (sum(calls),),
                               generator=torch.Generator().manual_seed(seed + i))
        out.append(flow.input_embedding(tokens).detach())
    return out


def run(flow, store: EncoderStore, streams: list[torch.Tensor], schedules: list[list[int]], N: int,
        padding: bool = True) -> list[list[torch.Tensor]]:
    """The streams' calls, all streams in each (and a padding row), N positions a row → per call, each stream's final
    frames. A call's look-ahead context is the 3 tokens after its final ones, those the stream has."""
    done, calls = [0] * len(streams), []
    for call in range(len(schedules[0])):
        finals = [s[call] for s in schedules]
        context = [min(LOOKAHEAD, len(x) - d - f) for x, d, f in zip(streams, done, finals)]
        B = len(streams) + padding
        xs = torch.zeros(B, N, flow.cfg.input_size)
        for b, x in enumerate(streams):
            xs[b, : finals[b] + context[b]] = x[done[b] : done[b] + finals[b] + context[b]]
        out = extend_rows(flow.encoder, store, torch.arange(B), torch.tensor(done + [0] * padding),
                          torch.tensor(finals + [0] * padding), torch.tensor(context + [0] * padding), xs)
        calls.append([out[b, : finals[b] * STRIDE].clone() for b in range(len(streams))])
        done = [d + f for d, f in zip(done, finals)]
    return calls


@pytest.mark.parametrize("prompt, blocks", [(12, [3, 5, 5, 10, 5, 2]), (10, [5, 5, 5, 1]), (7, [3, 5, 15, 4])])
def test_call_after_call_the_final_frames_are_the_offline_encoders(flow, prompt, blocks):
    """A stream's row [prompt | tokens] in calls: the first decodes the prompt and the tokens to the first chunk's
    end, each next call a whole number of chunks with 3 tokens of look-ahead context, the last the rest."""
    schedule = [prompt + blocks[0], *blocks[1:]]
    total = sum(schedule)
    assert all(sum(schedule[: i + 1]) % flow.cfg.encoder.static_chunk_size == 0 for i in range(len(schedule) - 1))
    (xs,) = streams_of(flow, [schedule], seed=total)
    with torch.inference_mode():
        offline = flow.encoder(xs[None, :total], torch.tensor([total]), torch.tensor([0]), True)[0]   # [4·total, d]
    calls = run(flow, EncoderStore(flow.encoder, slots=1, capacity=40 + 32, window=40), [xs], [schedule], N=32,
                padding=False)
    done = 0
    for (out,), final in zip(calls, schedule):
        torch.testing.assert_close(out, offline[done * STRIDE : (done + final) * STRIDE], atol=2e-5, rtol=1e-5)
        done += final


def test_streams_batched_in_fixed_shapes_are_each_alone(flow):
    """Three streams at different points and a padding row, in calls of one bucket of N positions, give each stream's
    offline frames while their window holds every kept position; and a store whose ring is only a window and a call
    long gives what a larger one gives, once streams outgrow the window."""
    N = 24
    schedules = [[15, 5, 5, 5, 5, 5, 5], [10, 5, 10, 5, 5, 5, 5], [10, 5, 5, 5, 5, 5, 10]]
    streams = streams_of(flow, schedules, seed=40)
    whole = run(flow, EncoderStore(flow.encoder, slots=3, capacity=96, window=64), streams, schedules, N)
    for b, x in enumerate(streams):
        total = sum(schedules[b])
        with torch.inference_mode():
            offline = flow.encoder(x[None, :total], torch.tensor([total]), torch.tensor([0]), True)[0]
        torch.testing.assert_close(torch.cat([call[b] for call in whole]), offline, atol=2e-5, rtol=1e-5)
    small = run(flow, EncoderStore(flow.encoder, 3, capacity=20 + N, window=20), streams, schedules, N)
    large = run(flow, EncoderStore(flow.encoder, 3, capacity=128, window=20), streams, schedules, N)
    for call, (a, b) in enumerate(zip(small, large)):
        for s_out, l_out in zip(a, b):
            torch.testing.assert_close(s_out, l_out, atol=0, rtol=0, msg=f"call {call}")
    with pytest.raises(ValueError, match="a call of 24 positions; the store holds 40"):
        run(flow, EncoderStore(flow.encoder, 3, capacity=40, window=20), streams, schedules, N)
    assert torch.cat([o.flatten() for o in small[-1]]).ne(torch.cat([o.flatten() for o in whole[-1]])).any()
