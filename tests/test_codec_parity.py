"""The codec decoder against the reference's own modules (tests/codec_reference.py): the same state dict loads by
name into ours, and the same tokens, prompt, x-vector and noise give the same mel and waveform (float32)."""

from __future__ import annotations

import os

import pytest
import torch

from codec_reference import reference_flow, reference_hift
from services.vocoder.codec.checkpoint import CheckpointMismatch, load_codec, load_into, save_codec
from services.vocoder.codec.config import moss_speech, tiny
from services.vocoder.codec.flow import CausalMaskedDiffWithXvec, FlowBatch
from services.vocoder.codec.hift import HiFTGenerator


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Weights away from their initial values (zero biases, unit norms) so that every tensor matters."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(std=0.05 if p.dim() > 1 else 0.1)


@pytest.fixture(scope="module")
def flows():
    cfg = tiny()
    ref = reference_flow(cfg)
    _randomize(ref, 0)
    ours = CausalMaskedDiffWithXvec(cfg.flow).eval()
    load_into(ours, ref.state_dict(), "reference flow")
    return ref, ours


@pytest.mark.parametrize("streaming,finalize,products", [(False, True, "pytorch"), (True, True, "pytorch"),
                                                         (True, False, "pytorch"), (True, True, "prefetch kernel")])
def test_flow_mel_matches_reference(flows, streaming, finalize, products, monkeypatch):
    """products: the estimator's matrix products by PyTorch (on a CPU, as served there), or by prefetch_linear.py's
    Triton kernel (as served on a GPU; here in Triton's interpreter, float32)."""
    ref, ours = flows
    kernel_calls = []
    if products == "prefetch kernel":
        if os.environ.get("TRITON_INTERPRET") != "1":  # (a GPU host: the kernel would be compiled for CPU tensors)
            pytest.skip("the kernel on this test's CPU tensors runs in Triton's interpreter only, on hosts without a "
                        "GPU; on a GPU, test_prefetch_linear.py checks it against PyTorch at the real size")
        from services.vocoder.codec import prefetch_linear

        real = prefetch_linear.kernel
        monkeypatch.setattr(prefetch_linear, "on_gpu", lambda x: True)  # this module's only (the norms fold in)
        # (each call: whether it folds a norm in)
        monkeypatch.setattr(prefetch_linear, "kernel", lambda *a, **kw: kernel_calls.append(
            len(a) > 4 and a[4] is not None) or real(*a, **kw))
        monkeypatch.setattr(prefetch_linear, "TILE", (128, 64, 4))  # few programs: the interpreter runs each in turn
    torch.manual_seed(1)
    P, N = 6, 13  # prompt tokens, tokens (the last pre_lookahead_len are look-ahead context unless finalize)
    prompt, tokens = torch.randint(0, 1024, (1, P)), torch.randint(0, 1024, (1, N))
    prompt_mel, xvec = torch.randn(1, 4 * P, 80) - 5, torch.randn(1, 192)
    expected, _ = ref.inference(token=tokens, token_len=torch.tensor([N]), prompt_token=prompt,
                                prompt_token_len=torch.tensor([P]), prompt_feat=prompt_mel,
                                prompt_feat_len=torch.tensor([4 * P]), embedding=xvec, streaming=streaming,
                                finalize=finalize)
    context = 0 if finalize else 3
    batch = FlowBatch(torch.cat([prompt, tokens], 1), torch.tensor([P + N - context]), torch.tensor([context]),
                      prompt_mel, torch.tensor([4 * P]), xvec, torch.tensor([0]))
    with torch.inference_mode():
        mel = ours(batch, streaming)[:, :, 4 * P : 4 * (P + N - context)]
    assert mel.shape == expected.shape
    torch.testing.assert_close(mel, expected, atol=1e-4, rtol=1e-4)
    assert expected.abs().max() > 0.5  # a real signal, not zeros compared with zeros
    assert bool(kernel_calls) == (products == "prefetch kernel")
    assert any(kernel_calls) == (products == "prefetch kernel")  # the transformer blocks folded


def test_hift_waveform_matches_reference():
    cfg = tiny()
    ref = reference_hift(cfg)
    _randomize(ref, 2)
    with torch.no_grad():
        ref.f0_predictor.classifier.bias.fill_(200.0)  # voiced: the harmonic source matters
    ours = HiFTGenerator(cfg.hift).eval()
    load_into(ours, ref.state_dict(), "reference hift")  # its convolutions carry weight norm: folded at load
    mel = torch.randn(1, 80, 30) - 5
    torch.manual_seed(7)
    expected, _ = ref.inference(speech_feat=mel)
    torch.manual_seed(7)  # the reference's draws, in its order: initial phases (unused after its resampling), noise
    torch.rand(1, cfg.hift.nb_harmonics + 1)
    noise = torch.randn(1, 30 * cfg.hift.hop_size, cfg.hift.nb_harmonics + 1)
    with torch.inference_mode():
        wav = ours(mel, noise=noise)[:, 0]
    assert wav.shape == expected.shape == (1, 30 * 480)
    torch.testing.assert_close(wav, expected, atol=1e-4, rtol=1e-3)
    assert expected.abs().max() > 1e-3


def test_real_size_names_and_shapes_are_the_references():
    """Every tensor of the published architecture, by name and shape, both ways (random weights)."""
    cfg = moss_speech()
    for ref, ours in ((reference_flow(cfg), CausalMaskedDiffWithXvec(cfg.flow)),
                      (reference_hift(cfg), HiFTGenerator(cfg.hift))):
        load_into(ours, ref.state_dict(), type(ref).__name__)
        theirs = {k: v.shape for k, v in ref.state_dict().items() if "parametrizations" not in k}
        mine = ours.state_dict()
        assert set(theirs) <= set(mine) and all(mine[k].shape == s for k, s in theirs.items())


def test_checkpoint_refuses_wrong_tensors_by_name(tmp_path):
    cfg = tiny()
    flow, hift = CausalMaskedDiffWithXvec(cfg.flow), HiFTGenerator(cfg.hift)
    save_codec(flow, hift, cfg, tmp_path)
    load_codec(tmp_path)  # as saved: loads
    state = flow.state_dict()
    state.pop("encoder_proj.weight")
    state["decoder.estimator.extra.weight"] = torch.zeros(1)
    state["input_embedding.weight"] = torch.zeros(7, 512)
    torch.save(state, tmp_path / "flow.pt")
    with pytest.raises(CheckpointMismatch) as err:
        load_codec(tmp_path)
    text = str(err.value)
    assert "missing 1: encoder_proj.weight" in text
    assert "unexpected 1: decoder.estimator.extra.weight" in text
    assert "misshapen 1: input_embedding.weight (7, 512) (expected (1024, 512))" in text
    (tmp_path / "hift.pt").write_bytes(b"not a checkpoint")
    torch.save(flow.state_dict(), tmp_path / "flow.pt")
    with pytest.raises(CheckpointMismatch, match="hift.pt: not a torch state dict"):
        load_codec(tmp_path)
    (tmp_path / "codec.json").unlink()
    with pytest.raises(FileNotFoundError, match="codec.json not found"):
        load_codec(tmp_path)
