"""The cluster feed-forward kernel of cluster_ff.py emulated on the CPU: every block, warp and lane, loading and
storing by the CUDA source's own index arithmetic, with `mma.sync` m16n8k16's fragments as the PTX ISA lays them out;
against a float32 reference. It checks the kernel's indexing where no GPU is (a swapped fragment register drops it from
~53 dB to ~4 dB), not the CUDA source itself: a change there must be made here too.

    python bench/studies/cluster_ff.py --emulate
"""

from __future__ import annotations

import math

import numpy as np
from cluster_ff import CS, HID, ROWS, THREADS, C


def bf16_round(a: np.ndarray) -> np.ndarray:
    """float32 → the nearest bf16 (ties to even), as float32: the kernel's f2bf."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def mma_emulated(acc, a_regs, b_regs) -> None:
    """One warp's mma.sync m16n8k16 as the PTX ISA lays out its fragments: a_regs [32 lanes][4][2], b_regs
    [32][2][2] (pairs of bf16 as floats), acc [32][4] updated. Lane l: gid = l // 4, tig = l % 4."""
    A, B = np.zeros((16, 16), np.float32), np.zeros((16, 8), np.float32)
    for lane in range(32):
        gid, tig = lane // 4, lane % 4
        for reg, (row, col) in enumerate(((gid, 2 * tig), (gid + 8, 2 * tig), (gid, 2 * tig + 8), (gid + 8, 2 * tig + 8))):
            A[row, col:col + 2] = a_regs[lane][reg]
        for reg, k in enumerate((2 * tig, 2 * tig + 8)):
            B[k:k + 2, gid] = b_regs[lane][reg]
    D = A @ B
    for lane in range(32):
        gid, tig = lane // 4, lane % 4
        acc[lane] += [D[gid, 2 * tig], D[gid, 2 * tig + 1], D[gid + 8, 2 * tig], D[gid + 8, 2 * tig + 1]]


def products_emulated(A: np.ndarray, B: np.ndarray, K: int) -> np.ndarray:
    """The kernel's products(): acc[MT][2][4] of every lane (as [32][MT][2][4]), A [ROWS][K], B the 16 rows of the
    columns [16][K], loaded by the same index arithmetic as the CUDA."""
    acc = np.zeros((32, ROWS // 16, 2, 4), np.float32)
    for k0 in range(0, K, 16):
        b = [[[B[t * 8 + lane // 4, k0 + (lane % 4) * 2 + o:k0 + (lane % 4) * 2 + o + 2] for o in (0, 8)]
              for t in range(2)] for lane in range(32)]
        for m in range(ROWS // 16):
            a = []
            for lane in range(32):
                gid, tig = lane // 4, lane % 4
                r, c = m * 16 + gid, k0 + tig * 2
                a.append([A[r, c:c + 2], A[r + 8, c:c + 2], A[r, c + 8:c + 10], A[r + 8, c + 8:c + 10]])
            for t in range(2):
                sub = np.zeros((32, 4), np.float32)
                mma_emulated(sub, a, [b[lane][t] for lane in range(32)])
                acc[:, m, t] += sub
    return acc


def scatter(acc: np.ndarray, out: np.ndarray, col0: int) -> None:
    """Every lane's acc[MT][2][4] into out[row][col0 + ...], by the kernel's epilogue index arithmetic."""
    for lane in range(32):
        gid, tig = lane // 4, lane % 4
        for m in range(ROWS // 16):
            for t in range(2):
                for e in range(4):
                    out[m * 16 + gid + (8 if e >= 2 else 0), col0 + t * 8 + tig * 2 + (e & 1)] = acc[lane, m, t, e]


def emulate(normed, x, w1, b1, w2, b2, g, be, eps) -> tuple[np.ndarray, np.ndarray]:
    """The kernel on one cluster of ROWS rows, block by block, warp by warp and lane by lane (float32 numpy arrays
    holding bf16 values) → (out, out_normed) [ROWS][C]."""
    hb, ob = HID // CS, C // CS
    parts = []
    for rank in range(CS):
        w1s, w2s = w1[rank * hb:(rank + 1) * hb], w2[:, rank * hb:(rank + 1) * hb]   # sW1 [HB][C], sW2 [C][HB]
        hidden = np.zeros((ROWS, hb), np.float32)
        for warp in range(THREADS // 32):
            acc = products_emulated(normed, w1s[warp * 16:warp * 16 + 16], C)
            scatter(acc, hidden, warp * 16)
        v = hidden + b1[rank * hb:(rank + 1) * hb]
        hidden = bf16_round(0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2))).astype(np.float32))
        part = np.zeros((ROWS, C), np.float32)
        for warp in range(THREADS // 32):
            for chunk in range(4):
                n0 = warp * 64 + chunk * 16
                scatter(products_emulated(hidden, w2s[n0:n0 + 16], hb), part, n0)
        parts.append(part)
    total = sum(parts)                                                               # through the cluster
    out = bf16_round(bf16_round(bf16_round(total + b2)) + x)
    mean = np.stack([out[:, r * ob:(r + 1) * ob].sum(1) for r in range(CS)]).sum(0) / C
    var = np.stack([((out[:, r * ob:(r + 1) * ob] - mean[:, None]) ** 2).sum(1) for r in range(CS)]).sum(0) / C
    normed_next = (out - mean[:, None]) / np.sqrt(var[:, None] + eps) * g + be
    return out, bf16_round(normed_next)


def check_emulated() -> None:
    """The kernel's index arithmetic, emulated on the CPU against the float reference of one cluster's rows."""
    rng = np.random.default_rng(0)

    def bf(*shape, scale=1.0):
        return bf16_round(rng.standard_normal(shape).astype(np.float32) * scale)

    normed, x = bf(ROWS, C), bf(ROWS, C)
    w1, b1, w2, b2 = bf(HID, C, scale=C ** -0.5), bf(HID, scale=0.1), bf(C, HID, scale=HID ** -0.5), bf(C, scale=0.1)
    g, be, eps = bf(C, scale=0.1) + 1, bf(C, scale=0.1), 1e-5
    got, got_normed = emulate(normed, x, w1, b1, w2, b2, g, be, eps)
    h = normed @ w1.T + b1
    h = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
    want = h @ w2.T + b2 + x
    mu, sd = want.mean(1, keepdims=True), want.std(1, keepdims=True)
    want_normed = (want - mu) / np.sqrt(sd ** 2 + eps) * g + be
    for name, a, b in (("out", got, want), ("normed next", got_normed, want_normed)):
        snr = 10 * np.log10((b ** 2).sum() / ((a - b) ** 2).sum())
        print(f"emulated kernel against float32: {name} {snr:.1f} dB")
