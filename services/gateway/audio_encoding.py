"""The HTTP door's response formats: a turn's PCM16 (mono, the vocoder's rate) encoded as it arrives, so that
a client's first bytes leave with the turn's first audio.

- pcm: the samples as they are (OpenAI's `pcm`: 24 kHz, signed 16-bit little-endian, mono);
- wav: a RIFF header whose sizes say "unknown" (0xFFFFFFFF: the length is not known when it is sent), then
  the samples: what streaming WAV writers send, and what readers take to the end of the stream;
- flac, opus (in Ogg): libsndfile's encoders (the `soundfile` package, a dependency already), writing into a
  sink whose new bytes go out after each chunk (Ogg pages every OGG_PAGE_MS, not libsndfile's default of 1 s,
  which would hold a stream's first audio back by as much). Where libsndfile goes back at the end to patch a header (FLAC's
  total sample count), bytes already sent stay as sent: FLAC's STREAMINFO then says "length unknown", as from a
  live encoder (sox and browsers read it; libsndfile's own reader fails at such a stream's last block);
- mp3: LAME through `lameenc`, constant 64 kbit/s (mono speech at 24 kHz), frames out as they are made.
  (libsndfile's MP3 writer patches a VBR tag into its first frame at the end: sent before that, the frame is
  zeros and decoders lose most of the stream.)
- aac: FFmpeg's AAC-LC encoder through `av` (PyAV's wheels carry FFmpeg), 64 kbit/s in ADTS: each frame carries
  its own header, so a stream can be played from its first bytes; the muxer writes every packet out as it is made
  (FFmpeg's flush_packets), not when its 32 KB buffer fills. Decoders see AAC's 1,024 samples of priming first.
"""

from __future__ import annotations

import io
import struct
from typing import Protocol

import numpy as np

from services.common.errors import InvalidArgument, echo
from services.gateway.time_stretch import TimeStretch

CONTENT_TYPES = {"pcm": "audio/pcm", "wav": "audio/wav", "flac": "audio/flac", "mp3": "audio/mpeg",
                 "opus": "audio/ogg", "aac": "audio/aac"}
FORMATS = tuple(CONTENT_TYPES)
UNKNOWN_SIZE = 0xFFFFFFFF
OGG_PAGE_MS = 20.0  # an Opus frame's worth: every chunk the vocoder sends goes out in the next page
SFC_SET_OGG_PAGE_LATENCY_MS = 0x1302  # libsndfile's sf_command (sndfile.h); soundfile does not name it


class AudioEncoder(Protocol):
    content_type: str

    def feed(self, pcm: bytes) -> bytes:
        """PCM16 samples in → the encoded bytes ready to send (maybe none yet)."""

    def finish(self) -> bytes:
        """→ the rest of the stream."""


class PcmEncoder:
    content_type = CONTENT_TYPES["pcm"]

    def feed(self, pcm: bytes) -> bytes:
        return pcm

    def finish(self) -> bytes:
        return b""


class WavEncoder:
    """A WAV stream: its header first (sizes unknown), then the samples."""

    content_type = CONTENT_TYPES["wav"]

    def __init__(self, sample_rate: int):
        self.header = wav_header(sample_rate)

    def feed(self, pcm: bytes) -> bytes:
        header, self.header = self.header, b""
        return header + pcm

    def finish(self) -> bytes:
        return self.header  # a reply without audio is still a WAV stream


def wav_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    block = channels * bits // 8
    fmt = struct.pack("<4sIHHIIHH", b"fmt ", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
    return struct.pack("<4sI4s", b"RIFF", UNKNOWN_SIZE, b"WAVE") + fmt + struct.pack("<4sI", b"data", UNKNOWN_SIZE)


class _Sink(io.RawIOBase):
    """A file libsndfile writes into: the whole stream so far, and how much of it has gone out."""

    def __init__(self):
        self.data, self.pos, self.sent = bytearray(), 0, 0

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def write(self, b) -> int:
        b = bytes(b)
        end = self.pos + len(b)
        if end > len(self.data):
            self.data.extend(bytes(end - len(self.data)))
        self.data[self.pos:end] = b
        self.pos = end
        return len(b)

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size is None or size < 0 else min(len(self.data), self.pos + size)
        out = bytes(self.data[self.pos:end])
        self.pos = end
        return out

    def readinto(self, buffer) -> int:
        out = self.read(len(buffer))
        buffer[:len(out)] = out
        return len(out)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.data)}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def take(self) -> bytes:
        """The bytes written since the last take (what went out before is not sent again)."""
        out = bytes(self.data[self.sent:])
        self.sent = len(self.data)
        return out


class SoundfileEncoder:
    """flac or opus through libsndfile, chunk by chunk."""

    KINDS = {"flac": ("FLAC", "PCM_16"), "opus": ("OGG", "OPUS")}

    def __init__(self, name: str, sample_rate: int):
        import soundfile

        self.content_type = CONTENT_TYPES[name]
        self.sink = _Sink()
        fmt, subtype = self.KINDS[name]
        self.file = soundfile.SoundFile(self.sink, "w", samplerate=sample_rate, channels=1, format=fmt, subtype=subtype)
        if fmt == "OGG":
            ffi = soundfile._ffi
            soundfile._snd.sf_command(self.file._file, SFC_SET_OGG_PAGE_LATENCY_MS, ffi.new("double*", OGG_PAGE_MS),
                                      ffi.sizeof("double"))

    def feed(self, pcm: bytes) -> bytes:
        self.file.write(np.frombuffer(pcm, dtype="<i2"))
        return self.sink.take()

    def finish(self) -> bytes:
        self.file.close()
        return self.sink.take()


class Mp3Encoder:
    content_type = CONTENT_TYPES["mp3"]
    KBPS = 64

    def __init__(self, sample_rate: int):
        import lameenc

        self.lame = lameenc.Encoder()
        self.lame.set_bit_rate(self.KBPS)
        self.lame.set_in_sample_rate(sample_rate)
        self.lame.set_channels(1)
        self.lame.set_quality(2)  # 2: near-best; encoding a chunk takes well under a millisecond

    def feed(self, pcm: bytes) -> bytes:
        return bytes(self.lame.encode(pcm))

    def finish(self) -> bytes:
        return bytes(self.lame.flush())


class _Packets(io.RawIOBase):
    """Where the AAC muxer writes: its bytes since the last take."""

    def __init__(self):
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.parts.append(bytes(b))
        return len(b)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class AacEncoder:
    """AAC-LC in ADTS frames, chunk by chunk (FFmpeg's encoder; it converts PCM16 to its float planes itself)."""

    content_type = CONTENT_TYPES["aac"]
    BIT_RATE = 64_000

    def __init__(self, sample_rate: int):
        import av

        self.av, self.sink, self.rate, self.samples = av, _Packets(), sample_rate, 0
        self.container = av.open(self.sink, "w", format="adts", options={"flush_packets": "1"})
        self.stream = self.container.add_stream("aac", rate=sample_rate, layout="mono")
        self.stream.bit_rate = self.BIT_RATE

    def feed(self, pcm: bytes) -> bytes:
        samples = np.frombuffer(pcm, dtype="<i2")
        if len(samples):
            frame = self.av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")  # [1, samples]
            frame.sample_rate, frame.pts = self.rate, self.samples
            self.samples += len(samples)
            self._mux(frame)
        return self.sink.take()

    def finish(self) -> bytes:
        self._mux(None)  # the encoder's last frames
        self.container.close()
        return self.sink.take()

    def _mux(self, frame) -> None:
        for packet in self.stream.encode(frame):
            self.container.mux(packet)


def check_format(name: str, field: str = "response_format") -> str:
    """A format a client asked for → its name, or InvalidArgument saying which are served."""
    if name in CONTENT_TYPES:
        return name
    raise InvalidArgument(field, f"{echo(name)}: unknown format; use one of {', '.join(FORMATS)}")


class Stretched:
    """Another encoder's stream of the PCM played `speed` times faster, at the same pitch (time_stretch.py)."""

    def __init__(self, inner: AudioEncoder, speed: float, sample_rate: int):
        self.inner, self.stretch, self.content_type = inner, TimeStretch(speed, sample_rate), inner.content_type

    def feed(self, pcm: bytes) -> bytes:
        return self.inner.feed(self.stretch.feed(pcm))

    def finish(self) -> bytes:
        return self.inner.feed(self.stretch.finish()) + self.inner.finish()


def encoder(name: str, sample_rate: int, speed: float = 1.0) -> AudioEncoder:
    """An encoder for a format check_format took, of the PCM played `speed` times faster."""
    inner = _encoder(name, sample_rate)
    return inner if speed == 1.0 else Stretched(inner, speed, sample_rate)


def _encoder(name: str, sample_rate: int) -> AudioEncoder:
    if name == "pcm":
        return PcmEncoder()
    if name == "wav":
        return WavEncoder(sample_rate)
    if name == "mp3":
        return Mp3Encoder(sample_rate)
    if name == "aac":
        return AacEncoder(sample_rate)
    return SoundfileEncoder(name, sample_rate)
