"""Voices: what the flow decoder speaks like. A voice is a prompt's audio codes, the prompt's mel (4 frames
per code, 80 bands at 24 kHz, hop 480) and a 192-d speaker x-vector (CAM++), stored as one safetensors file
per voice, `<voices dir>/<name>.safetensors`, with the tensors `prompt_tokens` [P] int, `prompt_mel`
[4·P, 80] float and `embedding` [192] float. docs/codec.md says how to make one from a WAV.

A file that is missing a tensor, has one of the wrong shape or kind, or does not read is refused at load
with its path and the problem (VoiceError): the service does not start on a bad voices directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from services.common.recording import NAME
from services.vocoder.codec.config import FlowConfig

DEFAULT = "default"


class VoiceError(ValueError):
    pass


@dataclass(frozen=True)
class Voice:
    name: str
    prompt_tokens: torch.Tensor  # [P] long
    prompt_mel: torch.Tensor     # [4·P, 80] float32
    embedding: torch.Tensor      # [192] float32

    @property
    def prompt_frames(self) -> int:
        return self.prompt_mel.shape[0]


def check(voice: Voice, cfg: FlowConfig, where: str) -> Voice:
    """Shapes, kinds and ranges against the flow's config, or VoiceError naming `where` and the problem."""
    t, mel, emb = voice.prompt_tokens, voice.prompt_mel, voice.embedding
    problems = []
    if t.dim() != 1 or t.dtype.is_floating_point:
        problems.append(f"prompt_tokens must be a 1-D integer tensor, got {t.dtype} {tuple(t.shape)}")
    elif t.numel() and not (0 <= int(t.min()) and int(t.max()) < cfg.vocab_size):
        problems.append(f"prompt_tokens must be codes in [0, {cfg.vocab_size})")
    if mel.dim() != 2 or mel.shape[1] != cfg.output_size or mel.shape[0] != cfg.token_mel_ratio * t.shape[0]:
        problems.append(f"prompt_mel must be [{cfg.token_mel_ratio} x {t.shape[0]} prompt tokens, {cfg.output_size}], "
                        f"got {tuple(mel.shape)}")
    if emb.shape != (cfg.spk_embed_dim,):
        problems.append(f"embedding must be [{cfg.spk_embed_dim}], got {tuple(emb.shape)}")
    for name, x in (("prompt_mel", mel), ("embedding", emb)):
        if x.dtype.is_floating_point and not torch.isfinite(x).all():
            problems.append(f"{name} holds values that are not finite")
    if problems:
        raise VoiceError(f"{where}: " + "; ".join(problems))
    return Voice(voice.name, t.long(), mel.float(), emb.float())


def save_voice(voice: Voice, directory: str | Path, path: str | Path | None = None) -> Path:
    """`<directory>/<name>.safetensors` (or `path`) → its path."""
    path = Path(path) if path is not None else Path(directory) / f"{voice.name}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"prompt_tokens": voice.prompt_tokens.to(torch.int32).contiguous(),
               "prompt_mel": voice.prompt_mel.float().contiguous(),
               "embedding": voice.embedding.float().contiguous()}, str(path))
    return path


def load_voice(path: str | Path, cfg: FlowConfig) -> Voice:
    path = Path(path)
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise VoiceError(f"{path}: not a readable safetensors file ({exc})") from None
    missing = sorted({"prompt_tokens", "prompt_mel", "embedding"} - set(tensors))
    if missing:
        raise VoiceError(f"{path}: missing tensor(s) {', '.join(missing)}")
    return check(Voice(path.stem, tensors["prompt_tokens"], tensors["prompt_mel"], tensors["embedding"]), cfg, str(path))


def load_voices(directory: str | Path, cfg: FlowConfig) -> dict[str, Voice]:
    """Every `<name>.safetensors` in the directory (a name: letters, digits, '_', '.', '-'), by name."""
    directory = Path(directory)
    if not directory.is_dir():
        raise VoiceError(f"{directory}: no such voices directory")
    voices = {}
    for path in sorted(directory.glob("*.safetensors")):
        if not NAME.match(path.stem):
            raise VoiceError(f"{path}: a voice name is 1-64 letters, digits, '_', '.' or '-'")
        voices[path.stem] = load_voice(path, cfg)
    if not voices:
        raise VoiceError(f"{directory}: no voices (<name>.safetensors files)")
    return voices


def random_voice(cfg: FlowConfig, name: str = DEFAULT, prompt_tokens: int = 25, seed: int = 0) -> Voice:
    """A voice for random weights: random codes, a log-mel-like prompt (around -6), a random x-vector."""
    gen = torch.Generator().manual_seed(seed)
    return Voice(name, torch.randint(0, cfg.vocab_size, (prompt_tokens,), generator=gen),
                 torch.randn(cfg.token_mel_ratio * prompt_tokens, cfg.output_size, generator=gen) - 6.0,
                 torch.randn(cfg.spk_embed_dim, generator=gen))
