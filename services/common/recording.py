"""A speaker's recording, checked before a voice is made of it: the one set of checks that `moss-serve voice`
(services/voice_maker.py), the vocoder's AddVoice and the gateway's CreateVoice apply, numpy only (the gateway
imports no torch). Each refusal says what to give instead."""

from __future__ import annotations

import re

import numpy as np

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a voice's name: its file's stem, so no path in it
NAME_RULE = "1-64 letters, digits, '_', '.' or '-', starting with a letter or digit"
MIN_RATE, MAX_RATE = 8_000, 192_000  # the rates a recording may come at
SILENCE_DBFS = -50.0                  # a recording whose loudest 100 ms is quieter than this is silence
CLIPPED_SHARE = 0.001                 # a recording with more of its samples at full scale is clipped
MIN_VOICE_SECONDS = 3.0               # a recording made a voice through the API: at least this (the CLI: a code)
LONGEST_RECORDING = 30.0              # a recording taken in at most (`moss-serve voice --max-seconds`' default too)
CODE_SECONDS = 0.08                   # the encoder's codes: 12.5 a second, each 4 of the flow's mel frames
CUT_SEARCH_SECONDS = 2.0              # a recording cut to a prompt ends at its quietest code boundary this close to
                                      # the limit


class RecordingError(ValueError):
    """A recording (or the name given it) that makes no voice, said with what to give instead."""


def check_name(name: str) -> None:
    if not NAME.match(name):
        raise RecordingError(f"voice name {name!r}: {NAME_RULE}")


def check_rate(rate: int) -> None:
    if not MIN_RATE <= rate <= MAX_RATE:
        raise RecordingError(f"the recording's rate is {rate} Hz; give one of {MIN_RATE}-{MAX_RATE} Hz")


def check_length(seconds: float, max_seconds: float, min_seconds: float = 0.08) -> None:
    if seconds > max_seconds:
        raise RecordingError(f"the recording is {seconds:.1f} s; a prompt of a few seconds is enough, at most "
                             f"{max_seconds:g} s (every block of the flow decodes it again)")
    if seconds < max(min_seconds, 0.08):
        raise RecordingError(f"the recording is {seconds:.2f} s: too short, give at least {max(min_seconds, 0.08):g} s"
                             if min_seconds > 0.08 else "the recording is too short to give one code (80 ms)")


def check_recording(name: str, samples: np.ndarray, rate: int, max_seconds: float, min_seconds: float = 0.08) -> None:
    """RecordingError for a bad name, a rate no recording has, a length out of [min_seconds, max_seconds], silence
    (no 100 ms as loud as SILENCE_DBFS) or clipping (over CLIPPED_SHARE of the samples at full scale). samples:
    float, mono, in [-1, 1]."""
    check_name(name)
    check_rate(rate)
    check_length(len(samples) / rate, max_seconds, min_seconds)
    window = max(1, rate // 10)
    frames = samples[: len(samples) // window * window].reshape(-1, window) if len(samples) >= window else samples[None]
    loudest = float(np.sqrt(np.mean(np.square(frames.astype(np.float64)), axis=1)).max())
    if loudest < 10 ** (SILENCE_DBFS / 20):
        raise RecordingError(f"the recording is silence (its loudest 100 ms at {20 * np.log10(max(loudest, 1e-12)):.0f} "
                             f"dBFS); record the speaker speaking")
    clipped = float(np.mean(np.abs(samples) >= 0.999))
    if clipped > CLIPPED_SHARE:
        raise RecordingError(f"the recording is clipped ({clipped:.1%} of its samples at full scale); record it quieter")


def prompt_cut(samples: np.ndarray, rate: int, max_seconds: float, min_seconds: float = MIN_VOICE_SECONDS) -> np.ndarray:
    """A recording longer than a prompt may be → its first max_seconds at most, ended where it is quietest: at the
    code boundary (a multiple of 80 ms, where the codes and the mel are cut too) within CUT_SEARCH_SECONDS of the
    limit whose 80 ms around it are the softest (the latest of those within 3 dB of it), so that the prompt ends in a
    pause rather than inside a word. One within the limit is returned whole. samples [n] float, mono → [m ≤ n] (a
    view)."""
    if len(samples) <= max_seconds * rate:
        return samples
    code = CODE_SECONDS * rate                                              # samples a code (not whole at every rate)
    last = int(max_seconds / CODE_SECONDS + 1e-9)                           # the most codes within the limit
    first = min(last, max(int(np.ceil(min_seconds / CODE_SECONDS - 1e-9)), last - int(CUT_SEARCH_SECONDS / CODE_SECONDS), 1))
    ends = np.round(np.arange(first, last + 1) * code).astype(np.int64)     # candidate ends, in samples
    half = max(1, int(code // 2))
    energy = np.cumsum(np.concatenate([[0.0], np.square(samples.astype(np.float64))]))
    lo, hi = np.clip(ends - half, 0, len(samples)), np.clip(ends + half, 0, len(samples))
    loudness = (energy[hi] - energy[lo]) / np.maximum(hi - lo, 1)           # mean square around each end
    # the longest prompt of the ends within 3 dB of the softest (a pause, if there is one; else nearly the limit)
    best = np.flatnonzero(loudness <= 2 * loudness.min() + 1e-12)[-1]
    return samples[: ends[best]]
