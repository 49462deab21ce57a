"""The speech tokenizer's official directory layout (services/encoder/checkpoint.py): the encoder's tensors load by
name, what it never runs is left out by name, and a wrong tensor or file is refused, naming it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.common.checkpoint import CheckpointMismatch
from services.encoder.checkpoint import load_tokenizer, random_tokenizer, save_tokenizer
from services.encoder.config import UnsupportedConfig, tiny

CFG = tiny()


def official_extras() -> dict[str, torch.Tensor]:
    """What the official file holds beside the encoder's first layers: later layers, the final norm, the quantizer's
    training state, the decoder."""
    d = CFG.d_model
    return {f"model.encoder.layers.{CFG.quantize_position}.fc1.weight": torch.zeros(CFG.encoder_ffn_dim, d),
            "model.encoder.layer_norm.weight": torch.ones(d), "model.encoder.ema_count": torch.ones(CFG.quantize_vocab_size),
            "model.encoder.ema_weight": torch.zeros(CFG.quantize_vocab_size, d),
            "model.decoder.embed_tokens.weight": torch.zeros(10, d)}


def test_the_official_layout_loads_the_same_encoder(tmp_path):
    model = random_tokenizer(CFG, seed=1)
    save_tokenizer(model, tmp_path, official_extras())
    loaded = load_tokenizer(tmp_path)
    assert loaded.cfg == CFG
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    mel = torch.randn(1, CFG.num_mel_bins, 40)
    with torch.no_grad():
        assert torch.equal(loaded(mel), model(mel))


def rewrite(tmp_path, change) -> None:
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path))


@pytest.mark.parametrize("change, named", [
    (lambda t: t.pop("model.encoder.layers.1.fc2.bias"), r"missing 1: layers\.1\.fc2\.bias"),
    (lambda t: t.update({"model.encoder.layers.0.extra.weight": torch.zeros(2)}), r"unexpected 1: layers\.0\.extra\.weight"),
    (lambda t: t.update({"model.encoder.codebook.weight": torch.zeros(3, CFG.d_model)}),
     r"misshapen 1: codebook\.weight \(3, 64\) \(expected \(64, 64\)\)"),
])
def test_a_wrong_tensor_is_refused_by_name(tmp_path, change, named):
    save_tokenizer(random_tokenizer(CFG), tmp_path)
    rewrite(tmp_path, change)
    with pytest.raises(CheckpointMismatch, match=named):
        load_tokenizer(tmp_path)


def test_a_missing_or_corrupt_file_and_a_non_causal_config_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json and model"):
        load_tokenizer(tmp_path)
    save_tokenizer(random_tokenizer(CFG), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointMismatch, match="model.safetensors: not a safetensors file"):
        load_tokenizer(tmp_path)
    save_tokenizer(random_tokenizer(CFG), tmp_path)
    config = tmp_path / "config.json"
    config.write_text(config.read_text().replace('"encoder_causal_convolution": true', '"encoder_causal_convolution": false'))
    with pytest.raises(UnsupportedConfig, match="encoder_causal_convolution=False"):
        load_tokenizer(tmp_path)
