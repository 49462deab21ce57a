"""A level's transformer blocks as one persistent kernel (codec/megakernel.py) against the blocks run one by one:
runs of one and several blocks, with and without static chunks, over a voice prefix and a stream history (its keys
and values kept in the ring), rows at different Euler steps; whole streams decoded through it. Without CUDA the
kernel runs in Triton's interpreter (float32, a launch per stage) and is compiled for sm_90 as a GPU would (its
grid barrier one thread's atomics); with CUDA in bf16 at the real size, its barrier in one launch, and the launches
of a flow call counted."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="triton is not importable; the estimator's persistent kernel untested")

from services.vocoder.codec import megakernel  # noqa: E402
from services.vocoder.codec.config import EstimatorConfig  # noqa: E402
from services.vocoder.codec.decoder import FlowTokenDecoder  # noqa: E402
from services.vocoder.codec.estimator import CausalConditionalDecoder  # noqa: E402

CUDA = torch.cuda.is_available()
CPU = torch.device("cpu")
DEVICE = torch.device("cuda") if CUDA else CPU   # the streams' tests: float32 either way (the interpreter's, or IEEE)
# (channels, heads x head_dim, blocks a level): the interpreter's small sizes; with CUDA the real size
SIZES = [(32, 2, 16, 3)] + ([(256, 8, 64, 4)] if CUDA else [])


@pytest.fixture(scope="module")
def flow():
    """The tiny-codec flow (conftest's), 2 Euler steps: in the interpreter a step's stages cost ~1 s."""
    from services.vocoder.codec.checkpoint import random_codec
    from services.vocoder.codec.config import tiny

    flow = random_codec(tiny(), 0)[0].eval()
    flow.decoder.n_timesteps = 2
    return flow


def codes(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 1024, n).tolist()


def snr(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float(), want.float()
    return float(10 * torch.log10(want.pow(2).sum() / (got - want).pow(2).sum().clamp(min=1e-30)))


def estimator(C: int, heads: int, d: int, blocks: int, device, dtype) -> CausalConditionalDecoder:
    """Random weights, the norms' gains and biases too (a default norm would hide a wrong one)."""
    torch.manual_seed(C + blocks)
    est = CausalConditionalDecoder(EstimatorConfig(channels=(C,), attention_head_dim=d, n_blocks=blocks,
                                                   num_mid_blocks=1, num_heads=heads)).eval()
    with torch.no_grad():
        for name, p in est.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return est.to(device, dtype)


def one_by_one(blocks, first: int, count: int, x, lengths, chunk: int, prefix=None):
    """The per-block path (the module's forward, PyTorch or the per-op kernels)."""
    normed = blocks[first].norm1(x)
    for i in range(first, first + count):
        last = i == first + count - 1
        out = blocks[i](x, normed, lengths, chunk, prefix, then=None if last else blocks[i + 1].norm1)
        x, normed = (out, None) if last else out
    return x


@pytest.mark.parametrize("chunk", [20, 0])
@pytest.mark.parametrize("C,heads,d,count", SIZES)
def test_a_run_of_blocks_is_the_blocks_one_by_one(C, heads, d, count, chunk):
    device = DEVICE
    dtype = torch.bfloat16 if C > 32 else torch.float32
    est = estimator(C, heads, d, count, device, dtype)
    blocks = est.transformer_blocks
    B, T = 6, 37 if C == 32 else 80
    gen = torch.Generator(device).manual_seed(5)
    x = torch.randn(B, T, C, generator=gen, device=device).to(dtype)
    lengths = torch.tensor([T, 20, 5, T - 7, 1, T], dtype=torch.int32, device=device)
    with torch.inference_mode():
        for first in (0, count):                     # the down level's run, the middle level's
            want = one_by_one(blocks, first, count, x, lengths, chunk)
            normed = blocks[first].norm1(x)
            inputs = x.clone(), normed.clone()
            got = megakernel.run_blocks(blocks, first, count, x, normed, lengths, chunk, sync=CUDA)
            assert got.shape == want.shape and torch.isfinite(got).all()
            assert torch.equal(x, inputs[0]) and torch.equal(normed, inputs[1])   # read where they lie, not written
            if dtype == torch.float32:
                torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
            else:
                assert snr(got, want) >= 40, snr(got, want)


def test_one_block_runs_without_the_next_blocks_norm():
    est = estimator(32, 2, 16, 1, DEVICE, torch.float32)
    blocks = est.transformer_blocks
    x, lengths = torch.randn(2, 9, 32, device=DEVICE), torch.tensor([9, 4], dtype=torch.int32, device=DEVICE)
    with torch.inference_mode():
        got = megakernel.run_blocks(blocks, 2, 1, x, blocks[2].norm1(x), lengths, 20, sync=CUDA)
        torch.testing.assert_close(got, one_by_one(blocks, 2, 1, x, lengths, 20), atol=2e-5, rtol=2e-5)


def test_weights_loaded_after_the_first_run_are_read():
    """The blocks' parameters become views of the stacked weights: a state dict loaded later lands in them (and a q|k|v
    buffer made again by the load is stacked again)."""
    est = estimator(32, 2, 16, 3, DEVICE, torch.float32)
    other = estimator(32, 2, 16, 3, DEVICE, torch.float32)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    other.load_state_dict(other.state_dict())         # (its laid-out q|k|v weight made again from the new ones)
    blocks = est.transformer_blocks
    x, lengths = torch.randn(2, 9, 32, device=DEVICE), torch.tensor([9, 4], dtype=torch.int32, device=DEVICE)
    with torch.inference_mode():
        megakernel.run_blocks(blocks, 0, 3, x, blocks[0].norm1(x), lengths, 20, sync=CUDA)
    est.load_state_dict(other.state_dict())
    with torch.inference_mode():
        got = megakernel.run_blocks(blocks, 0, 3, x, blocks[0].norm1(x), lengths, 20, sync=CUDA)
        want = one_by_one(other.transformer_blocks, 0, 3, x, lengths, 20)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.fixture
def through_the_kernel(monkeypatch):
    """The estimator's levels through the kernel on the CPU too (Triton's interpreter): the runs counted."""
    runs = []
    real = megakernel.run_blocks

    def counted(*args, **kwargs):
        runs.append(args[2])
        return real(*args, **kwargs, sync=args[3].is_cuda)

    monkeypatch.setattr(megakernel, "ENABLED", True)  # on a GPU the estimator folds its blocks while the kernel is off
    monkeypatch.setattr(megakernel, "usable", lambda x, prefix: not getattr(prefix, "recording", False))
    monkeypatch.setattr(megakernel, "run_blocks", counted)
    return runs


def stream(d: FlowTokenDecoder, voice, tokens: list[int], schedule: list[int]) -> torch.Tensor:
    state, pieces, at = d.start(voice), [], 0
    for n in schedule:
        mel, state = d.decode_chunks([(tokens[at : at + n], state)])[0]
        pieces.append(mel)
        at += n
    mel, state = d.decode_chunks([(None, state)])[0]
    return torch.cat([*pieces, mel], 1)


# Whole streams through a kernel that is off by default: on a GPU only (in the interpreter the [history] case took
# 30 s of a 2-core CI machine's run, the [prefix] case 12 s). On a CPU the kernel's stages are checked against the
# blocks one by one above, and its ring writes by the rows at different steps below.
@pytest.mark.skipif(not CUDA, reason="whole streams through the kernel (off by default): on a GPU")
@pytest.mark.parametrize("history", [pytest.param(True, id="history"), pytest.param(False, id="prefix")])
def test_streams_decode_the_same_through_the_kernel(flow, voices, through_the_kernel, history):
    """Two streams batched, over the voice prefix and their kept frames (the ring written by the kernel), or over
    their windows and the prefix: the kernel's mel is the per-block path's."""
    tokens = [codes(16, seed=1), codes(13, seed=2)]

    def decode():
        d = FlowTokenDecoder(flow, DEVICE, dtype=torch.float32, prefix_min_rows=1, history_streams=2 if history else 0)
        d.set_voices(voices)
        states, mels = [d.start(voices[0]), d.start(voices[1])], [[], []]
        for lo, hi in ((0, 8),):                    # a first call, then the ends: a second call reads the ring
            rows = [(t[lo:hi] if lo < len(t) else None, s) for t, s in zip(tokens, states)]
            for i, (mel, state) in enumerate(d.decode_chunks(rows)):
                mels[i].append(mel)
                states[i] = state
        for i, (mel, _) in enumerate(d.decode_chunks([(None, s) for s in states])):
            mels[i].append(mel)
        assert (d.history is not None) == history
        return [torch.cat(m, 1).cpu() for m in mels]

    with monkeypatch_off():
        want = decode()
    got = decode()
    assert through_the_kernel, "no run went through the kernel"
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.shape[1] > 0
        torch.testing.assert_close(g, w, atol=5e-5, rtol=1e-4)


class monkeypatch_off:
    """The per-block path for a while: usable() False (the fixture turns ENABLED on, so the estimator does not fold)."""

    def __enter__(self):
        self.usable, megakernel.usable = megakernel.usable, lambda x, prefix: False

    def __exit__(self, *exc):
        megakernel.usable = self.usable


def test_rows_at_different_steps_read_their_steps_through_the_kernel(flow, voices, through_the_kernel):
    """The exact Euler-step solve (flow.py's solve_step): one pass of two streams' rows at steps 0 and 1, each reading
    its own step's prefix and ring keys and writing its ring at its step, as the per-block path does."""
    d = FlowTokenDecoder(flow, DEVICE, dtype=torch.float32, prefix_min_rows=1, history_streams=4)
    d.set_voices(voices)
    rows = []
    with monkeypatch_off():  # the first calls fill the rings (per block: the interpreter's time goes to the pass below)
        for i, voice in enumerate(voices):
            _, state = d.decode_chunks([(codes(12, seed=i), d.start(voice))])[0]  # its first call: a ring to read
            state = dataclasses.replace(state, tokens=state.tokens + tuple(codes(8, seed=10 + i)))
            rows.append((state, d.plan(state, state.received, False, capped=True)))
    spans = [d._solved(s, p) for s, p in rows]
    T = max(len(s.voice.prompt_tokens) + p.end - p.start for s, p in rows)
    batch = d.history_batch(rows, len(rows), T, max(b - a for a, b, _ in spans))
    rings = [t.clone() for t in (d.history.keys, d.history.values)]
    got = []
    with torch.inference_mode():
        mu, mask, spks, cond, noise_index, _ = flow.prepare(batch, True, d.history)
        inputs, lengths = flow.decoder.start(mu, mask, spks, cond, noise_index)
        for kernel in (False, True):
            d.history.keys.copy_(rings[0])
            d.history.values.copy_(rings[1])
            view = d.history.view(batch.voice_index, batch.history, batch.solve_frames)
            part, runs = inputs.clone(), len(through_the_kernel)
            with contextlib.nullcontext() if kernel else monkeypatch_off():
                flow.decoder.solve_step(part, mask, lengths, torch.tensor([0, 1], device=DEVICE), True, view)
            assert (len(through_the_kernel) > runs) == kernel
            got.append((part, d.history.keys.clone(), d.history.values.clone()))
    for want, have in zip(*got):
        torch.testing.assert_close(have, want, atol=2e-5, rtol=1e-5)


def test_the_kernel_compiles_for_sm90_with_one_thread_at_the_barrier():
    """What a GPU would run, compiled here for an H100/H200 (no GPU needed): Hopper's matrix instructions, and the
    barrier's atomics each made by one thread of a program (a program's threads arriving one by one would release
    the barrier early)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # (compiled, not interpreted)
    root = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(root / "tests"), str(root / "protos"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", "import kernel_compile_check as k; "
                           "c = k.compiled(k.MEGAKERNEL, aligned=True); print(c.metadata.shared); print(c.asm['ptx'])"],
                          env=env, cwd=root, capture_output=True, text=True, timeout=600, check=True).stdout
    shared, ptx = done.split("\n", 1)
    assert 0 < int(shared) <= 227 * 1024          # an H100's or H200's shared memory a program may take
    assert "wgmma.mma_async" in ptx
    atomics = [line for line in ptx.splitlines() if "atom.global.gpu" in line or "ld.global.gpu.acquire" in line]
    assert atomics and all(line.strip().startswith("@") for line in atomics), atomics  # predicated: one thread


# An Euler step's kernels at a first call of one stream with the per-frame work folded into the products (the default:
# prefetch_linear.FOLD), at most: 394 an Euler step and ~2 of a call's own setup on an H200 (docs/benchmarks.md,
# fold-2026-11-30), against 548 apart; any one fold turned off adds 29 (the convolutions) or 56 (the blocks)
FOLDED_LAUNCHES_PER_STEP = 420


@pytest.mark.skipif(not CUDA, reason="needs CUDA: the barrier in one launch, bf16 at the real size")
@pytest.mark.parametrize("path", ["folded", "per-block", "megakernel"])
def test_a_flow_calls_launches_are_counted(monkeypatch, path):
    """The launches of one Euler step at the real size, through the per-block kernels with the per-frame work folded
    into the products (the default), apart, and through the kernel (a level's blocks one launch), counted by the
    profiler, so that no count creeps back."""
    from services.vocoder.codec import prefetch_linear

    enabled = path == "megakernel"
    monkeypatch.setattr(megakernel, "ENABLED", enabled)
    monkeypatch.setattr(prefetch_linear, "FOLD", path == "folded")
    from torch.profiler import ProfilerActivity, profile

    from services.vocoder.codec.checkpoint import random_codec
    from services.vocoder.codec.config import moss_speech
    from services.vocoder.codec.voice import random_voice

    cfg = moss_speech()
    d = FlowTokenDecoder(random_codec(cfg, 0)[0], torch.device("cuda"), graphs=False)
    voice = random_voice(cfg.flow, prompt_tokens=40, seed=3)
    d.set_voices([voice])
    tokens = codes(8, seed=1)
    with torch.inference_mode():
        d.decode_chunks([(tokens, d.start(voice))])          # compiles
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            d.decode_chunks([(tokens, d.start(voice))])
            torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    steps, levels = d.flow.decoder.n_timesteps, 2 + cfg.flow.estimator.num_mid_blocks
    assert sum("_blocks" in n for n in names) == (steps * levels if enabled else 0)
    per_step = len(names) / steps
    bound = {"folded": FOLDED_LAUNCHES_PER_STEP, "per-block": megakernel.PER_BLOCK_LAUNCHES_PER_STEP,
             "megakernel": megakernel.LAUNCHES_PER_STEP}[path]
    assert per_step <= bound, per_step
