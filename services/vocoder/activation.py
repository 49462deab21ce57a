"""BigVGAN-v2's anti-aliased Snake/SnakeBeta activation (`Activation1d`) as one Triton kernel.

Every AMP block of BigVGAN-v2 wraps each Snake/SnakeBeta in `Activation1d` = DownSample1d(act(UpSample1d(x))):
2× upsampling by a 12-tap Kaiser-sinc transposed conv, the periodic activation at the doubled rate (so its
harmonics above the input Nyquist are filtered rather than aliased), and 2× downsampling by the same low-pass.
The 480x preset has 109 of them per forward (6 stages × 3 AMP blocks × 6, plus `activation_post`).

Why a kernel of our own:
- The package's fused CUDA kernel (`bigvgan/alias_free_activation/cuda`) is JIT-built with nvcc at import and
  does not build with CUDA 13 (DESIGN §4); it also computes in the input dtype (bf16 math for a bf16 model).
- The eager module launches ~15 kernels per call (counted with a dispatch log: 2 replicate pads, 2 convolutions,
  exp/reciprocal of the parameters, ×2, and the snake as 5 elementwise ops on the 2T-long upsampled signal), and
  each of them writes a full intermediate that the next one reads back: ~9 round trips through memory, most at
  the doubled rate.
- This kernel reads x once (its 11-sample halo from L1/L2) and writes the output once; all math in fp32 with
  loads and stores in x's dtype. Its grid depends only on shapes and it never syncs with the host, so the whole
  generator can be captured in a CUDA graph.

Exact math (checked against the package to float rounding, see tests/test_vocoder_activation.py), f = upsample
filter, g = downsample filter, both [12] read from the module's buffers (not hard-coded), x [B, C, T]:
- UpSample1d: replicate-pad x by 5, 2·conv_transpose1d(stride 2), crop 15 each side → Y⁰ [2T]. In polyphase form
  Y⁰[2t + k - 5] = 2 · Σ_{m ≡ k (mod 2)} f[m] · x[clamp(t + (k - m)/2, 0, T-1)]   (k = 0..11, 6 taps each);
  the clamp is exactly the replicate pad, as the 5-sample pad covers the 3 samples each phase reaches.
- Y = act(Y⁰): Snake/SnakeBeta per channel, y + inv_beta · sin(alpha · y)².
- DownSample1d: replicate-pad Y by 5 left and 6 right, conv1d(g, stride 2) → z [T]:
  z[t] = Σ_{k=0..11} g[k] · Y[clamp(2t + k - 5, 0, 2T-1)].
  The clamp is on the *activated upsampled* signal: a position left of 0 takes Y[0] = act(Y⁰[0]), one right
  of 2T-1 takes Y[2T-1] = act(Y⁰[2T-1]) (not act(up(x)) at a clamped x index, which differs near the edges).
So each output needs 12 upsampled values (72 FMAs from 11 input samples x[t-5..t+5]), 12 activations (sin) and
a 12-tap sum ("variant A" of the design memo: recompute rather than share activations between outputs).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

KERNEL_SIZE = 12  # both filters; the kernel's index arithmetic assumes 12 taps and ratio 2
# Decided when this module is imported, as @triton.jit decides it: CPU tensors can then run the kernel.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


# ---------------------------------------------------------------------------------------------------------------
# Kernel


@triton.jit
def _upsampled(row, t, T, f_ptr, K: tl.constexpr):
    # Y⁰[2t + K - 5] (upsampled, not yet activated) at t [1, 1]: UpSample1d's polyphase taps f[m], m ≡ K mod 2,
    # at input index t + (K - m)/2 clamped to [0, T-1] (the replicate pad). row [BC, 1] pointers → [BC, 1].
    M0: tl.constexpr = K % 2
    y = tl.load(f_ptr + M0) * tl.load(row + tl.minimum(tl.maximum(t + (K - M0) // 2, 0), T - 1)).to(tl.float32)
    for m in tl.static_range(M0 + 2, 12, 2):
        y += tl.load(f_ptr + m) * tl.load(row + tl.minimum(tl.maximum(t + (K - m) // 2, 0), T - 1)).to(tl.float32)
    return 2.0 * y


@triton.jit
def _snake(y, alpha, inv_beta):
    # bigvgan.activations.SnakeBeta (Snake: inv_beta = 1/alpha): y + 1/(beta + 1e-9) · sin(alpha·y)², fp32.
    # On sm_90 tl.sin compiles to libdevice's __nv_sinf (full range reduction, same PTX as libdevice.sin),
    # not sin.approx.f32, so large |alpha·y| stay exact to fp32 rounding.
    s = tl.sin(y * alpha)
    return y + inv_beta * (s * s)


@triton.jit
def _anti_aliased_snake_kernel(x_ptr, f_ptr, g_ptr, alpha_ptr, inv_beta_ptr, out_ptr, C, T, n_cblocks, n_tblocks,
                               BC: tl.constexpr, BT: tl.constexpr):
    # 1-D grid over (batch, channel block, time tile), time tiles fastest so neighbours share their halos in L2.
    pid = tl.program_id(0)
    tb = pid % n_tblocks
    bc = pid // n_tblocks
    b = bc // n_cblocks
    c = (bc % n_cblocks) * BC + tl.arange(0, BC)  # [BC]
    cmask = c < C
    cc = tl.minimum(c, C - 1)  # rows past C read channel C-1 (in bounds, never stored): loads need no mask
    row = (x_ptr + (b * C + cc).to(tl.int64)[:, None] * T)  # [BC, 1]
    t = (tb * BT + tl.arange(0, BT))[None, :]  # [1, BT]; t >= T is computed on clamped indices, never stored

    alpha = tl.load(alpha_ptr + cc)[:, None]  # fp32 [BC, 1]
    inv_beta = tl.load(inv_beta_ptr + cc)[:, None]

    # DownSample1d's replicate pad: positions outside [0, 2T) of the activated upsampled signal take its edge
    # values Y[0] (= Y⁰ at t=0, k=5) and Y[2T-1] (= Y⁰ at t=T-1, k=6), per channel.
    t0 = tl.zeros([1, 1], dtype=tl.int32)
    y_first = _snake(_upsampled(row, t0, T, f_ptr, 5), alpha, inv_beta)  # [BC, 1]
    y_last = _snake(_upsampled(row, t0 + T - 1, T, f_ptr, 6), alpha, inv_beta)

    # The 11 input samples x[t-5 .. t+5] every output reaches, loaded once (index clamp = UpSample1d's pad),
    # and the 12 + 12 filter taps as scalars.
    xs = ()
    for j in tl.static_range(11):
        xs = xs + (tl.load(row + tl.minimum(tl.maximum(t + (j - 5), 0), T - 1)).to(tl.float32),)  # [BC, BT]
    fs = ()
    gs = ()
    for k in tl.static_range(12):
        fs = fs + (tl.load(f_ptr + k),)
        gs = gs + (tl.load(g_ptr + k),)
    acc = tl.zeros([BC, BT], dtype=tl.float32)
    for k in tl.static_range(12):
        # Y⁰[2t + k - 5] = 2 Σ_{m ≡ k mod 2} f[m] x[t + (k - m)/2], then the activation → Y[2t + k - 5].
        y = fs[k % 2] * xs[(k - k % 2) // 2 + 5]
        for m in tl.static_range(k % 2 + 2, 12, 2):
            y += fs[m] * xs[(k - m) // 2 + 5]
        y = _snake(2.0 * y, alpha, inv_beta)
        p = 2 * t + (k - 5)
        y = tl.where(p < 0, y_first, tl.where(p >= 2 * T, y_last, y))
        acc += gs[k] * y

    out = out_ptr + (b * C + cc).to(tl.int64)[:, None] * T + t
    tl.store(out, acc, mask=cmask[:, None] & (t < T))  # store casts to out's dtype


def _tiles(channels: int, length: int) -> tuple[int, int, int]:
    """(BC, BT, num_warps) from the shape alone: time tile up to 256 (coalesced rows), 256 elements a program
    (short stage-0 windows, T = 5·frames, fill it with channels instead of idle time lanes), 4 warps: 2 outputs
    a thread. Each output holds its 11 input samples in registers: ptxas (sm_90) reports ~88 registers at 2 a
    thread, ~170 at 4, ~245 at 8 (no spills), so more outputs a thread would cost occupancy in this compute-heavy
    kernel (12 sin per output). Not yet tuned on a GPU."""
    bt = min(256, max(16, triton.next_power_of_2(length)))
    bc = min(triton.next_power_of_2(channels), max(1, 256 // bt))
    return bc, bt, 4


def anti_aliased_snake(x: torch.Tensor, up_filter: torch.Tensor, down_filter: torch.Tensor, alpha: torch.Tensor,
                       inv_beta: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, C, T] contiguous (fp32/bf16/fp16) → out [B, C, T] (x's dtype) = bigvgan Activation1d(x), ratios 2.

    up_filter, down_filter: fp32 [12] (the modules' `upsample.filter` / `downsample.lowpass.filter`); alpha,
    inv_beta: fp32 [C] as `snake_params` computes them. All on x's device. No host sync; grid from shapes only.
    """
    assert x.dim() == 3 and x.is_contiguous(), "x must be a contiguous [B, C, T] tensor"
    bsz, channels, length = x.shape
    for name, v, n in (("up_filter", up_filter, KERNEL_SIZE), ("down_filter", down_filter, KERNEL_SIZE),
                       ("alpha", alpha, channels), ("inv_beta", inv_beta, channels)):
        assert v.shape == (n,) and v.dtype == torch.float32 and v.is_contiguous() and v.device == x.device, name
    if out is None:
        out = torch.empty_like(x)
    assert out.shape == x.shape and out.is_contiguous()
    if x.numel() > 0:
        bc, bt, warps = _tiles(channels, length)
        n_cblocks, n_tblocks = triton.cdiv(channels, bc), triton.cdiv(length, bt)
        _anti_aliased_snake_kernel[(bsz * n_cblocks * n_tblocks,)](
            x, up_filter, down_filter, alpha, inv_beta, out, channels, length, n_cblocks, n_tblocks,
            BC=bc, BT=bt, num_warps=warps)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Module swap


def snake_params(act: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """bigvgan Snake/SnakeBeta → fp32 (alpha [C], inv_beta [C]) exactly as its forward computes them:
    alpha = exp(alpha_p) if alpha_logscale else alpha_p; beta likewise (Snake: beta = alpha);
    inv_beta = 1 / (beta + 1e-9), the eps added after the exp."""
    from bigvgan.activations import Snake, SnakeBeta

    if not isinstance(act, (Snake, SnakeBeta)):
        raise ValueError(f"Activation1d wraps {type(act).__name__}; only Snake and SnakeBeta can be fused")
    with torch.no_grad():
        alpha = act.alpha.detach().float()
        beta = act.beta.detach().float() if isinstance(act, SnakeBeta) else alpha
        if act.alpha_logscale:
            alpha, beta = torch.exp(alpha), torch.exp(beta)
        inv_beta = 1.0 / (beta + act.no_div_by_zero)
    return alpha.contiguous(), inv_beta.contiguous()


def is_activation1d(module: torch.nn.Module) -> bool:
    """bigvgan's Activation1d, the torch one or the CUDA-kernel one (same submodules), told apart by shape so
    that the CUDA one's module (which builds its extension on import) is never imported here."""
    parts = ("act", "upsample", "downsample")
    return type(module).__name__ == "Activation1d" and all(hasattr(module, a) for a in parts)


def _check_resampling(module: torch.nn.Module) -> None:
    up, down = module.upsample, module.downsample
    low = getattr(down, "lowpass", None)
    ok = (up.ratio == 2 and up.kernel_size == KERNEL_SIZE and down.ratio == 2 and down.kernel_size == KERNEL_SIZE
          and low is not None and low.stride == 2 and low.kernel_size == KERNEL_SIZE and low.padding
          and low.padding_mode == "replicate"
          and tuple(up.filter.shape) == (1, 1, KERNEL_SIZE) and tuple(low.filter.shape) == (1, 1, KERNEL_SIZE))
    if not ok:
        raise ValueError(
            f"Activation1d with up ratio {up.ratio} / kernel {up.kernel_size}, down ratio {down.ratio} / kernel "
            f"{down.kernel_size}: the fused kernel handles only ratio 2 with 12-tap filters and replicate padding")


class FusedActivation1d(torch.nn.Module):
    """Drop-in for bigvgan's Activation1d(Snake|SnakeBeta, ratios 2, 12 taps) running one Triton kernel.

    Holds fp32 copies of both filters and of the per-channel alpha / 1/beta, as non-persistent buffers (fuse
    after loading weights). They stay fp32 when the model is cast (`model.to(torch.bfloat16)`): only their device
    follows. CPU tensors without Triton's interpreter run the same math as torch ops (the eager module's form).
    """

    def __init__(self, up_filter: torch.Tensor, down_filter: torch.Tensor, alpha: torch.Tensor,
                 inv_beta: torch.Tensor):
        super().__init__()
        for name, v in (("up_filter", up_filter.reshape(-1)), ("down_filter", down_filter.reshape(-1)),
                        ("alpha", alpha), ("inv_beta", inv_beta)):
            self.register_buffer(name, v.detach().to(torch.float32).contiguous(), persistent=False)
        assert self.up_filter.shape == (KERNEL_SIZE,) and self.down_filter.shape == (KERNEL_SIZE,)
        assert self.alpha.dim() == 1 and self.alpha.shape == self.inv_beta.shape

    @classmethod
    def of(cls, module: torch.nn.Module) -> "FusedActivation1d":
        """From a bigvgan Activation1d; ValueError unless ratios 2, 12-tap filters, Snake or SnakeBeta."""
        _check_resampling(module)
        alpha, inv_beta = snake_params(module.act)
        return cls(module.upsample.filter, module.downsample.lowpass.filter, alpha, inv_beta).to(alpha.device)

    def _apply(self, fn, recurse=True):
        # Keep the buffers fp32 through dtype casts; let them follow device moves.
        kept = dict(self._buffers)
        super()._apply(fn, recurse)
        for name, old in kept.items():
            self._buffers[name] = old.to(device=self._buffers[name].device)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        if x.is_cuda or _INTERPRETED:
            return anti_aliased_snake(x, self.up_filter, self.down_filter, self.alpha, self.inv_beta)
        return self._torch(x)

    def _torch(self, x: torch.Tensor) -> torch.Tensor:
        """The eager module's ops (replicate pads, conv_transpose1d, snake, conv1d), in fp32."""
        c = x.shape[1]
        y = F.pad(x.float(), (5, 5), mode="replicate")
        y = 2 * F.conv_transpose1d(y, self.up_filter.view(1, 1, -1).expand(c, -1, -1), stride=2, groups=c)
        y = y[..., 15:-15]
        s = torch.sin(y * self.alpha[:, None])
        y = y + self.inv_beta[:, None] * s * s
        y = F.pad(y, (5, 6), mode="replicate")
        return F.conv1d(y, self.down_filter.view(1, 1, -1).expand(c, -1, -1), stride=2, groups=c).to(x.dtype)

    def extra_repr(self) -> str:
        return f"channels={self.alpha.shape[0]}"


def fuse_activations(model: torch.nn.Module, strict: bool = True) -> int:
    """Replace every bigvgan Activation1d inside `model` (AMP blocks, activation_post) with FusedActivation1d;
    → how many were replaced. One that cannot be fused raises ValueError naming it, before anything is replaced
    (strict), or stays eager."""
    if is_activation1d(model):
        raise ValueError("fuse_activations replaces submodules; wrap a lone Activation1d with FusedActivation1d.of")
    fused, refused = [], []
    for name, module in model.named_modules():
        if is_activation1d(module):
            try:
                fused.append((name, FusedActivation1d.of(module)))
            except ValueError as e:
                refused.append(f"{name}: {e}")
    if refused and strict:  # raised before anything is replaced: the model is left as it was
        raise ValueError("; ".join(refused))
    for name, module in fused:
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, module)
    return len(fused)
