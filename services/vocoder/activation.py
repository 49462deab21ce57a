"""BigVGAN-v2's anti-aliased Snake/SnakeBeta activation (`Activation1d`) as one Triton kernel.

Every AMP block of BigVGAN-v2 wraps each Snake/SnakeBeta in `Activation1d` = DownSample1d(act(UpSample1d(x))):
2× upsampling by a 12-tap Kaiser-sinc transposed conv, the periodic activation at the doubled rate (so its
harmonics above the input Nyquist are filtered rather than aliased), and 2× downsampling by the same low-pass.
The 480x preset has 109 of them per forward (6 stages × 3 AMP blocks × 6, plus `activation_post`).

Why a kernel of our own:
- The package's fused CUDA kernel (`bigvgan/alias_free_activation/cuda`) is JIT-built with nvcc at import and
  does not build with CUDA 13 (its build flags ask for compute_70); it also computes in the input dtype (bf16 math for a bf16 model).
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
Each output needs 12 activated upsampled values Y[2t-5 .. 2t+6], and neighbouring outputs share 10 of them: a
program computes Y once for its tile (2·BT outputs' worth plus a halo: 3 activations an output at BT = 16, each
6 FMAs and one sin), parks it in an L2-resident scratch slot of its own, and sums the 12 taps from there. (The
first version let every output compute its 12 itself: 75% of a 64-stream call went to that kernel, on sin.)
"""

from __future__ import annotations

import functools
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
def _activated(row, p, T, st, fs, alpha, inv_beta):
    # Y[p] = act(Y⁰[p]) at upsampled positions p [1, W] (any integers: clamped to [0, 2T-1], DownSample1d's
    # replicate pad), for the channels of row [BC, 1] (pointers; st the time stride) → fp32 [BC, W].
    # UpSample1d in polyphase form: Y⁰[p] = 2 Σ_{m ≡ p+1 (mod 2)} f[m] · x[clamp((p + 5 - m)/2, 0, T-1)]; with
    # m = 2j + 1 - (p mod 2) the input index is (p + 4 + p mod 2)/2 - j, j = 0..5.
    p = tl.minimum(tl.maximum(p, 0), 2 * T - 1)
    odd = (p % 2) == 1
    base = (p + 4 + (p % 2)) // 2
    y = tl.where(odd, fs[0], fs[1]) * tl.load(row + tl.minimum(base, T - 1) * st).to(tl.float32)
    for j in tl.static_range(1, 6):
        tap = tl.where(odd, fs[2 * j], fs[2 * j + 1])
        y += tap * tl.load(row + tl.minimum(tl.maximum(base - j, 0), T - 1) * st).to(tl.float32)
    return _snake(2.0 * y, alpha, inv_beta)


@triton.jit
def _snake(y, alpha, inv_beta):
    # bigvgan.activations.SnakeBeta (Snake: inv_beta = 1/alpha): y + 1/(beta + 1e-9) · sin(alpha·y)², fp32.
    # On sm_90 tl.sin compiles to libdevice's __nv_sinf (full range reduction, same PTX as libdevice.sin),
    # not sin.approx.f32, so large |alpha·y| stay exact to fp32 rounding.
    s = tl.sin(y * alpha)
    return y + inv_beta * (s * s)


@triton.jit
def _anti_aliased_snake_kernel(x_ptr, f_ptr, g_ptr, alpha_ptr, inv_beta_ptr, out_ptr, scratch_ptr, C, T,
                               sb, sc, st, n_cblocks, n_tblocks, n_tiles,
                               BC: tl.constexpr, BT: tl.constexpr, CHANNELS_LAST: tl.constexpr):
    # Persistent: program `pid` of G takes tiles pid, pid + G, ... of (batch, channel block, time tile), time tiles
    # fastest; its own slot of `scratch` (fp32 [G, BC, YW]) holds the activated upsampled signal of its tile.
    # x and out share the element strides (sb, sc, st): [B, C, T] contiguous (st = 1) or channels-last (sc = 1,
    # runner.py); Triton specialises the stride that is 1, so either layout's loads and stores coalesce.
    HALO: tl.constexpr = 16  # the tile's BT outputs read Y at 2BT + 10 positions: 2BT, then a padded halo of 10
    YW: tl.constexpr = 2 * BT + HALO
    pid = tl.program_id(0)
    ci = tl.arange(0, BC)[:, None]
    qm = tl.arange(0, 2 * BT)[None, :]
    qh = 2 * BT + tl.arange(0, HALO)[None, :]
    i = tl.arange(0, BT)[None, :]
    if CHANNELS_LAST:  # the slot in the layout of the tile: channels fastest, or positions fastest
        slot = scratch_ptr + pid.to(tl.int64) * (BC * YW) + ci
        sq: tl.constexpr = BC
    else:
        slot = scratch_ptr + pid.to(tl.int64) * (BC * YW) + ci * YW
        sq: tl.constexpr = 1
    fs = ()
    gs = ()
    for k in tl.static_range(12):
        fs = fs + (tl.load(f_ptr + k),)
        gs = gs + (tl.load(g_ptr + k),)

    for tile in range(pid, n_tiles, tl.num_programs(0)):
        tb = tile % n_tblocks
        bc = tile // n_tblocks
        b = bc // n_cblocks
        c = (bc % n_cblocks) * BC + tl.arange(0, BC)  # [BC]
        cmask = c < C
        cc = tl.minimum(c, C - 1)  # rows past C read channel C-1 (in bounds, never stored): loads need no mask
        offset = (b.to(tl.int64) * sb + cc.to(tl.int64) * sc)[:, None]  # [BC, 1]
        row = x_ptr + offset
        alpha = tl.load(alpha_ptr + cc)[:, None]  # fp32 [BC, 1]
        inv_beta = tl.load(inv_beta_ptr + cc)[:, None]
        t0 = tb * BT
        # z[t0 + i] = Σ_k g[k] · Y[2(t0 + i) + k - 5]: Y at q = 2i + k of p = 2t0 - 5 + q, each computed once.
        y_main = _activated(row, 2 * t0 - 5 + qm, T, st, fs, alpha, inv_beta)  # [BC, 2BT]
        y_halo = _activated(row, 2 * t0 - 5 + qh, T, st, fs, alpha, inv_beta)  # [BC, HALO]
        tl.debug_barrier()  # every thread is done reading the slot for the previous tile
        tl.store(slot + qm * sq, y_main)
        tl.store(slot + qh * sq, y_halo)
        tl.debug_barrier()  # this tile's Y is visible to every thread of the program
        acc = tl.zeros([BC, BT], dtype=tl.float32)
        for k in tl.static_range(12):
            acc += gs[k] * tl.load(slot + (2 * i + k) * sq)
        t = t0 + i
        tl.store(out_ptr + offset + t * st, acc, mask=cmask[:, None] & (t < T))  # store casts to out's dtype


def _tiles(channels: int, length: int, channels_last: bool) -> tuple[int, int, int]:
    """(BC, BT, num_warps) from the shape and layout alone: 1024 outputs a program (8 a thread at 4 warps), whose
    Y takes 2·BT + 16 positions (3 activations an output at BT = 16, against 12 if each output made its own).
    Channels-last: the largest power-of-two channel block up to 64 that divides C (the 24- and 48-channel last
    stages waste no lanes), at least 8. Contiguous time: time tiles up to 256, the rest channels."""
    if channels_last:
        bc = 64
        while bc > 8 and channels % bc:
            bc //= 2
        bc = min(bc, triton.next_power_of_2(channels))
        return bc, max(16, 1024 // bc), 4
    bt = min(256, max(16, triton.next_power_of_2(length)))
    bc = min(triton.next_power_of_2(channels), max(1, 1024 // bt))
    return bc, bt, 4


@functools.lru_cache(maxsize=None)
def _programs(device: torch.device) -> int:
    """How many programs a persistent launch keeps resident: 8 per SM (GPU); 4 in Triton's interpreter."""
    if device.type != "cuda":
        return 4
    return 8 * torch.cuda.get_device_properties(device).multi_processor_count


def anti_aliased_snake(x: torch.Tensor, up_filter: torch.Tensor, down_filter: torch.Tensor, alpha: torch.Tensor,
                       inv_beta: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [B, C, T] contiguous, or [B, C, 1, T] channels-last (fp32/bf16/fp16) → out of x's shape, layout and dtype
    = bigvgan Activation1d(x) along T, ratios 2.

    up_filter, down_filter: fp32 [12] (the modules' `upsample.filter` / `downsample.lowpass.filter`); alpha,
    inv_beta: fp32 [C] as `snake_params` computes them. All on x's device. No host sync; grid from shapes only.
    """
    channels_last = is_channels_last(x)
    assert channels_last or (x.dim() == 3 and x.is_contiguous()), \
        "x must be a contiguous [B, C, T] tensor or a channels-last [B, C, 1, T] one"
    bsz, channels, length = x.shape[0], x.shape[1], x.shape[-1]
    for name, v, n in (("up_filter", up_filter, KERNEL_SIZE), ("down_filter", down_filter, KERNEL_SIZE),
                       ("alpha", alpha, channels), ("inv_beta", inv_beta, channels)):
        assert v.shape == (n,) and v.dtype == torch.float32 and v.is_contiguous() and v.device == x.device, name
    if out is None:
        out = torch.empty_like(x)  # keeps x's layout
    assert out.shape == x.shape and out.stride() == x.stride()
    if x.numel() > 0:
        bc, bt, warps = _tiles(channels, length, channels_last)
        n_cblocks, n_tblocks = triton.cdiv(channels, bc), triton.cdiv(length, bt)
        n_tiles = bsz * n_cblocks * n_tblocks
        grid = min(n_tiles, _programs(x.device))
        scratch = torch.empty(grid * bc * (2 * bt + 16), dtype=torch.float32, device=x.device)  # L2-resident
        # Element strides of batch, channel and time (a channels-last [B, C, 1, T]: B·T·C, 1, C).
        sb, sc, st = x.stride(0), x.stride(1), x.stride(-1)
        _anti_aliased_snake_kernel[(grid,)](
            x, up_filter, down_filter, alpha, inv_beta, out, scratch, channels, length, sb, sc, st,
            n_cblocks, n_tblocks, n_tiles, BC=bc, BT=bt, CHANNELS_LAST=channels_last, num_warps=warps)
    return out


def is_channels_last(x: torch.Tensor) -> bool:
    """x is [B, C, 1, T] in channels-last memory (runner.py's layout on CUDA: channels contiguous)."""
    return x.dim() == 4 and x.shape[2] == 1 and x.is_contiguous(memory_format=torch.channels_last)


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
        """x [B, C, T], or [B, C, 1, T] channels-last (channels_last.py) → the same shape and layout."""
        if not is_channels_last(x):
            x = x.contiguous()
        if x.is_cuda or _INTERPRETED:
            return anti_aliased_snake(x, self.up_filter, self.down_filter, self.alpha, self.inv_beta)
        if x.dim() == 4:
            return self._torch(x[:, :, 0, :]).unsqueeze(2).contiguous(memory_format=torch.channels_last)
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
