"""How many mel frames before and after a frame BigVGAN-v2 reads to produce that frame's samples.

A streamed chunk agrees with offline synthesis to float error when it is vocoded with at least this
much context on each side: nothing outside the window then reaches the kept samples (not the window's
zero padding, not a bucket's padding). Less context trades exactness for compute and latency.

Computed by walking the generator backwards from one frame's `hop` output samples, widening the span
of samples each layer needs from its input (all convolutions are "same"-padded; `Activation1d` is a
12-tap resampler pair that reaches 5 samples each way at its input rate; a ConvTranspose1d of kernel k,
stride u and padding (k - u) // 2 maps output sample o to inputs (o + p - k + 1) / u .. (o + p) / u).
Sequence edges are ignored, so the span is the interior one.
"""

from __future__ import annotations

import math

ACTIVATION_REACH = 5  # samples each way: 12-tap up- and down-sampling filters at ratio 2


def _conv(lo: int, hi: int, kernel: int, dilation: int = 1) -> tuple[int, int]:
    """Input span a "same"-padded Conv1d needs for output samples [lo, hi]."""
    left = dilation * (kernel - 1) // 2
    return lo - left, hi + dilation * (kernel - 1) - left


def _activation(lo: int, hi: int) -> tuple[int, int]:
    return lo - ACTIVATION_REACH, hi + ACTIVATION_REACH


def _amp_block(lo: int, hi: int, kernel: int, dilations, kind: str) -> tuple[int, int]:
    """AMPBlock1: per dilation x + conv(act(conv_d(act(x)))); AMPBlock2: x + conv_d(act(x)); in sequence."""
    for d in reversed(dilations):
        if kind == "1":
            lo, hi = _activation(*_conv(lo, hi, kernel))
        lo, hi = _activation(*_conv(lo, hi, kernel, d))
    return lo, hi


def receptive_field(h) -> tuple[int, int]:
    """BigVGAN config (dict-like) → (frames before, frames after) that a frame's samples depend on."""
    rates, kernels = h["upsample_rates"], h["upsample_kernel_sizes"]
    hop = math.prod(rates)
    frame = 1 << 20  # any interior frame
    lo, hi = _activation(*_conv(frame * hop, frame * hop + hop - 1, 7))  # conv_post, activation_post
    for stage in reversed(range(len(rates))):
        spans = [_amp_block(lo, hi, k, d, str(h["resblock"]))
                 for k, d in zip(h["resblock_kernel_sizes"], h["resblock_dilation_sizes"])]
        lo, hi = min(s[0] for s in spans), max(s[1] for s in spans)  # the stage averages its blocks
        k, u = kernels[stage], rates[stage]
        p = (k - u) // 2
        lo, hi = -(-(lo + p - k + 1) // u), (hi + p) // u  # ConvTranspose1d: back to the input rate
    lo, hi = _conv(lo, hi, 7)  # conv_pre
    return frame - lo, hi - frame
