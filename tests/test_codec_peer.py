"""The peer as a serving stack would run it (codec_reference.ServedReference, bench/codec.py's second reference
column): its batched call must be the reference's own streaming step for each window, or the bench would time a
different model."""

from __future__ import annotations

import pytest
import torch

from codec_reference import ServedReference, reference_flow
from services.vocoder.codec.config import tiny
from services.vocoder.codec.voice import random_voice


@pytest.fixture(scope="module")
def peer():
    cfg = tiny()
    torch.manual_seed(0)
    flow = reference_flow(cfg)
    with torch.no_grad():
        for p in flow.parameters():
            p.normal_(std=0.05 if p.dim() > 1 else 0.1)
    return cfg, flow, random_voice(cfg.flow, prompt_tokens=10, seed=3)


def _alone(flow, voice, window: list[int]) -> torch.Tensor:
    """The reference's inference for one window (streaming, not finalized) → mel [80, frames after the prompt]."""
    tokens = torch.tensor(window)[None]
    mel, _ = flow.inference(token=tokens, token_len=torch.tensor([len(window)]), prompt_token=voice.prompt_tokens[None],
                            prompt_token_len=torch.tensor([len(voice.prompt_tokens)]), prompt_feat=voice.prompt_mel[None],
                            prompt_feat_len=torch.tensor([voice.prompt_mel.shape[0]]), embedding=voice.embedding[None],
                            streaming=True, finalize=False)
    return mel[0]


@torch.inference_mode()
def test_a_batched_call_is_each_windows_reference_step(peer):
    cfg, flow, voice = peer
    g = torch.Generator().manual_seed(1)
    windows = [torch.randint(0, cfg.flow.vocab_size, (13,), generator=g).tolist() for _ in range(3)]
    served = ServedReference(flow, voice, torch.device("cpu"), dtype=torch.float32, graphs=False)
    got = served(windows)
    assert got.shape[0] == 3
    for b, window in enumerate(windows):
        want = _alone(flow, voice, window)
        assert got[b].shape == want.shape
        assert torch.allclose(got[b], want, atol=1e-4, rtol=1e-4), float((got[b] - want).abs().max())
    # The rows differ (each is its own window's), so a call that returned row 0 thrice would fail above.
    assert not torch.allclose(got[0], got[1], atol=1e-3)


@torch.inference_mode()
def test_the_reference_modules_keep_their_chunk_mask_after_a_call(peer):
    from cosyvoice.flow import decoder

    cfg, flow, voice = peer
    before = decoder.add_optional_chunk_mask
    ServedReference(flow, voice, torch.device("cpu"), dtype=torch.float32, graphs=False)([[1] * 13])
    assert decoder.add_optional_chunk_mask is before
