"""The flow's conformer token encoder run over a stream's new tokens only, its earlier positions' state kept.

Today a flow call runs the encoder (conformer.py) over the voice's prompt and a window of the stream's latest tokens,
every call: 5-10% of a call on an H200 (docs/benchmarks.md, conformer-2026-11-29). In streaming mode a position
reads only its own attention chunk and the chunks before it, the look-ahead convolution reads 3 tokens ahead, and the
upsampling convolution 8 frames (2 tokens) back. So once a call has decoded up to a chunk boundary D' (the decoder's
blocks end on one: decoder.py), every position before D' is final: its keys and values at every layer are what any
later call computes for it. `EncoderStore` keeps them for every stream slot, and `extend_rows` runs the layers over a
call's new positions only, many streams at once in fixed shapes (a CUDA graph's), their queries reading the `window`
positions kept before them and their own: a call's work does not grow with the stream. Within the window this is the
offline encoder in streaming mode, exactly (tests/test_encoder_state.py), as the reference computes it: its streaming
decode runs the encoder over every token so far.

Kept per stream: each layer's keys and values in a ring by position (the 6 token-rate layers' per token, the 4 up
layers' per frame), the last 2 final positions' embeddings (the look-ahead layer's second convolution reads its
first's output 2 positions back) and the token-rate layers' outputs there (the upsampling convolution's left
context): ~44 KB a kept position at the real size in bf16.

The decoder's history calls run it when `--flow-encoder-window` is given (off by default, until measured on a GPU): the
store sits beside the stream history's slots (history.encoder), a row holds only its new tokens, and flow.prepare runs
the encoder through it (tests/test_codec_history.py: with every frame kept, the offline decode exactly, though the
window of tokens is the default 40).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from services.vocoder.codec.conformer import ConformerLayer, UpsampleConformerEncoder, rel_sinusoids


@dataclass
class EncoderRows:
    """A call's B rows in the EncoderStore, each [B] long on the device: `slot` (the scratch slot for a padding row),
    `done` (the row's positions already kept: 0 at a stream's first call) and `final` (the positions this call makes
    final; 0 for a padding row)."""

    slot: torch.Tensor
    done: torch.Tensor
    final: torch.Tensor


class EncoderStore:
    """Every stream slot's encoder state in fixed tensors, which a call reads and writes in place:
    - keys[l], values[l] [slots + 1, h, capacity · r, d_k]: layer l's keys and values by row position modulo the
      capacity (r: 1 for the token-rate layers, stride for the up layers' frames); the last slot is scratch, where
      padding rows write;
    - embedded, encoded [slots + 1, 2, d]: the embeddings and the token-rate layers' outputs of each slot's last 2
      final positions.
    A call's queries read the `window` positions before their first (and their own), so a stream of any length fits:
    capacity ≥ window + the call's positions."""

    @staticmethod
    def bytes_per_slot(encoder: UpsampleConformerEncoder, capacity: int, element_size: int) -> int:
        """What one slot costs: keys and values of every layer over `capacity` positions (the up layers' frames),
        and the two tails (~44 KB a position at the real size in bf16)."""
        att, stride = encoder.encoders[0].self_attn, encoder.cfg.upsample_stride
        positions = capacity * (len(encoder.encoders) + stride * len(encoder.up_encoders))
        return (2 * positions * att.h * att.d_k + 4 * encoder.cfg.output_size) * element_size

    def __init__(self, encoder: UpsampleConformerEncoder, slots: int, capacity: int, window: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32):
        att = encoder.encoders[0].self_attn
        d, stride = encoder.cfg.output_size, encoder.cfg.upsample_stride
        self.capacity, self.window, self.scratch = capacity, window, slots
        rates = [1] * len(encoder.encoders) + [stride] * len(encoder.up_encoders)
        self.keys = [torch.zeros(slots + 1, att.h, capacity * r, att.d_k, device=device, dtype=dtype) for r in rates]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.embedded = torch.zeros(slots + 1, 2, d, device=device, dtype=dtype)
        self.encoded = torch.zeros_like(self.embedded)


def _rows_layer(layer: ConformerLayer, x: torch.Tensor, slot: torch.Tensor, done: torch.Tensor, readable: torch.Tensor,
                chunk: int, keys: torch.Tensor, values: torch.Tensor, window: int) -> torch.Tensor:
    """A conformer layer over each row's positions done[b] … done[b] + M - 1 (x [B, M, d]; done, readable [B] in this
    layer's positions), reading the `window` kept positions before them and their own; their keys and values written
    into the store (keys, values [slots + 1, h, C, d_k]) at their positions → the layer's output [B, M, d]."""
    att = layer.self_attn
    B, M, _ = x.shape
    C = keys.shape[2]
    q, k, v = att.qkv(layer.norm_mha(x))                                                    # [B, h, M, d_k] each
    own = done[:, None] + torch.arange(M, device=x.device)                                  # [B, M] positions
    before = done[:, None] - window + torch.arange(window, device=x.device)                 # [B, W]
    rows = slot[:, None]
    kept_k = keys[rows, :, before % C].permute(0, 2, 1, 3)                                  # [B, h, W, d_k]
    kept_v = values[rows, :, before % C].permute(0, 2, 1, 3)
    keys[rows, :, own % C] = k.permute(0, 2, 1, 3)                                          # (the final ones and those
    values[rows, :, own % C] = v.permute(0, 2, 1, 3)                                        # the next call writes over)
    pos_k = torch.cat([before, own], 1)                                                     # [B, W + M]
    distance = own[:, :, None] - pos_k[:, None, :]                                          # [B, M, W + M]
    high = window + M - 1                                                                   # distances: high … -(M-1)
    pos_emb = rel_sinusoids(torch.arange(high, -M, -1, device=x.device), x.shape[2]).to(x.dtype)
    blocked = (pos_k < 0)[:, None, :] | (pos_k >= readable[:, None])[:, None, :]
    if chunk > 0:
        blocked = blocked | ((pos_k[:, None, :] // chunk) > (own[:, :, None] // chunk))
    x = x + att.attend(q, torch.cat([kept_k, k], 2), torch.cat([kept_v, v], 2), pos_emb,
                       (high - distance)[:, None].expand(-1, att.h, -1, -1), blocked[:, None])
    return x + layer.feed_forward(layer.norm_ff(x))


@torch.inference_mode()
def extend_rows(encoder: UpsampleConformerEncoder, store: EncoderStore, slot: torch.Tensor, done: torch.Tensor,
                final: torch.Tensor, context: torch.Tensor, xs: torch.Tensor, streaming: bool = True) -> torch.Tensor:
    """The encoder over B streams' next positions: row b is slot[b]'s positions from done[b] on (row positions:
    prompt, then stream), final[b] of them decoded, which must end an attention chunk or the stream, and context[b]
    of look-ahead after them, read by the look-ahead layer only (xs [B, N, input_size]: their token embeddings, any
    after them; a padding row: the scratch slot, final 0) → their frames [B, N·stride, d], row b's first
    stride·final[b] final: what UpsampleConformerEncoder.forward gives them over the row so far, exactly, while
    every kept position is within the store's window of the call's first. A first call (done 0) makes at least 2
    positions final. The store is written in place."""
    cfg = encoder.cfg
    B, N, _ = xs.shape
    if N > store.capacity - store.window:  # (its own positions would be written over kept ones it reads)
        raise ValueError(f"encoder state: a call of {N} positions; the store holds {store.capacity}, a window of "
                         f"{store.window} and at most {store.capacity - store.window} new")
    lookahead, stride = encoder.pre_lookahead_layer.pre_lookahead_len, cfg.upsample_stride
    chunk = cfg.static_chunk_size if streaming else 0
    started = (done > 0).to(xs.dtype)[:, None, None]                                      # [B, 1, 1]: a kept left
    present = (torch.arange(N, device=xs.device)[None, :] < (final + context)[:, None]).to(xs.dtype)[..., None]
    embedded = encoder.embed(xs)[0] * present                                               # [B, N, d]
    pre = encoder.pre_lookahead_layer
    left = store.embedded[slot] * started                                                   # [B, 2, d]
    seq = torch.cat([left, embedded, embedded.new_zeros(B, lookahead, embedded.shape[2])], 1)
    out = F.leaky_relu(pre.conv1(seq.transpose(1, 2)))                                      # [B, d, 2 + N]
    out = torch.cat([out[:, :, :2] * started[:, :, :1], out[:, :, 2:]], 2)                 # (none before a row start)
    x = pre.conv2(out).transpose(1, 2) + embedded                                          # [B, N, d]
    readable = done + final
    n_layers = len(encoder.encoders)
    for i, layer in enumerate(encoder.encoders):
        x = _rows_layer(layer, x, slot, done, readable, chunk, store.keys[i], store.values[i], store.window)
    encoded = x
    before = store.encoded[slot] * started
    frames = torch.cat([before, x], 1).repeat_interleave(stride, 1)                        # [B, (2 + N)·stride, d]
    x = encoder.up_layer.conv(frames.transpose(1, 2)).transpose(1, 2)                      # [B, N·stride, d]
    x = encoder.up_embed(x)[0]
    for i, layer in enumerate(encoder.up_encoders):
        x = _rows_layer(layer, x, slot, done * stride, readable * stride, chunk * stride, store.keys[n_layers + i],
                        store.values[n_layers + i], store.window * stride)
    # each row's last 2 final positions, for its next call: in [the kept 2 | this call's N] at final, final + 1
    tail = (final[:, None] + torch.arange(2, device=xs.device))[..., None].expand(-1, -1, embedded.shape[2])
    store.embedded[slot] = torch.cat([left, embedded], 1).gather(1, tail)
    store.encoded[slot] = torch.cat([before, encoded], 1).gather(1, tail)
    return encoder.after_norm(x)
