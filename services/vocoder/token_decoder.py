"""Audio tokens → mel frames: `frames_per_token` frames of `num_mels` bands per token.

MOSS-Speech's codec decodes tokens with a flow-matching model into an 80-band mel at 24 kHz, hop 480
(4 frames per 80 ms token). This decoder has that interface and streams the way a causal codec decoder
does: a token's frames depend on it and the `context_tokens` tokens before it (an embedding per code, a
causal convolution over the sequence of embeddings, a projection to the token's frames), and a stream
carries its own state, the embeddings of its last `context_tokens` tokens (`DecoderState`). Decoding a
stream chunk by chunk with its state gives the frames of decoding it whole. Saved as token_decoder.json +
token_decoder.safetensors beside the BigVGAN checkpoint; a json without `context_tokens` is a per-token
decoder of an earlier version (context 0).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn


@dataclass(frozen=True)
class MelFormat:
    sampling_rate: int
    num_mels: int
    hop_size: int

    def __str__(self) -> str:
        return f"{self.sampling_rate} Hz, {self.num_mels} bands, hop {self.hop_size}"


@dataclass(frozen=True)
class TokenFormat:
    """What every token decoder (this stand-in, the codec's flow: codec/decoder.py) takes and makes."""

    codebook_size: int = 16384
    frames_per_token: int = 4
    num_mels: int = 80
    sampling_rate: int = 24000
    hop_size: int = 480

    @property
    def mel_format(self) -> MelFormat:
        return MelFormat(self.sampling_rate, self.num_mels, self.hop_size)

    @property
    def samples_per_token(self) -> int:
        return self.frames_per_token * self.hop_size


@dataclass(frozen=True)
class TokenDecoderConfig(TokenFormat):
    embed_dim: int = 512
    context_tokens: int = 2  # earlier tokens a token's frames depend on (the causal convolution's reach)


DecoderState = torch.Tensor  # one stream's last context_tokens embeddings [context_tokens, embed_dim]


class TokenDecoder(nn.Module):
    def __init__(self, cfg: TokenDecoderConfig):
        super().__init__()
        if cfg.context_tokens < 0:
            raise ValueError(f"token decoder: context_tokens must be >= 0, got {cfg.context_tokens}")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.codebook_size, cfg.embed_dim)
        if cfg.context_tokens:  # causal: token t sees embeddings t - context_tokens .. t
            self.context = nn.Conv1d(cfg.embed_dim, cfg.embed_dim, cfg.context_tokens + 1)
        self.proj = nn.Linear(cfg.embed_dim, cfg.frames_per_token * cfg.num_mels)

    def initial_state(self) -> DecoderState:
        """A stream's state before its first token: silence (zero embeddings) before the stream."""
        return self.embed.weight.new_zeros(self.cfg.context_tokens, self.cfg.embed_dim)

    def decode(self, tokens: torch.Tensor, state: DecoderState | None = None) -> tuple[torch.Tensor, DecoderState]:
        """tokens [n ≥ 1] of one stream, its state (None: the stream's start) → (log-mel [num_mels, n *
        frames_per_token], the state after these tokens): decode_batch of one stream."""
        return self.decode_batch(tokens, [len(tokens)], [state])[0]

    @torch.inference_mode()
    def decode_batch(self, tokens: torch.Tensor, lengths: list[int],
                     states: list[DecoderState | None]) -> list[tuple[torch.Tensor, DecoderState]]:
        """Chunks of several streams in one pass: a handful of kernels, not a handful per stream.
        tokens [sum(lengths)]: the chunks one after another; states[i]: stream i's (None: its start)
        → [(log-mel [num_mels, lengths[i] * frames_per_token], stream i's next state)]. Each stream's frames are
        those of decoding it alone (the batch axis never mixes streams)."""
        e = self.embed(tokens)  # [N, E]
        k, B = self.cfg.context_tokens, len(lengths)
        next_states: list[DecoderState] = [e.new_zeros(0, e.shape[1])] * B
        if k:
            # Each stream's [state; embeddings] as one row of a [B, k + n_max, E] batch, zero-padded after its
            # end: a causal convolution's outputs before the padding do not see it.
            row = torch.repeat_interleave(torch.arange(B), torch.tensor(lengths)).to(e.device)          # [N]
            pos = torch.cat([torch.arange(k, k + n) for n in lengths]).to(e.device)                      # [N]
            seq = e.new_zeros(B, k + max(lengths), e.shape[1])
            seq[:, :k] = torch.stack([self.initial_state() if s is None else s for s in states])
            seq[row, pos] = e
            ctx = F.conv1d(seq.transpose(1, 2), self.context.weight, self.context.bias)  # [B, E, n_max]
            e = e + ctx.transpose(1, 2)[row, pos - k]
            last = torch.tensor(lengths)[:, None] + torch.arange(k)  # [B, k]: each stream's last k rows
            next_states = list(seq[torch.arange(B)[:, None], last.to(e.device)].unbind(0))
        fpt = self.cfg.frames_per_token
        frames = self.proj(e).view(-1, self.cfg.num_mels).T.contiguous()  # [num_mels, N * fpt]
        return list(zip(frames.split([n * fpt for n in lengths], dim=1), next_states))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """A whole stream: tokens [n] → log-mel [num_mels, n * frames_per_token]."""
        return self.decode(tokens)[0]

    # ---- the interface the vocoder drives every token decoder through (codec/decoder.py has the other) ----
    def start(self, voice=None) -> DecoderState | None:
        """A stream's state before its first token (this stand-in speaks in no voice: `voice` is not read)."""
        return None

    def lane(self) -> "TokenDecoder":
        """The same decoder for a second worker thread: it keeps nothing between calls."""
        return self

    def release(self, state: DecoderState | None) -> None:
        """A stream is gone: nothing to let go (its state is all in `state`)."""

    def pending_frames(self, state: DecoderState | None, new_tokens: int | None) -> int:
        """Frames decode_chunks would return for this many new tokens (None: the stream's end)."""
        return (new_tokens or 0) * self.cfg.frames_per_token

    @property
    def end_tokens(self) -> int:
        """The most tokens a stream's end still decodes: none, a token's frames come with it."""
        return 0

    def decode_chunks(self, chunks: list[tuple[list[int] | None, DecoderState | None]]
                      ) -> list[tuple[torch.Tensor, DecoderState | None]]:
        """[(a stream's new tokens, or None at its end; its state)] → [(log-mel [num_mels, n], its next state)],
        in one pass. A token's frames come with it, so an end brings none."""
        device = self.embed.weight.device
        live = [i for i, (tokens, _) in enumerate(chunks) if tokens]
        out = [(torch.zeros(self.cfg.num_mels, 0, device=device), state) for _, state in chunks]
        if live:
            flat = torch.tensor([t for i in live for t in chunks[i][0]], dtype=torch.long, device=device)
            decoded = self.decode_batch(flat, [len(chunks[i][0]) for i in live], [chunks[i][1] for i in live])
            for i, d in zip(live, decoded):
                out[i] = d
        return out


def save_token_decoder(decoder: TokenDecoder, directory: str | Path) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token_decoder.json").write_text(json.dumps(asdict(decoder.cfg), indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in decoder.state_dict().items()}, str(directory / "token_decoder.safetensors"))


def load_token_decoder(directory: str | Path) -> TokenDecoder:
    directory = Path(directory)
    cfg = TokenDecoderConfig(**{"context_tokens": 0, **json.loads((directory / "token_decoder.json").read_text())})
    decoder = TokenDecoder(cfg)
    decoder.load_state_dict(load_file(str(directory / "token_decoder.safetensors")))
    return decoder.eval()


def random_token_decoder(cfg: TokenDecoderConfig, seed: int = 0) -> TokenDecoder:
    torch.manual_seed(seed)
    decoder = TokenDecoder(cfg)
    with torch.no_grad():  # log-mel-like range: around -5 with unit spread
        decoder.proj.weight.mul_(0.5)
        decoder.proj.bias.fill_(-5.0)
    return decoder.eval()
