"""Where a speaker's speech starts and ends, from the voice-activity probabilities of its windows (vad.py).

The rule is Silero's own streaming one (its package's VADIterator): speech starts at the first window whose
probability reaches `threshold`; once speaking, a window below `threshold - 0.15` starts a silence, a window at
`threshold` or above ends it, and a silence of `end_silence` seconds ends the speech. The speech encoded runs from
`pad` seconds before its first speech window to `pad` seconds after the start of its last silence (Silero's
speech_pad). We differ in one way: VADIterator's default silence is 0.1 s, which ends a turn at every pause for
breath; a turn-taking default is longer (the encoder's --end-silence-seconds).

The gate holds samples until their windows are judged: before the speech, the last `pad` seconds (the rest is
dropped, never encoded); during a silence, the silence (it is speech again if the speaker goes on, else only its
first `pad` seconds are). A turn ended by its client (`finish`) releases what it holds up to the end of the audio, or
of a silence in progress, past its pad.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from services.encoder.config import SAMPLE_RATE
from services.encoder.vad import WINDOW

NEGATIVE_MARGIN = 0.15  # a window this far under the threshold is silence (Silero's rule)


@dataclass
class GateOutput:
    """What a step found: samples to encode (16 kHz), and where the speech started or ended (sample positions in the
    turn's 16 kHz audio), each at most once in a turn."""

    speech: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    started: int | None = None
    ended: int | None = None


class SpeechGate:
    def __init__(self, threshold: float = 0.5, end_silence: float = 0.5, pad: float = 0.1,
                 max_speech: float = float("inf")):
        """threshold: a window's probability that is speech; end_silence, pad: seconds (module docstring);
        max_speech: seconds of speech after which the speech ends where it stands."""
        self.threshold, self.negative = threshold, threshold - NEGATIVE_MARGIN
        self.end_silence = int(end_silence * SAMPLE_RATE)
        self.pad = int(pad * SAMPLE_RATE)
        self.max_speech = max_speech * SAMPLE_RATE
        self.held = np.zeros(0, np.float32)
        self.held_from = 0            # the turn's sample index of held[0]
        self.judged = 0               # samples covered by the windows judged so far
        self.start: int | None = None
        self.end: int | None = None
        self.silence_from: int | None = None

    @property
    def speaking(self) -> bool:
        return self.start is not None and self.end is None

    def advance(self, samples: np.ndarray, probabilities: list[float]) -> GateOutput:
        """The turn's next samples and the probabilities of the whole windows they complete (vad.py)."""
        if self.end is not None:
            return GateOutput()
        self.held = np.concatenate([self.held, np.asarray(samples, np.float32)])
        out = GateOutput()
        for p in probabilities:
            window = self.judged
            self.judged += WINDOW
            if self.start is None:
                if p >= self.threshold:
                    self.start = out.started = max(0, window - self.pad, self.held_from)
                else:
                    self._drop_before(self.judged - self.pad)
                    continue
            if p >= self.threshold:
                self.silence_from = None
            elif p < self.negative and self.silence_from is None:
                self.silence_from = window
            if self.silence_from is not None and self.judged - self.silence_from >= self.end_silence:
                self.end = out.ended = min(self.silence_from + self.pad, self.judged)
                break
            if self.judged - self.start >= self.max_speech:
                self.end = out.ended = self.judged
                break
        out.speech = self._release()
        return out

    def finish(self) -> GateOutput:
        """The client ended the turn: the speech, if any started, runs to the end of the audio (or of a silence in
        progress, past its pad)."""
        if not self.speaking:
            return GateOutput()
        received = self.held_from + len(self.held)
        self.end = received if self.silence_from is None else min(received, self.silence_from + self.pad)
        return GateOutput(speech=self._release())

    def _release(self) -> np.ndarray:
        """The held samples that are speech: up to the speech's end, or up to the judged windows (less a silence
        in progress, past its pad)."""
        if self.start is None:
            return np.zeros(0, np.float32)
        upto = self.end if self.end is not None else self.judged
        if self.end is None and self.silence_from is not None:
            upto = min(upto, self.silence_from + self.pad)
        released = self.held[: max(0, upto - self.held_from)]
        self._drop_before(upto)
        return released

    def _drop_before(self, index: int) -> None:
        if index > self.held_from:
            self.held = self.held[index - self.held_from :]
            self.held_from = index
