"""The flow's conformer token encoder run over a stream's new tokens only, its earlier positions' state kept.

Today a flow call runs the encoder (conformer.py) over the voice's prompt and a window of the stream's latest tokens,
every call: 5-10% of a call on an H200 (docs/benchmarks.md, conformer-2026-11-29). In streaming mode a position
reads only its own attention chunk and the chunks before it, the look-ahead convolution reads 3 tokens ahead, and the
upsampling convolution 8 frames (2 tokens) back. So once a call has decoded up to a chunk boundary D' (the decoder's
blocks end on one: decoder.py), every position before D' is final: its keys and values at every layer are what any
later call computes for it. `EncoderState` keeps them, and the next call runs the layers over its new positions only,
reading the kept keys and values before its own. With the whole stream kept this is the offline encoder in streaming
mode, exactly (tests/test_encoder_state.py), as the reference computes it: its streaming decode runs the encoder over
every token so far.

Kept per stream: each layer's keys and values of the final positions (the 6 token-rate layers' per token, the 4 up
layers' per frame), the last 2 positions' embeddings (the look-ahead convolution's second kernel reads its first's
output 2 positions back) and the last 2 positions' outputs of the token-rate layers (the upsampling convolution's left
context). At the real size ~44 KB per token in bf16 (~0.55 MB a second of audio).

`extend` is one stream, eager: the definition. `extend_rows` is many streams in one call in fixed shapes, as a CUDA
graph needs them (`EncoderStore`: every slot's keys and values in a ring by position); its queries read the `window`
positions before the call's first, so that a call's work does not grow with the stream. Within the window it is
`extend`, exactly (tests). The decoder's history calls run it when `--flow-encoder-window` is given (off by default,
until measured on a GPU): the store sits beside the stream history's slots (history.encoder), a row holds only its new
tokens, and flow.prepare runs the encoder through it (tests/test_codec_history.py: with every frame kept, the offline
decode exactly, though the window of tokens is the default 40).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from services.vocoder.codec.conformer import ConformerLayer, UpsampleConformerEncoder


@dataclass
class EncoderState:
    """One stream's encoder state: `done` final positions (token positions of its row: prompt and stream)."""

    done: int = 0
    keys: list[torch.Tensor] = field(default_factory=list)     # per layer [h, positions, d_k] (up layers: frames)
    values: list[torch.Tensor] = field(default_factory=list)
    embedded: torch.Tensor | None = None                        # [2, d]: the embeddings of positions done-2, done-1
    encoded: torch.Tensor | None = None                         # [2, d]: the token-rate layers' outputs there


def rel_sinusoids(distances: torch.Tensor, d_model: int, dtype: torch.dtype) -> torch.Tensor:
    """distances [n] (query minus key) → ESPnet's relative encodings [n, d_model] (RelPositionalEncoding's rows)."""
    freq = torch.exp(torch.arange(0, d_model, 2, device=distances.device, dtype=torch.float32)
                     * -(math.log(10000.0) / d_model))
    angle = distances.to(torch.float32)[:, None] * freq
    pe = torch.zeros(len(distances), d_model, device=distances.device)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return pe.to(dtype)


def _layer(layer: ConformerLayer, x: torch.Tensor, start: int, readable: int, chunk: int, keys: torch.Tensor | None,
           values: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A conformer layer over positions start … start + N - 1 (x [N, d]), their queries reading the kept keys and
    values of positions 0 … start - 1 and their own: key j is read by query i if j < readable and j's chunk is at most
    i's → (the layer's output [N, d], this call's keys and values [h, N, d_k])."""
    att = layer.self_attn
    N, h, d_k = x.shape[0], att.h, att.d_k
    normed = layer.norm_mha(x)
    q, k, v = (F.linear(normed, att.qkv_weight, att.qkv_bias).view(N, 3, h, d_k).permute(1, 2, 0, 3).unbind(0))
    all_k = k if keys is None else torch.cat([keys, k], 1)                                  # [h, start + N, d_k]
    all_v = v if values is None else torch.cat([values, v], 1)
    pos_q = torch.arange(start, start + N, device=x.device)
    pos_k = torch.arange(start + N, device=x.device)
    distance = pos_q[:, None] - pos_k[None, :]                                              # [N, start + N]
    lo = int(distance.min())
    table = torch.arange(int(distance.max()), lo - 1, -1, device=x.device)                # the distances, high first
    p = att.linear_pos(rel_sinusoids(table, x.shape[1], x.dtype)).view(-1, h, d_k).transpose(0, 1)  # [h, n, d_k]
    scale = 1 / math.sqrt(d_k)
    scores = ((q + att.pos_bias_u[:, None]) * scale) @ all_k.transpose(-2, -1)            # [h, N, start + N]
    position = ((q + att.pos_bias_v[:, None]) * scale) @ p.transpose(-2, -1)              # [h, N, n]
    scores += position.gather(-1, (int(distance.max()) - distance).expand(h, -1, -1))
    blocked = (pos_k[None, :] >= readable) | ((pos_k[None, :] // chunk) > (pos_q[:, None] // chunk) if chunk > 0
                                               else torch.zeros_like(distance, dtype=torch.bool))
    attn = torch.softmax(scores.masked_fill_(blocked, float("-inf")), dim=-1).nan_to_num_(0.0)
    x = x + att.linear_out((attn @ all_v).transpose(0, 1).reshape(N, -1))
    return x + layer.feed_forward(layer.norm_ff(x)), k, v


@torch.inference_mode()
def extend(encoder: UpsampleConformerEncoder, state: EncoderState, xs: torch.Tensor, final: int,
           streaming: bool = True) -> tuple[torch.Tensor, EncoderState]:
    """The encoder over a stream's next positions → (their output frames [stride · N, d], the state after them).

    xs [N, input_size]: the token embeddings of row positions state.done … state.done + N - 1 (the stream's new tokens,
    then its look-ahead context); `final` of them are decoded (the rest is context, read by the look-ahead convolution
    only), and state.done + final must end an attention chunk (or the stream). Frames of the first stride · final
    positions are final; the rest are the context's, for nothing. As UpsampleConformerEncoder.forward gives for those
    positions over the whole row so far (lengths = done + final, context = N - final)."""
    cfg = encoder.cfg
    D, N = state.done, xs.shape[0]
    lookahead, stride = encoder.pre_lookahead_layer.pre_lookahead_len, cfg.upsample_stride
    chunk = cfg.static_chunk_size if streaming else 0
    embedded = encoder.embed(xs[None])[0][0]                                            # [N, d]: x·√d
    # The look-ahead layer: conv1 reads 3 positions ahead (zeros past the row), conv2 its output 2 positions back
    # (zeros before the row's start, or the kept positions').
    pre = encoder.pre_lookahead_layer
    left = state.embedded if state.embedded is not None else embedded.new_zeros(0, embedded.shape[1])
    seq = torch.cat([left, embedded, embedded.new_zeros(lookahead, embedded.shape[1])])  # [L + N + 3, d]
    out = F.leaky_relu(pre.conv1(seq.t()[None]))                                        # [1, d, L + N]
    if state.embedded is None:
        out = F.pad(out, (2, 0))
    x = embedded
    x = pre.conv2(out)[0].t() + x                                                       # [N, d]
    readable = D + final
    keys, values = [], []
    for i, layer in enumerate(encoder.encoders):
        x, k, v = _layer(layer, x, D, readable, chunk, *(_kept(state, i)))
        keys.append(k)
        values.append(v)
    encoded = x
    # Upsampling: nearest x stride, then a causal convolution over 2·stride + 1 frames (the last 2 tokens' frames)
    before = state.encoded if state.encoded is not None else x.new_zeros(2, x.shape[1])
    frames = torch.cat([before, x]).repeat_interleave(stride, 0)                        # [(2 + N)·stride, d]
    x = encoder.up_layer.conv(frames.t()[None])[0].t()[-N * stride :]                  # [N·stride, d]
    x = encoder.up_embed(x[None])[0][0]
    n_layers = len(encoder.encoders)
    for i, layer in enumerate(encoder.up_encoders):
        x, k, v = _layer(layer, x, D * stride, readable * stride, chunk * stride, *(_kept(state, n_layers + i)))
        keys.append(k)
        values.append(v)
    out = encoder.after_norm(x)
    if final == 0:
        return out, state
    kept = [final] * n_layers + [final * stride] * len(encoder.up_encoders)
    grown = EncoderState(
        D + final,
        [_grow(old, k[:, :n]) for old, k, n in _zip(state.keys, keys, kept)],
        [_grow(old, v[:, :n]) for old, v, n in _zip(state.values, values, kept)],
        torch.cat([left, embedded[:final]])[-2:],
        _grow(state.encoded, encoded[:final], 0)[-2:])
    return out, grown


def _grow(old: torch.Tensor | None, new: torch.Tensor, dim: int = 1) -> torch.Tensor:
    return new if old is None else torch.cat([old, new], dim)


def _kept(state: EncoderState, i: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    return (state.keys[i], state.values[i]) if state.keys else (None, None)


def _zip(old: list, new: list, kept: list):
    """(the kept tensor or None, this call's, how many of its positions are final) per layer."""
    return zip(old if old else [None] * len(new), new, kept)


# ---- many streams in one call, in fixed tensors (a CUDA graph's shapes) ---------------------------------------------
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
    h, d_k, C = att.h, att.d_k, keys.shape[2]
    normed = layer.norm_mha(x)
    q, k, v = (F.linear(normed, att.qkv_weight, att.qkv_bias).view(B, M, 3, h, d_k).permute(2, 0, 3, 1, 4)
               .unbind(0))                                                                    # [B, h, M, d_k] each
    own = done[:, None] + torch.arange(M, device=x.device)                                  # [B, M] positions
    before = done[:, None] - window + torch.arange(window, device=x.device)                 # [B, W]
    rows = slot[:, None]
    kept_k = keys[rows, :, before % C].permute(0, 2, 1, 3)                                  # [B, h, W, d_k]
    kept_v = values[rows, :, before % C].permute(0, 2, 1, 3)
    all_k, all_v = torch.cat([kept_k, k], 2), torch.cat([kept_v, v], 2)                     # [B, h, W + M, d_k]
    pos_k = torch.cat([before, own], 1)                                                     # [B, W + M]
    distance = own[:, :, None] - pos_k[:, None, :]                                          # [B, M, W + M]
    high = window + M - 1                                                                   # distances: high … -(M-1)
    table = torch.arange(high, -M, -1, device=x.device)
    p = att.linear_pos(rel_sinusoids(table, x.shape[2], x.dtype)).view(-1, h, d_k).transpose(0, 1)  # [h, n, d_k]
    scale = 1 / math.sqrt(d_k)
    scores = ((q + att.pos_bias_u[:, None]) * scale) @ all_k.transpose(-2, -1)             # [B, h, M, W + M]
    position = ((q + att.pos_bias_v[:, None]) * scale) @ p.transpose(-2, -1)               # [B, h, M, n]
    scores += position.gather(-1, (high - distance)[:, None].expand(-1, h, -1, -1))
    blocked = (pos_k < 0)[:, None, :] | (pos_k >= readable[:, None])[:, None, :]
    if chunk > 0:
        blocked = blocked | ((pos_k[:, None, :] // chunk) > (own[:, :, None] // chunk))
    attn = torch.softmax(scores.masked_fill_(blocked[:, None], float("-inf")), dim=-1).nan_to_num_(0.0)
    keys[rows, :, own % C] = k.permute(0, 2, 1, 3)                                          # (the final ones and those
    values[rows, :, own % C] = v.permute(0, 2, 1, 3)                                        # the next call writes over)
    x = x + att.linear_out((attn @ all_v).transpose(1, 2).reshape(B, M, -1))
    return x + layer.feed_forward(layer.norm_ff(x))


@torch.inference_mode()
def extend_rows(encoder: UpsampleConformerEncoder, store: EncoderStore, slot: torch.Tensor, done: torch.Tensor,
                final: torch.Tensor, context: torch.Tensor, xs: torch.Tensor, streaming: bool = True) -> torch.Tensor:
    """`extend` for B streams at once, in fixed shapes: row b is slot[b]'s next positions from done[b], final[b] of
    them decoded and context[b] of look-ahead after them (xs [B, N, input_size]: their embeddings, any after them;
    a padding row: the scratch slot, final 0) → the frames [B, N·stride, d] (row b's first stride·final[b] final).
    Within the store's window (every kept position within `window` of the call's first) this is `extend`, exactly; a
    first call (done 0) makes at least 2 positions final. The store is written in place."""
    cfg = encoder.cfg
    B, N, _ = xs.shape
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
