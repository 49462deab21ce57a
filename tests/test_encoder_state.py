"""The flow's conformer encoder over a stream's new tokens only, its earlier positions' state kept
(codec/encoder_state.py): call after call, the frames each call makes final are the offline encoder's over the whole
stream in streaming mode, in float32 (the tiny codec's layout, random weights)."""

from __future__ import annotations

import pytest
import torch

from services.vocoder.codec.checkpoint import random_codec
from services.vocoder.codec.config import tiny
from services.vocoder.codec.encoder_state import EncoderState, extend


@pytest.fixture(scope="module")
def flow():
    return random_codec(tiny(), 3)[0].eval()


@pytest.mark.parametrize("prompt, blocks", [(12, [3, 5, 5, 10, 5, 2]), (10, [5, 5, 5, 1]), (7, [3, 5, 15, 4])])
def test_call_after_call_the_final_frames_are_the_offline_encoders(flow, prompt, blocks):
    """A stream's row [prompt | tokens] in calls: the first decodes the prompt and the tokens to the first chunk's
    end, each next call a whole number of chunks, each with 3 tokens of look-ahead context, the last the rest."""
    enc, lookahead, chunk, stride = flow.encoder, flow.cfg.pre_lookahead_len, flow.cfg.encoder.static_chunk_size, 4
    total = prompt + sum(blocks)
    tokens = torch.randint(0, flow.cfg.vocab_size, (total,), generator=torch.Generator().manual_seed(total))
    xs = flow.input_embedding(tokens).detach()
    with torch.inference_mode():
        offline = enc(xs[None], torch.tensor([total]), torch.tensor([0]), True)[0]        # [4·total, d]
    state, done, calls = EncoderState(), 0, 0
    for i, block in enumerate(blocks):
        end = (prompt if i == 0 else 0) + done + block
        last = i == len(blocks) - 1
        if not last:
            assert end % chunk == 0, "a call ends on a chunk boundary"
        context = 0 if last else lookahead
        out, state = extend(enc, state, xs[done : end + context], end - done)
        torch.testing.assert_close(out[: (end - done) * stride], offline[done * stride : end * stride],
                                   atol=2e-5, rtol=1e-5)
        assert state.done == end and state.keys[0].shape[1] == end and state.keys[-1].shape[1] == end * stride
        done, calls = end, calls + 1
    assert done == total and calls == len(blocks)


def test_without_state_one_call_is_the_whole_forward(flow):
    xs = flow.input_embedding(torch.arange(20)).detach()
    with torch.inference_mode():
        whole = flow.encoder(xs[None], torch.tensor([17]), torch.tensor([3]), True)[0]
    out, state = extend(flow.encoder, EncoderState(), xs, 17)
    torch.testing.assert_close(out[: 17 * 4], whole[: 17 * 4], atol=2e-5, rtol=1e-5)
    assert state.done == 17


def test_streams_batched_in_fixed_shapes_are_each_alone(flow):
    """extend_rows: three streams at different points and a padding row, in calls of one bucket of N positions, give
    each stream's `extend` frames while their window holds every kept position; and a store whose ring is only a
    window and a call long gives what a larger one gives, once streams outgrow the window."""
    from services.vocoder.codec.encoder_state import EncoderStore, extend_rows

    enc, lookahead, N, stride = flow.encoder, flow.cfg.pre_lookahead_len, 24, 4
    schedules = [[15, 5, 5, 5, 5, 5, 5], [10, 5, 10, 5, 5, 5, 5], [10, 5, 5, 5, 5, 5, 10]]  # each call's final positions
    streams = []
    for i, calls in enumerate(schedules):
        tokens = torch.randint(0, flow.cfg.vocab_size, (sum(calls) + lookahead,),
                               generator=torch.Generator().manual_seed(40 + i))
        streams.append(flow.input_embedding(tokens).detach())

    def run(store):
        done, outs = [0, 0, 0], []
        for call in range(len(schedules[0])):
            finals = [s[call] for s in schedules]
            xs = torch.zeros(4, N, flow.cfg.input_size)
            for b, x in enumerate(streams):
                xs[b, : finals[b] + lookahead] = x[done[b] : done[b] + finals[b] + lookahead]
            out = extend_rows(enc, store, torch.tensor([0, 1, 2, 3]), torch.tensor(done + [0]),
                              torch.tensor(finals + [0]), torch.tensor([lookahead] * 3 + [0]), xs)
            outs.append([out[b, : finals[b] * stride].clone() for b in range(3)])
            done = [d + f for d, f in zip(done, finals)]
        return outs

    whole = run(EncoderStore(enc, slots=3, capacity=96, window=64))       # every position within the window
    alone = [EncoderState() for _ in streams]
    done = [0, 0, 0]
    for call, outs in enumerate(whole):
        for b, x in enumerate(streams):
            final = schedules[b][call]
            want, alone[b] = extend(enc, alone[b], x[done[b] : done[b] + final + lookahead], final)
            torch.testing.assert_close(outs[b], want[: final * stride], atol=2e-5, rtol=1e-5,
                                       msg=f"call {call}, stream {b}")
            done[b] += final
    small, large = run(EncoderStore(enc, 3, capacity=20 + N, window=20)), run(EncoderStore(enc, 3, capacity=128, window=20))
    for call, (a, b) in enumerate(zip(small, large)):
        for s_out, l_out in zip(a, b):
            torch.testing.assert_close(s_out, l_out, atol=0, rtol=0, msg=f"call {call}")
    assert torch.cat([o.flatten() for o in small[-1]]).ne(torch.cat([o.flatten() for o in whole[-1]])).any()
