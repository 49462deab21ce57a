"""A stream's state through the flow's token decoder (decoder.py), and the row a call decodes for it."""

from __future__ import annotations

from dataclasses import dataclass

from services.vocoder.codec.voice import Voice


@dataclass(frozen=True)
class FlowState:
    """One stream: its voice, its tokens from absolute index `base` on, and how many it has decoded."""

    voice: Voice
    tokens: tuple[int, ...] = ()
    base: int = 0
    decoded: int = 0
    stream: int | None = None  # the decoder's id for it (start); None: decoded over the window always
    slot: int | None = None    # its history slot; None before its first call, -1 if it has none
    written: int = 0           # frames it has solved into its slot
    bank: int = -1             # the lefts bank its next call reads (-1: the voice prefix's; history.py)

    @property
    def received(self) -> int:
        return self.base + len(self.tokens)

    def window(self, start: int, end: int) -> list[int]:
        return list(self.tokens[start - self.base : end - self.base])


@dataclass(frozen=True)
class Plan:
    """One row of a call: tokens [start, end) after the prompt; [start, decode_end) decoded, the rest look-ahead
    context; frames of tokens [emit_from, decode_end) kept."""

    start: int
    decode_end: int
    end: int
    emit_from: int
