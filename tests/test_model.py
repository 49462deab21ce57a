"""The model: official key names and shapes, checkpoint round trip, refusal of bad checkpoints."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.llm.model.checkpoint import CheckpointError, load_pretrained, random_model, save_pretrained
from services.llm.model.config import MossSpeechConfig, preset, tiny_config
from services.llm.model.model import MossSpeechForCausalLM


def test_real_preset_has_the_published_tensors():
    with torch.device("meta"):
        model = MossSpeechForCausalLM(preset("moss-speech"))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert len(shapes) == 446
    assert shapes["model.embed_tokens.weight"] == (151680, 4096)
    assert shapes["model.audio_embed.weight"] == (16512, 4096)
    assert shapes["text_lm_head.weight"] == (151680, 4096)
    assert shapes["audio_lm_head.weight"] == (16512, 4096)
    assert shapes["model.shared_block.layers.31.self_attn.k_proj.weight"] == (1024, 4096)
    assert shapes["model.text_block.layers.3.mlp.down_proj.weight"] == (4096, 12288)
    assert shapes["model.audio_block.layers.3.self_attn.q_norm.weight"] == (128,)
    assert "model.text_norm.weight" in shapes and "model.audio_norm.weight" in shapes
    assert not any(k.startswith("model.text_block.layers.4") for k in shapes)
    assert abs(sum(torch.Size(s).numel() for s in shapes.values()) / 1e9 - 9.1) < 0.05


@pytest.mark.parametrize("cfg", [preset("moss-speech"), tiny_config(),
                                 MossSpeechConfig(hidden_size=96, intermediate_size=160, num_attention_heads=6,
                                                  num_key_value_heads=2, head_dim=24, num_shared_layers=3,
                                                  num_modality_layers=2, vocab_size=151700, audio_vocab_size=300)])
def test_the_configs_parameter_count_is_the_built_models(cfg):
    """What the llm checks against the device's memory before it builds anything (server.check_weights_fit)."""
    with torch.device("meta"):
        built = sum(p.numel() for p in MossSpeechForCausalLM(cfg).parameters())
    assert cfg.num_parameters == built


def test_tiny_keeps_the_special_token_layout():
    real, tiny = preset("moss-speech"), tiny_config()
    for name in ("im_start_token_id", "im_end_token_id", "sosp_token_id", "modality_pad_token_id"):
        assert getattr(real, name) - real.endoftext_token_id == getattr(tiny, name) - tiny.endoftext_token_id
    assert real.eosp_token_id == real.audio_codebook_size and tiny.eosp_token_id == tiny.audio_codebook_size
    assert tiny.audio_pad_token_id == real.audio_pad_token_id == 512


def test_checkpoint_round_trip_gives_the_same_outputs(tmp_path):
    cfg = tiny_config()
    model = random_model(cfg, seed=7)
    save_pretrained(model, tmp_path)
    on_disk = load_file(str(tmp_path / "model.safetensors"))
    assert "model.shared_block.layers.0.self_attn.q_norm.weight" in on_disk and "audio_lm_head.weight" in on_disk
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "moss_speech"

    loaded = load_pretrained(tmp_path)
    n = 24
    text = torch.randint(0, 256, (n,))
    audio = torch.full((n,), cfg.audio_pad_token_id)
    text[10:] = cfg.modality_pad_token_id  # an audio segment: audio embeddings at these positions
    audio[10:] = torch.randint(0, cfg.audio_codebook_size, (n - 10,))
    want_t, want_a = model(text, audio, torch.arange(n))
    got_t, got_a = loaded(text, audio, torch.arange(n))
    assert torch.equal(want_t, got_t) and torch.equal(want_a, got_a)
    other = random_model(cfg, seed=8)
    assert not torch.equal(other(text, audio, torch.arange(n))[0], want_t)


def test_sharded_checkpoint_loads(tmp_path):
    model = random_model(tiny_config(), seed=1)
    save_pretrained(model, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    keys = sorted(tensors)
    half = len(keys) // 2
    weight_map = {}
    for i, part in enumerate((keys[:half], keys[half:])):
        name = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, str(tmp_path / name))
        weight_map.update({k: name for k in part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = load_pretrained(tmp_path)
    assert all(torch.equal(loaded.state_dict()[k], tensors[k]) for k in keys)


def test_checkpoint_with_missing_or_misshapen_weights_is_refused(tmp_path):
    model = random_model(tiny_config())
    save_pretrained(model, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    del tensors["audio_lm_head.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="audio_lm_head.weight"):
        load_pretrained(tmp_path)
    tensors["audio_lm_head.weight"] = torch.zeros(3, 3)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="shape"):
        load_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="config.json"):
        load_pretrained(tmp_path / "nowhere")


def test_config_reads_published_keys():
    d = preset("moss-speech").to_dict()
    assert d["num_hidden_layers"] == 36 and d["num_shared_layers"] == 32 and d["num_modality_layers"] == 4
    cfg = MossSpeechConfig.from_dict({**d, "rope_theta": 10000.0, "use_sliding_window": False})
    assert cfg.rope_theta == 10000.0 and cfg.extra == {"use_sliding_window": False}
    with pytest.raises(ValueError, match="num_hidden_layers"):
        MossSpeechConfig.from_dict({**d, "num_hidden_layers": 40})
