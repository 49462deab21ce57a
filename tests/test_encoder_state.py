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
