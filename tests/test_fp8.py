"""FP8 layer GEMMs (`--quantization fp8`, services/llm/runner/fp8.py): the quantization's arithmetic, the kernel
runner with FP8 layers against the model in float32, the settings that choose it, and on CUDA (bash
bench/gpu_smoke.sh) the Triton quantizer, the decode kernel and torch._scaled_mm against the CPU's arithmetic, in
graphs."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from test_kernel_runner import CUDA, GREEDY, TURNS, conversation, engine_for

from services.common.matmul_check import MatmulFault
from services.common.sampling import ChunkSettings
from services.llm.engine.engine import GenerationRequest
from services.llm.engine.reference import dense_logits, traced_generation
from services.llm.model.checkpoint import random_model
from services.llm.model.config import tiny_config
from services.llm.runner import fp8
from services.llm.runner.fp8 import FP8, FP8_MAX, Fp8Weight, linear, quantize_rows_reference

CFG = tiny_config()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (bash bench/gpu_smoke.sh)")


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def test_rows_are_scaled_to_their_largest_value():
    x = torch.randn(5, 96) * torch.tensor([1e-3, 1.0, 30.0, 1e4, 0.0])[:, None]
    q, scale = quantize_rows_reference(x)
    assert q.dtype == FP8 and q.shape == x.shape and scale.shape == (5, 1)
    # each row's largest magnitude lands on e4m3's largest value, whatever the row's size
    assert torch.equal(q[:4].float().abs().amax(dim=1), torch.full((4,), FP8_MAX))
    back = q.float() * scale
    for row in range(4):  # 3 bits of mantissa: every value within half a step (1/16 of itself) or subnormal
        assert relative_error(back[row], x[row]) < 0.05
    assert torch.equal(back[4], torch.zeros(96)) and bool(torch.isfinite(scale).all())  # a padding row


def test_a_product_with_fp8_weights_is_the_quantized_numbers_multiplied():
    torch.manual_seed(0)
    w, x = torch.randn(48, 64) / 8, torch.randn(7, 64)
    weight = Fp8Weight.of(w)
    assert weight.data.dtype == FP8 and weight.scale.shape == (1, 48) and weight.shape == (48, 64)
    q, scale = quantize_rows_reference(x)
    want = (q.float() * scale) @ (weight.data.float() * weight.scale.t()).t()
    assert torch.equal(linear(x, weight), want)
    assert 0.01 < relative_error(linear(x, weight), x @ w.t()) < 0.06  # e4m3's error, neither none nor more
    assert torch.equal(linear(x, w), torch.nn.functional.linear(x, w))  # a plain weight: a plain product


def test_the_start_up_check_passes_fp8_and_refuses_a_wrong_scale(monkeypatch):
    sizes = {"shapes": ((64, 32), (32, 96)), "rows": (1, 7, 33)}
    assert fp8.check_fp8("cpu", **sizes) == 6
    monkeypatch.setattr(Fp8Weight, "dequantized", lambda self: self.data.float() * self.scale.t() * 1.3)
    with pytest.raises(MatmulFault, match=r"6 of 6 FP8 products checked"):
        fp8.check_fp8("cpu", **sizes)


def test_an_fp8_runner_holds_its_layers_once_and_keeps_the_rest():
    model = random_model(CFG, seed=3)
    engine = engine_for(model, runner="kernels", kernels="torch", quantization="fp8")
    layers = engine.runner.forward.shared + engine.runner.forward.text + engine.runner.forward.audio
    assert len(layers) == CFG.num_layers
    assert all(isinstance(getattr(w, name), Fp8Weight) for w in layers for name in ("qkv", "o", "gate_up", "down"))
    attention = model.model.shared_block.layers[0].self_attn
    assert attention.q_proj.weight.numel() == 0 and attention.q_proj.weight.dtype == torch.float32
    assert model.audio_lm_head.weight.shape == (CFG.audio_vocab_size, CFG.hidden_size)  # heads stay whole


def test_fp8_logits_follow_the_models_own():
    """A reply's every audio step: the FP8 runner's logits within e4m3's error of a dense float32 forward over
    the same tokens (a wrong scale axis or a dropped scale would be off by far more)."""
    model = random_model(CFG, seed=6)
    engine = engine_for(random_model(CFG, seed=6), runner="kernels", kernels="torch", quantization="fp8")
    seq = engine.make_sequence(GenerationRequest("a", GREEDY, ChunkSettings(), text="Hello there, how are you?"))
    logits = traced_generation(engine, seq)
    _, dense_audio = dense_logits(model, seq.text_ids, seq.audio_ids)
    errors = [relative_error(a, dense_audio[seq.num_prompt - 1 + i]) for i, (_, a) in enumerate(logits) if a is not None]
    assert len(errors) >= 8 and max(errors) < 0.1, errors


def test_fp8_needs_the_kernel_runner_and_auto_chooses_it():
    model = random_model(CFG, seed=1)
    with pytest.raises(ValueError, match="--quantization fp8 needs the kernel runner"):
        engine_for(model, runner="reference", quantization="fp8")
    assert type(engine_for(random_model(CFG, seed=1), quantization="fp8").runner).__name__ == "KernelRunner"
    with pytest.raises(ValueError, match="unknown quantization 'int3'"):
        engine_for(random_model(CFG, seed=1), runner="kernels", kernels="torch", quantization="int3")


def test_moss_serve_takes_and_hands_on_the_quantization():
    from services.cli import parser
    from services.up import up_service_args

    assert parser().parse_args(["llm", "--quantization", "fp8"]).quantization == "fp8"
    assert parser().parse_args(["llm"]).quantization == "none"
    with pytest.raises(SystemExit):
        parser().parse_args(["llm", "--quantization", "int4"])
    args = parser().parse_args(["up", "--device", "cuda", "--quantization", "fp8"])
    llm = up_service_args(args)["llm"]
    assert llm[llm.index("--quantization") + 1] == "fp8"


# ---- CUDA: the Triton quantizer and decode kernel, cuBLASLt's FP8 products, graphs --------------------------------------------------
@needs_cuda
def test_the_triton_quantizer_gives_the_reference_numbers():
    from services.llm.runner.kernels.fp8 import quantize_rows

    x = torch.randn(37, 4096, device="cuda", dtype=torch.bfloat16) * 3
    x[5] = 0
    q, scale = quantize_rows(x)
    want_q, want_scale = quantize_rows_reference(x)
    torch.testing.assert_close(scale, want_scale, rtol=1e-6, atol=0)
    assert (q.float() != want_q.float()).float().mean() < 1e-3  # a division's last bit may round a value over


@needs_cuda
@pytest.mark.parametrize("rows", [1, 3, 16, 33, 64, 65, 256])
def test_fp8_products_on_cuda_multiply_what_the_cpu_multiplies(rows):
    """Up to DECODE_ROWS rows the Triton kernel, above it cuBLASLt's _scaled_mm: each against the CPU's arithmetic
    of the same quantized numbers."""
    torch.manual_seed(rows)
    w = torch.randn(12288, 4096, device="cuda", dtype=torch.bfloat16) / 64
    x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    weight = Fp8Weight.of(w)
    got = linear(x, weight)
    q, scale = quantize_rows_reference(x)
    want = (q.float() * scale) @ weight.dequantized().t()
    assert got.dtype == torch.bfloat16 and relative_error(got, want) < 0.01  # bf16 output, float32 accumulation
    assert relative_error(got, x.float() @ w.float().t()) < 0.06


@needs_cuda
@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 12288), (1000, 3000), (24, 40)])
def test_the_decode_kernel_covers_every_shape_and_stride(n, k):
    """Sizes that are not multiples of a tile, and rows read through a stride (a view of a wider tensor)."""
    from services.llm.runner.kernels.fp8 import decode_matmul

    torch.manual_seed(n)
    weight = Fp8Weight.of(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
    for rows in (1, 5, 17, 64):
        q, scale = quantize_rows_reference(torch.randn(rows, k, device="cuda", dtype=torch.bfloat16))
        wide = torch.zeros(rows, k + 16, device="cuda", dtype=FP8)
        wide[:, 16:] = q
        got = decode_matmul(wide[:, 16:], scale, weight.data, weight.scale, torch.bfloat16)
        want = (q.float() * scale) @ weight.dequantized().t()
        assert got.shape == (rows, n) and relative_error(got, want) < 0.01


@needs_cuda
def test_fp8_graphs_replay_the_eager_fp8_steps():
    model = random_model(CFG, device="cuda", dtype=torch.bfloat16, seed=8)
    eager = conversation(engine_for(model, runner="kernels", cuda_graphs=False, quantization="fp8"), TURNS)
    model = random_model(CFG, device="cuda", dtype=torch.bfloat16, seed=8)
    graphed = engine_for(model, runner="kernels", cuda_graphs=True, quantization="fp8")
    assert graphed.runner.graphs, "no graph captured"
    assert conversation(graphed, TURNS) == eager
