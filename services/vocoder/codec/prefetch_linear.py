"""The estimator's products at a call's few frames, their weights read before the kernel waits on the one before it.

A first call is a chain of ~550 dependent kernels an Euler step, each bound by the latency of its few dependent
loads, not by FLOPs or bytes (docs/codec.md, "The flow's fixed cost"). Under programmatic dependent launch (PDL,
services/common/launch.py) a kernel's programs start while the kernel before still runs, and wait
(`griddepcontrol.wait`) before their first load. A product's weights and bias depend on no kernel: here each program
loads its whole slice of them first (its BLOCK_N output channels, all K inputs: at most 32 KB), then waits, then
loads its frames, multiplies and stores. What is left on the chain's path is one load of the frames (written a
moment ago, in L2), the products and the store. cuBLAS's kernels take no part in PDL, and Triton's products that wait
before every load were slower than cuBLAS at these sizes (docs/benchmarks.md, 2026-11-27).

Shapes: x [..., K] with its last dimension contiguous, weight [N, K] (nn.Linear's), bias [N] → [..., N]; K at most
MAX_K (the estimator's 256 and 1024). GELU is the reference's exact (erf) form, on the float32 sum before the one
rounding, as fused_linear.py's.

Folded work: the per-frame kernel between two products (frame_ops.frame_norm: a residual, the next LayerNorm, the
history's keys) is a kernel of the chain's path, ~2 us at a stream's few frames. With `norm` a product LayerNorms its
frames as it loads them (a program holds whole frames when K fits one chunk; its gamma and beta load before the wait),
with `residual` it adds one to its sum before the one rounding, and with `keep` it copies the attention's new keys and
values into their stream's ring (frame_norm's `keep`; the heads shared out among the programs of a frame tile). So a
transformer block is five kernels where the kernel runs, not seven (estimator.BasicTransformerBlock.folded; FOLD).

Measured on an H200 (docs/benchmarks.md, prefetch-2026-11-30): 56 blocks' products and per-frame kernels without
their attention 13.3 us a block at 80 frames against 21.0 through cuBLAS (14.6 against 21.4 at 160); whole flow
calls, each variant run twice in both orders: a stream's first call 18.7-19.0 ms against 24.6 (23.7-24.1 against
30.9 beside the llm's decode), its steady call 21.8 against 25.9-26.2. At 320 frames (a first call of 4 streams)
calls took the same time; at 640 (their steady call) 4% longer: so the kernel runs up to MAX_ROWS frames, cuBLAS above.
bench/codec_history.py --variants per-block,prefetch compares whole flow calls; bench/studies/prefetch_linear.py each
product alone and in a chain.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.common import launch
from services.vocoder.codec import frame_ops
from services.vocoder.codec.fused_linear import linear_gelu

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover (CI installs triton; the PyTorch form needs none)
    triton = None
else:
    from services.common.launch import inputs_ready
    from services.vocoder.codec.frame_ops import _keep_frames, _normalize
    from services.vocoder.codec.fused_linear import exact_gelu

ENABLED = True     # False: cuBLAS's products at every size (bench/codec_history.py's `per-block` variant)
FOLD = True        # the estimator's norms, residuals and kept keys in these products where they run (False: apart)
MAX_ROWS = 160     # frames (rows of x) up to which the kernel runs (a call of one stream); cuBLAS's products above
K_CHUNK = 256      # a program's weight slice is loaded as up to four [K_CHUNK, BLOCK_N] tiles
MAX_K = 4 * K_CHUNK
SLICE_BYTES = 128 << 10  # a program's weight slice at most (an H200's SM has 227 KB of shared memory)
TILE = None        # (frames, channels, warps) per program; None: tiles() (the study sweeps them)


def on_gpu(x: torch.Tensor) -> bool:
    """frame_ops.on_gpu (the tests set either: every codec kernel, or this module's alone)."""
    return frame_ops.on_gpu(x)


def runs(x: torch.Tensor, inputs: int | None = None) -> bool:
    """Whether linear() runs the kernel on frames like x [..., K] (with `inputs` K, if not x's)."""
    rows = x.numel() // x.shape[-1]
    return ENABLED and on_gpu(x) and rows <= MAX_ROWS and (inputs or x.shape[-1]) <= MAX_K


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gelu: bool = False,
           norm: nn.LayerNorm | None = None, residual: torch.Tensor | None = None, keep: tuple | None = None):
    """x [..., K] → [gelu](norm(x) @ weight.T + bias) + residual [..., N], each part optional; keep: frame_norm's,
    done on the way. The kernel where runs(x); else cuBLAS's product (with fused_linear.py's GELU), and the rest op by
    op (the estimator folds only where the kernel runs)."""
    if runs(x, weight.shape[1]) and (norm is None or x.shape[-1] <= K_CHUNK):
        return kernel(x, weight, bias, gelu, norm, residual, keep)
    if keep is not None:
        frame_ops.keep_reference(*keep)
    if norm is not None:
        x = norm(x)
    out = linear_gelu(x, weight, bias) if gelu else F.linear(x, weight, bias)
    return out if residual is None else out + residual


def causal_conv(x: torch.Tensor, taps: torch.Tensor, bias: torch.Tensor | None, k: int, left: tuple | None = None):
    """A causal convolution over frames: x [B, T, C], taps [Cout, k·C] (frame_ops.taps_weight), left as
    frame_ops.causal_unfold's → causal_unfold(x, k, left) @ taps.T + bias [B, T, Cout]. Where the kernel runs and FOLD,
    it reads each tap's frames itself (a program's chunk j is tap j: C at most K_CHUNK) and keeps a history's last
    frames on the way: one kernel, not two; else causal_unfold's kernel, then the product."""
    C = x.shape[-1]
    if FOLD and runs(x, k * C) and C <= K_CHUNK and k <= MAX_K // K_CHUNK:
        return kernel(x, taps, bias, conv=(k, left))
    return linear(frame_ops.causal_unfold(x, k, left), taps, bias)


def tiles(M: int, K: int = K_CHUNK, itemsize: int = 2) -> tuple[int, int, int]:
    """(frames, channels, warps) per program: 16 x 16 on 2 warps up to 160 frames (a call of one stream: 5 frame
    tiles, 16-64 channel tiles, a weight slice of 8-32 KB), 32 x 64 on 4 warps above. On an H200, the fastest of six
    tiles for a chain of 56 blocks at 80 and 160 frames, and at 320 and 640 (bench/studies/prefetch_linear.py). The
    channels halve while the slice (K x channels of itemsize bytes) would pass SLICE_BYTES: float32 at K 1,024 and
    64 channels would need 256 KB of shared memory, more than an SM has."""
    block_m, block_n, warps = TILE if TILE is not None else (16, 16, 2) if M <= 160 else (32, 64, 4)
    while block_n > 16 and K * block_n * itemsize > SLICE_BYTES:
        block_n //= 2
    return block_m, block_n, warps


def kernel(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, gelu: bool = False,
           norm: nn.LayerNorm | None = None, residual: torch.Tensor | None = None, keep: tuple | None = None,
           conv: tuple | None = None):
    """The Triton kernel (on CPU tensors: Triton's interpreter, for the tests). conv = (k, left): x [B, T, C] are a
    causal convolution's frames, read tap by tap (causal_conv)."""
    taps, left = conv if conv is not None else (0, None)
    C = x.shape[-1]
    K = taps * C if taps else C
    N = weight.shape[0]
    if K > MAX_K or weight.shape[1] != K:
        raise ValueError(f"prefetch_linear: K {K} against a weight of {tuple(weight.shape)} (at most {MAX_K})")
    if (norm is not None or taps) and C > K_CHUNK:
        raise ValueError(f"prefetch_linear: a norm or a tap over {C} channels: a program holds whole frames up to "
                         f"{K_CHUNK}")
    if taps and norm is not None:
        raise ValueError("prefetch_linear: a norm before a convolution's taps is not folded")
    x2 = x.reshape(-1, C)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    weight = weight if weight.stride(1) == 1 else weight.contiguous()
    M = x2.shape[0]
    out = torch.empty(*x.shape[:-1], N, device=x.device, dtype=x.dtype)
    res = residual.reshape(M, N) if residual is not None else out
    if res.stride(1) != 1:
        res = res.contiguous()
    gamma, beta, eps = (norm.weight, norm.bias, norm.eps) if norm is not None else (weight, weight, 0.0)
    T = x.shape[-2] if x.dim() > 1 else 1
    kept, strides, ring, heads, head_d = frame_ops.keep_arguments(keep, x2)
    frames, rows = left[:2] if left is not None else (x2, x2)                              # (unread without)
    keep_rows, lengths = left[2:] if left is not None and len(left) == 4 else (x2, x2)
    block_m, block_n, warps = tiles(M, K, x.element_size())
    chunk = triton.next_power_of_2(C) if taps else min(K_CHUNK, triton.next_power_of_2(K))
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    pdl = launch.pdl(x)
    _prefetch_linear[grid](x2, weight, bias if bias is not None else weight, gamma, beta, res, *kept, frames, rows,
                           keep_rows, lengths, out, M, N, K, T, x2.stride(0), weight.stride(0), res.stride(0),
                           *strides, ring, *(frames.stride()[:2] if left is not None else (0, 0)), eps,
                           HAS_BIAS=bias is not None, GELU=gelu, NORM=norm is not None, RESIDUAL=residual is not None,
                           KEEP=keep is not None, HEADS=heads, HEAD_D=head_d, HEADS_HERE=triton.cdiv(heads, grid[1]),
                           TAPS=taps, LEFT=left is not None, KEEP_LEFT=left is not None and len(left) == 4,
                           IEEE=x.dtype == torch.float32, CHUNK=chunk, CHUNKS=taps or triton.cdiv(K, chunk),
                           BLOCK_M=block_m, BLOCK_N=block_n, PDL=pdl, num_warps=warps, launch_pdl=pdl)
    return out


if triton is not None:
    @triton.jit
    def _weight_tile(W, offs_n, col_ok, sw, k0, end, CHUNK: tl.constexpr):
        """[CHUNK, BLOCK_N]: the weight's rows offs_n, inputs k0 .. k0 + CHUNK, as columns (zero from end)."""
        offs_k = k0 + tl.arange(0, CHUNK)
        return tl.load(W + offs_n[None, :] * sw + offs_k[:, None], mask=(offs_k < end)[:, None] & col_ok[None, :],
                       other=0.0)

    @triton.jit
    def _chunk_weights(W, offs_n, col_ok, sw, j: tl.constexpr, inner, C, TAPS: tl.constexpr, CHUNK: tl.constexpr):
        """Chunk j of the weight slice: inputs j·CHUNK on, or with TAPS tap j's C."""
        if TAPS:
            return _weight_tile(W, offs_n, col_ok, sw, j * C, (j + 1) * C, CHUNK)
        return _weight_tile(W, offs_n, col_ok, sw, j * CHUNK, inner, CHUNK)

    @triton.jit
    def _frames_tile(X, offs_m, row_ok, sx, k0, inner, CHUNK: tl.constexpr):
        """[BLOCK_M, CHUNK]: frames offs_m, inputs k0 .. k0 + CHUNK (zero past inner)."""
        offs_k = k0 + tl.arange(0, CHUNK)
        return tl.load(X + offs_m[:, None] * sx + offs_k[None, :], mask=row_ok[:, None] & (offs_k < inner)[None, :],
                       other=0.0)

    @triton.jit
    def _tap_tile(X, FRAMES, offs_m, row_ok, left_row, T, C, sx, sf_r, sf_t, j: tl.constexpr, TAPS: tl.constexpr,
                  LEFT: tl.constexpr, CHUNK: tl.constexpr):
        """[BLOCK_M, CHUNK]: tap j of frames offs_m (rows of T): frame t - (TAPS-1) + j of the row; before its first,
        the left frames' (frame TAPS-1 + that of the row's left_row), or zeros (frame_ops.causal_unfold's)."""
        offs_c = tl.arange(0, CHUNK)
        col_ok = (offs_c < C)[None, :]
        src = offs_m % T - (TAPS - 1) + j
        a = tl.load(X + (offs_m - (TAPS - 1) + j)[:, None] * sx + offs_c[None, :],
                    mask=(row_ok & (src >= 0))[:, None] & col_ok, other=0.0)
        if LEFT:
            a += tl.load(FRAMES + left_row[:, None] * sf_r + (TAPS - 1 + src)[:, None] * sf_t + offs_c[None, :],
                         mask=(row_ok & (src < 0))[:, None] & col_ok, other=0.0)
        return a

    @triton.jit
    def _keep_left(X, FRAMES, offs_m, row_ok, left_row, KEEP_ROWS, LENGTHS, T, C, sx, sf_r, sf_t,
                   TAPS: tl.constexpr, CHUNK: tl.constexpr):
        """For each row whose first frame is among offs_m: its last TAPS-1 frames (before lengths, the left frames'
        last for a row shorter than them) into FRAMES' row KEEP_ROWS[b], where its stream's next call reads them."""
        b, t = offs_m // T, offs_m % T
        first = row_ok & (t == 0)
        keep_row = tl.load(KEEP_ROWS + b, mask=first, other=0)
        n = tl.load(LENGTHS + b, mask=first, other=0).to(tl.int32)
        offs_c = tl.arange(0, CHUNK)
        col_ok = (offs_c < C)[None, :]
        for j in tl.static_range(TAPS - 1):
            src = n - (TAPS - 1) + j
            kept = tl.load(X + (b * T + src)[:, None] * sx + offs_c[None, :], mask=(first & (src >= 0))[:, None] & col_ok,
                           other=0.0)
            kept += tl.load(FRAMES + left_row[:, None] * sf_r + (TAPS - 1 + src)[:, None] * sf_t + offs_c[None, :],
                            mask=(first & (src < 0))[:, None] & col_ok, other=0.0)
            tl.store(FRAMES + keep_row[:, None] * sf_r + j * sf_t + offs_c[None, :], kept, mask=first[:, None] & col_ok)

    @triton.jit
    def _chunk_frames(X, FRAMES, offs_m, row_ok, left_row, sx, j: tl.constexpr, inner, T, C, sf_r, sf_t,
                      TAPS: tl.constexpr, LEFT: tl.constexpr, CHUNK: tl.constexpr):
        if TAPS:
            return _tap_tile(X, FRAMES, offs_m, row_ok, left_row, T, C, sx, sf_r, sf_t, j, TAPS, LEFT, CHUNK)
        return _frames_tile(X, offs_m, row_ok, sx, j * CHUNK, inner, CHUNK)

    @triton.jit
    def _dot(a, w, acc, IEEE: tl.constexpr):
        if IEEE:  # float32 inputs (the tests): no TF32 rounding
            return tl.dot(a, w, acc, input_precision="ieee")
        return tl.dot(a, w, acc)

    @triton.jit
    def _prefetch_linear(X, W, BIAS, GAMMA, BETA, RES, K, V, KR, VR, KEEP_ROWS, AT, LENGTHS, FRAMES, LEFT_ROWS,
                         LEFT_KEEP, LEFT_LENGTHS, OUT, M, N, inner, T, sx, sw, s_res, sk_b, sk_h, sk_t, sv_b, sv_h,
                         sv_t, skr_r, skr_h, skr_t, svr_r, svr_h, svr_t, ring, sf_r, sf_t, eps,
                         HAS_BIAS: tl.constexpr, GELU: tl.constexpr, NORM: tl.constexpr, RESIDUAL: tl.constexpr,
                         KEEP: tl.constexpr, HEADS: tl.constexpr, HEAD_D: tl.constexpr, HEADS_HERE: tl.constexpr,
                         TAPS: tl.constexpr, LEFT: tl.constexpr, KEEP_LEFT: tl.constexpr, IEEE: tl.constexpr,
                         CHUNK: tl.constexpr, CHUNKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         PDL: tl.constexpr):
        """x [M, inner] (or with TAPS its frames [M, C], inner = TAPS·C) → out [M, N] (module docstring)."""
        C = inner // TAPS if TAPS else inner
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = offs_n < N
        # The weight slice, the bias and the norm's gamma and beta first: no kernel before writes them, so they load
        # while it still runs.
        w0 = _chunk_weights(W, offs_n, col_ok, sw, 0, inner, C, TAPS, CHUNK)
        if CHUNKS > 1:
            w1 = _chunk_weights(W, offs_n, col_ok, sw, 1, inner, C, TAPS, CHUNK)
        if CHUNKS > 2:
            w2 = _chunk_weights(W, offs_n, col_ok, sw, 2, inner, C, TAPS, CHUNK)
        if CHUNKS > 3:
            w3 = _chunk_weights(W, offs_n, col_ok, sw, 3, inner, C, TAPS, CHUNK)
        if HAS_BIAS:
            b = tl.load(BIAS + offs_n, mask=col_ok, other=0.0).to(tl.float32)
        if NORM:  # (K fits one chunk: each program's frames are whole)
            offs_k = tl.arange(0, CHUNK)
            k_ok = offs_k < inner
            gamma = tl.load(GAMMA + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            beta = tl.load(BETA + offs_k, mask=k_ok, other=0.0).to(tl.float32)
        inputs_ready(PDL)
        # Then the frames, which the kernel before wrote.
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < M
        left_row = offs_m  # (unread without LEFT)
        if LEFT:
            left_row = tl.load(LEFT_ROWS + offs_m // T, mask=row_ok, other=0)
        if KEEP:  # the attention before has read the rings: its new keys and values go in, a share of heads each
            _keep_frames(offs_m, row_ok, T, K, V, KR, VR, KEEP_ROWS, AT, LENGTHS, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                         skr_r, skr_h, skr_t, svr_r, svr_h, svr_t, ring, tl.program_id(1) * HEADS_HERE, HEADS, HEAD_D,
                         HEADS_HERE)
        if KEEP_LEFT:  # (the left frames this call's convolution reads lie in other rows of FRAMES)
            if tl.program_id(1) == 0:
                _keep_left(X, FRAMES, offs_m, row_ok, left_row, LEFT_KEEP, LEFT_LENGTHS, T, C, sx, sf_r, sf_t, TAPS,
                           CHUNK)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        a = _chunk_frames(X, FRAMES, offs_m, row_ok, left_row, sx, 0, inner, T, C, sf_r, sf_t, TAPS, LEFT, CHUNK)
        if NORM:  # rounded once, as frame_norm stores it for a product apart
            a = _normalize(a.to(tl.float32), k_ok, gamma, beta, inner, eps).to(X.dtype.element_ty)
        acc = _dot(a, w0, acc, IEEE)
        if CHUNKS > 1:
            acc = _dot(_chunk_frames(X, FRAMES, offs_m, row_ok, left_row, sx, 1, inner, T, C, sf_r, sf_t, TAPS, LEFT,
                                     CHUNK), w1, acc, IEEE)
        if CHUNKS > 2:
            acc = _dot(_chunk_frames(X, FRAMES, offs_m, row_ok, left_row, sx, 2, inner, T, C, sf_r, sf_t, TAPS, LEFT,
                                     CHUNK), w2, acc, IEEE)
        if CHUNKS > 3:
            acc = _dot(_chunk_frames(X, FRAMES, offs_m, row_ok, left_row, sx, 3, inner, T, C, sf_r, sf_t, TAPS, LEFT,
                                     CHUNK), w3, acc, IEEE)
        if HAS_BIAS:
            acc += b[None, :]
        if GELU:
            acc = exact_gelu(acc)
        ok = row_ok[:, None] & col_ok[None, :]
        if RESIDUAL:
            acc += tl.load(RES + offs_m[:, None] * s_res + offs_n[None, :], mask=ok, other=0.0).to(tl.float32)
        tl.store(OUT + offs_m[:, None] * N + offs_n[None, :], acc.to(OUT.dtype.element_ty), mask=ok)
