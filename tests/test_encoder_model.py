"""The Whisper-VQ encoder (services/encoder/whisper_vq.py): the reference's names and shapes, its math against
PyTorch's own transformer layer, streaming equal to offline however the frames are chunked, and causality."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from services.encoder.config import UnsupportedConfig, glm4_voice, read_config, tiny
from services.encoder.kv_pool import KVPool, PoolFull
from services.encoder.whisper_vq import WhisperVQEncoder


def layer_names(i: int, cfg) -> dict[str, tuple[int, ...]]:
    d, f = cfg.d_model, cfg.encoder_ffn_dim
    p = f"layers.{i}."
    shapes = {p + "self_attn.k_proj.weight": (d, d)}  # the reference's k_proj has no bias
    for proj in ("q_proj", "v_proj", "out_proj"):
        shapes |= {p + f"self_attn.{proj}.weight": (d, d), p + f"self_attn.{proj}.bias": (d,)}
    for norm in ("self_attn_layer_norm", "final_layer_norm"):
        shapes |= {p + f"{norm}.weight": (d,), p + f"{norm}.bias": (d,)}
    return shapes | {p + "fc1.weight": (f, d), p + "fc1.bias": (f,), p + "fc2.weight": (d, f), p + "fc2.bias": (d,)}


def test_the_real_size_has_the_references_names_and_shapes():
    """Names and shapes as the reference's WhisperVQEncoder (encoder-only, quantized after layer 16) declares them
    for the official config (read from alpacaking/MOSS-Speech-decoder-cosy's modeling_whisper.py and config.json)."""
    cfg = glm4_voice()
    with torch.device("meta"):
        model = WhisperVQEncoder(cfg)
    expected = {"conv1.weight": (1280, 128, 3), "conv1.bias": (1280,), "conv2.weight": (1280, 1280, 3),
                "conv2.bias": (1280,), "embed_positions.weight": (1500, 1280), "codebook.weight": (16384, 1280),
                "embed_positions2.weight": (375, 1280)}
    for i in range(16):
        expected |= layer_names(i, cfg)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected
    assert model.conv2.stride == (2,) and cfg.mel_frames_per_code == 8 and cfg.segment_mel_frames == 3000


def oracle(model: WhisperVQEncoder, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same encoder written with PyTorch's own pieces: left-padded convolutions, nn.TransformerEncoderLayer
    (pre-norm, GELU) with a causal mask, nn.AvgPool1d over zero-padded frames, nearest codebook row by cdist.
    → (pooled features [B, c, dim], codes [B, c])."""
    cfg = model.cfg
    h = F.gelu(F.conv1d(F.pad(mel, (2, 0)), model.conv1.weight, model.conv1.bias))
    h = F.gelu(F.conv1d(F.pad(h, (2, 0)), model.conv2.weight, model.conv2.bias, stride=2)).transpose(1, 2)
    T = h.shape[1]
    h = h + model.embed_positions.weight[:T]
    mask = nn.Transformer.generate_square_subsequent_mask(T)
    for layer in model.layers:
        ref = nn.TransformerEncoderLayer(cfg.d_model, cfg.encoder_attention_heads, cfg.encoder_ffn_dim, dropout=0.0,
                                         activation="gelu", batch_first=True, norm_first=True).eval()
        a = layer.self_attn
        with torch.no_grad():
            ref.self_attn.in_proj_weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            ref.self_attn.in_proj_bias.copy_(torch.cat([a.q_proj.bias, torch.zeros_like(a.q_proj.bias), a.v_proj.bias]))
            ref.self_attn.out_proj.load_state_dict(a.out_proj.state_dict())
            ref.linear1.load_state_dict(layer.fc1.state_dict())
            ref.linear2.load_state_dict(layer.fc2.state_dict())
            ref.norm1.load_state_dict(layer.self_attn_layer_norm.state_dict())
            ref.norm2.load_state_dict(layer.final_layer_norm.state_dict())
        h = ref(h, src_mask=mask, is_causal=True)
    k = cfg.pooling_kernel_size
    pooled = nn.AvgPool1d(k)(F.pad(h.transpose(1, 2), (0, -T % k))).transpose(1, 2)
    codes = torch.cdist(pooled, model.codebook.weight[None].expand(pooled.shape[0], -1, -1)).argmin(-1)
    return pooled, codes


def spread_codebook(model: WhisperVQEncoder, mel: torch.Tensor) -> None:
    """Random weights pool every frame near one codebook row; a codebook of (noisy) pooled features of this audio
    makes the codes tell frames apart, so that equal codes mean something."""
    pooled, _ = oracle(model, mel)
    rows = pooled.reshape(-1, pooled.shape[-1])
    g = torch.Generator().manual_seed(5)
    book = model.codebook.weight
    with torch.no_grad():
        n = min(len(rows), len(book))
        book[:n] = rows[torch.randperm(len(rows), generator=g)[:n]] + 0.01 * torch.randn(n, book.shape[1], generator=g)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = WhisperVQEncoder(tiny()).eval()
    mel = torch.randn(3, 16, 70, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        spread_codebook(m, mel)
    return m


@torch.no_grad()
def test_offline_is_the_oracles_encoder(model):
    mel = torch.randn(3, 16, 75, generator=torch.Generator().manual_seed(2))  # 75 frames: a last group part-filled
    pooled, codes = oracle(model, mel)
    recorded = []
    quantize = model.quantize
    model.quantize = lambda h: (recorded.append(h), quantize(h))[1]
    try:
        ours = model(mel)
    finally:
        del model.quantize
    # quantized: every row's whole groups in one call (row by row), then each row's last, unfinished group
    torch.testing.assert_close(torch.cat(recorded), torch.cat([pooled[:, :-1].flatten(0, 1), pooled[:, -1]]),
                               rtol=1e-4, atol=1e-5)
    assert ours.shape == (3, 10) and torch.equal(ours, codes)
    assert len(set(ours.flatten().tolist())) > 5  # the codes tell frames apart (spread_codebook)


@torch.no_grad()
def test_a_whole_segment_encoded_in_the_services_pool_holds_places_for_its_call_as_no_speaker(model):
    """A turn's segment encoded again at its end (stream._reencode) runs in free places of the service's pool: for its
    call they are used, and they are not speakers (the encoder_speakers gauge reads `speakers`); then all go back."""
    pool = KVPool(model.cfg, 4)
    speaker = model.start(pool)
    seen = []
    feed = model.feed
    model.feed = lambda states, mels, p: (seen.append((p is pool, pool.used(), pool.speakers())), feed(states, mels, p))[1]
    try:
        model(torch.randn(2, 16, 40, generator=torch.Generator().manual_seed(4)), pool)
    finally:
        del model.feed
    assert seen == [(True, 3, 1)]                # two rows in the pool for the call, one speaker
    assert (pool.used(), pool.speakers(), pool.borrowed) == (1, 1, 0)
    model.finish(speaker, pool)
    assert pool.used() == pool.speakers() == 0


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(0, 80), max_size=8))
@torch.no_grad()
def test_streaming_gives_the_offline_codes_however_the_frames_are_chunked(model, cuts):
    mel = torch.randn(2, 16, 80, generator=torch.Generator().manual_seed(3))
    bounds = [0, *sorted(cuts), 80]
    pool = KVPool(model.cfg, 2)
    states, codes = [model.start(pool), model.start(pool)], [[], []]
    for a, b in zip(bounds, bounds[1:]):
        for row, new in enumerate(model.feed(states, list(mel[:, :, a:b]), pool)):
            codes[row].append(new)
    streamed = torch.stack([torch.cat([*c, model.finish(s, pool)]) for c, s in zip(codes, states)])
    assert pool.used() == 0
    assert torch.equal(streamed, model(mel))


@settings(max_examples=15, deadline=None)
@given(chunks=st.lists(st.lists(st.integers(0, 13), min_size=1, max_size=6), min_size=1, max_size=4))  # ≤ 78 frames: a segment
@torch.no_grad()
def test_streams_fed_together_each_get_what_they_get_alone(model, chunks):
    """Streams packed into one call, each with its own chunks (some empty): each stream's codes are its own."""
    g = torch.Generator().manual_seed(6)
    mels = [torch.randn(16, sum(c), generator=g) for c in chunks]
    pool = KVPool(model.cfg, len(chunks) + 1)
    states, together = [model.start(pool) for _ in chunks], [[] for _ in chunks]
    at = [0] * len(chunks)
    for step in range(max(len(c) for c in chunks)):
        parts = []
        for i, c in enumerate(chunks):
            n = c[step] if step < len(c) else 0
            parts.append(mels[i][:, at[i] : at[i] + n])
            at[i] += n
        for i, new in enumerate(model.feed(states, parts, pool)):
            together[i].append(new)
    for i, mel in enumerate(mels):
        alone = model.start(pool)
        expected = torch.cat([model.feed([alone], [mel], pool)[0], model.finish(alone, pool)])
        got = torch.cat([*together[i], model.finish(states[i], pool)])
        assert torch.equal(got, expected), i


@torch.no_grad()
def test_like_chunks_of_many_streams_share_one_convolution(model, monkeypatch):
    """Streams with as many new frames (and as many inputs pending in the strided convolution) go through the
    front end as one batch; each stream's codes are still its own."""
    g = torch.Generator().manual_seed(8)
    mels = [torch.randn(16, 24, generator=g) for _ in range(5)]
    pool = KVPool(model.cfg, 6)
    states = [model.start(pool) for _ in mels]
    calls = []
    step = type(model.conv1).step
    monkeypatch.setattr(type(model.conv1), "step", lambda self, p, x: calls.append(x.shape[0]) or step(self, p, x))
    together = [torch.cat([c, model.finish(s, pool)]) for c, s in zip(model.feed(states, mels, pool), states)]
    assert calls == [5, 5]  # conv1 and conv2, each once, over the five streams
    monkeypatch.undo()
    for mel, got in zip(mels, together):
        alone = model.start(pool)
        assert torch.equal(got, torch.cat([model.feed([alone], [mel], pool)[0], model.finish(alone, pool)]))


@torch.no_grad()
def test_a_code_reads_no_later_frame(model):
    mel = torch.randn(1, 16, 64, generator=torch.Generator().manual_seed(4))
    later = mel.clone()
    later[:, :, 24:] = torch.randn(1, 16, 40, generator=torch.Generator().manual_seed(9))
    a, b = model(mel), model(later)
    assert torch.equal(a[:, :3], b[:, :3])  # codes 0-2 read mel frames 0-23
    assert not torch.equal(a[:, 3:], b[:, 3:])


@torch.no_grad()
def test_a_segment_is_at_most_30_seconds(model):
    cfg = model.cfg
    pool = KVPool(cfg, 1)
    state = model.start(pool)
    model.feed([state], [torch.zeros(cfg.num_mel_bins, cfg.segment_mel_frames)], pool)
    with pytest.raises(ValueError, match="a segment holds"):
        model.feed([state], [torch.zeros(cfg.num_mel_bins, 2)], pool)
    with pytest.raises(PoolFull, match="all 1 encoder slots are in use"):
        model.start(pool)
    model.finish(state, pool)
    assert pool.used() == 0


OFFICIAL = {"architectures": ["WhisperVQEncoder"], "d_model": 1280, "encoder_attention_heads": 20,
            "encoder_ffn_dim": 5120, "encoder_layers": 32, "encoder_causal_attention": True,
            "encoder_causal_convolution": True, "num_mel_bins": 128, "max_source_positions": 1500,
            "pooling_kernel_size": 4, "pooling_position": 16, "pooling_type": "avg", "quantize_position": 16,
            "quantize_vocab_size": 16384, "quantize_encoder_only": True, "activation_function": "gelu",
            "scale_embedding": False, "vocab_size": 51866}


def test_the_official_config_reads_as_the_real_size_and_a_non_causal_one_is_refused(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(OFFICIAL))
    assert read_config(path) == glm4_voice()
    path.write_text(json.dumps(OFFICIAL | {"encoder_causal_attention": False, "pooling_type": "max"}))
    with pytest.raises(UnsupportedConfig, match="encoder_causal_attention=False.*pooling_type='max'"):
        read_config(path)
