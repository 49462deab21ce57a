"""Mel → 24 kHz waveform: the reference's `HiFTGenerator` (a neural source filter feeding an iSTFTNet).

An F0 predictor reads the mel; a harmonic sine source at that F0 (9 harmonics, noise where unvoiced) is
merged to one excitation, whose STFT joins the upsampling network at each rate; the network ends in a
magnitude and phase that an inverse STFT (n_fft 16, hop 4) turns into samples.

**Streaming without seams.** The source's phase is a running sum of F0 over the whole stream, and the
reference draws fresh random phases and noise on every call. Here the source is a function of a stream's
absolute position: the phase at a window's first frame comes in (`phase0`, from the frames before it) and
the noise is read from a fixed table at the window's absolute sample offset (`noise_offset`). So a window
vocoded with enough context on both sides yields the samples of offline synthesis (streamer.py).

Names are the reference's (`m_source.l_linear`, `conv_pre`, `ups.N`, `source_downs.N`, `source_resblocks.N`,
`resblocks.N.convs1.M`, `resblocks.N.activations1.M.alpha`, `conv_post`, `f0_predictor.condnet.N`,
`f0_predictor.classifier`); weight norm is folded in at load (checkpoint.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from services.vocoder.codec.config import HiftConfig
from services.vocoder.codec.snake import snake

NOISE_SAMPLES = 1 << 20  # the source noise table: ~44 s at 24 kHz, read cyclically


class Snake(nn.Module):
    """x + sin²(αx)/α, α per channel (linear scale); one kernel on CUDA (snake.py)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return snake(x, self.alpha)


class ResBlock(nn.Module):
    def __init__(self, channels: int, kernel: int, dilations):
        super().__init__()
        self.convs1 = nn.ModuleList(nn.Conv1d(channels, channels, kernel, dilation=d, padding=d * (kernel - 1) // 2)
                                    for d in dilations)
        self.convs2 = nn.ModuleList(nn.Conv1d(channels, channels, kernel, padding=(kernel - 1) // 2) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv1, conv2, act1, act2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class ConvRNNF0Predictor(nn.Module):
    """Five 3-tap convolutions with ELU, then a linear map to |F0| per frame."""

    def __init__(self, in_channels: int, cond_channels: int):
        super().__init__()
        layers = []
        for i in range(5):
            layers += [nn.Conv1d(in_channels if i == 0 else cond_channels, cond_channels, 3, padding=1), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel [B, 80, F] → F0 in Hz [B, F]."""
        return self.classifier(self.condnet(mel).transpose(1, 2)).squeeze(-1).abs()


class SourceModuleHnNSF(nn.Module):
    """The excitation: harmonics 1..nb_harmonics+1 of F0 (sine_amp each; voiced frames), Gaussian noise
    (noise_std voiced, sine_amp/3 unvoiced), merged by a linear map and tanh. Its `l_linear` is the
    reference's `m_source.l_linear`."""

    def __init__(self, cfg: HiftConfig):
        super().__init__()
        self.harmonics = cfg.nb_harmonics + 1
        self.sampling_rate, self.upsample = cfg.sampling_rate, cfg.hop_size
        self.sine_amp, self.noise_std, self.threshold = cfg.nsf_alpha, cfg.nsf_sigma, cfg.nsf_voiced_threshold
        self.l_linear = nn.Linear(self.harmonics, 1)

    def frame_phase(self, f0: torch.Tensor) -> torch.Tensor:
        """F0 [B, F] → each frame's phase advance in cycles per sample, fractional [B, F, H]."""
        harmonic = torch.arange(1, self.harmonics + 1, device=f0.device, dtype=f0.dtype)
        return (f0[..., None] * harmonic / self.sampling_rate) % 1

    def forward(self, f0: torch.Tensor, phase0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """f0 [B, F]; phase0 [B, H]: cycles accumulated before the first frame (mod 1); noise [B, F·hop, H] standard
        normal → excitation [B, 1, F·hop].

        Phase: a frame's running sum of cycles, as the reference's (frame values linearly interpolated across
        the hop; at the window's edges, held): sample phase = 2π·hop·lerp(Σ cycles/sample)."""
        B, F_ = f0.shape
        rad = self.frame_phase(f0)                                           # [B, F, H]
        cycles = torch.cumsum(rad, dim=1) + phase0[:, None, :]               # [B, F, H]
        phase = F.interpolate(cycles.transpose(1, 2) * self.upsample, scale_factor=float(self.upsample),
                              mode="linear").transpose(1, 2) * (2 * math.pi)   # [B, F·hop, H]
        sines = torch.sin(phase) * self.sine_amp
        uv = (F.interpolate(f0[:, None], scale_factor=float(self.upsample)).transpose(1, 2) > self.threshold).to(sines.dtype)
        noise = (uv * self.noise_std + (1 - uv) * self.sine_amp / 3) * noise
        source = sines * uv + noise
        return torch.tanh(self.l_linear(source.to(self.l_linear.weight.dtype))).transpose(1, 2)


class HiFTGenerator(nn.Module):
    def __init__(self, cfg: HiftConfig):
        super().__init__()
        self.cfg = cfg
        base = cfg.base_channels
        self.n_fft, self.istft_hop = cfg.istft_n_fft, cfg.istft_hop_len
        self.m_source = SourceModuleHnNSF(cfg)
        self.conv_pre = nn.Conv1d(cfg.in_channels, base, 7, padding=3)
        self.ups = nn.ModuleList(nn.ConvTranspose1d(base // 2 ** i, base // 2 ** (i + 1), k, u, padding=(k - u) // 2)
                                 for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)))
        # The source joins each rate: its STFT frames (hop_size / n_fft-hop per mel frame) downsampled to that rate.
        rates = list(cfg.upsample_rates)
        cum = [math.prod(([1] + rates[::-1][:-1])[: i + 1]) for i in range(len(rates))][::-1]
        self.source_downs, self.source_resblocks = nn.ModuleList(), nn.ModuleList()
        for i, (u, k, d) in enumerate(zip(cum, cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes)):
            ch = base // 2 ** (i + 1)
            self.source_downs.append(nn.Conv1d(self.n_fft + 2, ch, 1) if u == 1 else
                                     nn.Conv1d(self.n_fft + 2, ch, u * 2, u, padding=u // 2))
            self.source_resblocks.append(ResBlock(ch, k, d))
        self.resblocks = nn.ModuleList(ResBlock(base // 2 ** (i + 1), k, d) for i in range(len(rates))
                                       for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
        self.conv_post = nn.Conv1d(base // 2 ** len(rates), self.n_fft + 2, 7, padding=3)
        self.f0_predictor = ConvRNNF0Predictor(cfg.in_channels, cfg.f0_cond_channels)
        self.register_buffer("window", torch.hann_window(self.n_fft, periodic=True), persistent=False)
        gen = torch.Generator().manual_seed(1)
        self.register_buffer("noise_table", torch.randn(NOISE_SAMPLES, self.m_source.harmonics, generator=gen),
                             persistent=False)

    @property
    def hop_size(self) -> int:
        return self.cfg.hop_size

    def source_noise(self, offsets: torch.Tensor, samples: int) -> torch.Tensor:
        """offsets [B] (absolute sample of each row's first) → the table's noise [B, samples, H], read cyclically."""
        idx = (offsets[:, None] + torch.arange(samples, device=offsets.device)[None]) % NOISE_SAMPLES
        return self.noise_table[idx]

    def decode(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """mel [B, 80, F], excitation [B, 1, F·hop] → samples [B, F·hop] in ±audio_limit."""
        spec = torch.stft(source[:, 0].float(), self.n_fft, self.istft_hop, self.n_fft, window=self.window.float(),
                          return_complex=True)
        s = torch.cat([spec.real, spec.imag], dim=1).to(mel.dtype)            # [B, n_fft + 2, F·hop/4 + 1]
        x = self.conv_pre(mel)
        kernels = len(self.cfg.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, self.cfg.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s))
            x = sum(self.resblocks[i * kernels + j](x) for j in range(kernels)) / kernels
        x = self.conv_post(F.leaky_relu(x))
        half = self.n_fft // 2 + 1
        magnitude = torch.exp(x[:, :half].float()).clamp(max=1e2)
        phase = torch.sin(x[:, half:].float())
        wav = self.istft(torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase)))
        return wav.clamp(-self.cfg.audio_limit, self.cfg.audio_limit)

    def istft(self, spec: torch.Tensor) -> torch.Tensor:
        """spec [B, n_fft/2 + 1, N] complex → samples [B, (N - 1)·hop]: torch.istft (centred, Hann window), written
        out so that a CUDA graph can capture it (torch.istft checks the window's overlap on the host: a sync)."""
        n, hop, N = self.n_fft, self.istft_hop, spec.shape[-1]
        window = self.window.float()
        frames = torch.fft.irfft(spec, n=n, dim=1) * window[None, :, None]             # [B, n_fft, N]
        size, fold = (1, n + hop * (N - 1)), dict(kernel_size=(1, n), stride=(1, hop))
        wav = F.fold(frames, size, **fold)[:, 0, 0]                                     # overlap-add
        envelope = F.fold(window.pow(2)[None, :, None].expand(1, n, N), size, **fold)[0, 0, 0]
        return (wav / envelope)[:, n // 2 : size[1] - n // 2]

    def synthesize(self, mel: torch.Tensor, f0: torch.Tensor, phase0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """mel [B, 80, F], its F0 [B, F], phase0 [B, H] (cycles before frame 0), noise [B, F·hop, H] → [B, 1, F·hop]."""
        source = self.m_source(f0.float(), phase0.float(), noise)
        return self.decode(mel, source.to(mel.dtype))[:, None]

    def forward(self, mel: torch.Tensor, anchor_phase: torch.Tensor | None = None, anchor: torch.Tensor | None = None,
                upto: torch.Tensor | None = None, noise_offset: torch.Tensor | None = None, noise: torch.Tensor | None = None):
        """Offline (anchor_phase None): mel [B, 80, F] as a whole stream → samples [B, 1, F·hop]; `noise` [B, F·hop, H]
        replaces the table's (tests drive it as the reference draws it).

        A window of a stream (streamer.py): anchor_phase [B, H]: the stream's source cycles before frame `anchor`
        [B] of the window (mod 1); noise_offset [B]: the stream's sample at the window's start → (samples
        [B, 1, F·hop], the cycles before frame `upto` [B] of the window, mod 1: the next window's anchor). The
        phase is pinned at the anchor, where the window's F0 is exact (the context before it covers the F0
        predictor's reach), and runs from there both ways."""
        B, _, frames = mel.shape
        f0 = self.f0_predictor(mel).float()
        if noise is None:
            offsets = mel.new_zeros(B, dtype=torch.long) if noise_offset is None else noise_offset
            noise = self.source_noise(offsets, frames * self.hop_size)
        if anchor_phase is None:
            return self.synthesize(mel, f0, mel.new_zeros(B, self.m_source.harmonics), noise)
        rad = self.m_source.frame_phase(f0)                                              # [B, F, H]
        before = F.pad(torch.cumsum(rad, dim=1), (0, 0, 1, 0))                           # [B, F + 1, H]: Σ k < i
        at = lambda i: before.gather(1, i.view(B, 1, 1).expand(B, 1, rad.shape[-1]))[:, 0]  # noqa: E731
        phase0 = (anchor_phase.float() - at(anchor)) % 1
        return self.synthesize(mel, f0, phase0, noise), (phase0 + at(upto)) % 1


def receptive_field(cfg: HiftConfig) -> tuple[int, int]:
    """Mel frames (before, after) that one frame's samples depend on: the network's reach, walked back from the
    frame's samples as receptive_field.py walks BigVGAN's, plus the F0 predictor's (its five 3-tap convolutions:
    the source of those frames comes from the F0 there). Sequence edges are ignored (an interior frame)."""
    hop, frame = cfg.hop_size, 1 << 16
    lo, hi = frame * hop, frame * hop + hop - 1                               # output samples
    n_fft, step = cfg.istft_n_fft, cfg.istft_hop_len
    lo, hi = -(-(lo - n_fft // 2 + 1) // step), (hi + n_fft // 2) // step    # iSTFT: frames overlapping them
    lo, hi = lo - 3, hi + 3                                                   # conv_post
    lo, hi = lo - 1, hi                                                       # the reflection pad's shift
    rates, kernels = cfg.upsample_rates, cfg.upsample_kernel_sizes
    for stage in reversed(range(len(rates))):
        reach = max(sum(d * (k - 1) // 2 + (k - 1) // 2 for d in ds)
                    for k, ds in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
        lo, hi = lo - reach, hi + reach
        k, u = kernels[stage], rates[stage]
        p = (k - u) // 2
        lo, hi = -(-(lo + p - k + 1) // u), (hi + p) // u                     # ConvTranspose1d, back a rate
    lo, hi = lo - 3, hi + 3                                                   # conv_pre
    f0_reach = 5
    return frame - lo + f0_reach, hi - frame + f0_reach
