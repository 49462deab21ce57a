"""The estimator's per-frame work between its matrix products, in as few kernels as the math allows.

Between two matrix products the estimator only works frame by frame: a LayerNorm over a frame's channels, Mish,
a residual or a time term added, the frames a causal convolution reads gathered. In PyTorch each of those is a
kernel of its own (a resnet block ~19, a transformer block 10), and a first block's flow call, ~11,000 kernels
over its 10 Euler steps, is bound by running them one after another (docs/benchmarks.md). Here:

- `frame_norm`: [LayerNorm → Mish] → + a per-row term or a residual → [a second LayerNorm of the sum], one
  kernel where PyTorch takes up to six;
- `causal_unfold`: the k frames a causal convolution reads, the prompt prefix's before a row's first, one kernel
  (no padding or concatenation first);
- `euler_step`: the guided Euler update of the flow's solver, written into both halves of the next estimator
  input, one kernel.

Each has a PyTorch form (CPU, and the tests' oracle) and a Triton kernel (CUDA; Triton's interpreter in the
tests). The kernels compute in float32 and round once, where PyTorch rounds after every op.
Shapes: frames are rows of C channels, [B, T, C] with C contiguous.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover (CI installs triton; the PyTorch forms need none)
    triton = None
else:
    from services.common.launch import inputs_ready

from services.common import launch

ROWS_PER_PROGRAM = 16  # frames per program of frame_norm: a few KB of channels each, enough programs to fill a GPU
NORM_WARPS = 4         # warps per program of frame_norm (Triton's default). At 32 streams (5,120 frames: 320 programs,
                       # ~10 warps a multiprocessor) a norm took 5.8 us for ~8-10 MB moved, ~2x what the bandwidth
                       # allows (docs/benchmarks.md, 2026-12-02). 4 or 8 frames, or 8 warps, a program measured
                       # within ±0.3 us of it; 32 frames 1.3 us slower: the norm's time is not its programs' shape


def on_gpu(x: torch.Tensor) -> bool:
    return x.is_cuda and triton is not None


# ---- frame_norm --------------------------------------------------------------------------------------------
def frame_norm(h: torch.Tensor, norm: nn.LayerNorm | None = None, mish: bool = False, rows: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, then: nn.LayerNorm | None = None, keep: tuple | None = None):
    """h [B, T, C] → out = [mish](norm(h)) + rows + residual, each part optional; and then(out) if `then` is given.

    rows [1 or B, C]: a term per row (the time embedding's), the same for every frame; residual [B, T, C].
    keep: an attention's keys and values of the same frames into a stream history's ring (history.py), after the
    attention has read the ring: (k, v [B, heads, T, d], ring keys, ring values [S, heads, ring, d], rows [B],
    at [B], lengths [B]): row b's last min(lengths[b], ring) frames, the i-th at place (at[b] + i) % ring.
    Returns out, or (out, then(out))."""
    if on_gpu(h):
        return kernel(h, norm, mish, rows, residual, then, keep)
    if keep is not None:
        keep_reference(*keep)
    return reference(h, norm, mish, rows, residual, then)


def keep_reference(k, v, ring_k, ring_v, rows, at, lengths) -> None:
    ring = ring_k.shape[2]
    for b in range(k.shape[0]):
        n = int(lengths[b])
        new = torch.arange(max(0, n - ring), n, device=k.device)
        places = (int(at[b]) + new) % ring
        ring_k[rows[b], :, places] = k[b, :, new]
        ring_v[rows[b], :, places] = v[b, :, new]


def reference(h, norm=None, mish=False, rows=None, residual=None, then=None):
    """The PyTorch form, op by op."""
    out = norm(h) if norm is not None else h
    if mish:
        out = F.mish(out)
    if rows is not None:
        out = out + rows[:, None, :]
    if residual is not None:
        out = out + residual
    return (out, then(out)) if then is not None else out


def kernel(h, norm=None, mish=False, rows=None, residual=None, then=None, keep=None):
    """The Triton kernel (on CPU tensors: Triton's interpreter, for the tests)."""
    B, T, C = h.shape
    h2 = h.reshape(B * T, C)
    out = torch.empty(B, T, C, device=h.device, dtype=h.dtype)
    second = torch.empty_like(out) if then is not None else out
    res = residual.reshape(B * T, C) if residual is not None else h2
    unused = h2  # a pointer the kernel does not read
    w1, b1, eps1 = (norm.weight, norm.bias, norm.eps) if norm is not None else (unused, unused, 0.0)
    w2, b2, eps2 = (then.weight, then.bias, then.eps) if then is not None else (unused, unused, 0.0)
    row_terms = rows if rows is not None else unused
    row_stride = 0 if rows is None or rows.shape[0] == 1 else rows.stride(0)
    kept, strides, ring, heads, head_d = keep_arguments(keep, h)
    grid = (triton.cdiv(B * T, ROWS_PER_PROGRAM),)
    _frame_norm[grid](h2, w1, b1, row_terms, res, w2, b2, out, second, *kept, B * T, T, C, h2.stride(0), row_stride,
                      res.stride(0), *strides, ring, eps1, eps2,
                      NORM=norm is not None, MISH=mish, ROWS=rows is not None, RESIDUAL=residual is not None,
                      THEN=then is not None, KEEP=keep is not None, HEADS=heads, HEAD_D=head_d,
                      BLOCK_M=ROWS_PER_PROGRAM, BLOCK_C=triton.next_power_of_2(C), PDL=(pdl := launch.pdl(h)),
                      launch_pdl=pdl, num_warps=NORM_WARPS)
    return (out, second) if then is not None else out


def keep_arguments(keep: tuple | None, unused: torch.Tensor):
    """frame_norm's `keep` → what a kernel's _keep_frames takes: (k, v, ring keys, ring values, rows, at, lengths),
    their twelve strides (k's, v's and the rings' first three), the ring's frames, heads and head width; without a
    keep, tensors the kernel does not read and placeholders."""
    if keep is None:
        return (unused,) * 7, [0] * 12, 1, 1, 1
    k, v, ring_k, ring_v = keep[:4]
    strides = [*k.stride()[:3], *v.stride()[:3], *ring_k.stride()[:3], *ring_v.stride()[:3]]
    return keep, strides, ring_k.shape[2], k.shape[1], k.shape[3]


# ---- causal_unfold -----------------------------------------------------------------------------------------
def causal_unfold(x: torch.Tensor, k: int, left: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """x [B, T, C] → [B, T, k·C]: row t holds frames t-k+1 … t one after another (tap-major, each frame's C
    channels contiguous, so the kernel's stores are whole rows), and a causal convolution is one matrix product
    over it with its weight [Cout, Cin, k] laid out as [Cout, k, Cin] (taps_weight).

    Frames before a row's first are zeros, or, with left = (frames [R, k-1, C], rows [B]), the prompt prefix's
    last frames of row b's voice: frames[rows[b]]. With left = (frames, rows, keep [B], lengths [B]) (a stream's
    history, history.py) each row also leaves the k-1 frames before its end (lengths[b]) in frames[keep[b]], where
    its stream's next call reads them (keep and rows never share a row in one call)."""
    if on_gpu(x):
        return unfold_kernel(x, k, left)
    return unfold_reference(x, k, left)


def taps_weight(weight: torch.Tensor) -> torch.Tensor:
    """An nn.Conv1d weight [Cout, Cin, k] → [Cout, k·Cin], the order causal_unfold lays frames out in."""
    return weight.permute(0, 2, 1).reshape(weight.shape[0], -1)


def unfold_reference(x, k, left=None):
    if left is None:
        padded = F.pad(x, (0, 0, k - 1, 0))
    else:
        frames, rows = left[:2]
        padded = torch.cat([frames.index_select(0, rows), x], 1)
    out = padded.unfold(1, k, 1).transpose(2, 3).reshape(*x.shape[:2], -1)   # [B, T, C, k] → [B, T, k·C]
    if left is not None and len(left) == 4:
        _, _, keep, lengths = left
        for b in range(x.shape[0]):
            n = int(lengths[b])                       # padded frame n + i is frame n - (k-1) + i of the row
            left[0][keep[b]] = padded[b, n : n + k - 1]
    return out


def unfold_kernel(x, k, left=None):
    B, T, C = x.shape
    out = torch.empty(B, T, k, C, device=x.device, dtype=x.dtype)
    frames, rows = left[:2] if left is not None else (x, x)  # unread without a prefix
    keep, lengths = left[2:] if left is not None and len(left) == 4 else (rows, rows)
    grid = (triton.cdiv(T, ROWS_PER_PROGRAM), B)
    _causal_unfold[grid](x, frames, rows, keep, lengths, out, T, C, *x.stride()[:2], *frames.stride()[:2],
                         *out.stride()[:2], K=k, LEFT=left is not None, KEEP=left is not None and len(left) == 4,
                         BLOCK_T=ROWS_PER_PROGRAM, BLOCK_C=triton.next_power_of_2(C), PDL=(pdl := launch.pdl(x)),
                         launch_pdl=pdl)
    return out.view(B, T, k * C)


# ---- euler_step --------------------------------------------------------------------------------------------
def euler_step(inputs: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, dt: float | torch.Tensor,
               cfg_rate: float) -> None:
    """One guided Euler step of the flow's solver, in place.

    inputs [2B, T, Cin]: the estimator's input, its first C channels the state x of the B rows (twice: the
    conditioned rows, then the same x for the unconditioned ones); v [2B, T, C]: the estimator's velocity;
    mask [B, T, 1]: the rows' valid frames (the velocity is zero past them, as the reference's estimator masks
    its output); dt: the step, or each row's [B] (rows at different steps: flow.py's solve_step).
    x ← x + dt·((1 + r)·v_cond - r·v_free), into both halves."""
    if on_gpu(inputs):
        return euler_kernel(inputs, v, mask, dt, cfg_rate)
    return euler_reference(inputs, v, mask, dt, cfg_rate)


def euler_reference(inputs, v, mask, dt, cfg_rate):
    B, C = mask.shape[0], v.shape[-1]
    x = inputs[:B, :, :C]
    v_cond, v_free = v[:B] * mask, v[B:] * mask
    if isinstance(dt, torch.Tensor):  # float32, as the kernel reads it: the sum rounds once, into inputs
        dt = dt.float()[:, None, None]
    x = x + dt * ((1.0 + cfg_rate) * v_cond - cfg_rate * v_free)
    inputs[:B, :, :C] = x
    inputs[B:, :, :C] = x


def euler_kernel(inputs, v, mask, dt, cfg_rate):
    B, T, _ = mask.shape
    C = v.shape[-1]
    per_row = isinstance(dt, torch.Tensor)
    grid = (triton.cdiv(T, ROWS_PER_PROGRAM), B)
    _euler_step[grid](inputs, v, mask, dt if per_row else mask, B, T, C, *inputs.stride()[:2], *v.stride()[:2],
                      *mask.stride()[:2], 0.0 if per_row else float(dt), float(cfg_rate), DT_PER_ROW=per_row,
                      BLOCK_T=ROWS_PER_PROGRAM, BLOCK_C=triton.next_power_of_2(C), PDL=(pdl := launch.pdl(inputs)),
                      launch_pdl=pdl)


if triton is not None:
    @triton.jit
    def _normalize(x, col_ok, w, b, C, eps):
        """x [M, BLOCK_C] float32 (zeros past C) → LayerNorm over its C channels, times w plus b ([BLOCK_C] float32,
        zeros past C: so are the result's)."""
        mean = tl.sum(x, 1) / C
        d = tl.where(col_ok[None, :], x - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, 1) / C + eps)
        return d * rstd[:, None] * w[None, :] + b[None, :]

    @triton.jit
    def _layer_norm(x, col_ok, W, B, C, eps, BLOCK_C: tl.constexpr):
        """x [M, BLOCK_C] float32 (zeros past C) → LayerNorm over its C channels, times W plus B."""
        offs_c = tl.arange(0, BLOCK_C)
        w = tl.load(W + offs_c, mask=col_ok, other=0.0).to(tl.float32)
        b = tl.load(B + offs_c, mask=col_ok, other=0.0).to(tl.float32)
        return _normalize(x, col_ok, w, b, C, eps)

    @triton.jit
    def _keep_frames(offs_m, row_ok, T, K, V, KR, VR, KEEP_ROWS, AT, LENGTHS, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                     skr_r, skr_h, skr_t, svr_r, svr_h, svr_t, ring, first_head, HEADS: tl.constexpr,
                     HEAD_D: tl.constexpr, HEADS_HERE: tl.constexpr):
        """Frames offs_m's keys and values, heads first_head .. + HEADS_HERE (those below HEADS), into their stream's
        ring: a row's last `ring` frames, the i-th at place (at + i) % ring (frame_norm's `keep`)."""
        b, t = offs_m // T, offs_m % T
        n = tl.load(LENGTHS + b, mask=row_ok, other=0).to(tl.int32)
        kept = row_ok & (t < n) & (t >= n - ring)
        hrow = tl.load(KEEP_ROWS + b, mask=row_ok, other=0)
        place = (tl.load(AT + b, mask=row_ok, other=0) + t) % ring
        offs_d = tl.arange(0, HEAD_D)
        for j in tl.static_range(HEADS_HERE):
            hh = first_head + j
            here = (kept & (hh < HEADS))[:, None]
            key = tl.load(K + b[:, None] * sk_b + hh * sk_h + t[:, None] * sk_t + offs_d[None, :], mask=here)
            tl.store(KR + hrow[:, None] * skr_r + hh * skr_h + place[:, None] * skr_t + offs_d[None, :], key, mask=here)
            value = tl.load(V + b[:, None] * sv_b + hh * sv_h + t[:, None] * sv_t + offs_d[None, :], mask=here)
            tl.store(VR + hrow[:, None] * svr_r + hh * svr_h + place[:, None] * svr_t + offs_d[None, :], value,
                     mask=here)

    @triton.jit
    def _frame_norm(H, W1, B1, ROW_TERMS, RES, W2, B2, OUT, OUT2, K, V, KR, VR, KEEP_ROWS, AT, LENGTHS,
                    M, T, C, sh, s_rows, s_res, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, skr_r, skr_h, skr_t,
                    svr_r, svr_h, svr_t, ring, eps1, eps2,
                    NORM: tl.constexpr, MISH: tl.constexpr, ROWS: tl.constexpr, RESIDUAL: tl.constexpr,
                    THEN: tl.constexpr, KEEP: tl.constexpr, HEADS: tl.constexpr, HEAD_D: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
        inputs_ready(PDL)
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_c = tl.arange(0, BLOCK_C)
        row_ok, col_ok = offs_m < M, offs_c < C
        if KEEP:  # these frames' keys and values into their stream's ring: the row's last `ring` frames
            _keep_frames(offs_m, row_ok, T, K, V, KR, VR, KEEP_ROWS, AT, LENGTHS, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t,
                         skr_r, skr_h, skr_t, svr_r, svr_h, svr_t, ring, 0, HEADS, HEAD_D, HEADS)
        ok = row_ok[:, None] & col_ok[None, :]
        x = tl.load(H + offs_m[:, None] * sh + offs_c[None, :], mask=ok, other=0.0).to(tl.float32)
        if NORM:
            x = _layer_norm(x, col_ok, W1, B1, C, eps1, BLOCK_C)
        if MISH:  # x·tanh(softplus(x)) = x·n(n+2)/(n(n+2)+2), n = e^x; past 20 it is x to float32 precision
            n = tl.exp(tl.minimum(x, 20.0))
            y = n * (n + 2.0)
            x = tl.where(x > 20.0, x, x * y / (y + 2.0))
        if ROWS:
            x += tl.load(ROW_TERMS + (offs_m // T)[:, None] * s_rows + offs_c[None, :], mask=ok, other=0.0).to(tl.float32)
        if RESIDUAL:
            x += tl.load(RES + offs_m[:, None] * s_res + offs_c[None, :], mask=ok, other=0.0).to(tl.float32)
        out = x.to(OUT.dtype.element_ty)
        tl.store(OUT + offs_m[:, None] * C + offs_c[None, :], out, mask=ok)
        if THEN:  # the next norm reads the sum as stored, as it would from memory
            x2 = _layer_norm(tl.where(ok, out.to(tl.float32), 0.0), col_ok, W2, B2, C, eps2, BLOCK_C)
            tl.store(OUT2 + offs_m[:, None] * C + offs_c[None, :], x2.to(OUT2.dtype.element_ty), mask=ok)

    @triton.jit
    def _causal_unfold(X, FRAMES, ROWS, KEEP_ROWS, LENGTHS, OUT, T, C, sx_b, sx_t, sf_r, sf_t, so_b, so_t,
                       K: tl.constexpr, LEFT: tl.constexpr, KEEP: tl.constexpr, BLOCK_T: tl.constexpr,
                       BLOCK_C: tl.constexpr, PDL: tl.constexpr):
        inputs_ready(PDL)
        b = tl.program_id(1)
        offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_c = tl.arange(0, BLOCK_C)
        t_ok, col_ok = offs_t < T, offs_c < C
        if LEFT:
            row = tl.load(ROWS + b)
        if KEEP:  # the row's last K-1 frames (the left frames' last, for a row shorter than them) for its next call
            if tl.program_id(0) == 0:
                keep_row, n = tl.load(KEEP_ROWS + b), tl.load(LENGTHS + b).to(tl.int32)
                for j in tl.static_range(K - 1):
                    src = n - (K - 1) + j
                    kept = tl.load(X + b * sx_b + src * sx_t + offs_c, mask=col_ok & (src >= 0), other=0.0)
                    kept += tl.load(FRAMES + row * sf_r + (K - 1 + src) * sf_t + offs_c, mask=col_ok & (src < 0),
                                    other=0.0)
                    tl.store(FRAMES + keep_row * sf_r + j * sf_t + offs_c, kept, mask=col_ok)
        for j in tl.static_range(K):
            src = offs_t - (K - 1) + j                                   # the frame tap j reads
            inside = t_ok & (src >= 0)
            v = tl.load(X + b * sx_b + src[:, None] * sx_t + offs_c[None, :], mask=inside[:, None] & col_ok[None, :],
                        other=0.0)
            if LEFT:  # frames before the row's first: the prefix's last K-1, frame K-1+src of them
                before = t_ok & (src < 0)
                v += tl.load(FRAMES + row * sf_r + (K - 1 + src)[:, None] * sf_t + offs_c[None, :],
                             mask=before[:, None] & col_ok[None, :], other=0.0)
            tl.store(OUT + b * so_b + offs_t[:, None] * so_t + j * C + offs_c[None, :], v,
                     mask=t_ok[:, None] & col_ok[None, :])

    @triton.jit
    def _euler_step(IN, V, MASK, DT, B, T, C, si_b, si_t, sv_b, sv_t, sm_b, sm_t, dt, cfg_rate,
                    DT_PER_ROW: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
        inputs_ready(PDL)
        b = tl.program_id(1)
        if DT_PER_ROW:
            dt = tl.load(DT + b).to(tl.float32)
        offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        offs_c = tl.arange(0, BLOCK_C)
        ok = (offs_t < T)[:, None] & (offs_c < C)[None, :]
        at = offs_t[:, None] * si_t + offs_c[None, :]
        x = tl.load(IN + b * si_b + at, mask=ok, other=0.0).to(tl.float32)
        v_cond = tl.load(V + b * sv_b + offs_t[:, None] * sv_t + offs_c[None, :], mask=ok, other=0.0).to(tl.float32)
        v_free = tl.load(V + (b + B) * sv_b + offs_t[:, None] * sv_t + offs_c[None, :], mask=ok, other=0.0).to(tl.float32)
        m = tl.load(MASK + b * sm_b + offs_t * sm_t, mask=offs_t < T, other=0.0).to(tl.float32)
        x = (x + dt * m[:, None] * ((1.0 + cfg_rate) * v_cond - cfg_rate * v_free)).to(IN.dtype.element_ty)
        tl.store(IN + b * si_b + at, x, mask=ok)
        tl.store(IN + (b + B) * si_b + at, x, mask=ok)
