"""The encoder against transformers' Whisper encoder, used only as a test oracle: the reference's WhisperVQEncoder
subclasses it and keeps its module and parameter names. Its state dict loads into ours by name (strictly, less its
final layer_norm, which the reference skips, plus our codebook); its layers, run causally as the reference's are, on
the same causal front end, then pooled and quantized, give our pooled features and codes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

modeling = pytest.importorskip("transformers.models.whisper.modeling_whisper",
                               reason="transformers (the test oracle) is not installed: `make install` adds it")
from transformers import WhisperConfig  # noqa: E402

from services.common.checkpoint import load_strict  # noqa: E402
from services.encoder.config import tiny  # noqa: E402
from services.encoder.whisper_vq import WhisperVQEncoder  # noqa: E402


@torch.no_grad()
def test_the_references_weights_load_by_name_and_give_its_codes():
    cfg = tiny()
    hf_cfg = WhisperConfig(num_mel_bins=cfg.num_mel_bins, d_model=cfg.d_model, encoder_layers=cfg.quantize_position,
                           encoder_attention_heads=cfg.encoder_attention_heads, encoder_ffn_dim=cfg.encoder_ffn_dim,
                           max_source_positions=cfg.max_source_positions, activation_function="gelu",
                           attn_implementation="eager")
    torch.manual_seed(3)
    ref = modeling.WhisperEncoder(hf_cfg).eval()
    ours = WhisperVQEncoder(cfg).eval()
    state = {k: v for k, v in ref.state_dict().items() if not k.startswith("layer_norm.")}
    codebook = torch.randn(cfg.quantize_vocab_size, cfg.d_model)
    load_strict(ours, state | {"codebook.weight": codebook, "embed_positions2.weight": ours.embed_positions2.weight},
                "transformers' WhisperEncoder")

    mel = torch.randn(2, cfg.num_mel_bins, 64, generator=torch.Generator().manual_seed(4))
    # the reference's causal front end (left-padded convolutions), then transformers' layers under a causal mask
    h = F.gelu(F.conv1d(F.pad(mel, (2, 0)), ref.conv1.weight, ref.conv1.bias))
    h = F.gelu(F.conv1d(F.pad(h, (2, 0)), ref.conv2.weight, ref.conv2.bias, stride=2)).transpose(1, 2)
    T = h.shape[1]
    h = h + ref.embed_positions.weight[:T]
    causal = torch.full((T, T), torch.finfo(h.dtype).min).triu(1)[None, None]
    for layer in ref.layers:
        out = layer(h, causal)
        h = out[0] if isinstance(out, tuple) else out
    pooled = h.unflatten(1, (-1, cfg.pooling_kernel_size)).mean(2)                     # [2, T / 4, dim]
    codes = torch.cdist(pooled, codebook[None].expand(2, -1, -1)).argmin(-1)

    recorded = []
    quantize = ours.quantize
    ours.quantize = lambda x: (recorded.append(x), quantize(x))[1]
    try:
        got = ours(mel)
    finally:
        del ours.quantize
    torch.testing.assert_close(recorded[0], pooled.flatten(0, 1), rtol=1e-4, atol=1e-5)
    assert torch.equal(got, codes)
    assert len(set(got.flatten().tolist())) > 1
